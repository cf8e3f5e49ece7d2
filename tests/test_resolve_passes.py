"""Tests of the passes :func:`sdplan.core.planning.plan.resolve` is made of, one spec
section each (``shared/spec/assignment.md`` sections 3-9 and 11), called on their own."""

from __future__ import annotations

from decimal import Decimal

import pytest
from sdplan.core.errors import PlanError
from sdplan.core.planning.assignment import DeviceIndex, RuntimeValue
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.modules import MODULES, PLACED_MODULES
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import (
    Layout,
    budget_bytes,
    budget_entries,
    canonical_placement,
    check_device_names,
    default_devices,
    deprecation_warnings,
    device_names,
    layer_split,
    layer_splits,
    params_residency,
    resolve,
    runtime_devices,
    stream_layers_warnings,
)
from sdplan.core.planning.plan_types import ModulePlan, Params, PlanWarning, Range
from sdplan.core.planning.profile import ModuleProfile, Profile

GIB = 1 << 30
INV = Inventory((
    Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB),
    Device("CUDA1", "RTX 3060", "gpu", "CUDA", 11 * GIB, 12 * GIB),
    Device("CPU", "CPU", "cpu", "CPU", 48 * GIB, 64 * GIB),
))
IDX = DeviceIndex(INV)
NO_BUDGETS = {"CUDA0": 0, "CUDA1": 0, "CPU": 0}
FOUR_BLOCKS = ModuleProfile((GIB,) * 4, GIB // 2)


def pl(backend: str = "", params: str = "", max_vram: str = "", **flags: bool) -> Placement:
    return Placement.from_strings(backend, params, max_vram, **flags)


# -- section 6 ------------------------------------------------------------------------------

def test_deprecation_warnings_one_per_flag_in_order() -> None:
    assert deprecation_warnings(()) == []
    assert deprecation_warnings(("--vae-on-cpu", "--clip-on-cpu")) == [
        PlanWarning("deprecated_flag", "--vae-on-cpu is deprecated; it means --backend vae=cpu"),
        PlanWarning("deprecated_flag", "--clip-on-cpu is deprecated; it means --backend te=cpu"),
    ]
    placement = pl(clip_on_cpu=True, control_net_cpu=True)
    assert [w.message for w in deprecation_warnings(placement.deprecated)] == [
        "--clip-on-cpu is deprecated; it means --backend te=cpu",
        "--control-net-cpu is deprecated; it means --backend controlnet=cpu"]


# -- sections 3 and 11 -----------------------------------------------------------------------

def test_check_device_names_accepts_good_names_and_returns_nothing() -> None:
    assert check_device_names(pl("cuda1,te=cpu,vae=Cuda0&cuda1", "disk,te=cuda0"), IDX) is None


def test_check_device_names_reports_overridden_entry_first_in_text_order() -> None:
    with pytest.raises(PlanError) as err:
        check_device_names(pl("vae=cpu,te=nope,te=cuda0,diffusion=zzz"), IDX)
    assert (err.value.code, err.value.flag, err.value.span) == ("device_not_found", "--backend",
                                                                 (11, 15))
    assert str(err.value) == "--backend: no device 'nope' (available: CUDA0, CUDA1, CPU)"


def test_check_device_names_backend_before_params_backend() -> None:
    with pytest.raises(PlanError) as err:
        check_device_names(pl("cuda", "c"), IDX)
    assert (err.value.code, err.value.flag, err.value.span) == ("ambiguous_device",
                                                                 "--params-backend", (0, 1))
    with pytest.raises(PlanError) as err:
        check_device_names(pl("te=gpu0", "c"), IDX)
    assert (err.value.code, err.value.flag) == ("device_not_found", "--backend")


def test_device_names_exact_and_collapsed() -> None:
    assert device_names(RuntimeValue.of("cuda1", "CUDA0", "cuda0", "cuda1"), IDX, None) == [
        "CUDA1", "CUDA0"]
    assert device_names(RuntimeValue.of("auto"), IDX, None) == ["CUDA0"]
    assert device_names(RuntimeValue.of("cpu"), IDX, None) == ["CPU"]


# -- sections 4 and 5 ------------------------------------------------------------------------

def test_default_devices() -> None:
    assert default_devices(pl(), IDX) == ["CUDA0"]
    assert default_devices(pl("cuda1&cuda0,te=cpu"), IDX) == ["CUDA1", "CUDA0"]
    igpu = DeviceIndex(Inventory((Device("CPU", "CPU", "cpu", "CPU", GIB, GIB),
                                  Device("Vulkan0", "igpu", "igpu", "Vulkan", GIB, GIB))))
    assert default_devices(pl(), igpu) == ["Vulkan0"]


def test_runtime_devices_default_list_splits_only_splittable_modules() -> None:
    default = ["CUDA0", "CUDA1"]
    devices, warnings = runtime_devices(pl("cuda0&cuda1"), IDX, default)
    assert devices == {m: (default if m in ("diffusion", "te") else ["CUDA0"])
                       for m in PLACED_MODULES}
    assert warnings == [PlanWarning(
        "split_not_supported", "clip_vision, vae, controlnet, photomaker, upscaler, detector, "
        "audio_encoder cannot run on several devices; they run on CUDA0")]


def test_runtime_devices_module_lists_split_and_cpu_rules() -> None:
    devices, warnings = runtime_devices(pl("vae=cuda1&cuda0,te=cuda0&cpu,diffusion=cuda1&cuda0"),
                                        IDX, ["CUDA0"])
    assert devices["diffusion"] == ["CUDA1", "CUDA0"]
    assert devices["te"] == ["CUDA0"] and devices["vae"] == ["CUDA1"]
    assert devices["upscaler"] == ["CUDA0"]
    assert warnings == [
        PlanWarning("split_with_cpu", "te: a device list with the CPU is not split; te runs on "
                    "CUDA0 (to keep its weights in RAM use --params-backend te=cpu)"),
        PlanWarning("split_not_supported", "vae cannot run on several devices; it runs on CUDA1"),
    ]


def test_runtime_devices_collapsed_list_is_one_device_without_warning() -> None:
    devices, warnings = runtime_devices(pl("vae=cuda1&CUDA1&"), IDX, ["CUDA0"])
    assert devices["vae"] == ["CUDA1"] and warnings == []


def test_params_residency_modes() -> None:
    placement = pl("", "cuda0,vae=disk,te=auto,clip_vision=cpu")
    assert params_residency(placement, "vae", ["CUDA0"], IDX) == Params("disk")
    assert params_residency(placement, "diffusion", ["CUDA1"], IDX) == Params("device", "CUDA0")
    # the params device is the only runtime device: reported as follow runtime
    assert params_residency(placement, "diffusion", ["CUDA0"], IDX) == Params("runtime")
    assert params_residency(placement, "te", ["CUDA0", "CUDA1"], IDX) == Params("device", "CUDA0")
    assert params_residency(placement, "clip_vision", ["CUDA0"], IDX) == Params("device", "CPU")
    assert params_residency(pl(), "vae", ["CUDA1"], IDX) == Params("runtime")


# -- section 7 ------------------------------------------------------------------------------

def test_budget_entries_later_key_wins_with_warning() -> None:
    per, warnings = budget_entries(pl(max_vram="5,cuda0=4,cpu=2,CUDA0=6.5"), IDX)
    assert per == {"CPU": Decimal("2"), "CUDA0": Decimal("6.5")}
    assert warnings == [PlanWarning("duplicate_max_vram_device",
                                    "--max-vram names CUDA0 twice; the later value (CUDA0=6.5) "
                                    "wins")]
    assert budget_entries(pl(max_vram="4"), IDX) == ({}, [])


def test_budget_entries_unknown_and_ambiguous_keys() -> None:
    with pytest.raises(PlanError) as err:
        budget_entries(pl(max_vram="cuda0=4,cuda7=2"), IDX)
    assert (err.value.code, err.value.span) == ("unknown_max_vram_device", (8, 13))
    with pytest.raises(PlanError) as err:
        budget_entries(pl(max_vram="c=4"), IDX)
    assert err.value.code == "ambiguous_device"


def test_budget_bytes_positive_spare_disabled_and_cpu() -> None:
    budgets, warnings = budget_bytes(INV, {"CUDA1": Decimal(-12), "CPU": Decimal(4)},
                                     Decimal(-1))
    assert budgets == {"CUDA0": 21 * GIB, "CUDA1": 0, "CPU": 0}
    assert warnings == [PlanWarning("max_vram_disabled", "CUDA1: 11.00 GiB free minus 12 GiB "
                                    "spare leaves nothing; no budget")]
    budgets, warnings = budget_bytes(INV, {"CUDA1": Decimal(0)}, Decimal("6.5"))
    assert budgets == {"CUDA0": 6 * GIB + GIB // 2, "CUDA1": 0, "CPU": 0} and warnings == []
    assert budget_bytes(INV, {}, None) == (NO_BUDGETS, [])


# -- section 8 ------------------------------------------------------------------------------

def test_layer_split_single_device_is_untouched() -> None:
    assert layer_split("vae", ["CUDA1"], FOUR_BLOCKS, NO_BUDGETS, IDX.devices) == (
        Layout(["CUDA1"], [], 0), [])


def test_layer_split_ranges_by_free_memory() -> None:
    # weights 20 and 9 GiB: CUDA0's share of 4.5 GiB is 3.10 GiB minus 0.5 GiB non-block
    layout, warnings = layer_split("diffusion", ["CUDA0", "CUDA1"], FOUR_BLOCKS, NO_BUDGETS,
                                   IDX.devices)
    assert layout == Layout(["CUDA0", "CUDA1"], [Range("CUDA0", 0, 1, 2 * GIB),
                                                 Range("CUDA1", 2, 3, 2 * GIB)], GIB // 2)
    assert warnings == []


def test_layer_split_budget_caps_free_memory_and_warns() -> None:
    # CUDA0 capped at 4 GiB: weight 2 GiB against CUDA1's 9, so it keeps only block 0
    budgets = {"CUDA0": 4 * GIB, "CUDA1": 0, "CPU": 0}
    layout, warnings = layer_split("te", ["CUDA0", "CUDA1"], FOUR_BLOCKS, budgets, IDX.devices)
    assert layout.ranges == [Range("CUDA0", 0, 0, GIB), Range("CUDA1", 1, 3, 3 * GIB)]
    assert warnings == [PlanWarning("split_disables_max_vram", "te is split, so --max-vram "
                                    "segmentation is off for it; the budgets of CUDA0 cap its "
                                    "ranges")]
    # without a profile: the warning, no ranges
    assert layer_split("te", ["CUDA0", "CUDA1"], None, budgets, IDX.devices) == (
        Layout(["CUDA0", "CUDA1"], [], 0), warnings)


def test_layer_split_no_blocks_and_device_without_blocks() -> None:
    unet = ModuleProfile((), 3 * GIB)
    assert layer_split("diffusion", ["CUDA1", "CUDA0"], unet, NO_BUDGETS, IDX.devices) == (
        Layout(["CUDA1"], [], 0),
        [PlanWarning("no_blocks", "diffusion has no splittable blocks (UNet); it runs on "
                     "CUDA1")])
    layout, warnings = layer_split("te", ["CUDA0", "CUDA1"], ModuleProfile((GIB,), 0),
                                   NO_BUDGETS, IDX.devices)
    assert layout == Layout(["CUDA0", "CUDA1"], [Range("CUDA0", 0, 0, GIB)], 0)
    assert warnings == [PlanWarning("device_gets_no_blocks", "te: CUDA1 gets no blocks (too "
                                    "little memory or too few blocks)")]


def test_layer_splits_every_module_in_module_order() -> None:
    runtime = {m: ["CUDA0"] for m in MODULES} | {"diffusion": ["CUDA0", "CUDA1"],
                                                 "te": ["CUDA1", "CUDA0"]}
    profile = Profile({"diffusion": ModuleProfile((), GIB), "te": ModuleProfile((GIB,), 0)})
    layouts, warnings = layer_splits(runtime, NO_BUDGETS, IDX.devices, profile)
    assert list(layouts) == list(MODULES)
    assert layouts["diffusion"] == Layout(["CUDA0"], [], 0)
    assert layouts["te"] == Layout(["CUDA1", "CUDA0"], [Range("CUDA1", 0, 0, GIB)], 0)
    assert layouts["vae"] == Layout(["CUDA0"], [], 0)
    assert [w.code for w in warnings] == ["no_blocks", "device_gets_no_blocks"]
    layouts, warnings = layer_splits(runtime, NO_BUDGETS, IDX.devices, None)
    assert layouts["te"] == Layout(["CUDA1", "CUDA0"], [], 0) and warnings == []


# -- section 9 ------------------------------------------------------------------------------

def test_stream_layers_warnings() -> None:
    on_cpu = ModulePlan(["CUDA1"], Params("device", "CPU"))
    budget = {"CUDA0": 0, "CUDA1": 4 * GIB, "CPU": 0}
    assert stream_layers_warnings(False, ModulePlan(["CUDA0", "CUDA1"], Params("runtime")),
                                  NO_BUDGETS, IDX.devices) == []
    assert stream_layers_warnings(True, on_cpu, budget, IDX.devices) == []
    inactive = [PlanWarning("stream_layers_inactive", "--stream-layers needs the diffusion "
                            "weights on the CPU (--offload-to-cpu) and a --max-vram budget on "
                            "CUDA1; it has no effect")]
    assert stream_layers_warnings(True, on_cpu, NO_BUDGETS, IDX.devices) == inactive
    assert stream_layers_warnings(True, ModulePlan(["CUDA1"], Params("device", "CUDA0")), budget,
                                  IDX.devices) == inactive
    assert stream_layers_warnings(True, ModulePlan(["CUDA0", "CUDA1"], Params("device", "CPU")),
                                  budget, IDX.devices) == [
        PlanWarning("split_disables_stream_layers", "--stream-layers has no effect: diffusion "
                    "is split across devices")]


# -- canonical strings ----------------------------------------------------------------------

def test_canonical_placement_exact_names_and_defaults_dropped() -> None:
    placement = pl("cuda1,te=Cuda1,vae=cpu&,diffusion=cuda0&CUDA0&cuda1",
                   "disk,vae=disk,te=cuda0", "5,cuda1=4,cuda0=2,CUDA1=5,cpu=1")
    per, _ = budget_entries(placement, IDX)
    canon = canonical_placement(placement, IDX, ["CUDA1"], per)
    assert canon.to_strings() == {"backend": "CUDA1,diffusion=CUDA0&CUDA1,vae=CPU",
                                  "params_backend": "disk,te=CUDA0",
                                  "max_vram": "5,CUDA0=2,CPU=1"}
    assert canon.default == RuntimeValue.of("CUDA1")
    assert [b.key.text for b in canon.budgets] == ["CUDA0", "CPU"]


# -- the passes together --------------------------------------------------------------------

def test_resolve_joins_pass_warnings_in_pass_order() -> None:
    plan = resolve(["--vae-on-cpu", "--backend", "cuda0&cuda1,vae=cpu", "--max-vram",
                    "cuda1=-20,cuda0=4,CUDA0=5", "--stream-layers"], INV,
                   Profile({"diffusion": FOUR_BLOCKS}))
    assert plan.warning_codes() == [
        "deprecated_flag", "duplicate_max_vram_device", "max_vram_disabled",
        "split_not_supported", "split_disables_max_vram", "split_disables_max_vram",
        "split_disables_stream_layers"]
    assert plan.budgets == {"CUDA0": 5 * GIB, "CUDA1": 0, "CPU": 0}
    assert plan.modules["diffusion"].ranges == [Range("CUDA0", 0, 0, GIB),
                                                Range("CUDA1", 1, 3, 3 * GIB)]
    assert plan.modules["vae"].devices == ["CPU"]
    assert (plan.backend, plan.max_vram) == ("CUDA0&CUDA1,vae=CPU", "CUDA0=5,CUDA1=-20")
