"""Auto plan with time: of the plans that fit it proposes the fastest predicted one when the
devices' speeds are measured, keeps its choice by memory (and says so) when they are not;
the review carries the current plan's and the proposal's predicted times."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sdplan.core.planning.autoplan import auto_plan
from sdplan.core.planning.autoplan_review import review_auto_plan
from sdplan.core.planning.device_profile import DeviceProfile, Link
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.timing import RunSettings, predict_time, seconds_text

GIB = 1 << 30
MIB = 1 << 20
#: The large card is slow (2 TFLOP/s), the small one fast (50 TFLOP/s).
SLOW = DeviceProfile({"mm:f16": ((1.0, 2e12),)}, mem_bps=1e11, node_s=5e-6, graph_s=1e-4,
                     h2d=Link(1e10, 1e-5), d2h=Link(1e10, 1e-5))
FAST = DeviceProfile({"mm:f16": ((1.0, 5e13),)}, mem_bps=8e11, node_s=5e-6, graph_s=1e-4,
                     h2d=Link(2e10, 1e-5), d2h=Link(2e10, 1e-5))
CPU_P = DeviceProfile({"mm:f16": ((1.0, 2e11),)}, mem_bps=4e10, node_s=1e-6, graph_s=1e-4,
                      h2d=Link(1e10, 0.0), d2h=Link(1e10, 0.0), threads=8)
SD15 = Profile({"diffusion": ModuleProfile((60 * MIB,) * 25, 140 * MIB),
                "te": ModuleProfile((20 * MIB,) * 12, 20 * MIB, {"clip_l": 260 * MIB}),
                "vae": ModuleProfile((), 160 * MIB)}, "sd15", "sd1")
RUN = RunSettings(steps=20, sampler="euler", cfg=True)


def inventory(big: DeviceProfile | None = SLOW, small: DeviceProfile | None = FAST) -> Inventory:
    return Inventory((Device("CUDA0", "big slow", "gpu", "CUDA", 22 * GIB, 24 * GIB, profile=big),
                      Device("CUDA1", "small fast", "gpu", "CUDA", 7 * GIB, 8 * GIB, profile=small),
                      Device("CPU", "cpu", "cpu", "CPU", 48 * GIB, 64 * GIB, profile=CPU_P)))


def devices(plan) -> dict[str, list[str]]:
    return {m: list(plan.modules[m].devices) for m in SD15.modules}


def seconds(placement: Placement, inv: Inventory) -> float:
    plan = resolve(placement, inv, SD15)
    return predict_time(plan, inv, SD15, replace(RUN, width=512, height=512)).image_s


def test_by_memory_the_most_free_card_with_measured_speeds_the_fastest_that_fits() -> None:
    inv = inventory()
    base = Placement.from_strings("CUDA1", "", "")  # fits on the small fast card already
    memory = auto_plan(inv, SD15, base, width=512, height=512)
    assert memory.fits and devices(memory.plan) == {m: ["CUDA0"] for m in SD15.modules}
    timed = auto_plan(inv, SD15, base, width=512, height=512, run=RUN)
    assert timed.fits and devices(timed.plan) == {m: ["CUDA1"] for m in SD15.modules}
    # the choice is the faster by an independent prediction of both plans
    fast_s, slow_s = seconds(timed.placement, inv), seconds(memory.placement, inv)
    assert fast_s < slow_s / 5
    # three candidates: the plan as it is (CUDA1), the packing by memory (CUDA0) and the
    # packing by speed (CUDA1 again: the same placement, counted once)
    assert timed.notes[-1] == (f"the fastest of 2 plans that fit: ~{seconds_text(fast_s)} s/picture "
                               f"predicted (the other: ~{seconds_text(slow_s)} s)")
    assert estimate_plan(timed.plan, SD15, inv, width=512, height=512).fits


def test_unmeasured_speeds_keep_the_choice_by_memory_and_say_so() -> None:
    inv = inventory(small=None)
    base = Placement.from_strings("CUDA1", "", "")
    timed = auto_plan(inv, SD15, base, width=512, height=512, run=RUN)
    assert devices(timed.plan) == {m: ["CUDA0"] for m in SD15.modules}
    assert timed.notes[-1] == ("chosen by memory alone: CUDA1 has no measured speed "
                               "(sdplan devices --calibrate)")


def test_the_packing_by_speed_moves_a_fitting_plan_to_the_fast_card() -> None:
    inv = inventory()
    current = Placement.from_strings("CUDA0", "", "")
    # by memory the packing is the current plan itself; by speed the small card holds it all
    assert devices(auto_plan(inv, SD15, current, width=512, height=512).plan) == {
        m: ["CUDA0"] for m in SD15.modules}
    prop = auto_plan(inv, SD15, current, width=512, height=512, run=RUN)
    assert devices(prop.plan) == {m: ["CUDA1"] for m in SD15.modules}
    assert [n for n in prop.notes if not n.startswith("the fastest")] == [
        f"{m} ({SD15.modules[m].total / GIB:.1f} GiB) on CUDA1" for m in ("diffusion", "te", "vae")]


def test_a_large_model_goes_to_the_fast_card_only_where_it_fits() -> None:
    big = Profile({"diffusion": ModuleProfile((160 * MIB,) * 57, 120 * MIB),
                   "te": ModuleProfile((), 500 * MIB, {"clip_l": 500 * MIB}),
                   "vae": ModuleProfile((), 160 * MIB)}, "big", "flux-dev")
    inv = inventory()
    prop = auto_plan(inv, big, Placement(), width=512, height=512, run=RUN)
    assert prop.fits
    # 9 GiB of diffusion weights do not fit the 7 GiB card: on the large one; the small
    # modules on the fast card
    assert list(prop.plan.modules["diffusion"].devices) == ["CUDA0"]
    assert list(prop.plan.modules["vae"].devices) == ["CUDA1"]


def test_the_review_carries_both_times() -> None:
    inv = inventory()
    current = Placement.from_strings("CUDA0", "", "")
    plain = review_auto_plan(inv, SD15, current, width=512, height=512)
    assert plain.time is None and plain.current_time is None
    r = review_auto_plan(inv, SD15, current, width=512, height=512, run=RUN)
    assert r.time is not None and r.current_time is not None
    assert r.time.settings == replace(RUN, width=512, height=512)
    assert r.current_time.image_s == pytest.approx(seconds(current, inv))
    assert r.time.image_s == pytest.approx(seconds(Placement.from_strings("CUDA1", "", ""), inv))
    assert r.time.image_s < r.current_time.image_s / 5
