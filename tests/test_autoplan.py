"""Auto plan (core.autoplan): proposals that fit, checked against the estimate and against
a plain byte count of where each module's weights land; and the before/after diff."""

from __future__ import annotations

import pytest
from sdplan.core.errors import PlanError
from sdplan.core.planning.autoplan import HEADROOM, auto_plan, describe_plan, plan_diff
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile

GIB = 1 << 30
MIB = 1 << 20


def gpu(name: str, free_gib: float, total_gib: float) -> Device:
    return Device(name, f"GPU {name}", "gpu", "CUDA", int(free_gib * GIB), int(total_gib * GIB))


def cpu(free_gib: float, total_gib: float = 64) -> Device:
    return Device("CPU", "CPU", "cpu", "CPU", int(free_gib * GIB), int(total_gib * GIB))


def flux() -> Profile:
    """A Flux-sized profile: 22.4 GiB diffusion (57 blocks), 9.8 GiB text encoders, VAE."""
    return Profile({"diffusion": ModuleProfile((400 * MIB,) * 57, 120 * MIB),
                    "te": ModuleProfile((360 * MIB,) * 24, 700 * MIB,
                                        {"clip_l": 240 * MIB, "t5xxl": 9 * GIB}, "t5xxl"),
                    "vae": ModuleProfile((), 160 * MIB)}, "flux", "flux-dev")


def small() -> Profile:
    """An SD 1.5-sized profile (about 2 GiB in all)."""
    return Profile({"diffusion": ModuleProfile((60 * MIB,) * 25, 140 * MIB),
                    "te": ModuleProfile((20 * MIB,) * 12, 20 * MIB, {"clip_l": 260 * MIB}),
                    "vae": ModuleProfile((), 160 * MIB)}, "sd15", "sd1")


def resident_bytes(plan, profile: Profile) -> dict[str, int]:
    """Independent count: weight bytes held on each device between uses (runtime
    residency splits a module's blocks over its devices by its ranges)."""
    out: dict[str, int] = {}
    for m, mp in profile.modules.items():
        p = plan.modules[m]
        if p.params.mode == "disk":
            continue
        if p.params.mode == "device":
            out[p.params.device] = out.get(p.params.device, 0) + mp.total
            continue
        if len(p.devices) == 1:
            out[p.devices[0]] = out.get(p.devices[0], 0) + mp.total
            continue
        for r in p.ranges:
            size = sum(mp.blocks[r.first_block:r.last_block + 1])
            out[r.device] = out.get(r.device, 0) + size
        out[p.devices[0]] += mp.other
    return out


def test_small_model_goes_whole_on_the_largest_gpu():
    inv = Inventory((gpu("CUDA0", 7, 8), gpu("CUDA1", 11, 12), cpu(48)))
    prop = auto_plan(inv, small(), Placement(), width=512, height=512)
    assert prop.fits
    assert {m: list(p.devices) for m, p in prop.plan.modules.items()
            if m in small().modules} == {"diffusion": ["CUDA1"], "te": ["CUDA1"],
                                         "vae": ["CUDA1"]}
    assert all(p.params.mode == "runtime" for p in prop.plan.modules.values())
    assert prop.notes[0].startswith("diffusion") and "CUDA1" in prop.notes[0]


def test_flux_on_two_cards_is_split_and_fits_by_a_plain_byte_count():
    inv = Inventory((gpu("CUDA0", 22, 24), gpu("CUDA1", 11, 12), cpu(48)))
    prof = flux()
    prop = auto_plan(inv, prof, Placement())
    assert prop.fits
    diff = prop.plan.modules["diffusion"]
    assert set(diff.devices) == {"CUDA0", "CUDA1"}
    assert any("split over" in n for n in prop.notes)
    # the proposal really fits: estimate again, and count resident weights by hand
    fit = estimate_plan(prop.plan, prof, inv, width=1024, height=1024)
    assert fit.fits and not fit.reasons
    held = resident_bytes(prop.plan, prof)
    for d in inv:
        assert held.get(d.name, 0) <= d.free, (d.name, held)
    # the strings it proposes resolve to the same plan
    again = resolve(Placement.from_strings(prop.plan.backend, prop.plan.params_backend,
                                           prop.plan.max_vram), inv, prof)
    assert again.modules["diffusion"].devices == diff.devices


def test_cpu_only_short_of_ram_moves_weights_to_disk():
    # 32 GiB of Flux weights, 28 GiB of RAM free: read both big modules from disk, one at
    # a time (the peak is then the diffusion model staged alone, about 23 GiB)
    inv = Inventory((cpu(28, 32),))
    prof = flux()
    prop = auto_plan(inv, prof, Placement())
    assert prop.fits
    modes = {m: prop.plan.modules[m].params.mode for m in prof.modules}
    assert modes == {"diffusion": "disk", "te": "disk", "vae": "runtime"}
    held = resident_bytes(prop.plan, prof)
    assert held == {"CPU": prof.modules["vae"].total}
    peak = held["CPU"] + prof.modules["diffusion"].total
    assert peak < inv.devices[0].free


def test_cpu_only_smaller_than_the_largest_module_does_not_fit():
    # the diffusion model alone (22.4 GiB) must be staged in 20 GiB of RAM; a CPU has no
    # --max-vram segmentation (spec section 7), so no proposal fits
    prop = auto_plan(Inventory((cpu(20, 24),)), flux(), Placement())
    assert not prop.fits
    assert "diffusion=disk" in prop.plan.params_backend


def test_hopeless_case_says_so():
    inv = Inventory((gpu("CUDA0", 1, 2), cpu(0.5, 1)))
    prop = auto_plan(inv, flux(), Placement())
    assert not prop.fits
    assert prop.notes[-1].startswith("still does not fit")


def test_base_budgets_and_rpc_servers_are_kept():
    inv = Inventory((gpu("CUDA0", 22, 24), gpu("CUDA1", 11, 12), cpu(48)))
    base = Placement.from_strings("CPU", "", "CUDA1=6", rpc_servers=["127.0.0.1:50052"])
    prop = auto_plan(inv, small(), base)
    assert prop.plan.placement.rpc_servers == base.rpc_servers
    assert "CUDA1=6" in prop.plan.max_vram
    # with CUDA1 held to 6 GiB, CUDA0 has the most room: everything goes there
    assert list(prop.plan.modules["diffusion"].devices) == ["CUDA0"]


def test_headroom_is_kept_when_packing():
    # exactly the model's weights free on the GPU: with headroom it cannot all go there
    prof = small()
    room = (prof.modules["diffusion"].total + HEADROOM // 4) / GIB
    inv = Inventory((gpu("CUDA0", room, 8), cpu(48)))
    prop = auto_plan(inv, prof, Placement(), width=512, height=512)
    held = resident_bytes(prop.plan, prof)
    assert held.get("CUDA0", 0) <= inv.devices[0].free


def test_bad_base_raises_plan_error():
    inv = Inventory((cpu(48),))
    with pytest.raises(PlanError):
        auto_plan(inv, small(), Placement.from_strings("CUDA7", "", ""))


def test_plan_diff_lists_modules_then_flags():
    inv = Inventory((gpu("CUDA0", 22, 24), gpu("CUDA1", 11, 12), cpu(48)))
    prof = flux()
    old = resolve(Placement.from_strings("CUDA0", "", ""), inv, prof)
    new = resolve(Placement.from_strings("CUDA0,diffusion=CUDA0&CUDA1", "te=disk", ""), inv,
                  prof)
    rows = plan_diff(old, new, ["diffusion", "te", "vae"])
    assert rows == [("diffusion", "CUDA0", "CUDA0 & CUDA1"),
                    ("te", "CUDA0", "CUDA0, weights on disk"),
                    ("--backend", "CUDA0", new.backend),
                    ("--params-backend", "(empty)", "te=disk")]
    assert plan_diff(old, old, ["diffusion", "te", "vae"]) == []
    assert describe_plan(new, ["vae"]) == {"vae": "CUDA0"}


def test_under_a_budget_the_smallest_change_that_fits_is_proposed():
    """SD3.5 medium (f16, the built-in profile) on two cards under ``--max-vram 4``: CUDA1
    needs 4.13 GiB, and one residency change (the VAE's weights in RAM) fits. The proposal
    is that change, under the user's budget, not a fresh split that does not fit."""
    from sdplan.core.planning.autoplan import smallest_change
    from sdplan.core.planning.builtin_profiles import load_builtin_profile

    inv = Inventory((gpu("CUDA0", 24, 25), gpu("CUDA1", 12, 13), cpu(48)))
    prof = load_builtin_profile("sd35-medium-f16")
    mine = Placement.from_strings("CUDA1,te=CUDA0", "", "4")
    now = estimate_plan(resolve(mine, inv, prof), prof, inv, width=1024, height=1024)
    assert not now.fits and now.reasons == [
        "CUDA1: needs 4.13 GiB, over its --max-vram budget of 4.00 GiB"]
    prop = auto_plan(inv, prof, mine, width=1024, height=1024)
    assert prop.fits
    assert prop.notes == ["vae weights kept in RAM (CPU) and staged to the device"]
    assert (prop.plan.backend, prop.plan.params_backend, prop.plan.max_vram) == (
        "CUDA1,te=CUDA0", "vae=CPU", "4")
    # the proposal's plan is the current one with that single change, checked again
    again = resolve(mine.set_residency("vae", "device", "CPU"), inv, prof)
    assert estimate_plan(again, prof, inv, width=1024, height=1024).fits
    assert describe_plan(again, list(prof.modules)) == describe_plan(prop.plan, list(prof.modules))
    assert smallest_change(inv, prof, mine, width=1024, height=1024).notes == prop.notes


def test_the_smallest_change_takes_two_modules_when_one_is_not_enough_never_the_cpu():
    from sdplan.core.planning.autoplan import smallest_change

    inv = Inventory((gpu("CUDA0", 22, 24), gpu("CUDA1", 11, 12), cpu(48)))
    prof = flux()
    # the diffusion model staged from RAM to CUDA1 (11 GiB free) overflows it
    mine = Placement.from_strings("CUDA1,te=CUDA0", "diffusion=CPU")
    assert not estimate_plan(resolve(mine, inv, prof), prof, inv, width=1024, height=1024).fits
    assert smallest_change(inv, prof, mine, width=1024, height=1024, most=1) is None
    change = smallest_change(inv, prof, mine, width=1024, height=1024)
    assert change is not None and change.notes == [
        "diffusion split onto CUDA0", "te weights kept in RAM (CPU) and staged to the device"]
    fit = estimate_plan(change.plan, prof, inv, width=1024, height=1024)
    assert fit.fits and change.plan.modules["diffusion"].devices == ["CUDA1", "CUDA0"]
    assert all(p.devices != ["CPU"] for p in change.plan.modules.values())
