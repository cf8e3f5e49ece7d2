"""SDXL base 1.0 at full size from ``../shared/models`` (``sdxl_base_ldm_full``: the whole
single file's 2515 tensor names and shapes, data left sparse): ``sdplan inspect`` and
``sdplan plan`` on it, the engine's view of its UNet and encoders (shapes only, nothing
computed), and the built-in SDXL profiles against its bytes.

Expected figures are computed here from the layout's shapes (elements times dtype size;
F16, except ``position_ids`` int64 and the 0-d ``logit_scale``, as in the published file).
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

import pytest
from sdplan.core import cli
from sdplan.core.planning.builtin_profiles import load_builtin_profile

Layout = dict[str, list[int]]
GIB = 1 << 30
SIZES = {"F16": 2, "F32": 4, "I64": 8}


@pytest.fixture(scope="module")
def layout(shared_dir: Path) -> Layout:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())["sdxl_base_ldm_full"]


def dtype_of(name: str) -> str:
    return "I64" if name.endswith("position_ids") else "F16"


def nbytes(layout: Layout, pred=lambda n: True) -> int:
    return sum(math.prod(s) * SIZES[dtype_of(n)] for n, s in layout.items() if pred(n))


@pytest.fixture(scope="module")
def sparse(layout: Layout, tmp_path_factory) -> Path:
    """The layout as a sparse safetensors file (header, then one byte at the data's end)."""
    path = tmp_path_factory.mktemp("sdxl") / "sd_xl_base_1.0.safetensors"
    header, off = {}, 0
    for name, shape in layout.items():
        n = math.prod(shape) * SIZES[dtype_of(name)]
        header[name] = {"dtype": dtype_of(name), "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        fh.seek(off - 1, 1)
        fh.write(b"\0")
    return path


def stage_bytes(layout: Layout) -> list[int]:
    """Bytes of input_blocks.1..8, middle_block, output_blocks.0..8, in that order."""
    keys = [f"input_blocks.{i}." for i in range(1, 9)] + ["middle_block."] + [f"output_blocks.{i}." for i in range(9)]
    return [nbytes(layout, lambda n, k=k: n.startswith("model.diffusion_model." + k)) for k in keys]


def test_inspect_reports_sdxl_with_both_encoders(layout: Layout, sparse: Path, capsys) -> None:
    assert len(layout) == 2515
    assert cli.main(["inspect", str(sparse), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["architecture"]["family"] == "sdxl" and out["architecture"]["name"] == "sdxl"
    mods = out["modules"]
    assert list(mods) == ["diffusion", "te", "vae"]
    assert mods["diffusion"]["bytes"] == nbytes(layout, lambda n: n.startswith("model.diffusion_model."))
    assert mods["vae"]["bytes"] == nbytes(layout, lambda n: n.startswith("first_stage_model."))
    clip_l = nbytes(layout, lambda n: n.startswith("conditioner.embedders.0."))
    clip_g = nbytes(layout, lambda n: n.startswith("conditioner.embedders.1."))
    assert mods["te"]["encoders"] == {"clip_l": clip_l, "clip_g": clip_g}
    assert mods["te"]["block_encoder"] == "clip_g" and mods["te"]["blocks"] == 32
    assert mods["diffusion"]["blocks"] == 0  # a UNet: no planner blocks (spec section 8)
    assert sum(m["bytes"] for m in mods.values()) == nbytes(layout) == out["files"][0]["bytes"]
    assert out["profile"]["modules"]["diffusion"]["stages"] == stage_bytes(layout)
    assert cli.main(["inspect", str(sparse)]) == 0
    text = capsys.readouterr().out
    assert "sdxl" in text and "clip_l" in text and "clip_g" in text


def test_plan_estimates_per_device_with_unet_segments(layout: Layout, sparse: Path, tmp_path: Path,
                                                       capsys) -> None:
    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps({"devices": [
        {"name": "CUDA0", "description": "8 GiB card", "type": "gpu", "registry": "CUDA",
         "free": 8 * GIB, "total": 8 * GIB},
        {"name": "CPU", "description": "host", "type": "cpu", "registry": "CPU",
         "free": 32 * GIB, "total": 64 * GIB}]}))
    argv = ["plan", "--devices", str(devices), "-m", str(sparse), "--backend", "CUDA0,te=CPU,vae=CPU",
            "--max-vram", "CUDA0=2.5", "-W", "1024", "-H", "1024"]
    assert cli.main([*argv, "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["fit"]
    assert set(fit["devices"]) == {"CUDA0", "CPU"}
    diff = fit["modules"]["diffusion"]
    stages = stage_bytes(layout)
    unet = nbytes(layout, lambda n: n.startswith("model.diffusion_model."))
    fixed = unet - sum(stages)
    # greedy packing in stage order under the budget, written out here
    room = 2.5 * GIB - fixed - diff["compute"]["CUDA0"]
    want: list[int] = []
    for s in stages:
        if want and want[-1] + s <= room:
            want[-1] += s
        else:
            want.append(s)
    assert diff["segments"] == want and len(want) >= 3 and sum(want) == sum(stages)
    assert diff["weights"] == {"CUDA0": fixed} and diff["staging"] == {"CUDA0": max(want)}
    cuda0 = fit["devices"]["CUDA0"]
    assert cuda0["total"] <= 2.5 * GIB and fit["fits"]
    assert fit["devices"]["CPU"]["weights"] == nbytes(layout, lambda n: n.startswith(("conditioner.", "first_stage_model.")))
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert re.search(rf"diffusion: {len(want)} segments", text)


def test_engine_reads_the_real_shapes(layout: Layout) -> None:
    """The UNet, encoders and stages the SDXL pipeline builds from the real names."""
    from sdplan.core.models import clip, unet

    shapes = {k: tuple(v) for k, v in layout.items()}
    cfg = unet.unet_config(shapes, "sdxl")
    assert (cfg.model_channels, cfg.channel_mult, cfg.num_res_blocks) == (320, (1, 2, 4), 2)
    assert (cfg.attention_levels, cfg.transformer_depth, cfg.context_dim) == ((1, 2), 10, 2048)
    assert cfg.adm_in_channels == 2816 and cfg.heads(640) == 10 and cfg.heads(1280) == 20
    names = {k: k for k in shapes if k.startswith(unet.PREFIX)}
    graph = unet.UNetGraph(cfg, names)
    assert graph.n_blocks == 18 and graph.stages[8] == "middle_block."
    assert sum(len(graph.block_tensors(i)) for i in range(18)) + len(graph.other_tensors()) == len(names)
    l_cfg = clip.clip_config(shapes, prefix="conditioner.embedders.0.transformer.text_model.")
    g_cfg = clip.clip_config(shapes, prefix="conditioner.embedders.1.model.")
    assert (l_cfg.layout, l_cfg.width, l_cfg.n_layers, l_cfg.n_heads, l_cfg.activation) == \
        ("openai", 768, 12, 12, "gelu_quick")
    assert (g_cfg.layout, g_cfg.width, g_cfg.n_layers, g_cfg.n_heads, g_cfg.activation) == \
        ("openclip", 1280, 32, 20, "gelu_erf")
    assert clip.find_projection(shapes, "conditioner.embedders.1.model.") == \
        ("conditioner.embedders.1.model.text_projection", "matrix")


def test_builtin_sdxl_profiles_match_the_real_bytes(layout: Layout) -> None:
    """sdxl-base-f16 against the real file: the UNet, VAE and bigG to the byte; ViT-L without
    its int64 position_ids (sd-cli does not load them); the UNet's stages for ``--max-vram``."""
    p = load_builtin_profile("sdxl-base-f16")
    assert p.modules["diffusion"].total == nbytes(layout, lambda n: n.startswith("model.diffusion_model."))
    assert p.modules["vae"].total == nbytes(layout, lambda n: n.startswith("first_stage_model."))
    te = p.modules["te"].encoders
    assert te["clip_g"] == nbytes(layout, lambda n: n.startswith("conditioner.embedders.1."))
    assert te["clip_l"] == nbytes(layout, lambda n: n.startswith("conditioner.embedders.0.")
                                  and not n.endswith("position_ids"))
    assert list(p.modules["diffusion"].stages) == stage_bytes(layout)
    for quant in ("q8_0", "q4_0"):
        q = load_builtin_profile(f"sdxl-base-{quant}").modules["diffusion"]
        assert len(q.stages) == 18 and sum(q.stages) < q.other
