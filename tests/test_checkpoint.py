"""Model-file classification on small checkpoints built here in every layout.

Tensor names are those real checkpoints use; shapes are scaled down except where a width
is the evidence (cross-attention context, CLIP width). Files are written with the
``safetensors`` and ``gguf`` packages' own writers; byte counts are checked against numpy's
``nbytes`` and against ``gguf.GGUFReader``.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from safetensors.numpy import save_file
from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.checkpoint import (
    block_of,
    profile_from_model_flags,
    read_model_files,
)
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.planning.profile import Profile

F16 = np.float16


def write_st(path: Path, spec: dict[str, tuple[int, ...]], dtype=F16) -> dict[str, int]:
    """Write zeros of each shape; returns name -> bytes (numpy's count)."""
    arrays = {n: np.zeros(s, dtype) for n, s in spec.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(arrays, str(path))
    return {n: a.nbytes for n, a in arrays.items()}


def clip_hf(prefix: str, width: int, layers: int) -> dict[str, tuple[int, ...]]:
    """A transformers CLIPTextModel layout, ``layers`` layers of width ``width``."""
    d = {f"{prefix}embeddings.token_embedding.weight": (4, width),
         f"{prefix}embeddings.position_embedding.weight": (2, width),
         f"{prefix}final_layer_norm.weight": (width,)}
    for i in range(layers):
        d[f"{prefix}encoder.layers.{i}.self_attn.q_proj.weight"] = (8, width)
        d[f"{prefix}encoder.layers.{i}.mlp.fc1.weight"] = (4, width)
    return d


def open_clip(prefix: str, width: int, layers: int) -> dict[str, tuple[int, ...]]:
    """An OpenCLIP text tower (``transformer.resblocks.N``)."""
    d = {f"{prefix}token_embedding.weight": (4, width), f"{prefix}positional_embedding": (2, width),
         f"{prefix}ln_final.weight": (width,), f"{prefix}text_projection": (width, 8)}
    for i in range(layers):
        d[f"{prefix}transformer.resblocks.{i}.attn.in_proj_weight"] = (6, width)
        d[f"{prefix}transformer.resblocks.{i}.mlp.c_fc.weight"] = (8, width)
    return d


def t5(prefix: str, blocks: int) -> dict[str, tuple[int, ...]]:
    d = {f"{prefix}shared.weight": (16, 8), f"{prefix}encoder.final_layer_norm.weight": (8,)}
    for i in range(blocks):
        d[f"{prefix}encoder.block.{i}.layer.0.SelfAttention.q.weight"] = (8, 8)
        d[f"{prefix}encoder.block.{i}.layer.1.DenseReluDense.wi_0.weight"] = (12, 8)
    d[f"{prefix}encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = (32, 4)
    return d


def unet_ldm(prefix: str, ctx: int, sdxl: bool = False) -> dict[str, tuple[int, ...]]:
    d = {f"{prefix}input_blocks.0.0.weight": (8, 4, 3, 3),
         f"{prefix}time_embed.0.weight": (16, 8),
         f"{prefix}input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight": (8, ctx),
         f"{prefix}middle_block.1.transformer_blocks.0.attn1.to_q.weight": (8, 8),
         f"{prefix}output_blocks.2.1.transformer_blocks.1.ff.net.2.weight": (8, 16),
         f"{prefix}out.2.weight": (4, 8, 3, 3)}
    if sdxl:
        d[f"{prefix}label_emb.0.0.weight"] = (16, 12)
    return d


def vae_ldm(prefix: str) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}encoder.conv_in.weight": (8, 3, 3, 3),
            f"{prefix}encoder.down.0.block.0.conv1.weight": (8, 8, 3, 3),
            f"{prefix}decoder.up.1.block.2.conv1.weight": (8, 8, 3, 3),
            f"{prefix}decoder.conv_out.weight": (3, 8, 3, 3),
            f"{prefix}quant_conv.weight": (8, 8, 1, 1)}


def flux(double: int, single: int, guidance: bool) -> dict[str, tuple[int, ...]]:
    d = {"img_in.weight": (16, 64), "txt_in.weight": (16, 32), "time_in.in_layer.weight": (16, 8),
         "vector_in.in_layer.weight": (16, 12), "final_layer.linear.weight": (64, 16)}
    if guidance:
        d["guidance_in.in_layer.weight"] = (16, 8)
    for i in range(double):
        d[f"double_blocks.{i}.img_attn.qkv.weight"] = (48, 16)
        d[f"double_blocks.{i}.txt_mlp.0.weight"] = (64, 16)
    for i in range(single):
        d[f"single_blocks.{i}.linear1.weight"] = (80, 16)
    return d


def mmdit(prefix: str, depth: int) -> dict[str, tuple[int, ...]]:
    d = {f"{prefix}pos_embed": (1, 16, 24), f"{prefix}x_embedder.proj.weight": (24, 16, 2, 2),
         f"{prefix}context_embedder.weight": (24, 32), f"{prefix}final_layer.linear.weight": (64, 24)}
    for i in range(depth):
        d[f"{prefix}joint_blocks.{i}.x_block.attn.qkv.weight"] = (72, 24)
        d[f"{prefix}joint_blocks.{i}.context_block.mlp.fc1.weight"] = (96, 24)
    return d


def total(sizes: dict[str, int], pred=lambda n: True) -> int:
    return sum(v for n, v in sizes.items() if pred(n))


# --------------------------------------------------------------------------- block rule


@pytest.mark.parametrize("name, block", [
    ("double_blocks.3.img_attn.qkv.weight", (2, 3)),
    ("single_blocks.37.linear1.weight", (3, 37)),
    ("model.diffusion_model.joint_blocks.12.x_block.attn.qkv.weight", (1, 12)),
    ("encoder.block.23.layer.1.DenseReluDense.wo.weight", (5, 23)),
    ("text_model.encoder.layers.11.mlp.fc1.weight", (6, 11)),
    ("transformer_blocks.0.attn.to_q.weight", (0, 0)),
    ("blocks.7", (4, 7)),
    ("model.diffusion_model.input_blocks.4.1.transformer_blocks.0.attn1.to_q.weight", None),
    ("model.diffusion_model.middle_block.1.transformer_blocks.3.norm1.weight", None),
    ("down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight", None),
    ("mid_block.attentions.0.transformer_blocks.0.ff.net.2.weight", None),
    ("joint_blocks.0.x_block.attn.qkv.weight", (1, 0)),  # x_block is not a segment
    ("myblocks.3.weight", None),                         # segment must start the name or a part
    ("layers.3x.weight", None),                          # index must end at '.' or the end
    ("final_layer.linear.weight", None),
    ("single_transformer_blocks.5.proj_out.weight", (3, 5)),   # sd-cli's rename
    ("model.transformer.resblocks.2.attn.in_proj_weight", (6, 2)),
    ("blk.4.attn_q.weight", (6, 4)),
    # Chroma's approximator runs before the blocks: its layers are not blocks
    ("distilled_guidance_layer.layers.3.in_layer.weight", None),
    ("model.diffusion_model.distilled_guidance_layer.layers.0.out_layer.bias", None),
])
def test_block_of_follows_spec_section_8(name: str, block: tuple[int, int] | None) -> None:
    assert block_of(name) == block


@given(st.lists(st.sampled_from(["a", "b", "layers", "block", "blocks", "0", "12", "x"]),
                min_size=1, max_size=6))
def test_block_of_matches_a_plain_segment_scan(parts: list[str]) -> None:
    """Independent reference: scan the '.'-split segments for SEGMENT followed by digits."""
    name = ".".join(parts)
    segs = ["blocks", "block", "layers"]
    expect = None
    for i in range(len(parts) - 1):
        if parts[i] in segs and parts[i + 1].isdigit():
            expect = int(parts[i + 1])
            break
    got = block_of(name)
    assert (got[1] if got else None) == expect


# --------------------------------------------------------------------------- single files


def test_sd1_single_file(tmp_path: Path) -> None:
    spec = {**unet_ldm("model.diffusion_model.", 768),
            **clip_hf("cond_stage_model.transformer.text_model.", 768, 3),
            **vae_ldm("first_stage_model."),
            "alphas_cumprod": (1000,), "model_ema.decay": ()}
    sizes = write_st(tmp_path / "sd15.safetensors", spec)
    ms = read_model_files({"model": [tmp_path / "sd15.safetensors"]})
    assert ms.architecture.family == "sd1"
    assert "768" in ms.architecture.evidence[0]
    assert ms.modules() == ["diffusion", "te", "vae"]
    prof = ms.profile()
    diff = prof.modules["diffusion"]
    assert diff.blocks == ()  # UNet: transformer_blocks under UNet stages are never blocks
    assert diff.other == total(sizes, lambda n: n.startswith("model.diffusion_model."))
    te = prof.modules["te"]
    layer = 2 * (8 * 768 + 4 * 768)
    assert te.blocks == (layer, layer, layer)
    assert te.encoders == {"clip_l": total(sizes, lambda n: n.startswith("cond_stage"))}
    assert te.block_encoder == "clip_l"
    assert prof.modules["vae"].blocks == () and prof.modules["vae"].other == total(
        sizes, lambda n: n.startswith("first_stage_model."))
    assert {t.name for t, _ in ms.ignored} == {"alphas_cumprod", "model_ema.decay"}


@pytest.mark.parametrize(("metadata", "family"), [
    ({"sdplan.family": "sd1"}, "sd1"),
    ({"sdplan.family": "sd2"}, "sd2"),
    ({}, "unknown"),  # a context width of 64 alone names no family
    ({"sdplan.family": "flux"}, "unknown"),  # only UNet families are taken from metadata
])
def test_scaled_down_unet_family_from_metadata(tmp_path: Path, metadata, family) -> None:
    spec = {**unet_ldm("model.diffusion_model.", 64), **vae_ldm("first_stage_model.")}
    arrays = {n: np.zeros(s, F16) for n, s in spec.items()}
    save_file(arrays, str(tmp_path / "small.safetensors"), metadata=metadata or None)
    ms = read_model_files({"model": [tmp_path / "small.safetensors"]})
    assert ms.architecture.family == family
    if family != "unknown":
        assert "context 64" in ms.architecture.evidence[0]
        assert ms.architecture.evidence[-1] == f"file metadata sdplan.family = {family}"


def test_sd2_single_file_has_openclip_h(tmp_path: Path) -> None:
    spec = {**unet_ldm("model.diffusion_model.", 1024),
            **open_clip("cond_stage_model.model.", 1024, 2), **vae_ldm("first_stage_model.")}
    write_st(tmp_path / "sd21.safetensors", spec)
    ms = read_model_files({"model": [tmp_path / "sd21.safetensors"]})
    assert ms.architecture.family == "sd2"
    te = ms.profile().modules["te"]
    assert list(te.encoders) == ["clip_h"] and len(te.blocks) == 2


def test_sdxl_single_file_splits_clip_g_blocks(tmp_path: Path) -> None:
    spec = {**unet_ldm("model.diffusion_model.", 2048, sdxl=True),
            **clip_hf("conditioner.embedders.0.transformer.text_model.", 768, 2),
            **open_clip("conditioner.embedders.1.model.", 1280, 4),
            **vae_ldm("first_stage_model.")}
    sizes = write_st(tmp_path / "sdxl.safetensors", spec)
    ms = read_model_files({"model": [tmp_path / "sdxl.safetensors"]})
    assert ms.architecture.name == "sdxl"
    te = ms.profile().modules["te"]
    assert te.encoders == {
        "clip_l": total(sizes, lambda n: ".embedders.0." in n),
        "clip_g": total(sizes, lambda n: ".embedders.1." in n)}
    assert te.block_encoder == "clip_g"
    assert te.blocks == (2 * (6 * 1280 + 8 * 1280),) * 4
    assert te.other == te.encoders["clip_l"] + te.encoders["clip_g"] - sum(te.blocks)


def test_sd3_single_file_with_text_encoders(tmp_path: Path) -> None:
    spec = {**mmdit("model.diffusion_model.", 24),
            **clip_hf("text_encoders.clip_l.transformer.text_model.", 768, 2),
            **clip_hf("text_encoders.clip_g.transformer.text_model.", 1280, 3),
            **t5("text_encoders.t5xxl.transformer.", 4),
            **vae_ldm("first_stage_model.")}
    sizes = write_st(tmp_path / "sd3.safetensors", spec)
    ms = read_model_files({"model": [tmp_path / "sd3.safetensors"]})
    assert ms.architecture.name == "sd3-medium"
    prof = ms.profile()
    assert len(prof.modules["diffusion"].blocks) == 24
    te = prof.modules["te"]
    assert te.block_encoder == "t5xxl"
    t5_block0 = 2 * (8 * 8 + 12 * 8 + 32 * 4)
    assert te.blocks == (t5_block0,) + (2 * (8 * 8 + 12 * 8),) * 3
    assert te.encoders["t5xxl"] == total(sizes, lambda n: ".t5xxl." in n)
    assert te.total == total(sizes, lambda n: n.startswith("text_encoders."))


# --------------------------------------------------------------------------- several files


def test_flux_files_as_sd_cli_takes_them(tmp_path: Path) -> None:
    dit = write_st(tmp_path / "flux1-dev.safetensors", flux(3, 5, guidance=True))
    t5s = write_st(tmp_path / "t5xxl.safetensors", t5("", 6))
    cls = write_st(tmp_path / "clip_l.safetensors", clip_hf("text_model.", 768, 2))
    vae = write_st(tmp_path / "ae.safetensors", vae_ldm(""))
    tae = write_st(tmp_path / "taef1.safetensors",
                   {"1.weight": (8, 16, 3, 3), "3.conv.0.weight": (8, 8, 3, 3)})
    flags = {"diffusion_model": [tmp_path / "flux1-dev.safetensors"],
             "t5xxl": [tmp_path / "t5xxl.safetensors"],
             "clip_l": [tmp_path / "clip_l.safetensors"], "vae": [tmp_path / "ae.safetensors"],
             "taesd": [tmp_path / "taef1.safetensors"]}
    ms = read_model_files(flags)
    assert ms.architecture.name == "flux-dev"
    prof = ms.profile()
    diff = prof.modules["diffusion"]
    dbl, sgl = 2 * (48 * 16 + 64 * 16), 2 * 80 * 16
    assert diff.blocks == (dbl,) * 3 + (sgl,) * 5  # double blocks first, then single
    assert diff.total == total(dit)
    te = prof.modules["te"]
    assert te.encoders == {"clip_l": total(cls), "t5xxl": total(t5s)}
    assert te.block_encoder == "t5xxl" and len(te.blocks) == 6
    assert prof.modules["vae"].total == total(vae)  # the preview TAE is not the VAE
    assert ms.preview_bytes() == total(tae)
    assert prof == profile_from_model_flags(flags)
    assert Profile.from_json(json.loads(json.dumps(prof.to_json()))) == prof


def test_flux_schnell_via_model_flag(tmp_path: Path) -> None:
    write_st(tmp_path / "flux1-schnell.safetensors", flux(2, 2, guidance=False))
    ms = read_model_files({"model": [str(tmp_path / "flux1-schnell.safetensors")]})
    assert ms.architecture.name == "flux-schnell"
    assert any("no guidance_in" in e for e in ms.architecture.evidence)
    assert ms.modules() == ["diffusion"]


def test_chroma_is_not_flux_schnell(tmp_path: Path) -> None:
    """Chroma: FLUX.1 blocks without guidance_in, told apart by its distilled guidance layer;
    its approximator's 'layers.K' stay non-block bytes. The same in diffusers' names, with
    the ``model.diffusion_model.`` prefix, and Radiance's pixel-space patch embedder."""
    approx = {f"distilled_guidance_layer.{n}": (8, 8) for n in (
        "in_proj.weight", "layers.0.in_layer.weight", "layers.1.out_layer.weight", "out_proj.weight")}
    spec = {k: v for k, v in flux(2, 3, guidance=False).items() if not k.startswith(("time_in.", "vector_in."))}
    write_st(tmp_path / "Chroma1-HD.safetensors", {**spec, **approx})
    write_st(tmp_path / "t5xxl.safetensors", t5("", 4))
    ms = read_model_files({"diffusion_model": [tmp_path / "Chroma1-HD.safetensors"],
                           "t5xxl": [tmp_path / "t5xxl.safetensors"]})
    assert ms.architecture.name == "chroma"
    assert any("distilled_guidance_layer" in e for e in ms.architecture.evidence)
    diff = ms.profile().modules["diffusion"]
    assert len(diff.blocks) == 5 and diff.other >= 4 * 8 * 8 * 2
    write_st(tmp_path / "prefixed.safetensors", {"model.diffusion_model." + k: v for k, v in {**spec, **approx}.items()})
    assert read_model_files({"model": [tmp_path / "prefixed.safetensors"]}).architecture.name == "chroma"
    tr = {"transformer_blocks.0.attn.to_q.weight": (16, 16), "single_transformer_blocks.0.proj_mlp.weight": (32, 16),
          "distilled_guidance_layer.in_proj.weight": (8, 64)}
    write_st(tmp_path / "Chroma1-HD/transformer/diffusion_pytorch_model.safetensors", tr)
    assert read_model_files({"model": [tmp_path / "Chroma1-HD"]}).architecture.name == "chroma"
    write_st(tmp_path / "radiance.safetensors", {**spec, **approx, "img_in_patch.weight": (16, 3, 16, 16)})
    assert read_model_files({"model": [tmp_path / "radiance.safetensors"]}).architecture.name == "chroma-radiance"


def test_standalone_files_by_content(tmp_path: Path) -> None:
    """Files given positionally (as ``-m``) go to their module by their names."""
    write_st(tmp_path / "sd3.safetensors", mmdit("", 38))
    write_st(tmp_path / "t5.safetensors", t5("", 2))
    write_st(tmp_path / "clip_g.safetensors", clip_hf("text_model.", 1280, 2))
    write_st(tmp_path / "vae.safetensors", vae_ldm(""))
    write_st(tmp_path / "esrgan.safetensors", {"body.0.weight": (8, 3, 3, 3),
                                                 "body.1.weight": (8,)})
    ms = read_model_files({"model": sorted(tmp_path.iterdir())})
    assert ms.architecture.name == "sd3-large"
    assert ms.modules() == ["diffusion", "te", "vae", "upscaler"]
    assert ms.profile().modules["te"].encoders.keys() == {"clip_g", "t5xxl"}


def test_unknown_but_loadable_and_not_a_model(tmp_path: Path) -> None:
    write_st(tmp_path / "odd.safetensors", {"foo.weight": (4, 4), "bar.bias": (4,)})
    ms = read_model_files({"diffusion_model": [tmp_path / "odd.safetensors"]})
    assert ms.architecture.family == "unknown"
    assert "loadable" in ms.architecture.evidence[0]
    assert ms.profile().modules["diffusion"].other == 4 * 4 * 2 + 4 * 2
    with pytest.raises(ModelFileError, match="not a model") as err:
        read_model_files({"model": [tmp_path / "odd.safetensors"]})
    assert "odd.safetensors" in str(err.value)


def test_same_tensor_in_two_files_is_an_error(tmp_path: Path) -> None:
    write_st(tmp_path / "a.safetensors", clip_hf("text_model.", 768, 1))
    write_st(tmp_path / "b.safetensors", clip_hf("text_model.", 768, 1))
    with pytest.raises(ModelFileError, match="also in"):
        read_model_files({"clip_l": [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]})


def test_unknown_flag_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model-file flag"):
        read_model_files({"lora": [tmp_path / "x"]})


# --------------------------------------------------------------------------- diffusers


def test_diffusers_sdxl_folder_with_sharded_unet(tmp_path: Path) -> None:
    root = tmp_path / "sdxl-base"
    (root / "model_index.json").parent.mkdir(parents=True)
    (root / "model_index.json").write_text("{}")
    unet = {"conv_in.weight": (8, 4, 3, 3), "add_embedding.linear_1.weight": (16, 12),
            "down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight": (8, 2048),
            "mid_block.attentions.0.transformer_blocks.1.attn1.to_q.weight": (8, 8),
            "up_blocks.0.resnets.0.conv1.weight": (8, 8, 3, 3)}
    names = sorted(unet)
    s1 = write_st(root / "unet/diffusion_pytorch_model-00001-of-00002.safetensors",
                  {n: unet[n] for n in names[:2]})
    s2 = write_st(root / "unet/diffusion_pytorch_model-00002-of-00002.safetensors",
                  {n: unet[n] for n in names[2:]})
    wm = {n: "diffusion_pytorch_model-00001-of-00002.safetensors" for n in names[:2]}
    wm |= {n: "diffusion_pytorch_model-00002-of-00002.safetensors" for n in names[2:]}
    (root / "unet/diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": wm}))
    te1 = write_st(root / "text_encoder/model.safetensors", clip_hf("text_model.", 768, 2))
    te2 = write_st(root / "text_encoder_2/model.safetensors",
                   {**clip_hf("text_model.", 1280, 3), "text_projection.weight": (8, 1280)})
    write_st(root / "text_encoder_2/model.fp16.safetensors", {"x": (1,)})  # variant ignored
    vae = write_st(root / "vae/diffusion_pytorch_model.safetensors",
                   {"encoder.conv_in.weight": (8, 3, 3, 3),
                    "decoder.up_blocks.0.resnets.0.conv1.weight": (8, 8, 3, 3)})
    ms = read_model_files({"model": [root]})
    assert ms.architecture.name == "sdxl"
    prof = ms.profile()
    assert prof.modules["diffusion"].blocks == ()
    assert prof.modules["diffusion"].other == total(s1) + total(s2)
    te = prof.modules["te"]
    assert te.encoders == {"clip_l": total(te1), "clip_g": total(te2)}
    assert te.block_encoder == "clip_g" and len(te.blocks) == 3
    assert prof.modules["vae"].total == total(vae)


def test_diffusers_flux_folder(tmp_path: Path) -> None:
    root = tmp_path / "FLUX.1-dev"
    tr = {"x_embedder.weight": (16, 64), "time_text_embed.guidance_embedder.linear_1.weight":
          (16, 8), "proj_out.weight": (64, 16)}
    for i in range(2):
        tr[f"transformer_blocks.{i}.attn.to_q.weight"] = (16, 16)
    for i in range(3):
        tr[f"single_transformer_blocks.{i}.proj_mlp.weight"] = (32, 16)
    write_st(root / "transformer/diffusion_pytorch_model.safetensors", tr)
    write_st(root / "text_encoder/model.safetensors", clip_hf("text_model.", 768, 1))
    write_st(root / "text_encoder_2/model.safetensors", t5("", 2))
    ms = read_model_files({"model": [root]})
    assert ms.architecture.name == "flux-dev"
    prof = ms.profile()
    assert prof.modules["diffusion"].blocks == (512,) * 2 + (1024,) * 3
    assert prof.modules["te"].block_encoder == "t5xxl"


def test_diffusers_folder_only_with_model_flag(tmp_path: Path) -> None:
    write_st(tmp_path / "p/unet/diffusion_pytorch_model.safetensors", unet_ldm("", 768))
    with pytest.raises(ModelFileError, match="pipeline folder"):
        read_model_files({"vae": [tmp_path / "p"]})


def test_missing_shard_is_an_error(tmp_path: Path) -> None:
    d = tmp_path / "p/unet"
    d.mkdir(parents=True)
    (d / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "missing.safetensors"}}))
    with pytest.raises(ModelFileError, match="missing"):
        read_model_files({"model": [tmp_path / "p"]})


# --------------------------------------------------------------------------- GGUF


def write_gguf(path: Path) -> None:
    """A quantised Flux-layout GGUF: Q8_0 and Q4_0 block weights, F16/F32 others."""
    w = gguf.GGUFWriter(str(path), "flux")
    w.add_string("general.name", "tiny-flux")
    w.add_array("tokens", ["a", "bb", "ccc"])
    w.add_tensor("img_in.weight", np.zeros((16, 64), np.float32))
    w.add_tensor("guidance_in.in_layer.weight", np.zeros((16, 8), np.float16))
    q8 = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0]
    q4 = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q4_0]
    for i in range(2):  # 32 rows of 64 elements each
        w.add_tensor(f"double_blocks.{i}.img_attn.qkv.weight",
                     np.zeros((32, 64 // q8[0] * q8[1]), np.uint8),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    for i in range(3):
        w.add_tensor(f"single_blocks.{i}.linear1.weight",
                     np.zeros((32, 64 // q4[0] * q4[1]), np.uint8),
                     raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_reader_agrees_with_gguf_package(tmp_path: Path) -> None:
    path = tmp_path / "flux1-dev-Q4_0.gguf"
    write_gguf(path)
    tf = read_tensor_file(path)
    ref = gguf.GGUFReader(str(path))
    assert tf.format == "gguf" and tf.metadata["general.name"] == "tiny-flux"
    got = {t.name: (t.dtype, t.shape, t.nbytes, t.offset) for t in tf.tensors}
    want = {t.name: (t.tensor_type.name, tuple(int(x) for x in reversed(t.shape)),
                     int(t.n_bytes), int(t.data_offset)) for t in ref.tensors}
    assert got == want
    assert got["double_blocks.0.img_attn.qkv.weight"] == (
        "Q8_0", (32, 64), 32 * 2 * 34, got["double_blocks.0.img_attn.qkv.weight"][3])
    assert got["single_blocks.2.linear1.weight"][2] == 32 * 2 * 18


def test_gguf_flux_profile(tmp_path: Path) -> None:
    path = tmp_path / "flux1-dev-Q4_0.gguf"
    write_gguf(path)
    ms = read_model_files({"diffusion_model": [path]})
    assert ms.architecture.name == "flux-dev"
    diff = ms.profile().modules["diffusion"]
    assert diff.blocks == (2176, 2176, 1152, 1152, 1152)
    assert diff.other == 16 * 64 * 4 + 16 * 8 * 2
    assert ms.dtype_mix("diffusion") == {"Q8_0": 4352, "Q4_0": 3456, "F32": 4096, "F16": 256}


# --------------------------------------------------------------------------- command


def test_inspect_command_json_and_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    from sdplan.core.cli import main

    write_st(tmp_path / "flux.safetensors", flux(2, 3, guidance=True))
    t5s = write_st(tmp_path / "t5.safetensors", t5("", 2))
    out = tmp_path / "profile.json"
    rc = main(["inspect", str(tmp_path / "flux.safetensors"), "--t5xxl",
               str(tmp_path / "t5.safetensors"), "--json", "--write-profile", str(out)])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["architecture"]["name"] == "flux-dev"
    assert data["modules"]["diffusion"]["blocks"] == 5
    assert data["modules"]["te"]["encoders"] == {"t5xxl": total(t5s)}
    prof = Profile.load(out)
    assert prof == read_model_files({"model": [tmp_path / "flux.safetensors"],
                                     "t5xxl": [tmp_path / "t5.safetensors"]}).profile()
    assert main(["inspect", str(tmp_path / "flux.safetensors")]) == 0
    assert "flux-dev" in capsys.readouterr().out
    (tmp_path / "junk.safetensors").write_bytes(b"\x10" + b"\0" * 7 + b"junk" * 4)
    assert main(["inspect", str(tmp_path / "junk.safetensors"), "--json"]) == 2
    err = json.loads(capsys.readouterr().out)["error"]
    assert err["code"] == "invalid_model_file" and "junk.safetensors" in err["message"]


def test_a_folder_of_several_model_files_names_them_instead_of_picking_one(tmp_path: Path) -> None:
    """``-m FOLDER`` with two model files is an error naming the folder and its files (it took
    the first by name before, and said so only in the log); one file, or one file beside its
    fp16 variant, is read as before."""
    spec = {"model.diffusion_model.input_blocks.0.0.weight": (4, 4, 3, 3)}
    write_st(tmp_path / "b.safetensors", spec)
    (tmp_path / "a.safetensors").write_bytes(b"xx")
    with pytest.raises(ModelFileError, match=r"folder holds 2 model files \(a.safetensors, b.safetensors\); "
                                             r"name one of them"):
        read_model_files({"model": [str(tmp_path)]})
    (tmp_path / "a.safetensors").unlink()
    write_st(tmp_path / "b.fp16.safetensors", spec)
    ms = read_model_files({"model": [str(tmp_path)]})
    assert {t.info.name for t in ms.tensors} == set(spec)
