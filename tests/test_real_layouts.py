"""Full-size layouts from ``../shared/models``: sparse safetensors files with the real tensor
names and shapes (data region left sparse) classify as the real models do.

Expected figures are computed here from the shapes in the layout file (element counts times
dtype size), independently of the reader.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

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
