"""DiT layouts cut to their first blocks, shared by the benchmarks that time a model's call
per block (bench/bench_cpu_bf16_families.py, bench/bench_dit_blocks.py).

Every block of one stack of a DiT has the same shapes, so the real model's names and shapes
(``../shared/models/real_size_key_layouts.json``) cut to blocks ``0 .. N-1`` of every stack
give a module whose call costs N blocks of each stack plus the rest (embedders, final layer).
:func:`cut_layout` cuts; :data:`DITS` says, per family, the layout, sdplan's model class, the
text tokens its pipeline passes the DiT and the latent it takes; :func:`chroma_layout`
derives Chroma's names from FLUX.1-dev's (no Chroma layout is stored); :func:`native_inputs`
builds one call's inputs at a size in pixels; :func:`stacks` counts each stack's blocks;
:func:`block_flops` estimates each stack's multiply-adds per block, which turns the time of a
cut call into the time of the whole model's call (:func:`flops_of`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Blocks of a family: a name's first "<stack>.<index>." decides whether it is kept (Chroma's
#: distilled guidance layer keeps its layers: it is no block stack).
BLOCK = re.compile(r"(?<!distilled_guidance_layer)(?:^|\.)(double_blocks|single_blocks|joint_blocks|transformer_blocks|layers|block|"
                   r"noise_refiner|context_refiner)\.(\d+)\.")
EMBED_ROWS = 4096


def cut_layout(layout: Mapping[str, Any], blocks: int) -> dict[str, tuple[int, ...]]:
    """The layout's names of blocks ``0 .. blocks-1`` of every stack (and every name outside
    the stacks), embedding tables cut to EMBED_ROWS rows. Where a stack's real last block has
    other names than its first (SD3's last joint block has no text-stream output layers), the
    cut's last block takes the real last block's names, as a model of that many blocks has."""
    out: dict[str, tuple[int, ...]] = {}
    last: dict[str, int] = {}
    for name in layout:
        m = BLOCK.search(name)
        if m:
            last[m.group(1)] = max(last.get(m.group(1), 0), int(m.group(2)))
    sets: dict[tuple[str, int], set[str]] = {}
    for name in layout:
        m = BLOCK.search(name)
        if m and int(m.group(2)) in (0, last[m.group(1)]):
            sets.setdefault((m.group(1), int(m.group(2))), set()).add(name[m.end():])
    odd = {s for s, n in last.items() if n >= blocks and sets[(s, 0)] != sets[(s, n)]}
    for name, shape in layout.items():
        m = BLOCK.search(name)
        if m:
            stack, i = m.group(1), int(m.group(2))
            if stack in odd:
                if i == last[stack]:  # the real last block, renumbered as the cut's last
                    name = f"{name[:m.start(2)]}{blocks - 1}{name[m.end(2):]}"
                elif i >= blocks - 1:
                    continue
            elif i >= blocks:
                continue
        shape = tuple(shape)
        if re.search(r"(embed_tokens|shared|token_embd)\.weight$", name):
            shape = (min(shape[0], EMBED_ROWS),) + shape[1:]
        out[name] = shape
    return out


def stacks(layout: Mapping[str, Any]) -> dict[str, int]:
    """Blocks per stack of a layout: stack name -> count (highest index + 1)."""
    out: dict[str, int] = {}
    for name in layout:
        m = BLOCK.search(name)
        if m:
            out[m.group(1)] = max(out.get(m.group(1), 0), int(m.group(2)) + 1)
    return out


# --------------------------------------------------------------------------- families


@dataclass(frozen=True)
class DiT:
    """A family's DiT as the block benchmark runs it.

    Attributes:
        layout: its key in real_size_key_layouts.json (Chroma: FLUX.1-dev's, converted by
            :func:`chroma_layout`).
        cls: sdplan's model class, ``module:Class``.
        title: what it is, for tables.
        txt: the text tokens the family's pipeline passes the DiT (see :data:`DITS`).
        vae: its autoencoder's key in :data:`VAES`.
        width_key: a name whose first dimension is the model width (attention FLOPs).
        dtype: the released file's dtype of its matrices (safetensors name): BF16, SD3-medium's
            ``sd3_medium.safetensors`` F16.
    """

    layout: str
    cls: str
    title: str
    txt: int
    vae: str
    width_key: str
    dtype: str = "BF16"


#: family -> its DiT. Text tokens: FLUX.1 256 (the pipeline's ``t5_length`` default, sd-cli's;
#: the registry's ComputeShape says 512, diffusers' pipeline default); Chroma 512 (T5 padded
#: to 512; sdplan then keeps the prompt's tokens + 1 under the DiT mask, so 512 is the
#: unmasked upper bound both engines can run alike); SD3 154 (77 CLIP + 77 T5 rows, one
#: chunk); FLUX.2 klein 512 (the LLM's states padded to 512); Z-Image 512 (the registry's);
#: Qwen-Image 256 (the dry run's DRY_RUN_TOKENS, the registry's).
DITS: dict[str, DiT] = {
    "flux": DiT("flux1_dev_bfl", "sdplan.core.models.flux:FluxDiT", "FLUX.1-dev", 256, "flux1_ae", "img_in.weight"),
    "chroma": DiT("flux1_dev_bfl", "sdplan.core.models.chroma:ChromaDiT", "Chroma", 512, "flux1_ae", "img_in.weight"),
    "sd3": DiT("sd3_medium_sai", "sdplan.core.models.mmdit:MMDiT", "SD3-medium", 154, "flux1_ae",
               "context_embedder.weight", "F16"),
    "flux2": DiT("flux2_klein_4b", "sdplan.core.models.flux2:Flux2DiT", "FLUX.2 klein 4B", 512, "flux2_vae",
                 "img_in.weight"),
    "z_image": DiT("z_image_turbo", "sdplan.core.models.z_image:ZImageDiT", "Z-Image Turbo", 512, "flux1_ae",
                   "x_embedder.weight"),
    "qwen_image": DiT("qwen_image_dit", "sdplan.core.models.qwen_image:QwenImageDiT", "Qwen-Image", 256,
                      "qwen_image_vae", "img_in.weight"),
}

#: autoencoder -> (layout key, the released file's dtype, latent channels, what uses it)
VAES: dict[str, tuple[str, str, int, str]] = {
    "flux1_ae": ("flux1_ae_bfl", "F32", 16, "FLUX.1 / Chroma / Z-Image (SD3's is the same architecture)"),
    "flux2_vae": ("flux2_vae", "F32", 32, "FLUX.2"),
    "qwen_image_vae": ("qwen_image_vae", "BF16", 16, "Qwen-Image (one frame)"),
}

#: Chroma1-HD's distilled guidance layer (diffusers ChromaTransformer2DModel's defaults):
#: input width, hidden width, layers
CHROMA_APPROX = (64, 5120, 5)


def chroma_layout(flux: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Chroma's names and shapes from FLUX.1-dev's layout: the same blocks without their
    modulation linears (``{img,txt}_mod.lin``, ``modulation.lin``), no ``time_in`` /
    ``vector_in`` / ``guidance_in`` / final ``adaLN_modulation``, plus the distilled guidance
    layer of :data:`CHROMA_APPROX` (sdplan.core.models.chroma's module docstring lists them)."""
    drop = re.compile(r"(_mod\.lin\.|modulation\.lin\.|^time_in\.|^vector_in\.|^guidance_in\.|"
                      r"^final_layer\.adaLN_modulation\.)")
    out = {n: tuple(s) for n, s in flux.items() if not drop.search(n)}
    a_in, hidden, layers = CHROMA_APPROX
    width = tuple(flux["img_in.weight"])[0]
    p = "distilled_guidance_layer."
    out.update({p + "in_proj.weight": (hidden, a_in), p + "in_proj.bias": (hidden,),
                p + "out_proj.weight": (width, hidden), p + "out_proj.bias": (width,)})
    for k in range(layers):
        for lin in ("in_layer", "out_layer"):
            out.update({f"{p}layers.{k}.{lin}.weight": (hidden, hidden), f"{p}layers.{k}.{lin}.bias": (hidden,)})
        out[f"{p}norms.{k}.scale"] = (hidden,)
    return out


def dit_layout(family: str, layouts: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[int, ...]]:
    """The real model's whole layout for ``family`` (names -> shapes)."""
    lay = layouts[DITS[family].layout]
    return chroma_layout(lay) if family == "chroma" else {n: tuple(s) for n, s in lay.items()}


def model_class(family: str) -> Any:
    """sdplan's model class of ``family``'s DiT."""
    import importlib

    mod_path, cls_name = DITS[family].cls.split(":")
    return getattr(importlib.import_module(mod_path), cls_name)


def latent_shape(family: str, model: Any, px: int) -> tuple[int, int, int, int]:
    """The latent ``(1, C, h, w)`` of a ``px`` x ``px`` picture the model takes: FLUX.2's
    autoencoder is 16x with the DiT's 128 channels (its 2x2 patches already folded in),
    the others 8x with 16 channels and 2x2 patches in the DiT."""
    if family == "flux2":
        return (1, model.cfg.in_channels, px // 16, px // 16)
    return (1, 16, px // 8, px // 8)


def image_tokens(family: str, model: Any, px: int) -> int:
    """Image tokens of a ``px`` x ``px`` picture (4096 at 1024 px for every family here)."""
    _, _, h, w = latent_shape(family, model, px)
    return h * w if family == "flux2" else (h // 2) * (w // 2)


def native_inputs(family: str, model: Any, px: int, txt: int, seed: int = 1) -> dict[str, np.ndarray]:
    """One call's inputs (random latent and text states) for ``model`` of ``family`` at
    ``px`` x ``px`` pixels and ``txt`` text tokens, sigma 0.5."""
    rng = np.random.default_rng(seed)
    c = model.cfg
    lat = rng.standard_normal(latent_shape(family, model, px)).astype(np.float32)
    ctx = rng.standard_normal((1, txt, c.context)).astype(np.float32)
    if family in ("flux2", "z_image", "qwen_image"):
        return model.inputs(lat, ctx, 0.5)
    if family == "chroma":
        return model.inputs(lat, ctx, None, 0.5)
    pooled = rng.standard_normal((1, c.pooled)).astype(np.float32)
    if family == "sd3":
        return model.inputs(lat, ctx, pooled, 0.5)
    return model.inputs(lat, ctx, pooled, 0.5, 3.5)


# --------------------------------------------------------------------------- cost model

_MOD = re.compile(r"(_mod\.|modulation|adaLN)")
_TXT = re.compile(r"(txt_|context_block|add_[qkv]_proj|to_add_out)")


def block_flops(layout: Mapping[str, Any], n_img: int, n_txt: int, width: int) -> dict[str, float]:
    """Multiply-adds of one block of each stack (block 0's shapes): each matrix times the
    tokens it sees (modulation: 1; the text stream: ``n_txt``; a single-stream block, Z-Image's
    main layers: ``n_img + n_txt``; Z-Image's context refiner: ``n_txt``; otherwise
    ``n_img``) plus attention's two products, ``2 S^2 width`` over its sequence S. An
    estimate for sharing a measured call among stacks, not a timing."""
    seq = {"context_refiner": n_txt, "noise_refiner": n_img}
    out: dict[str, float] = {}
    for name, shape in layout.items():
        m = BLOCK.search(name)
        if not m or m.group(2) != "0" or len(shape) < 2:
            continue
        stack = m.group(1)
        rest = name[m.end():]
        if _MOD.search(rest):
            t = 1
        elif stack in seq:
            t = seq[stack]
        elif _TXT.search(rest):
            t = n_txt
        elif stack in ("single_blocks", "layers"):
            t = n_img + n_txt
        else:
            t = n_img
        out[stack] = out.get(stack, 0.0) + float(np.prod(shape)) * t
    for stack in out:
        s = seq.get(stack, n_img + n_txt)
        out[stack] += 2.0 * s * s * width
    return out


def flops_of(counts: Mapping[str, int], per_block: Mapping[str, float]) -> float:
    """Multiply-adds of a model with ``counts`` blocks per stack (:func:`block_flops`)."""
    return sum(n * per_block.get(s, 0.0) for s, n in counts.items())
