"""Parallel CFG in sdplan's engine (``--backend cfg=DEVICE``, spec section 14.5): the
unconditional half of each guided evaluation on the copy's device at the same time as the
conditional half; the picture equals the sequential one, the copy's weights live on its
device, the work count and the prediction take the slower half, and the plan says when a
family's engine runs the passes one after another."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, require_or_skip
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.runtime.placement import CFG, ModulePlacement, cfg_placement
from sdplan.core.runtime.run_plan import RunPlan

DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"
GIB = 1 << 30
INV = Inventory((Device("CPU", "cpu", "cpu", "CPU", 16 * GIB, 16 * GIB),
                 Device("RPC0", "127.0.0.1:1", "gpu", "RPC", 8 * GIB, 8 * GIB),
                 Device("RPC1", "127.0.0.1:2", "gpu", "RPC", 8 * GIB, 8 * GIB)))


def _profile(arch: str) -> Profile:
    return Profile({"te": ModuleProfile((), GIB // 4), "diffusion": ModuleProfile((), 2 * GIB),
                    "vae": ModuleProfile((), GIB // 8)}, architecture=arch)


def test_the_run_plan_carries_the_copy_with_the_diffusion_models_residency() -> None:
    plan = resolve(Placement.from_strings("te=CPU,diffusion=RPC0,cfg=RPC1,vae=CPU"), INV, _profile("sd1"))
    assert plan.cfg is not None and plan.cfg.active
    run = RunPlan.from_plan(plan)
    assert run.placements[CFG] == ModulePlacement(("RPC1",))
    assert "RPC1" in run.used_devices()
    # the copy's weights are in the estimate on RPC1
    from sdplan.core.planning.estimate import estimate_plan

    fit = estimate_plan(plan, _profile("sd1"), INV, width=512, height=512)
    assert fit.modules["cfg"].weights == {"RPC1": 2 * GIB} and fit.devices["RPC1"].weights == 2 * GIB
    assert fit.modules["cfg"].compute["RPC1"] == fit.modules["diffusion"].compute["RPC0"] > 0
    staged = resolve(Placement.from_strings("te=CPU,diffusion=RPC0,cfg=RPC1,vae=CPU", "diffusion=CPU"), INV,
                     _profile("sd1"))
    assert cfg_placement(staged) == ModulePlacement(("RPC1",), (), "device", "CPU")
    # no cfg=, or one sd-cli and sdplan both run sequentially: no copy
    assert CFG not in RunPlan.from_plan(resolve(Placement.from_strings("RPC0"), INV, _profile("sd1"))).placements
    same = resolve(Placement.from_strings("RPC0,cfg=RPC0"), INV, _profile("sd1"))
    assert not same.cfg.active and CFG not in RunPlan.from_plan(same).placements


def test_a_family_whose_engine_runs_the_passes_in_turn_is_said() -> None:
    plan = resolve(Placement.from_strings("te=CPU,diffusion=RPC0,cfg=RPC1,vae=CPU"), INV, _profile("flux-dev"))
    assert not plan.cfg.active and cfg_placement(plan) is None
    msg = next(w.message for w in plan.warnings if w.code == "cfg_sequential")
    assert msg == ("--backend cfg=RPC1: sdplan's engine runs the unconditional pass sequentially "
                   "(sdplan's engine runs FLUX.1's two passes one after another)")


def test_the_work_count_runs_each_half_on_its_device_at_the_same_time() -> None:
    pytest.importorskip("sdplan._ggml")
    from sdplan.core.pipelines.work import count_work
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.native import native
    from sdplan.core.runtime.runner import BackendPool

    with BackendManager(cpu_threads=1) as manager:
        pool = BackendPool(manager, {"B": native().init_backend("CPU")})
        cpu = ModulePlacement(("CPU",))
        seq = count_work({"model": [str(DEMO)]}, width=128, height=128, pool=pool,
                         placements={"te": cpu, "diffusion": cpu, "vae": cpu})
        par = count_work({"model": [str(DEMO)]}, width=128, height=128, pool=pool,
                         placements={"te": cpu, "diffusion": cpu, "vae": cpu, CFG: ModulePlacement(("B",))})
    (whole,), (mine, theirs) = seq["diffusion"], par["diffusion"]
    assert (mine.group, theirs.group, whole.group) == ("cfg", "cfg", "")
    assert (mine.graph.main, theirs.graph.main) == ("CPU", "B")
    mm = lambda w, d: sum(o.flops * o.count for o in w.graph.devices[d].ops if o.cls != "attn")  # noqa: E731
    assert mm(mine, "CPU") == pytest.approx(mm(whole, "CPU") / 2, rel=0.02)
    assert mm(theirs, "B") == pytest.approx(mm(mine, "CPU"))
    assert theirs.graph.devices["B"].weight_bytes == pytest.approx(whole.graph.devices["CPU"].weight_bytes, rel=0.02)

    from sdplan.core.planning.device_profile import DeviceProfile, Link
    from sdplan.core.planning.timing import RunSettings, graph_seconds, predict_time

    def prof(rate: float) -> DeviceProfile:
        return DeviceProfile({"mm:f16": ((1.0, rate),), "mm:f32": ((1.0, rate),), "conv:f16": ((1.0, rate),),
                              "attn:f32": ((1.0, rate),)}, mem_bps=1e10, node_s=1e-6, graph_s=1e-4,
                             h2d=Link(1e10, 0.0), d2h=Link(1e10, 0.0), threads=1)

    inv = Inventory((Device("CPU", "cpu", "cpu", "CPU", 16 * GIB, 16 * GIB, profile=prof(2e10)),
                     Device("B", "cpu", "cpu", "CPU", 16 * GIB, 16 * GIB, profile=prof(1e10))))
    profile = _profile("sd1")
    plan = resolve(Placement.from_strings("CPU"), inv, profile)
    rep = predict_time(plan, inv, profile, RunSettings(128, 128, 1, 4, "euler", True, 1), par, {})
    from sdplan.core.planning.timing import _Profiles

    p = _Profiles(inv, 1)
    slower = sum(graph_seconds(theirs.graph, p).values())  # the half on the slower device
    assert slower > sum(graph_seconds(mine.graph, p).values())
    assert rep.step_s == pytest.approx(slower)


PICTURE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion
    from sdplan.core.runtime.devices import BackendManager, add_rpc_servers
    from sdplan.core.runtime.placement import CFG, CFG_RUNNER, ModulePlacement
    from sdplan.core.runtime.runner import BackendPool

    add_rpc_servers(sys.argv[2:4])
    cpu = ModulePlacement(("CPU",))
    base = {"te": cpu, "diffusion": ModulePlacement(("RPC0",)), "vae": cpu}
    p = GenerateParams("a red circle on a blue background", "", 128, 128, 3, 7.0, 42, "euler_a", "discrete", 1, 0)
    out = {}
    with BackendManager(cpu_threads=1) as m:
        pool = BackendPool(m)
        for name, place in (("seq", base), ("par", {**base, CFG: ModulePlacement(("RPC1",))})):
            with StableDiffusion(sys.argv[1], None, pool, placements=place) as sd:
                img = sd.txt2img(p)[0]
                out[name] = img.tolist()
                copy = sd.runners.get(CFG_RUNNER)
                out[name + "_copy"] = sorted(copy.last_peak) if copy is not None else None
                out[name + "_copy_weights"] = copy.placed_bytes().get("RPC1", 0) if copy is not None else 0
    print(json.dumps(out))
""")


def test_the_parallel_picture_equals_the_sequential_one_over_two_rpc_servers(tmp_path: Path) -> None:
    """The demo at 128 px, 3 steps, CFG 7: the UNet on RPC0 with its unconditional half on
    RPC1 at the same time against both halves on RPC0 as one batch: the same picture within
    1/255, the copy's weights and compute on RPC1; and ``sdplan generate`` with
    ``--backend ...,cfg=RPC1`` gives that picture and records the placement."""
    from rpc_util import rpc_servers, sdplan_cmd
    from sdplan.core.pipelines.stages.results import read_generation
    from sdplan.core.runtime.native import native

    if not native().rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    with rpc_servers(2) as servers:
        ends = [s.endpoint for s in servers]
        done = subprocess.run([sys.executable, "-c", PICTURE, str(DEMO), *ends], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        res = json.loads(done.stdout.strip().splitlines()[-1])
        pngs = {}
        for name, backend in (("seq", "te=CPU,diffusion=RPC0,vae=CPU"), ("par", "te=CPU,diffusion=RPC0,cfg=RPC1,vae=CPU")):
            pngs[name] = tmp_path / f"{name}.png"
            gen = subprocess.run(sdplan_cmd("generate", "--demo", "-p", "a red circle on a blue background", "-s", "42",
                                            "--steps", "3", "--cfg-scale", "7", "-t", "1", "--rpc-servers", ",".join(ends),
                                            "--backend", backend, "-o", str(pngs[name])),
                                 capture_output=True, text=True, timeout=300)
            assert gen.returncode == 0, gen.stderr[-3000:]
    seq, par = np.array(res["seq"], np.int32), np.array(res["par"], np.int32)
    assert seq.shape == (128, 128, 3) and seq.std() > 10  # a picture, not a flat field
    assert np.abs(par - seq).max() <= 1
    assert res["seq_copy"] is None and "RPC1" in res["par_copy"] and res["par_copy_weights"] > 1e6
    from PIL import Image

    a, b = (np.asarray(Image.open(pngs[n]).convert("RGB"), np.int32) for n in ("seq", "par"))
    assert np.abs(a - b).max() <= 1
    assert read_generation(pngs["par"]).placement["backend"] == "RPC0,te=CPU,vae=CPU,cfg=RPC1"  # canonical
