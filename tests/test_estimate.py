"""Memory estimates of resolved plans: weights by residency, staging, compute, fit verdict.

Expected figures are recomputed here from the profile, the plan's ranges and the formula
written out in the test (not taken from the estimate's own helpers).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
from sdplan.core.planning.estimate import compute_bytes, estimate_plan
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile

GIB = 1 << 30
INV = Inventory.from_json({"devices": [
    {"name": "CUDA0", "description": "big", "type": "gpu", "registry": "CUDA",
     "free": 22 * GIB, "total": 24 * GIB},
    {"name": "CUDA1", "description": "small", "type": "gpu", "registry": "CUDA",
     "free": 11 * GIB, "total": 12 * GIB},
    {"name": "CPU", "description": "host", "type": "cpu", "registry": "CPU",
     "free": 48 * GIB, "total": 64 * GIB}]})
PROFILE = Profile({
    "diffusion": ModuleProfile((GIB,) * 10, GIB),
    "te": ModuleProfile((GIB // 2,) * 24, GIB // 4, {"clip_l": GIB // 4, "t5xxl": 12 * GIB},
                        "t5xxl"),
    "vae": ModuleProfile((), 160 << 20)}, architecture="flux-dev")


def attn(heads: int, tokens: int, width: int, batch: int = 1) -> int:
    """The documented formula: batch * 4 * (heads*N^2 + 4*N*D)."""
    return batch * 4 * (heads * tokens**2 + 4 * tokens * width)


def test_compute_formula_per_architecture() -> None:
    mp = ModuleProfile((), 1)
    flux_n = (1024 // 16) ** 2 + 512
    assert compute_bytes("diffusion", mp, "flux-dev", width=1024, height=1024, batch=2) == \
        attn(24, flux_n, 4 * 3072, batch=2)
    # Chroma: FLUX.1's width with sd-cli's 512 T5 tokens (not the unknown-model fallback)
    assert compute_bytes("diffusion", mp, "chroma", width=1024, height=1024, batch=1) == \
        attn(24, flux_n, 4 * 3072)
    # FLUX.2 klein: 512 Qwen3 tokens; 4B 24 heads of 3072, 9B 32 heads of 4096
    assert compute_bytes("diffusion", mp, "flux2_klein-4b", width=1024, height=1024, batch=1) == \
        attn(24, flux_n, 4 * 3072)
    assert compute_bytes("diffusion", mp, "flux2_klein-9b", width=1024, height=1024, batch=1) == \
        attn(32, flux_n, 4 * 4096)
    # SD3 / SD3.5: one chunk of 77 CLIP + 77 T5 rows (sd-cli's SD3CLIPEmbedder); medium 24
    # heads of 1536, large 38 of 2432
    sd3_n = (1024 // 16) ** 2 + 154
    assert compute_bytes("diffusion", mp, "sd3-3.5-medium", width=1024, height=1024, batch=1) == \
        attn(24, sd3_n, 4 * 1536)
    assert compute_bytes("diffusion", mp, "sd3-large", width=1024, height=1024, batch=1) == \
        attn(38, sd3_n, 4 * 2432)
    assert compute_bytes("diffusion", mp, "sd1", width=512, height=512, batch=1) == \
        attn(8, 64 * 64, 1280)
    assert compute_bytes("diffusion", mp, "sdxl", width=1024, height=1024, batch=1) == \
        attn(10, 128 * 128 // 4, 2560)
    te = ModuleProfile((), 1, {"clip_l": 1, "t5xxl": 1}, "t5xxl")
    assert compute_bytes("te", te, "flux-dev", width=512, height=512, batch=1) == \
        attn(64, 512, 10240)
    # SD3's T5-XXL encodes 77-token chunks (sd-cli's chunk_len), not FLUX.1's 512 tokens
    sd3_te = ModuleProfile((), 1, {"clip_l": 1, "clip_g": 1, "t5xxl": 1}, "t5xxl")
    assert compute_bytes("te", sd3_te, "sd3-large", width=512, height=512, batch=1) == \
        attn(64, 77, 10240)
    assert compute_bytes("vae", mp, "sd1", width=512, height=512, batch=1) == \
        4 * (4096**2 + 4 * 128 * 512 * 512)
    big = ModuleProfile((), 4 * GIB)
    assert compute_bytes("diffusion", big, None, width=1024, height=512, batch=1) == 2 * GIB


def test_split_runtime_residency() -> None:
    plan = resolve(["--backend", "diffusion=CUDA0&CUDA1,te=CPU,vae=CUDA0"], INV, PROFILE)
    rep = estimate_plan(plan, PROFILE, INV, width=1024, height=1024)
    ranges = plan.modules["diffusion"].ranges
    assert [r.device for r in ranges] == ["CUDA0", "CUDA1"]
    d = rep.modules["diffusion"]
    assert d.weights == {"CUDA0": ranges[0].bytes + GIB, "CUDA1": ranges[1].bytes}
    comp = attn(24, 64 * 64 + 512, 4 * 3072)
    assert d.compute == {"CUDA0": comp, "CUDA1": comp} and d.staging == {}
    vae_comp = 4 * (128**2 * 128**2 + 4 * 128 * 1024 * 1024)
    cuda0 = rep.devices["CUDA0"]
    assert cuda0.weights == ranges[0].bytes + GIB + (160 << 20)
    assert cuda0.compute == max(comp, vae_comp) and cuda0.staging == 0
    assert cuda0.total == cuda0.weights + max(comp, vae_comp)
    assert rep.devices["CPU"].weights == PROFILE.modules["te"].total
    assert rep.fits and rep.reasons == []
    json.dumps(rep.to_json())


def test_params_on_a_device_and_disk() -> None:
    plan = resolve(["--backend", "CUDA0", "--params-backend", "te=CPU,diffusion=disk"],
                   INV, PROFILE)
    rep = estimate_plan(plan, PROFILE, INV)
    te, diff = rep.modules["te"], rep.modules["diffusion"]
    assert te.mode == "device" and te.weights == {"CPU": PROFILE.modules["te"].total}
    assert te.staging == {"CUDA0": PROFILE.modules["te"].total}
    assert diff.mode == "disk" and diff.weights == {} and diff.staging == {"CUDA0": 11 * GIB}
    # transient: the larger of te and diffusion staging+compute, not their sum
    cuda0 = rep.devices["CUDA0"]
    assert cuda0.weights == 160 << 20
    assert cuda0.staging + cuda0.compute == max(
        te.staging["CUDA0"] + te.compute["CUDA0"], diff.staging["CUDA0"] + diff.compute["CUDA0"])
    assert rep.devices["CPU"].weights == PROFILE.modules["te"].total


def test_budget_segments_limit_staging() -> None:
    plan = resolve(["--backend", "CUDA0", "--offload-to-cpu", "--max-vram", "4"], INV, PROFILE)
    rep = estimate_plan(plan, PROFILE, INV)
    diff = rep.modules["diffusion"]
    room = 4 * GIB - GIB - diff.compute["CUDA0"]
    per_segment = max(1, room // GIB) * GIB  # whole 1 GiB blocks that fit the room
    assert diff.staging == {"CUDA0": GIB + per_segment}
    assert diff.weights == {"CPU": 11 * GIB}


def test_does_not_fit_names_the_device() -> None:
    small = Inventory.from_json({"devices": [
        {"name": "CUDA0", "description": "", "type": "gpu", "registry": "CUDA",
         "free": 8 * GIB, "total": 8 * GIB},
        {"name": "CPU", "description": "", "type": "cpu", "registry": "CPU",
         "free": 48 * GIB, "total": 64 * GIB}]})
    plan = resolve(["--backend", "CUDA0"], small, PROFILE)
    rep = estimate_plan(plan, PROFILE, small)
    assert not rep.fits
    assert len(rep.reasons) == 1 and rep.reasons[0].startswith("CUDA0: needs")
    budget = resolve(["--backend", "te=CPU,diffusion=CPU", "--max-vram", "0.1"], small, PROFILE)
    rep = estimate_plan(budget, PROFILE, small, width=1024, height=1024)
    assert not rep.fits and "--max-vram budget" in rep.reasons[0]


def test_bad_size_is_an_error() -> None:
    plan = resolve([], INV, PROFILE)
    with pytest.raises(ValueError, match="positive"):
        estimate_plan(plan, PROFILE, INV, width=0)


def test_flux_file_split_end_to_end(tmp_path: Path) -> None:
    """A Flux-layout file (BFL names, scaled) split over two GPUs."""
    header, off = {}, 0
    shapes = {"img_in.weight": [3072, 64], "guidance_in.in_layer.weight": [3072, 256]}
    shapes |= {f"double_blocks.{i}.img_mlp.0.weight": [12288, 3072] for i in range(19)}
    shapes |= {f"single_blocks.{i}.linear1.weight": [21504, 3072] for i in range(38)}
    for n, s in shapes.items():
        size = math.prod(s) * 2
        header[n] = {"dtype": "BF16", "shape": s, "data_offsets": [off, off + size]}
        off += size
    hb = json.dumps(header).encode()
    path = tmp_path / "flux.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        fh.seek(off - 1, 1)
        fh.write(b"\0")
    prof = profile_from_model_flags({"model": [path]})
    plan = resolve(["--backend", "diffusion=CUDA0&CUDA1"], INV, prof)
    rep = estimate_plan(plan, prof, INV)
    ranges = plan.modules["diffusion"].ranges
    assert ranges[0].first_block == 0 and ranges[-1].last_block == 56
    assert sum(rep.modules["diffusion"].weights.values()) == off
    assert set(rep.devices) == {"CUDA0", "CUDA1"}
