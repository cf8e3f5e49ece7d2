"""The newest sd-cli's auto-fit (spec section 14.1), predicted exactly: on by default, off with
``--auto-fit off`` or any explicit ``--params-backend`` entry, keeps ``--backend``, puts
modules without a runtime entry on the largest-budget GPU, and sends each component's weights
to the first of its compute GPU, RAM, another GPU, disk with room. Every expected figure
below is worked out by hand from those rules."""

from __future__ import annotations

import pytest
from sdplan.core.planning.autofit_newest import newest_auto_fit, ram_keep
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.target import Target

MIB = 1 << 20
NEWEST = Target("sd-cli", "newest", True, "test")
SNAPSHOT = Target("sd-cli", "snapshot", True, "test")


def inv(*gpus: float, ram: float = 64) -> Inventory:
    devs = [{"name": f"CUDA{i}", "type": "gpu", "registry": "CUDA", "free": int(g * GIB),
             "total": int(g * GIB)} for i, g in enumerate(gpus)]
    devs.append({"name": "CPU", "type": "cpu", "registry": "CPU", "free": int(ram * GIB),
                 "total": int(ram * GIB)})
    return Inventory.from_json({"devices": devs})


def prof(diffusion: float, te: float, vae: float, loaded: dict | None = None,
         blocks: int = 0) -> Profile:
    """Sizes in GiB; ``blocks``: diffusion as that many equal blocks (a DiT), else none."""
    size = {"diffusion": diffusion, "te": te, "vae": vae}
    mods = {m: ModuleProfile((int(g * GIB) // blocks,) * blocks if m == "diffusion" and blocks
                             else (), 0 if m == "diffusion" and blocks else int(g * GIB))
            for m, g in size.items() if g}
    return Profile(mods, autofit={m: p.total for m, p in mods.items()},
                   autofit_loaded={k: int(v * GIB) for k, v in (loaded or {}).items()})


def where(plan, m: str) -> tuple[list[str], str, str | None]:  # noqa: ANN001
    mp = plan.modules[m]
    return mp.devices, mp.params.mode, mp.params.device


# CUDA0 8 GiB and CUDA1 24 GiB free: budgets 7.5 and 23.5 GiB (free - 512 MiB); 64 GiB of
# RAM keeps max(2 GiB, 6.4 GiB) free, so 57.6 GiB hold weights.
D = inv(8, 24)


def test_ram_keep() -> None:
    assert ram_keep(64 * GIB) == int(6.4 * GIB) and ram_keep(8 * GIB) == 2 * GIB


def test_everything_resident_on_the_largest_budget_gpu() -> None:
    # no --backend: every module goes to CUDA1 (23.5 GiB beats 7.5); diffusion 12 + 2 GiB,
    # then te 12 + 9 + 2 = 23 <= 23.5, then vae 21 + 0.3 + 2 = 23.3 <= 23.5: all resident
    plan = resolve(Placement(), D, prof(12, 9, 0.3), NEWEST)
    for m in ("diffusion", "te", "vae", "clip_vision", "upscaler", "audio_encoder"):
        assert where(plan, m) == (["CUDA1"], "runtime", None), m
    fit = plan.auto_fit
    assert fit.tiers == {"diffusion": 1, "te": 1, "vae": 1} and fit.params_backend == ""
    assert [d.budget for d in fit.devices] == [8 * GIB - 512 * MIB, 24 * GIB - 512 * MIB]
    # the same flags on the snapshot put everything on the default (first) GPU
    assert where(resolve(Placement(), D, prof(12, 9, 0.3), SNAPSHOT), "te")[0] == ["CUDA0"]
    # and sdplan's engine reads them as the snapshot does
    assert where(resolve(Placement(), D, prof(12, 9, 0.3)), "te") == (["CUDA0"], "runtime", None)


def test_tier_two_ram_when_the_compute_gpu_is_full() -> None:
    # diffusion 20 + 2 = 22 fits; te 20 + 9 + 2 = 31 does not: RAM (9 <= 57.6); vae must
    # leave room for te's staged weights and reserve, 20 + 0.3 + (9 + 2) > 23.5: RAM too
    plan = resolve(Placement(), D, prof(20, 9, 0.3), NEWEST)
    assert where(plan, "diffusion") == (["CUDA1"], "runtime", None)
    assert where(plan, "te") == (["CUDA1"], "device", "CPU")
    assert where(plan, "vae") == (["CUDA1"], "device", "CPU")
    assert plan.auto_fit.tiers == {"diffusion": 1, "te": 2, "vae": 2}
    assert plan.auto_fit.params_backend == "diffusion=CUDA1,te=CPU,vae=CPU"
    # a smaller te leaves vae its room: 20 + 0.3 + max(1 + 2 staged... ) -> te 2 GiB:
    # 20 + 2 + 2 = 24 > 23.5 (RAM), vae 20 + 0.3 + (2 + 2) = 24.3 > 23.5 (RAM); te 1 GiB:
    # 20 + 1 + 2 = 23 <= 23.5 resident, vae 21 + 0.3 + 2 = 23.3 resident
    small = resolve(Placement(), D, prof(20, 1, 0.3), NEWEST)
    assert small.auto_fit.tiers == {"diffusion": 1, "te": 1, "vae": 1}


def test_keeps_backend_and_uses_another_gpu_then_leaves_room_for_its_staging() -> None:
    # --backend diffusion=CUDA0 (7.5 GiB): 12 + 2 > 7.5; RAM of 8 GiB keeps 2, holds 6 < 12;
    # CUDA1's remaining budget 23.5 - 2 (te's reserve) = 21.5 holds 12: another GPU (tier 3).
    # te then on CUDA1: 12 stored + 5 + 2 = 19 <= 23.5: resident; vae 19.3: resident
    small_ram = inv(8, 24, ram=8)
    plan = resolve(Placement.from_strings("diffusion=CUDA0"), small_ram, prof(12, 5, 0.3),
                   NEWEST)
    assert where(plan, "diffusion") == (["CUDA0"], "device", "CUDA1")
    assert where(plan, "te") == (["CUDA1"], "runtime", None)
    assert where(plan, "vae") == (["CUDA1"], "runtime", None)
    assert plan.auto_fit.tiers == {"diffusion": 3, "te": 1, "vae": 1}
    # nowhere with room: disk (tier 4); 30 GiB fits neither GPU, nor 6 GiB of RAM
    big = resolve(Placement.from_strings("diffusion=CUDA0"), small_ram, prof(30, 5, 0.3),
                  NEWEST)
    assert where(big, "diffusion") == (["CUDA0"], "disk", None)
    assert big.auto_fit.tiers["diffusion"] == 4


def test_offloaded_diffusion_that_fills_its_gpu_offloads_te_and_vae() -> None:
    one = inv(8)  # budget 7.5 GiB
    plan = resolve(Placement(), one, prof(12, 1, 0.3), NEWEST)
    # diffusion 12 + 2 > 7.5: RAM; te 1 + max(12 + 2 staged, 2) > 7.5: RAM; vae likewise
    assert [where(plan, m)[1:] for m in ("diffusion", "te", "vae")] == [("device", "CPU")] * 3
    # a small diffusion that leaves room keeps te resident beside its staging
    ok = resolve(Placement(), inv(12), prof(8, 1, 0.3), NEWEST)
    # budget 11.5: diffusion 8 + 2 = 10 resident; te 8 + 1 + 2 = 11 resident; vae 11.3
    assert [where(ok, m)[1] for m in ("diffusion", "te", "vae")] == ["runtime"] * 3


def test_a_split_component_counts_its_full_size_on_each_device() -> None:
    # diffusion 10 GiB on CUDA0 & CUDA1: CUDA0 needs 10 + 2 > 7.5, so not resident: RAM
    plan = resolve(Placement.from_strings("diffusion=CUDA0&CUDA1"), D, prof(10, 0, 0, blocks=10),
                   NEWEST)
    assert where(plan, "diffusion") == (["CUDA0", "CUDA1"], "device", "CPU")
    # on two 23.5 GiB budgets it stays resident (follows runtime, no params entry)
    two = resolve(Placement.from_strings("diffusion=CUDA0&CUDA1"), inv(24, 24),
                  prof(10, 0, 0, blocks=10), NEWEST)
    assert where(two, "diffusion") == (["CUDA0", "CUDA1"], "runtime", None)
    assert two.auto_fit.params_backend == ""


@pytest.mark.parametrize("flags", [
    {"params_backend": "te=cpu"},  # any explicit entry, whatever the order
    {"offload_to_cpu": True},  # prepends *=cpu
    {"auto_fit": "off"},
])
def test_auto_fit_off(flags: dict) -> None:
    pl = Placement.from_strings("", **flags)
    plan = resolve(pl, D, prof(20, 9, 0.3), NEWEST)
    assert plan.auto_fit is None
    assert where(plan, "diffusion")[0] == ["CUDA0"]  # the default device, not CUDA1
    if "params_backend" in flags:
        assert where(plan, "te") == (["CUDA0"], "device", "CPU")
        assert where(plan, "diffusion")[1] == "runtime"


def test_auto_fit_on_with_params_is_off_and_says_so() -> None:
    pl = Placement.from_strings("", "te=cpu", auto_fit="on")
    plan = resolve(pl, D, prof(20, 9, 0.3), NEWEST)
    assert plan.auto_fit is None and "auto_fit_off" in plan.warning_codes()
    # sdplan's engine shows the newest choice for --auto-fit on, the snapshot's for the switch
    on = resolve(Placement.from_strings("", auto_fit="on"), D, prof(20, 9, 0.3))
    assert on.auto_fit.tiers == {"diffusion": 1, "te": 2, "vae": 2}
    switch = resolve(Placement.from_strings("", auto_fit=True), D, prof(20, 9, 0.3))
    # section 13: te 9 + 2 fits neither beside diffusion nor alone on CUDA0: time-share,
    # each on the largest budget where it fits alone, disk params
    assert switch.auto_fit.time_share is True
    assert (switch.auto_fit.backend, switch.auto_fit.params_backend) == (
        "diffusion=CUDA1,te=CUDA1,vae=CUDA1", "diffusion=disk,te=disk,vae=disk")


def test_warns_when_its_own_sizing_will_not_fit() -> None:
    # te counted 21 GiB fits CUDA1's 23.5 with 2 GiB reserve; loaded as 22 it needs 24
    plan = resolve(Placement(), D, prof(0, 21, 0, {"te": 22}), NEWEST)
    assert where(plan, "te") == (["CUDA1"], "runtime", None)
    msgs = [w.message for w in plan.warnings if w.code == "auto_fit_will_not_fit"]
    assert len(msgs) == 1 and "CUDA1: 24.00 GiB" in msgs[0] and "te 22.00 GiB as loaded" in msgs[0]
    assert "auto_fit_will_not_fit" not in resolve(Placement(), D, prof(0, 21, 0, {"te": 21}),
                                                  NEWEST).warning_codes()


def test_without_a_model_the_runtime_rule_still_holds() -> None:
    plan = resolve(Placement.from_strings("te=CUDA0"), D, None, NEWEST)
    assert "auto_fit_needs_model" in plan.warning_codes()
    assert where(plan, "te") == (["CUDA0"], "runtime", None)
    assert where(plan, "diffusion") == (["CUDA1"], "runtime", None)
    # the written placement keeps what was written: no default, te=CUDA0
    assert plan.placement.to_strings()["backend"] == "te=CUDA0"
    assert plan.backend == "CUDA1,te=CUDA0"  # the pinned choice


def test_no_gpu_keeps_the_default_placement() -> None:
    fit = newest_auto_fit({"diffusion": GIB}, inv(ram=64), {"diffusion": None})
    assert fit.devices == () and fit.runtime == {}
    plan = resolve(Placement(), inv(ram=64), prof(1, 1, 0.1), NEWEST)
    assert where(plan, "diffusion") == (["CPU"], "runtime", None)
