"""The board session's predicted time (:meth:`~sdplan.core.session.estimates.Estimates.predicted_time`)
against :func:`~sdplan.core.planning.timing.predict_time` and the formula written out by
hand: it follows card moves, steps, size and sampler, and says when speeds are defaults."""

from __future__ import annotations

import pytest
from sdplan.core.planning.device_profile import DEFAULTS, DeviceProfile, Link, default_profile
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.timing import RunSettings, predict_time, seconds_text
from sdplan.core.session.board import BoardSession

GB = 10**9
GIB = 1 << 30
#: A fast GPU (50 TFLOP/s products) and a slow CPU (0.2 TFLOP/s), both measured.
FAST = DeviceProfile({"mm:f16": ((1.0, 5e13),)}, mem_bps=8e11, node_s=5e-6, graph_s=1e-4,
                     h2d=Link(2e10, 1e-5), d2h=Link(2e10, 1e-5))
SLOW = DeviceProfile({"mm:f16": ((1.0, 2e11),)}, mem_bps=4e10, node_s=1e-6, graph_s=1e-4,
                     h2d=Link(1e10, 0.0), d2h=Link(1e10, 0.0), threads=4)
SD15 = Profile({"te": ModuleProfile((), 246_000_000), "diffusion": ModuleProfile((), 1_720_000_000),
                "vae": ModuleProfile((), 167_307_726)}, name="sd15", architecture="sd1")


def inventory(gpu: DeviceProfile | None = FAST, cpu: DeviceProfile | None = SLOW) -> Inventory:
    return Inventory((Device("CUDA0", "RTX", "gpu", "CUDA", 20 * GIB, 24 * GIB, profile=gpu),
                      Device("CPU", "cpu", "cpu", "CPU", 48 * GIB, 64 * GIB, profile=cpu)))


def session(inv: Inventory, placement: Placement | None = None) -> BoardSession:
    s = BoardSession(inv, SD15, placement or Placement.from_strings("CUDA0", "", ""))
    s.time_profiles = lambda i: i  # the profiles the devices carry, none from this machine's cache
    s.set_generation(width=512, height=512, steps=20, cfg_scale=7.0, sampling_method="euler")
    return s


#: A GPU call's fixed seconds: the graph's 1e-4 and the latency of its input and output over
#: the host links (1e-5 each way); a CPU call's only the graph's.
GPU_FIXED, CPU_FIXED = 1e-4 + 2e-5, 1e-4


def unet_step(rate: float, fixed: float = GPU_FIXED) -> float:
    """One SD 1.5 UNet step by the formula (timing's module docstring): 2 * params * latent
    pixels * 0.1141 * 2 (CFG as a batch of 2) FLOP at ``rate``, plus the call's fixed cost."""
    params = 1_720_000_000 / 2.0
    return 2 * params * 64 * 64 * 0.1141 * 2 / rate + fixed


def test_the_time_is_predict_time_of_the_plan_at_the_settings() -> None:
    s = session(inventory())
    rep = s.predicted_time()
    assert rep is not None
    assert rep.settings == RunSettings(512, 512, 1, 20, "euler", True, 0)
    want = predict_time(s.plan, s.inventory, SD15, rep.settings)
    assert (rep.step_s, rep.image_s, rep.load_s) == pytest.approx((want.step_s, want.image_s, want.load_s))
    assert rep.step_s == pytest.approx(unet_step(5e13))
    assert rep.measured and rep.profiles == {"CUDA0": "measured"}
    assert s.predicted_time() is rep  # cached with the estimate


def test_moving_the_diffusion_card_to_the_slow_device_raises_the_step() -> None:
    s = session(inventory())
    fast = s.predicted_time()
    s.apply(s.assign("diffusion", "CPU"))
    slow = s.predicted_time()
    assert fast is not None and slow is not None and slow is not fast
    assert slow.step_s == pytest.approx(unet_step(2e11, CPU_FIXED))
    assert slow.step_s > 100 * fast.step_s
    assert slow.image_s > fast.image_s
    s.apply(s.assign("diffusion", "CUDA0"))
    back = s.predicted_time()
    assert back is not None and back.step_s == pytest.approx(fast.step_s)


def test_steps_size_and_sampler_change_the_time() -> None:
    s = session(inventory())
    base = s.predicted_time()
    assert base is not None
    s.set_generation(steps=40)
    more = s.predicted_time()
    assert more is not None and more.step_s == pytest.approx(base.step_s)
    # 20 more steps of the same cost: sampling doubles, load, text and decode stay
    assert more.image_s - base.image_s == pytest.approx(20 * base.step_s)
    s.set_generation(width=1024, height=1024)
    big = s.predicted_time()
    assert big is not None and big.step_s - GPU_FIXED == pytest.approx(4 * (base.step_s - GPU_FIXED))
    s.set_generation(sampling_method="heun")
    heun = s.predicted_time()
    assert heun is not None and heun.step_s == pytest.approx(2 * big.step_s)  # two evaluations
    s.set_generation(cfg_scale=1.0)
    assert s.predicted_time().settings.cfg is False  # type: ignore[union-attr]


def test_devices_without_a_profile_are_flagged_as_default_speeds() -> None:
    s = session(inventory(gpu=None))
    rep = s.predicted_time()
    assert rep is not None and not rep.measured and rep.profiles == {"CUDA0": "default"}
    flops, _, _, graph_s, _, latency = DEFAULTS["gpu"]  # the stated GPU: 20 TFLOP/s
    assert default_profile("gpu").rate("mm", "formula", "f16", 1.0) == flops == 2e13
    assert rep.step_s == pytest.approx(unet_step(flops, graph_s + 2 * latency))
    assert rep.summary().endswith("· default speeds")
    assert "no measured profile" in " ".join(rep.notes)


def test_the_kept_profiles_of_this_machine_are_used_by_default(tmp_path, monkeypatch) -> None:
    from sdplan.core.runtime import profile_cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    inv = inventory(gpu=None, cpu=None)
    profile_cache.store(inv.devices[0], FAST)
    s = BoardSession(inv, SD15, Placement.from_strings("CUDA0", "", ""))
    rep = s.predicted_time()
    assert rep is not None and rep.measured and rep.profiles == {"CUDA0": "measured"}


def test_no_profile_no_time_and_the_summary_line() -> None:
    assert BoardSession(inventory()).predicted_time() is None
    s = session(inventory())
    rep = s.predicted_time()
    assert rep is not None
    assert rep.summary() == (f"~{seconds_text(rep.step_s)} s/step, ~{seconds_text(rep.image_s)} s/picture "
                             f"(load {seconds_text(rep.load_s)} s)")
    assert [seconds_text(x) for x in (0.00431, 0.0412, 0.412, 3.26, 19.4, 250.0, 0.0)] == [
        "0.0043", "0.041", "0.41", "3.3", "19", "250", "0"]


def test_with_the_hires_fix_the_first_pass_is_priced_and_the_notes_say_so() -> None:
    from sdplan.core.session.estimates import HIRES_NOTE

    s = session(inventory())
    first = s.predicted_time()
    assert first is not None and HIRES_NOTE not in first.notes
    s.set_generation(hires={"enabled": True, "upscaler": "Latent", "scale": 2.0})
    assert s.peak_size()[:2] == (1024, 1024)
    rep = s.predicted_time()
    assert rep is not None and rep.notes[-1] == HIRES_NOTE
    assert (rep.step_s, rep.image_s) == pytest.approx((first.step_s, first.image_s))  # the first pass, at 512 px


def test_with_files_open_the_board_prices_the_engines_counted_graphs_as_plan_does() -> None:
    """The demo's files open on a CPU and a GPU: the board's time is predict_time of the work
    count_plan counts (``sdplan plan``'s), not the formula's; a card move counts again (the
    UNet's work now on the GPU stand-in), and moving it back takes the kept count."""
    from sdplan.core.pipelines.demo.model import demo_model_path
    from sdplan.core.pipelines.work import count_plan
    from sdplan.core.planning.timing import drive_of_files

    s = session(inventory())
    s.load_model_files({"model": [str(demo_model_path())]})
    s.set_generation(width=128, height=128, steps=4, cfg_scale=5.0, sampling_method="euler")
    s.apply(Placement.from_strings("CPU", "", ""))
    rep = s.predicted_time()
    assert rep is not None and s.profile is not None
    names = [d.name for d in s.inventory]
    works = count_plan(s.model_files, s.plan, names, width=128, height=128, batch=1, cfg=True)
    assert set(works) == {"te", "diffusion", "vae"}
    import os
    paths = {m: [os.path.abspath(p) for p in ps] for m, ps in drive_of_files(s.model_files).items()}
    want = predict_time(s.plan, s.inventory, s.profile, rep.settings, works, paths)
    formula = predict_time(s.plan, s.inventory, s.profile, rep.settings, None, paths)
    assert (rep.step_s, rep.image_s) == pytest.approx((want.step_s, want.image_s))
    assert {t.source for ts in rep.modules.values() for t in ts} == {"counted"}
    assert rep.step_s != pytest.approx(formula.step_s, rel=0.05)
    s.apply(Placement.from_strings("te=CPU,diffusion=CUDA0,vae=CPU", "", ""))
    moved = s.predicted_time()
    assert moved is not None and {t.source for t in moved.modules["diffusion"]} == {"counted"}
    # the UNet counted on a stand-in for the GPU: ggml's own ops, as a GPU runs them (more,
    # unfused nodes: on this toy UNet the GPU's 5 us per node outweighs its faster products)
    on_gpu = count_plan(s.model_files, s.plan, names, width=128, height=128, batch=1, cfg=True,
                        accelerators=["CUDA0"])
    kernels = {o.kernel for o in on_gpu["diffusion"][0].graph.devices["CUDA0"].ops}
    assert "FLASH_ATTN_EXT@d8" in kernels and not {k for k in kernels if "attention" in k}
    want = predict_time(s.plan, s.inventory, s.profile, moved.settings, on_gpu, paths)
    assert (moved.step_s, moved.image_s) == pytest.approx((want.step_s, want.image_s))
    assert moved.step_s != pytest.approx(rep.step_s, rel=0.01)
    assert len(s._work_cache) == 2
    s.apply(Placement.from_strings("CPU", "", ""))
    back = s.predicted_time()
    assert back is not None and back.step_s == pytest.approx(rep.step_s) and len(s._work_cache) == 2
