#!/usr/bin/env python3
"""Generate sdplan's built-in model profiles (``resources/profiles/builtin_profiles.json``).

Run with the ``ref`` extra (torch, diffusers, transformers) plus ``gguf``::

    /work/venv-ref/bin/python tools/make_profiles.py [--layouts PATH] [--out PATH]

No weight is downloaded or allocated: tensor names and shapes come from

- the real layouts in ``shared/models/real_size_key_layouts.json`` (SD 1.5 UNet, SDXL
  UNet, SD VAE, CLIP-L, T5-XXL encoder, FLUX.1-dev, Z-Image Turbo, Qwen3-4B in transformers
  and llama.cpp names; FLUX.1-schnell is FLUX.1-dev without
  its ``guidance_in`` embedder; SD 2.1's UNet is SD 1.5's with a 1024-wide
  cross-attention context and linear ``proj_in``/``proj_out``, as its published
  ``use_linear_in_transformer: true`` config says; the 16-channel SD3/Flux VAE is the SD
  VAE with ``z_channels`` 16 and no ``quant_conv``/``post_quant_conv``), each derived
  layout checked against a diffusers model of the published config built on the meta
  device (parameter counts must agree exactly);
- diffusers ``SD3Transformer2DModel`` and transformers ``CLIPTextModelWithProjection``
  on the meta device with the published hyper-parameters (SD3.5 medium/large MMDiT,
  OpenCLIP ViT-H/14 and ViT-bigG/14 text towers), renamed to the names sd-cli's files use
  (SAI ``joint_blocks.N.x_block...`` and OpenCLIP ``transformer.resblocks.N...``); the
  renaming is checked against the real SD3-medium layout;
- Chroma1-HD (no published layout in ``shared/models``): FLUX.1-dev's real layout without the
  modulation Chroma prunes (``{img,txt}_mod``, ``modulation``, ``final_layer.adaLN_modulation``,
  ``time_in``, ``vector_in``, ``guidance_in``) plus sd-cli's ``ChromaApproximator``
  (``distilled_guidance_layer``: 64 -> 5120, 5 layers, -> 3072), checked by diffusers' own
  ``convert_chroma_transformer_checkpoint_to_diffusers``, which must consume every tensor and
  give exactly the names and shapes of ``ChromaTransformer2DModel()`` (lodestones/Chroma1-HD
  ``transformer/config.json`` is its defaults) on the meta device.

- FLUX.2 klein 4B, Qwen3-4B and the FLUX.2 autoencoder: their real layouts (the VAE in F32
  with its int64 ``bn.num_batches_tracked``); FLUX.2 klein 9B (no published layout here): the
  4B's real layout widened 3072 -> 4096 (every width that is a multiple of 3072 scales by 4/3;
  the text width 7680 -> 12288, three Qwen3-8B states) with 8 double + 24 single blocks,
  checked by diffusers' own ``convert_flux2_transformer_checkpoint_to_diffusers``, which must
  give exactly the names and shapes of ``Flux2Transformer2DModel(num_layers=8,
  num_single_layers=24, num_attention_heads=32, joint_attention_dim=12288,
  guidance_embeds=False)`` (black-forest-labs/FLUX.2-klein-9B ``transformer/config.json``) on
  the meta device; Qwen3-8B: Qwen3-4B's layouts widened 2560 -> 4096 and 9728 -> 12288,
  checked against transformers' ``Qwen3Model`` of Qwen/Qwen3-8B's config on the meta device
  (no ``lm_head``: sd-cli reads only the model's states).

- Qwen-Image, Qwen2.5-VL-7B and the Qwen-Image VAE: their real layouts in BF16 (the published
  ``qwen_image_bf16.safetensors``, ``qwen_2.5_vl_7b.safetensors`` with its vision tower and
  ``lm_head``, ``qwen_image_vae.safetensors``; the files' sizes less their headers); the GGUF
  profiles take ``Qwen2.5-VL-7B-Instruct-Q8_0.gguf`` (the text model in llama.cpp names, its
  ``output`` head included, no vision tower: that is the separate ``mmproj`` file sd-cli reads
  with ``--llm_vision``).

- FLUX.2 dev and Mistral-Small-3.2-24B (no published layout in ``shared/models``): the layouts of
  ``tests/fixtures/flux2_dev_layouts.json`` (``make_flux2_dev_fixtures.py``: diffusers
  ``Flux2Transformer2DModel()``, whose defaults are black-forest-labs/FLUX.2-dev's config, in
  BFL names, 64,446,562,304 bytes in BF16 as the published ``flux2-dev.safetensors``; transformers
  ``Mistral3ForConditionalGeneration`` of mistralai/Mistral-Small-3.2-24B-Instruct-2506's config in
  its checkpoint names); the ``f16`` profile takes the encoder's BF16 checkpoint (the text model
  with its ``lm_head``, the Pixtral vision tower and projector as ``llm_vision``), the GGUF ones
  ``Mistral-Small-3.2-24B-Instruct-2506-Q8_0.gguf`` (the text model in llama.cpp names with its
  ``output`` head; vectors F32, matrices Q8_0). FLUX.2 dev GGUF files (city96/FLUX.2-dev-gguf)
  keep FLUX.1's kind of tensors unquantised (``img_in. txt_in. time_in. guidance_in.
  final_layer.``, the ``flux2`` rule below).

Byte sizes per tensor: ``n_elements / block_size * type_size`` with ggml's
``gguf.GGML_QUANT_SIZES``.

Which tensors stay unquantised in GGUF files (city96-style conversions, the community
GGUF files of FLUX.1, SD3.5, SDXL and SD1.x). Source: city96/ComfyUI-GGUF
``tools/convert.py`` (first pass to an F16/BF16 GGUF) and ``tools/lcpp.patch`` /
``tools/lcpp_sd3.patch`` (llama-quantize rules for image models):

1. First pass: a BF16/F32 source keeps 1-D tensors and tensors of at most 1024 elements
   in F32; everything else keeps the source's 16-bit type. SD1/SDXL (``shape_fix``):
   a tensor of more than one dimension with at least 512 elements, a multiple of 256
   elements and a last dimension that is not a multiple of 256 is stored as rows of 256.
2. Quantisation: only 2-D tensors whose name ends in ``weight`` are quantised, except
   Flux ``txt_in. img_in. time_in. vector_in. guidance_in. final_layer.`` (Chroma also
   ``distilled_guidance_layer.``, as the community Chroma quantisations keep it), SD3
   ``final_layer. t_embedder. y_embedder. x_embedder. context_embedder. pos_embed``,
   SD1/SDXL ``time_embed. label_emb. conv_in. conv_out. input_blocks.0.0.weight
   out.2.weight`` (and their diffusers spellings), which keep the first pass's type.
   A K-quant tensor whose row length (``ne0``) is not a multiple of 256 falls back to
   F16; any type needs ``ne0`` to be a multiple of its block size.

The Q4_K/Q5_K profiles quantise uniformly (sd-cli ``--type q4_K``; city96's ``_K_S``
files differ only where the patch's name rules match, which no Flux tensor does).
Z-Image GGUF files (leejet/Z-Image-Turbo-GGUF) come from stable-diffusion.cpp's converter,
whose ``tensor_should_be_converted`` keeps ``x_embedder. t_embedder. final_layer.`` (and
biases) unquantised; the rest follows the first pass above.
FLUX.2 klein GGUF files (leejet/FLUX.2-klein-4B-GGUF and -9B-GGUF) come from the same
converter, which keeps ``img_in. txt_in. time_in. guidance_in. final_layer.`` (FLUX.1's rule)
and the q/k norm scales unquantised; the shared modulations are quantised.
Qwen-Image GGUF files (QuantStack/Qwen-Image-GGUF, city96's tools) are assumed to keep FLUX.1's
kind of tensors unquantised: the embedders and the final layer (``img_in. txt_in.
time_text_embed. norm_out. proj_out.``); every block matrix is quantised (all rows are 3072 or
12288 wide: whole K-quant blocks).
Wan 2.2 GGUF files (QuantStack/Wan2.2-*-GGUF, city96's tools) are assumed to keep the
embedders and the head unquantised (``patch_embedding. text_embedding. time_embedding.
time_projection. head.``) and the 3-D ``modulation`` tensors in F16; every block matrix is
quantised (rows of 3072, 5120, 13824 or 14336: whole K-quant blocks). The A14B profiles hold
both experts (the high-noise one as the ``diffusion`` module's ``high_noise`` phase).
UMT5-XXL (Wan's ``--t5xxl``) Q8_0 is city96/umt5-xxl-encoder-gguf, T5-XXL's rule below.
Qwen3-4B / Qwen3-8B Q8_0 is llama.cpp's converter and ``llama-quantize Q8_0``: 1-D tensors
F32, every matrix (the token embedding included) Q8_0.
T5-XXL Q8_0 follows city96/t5-v1_1-xxl-encoder-gguf (llama.cpp's converter and
llama-quantize): one token embedding (the tied copy is not written), 1-D tensors F32,
the relative attention bias F16, every other matrix Q8_0.

Profile composition (what a user passes to sd-cli): the diffusion model in the named
quant type; text encoders in F16 (T5-XXL: F16 for ``-f16`` profiles, Q8_0 otherwise);
VAEs as published (F16 inside the SD/SDXL/SD3.5 checkpoints, F32 ``ae.safetensors`` for
FLUX.1, Chroma and Z-Image; ``flux2-vae.safetensors`` F32 for FLUX.2 klein); Z-Image's and
klein 4B's Qwen3-4B (klein 9B's Qwen3-8B) in BF16 (``qwen_3_4b.safetensors``) for ``-f16``,
Q8_0 GGUF otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
log = logging.getLogger("make_profiles")

Layout = list[tuple[str, tuple[int, ...]]]

#: Quant types of the built-in profiles: name suffix -> ggml type name.
QUANTS = {"f16": "F16", "q8_0": "Q8_0", "q5_k": "Q5_K", "q4_k": "Q4_K", "q4_0": "Q4_0"}


def _sdplan() -> None:
    """Make ``sdplan.core`` importable from this checkout when sdplan is not installed
    (the ref environment): ``sdplan`` is a namespace package whose ``core`` is ``core/``."""
    try:
        import sdplan.core.modelfiles.checkpoint  # noqa: F401
    except ImportError:
        pkg = types.ModuleType("sdplan")
        pkg.__path__ = [str(REPO)]  # type: ignore[attr-defined]
        sys.modules["sdplan"] = pkg


# --------------------------------------------------------------------------- layouts


def _real(layouts: dict, key: str, strip: str = "", prefix: str = "") -> Layout:
    out = []
    for name, shape in layouts[key].items():
        if strip and name.startswith(strip):
            name = name[len(strip):]
        out.append((prefix + name, tuple(shape)))
    return out


def _count(layout: Layout) -> int:
    return sum(math.prod(s) for _, s in layout)


def _meta_params(model: object) -> int:
    return sum(p.numel() for p in model.parameters())  # type: ignore[attr-defined]


def sd21_unet(layouts: dict) -> Layout:
    """SD 2.1 UNet in the original layout, from SD 1.5's real names and shapes."""
    out: Layout = []
    for name, shape in _real(layouts, "sd15_unet_ldm"):
        if name.endswith((".attn2.to_k.weight", ".attn2.to_v.weight")):
            shape = (shape[0], 1024)
        elif (".proj_in." in name or ".proj_out." in name) and len(shape) == 4:
            shape = shape[:2]
        out.append((name, shape))
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):  # stabilityai/stable-diffusion-2-1 unet/config.json
        ref = UNet2DConditionModel(sample_size=96, cross_attention_dim=1024,
                                   attention_head_dim=[5, 10, 20, 20],
                                   use_linear_projection=True)
    _check(out, _meta_params(ref), "SD 2.1 UNet")
    return out


def vae16(layouts: dict, prefix: str) -> Layout:
    """16-channel SD3/Flux VAE from the SD VAE's real layout."""
    out: Layout = []
    for name, shape in _real(layouts, "sd_vae_ldm", strip="first_stage_model."):
        if name.startswith(("quant_conv.", "post_quant_conv.")):
            continue
        if name.startswith("encoder.conv_out."):
            shape = (32, *shape[1:])
        elif name == "decoder.conv_in.weight":
            shape = (shape[0], 16, *shape[2:])
        out.append((prefix + name, shape))
    import torch
    from diffusers import AutoencoderKL

    with torch.device("meta"):  # black-forest-labs/FLUX.1-dev vae/config.json
        ref = AutoencoderKL(in_channels=3, out_channels=3, latent_channels=16,
                            down_block_types=("DownEncoderBlock2D",) * 4,
                            up_block_types=("UpDecoderBlock2D",) * 4,
                            block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                            use_quant_conv=False, use_post_quant_conv=False)
    _check(out, _meta_params(ref), "16-channel VAE")
    return out


def _check(layout: Layout, expected: int, what: str) -> None:
    got = _count(layout)
    if got != expected:
        raise SystemExit(f"{what}: layout has {got} parameters, the reference {expected}")
    log.info("%s: %d tensors, %d parameters (matches the meta-device model)", what,
             len(layout), got)


def _clip_text(hidden: int, layers: int, heads: int, proj: int) -> Layout:
    """HF names and shapes of a CLIP text tower with projection (meta device)."""
    import torch
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(hidden_size=hidden, intermediate_size=4 * hidden,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         projection_dim=proj, vocab_size=49408, max_position_embeddings=77)
    with torch.device("meta"):
        model = CLIPTextModelWithProjection(cfg)
    return [(n, tuple(p.shape)) for n, p in model.state_dict().items()
            if not n.endswith("position_ids")]


def openclip_text(hf: Layout, prefix: str) -> Layout:
    """HF CLIP text names -> OpenCLIP names (q/k/v merged into ``in_proj``), as the SD2
    and SDXL checkpoints store the ViT-H and ViT-bigG towers."""
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in hf:
        n = name.removeprefix("text_model.")
        if n == "embeddings.token_embedding.weight":
            out["token_embedding.weight"] = shape
        elif n == "embeddings.position_embedding.weight":
            out["positional_embedding"] = shape
        elif n.startswith("final_layer_norm."):
            out["ln_final." + n.split(".")[-1]] = shape
        elif n == "text_projection.weight":
            out["text_projection"] = (shape[1], shape[0])
        elif n.startswith("encoder.layers."):
            _, _, idx, rest = n.split(".", 3)
            base = f"transformer.resblocks.{idx}."
            kind = rest.split(".")[-1]
            if rest.startswith("self_attn.") and rest.split(".")[1] in ("q_proj", "k_proj",
                                                                     "v_proj"):
                key = base + f"attn.in_proj_{kind}"
                old = out.get(key)
                out[key] = (shape[0] + (old[0] if old else 0), *shape[1:])
            else:
                mapped = {"self_attn.out_proj": "attn.out_proj", "layer_norm1": "ln_1",
                          "layer_norm2": "ln_2", "mlp.fc1": "mlp.c_fc",
                          "mlp.fc2": "mlp.c_proj"}[rest.rsplit(".", 1)[0]]
                out[base + f"{mapped}.{kind}"] = shape
        else:
            raise SystemExit(f"unexpected CLIP tensor {name}")
    out["logit_scale"] = ()
    return [(prefix + n, s) for n, s in out.items()]


#: diffusers SD3 block tensor -> SAI name (q/k/v parts are concatenated along dim 0).
_SD3_BLOCK = {
    "norm1.linear": "x_block.adaLN_modulation.1",
    "norm1_context.linear": "context_block.adaLN_modulation.1",
    "attn.to_q": "x_block.attn.qkv", "attn.to_k": "x_block.attn.qkv",
    "attn.to_v": "x_block.attn.qkv",
    "attn.add_q_proj": "context_block.attn.qkv", "attn.add_k_proj": "context_block.attn.qkv",
    "attn.add_v_proj": "context_block.attn.qkv",
    "attn.to_out.0": "x_block.attn.proj", "attn.to_add_out": "context_block.attn.proj",
    "attn.norm_q": "x_block.attn.ln_q", "attn.norm_k": "x_block.attn.ln_k",
    "attn.norm_added_q": "context_block.attn.ln_q",
    "attn.norm_added_k": "context_block.attn.ln_k",
    "attn2.to_q": "x_block.attn2.qkv", "attn2.to_k": "x_block.attn2.qkv",
    "attn2.to_v": "x_block.attn2.qkv", "attn2.to_out.0": "x_block.attn2.proj",
    "attn2.norm_q": "x_block.attn2.ln_q", "attn2.norm_k": "x_block.attn2.ln_k",
    "ff.net.0.proj": "x_block.mlp.fc1", "ff.net.2": "x_block.mlp.fc2",
    "ff_context.net.0.proj": "context_block.mlp.fc1",
    "ff_context.net.2": "context_block.mlp.fc2",
}
_SD3_TOP = {
    "pos_embed.proj": "x_embedder.proj", "pos_embed.pos_embed": "pos_embed",
    "time_text_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
    "time_text_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
    "time_text_embed.text_embedder.linear_1": "y_embedder.mlp.0",
    "time_text_embed.text_embedder.linear_2": "y_embedder.mlp.2",
    "context_embedder": "context_embedder", "norm_out.linear": "final_layer.adaLN_modulation.1",
    "proj_out": "final_layer.linear",
}


def sd3_mmdit(**config: object) -> Layout:
    """SAI-named MMDiT layout of a diffusers ``SD3Transformer2DModel`` config."""
    import torch
    from diffusers import SD3Transformer2DModel

    with torch.device("meta"):
        model = SD3Transformer2DModel(**config)  # type: ignore[arg-type]
    out: dict[str, tuple[int, ...]] = {}
    for name, t in model.state_dict().items():
        shape = tuple(t.shape)
        if name.startswith("transformer_blocks."):
            _, idx, rest = name.split(".", 2)
            stem, kind = rest.rsplit(".", 1)
            new = f"joint_blocks.{idx}.{_SD3_BLOCK[stem]}.{kind}"
        else:
            stem, kind = name.rsplit(".", 1)
            if name == "pos_embed.pos_embed":
                stem, kind = name, ""
            new = _SD3_TOP[stem] + (f".{kind}" if kind else "")
        old = out.get(new)
        out[new] = shape if old is None else (old[0] + shape[0], *shape[1:])
    return list(out.items())


def chroma_dit(layouts: dict) -> Layout:
    """Chroma1-HD's BFL single-file layout (see the module docstring), checked with diffusers."""
    pruned = ("time_in.", "vector_in.", "guidance_in.", "final_layer.adaLN_modulation.")
    out: Layout = [(n, s) for n, s in _real(layouts, "flux1_dev_bfl")
                   if not n.startswith(pruned) and "_mod.lin." not in n and ".modulation.lin." not in n]
    a, hidden, width = "distilled_guidance_layer.", 5120, 3072
    out += [(a + "in_proj.weight", (hidden, 64)), (a + "in_proj.bias", (hidden,))]
    for k in range(5):
        for lin in ("in_layer", "out_layer"):
            out += [(f"{a}layers.{k}.{lin}.weight", (hidden, hidden)), (f"{a}layers.{k}.{lin}.bias", (hidden,))]
        out.append((f"{a}norms.{k}.scale", (hidden,)))
    out += [(a + "out_proj.weight", (width, hidden)), (a + "out_proj.bias", (width,))]
    import torch
    from diffusers import ChromaTransformer2DModel
    from diffusers.loaders.single_file_utils import (
        convert_chroma_transformer_checkpoint_to_diffusers,
    )

    with torch.device("meta"):
        ref = ChromaTransformer2DModel()
        ckpt = {n: torch.empty(s) for n, s in out}
    conv = convert_chroma_transformer_checkpoint_to_diffusers(ckpt)
    want = {n: tuple(t.shape) for n, t in ref.state_dict().items()}
    if ckpt or {n: tuple(t.shape) for n, t in conv.items()} != want:
        raise SystemExit(f"Chroma layout: {sorted(ckpt)[:4]} left over, or names/shapes differ from diffusers")
    _check(out, _meta_params(ref), "Chroma1-HD DiT")
    return out


def _widen(layout: Layout, dims: dict[int, int], unit: int = 0, scale: tuple[int, int] = (1, 1)) -> Layout:
    """``layout`` with each dimension in ``dims`` replaced, and (with ``unit``) each multiple of
    ``unit`` scaled by ``scale[0] / scale[1]``."""
    def dim(d: int) -> int:
        if d in dims:
            return dims[d]
        return d * scale[0] // scale[1] if unit and d % unit == 0 else d
    return [(n, tuple(dim(d) for d in s)) for n, s in layout]


def wan_i2v_dit(layouts: dict) -> Layout:
    """A Wan 2.2 I2V-A14B expert's layout: the T2V-A14B expert's real one with 36 inputs to its
    patch embedding (the noise, the picture's mask and latent), no image embedder (Wan 2.2 takes
    no CLIP vision), checked with diffusers' ``WanTransformer3DModel`` of the published
    Wan-AI/Wan2.2-I2V-A14B-Diffusers ``transformer/config.json``."""
    out: Layout = [(n, (s[0], 36, *s[2:]) if n == "patch_embedding.weight" else s)
                   for n, s in _real(layouts, "wan22_t2v_a14b")]
    import torch
    from diffusers import WanTransformer3DModel

    with torch.device("meta"):
        ref = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128,
                                    in_channels=36, out_channels=16, text_dim=4096, freq_dim=256,
                                    ffn_dim=13824, num_layers=40, cross_attn_norm=True,
                                    qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None)
    _check(out, _meta_params(ref), "Wan 2.2 I2V-A14B expert")
    return out


def klein9b_dit(layouts: dict) -> Layout:
    """FLUX.2 klein 9B's BFL layout from the 4B's real one (module docstring), checked with diffusers."""
    base = _widen(_real(layouts, "flux2_klein_4b"), {7680: 12288}, 3072, (4, 3))
    out: Layout = [(n, s) for n, s in base if "_blocks." not in n]
    for seg, count in (("double_blocks.", 8), ("single_blocks.", 24)):
        block0 = [(n, s) for n, s in base if n.startswith(seg + "0.")]
        out += [(n.replace(seg + "0.", f"{seg}{i}.", 1), s) for i in range(count) for n, s in block0]
    import torch
    from diffusers import Flux2Transformer2DModel
    from diffusers.loaders.single_file_utils import (
        convert_flux2_transformer_checkpoint_to_diffusers,
    )

    with torch.device("meta"):  # black-forest-labs/FLUX.2-klein-9B transformer/config.json
        ref = Flux2Transformer2DModel(num_layers=8, num_single_layers=24, num_attention_heads=32,
                                      joint_attention_dim=12288, guidance_embeds=False)
        ckpt = {n: torch.empty(s) for n, s in out}
    conv = convert_flux2_transformer_checkpoint_to_diffusers(ckpt)
    if ckpt or {n: tuple(t.shape) for n, t in conv.items()} != {n: tuple(t.shape) for n, t in ref.state_dict().items()}:
        raise SystemExit("FLUX.2 klein 9B layout: names/shapes differ from diffusers' Flux2Transformer2DModel")
    _check(out, _meta_params(ref), "FLUX.2 klein 9B DiT")
    return out


def qwen3_8b(layouts: dict) -> tuple[Layout, Layout]:
    """Qwen3-8B in transformers and llama.cpp names from Qwen3-4B's real layouts, checked
    against transformers' ``Qwen3Model`` (Qwen/Qwen3-8B config.json) on the meta device."""
    dims = {2560: 4096, 9728: 12288}
    hf, gg = _widen(_real(layouts, "qwen3_4b_hf"), dims), _widen(_real(layouts, "qwen3_4b_gguf"), dims)
    import torch
    from transformers import Qwen3Config, Qwen3Model

    with torch.device("meta"):
        ref = Qwen3Model(Qwen3Config(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                                     head_dim=128))
    want = {"model." + n: tuple(t.shape) for n, t in ref.state_dict().items()}
    if dict(hf) != want:
        raise SystemExit(f"Qwen3-8B layout differs from transformers: {sorted(set(dict(hf).items()) ^ set(want.items()))[:4]}")
    _check(hf, _meta_params(ref), "Qwen3-8B")
    _check(gg, _meta_params(ref), "Qwen3-8B (llama.cpp names)")
    return hf, gg


def check_sd3_renaming(layouts: dict) -> None:
    """The renaming reproduces the real SD3-medium layout exactly (names and shapes)."""
    mine = dict(sd3_mmdit(num_layers=24, num_attention_heads=24, caption_projection_dim=1536,
                          pos_embed_max_size=192))
    real = {n: tuple(s) for n, s in layouts["sd3_medium_sai"].items()}
    if mine != real:
        diff = sorted(set(mine.items()) ^ set(real.items()))[:6]
        raise SystemExit(f"SD3 renaming differs from the real SD3-medium layout: {diff}")
    log.info("SD3 renaming reproduces the real SD3-medium layout (%d tensors)", len(real))


# --------------------------------------------------------------------------- dtypes


@dataclass(frozen=True)
class Component:
    """One model file's tensors as sd-cli gets them.

    Attributes:
        key: component id (``flux1-dev:Q8_0``...).
        module: spec module (``diffusion``, ``te``, ``vae``).
        encoder: ``te`` encoder or None.
        file: the usual published file it stands for.
        tensors: ``(name, shape, ggml type name, bytes)``.
    """

    key: str
    module: str
    encoder: str | None
    file: str
    tensors: tuple[tuple[str, tuple[int, ...], str, int], ...]

    @property
    def nbytes(self) -> int:
        return sum(t[3] for t in self.tensors)


def nbytes(shape: tuple[int, ...], ggml_type: str) -> int:
    """Bytes of a tensor: elements / block size * bytes per block (gguf.GGML_QUANT_SIZES)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ggml_type]]
    n = math.prod(shape)
    if n % block:
        raise ValueError(f"{n} elements are not whole {ggml_type} blocks")
    return n // block * size


_KEEP = {
    "flux": ("txt_in.", "img_in.", "time_in.", "vector_in.", "guidance_in.", "final_layer."),
    "chroma": ("txt_in.", "img_in.", "final_layer.", "distilled_guidance_layer."),
    "sd3": ("final_layer.", "time_text_embed.", "context_embedder.", "t_embedder.",
            "y_embedder.", "x_embedder.", "pos_embed"),
    "unet": ("class_embedding.", "time_embedding.", "add_embedding.", "time_embed.",
             "label_emb.", "conv_in.", "conv_out."),
    "z_image": ("x_embedder.", "t_embedder.", "final_layer."),
    "flux2": ("txt_in.", "img_in.", "time_in.", "guidance_in.", "final_layer."),
    "qwen_image": ("img_in.", "txt_in.", "time_text_embed.", "norm_out.", "proj_out."),
    "wan": ("patch_embedding.", "text_embedding.", "time_embedding.", "time_projection.", "head."),
}
_KEEP_EXACT = {"unet": ("input_blocks.0.0.weight", "out.2.weight"), "sd3": ("proj_out.weight",)}


def gguf_type(name: str, shape: tuple[int, ...], quant: str, family: str,
              source: str) -> tuple[str, tuple[int, ...]]:
    """``(ggml type, stored shape)`` of one diffusion-model tensor in a city96-style GGUF
    file of ``quant`` (see the module docstring for the rule and its source).

    ``family`` is ``flux``, ``chroma``, ``sd3``, ``unet``, ``z_image``, ``flux2`` or ``qwen_image``; ``source`` the
    published dtype
    (``BF16``, ``F16`` or ``F32``).
    """
    import gguf

    n = math.prod(shape)
    base = "F16" if source == "F16" else "BF16"
    if source in ("BF16", "F32") and (len(shape) <= 1 or n <= 1024):
        base = "F32"
    if (family == "unet" and len(shape) > 1 and n >= 512 and n % 256 == 0
            and shape[-1] % 256):
        shape = (n // 256, 256)
    local = name.removeprefix("model.diffusion_model.")
    quantise = (local.endswith("weight") and len(shape) == 2
                and not any(k in local for k in _KEEP[family])
                and local not in _KEEP_EXACT.get(family, ()))
    if not quantise:
        return base, shape
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[quant]][0]
    if shape[-1] % block:
        return ("F16" if quant.endswith("_K") else base), shape
    return quant, shape


def component(key: str, module: str, encoder: str | None, file: str, layout: Layout,
              dtype: str, quant: str | None = None, family: str = "") -> Component:
    """Type and size every tensor of ``layout``: all ``dtype``, or for ``quant`` the GGUF
    rule of :func:`gguf_type` (``family`` ``t5`` for the T5-XXL encoder file, ``llm`` for a
    llama.cpp language model: vectors F32, matrices ``quant``)."""
    rows = []
    for name, shape in layout:
        t, stored = dtype, shape
        if quant and family == "llm":
            t = "F32" if len(shape) == 1 else quant
        elif quant and family == "t5":
            if name == "encoder.embed_tokens.weight":
                continue  # tied to shared.weight; written once
            t = ("F32" if len(shape) == 1 else "F16" if "relative_attention_bias" in name
                 else quant)
        elif quant:
            t, stored = gguf_type(name, shape, quant, family, dtype)
        rows.append((name, tuple(shape), t, nbytes(stored, t)))
    return Component(key, module, encoder, file, tuple(rows))


# --------------------------------------------------------------------------- profiles


@dataclass(frozen=True)
class ModelSpec:
    """A built-in model: its diffusion layout and the files that go with it."""

    name: str
    title: str
    family: str  # gguf rule family: flux, chroma, sd3, unet
    source: str  # published dtype of the diffusion weights
    diffusion: Layout
    diffusion_file: str
    extras: tuple[Component, ...]
    t5: bool = False
    qwen3: bool = False
    qwen3_8b: bool = False
    qwen25vl: bool = False
    mistral: bool = False
    umt5: bool = False
    high_noise_file: str = ""  # a two-stage model's high-noise expert (the same layout)


def build_specs(layouts: dict) -> list[ModelSpec]:
    """The built-in models with their encoders and VAEs."""
    clip_l_hf = _real(layouts, "clip_l_hf", prefix="text_model.")
    sd_vae = _real(layouts, "sd_vae_ldm")
    clip_g_hf = _clip_text(1280, 32, 20, 1280)  # laion/CLIP-ViT-bigG-14 text config
    clip_h_hf = _clip_text(1024, 24, 16, 1024)  # laion/CLIP-ViT-H-14 text config
    log.info("CLIP-G: %d parameters, CLIP-H: %d", _count(clip_g_hf), _count(clip_h_hf))

    def f16(key: str, module: str, enc: str | None, file: str, lay: Layout,
            dtype: str = "F16") -> Component:
        return component(key, module, enc, file, lay, dtype)

    sd1_clip = f16("clip-l:sd1", "te", "clip_l", "v1-5-pruned-emaonly-fp16.safetensors",
                   [("cond_stage_model.transformer." + n, s) for n, s in clip_l_hf])
    sd_vae_c = f16("vae-sd", "vae", None, "v1-5-pruned-emaonly-fp16.safetensors", sd_vae)
    sd2_clip = f16("clip-h:sd2", "te", "clip_h", "v2-1_768-ema-pruned.safetensors",
                   openclip_text(clip_h_hf, "cond_stage_model.model."))
    sd2_vae = f16("vae-sd:sd2", "vae", None, "v2-1_768-ema-pruned.safetensors", sd_vae)
    xl_l = f16("clip-l:sdxl", "te", "clip_l", "sd_xl_base_1.0.safetensors",
               [("conditioner.embedders.0.transformer." + n, s) for n, s in clip_l_hf])
    xl_g = f16("clip-g:sdxl", "te", "clip_g", "sd_xl_base_1.0.safetensors",
               openclip_text(clip_g_hf, "conditioner.embedders.1.model."))
    xl_vae = f16("vae-sdxl", "vae", None, "sd_xl_base_1.0.safetensors", sd_vae)
    clip_l = f16("clip-l", "te", "clip_l", "clip_l.safetensors", clip_l_hf)
    clip_g = f16("clip-g", "te", "clip_g", "clip_g.safetensors", clip_g_hf)
    sd3_vae = f16("vae-16ch:sd3", "vae", None, "sd3.5 checkpoint",
                  vae16(layouts, "first_stage_model."))
    ae = f16("vae-16ch:ae", "vae", None, "ae.safetensors", vae16(layouts, ""), "F32")
    ae2 = Component("vae-flux2", "vae", None, "flux2-vae.safetensors", tuple(
        (n, s, t, nbytes(s, t)) for n, s in _real(layouts, "flux2_vae")
        for t in ["I64" if n == "bn.num_batches_tracked" else "F32"]))

    qwen_vae = f16("vae-wan21:qwen_image", "vae", None, "qwen_image_vae.safetensors",
                   _real(layouts, "qwen_image_vae"), "BF16")
    wan21_vae = f16("vae-wan21", "vae", None, "wan_2.1_vae.safetensors", _real(layouts, "wan21_vae"), "BF16")
    wan22_vae = f16("vae-wan22", "vae", None, "wan2.2_vae.safetensors", _real(layouts, "wan22_vae"))

    flux_dev = _real(layouts, "flux1_dev_bfl")
    flux_schnell = [(n, s) for n, s in flux_dev if not n.startswith("guidance_in.")]
    check_sd3_renaming(layouts)
    mmdit = "model.diffusion_model."
    # stabilityai/stable-diffusion-3.5-large and -medium transformer/config.json
    large = [(mmdit + n, s) for n, s in sd3_mmdit(
        num_layers=38, num_attention_heads=38, caption_projection_dim=2432,
        pos_embed_max_size=192, qk_norm="rms_norm")]
    medium = [(mmdit + n, s) for n, s in sd3_mmdit(
        num_layers=24, num_attention_heads=24, caption_projection_dim=1536,
        pos_embed_max_size=384, qk_norm="rms_norm", dual_attention_layers=tuple(range(13)))]
    return [
        ModelSpec("sd15", "Stable Diffusion 1.5", "unet", "F16",
                  _real(layouts, "sd15_unet_ldm"), "v1-5-pruned-emaonly-fp16.safetensors",
                  (sd1_clip, sd_vae_c)),
        ModelSpec("sd21", "Stable Diffusion 2.1 (768)", "unet", "F16", sd21_unet(layouts),
                  "v2-1_768-ema-pruned.safetensors", (sd2_clip, sd2_vae)),
        ModelSpec("sdxl-base", "SDXL base 1.0", "unet", "F16",
                  _real(layouts, "sdxl_unet_ldm"), "sd_xl_base_1.0.safetensors",
                  (xl_l, xl_g, xl_vae)),
        ModelSpec("sd35-medium", "Stable Diffusion 3.5 Medium", "sd3", "BF16", medium,
                  "sd3.5_medium.safetensors", (clip_l, clip_g, sd3_vae), t5=True),
        ModelSpec("sd35-large", "Stable Diffusion 3.5 Large", "sd3", "BF16", large,
                  "sd3.5_large.safetensors", (clip_l, clip_g, sd3_vae), t5=True),
        ModelSpec("flux1-dev", "FLUX.1 [dev]", "flux", "BF16", flux_dev,
                  "flux1-dev.safetensors", (clip_l, ae), t5=True),
        ModelSpec("flux1-schnell", "FLUX.1 [schnell]", "flux", "BF16", flux_schnell,
                  "flux1-schnell.safetensors", (clip_l, ae), t5=True),
        ModelSpec("chroma1-hd", "Chroma1-HD", "chroma", "BF16", chroma_dit(layouts),
                  "Chroma1-HD.safetensors", (ae,), t5=True),
        ModelSpec("z-image-turbo", "Z-Image Turbo", "z_image", "BF16", _real(layouts, "z_image_turbo"),
                  "z_image_turbo_bf16.safetensors", (ae,), qwen3=True),
        ModelSpec("flux2-klein-4b", "FLUX.2 [klein] 4B", "flux2", "BF16", _real(layouts, "flux2_klein_4b"),
                  "flux-2-klein-4b.safetensors", (ae2,), qwen3=True),
        ModelSpec("flux2-klein-9b", "FLUX.2 [klein] 9B", "flux2", "BF16", klein9b_dit(layouts),
                  "flux-2-klein-9b.safetensors", (ae2,), qwen3_8b=True),
        ModelSpec("qwen-image", "Qwen-Image", "qwen_image", "BF16", _real(layouts, "qwen_image_dit"),
                  "qwen_image_bf16.safetensors", (qwen_vae,), qwen25vl=True),
        ModelSpec("flux2-dev", "FLUX.2 [dev]", "flux2", "BF16", _real(layouts, "flux2_dev_bfl"),
                  "flux2-dev.safetensors", (ae2,), mistral=True),
        ModelSpec("wan22-ti2v-5b", "Wan 2.2 TI2V-5B", "wan", "F16", _real(layouts, "wan22_ti2v_5b"),
                  "wan2.2_ti2v_5B_fp16.safetensors", (wan22_vae,), umt5=True),
        ModelSpec("wan22-t2v-a14b", "Wan 2.2 T2V-A14B (both experts)", "wan", "F16",
                  _real(layouts, "wan22_t2v_a14b"), "wan2.2_t2v_low_noise_14B_fp16.safetensors",
                  (wan21_vae,), umt5=True, high_noise_file="wan2.2_t2v_high_noise_14B_fp16.safetensors"),
        ModelSpec("wan22-i2v-a14b", "Wan 2.2 I2V-A14B (both experts)", "wan", "F16", wan_i2v_dit(layouts),
                  "wan2.2_i2v_low_noise_14B_fp16.safetensors", (wan21_vae,), umt5=True,
                  high_noise_file="wan2.2_i2v_high_noise_14B_fp16.safetensors"),
    ]


#: transformers -> llama.cpp names of a Qwen2 / Qwen2.5 language model's block tensors
#: (llama.cpp ``gguf-py`` ``tensor_mapping.py``).
_LLAMA_BLOCK = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
                "post_attention_layernorm": "ffn_norm"}


def llama_names(text: Layout, prefix: str = "") -> Layout:
    """A transformers LLM's text model (names under ``prefix``, then ``model.``) in llama.cpp's
    names: ``token_embd``, ``output_norm``, ``output`` (an untied head) and ``blk.N.*``
    (:data:`_LLAMA_BLOCK`)."""
    ends = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}
    out: Layout = []
    for name, shape in text:
        rest = name.removeprefix(prefix)
        if rest in ends:
            out.append((ends[rest], shape))
        else:
            _, _, i, role = rest.split(".", 3)
            stem, kind = role.rsplit(".", 1)
            out.append((f"blk.{i}.{_LLAMA_BLOCK[stem]}.{kind}", shape))
    return out


def qwen25vl(layouts: dict) -> tuple[Layout, Layout, Layout]:
    """Qwen2.5-VL-7B as Qwen-Image's ``--llm`` files: ``(the Comfy file's LLM part with its
    lm_head, its vision tower, the LLM in llama.cpp names)``; the last is
    ``Qwen2.5-VL-7B-Instruct-Q8_0.gguf``'s text model (``token_embd``, ``blk.N.*``,
    ``output_norm``, ``output``: its untied head), whose vision tower ships apart (``mmproj``)."""
    full = _real(layouts, "qwen25vl_7b_llm")
    vision = [(n, s) for n, s in full if n.startswith("visual.")]
    text = [(n, s) for n, s in full if not n.startswith("visual.")]
    return text, vision, llama_names(text)


def mistral_small(layouts: dict) -> tuple[Layout, Layout, Layout]:
    """Mistral-Small-3.2-24B as FLUX.2 dev's ``--llm`` files: ``(the checkpoint's text model with
    its lm_head, its Pixtral vision tower and projector, the text model in llama.cpp names)``."""
    full = _real(layouts, "mistral_small_32_hf")
    vision = [(n, s) for n, s in full if not n.startswith("language_model.")]
    text = [(n, s) for n, s in full if n.startswith("language_model.")]
    return text, vision, llama_names(text, "language_model.")


def _mistral_components(quant: str, mistral: tuple[Layout, Layout, Layout]) -> list[Component]:
    """FLUX.2 dev's encoder: the BF16 checkpoint (text model, vision tower as ``llm_vision``) for
    the ``f16`` profile; ``Mistral-Small-3.2-24B-Instruct-2506-Q8_0.gguf`` for the GGUF ones."""
    text, vision, gguf = mistral
    file = "Mistral-Small-3.2-24B-Instruct-2506 (BF16 safetensors)"
    if quant == "F16":
        return [component("mistral-small-3.2:BF16", "te", "llm", file, text, "BF16"),
                component("mistral-small-3.2-vision:BF16", "te", "llm_vision", file, vision, "BF16")]
    return [component("mistral-small-3.2:Q8_0", "te", "llm", "Mistral-Small-3.2-24B-Instruct-2506-Q8_0.gguf", gguf,
                      "BF16", "Q8_0", "llm")]


def _qwen25vl_components(quant: str, qwen25: tuple[Layout, Layout, Layout]) -> list[Component]:
    """Qwen-Image's encoder: the Comfy ``qwen_2.5_vl_7b.safetensors`` in BF16 (the LLM with its
    lm_head, and the vision tower as ``llm_vision``: sd-cli's ``--llm_vision`` part) for the
    ``f16`` profile; ``Qwen2.5-VL-7B-Instruct-Q8_0.gguf`` (vectors F32, matrices Q8_0, no vision
    tower) for the GGUF ones."""
    text, vision, gguf = qwen25
    if quant == "F16":
        return [component("qwen25vl-7b:BF16", "te", "llm", "qwen_2.5_vl_7b.safetensors", text, "BF16"),
                component("qwen25vl-7b-vision:BF16", "te", "llm_vision", "qwen_2.5_vl_7b.safetensors", vision,
                          "BF16")]
    return [component("qwen25vl-7b:Q8_0", "te", "llm", "Qwen2.5-VL-7B-Instruct-Q8_0.gguf", gguf, "BF16", "Q8_0",
                      "llm")]


#: Component key prefix of a two-stage model's high-noise expert (role ``high_noise``).
HIGH_NOISE = "high-noise:"


def _umt5_component(quant: str, layout: Layout) -> Component:
    """Wan's UMT5-XXL encoder (``--t5xxl``): Comfy's ``umt5_xxl_fp16.safetensors`` (F16, with
    its ``spiece_model`` tokenizer blob as U8 bytes) for the ``f16`` profile; city96's
    ``umt5-xxl-encoder-Q8_0.gguf`` (T5-XXL's rule: vectors F32, relative attention biases
    F16, matrices Q8_0; the tokenizer in the GGUF metadata, no blob) for the others."""
    blob = [(n, s) for n, s in layout if n == "spiece_model"]
    model = [(n, s) for n, s in layout if n != "spiece_model"]
    if quant == "F16":
        c = component("umt5-xxl:F16", "te", "t5xxl", "umt5_xxl_fp16.safetensors", model, "F16")
        rows = tuple((n, tuple(s), "U8", math.prod(s)) for n, s in blob)
        return dataclasses.replace(c, tensors=c.tensors + rows)
    return component("umt5-xxl:Q8_0", "te", "t5xxl", "umt5-xxl-encoder-Q8_0.gguf", model, "F16", "Q8_0", "t5")


def profile_entry(spec: ModelSpec, suffix: str, t5_layout: Layout,
                  qwen3: tuple[Layout, Layout] = ([], []),
                  qwen8: tuple[Layout, Layout] = ([], []),
                  qwen25: tuple[Layout, Layout, Layout] = ([], [], []),
                  mistral: tuple[Layout, Layout, Layout] = ([], [], []),
                  umt5: Layout = ()) -> dict[str, object]:
    """The JSON entry of one built-in profile, classified by sdplan's own model-file code
    (modules, encoders, blocks of spec section 8, architecture detection)."""
    from sdplan.core.modelfiles.checkpoint import (
        ModelSet,
        ModelTensor,
        block_of,
        detect_architecture,
    )
    from sdplan.core.modelfiles.readers import TensorInfo

    quant = QUANTS[suffix]
    if quant == "F16":
        diff_file = spec.diffusion_file
        diff = component(f"{spec.name}:F16", "diffusion", None, diff_file, spec.diffusion,
                         spec.source if spec.source != "F32" else "F16")
        t5 = component("t5xxl:F16", "te", "t5xxl", "t5xxl_fp16.safetensors", t5_layout, "F16")
        llm = component("qwen3-4b:BF16", "te", "llm", "qwen_3_4b.safetensors", qwen3[0], "BF16")
        llm8 = component("qwen3-8b:BF16", "te", "llm", "qwen_3_8b.safetensors", qwen8[0], "BF16")
    else:
        diff_file = f"{spec.name}-{quant}.gguf"
        diff = component(f"{spec.name}:{quant}", "diffusion", None, diff_file,
                         spec.diffusion, spec.source, quant, spec.family)
        t5 = component("t5xxl:Q8_0", "te", "t5xxl", "t5-v1_1-xxl-encoder-Q8_0.gguf",
                       t5_layout, "F16", "Q8_0", "t5")
        llm = component("qwen3-4b:Q8_0", "te", "llm", "Qwen3-4B-Q8_0.gguf", qwen3[1], "BF16", "Q8_0", "llm")
        llm8 = component("qwen3-8b:Q8_0", "te", "llm", "Qwen3-8B-Q8_0.gguf", qwen8[1], "BF16", "Q8_0", "llm")
    comps = [diff, *spec.extras, *([t5] if spec.t5 else []), *([llm] if spec.qwen3 else []),
             *([llm8] if spec.qwen3_8b else [])]
    if spec.qwen25vl:
        comps += _qwen25vl_components(quant, qwen25)
    if spec.mistral:
        comps += _mistral_components(quant, mistral)
    if spec.umt5:
        comps.append(_umt5_component(quant, umt5))
    if spec.high_noise_file:
        hfile = spec.high_noise_file if quant == "F16" else spec.high_noise_file.replace(
            "_fp16.safetensors", f"-{quant}.gguf")
        comps.append(dataclasses.replace(diff, key=HIGH_NOISE + diff.key, file=hfile))
    tensors = [ModelTensor(TensorInfo(n, t, s, b, 0, c.key), c.module, c.encoder,
                           "high_noise" if c.key.startswith(HIGH_NOISE) else "main")
               for c in comps for n, s, t, b in c.tensors]
    ms = ModelSet([], tensors)
    dominant = ms.block_encoder()
    ms.tensors = [
        ModelTensor(t.info, t.module, t.encoder, t.role, block_of(t.info.name))
        if t.module == "diffusion" or (t.module == "te" and t.encoder == dominant) else t
        for t in tensors]
    arch = ms.architecture = detect_architecture(ms)
    prof = ms.profile()  # te: the LLM blocks the family reads (sdplan.core.modelfiles.te_read)
    dtypes: dict[str, int] = {}
    for t in ms.module_tensors("diffusion"):  # the (low-noise) diffusion model's
        dtypes[t.info.dtype] = dtypes.get(t.info.dtype, 0) + t.info.nbytes
    files: dict[str, int] = {}
    for c in comps:
        label = c.file
        if quant != "F16" and c.file == spec.diffusion_file:
            label = f"{c.file} without its diffusion model"
        files[label] = files.get(label, 0) + c.nbytes
    note = ""
    if quant.endswith("_K") and dtypes.get(quant, 0) < sum(dtypes.values()) // 2:
        note = (f"most rows are not a multiple of 256 wide, so {quant} falls back to F16 "
                "for them; prefer Q8_0 or Q4_0")
    return {
        "title": f"{spec.title} {quant}",
        "architecture": arch.name,
        "quant": quant,
        "modules": prof.to_json()["modules"],
        **({"phases": prof.to_json()["phases"]} if prof.phases else {}),
        "diffusion_dtypes": dict(sorted(dtypes.items(), key=lambda kv: -kv[1])),
        "files": files,
        **({"note": note} if note else {}),
    }


def build_profiles(layouts: dict) -> dict[str, object]:
    """Every built-in profile, keyed by name (``flux1-dev-q8_0``...)."""
    _sdplan()
    t5_layout = _real(layouts, "t5xxl_hf")
    qwen3 = (_real(layouts, "qwen3_4b_hf"), _real(layouts, "qwen3_4b_gguf"))
    qwen8 = qwen3_8b(layouts)
    qwen25 = qwen25vl(layouts)
    mistral = mistral_small(layouts)
    umt5 = _real(layouts, "umt5_xxl")
    out: dict[str, object] = {}
    for spec in build_specs(layouts):
        for suffix in QUANTS:
            name = f"{spec.name}-{suffix}"
            out[name] = profile_entry(spec, suffix, t5_layout, qwen3, qwen8, qwen25, mistral, umt5)
            log.info("%-20s %s", name, _summary(out[name]))
    return out


def _summary(entry: object) -> str:
    mods = entry["modules"]  # type: ignore[index]
    parts = [f"{m}={(sum(v['blocks']) + v['other']) / 2**30:.2f}GiB/{len(v['blocks'])}b"
             for m, v in mods.items()]
    return " ".join(parts)


def write(profiles: dict[str, object], out: Path) -> None:
    """Write the index compactly (one line per profile)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = ['{"format": 1, "profiles": {']
    items = list(profiles.items())
    for i, (name, entry) in enumerate(items):
        sep = "," if i < len(items) - 1 else ""
        lines.append(f"{json.dumps(name)}: {json.dumps(entry, separators=(',', ':'))}{sep}")
    lines.append("}}")
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    log.info("wrote %s (%d profiles, %d bytes)", out, len(items), out.stat().st_size)


def main(argv: Iterable[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layouts", type=Path,
                   default=REPO.parent / "shared" / "models" / "real_size_key_layouts.json")
    p.add_argument("--out", type=Path,
                   default=REPO / "resources" / "profiles" / "builtin_profiles.json")
    args = p.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    layouts = json.loads(args.layouts.read_text(encoding="utf-8"))
    layouts |= json.loads((REPO / "tests" / "fixtures" / "flux2_dev_layouts.json").read_text(encoding="utf-8"))
    write(build_profiles(layouts), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
