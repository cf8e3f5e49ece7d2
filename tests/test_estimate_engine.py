"""The fit estimate is for the engine that runs it.

sdplan's engine: ``generate``'s estimate (weights + a dry-run reserve of the engine's own
graphs) against the peak the engine really allocates over a generation of the demo at
512 px, within 10%; the per-pixel figures for a profile alone against the dry run of an
SD 1.5-size model; sd-cli's formula with and without ``--diffusion-fa``; the engine named
in ``plan``'s output; the smallest change that would fit.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
from engine_peak import cpu_peak
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
from sdplan.core.planning.estimate import compute_bytes, estimate_plan
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.plan import resolve

GIB = 1 << 30
CPU_INV = Inventory((Device("CPU", "host", "cpu", "CPU", 64 * GIB, 64 * GIB),))


@pytest.fixture(autouse=True)
def _engine() -> None:
    g = pytest.importorskip("sdplan._ggml")
    if not hasattr(g, "Graph"):
        pytest.skip("sdplan._ggml has no Graph (engine not built)")


def _demo() -> Path:
    from sdplan.core.pipelines.demo.model import demo_model_path

    return demo_model_path()


def test_demo_estimate_matches_the_engine_peak_at_512() -> None:
    from sdplan.core.pipelines.compute import measure_compute
    from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    files = {"model": [str(_demo())]}
    prof = profile_from_model_flags(files)
    plan = resolve(["--backend", "CPU"], CPU_INV, prof)
    fit = estimate_plan(plan, prof, CPU_INV, width=512, height=512,
                        measured=measure_compute(files, width=512, height=512))
    assert set(fit.compute_source.values()) == {"measured"} and fit.engine == "sdplan"
    with BackendManager(2) as manager:
        sd = StableDiffusion(files, None, BackendPool(manager))
        try:
            sd.txt2img(GenerateParams("a red circle on a blue background", "", 512, 512, steps=1,
                                      cfg_scale=5.0, sampler="euler"))
            peak = before = 0
            for m in ("te", "diffusion", "vae"):  # the order they run; weights stay resident
                own = sd.runners[m].last_peak["CPU"]
                peak = max(peak, before + own.weights + own.staging + own.compute)
                before += sd.runners[m].memory()["CPU"].weights
        finally:
            sd.close()
    estimate = fit.devices["CPU"].total
    assert 0.9 * peak <= estimate <= 1.1 * peak, (estimate, peak)
    # the old formula (sd-cli's path) was far off for sdplan's engine
    assert estimate_plan(plan, prof, CPU_INV, width=512, height=512,
                         engine="sd-cli").devices["CPU"].total > 1.3 * peak


def _write_sd15(path: Path, shared: Path) -> Path:
    layouts = json.loads((shared / "models/real_size_key_layouts.json").read_text())
    shapes = {**layouts["sd15_unet_ldm"], **layouts["sd_vae_ldm"]}
    shapes |= {"cond_stage_model.transformer.text_model." + n: s
               for n, s in layouts["clip_l_hf"].items()}
    header, off = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape) * 2
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        fh.seek(off - 1, 1)
        fh.write(b"\0")
    return path


def test_fitted_figures_match_the_dry_run_at_sd15_size(tmp_path: Path, shared_dir: Path) -> None:
    """A profile alone (``--model-profile sd15-f16``) gets figures within 10% of the dry
    run of the engine's graphs at real size; the old formula said 8+ GiB at 1024 px."""
    from sdplan.core.pipelines.compute import measure_compute

    files = {"model": [str(_write_sd15(tmp_path / "sd15.safetensors", shared_dir))]}
    prof = profile_from_model_flags(files)
    plan = resolve(["--backend", "CPU"], CPU_INV, prof)
    for px in (256, 512, 1024):
        measured = measure_compute(files, width=px, height=px)
        dry = estimate_plan(plan, prof, CPU_INV, width=px, height=px, measured=measured)
        fitted = estimate_plan(plan, prof, CPU_INV, width=px, height=px)
        assert set(fitted.compute_source.values()) == {"fitted"}
        a, b = fitted.devices["CPU"].total, dry.devices["CPU"].total
        assert 0.9 * b <= a <= 1.1 * b, (px, a, b)
    assert fitted.devices["CPU"].total < 6 * GIB  # SD 1.5 F16 at 1024 px fits 10 GiB


def test_sd_cli_formula_with_and_without_flash_attention() -> None:
    prof = profile_from_model_flags({"model": [str(_demo())]})
    mp = prof.modules["diffusion"]
    full = compute_bytes("diffusion", mp, "sd1", width=1024, height=1024, batch=1)
    fa = compute_bytes("diffusion", mp, "sd1", width=1024, height=1024, batch=1,
                       flash=True)
    n = 128 * 128
    assert full - fa == 4 * 8 * n * n  # the 8 heads' N x N attention matrices in F32
    plan = resolve(["--backend", "CPU"], CPU_INV, prof)
    a = estimate_plan(plan, prof, CPU_INV, width=1024, height=1024, engine="sd-cli")
    b = estimate_plan(plan, prof, CPU_INV, width=1024, height=1024, engine="sd-cli-fa")
    assert a.modules["diffusion"].compute["CPU"] == full
    assert b.modules["diffusion"].compute["CPU"] == fa
    assert "sd-cli with --diffusion-fa" in b.engine_label() and b.to_json()["engine"] == "sd-cli-fa"
    with pytest.raises(ValueError, match="unknown engine"):
        estimate_plan(plan, prof, CPU_INV, engine="comfy")


def test_plan_names_the_engine_and_what_would_fit(tmp_path: Path) -> None:
    import subprocess

    from rpc_util import sdplan_cmd

    inv = {"devices": [
        {"name": "CUDA0", "description": "small", "type": "gpu", "registry": "CUDA",
         "free": 6 * GIB, "total": 8 * GIB},
        {"name": "CUDA1", "description": "small", "type": "gpu", "registry": "CUDA",
         "free": 6 * GIB, "total": 8 * GIB},
        {"name": "CPU", "description": "host", "type": "cpu", "registry": "CPU",
         "free": 60 * GIB, "total": 64 * GIB}]}
    path = tmp_path / "box.json"
    path.write_text(json.dumps(inv))
    base = ["plan", "--devices", str(path), "--model-profile", "sd15-f16", "-W", "1024",
            "-H", "1024"]
    r = subprocess.run(sdplan_cmd(*base), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "fits · for sdplan's engine (compute fitted" in r.stdout
    r = subprocess.run(sdplan_cmd(*base, "--engine", "sd-cli", "--json"), capture_output=True,
                       text=True, timeout=120)
    fit = json.loads(r.stdout)["fit"]
    assert fit["engine"] == "sd-cli" and set(fit["compute_source"].values()) == {"formula"}
    # FLUX.1-dev F16 on these two 6 GiB GPUs: nothing fits, and the advice says so
    flux = ["plan", "--model-profile", "flux1-dev-f16", "--backend", "CUDA0", "--json"]
    r = subprocess.run(sdplan_cmd(*flux, "--devices", str(path)), capture_output=True,
                       text=True, timeout=120)
    fit = json.loads(r.stdout)["fit"]
    assert not fit["fits"] and fit["advice"][0].startswith("no placement on these devices fits")
    # on 22 + 11 GiB GPUs it does not fit on CUDA0 alone; the auto plan says what would
    inv["devices"][0]["free"], inv["devices"][1]["free"] = 22 * GIB, 11 * GIB
    inv["devices"][0]["total"] = inv["devices"][1]["total"] = 24 * GIB
    path.write_text(json.dumps(inv))
    r = subprocess.run(sdplan_cmd(*flux, "--devices", str(path)), capture_output=True,
                       text=True, timeout=120)
    fit = json.loads(r.stdout)["fit"]
    assert not fit["fits"] and fit["advice"][-1].startswith("use: --backend")
    assert any(line.startswith("diffusion: CUDA0 -> CUDA0 & CUDA1") for line in fit["advice"])


def test_sd3_estimate_matches_the_engine_peak_on_the_tiny_fixture(tmp_path: Path) -> None:
    """SD3 as one file (MMDiT, encoders, autoencoder): the dry run of the engine's graphs
    (CLIP-L, bigG, T5 on one chunk, the MMDiT on 256 image + 77 CLIP + 77 T5 tokens, the VAE
    decoder) plus the weights is the peak the engine allocates over a CFG generation at the
    largest size the tiny MMDiT draws (its position table: 64 px)."""
    from sd3_util import CLIP_HEADS, write_single_file
    from sdplan.core.pipelines.compute import measure_compute
    from sdplan.core.pipelines.sd3.pipeline import Sd3Pipeline
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    files = {"model": [str(write_single_file(tmp_path / "sd3_all.safetensors"))]}
    prof = profile_from_model_flags(files)
    assert prof.architecture.startswith("sd3")
    plan = resolve(["--backend", "CPU"], CPU_INV, prof)
    measured = measure_compute(files, width=64, height=64, overrides={"clip_heads": CLIP_HEADS})
    assert set(measured) == {"te", "diffusion", "vae"} and min(measured.values()) > 0
    fit = estimate_plan(plan, prof, CPU_INV, width=64, height=64, measured=measured)
    assert set(fit.compute_source.values()) == {"measured"}
    with BackendManager(1) as manager:
        pipe = Sd3Pipeline(files, None, BackendPool(manager), n_threads=1, clip_heads=CLIP_HEADS)
        try:
            pipe.txt2img("a photo of a cat", 64, 64, steps=1, cfg_scale=4.5)
            peak, computes = cpu_peak(pipe, ("clip_l", "clip_g", "t5xxl", "diffusion", "vae"))  # run order; weights stay
        finally:
            pipe.close()
    assert fit.modules["diffusion"].compute["CPU"] == computes["diffusion"]
    assert fit.modules["vae"].compute["CPU"] == computes["vae"]
    assert fit.modules["te"].compute["CPU"] == max(computes[m] for m in ("clip_l", "clip_g", "t5xxl"))
    estimate = fit.devices["CPU"].total
    assert 0.9 * peak <= estimate <= 1.1 * peak, (estimate, peak)
