"""Every module the plan places runs where it is placed, and the picture says where.

The upscaler (``--upscale-model``) runs on its own planned device with its residency and
budget, not on the VAE's; the run's plan carries exactly the modules a request runs
(``GenerationRequest.modules``); the estimate counts the upscaler's weights and its tile's
compute buffer, within 10% of what the engine allocates; over a loopback RPC server the
picture equals the one-device one within 1/255 and its record names the RPC device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from sdplan.core.pipelines import jobs  # noqa: E402
from sdplan.core.pipelines.request import GenerationRequest, planned_request  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.runtime.process import JobContext  # noqa: E402
from sdplan.core.runtime.run_plan import RunPlan  # noqa: E402
from sdplan.core.runtime.runner import CancelToken, ModulePlacement  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
MODEL = FIX / "sd1_tiny.safetensors"
GIB = 1 << 30
INVENTORY = Inventory((Device("CUDA0", "first", "gpu", "CUDA", 8 * GIB, 8 * GIB),
                       Device("CUDA1", "second", "gpu", "CUDA", 8 * GIB, 8 * GIB),
                       Device("CPU", "host", "cpu", "CPU", 16 * GIB, 16 * GIB)))
BASE = {"model_files": {"model": [str(MODEL)]}, "prompt": "a photo of a cat", "width": 16, "height": 16,
        "steps": 2, "cfg_scale": 7.0, "seed": 1, "sampling_method": "euler", "threads": 1,
        "overrides": {"clip_heads": 2}, "previews": False}


@pytest.fixture(scope="module")
def upscaler(tmp_path_factory) -> str:
    from pth_writer import compact_weights
    from safetensors.numpy import save_file

    path = tmp_path_factory.mktemp("up") / "compact_x2.safetensors"
    save_file(compact_weights(feat=8, n_conv=2), str(path))
    return str(path)


def run(req: dict[str, Any]) -> dict[str, Any]:
    return jobs.generate_job(JobContext(lambda *a: None, CancelToken()), req)


def test_a_request_names_the_modules_it_runs(upscaler: str) -> None:
    req = GenerationRequest.from_settings(BASE)
    assert req.modules() == ("te", "diffusion", "vae")
    up = GenerationRequest.from_settings({**BASE, "model_files": {"model": [str(MODEL)],
                                                                   "upscale_model": [upscaler]}})
    assert up.modules() == ("te", "diffusion", "vae", "upscaler")


def test_the_run_plan_carries_the_upscaler_placement(upscaler: str) -> None:
    """The plan the user saw puts the upscaler on CUDA1 with CPU-resident weights: the
    run's plan carries that placement (and none for a request without an upscaler)."""
    from sdplan.core.commands.generate_modules import with_late_modules
    from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
    from sdplan.core.planning.estimate import estimate_plan
    from sdplan.core.planning.plan import resolve

    files = {"model": [str(MODEL)], "upscale_model": [upscaler]}
    profile = with_late_modules(profile_from_model_flags({"model": [str(MODEL)]}), files)
    assert profile.modules["upscaler"].total == sum(
        int(np.prod(v.shape)) for v in __import__("pth_writer").compact_weights(feat=8, n_conv=2).values()) * 4
    plan = resolve(["--backend", "CUDA0,upscaler=CUDA1", "--params-backend", "upscaler=CPU"], INVENTORY, profile)
    fit = estimate_plan(plan, profile, INVENTORY, width=16, height=16)
    assert fit.modules["upscaler"].devices == ("CUDA1",)
    assert fit.modules["upscaler"].weights == {"CPU": profile.modules["upscaler"].total}
    req = planned_request({**BASE}, files, plan, fit, INVENTORY)
    assert set(req.plan.placements) == {"te", "diffusion", "vae", "upscaler"}
    up = req.plan.placements["upscaler"]
    assert (up.devices, up.params_mode, up.params_device) == (("CUDA1",), "device", "CPU")
    assert "CUDA1" in req.plan.used_devices()
    plain = planned_request({**BASE}, {"model": [str(MODEL)]}, plan, fit, INVENTORY)
    assert set(plain.plan.placements) == {"te", "diffusion", "vae"}  # CUDA1 is not checked


def test_the_upscaler_runs_with_its_own_residency_and_the_picture_says_so(upscaler: str) -> None:
    """The same picture with the upscaler's weights resident or read from disk per use; the
    record's ``placements`` name the upscaler's device and residency; without a plan entry
    (a request of an older sdplan) it runs on the VAE's main device and says so."""
    files = {"model": [str(MODEL)], "upscale_model": [upscaler]}
    cpu = ModulePlacement(("CPU",))
    plans = {"resident": {"te": cpu, "diffusion": cpu, "vae": cpu, "upscaler": cpu},
             "disk": {"te": cpu, "diffusion": cpu, "vae": cpu,
                      "upscaler": ModulePlacement(("CPU",), params_mode="disk")}}
    got = {k: run({**BASE, "model_files": files, "placements": p}) for k, p in plans.items()}
    assert got["resident"]["images"][0].shape == (32, 32, 3)
    assert np.array_equal(got["resident"]["images"][0], got["disk"]["images"][0])
    assert got["disk"]["placements"]["upscaler"] == {"devices": ["CPU"], "params": "disk"}
    assert got["resident"]["placements"]["upscaler"] == {"devices": ["CPU"], "params": "runtime"}
    legacy = run({**BASE, "model_files": files, "placements": {"te": cpu, "diffusion": cpu, "vae": cpu}})
    assert legacy["placements"]["upscaler"] == {"devices": ["CPU"], "params": "runtime"}
    plain = run({**BASE, "placements": plans["disk"]})
    assert "upscaler" not in plain["placements"]  # the record names the modules that ran


def test_the_upscaler_estimate_is_the_engine_peak(upscaler: str) -> None:
    """Weights plus the dry-run reserve of the tile graph against what the upscaler's runner
    allocated while it upscaled a 64 px picture: within 10%."""
    from sdplan.core.commands.generate_modules import with_late_modules
    from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
    from sdplan.core.pipelines.compute import measure_compute
    from sdplan.core.pipelines.demo.model import demo_model_path
    from sdplan.core.pipelines.stages.upscale import Upscaler
    from sdplan.core.planning.estimate import estimate_plan
    from sdplan.core.planning.plan import resolve
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    cpu_inv = Inventory((Device("CPU", "host", "cpu", "CPU", 16 * GIB, 16 * GIB),))
    files = {"model": [str(demo_model_path())], "upscale_model": [upscaler]}
    profile = with_late_modules(profile_from_model_flags({"model": files["model"]}), files)
    plan = resolve(["--backend", "CPU"], cpu_inv, profile)
    measured = measure_compute(files, width=64, height=64)
    assert measured["upscaler"] > 0
    fit = estimate_plan(plan, profile, cpu_inv, width=64, height=64, measured=measured)
    est = fit.modules["upscaler"]
    estimate = est.weights.get("CPU", 0) + est.compute["CPU"]
    with BackendManager(1) as manager:
        with Upscaler(upscaler, pool=BackendPool(manager)) as up:
            up.upscale_image(np.zeros((64, 64, 3), np.uint8))
            own = up.runner.last_peak["CPU"]
    peak = own.weights + own.staging + own.compute
    assert 0.9 * peak <= estimate <= 1.1 * peak, (estimate, peak)


@pytest.mark.rpc
def test_the_upscaler_on_an_rpc_device(upscaler: str) -> None:
    """The VAE on the CPU, the upscaler on RPC0 (weights on the CPU, staged per use), in the
    engine child: the picture equals the one-device picture within 1/255 and its record names
    RPC0."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers
    from sdplan.core.runtime.process import Engine

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    files = {"model": [str(MODEL)], "upscale_model": [upscaler]}
    cpu = ModulePlacement(("CPU",))
    here_plan = RunPlan({"te": cpu, "diffusion": cpu, "vae": cpu, "upscaler": cpu})
    with Engine() as engine:
        here = engine.call(jobs.GENERATE_JOB, {"request": {**BASE, "model_files": files, "plan": here_plan.to_json()}})
        with rpc_servers(1) as (server,):
            far = RunPlan({"te": cpu, "diffusion": cpu, "vae": cpu,
                           "upscaler": ModulePlacement(("RPC0",), params_mode="device", params_device="CPU")},
                          (server.endpoint,))
            rpc = engine.call(jobs.GENERATE_JOB, {"request": {**BASE, "model_files": files, "plan": far.to_json()}})
    assert rpc["placements"]["upscaler"] == {"devices": ["RPC0"], "params": "device", "params_device": "CPU"}
    assert rpc["placements"]["vae"]["devices"] == ["CPU"]
    assert np.abs(rpc["images"][0].astype(int) - here["images"][0].astype(int)).max() <= 1
