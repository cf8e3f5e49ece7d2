"""Full-size layouts from ``../shared/models``: sparse safetensors files with the real tensor
names and shapes (data region left sparse) classify as the real models do.

Expected figures are computed here from the shapes in the layout file (element counts times
dtype size), independently of the reader.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from sdplan.core.modelfiles.checkpoint import read_model_files
from sparse_writer import Layout, write_sparse


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, Layout]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


def nbytes(shapes: Layout, pred=lambda n: True, size: int = 2) -> int:
    return sum(math.prod(s) * size for n, s in shapes.items() if pred(n))


def test_flux1_dev_full_size(tmp_path: Path, layouts: dict[str, Layout]) -> None:
    fl = layouts["flux1_dev_bfl"]
    path = tmp_path / "flux1-dev.safetensors"
    data = write_sparse(path, fl)
    assert data > 23 * 10**9  # 11.9 B parameters in BF16
    ms = read_model_files({"model": [path]})
    assert ms.architecture.name == "flux-dev"
    diff = ms.profile().modules["diffusion"]
    assert len(diff.blocks) == 57  # 19 double + 38 single
    assert diff.blocks[0] == nbytes(fl, lambda n: n.startswith("double_blocks.0."))
    assert diff.blocks[19] == nbytes(fl, lambda n: n.startswith("single_blocks.0."))
    assert diff.other == nbytes(fl, lambda n: "_blocks." not in n)
    assert diff.total == data


def test_flux1_schnell_without_guidance(tmp_path: Path, layouts: dict[str, Layout]) -> None:
    fl = {n: s for n, s in layouts["flux1_dev_bfl"].items() if not n.startswith("guidance_in.")}
    path = tmp_path / "flux1-schnell.safetensors"
    write_sparse(path, fl)
    ms = read_model_files({"diffusion_model": [path]})
    assert ms.architecture.name == "flux-schnell"
    assert len(ms.profile().modules["diffusion"].blocks) == 57


def test_flux_with_its_encoders_and_vae(tmp_path: Path, layouts: dict[str, Layout]) -> None:
    files = {"diffusion_model": ("flux1_dev_bfl", ""), "t5xxl": ("t5xxl_hf", ""),
             "clip_l": ("clip_l_hf", "text_model."), "vae": ("sd_vae_ldm", "")}
    flags = {}
    for flag, (key, prefix) in files.items():
        shapes = layouts[key]
        if key == "sd_vae_ldm":
            shapes = {n.removeprefix("first_stage_model."): s for n, s in shapes.items()}
        write_sparse(tmp_path / f"{key}.safetensors", shapes, "F16", prefix)
        flags[flag] = [tmp_path / f"{key}.safetensors"]
    prof = read_model_files(flags).profile()
    te = prof.modules["te"]
    assert te.block_encoder == "t5xxl" and len(te.blocks) == 24
    assert te.encoders == {"clip_l": nbytes(layouts["clip_l_hf"]),
                           "t5xxl": nbytes(layouts["t5xxl_hf"])}
    assert te.other == te.encoders["clip_l"] + nbytes(
        layouts["t5xxl_hf"], lambda n: not n.startswith("encoder.block."))
    assert prof.modules["vae"].blocks == ()
    assert prof.modules["vae"].other == nbytes(layouts["sd_vae_ldm"])
    assert prof.architecture == "flux-dev"


def test_sd3_medium(tmp_path: Path, layouts: dict[str, Layout]) -> None:
    path = tmp_path / "sd3_medium.safetensors"
    write_sparse(path, layouts["sd3_medium_sai"], "F16", "model.diffusion_model.")
    ms = read_model_files({"model": [path]})
    assert ms.architecture.name == "sd3-medium"
    assert len(ms.profile().modules["diffusion"].blocks) == 24


def test_sd15_single_file(tmp_path: Path, layouts: dict[str, Layout]) -> None:
    shapes = {**layouts["sd15_unet_ldm"], **layouts["sd_vae_ldm"]}
    shapes |= {"cond_stage_model.transformer.text_model." + n: s
               for n, s in layouts["clip_l_hf"].items()}
    path = tmp_path / "v1-5.safetensors"
    write_sparse(path, shapes, "F16")
    ms = read_model_files({"model": [path]})
    assert ms.architecture.name == "sd1"
    prof = ms.profile()
    assert prof.modules["diffusion"].blocks == ()  # UNet: no blocks
    assert prof.modules["diffusion"].other == nbytes(layouts["sd15_unet_ldm"])
    assert len(prof.modules["te"].blocks) == 12
    assert prof.modules["vae"].other == nbytes(layouts["sd_vae_ldm"])


def test_sdxl_unet(tmp_path: Path, layouts: dict[str, Layout]) -> None:
    path = tmp_path / "sdxl_unet.safetensors"
    write_sparse(path, layouts["sdxl_unet_ldm"], "F16")
    ms = read_model_files({"model": [path]})
    assert ms.architecture.name == "sdxl"
    assert ms.profile().modules["diffusion"].blocks == ()


def test_real_tae_and_esrgan_weights(shared_dir: Path) -> None:
    w = shared_dir / "weights"
    ms = read_model_files({"taesd": [w / "taef2_decoder.safetensors"],
                           "upscale_model": [w / "realesr-animevideov3.safetensors"]})
    assert ms.preview_bytes() == sum(t.info.nbytes for t in ms.module_tensors("vae", "preview"))
    assert len(ms.module_tensors("vae", "preview")) == 79
    assert ms.module_bytes("upscaler") > 600_000 * 4  # 621 K float32 parameters
    by_content = read_model_files({"model": [w / "realesr-animevideov3.safetensors",
                                             w / "taef2_encoder.safetensors"]})
    assert by_content.modules() == ["vae", "upscaler"]


# --------------------------------------------------------------------------- Chroma
# No Chroma layout is in ../shared/models: Chroma1-HD's is FLUX.1-dev's real layout without
# the modulation Chroma prunes, plus the approximator as sd-cli's ChromaApproximator builds it
# (in 64, hidden 5120, 5 layers, out 3072). tools/make_profiles.py derives the same layout
# from diffusers' ChromaTransformer2DModel and its checkpoint converter: 643 tensors,
# 8,899,983,424 parameters, "8.9 B" on the model card, "17.8 GB" in BF16 on the hub.
CHROMA_PARAMS = 8_899_983_424


def chroma_layout(layouts: dict[str, Layout]) -> Layout:
    pruned = ("time_in.", "vector_in.", "guidance_in.", "final_layer.adaLN_modulation.")
    out = {n: s for n, s in layouts["flux1_dev_bfl"].items()
           if not n.startswith(pruned) and "_mod.lin." not in n and ".modulation.lin." not in n}
    a = "distilled_guidance_layer."
    out |= {a + "in_proj.weight": [5120, 64], a + "in_proj.bias": [5120],
            a + "out_proj.weight": [3072, 5120], a + "out_proj.bias": [3072]}
    for k in range(5):
        out |= {f"{a}norms.{k}.scale": [5120]}
        for lin in ("in_layer", "out_layer"):
            out |= {f"{a}layers.{k}.{lin}.weight": [5120, 5120], f"{a}layers.{k}.{lin}.bias": [5120]}
    return out


def write_sparse_gguf(path: Path, shapes: Layout, quantise) -> int:
    """A GGUF header for ``shapes`` (``quantise(name, shape)``: a ggml type name), data sparse;
    returns the tensors' bytes."""
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "flux")
    sizes = []
    for name, shape in shapes.items():
        kind = gguf.GGMLQuantizationType[quantise(name, shape)]
        block, size = gguf.GGML_QUANT_SIZES[kind]
        sizes.append(math.prod(shape) // block * size)
        w.add_tensor_info(name, (*shape[:-1], shape[-1] // block * size), np.uint8, sizes[-1], raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with open(path, "r+b") as fh:  # data region: aligned start, each tensor padded to 32 bytes
        start = -(-fh.seek(0, 2) // 32) * 32
        fh.truncate(start + sum(-(-n // 32) * 32 for n in sizes))
    return sum(sizes)


def test_chroma1_hd_inspects_and_plans_with_a_layer_split(tmp_path: Path, layouts: dict[str, Layout]) -> None:
    from sdplan.core.planning import plan as P
    from sdplan.core.planning.inventory import Inventory

    ch = chroma_layout(layouts)
    assert len(ch) == 643 and sum(math.prod(s) for s in ch.values()) == CHROMA_PARAMS
    dit = tmp_path / "Chroma1-HD.safetensors"
    data = write_sparse(dit, ch)
    assert abs(data - 17.8e9) < 0.003 * 17.8e9
    flags = {"diffusion_model": [dit], "t5xxl": [tmp_path / "t5.safetensors"], "vae": [tmp_path / "ae.safetensors"]}
    write_sparse(flags["t5xxl"][0], layouts["t5xxl_hf"], "F16")
    write_sparse(flags["vae"][0], {n.removeprefix("first_stage_model."): s for n, s in layouts["sd_vae_ldm"].items()},
                 "F32")
    ms = read_model_files(flags)
    assert ms.architecture.name == "chroma"
    assert not any("double_blocks" in e and "schnell" in e for e in ms.architecture.evidence)
    prof = ms.profile()
    diff = prof.modules["diffusion"]
    assert len(diff.blocks) == 57  # 19 double + 38 single; the approximator's layers are not blocks
    assert diff.blocks[0] == nbytes(ch, lambda n: n.startswith("double_blocks.0."))
    assert diff.blocks[19] == nbytes(ch, lambda n: n.startswith("single_blocks.0."))
    assert diff.other == nbytes(ch, lambda n: "_blocks." not in n)
    assert diff.other > nbytes(ch, lambda n: n.startswith("distilled_guidance_layer.")) > 0.5e9
    assert diff.total == data
    te = prof.modules["te"]
    assert te.encoders == {"t5xxl": nbytes(layouts["t5xxl_hf"])} and len(te.blocks) == 24
    gib = 1 << 30
    inv = Inventory.from_json({"devices": [
        {"name": n, "description": n, "type": "gpu", "registry": "CUDA", "free": 12 * gib, "total": 12 * gib}
        for n in ("CUDA0", "CUDA1")] + [{"name": "CPU", "description": "host", "type": "cpu",
                                         "registry": "CPU", "free": 64 * gib, "total": 64 * gib}]})
    mp = P.resolve(["--backend", "diffusion=CUDA0&CUDA1,te=CPU"], inv, prof).modules["diffusion"]
    assert [r.device for r in mp.ranges] == ["CUDA0", "CUDA1"]
    assert mp.ranges[0].first_block == 0 and mp.ranges[-1].last_block == 56
    assert sum(r.bytes for r in mp.ranges) == sum(diff.blocks) and mp.main_other_bytes == diff.other


def test_chroma1_hd_q8_0_gguf(tmp_path: Path, layouts: dict[str, Layout]) -> None:
    ch = chroma_layout(layouts)
    keep = ("img_in.", "txt_in.", "final_layer.", "distilled_guidance_layer.")

    def kind(name: str, shape: list[int]) -> str:
        if len(shape) == 2 and name.endswith("weight") and not name.startswith(keep):
            return "Q8_0"
        return "F32" if len(shape) == 1 else "BF16"

    path = tmp_path / "Chroma1-HD-Q8_0.gguf"
    total = write_sparse_gguf(path, ch, kind)
    ms = read_model_files({"diffusion_model": [path]})
    assert ms.architecture.name == "chroma"
    diff = ms.profile().modules["diffusion"]
    assert len(diff.blocks) == 57 and diff.total == total
    assert 0.5 < total / nbytes(ch) < 0.6  # mostly 34 bytes per 32 weights against 2 per weight
    assert ms.dtype_mix("diffusion")["Q8_0"] > 0.9 * total
