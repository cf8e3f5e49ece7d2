"""Resolution of a placement against a device inventory (and a model profile) into a plan.

:func:`resolve` applies spec sections 3-9: runtime devices per module, params residency,
budgets in bytes, layer-split block ranges when a profile is given, and warnings with the
spec's codes. The resulting :class:`~sdplan.core.planning.plan_types.Plan` carries the canonical strings and a canonical
:class:`~sdplan.core.planning.placement.Placement` (exact device names) for the GUI to edit; resolving
those strings again gives the same plan.

The plan data types live in :mod:`sdplan.core.planning.plan_types`; the editable placement,
the flag glue and the sd-cli writer/importer in :mod:`sdplan.core.planning.placement` and
:mod:`sdplan.core.planning.sdcli`. This module is the public entry and re-exports them.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence
from decimal import Decimal

from sdplan.core.errors import PlanError
from sdplan.core.planning.assignment import (
    GIB,
    MODULES,
    SPLITTABLE,
    DeviceIndex,
    ParamsValue,
    Ref,
    RuntimeValue,
    gib_to_bytes,
    normalize_module,
)
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.placement import (
    BudgetEntry,
    Placement,
    add_placement_arguments,
    placement_from_namespace,
)
from sdplan.core.planning.plan_types import ModulePlan, Params, Plan, PlanWarning, Range
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.sdcli import ImportedCommand, import_sdcli_command, sdcli_argv

__all__ = [
    "MODULES", "SPLITTABLE", "normalize_module", "Placement", "Plan", "ModulePlan", "Params",
    "Range", "PlanWarning", "resolve", "split_ranges", "add_placement_arguments",
    "placement_from_namespace", "sdcli_argv", "import_sdcli_command", "ImportedCommand",
]

#: Warnings that only say the input was redundant; a canonical rewrite drops them.
INPUT_ONLY_WARNINGS = frozenset({"deprecated_flag", "duplicate_max_vram_device"})


@functools.lru_cache(maxsize=16)
def _index(inventory: Inventory) -> DeviceIndex:
    return DeviceIndex(inventory)


def _placement(source: Placement | Sequence[str] | argparse.Namespace) -> Placement:
    if isinstance(source, Placement):
        return source
    if isinstance(source, argparse.Namespace):
        return placement_from_namespace(source)
    if isinstance(source, str):
        raise TypeError("resolve() takes a Placement, an argument list or a Namespace, not str")
    return Placement.from_args(list(source))


def resolve(source: Placement | Sequence[str] | argparse.Namespace, inventory: Inventory,
            profile: Profile | None = None) -> Plan:
    """Resolve a placement (or sd-cli placement arguments) into a :class:`Plan`.

    Args:
        source: a :class:`Placement`, an argument list such as ``["--backend", "te=cpu"]``,
            or a Namespace from :func:`add_placement_arguments`.
        inventory: the devices to plan for (free memory in bytes drives spare budgets and
            split ranges).
        profile: per-module block sizes; when given, split modules get block ranges
            (spec section 8) and UNet-style modules (no blocks) warning ``no_blocks``.

    Raises:
        PlanError: any error code of spec section 11, with the flag and span.
    """
    pl = _placement(source)
    idx = _index(inventory)
    if idx.default is None:
        raise PlanError("device_not_found", "the device inventory is empty")
    texts = pl.texts
    warnings: list[PlanWarning] = []
    for flag in pl.deprecated:
        warnings.append(PlanWarning("deprecated_flag", f"{flag} is deprecated; it means "
                                    f"{_DEPRECATED_MEANING[flag]}"))
    _check_all(pl, idx)

    def names(value: RuntimeValue) -> list[str]:
        out: list[str] = []
        for r in value.refs:
            n = idx.resolve(r, "--backend", texts.get("--backend"))
            if n not in out:
                out.append(n)
        return out

    default_list = names(pl.default) if pl.default is not None else [idx.default]
    budgets, budget_entries = _budgets(pl, idx, inventory, warnings)
    devices: dict[str, list[str]] = {}
    inherited: list[str] = []
    for m in MODULES:
        value = pl.runtime.get(m)
        devs = names(value) if value is not None else list(default_list)
        if len(devs) > 1 and m not in SPLITTABLE:
            # One warning for every module on the default list, written or inherited, so a
            # plan and its canonical strings (which omit entries equal to the default) agree.
            if value is None or devs == default_list:
                inherited.append(m)
            else:
                warnings.append(PlanWarning("split_not_supported", f"{m} cannot run on several "
                                            f"devices; it runs on {devs[0]}"))
            devs = devs[:1]
        elif len(devs) > 1 and any(idx.devices[d].type == "cpu" for d in devs):
            warnings.append(PlanWarning("split_with_cpu", f"{m}: a device list with the CPU is "
                                        f"not split; {m} runs on {devs[0]} (to keep its weights "
                                        f"in RAM use --params-backend {m}=cpu)"))
            devs = devs[:1]
        devices[m] = devs
    if inherited:
        warnings.append(PlanWarning("split_not_supported", f"{', '.join(inherited)} cannot run "
                                    f"on several devices; they run on {default_list[0]}"))

    modules: dict[str, ModulePlan] = {}
    for m in MODULES:
        devs = devices[m]
        ranges: list[Range] = []
        other = 0
        if len(devs) > 1:
            mp = profile.get(m) if profile is not None else None
            if mp is not None and not mp.blocks:
                warnings.append(PlanWarning("no_blocks", f"{m} has no splittable blocks (UNet); "
                                            f"it runs on {devs[0]}"))
                devs = devs[:1]
            else:
                budgeted = [d for d in devs if budgets[d] > 0]
                if budgeted:
                    warnings.append(PlanWarning("split_disables_max_vram", f"{m} is split, so "
                                                "--max-vram segmentation is off for it; the "
                                                f"budgets of {', '.join(budgeted)} cap its ranges"))
                if mp is not None:
                    free = [min(idx.devices[d].free, budgets[d]) if budgets[d] > 0
                            else idx.devices[d].free for d in devs]
                    ranges = split_ranges(devs, free, mp)
                    other = mp.other
                    for d in devs:
                        if not any(r.device == d for r in ranges):
                            warnings.append(PlanWarning("device_gets_no_blocks", f"{m}: {d} gets "
                                                        "no blocks (too little memory or too "
                                                        "few blocks)"))
        modules[m] = ModulePlan(devs, _params(pl, m, devs, idx), ranges, other)

    if pl.stream_layers:
        diff = modules["diffusion"]
        on_cpu = diff.params.mode == "device" and diff.params.device is not None and \
            idx.devices[diff.params.device].type == "cpu"
        if len(diff.devices) > 1:
            warnings.append(PlanWarning("split_disables_stream_layers", "--stream-layers has "
                                        "no effect: diffusion is split across devices"))
        elif not on_cpu or budgets[diff.devices[0]] <= 0:
            warnings.append(PlanWarning("stream_layers_inactive", "--stream-layers needs the "
                                        "diffusion weights on the CPU (--offload-to-cpu) and a "
                                        f"--max-vram budget on {diff.devices[0]}; it has no "
                                        "effect"))

    canon = _canonical(pl, idx, default_list, budget_entries)
    strings = canon.to_strings()
    return Plan(modules=modules, budgets=budgets, warnings=warnings,
                backend=strings["backend"], params_backend=strings["params_backend"],
                max_vram=strings["max_vram"], placement=canon,
                stream_layers=pl.stream_layers, rpc_servers=pl.rpc_servers)


_DEPRECATED_MEANING = {"--clip-on-cpu": "--backend te=cpu", "--vae-on-cpu": "--backend vae=cpu",
                       "--control-net-cpu": "--backend controlnet=cpu"}


def _check_all(pl: Placement, idx: DeviceIndex) -> None:
    """Resolve every device name written in ``--backend`` and ``--params-backend``, including
    overridden entries, in text order, so the first bad one is reported (spec section 11)."""
    for flag in ("--backend", "--params-backend"):
        text = pl.texts.get(flag)
        refs: list[Ref] = []
        values: list[object] = [pl.default, *pl.runtime.values()] if flag == "--backend" else \
            [pl.params_default, *pl.params.values()]
        values += [v for f, v in pl.shadowed if f == flag]
        for v in values:
            if isinstance(v, RuntimeValue):
                refs.extend(v.refs)
            elif isinstance(v, ParamsValue) and v.ref is not None:
                refs.append(v.ref)
        refs.sort(key=lambda r: r.span[0] if r.span is not None else -1)
        for r in refs:
            idx.resolve(r, flag, text)


def _params(pl: Placement, m: str, devs: list[str], idx: DeviceIndex) -> Params:
    pv = pl.params.get(m, pl.params_default)
    if pv is None or pv.kind == "runtime":
        return Params("runtime")
    if pv.kind == "disk":
        return Params("disk")
    assert pv.ref is not None
    name = idx.resolve(pv.ref, "--params-backend", pl.texts.get("--params-backend"))
    if devs == [name]:
        return Params("runtime")
    return Params("device", name)


def _budgets(pl: Placement, idx: DeviceIndex, inventory: Inventory,
             warnings: list[PlanWarning]) -> tuple[dict[str, int], dict[str, Decimal]]:
    """Budgets in bytes per device (spec section 7) and the winning GiB entry per device."""
    text = pl.texts.get("--max-vram")
    per: dict[str, Decimal] = {}
    for b in pl.budgets:
        name = idx.resolve(b.key, "--max-vram", text, not_found="unknown_max_vram_device")
        if name in per:
            warnings.append(PlanWarning("duplicate_max_vram_device", f"--max-vram names {name} "
                                        f"twice; the later value ({b.key.text}="
                                        f"{b.gib}) wins"))
            del per[name]
        per[name] = b.gib
    out: dict[str, int] = {}
    for d in inventory:
        gib = per.get(d.name, pl.budget_default)
        if gib is None or not d.is_gpu_like or gib == 0:
            out[d.name] = 0
        elif gib > 0:
            out[d.name] = gib_to_bytes(gib)
        else:
            spare = d.free + gib_to_bytes(gib)
            if spare <= 0:
                warnings.append(PlanWarning("max_vram_disabled", f"{d.name}: {d.free / GIB:.2f} "
                                            f"GiB free minus {gib.copy_abs()} GiB spare leaves nothing; "
                                            "no budget"))
            out[d.name] = max(spare, 0)
    return out, per


def split_ranges(devices: Sequence[str], free: Sequence[int], mp: ModuleProfile) -> list[Range]:
    """Contiguous block ranges for a layer split (spec section 8, the design document's rule).

    Weight ``w_i = max(free_i - 2 GiB, free_i / 8)`` (1 when not positive); device ``i``'s
    share is ``floor(total * w_i / sum(w))`` bytes, minus the non-block bytes on device 0,
    floored at 0; blocks go in order, moving on when the current device has a block and the
    next would exceed its share; the last device takes the rest. Integer arithmetic (weights
    scaled by 8), so results are exact.

    Args:
        devices: the module's devices, main device first.
        free: free bytes per device (already capped by budgets).
        mp: the module's block sizes (bytes) and non-block bytes.

    Returns:
        One :class:`Range` per device that received blocks, in order.
    """
    w = [max(8 * (f - 2 * GIB), f) for f in free]
    w = [x if x > 0 else 8 for x in w]
    total = sum(mp.blocks) + mp.other
    sw = sum(w)
    shares = [total * x // sw for x in w]
    shares[0] = max(shares[0] - mp.other, 0)
    ranges: list[Range] = []
    dev, first, running = 0, 0, 0
    last = len(devices) - 1
    for i, size in enumerate(mp.blocks):
        if dev < last and i > first and running + size > shares[dev]:
            ranges.append(Range(devices[dev], first, i - 1, running))
            dev, first, running = dev + 1, i, 0
        running += size
    if mp.blocks:
        ranges.append(Range(devices[dev], first, len(mp.blocks) - 1, running))
    return ranges


def _canonical(pl: Placement, idx: DeviceIndex, default_list: list[str],
               per: dict[str, Decimal]) -> Placement:
    """The placement with exact device names, an explicit default and one budget entry per
    device (inventory order)."""

    def run(v: RuntimeValue) -> RuntimeValue:
        out: list[str] = []
        for r in v.refs:
            n = idx.resolve(r, "--backend", None)
            if n not in out:
                out.append(n)
        return RuntimeValue.of(*out)

    def par(v: ParamsValue) -> ParamsValue:
        if v.kind != "device" or v.ref is None:
            return ParamsValue(v.kind)
        return ParamsValue("device", Ref(idx.resolve(v.ref, "--params-backend", None)))

    budgets = tuple(BudgetEntry(Ref(d.name), per[d.name]) for d in idx.inventory
                    if d.name in per)
    default = RuntimeValue.of(*default_list)
    p_default = par(pl.params_default) if pl.params_default else None
    runtime = {m: run(pl.runtime[m]) for m in MODULES if m in pl.runtime}
    params = {m: par(pl.params[m]) for m in MODULES if m in pl.params}
    return Placement(default=default,
                     runtime={m: v for m, v in runtime.items() if v != default},
                     params_default=p_default,
                     params={m: v for m, v in params.items() if v != p_default and not (
                         v.kind == "runtime" and p_default is None)},
                     budget_default=pl.budget_default,
                     budgets=tuple(b for b in budgets if b.gib != pl.budget_default),
                     stream_layers=pl.stream_layers, rpc_servers=pl.rpc_servers)
