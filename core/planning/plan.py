"""Resolution of a placement against a device inventory (and a model profile) into a plan.

:func:`resolve` runs one pass per section of the behaviour spec, in this order:

- :func:`deprecation_warnings`: compatibility flags (section 6);
- :func:`~sdplan.core.planning.autofit_plan.fit_placement`: sd-cli's auto-fit replaces the
  runtime and params strings with its own choice (sections 13 and 14.1, for the plan's
  :class:`~sdplan.core.planning.target.Target`);
- :func:`check_device_names`: every written device name resolves (sections 3 and 11);
- :func:`default_devices`: the default runtime devices (sections 4 and 5);
- :func:`budget_entries` and :func:`budget_bytes`: ``--max-vram`` (section 7);
- :func:`runtime_devices`: runtime devices per module, with the split rules (section 5);
- :func:`layer_splits`: block ranges of split modules (section 8, :func:`split_ranges`);
- :func:`row_splits`: ``--split-mode row`` where the devices allow it (section 12);
- :func:`params_residency`: where each module's weights live (section 5);
- :func:`stream_layers_warnings`: ``--stream-layers`` (section 9);
- :func:`canonical_placement`: exact device names for the canonical strings (section 3).

Each pass is a pure function of plain data that returns its result and its warnings;
:func:`resolve` joins the warnings in pass order. The resulting
:class:`~sdplan.core.planning.plan_types.Plan` carries the canonical strings and a canonical
:class:`~sdplan.core.planning.placement.Placement` (exact device names) for the GUI to edit;
resolving those strings again gives the same plan.

The plan data types live in :mod:`sdplan.core.planning.plan_types`; the editable
placement and the flag glue in :mod:`sdplan.core.planning.placement`.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import NamedTuple

from sdplan.core.errors import PlanError
from sdplan.core.planning.assignment import (
    DeviceIndex,
    ParamsValue,
    Ref,
    RuntimeValue,
    gib_to_bytes,
)
from sdplan.core.planning.autofit_plan import auto_fit_semantics, fit_placement
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.modules import GIB, PLACED_MODULES, SPLITTABLE
from sdplan.core.planning.phases import PHASE_ORDER
from sdplan.core.planning.placement import BudgetEntry, Placement, placement_from_namespace
from sdplan.core.planning.plan_types import (
    DiffusionPhase,
    ModulePlan,
    Params,
    Plan,
    PlanWarning,
    Range,
)
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.sdcli_split import (
    fill_first,
    newest_budget,
    ratio_ranges,
    sdcli_capacities,
    spread_capacities,
)
from sdplan.core.planning.speed_split import speed_ranges
from sdplan.core.planning.split_policy import cfg_plan, split_ratio_check
from sdplan.core.planning.split_ratio import SplitRatio
from sdplan.core.planning.target import Target

__all__ = ["resolve", "split_ranges"]

#: Warnings that only say the input was redundant; a canonical rewrite drops them.
INPUT_ONLY_WARNINGS = frozenset({"deprecated_flag", "duplicate_max_vram_device"})


class Layout(NamedTuple):
    """A module's runtime devices after the layer-split rules (main device first), its block
    ranges (empty unless split with a profile), its non-block bytes on the main device, in
    row mode each device's bytes of the block weights' rows, and what the ranges count."""

    devices: list[str]
    ranges: list[Range]
    main_other_bytes: int
    row_shares: dict[str, int] = {}  # noqa: RUF012 - NamedTuple default, never mutated
    unit: str = "block"


#: Backend registries whose devices offer a row-split buffer type (spec section 12): ggml's
#: CUDA back end, under the registry names its CUDA, HIP (ROCm) and MUSA builds use.
ROW_SPLIT_REGISTRIES = frozenset({"CUDA", "ROCM", "MUSA"})


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
            profile: Profile | None = None, target: Target | None = None) -> Plan:
    """Resolve a placement (or sd-cli placement arguments) into a :class:`Plan`.

    Args:
        source: a :class:`Placement`, an argument list such as ``["--backend", "te=cpu"]``,
            or a Namespace from :func:`add_placement_arguments`.
        inventory: the devices to plan for (free memory in bytes drives spare budgets and
            split ranges).
        profile: per-module block sizes; when given, split modules get block ranges
            (spec section 8) and UNet-style modules (no blocks) warning ``no_blocks``.
        target: what the plan is for (default: sdplan's engine); an sd-cli target reads the
            flags as that sd-cli does (its auto-fit, spec section 14).

    Raises:
        PlanError: any error code of spec section 11, with the flag and span.
    """
    pl = _placement(source)
    target = target or Target()
    idx = _index(inventory)
    if idx.default is None:
        raise PlanError("device_not_found", "the device inventory is empty")
    deprecated = deprecation_warnings(pl.deprecated)
    per_device, duplicates = budget_entries(pl, idx)
    given = pl
    semantics = auto_fit_semantics(pl, target)
    pl, fitted, fit_warnings = fit_placement(
        pl, inventory, per_device, profile, target,
        lambda v: device_names(v, idx, given.texts.get("--backend")))
    check_device_names(pl, idx)
    default_list = default_devices(pl, idx)
    budgets, disabled = budget_bytes(inventory, per_device, pl.budget_default)
    runtime, runtime_warnings = runtime_devices(pl, idx, default_list)
    rows, row_warnings = row_splits(pl, runtime, idx.devices, profile)
    layered = {m: d for m, d in runtime.items() if m not in rows}
    ratio_warnings = split_ratio_check(pl, layered)
    # the inventory's own devices: the cached index compares devices without their profiles
    layouts, split_warnings = layer_splits(layered, budgets, {d.name: d for d in inventory}, profile,
                                           target, pl.split_ratio)
    split_warnings = ratio_warnings + split_warnings
    diffusion = layouts.get("diffusion")
    cfg, cfg_warnings = cfg_plan(pl, idx, diffusion.devices if diffusion else None, target,
                                 profile)
    layouts.update(rows)
    modules = {m: ModulePlan(lay.devices, params_residency(pl, m, lay.devices, idx),
                             lay.ranges, lay.main_other_bytes,
                             "row" if m in rows else "layer",
                             rows[m].row_shares if m in rows else {}, lay.unit)
               for m, lay in sorted(layouts.items(), key=lambda kv: PLACED_MODULES.index(kv[0]))}
    phases = diffusion_phases(modules.get("diffusion"), profile, budgets, idx.devices, target,
                              pl.split_ratio)
    streaming = stream_layers_warnings(pl.stream_layers, modules["diffusion"], budgets,
                                       idx.devices)
    canon = canonical_placement(pl, idx, default_list, per_device)
    strings = canon.to_strings()
    if semantics == "snapshot":  # edit and write the --auto-fit placement, not its result
        canon = dataclasses.replace(canon, default=None, runtime={}, params_default=None,
                                    params={})
    elif semantics == "newest" or target.sdcli:  # the written --backend as sd-cli reads it
        canon = canonical_placement(given, idx, default_list, per_device)
        if given.default is None:  # no default written: sd-cli's own (its auto-fit's) stays
            canon = dataclasses.replace(canon, default=None, runtime={
                m: RuntimeValue.of(*device_names(v, idx, None)) for m, v in given.runtime.items()})
    return Plan(modules=modules, budgets=budgets,
                warnings=[*deprecated, *fit_warnings, *duplicates, *disabled, *runtime_warnings,
                          *row_warnings, *split_warnings, *cfg_warnings, *streaming],
                backend=strings["backend"], params_backend=strings["params_backend"],
                max_vram=strings["max_vram"], placement=canon,
                stream_layers=pl.stream_layers, rpc_servers=pl.rpc_servers,
                split_mode=canon.split_mode_text(), auto_fit=fitted, target=target,
                split_ratio=pl.split_ratio, cfg=cfg, phases=phases)


def diffusion_phases(diffusion: ModulePlan | None, profile: Profile | None,
                     budgets: Mapping[str, int], devices: Mapping[str, Device], target: Target,
                     split_ratio: SplitRatio | None) -> tuple[DiffusionPhase, ...]:
    """The phases of a two-stage diffusion model (:mod:`sdplan.core.planning.phases`), in the
    order they run, on the ``diffusion`` module's devices, each expert's blocks split by its
    own bytes as :func:`layer_split` splits the module; ``()`` for a one-stage model."""
    high = profile.phases.get("high_noise") if profile is not None else None
    low = profile.get("diffusion") if profile is not None else None
    if diffusion is None or high is None or low is None:
        return ()
    lay, _ = layer_split("diffusion", diffusion.devices, high, budgets, devices, target, split_ratio)
    (hn, hflag), (ln, lflag) = PHASE_ORDER
    return (DiffusionPhase(hn, hflag, lay.ranges, high.total, lay.main_other_bytes if lay.ranges else high.other),
            DiffusionPhase(ln, lflag, list(diffusion.ranges), low.total,
                           diffusion.main_other_bytes if diffusion.ranges else low.other))


_DEPRECATED_MEANING = {"--clip-on-cpu": "--backend te=cpu", "--vae-on-cpu": "--backend vae=cpu",
                       "--control-net-cpu": "--backend controlnet=cpu"}


def deprecation_warnings(flags: Sequence[str]) -> list[PlanWarning]:
    """Spec section 6: one ``deprecated_flag`` per compatibility flag used, in order."""
    return [PlanWarning("deprecated_flag", f"{flag} is deprecated; it means "
                        f"{_DEPRECATED_MEANING[flag]}") for flag in flags]


def check_device_names(pl: Placement, idx: DeviceIndex) -> None:
    """Spec sections 3 and 11: resolve every device name written in ``--backend`` and
    ``--params-backend``, including overridden entries, in text order, so the first bad one
    is reported.

    Raises:
        PlanError: ``device_not_found`` or ``ambiguous_device`` with the entry's span.
    """
    for flag in ("--backend", "--params-backend"):
        text = pl.texts.get(flag)
        refs: list[Ref] = []
        values: list[object] = [pl.default, *pl.runtime.values(), pl.cfg] \
            if flag == "--backend" else [pl.params_default, *pl.params.values()]
        values += [v for f, v in pl.shadowed if f == flag]
        for v in values:
            if isinstance(v, RuntimeValue):
                refs.extend(v.refs)
            elif isinstance(v, ParamsValue) and v.ref is not None:
                refs.append(v.ref)
        refs.sort(key=lambda r: r.span[0] if r.span is not None else -1)
        for r in refs:
            idx.resolve(r, flag, text)


def device_names(value: RuntimeValue, idx: DeviceIndex, text: str | None) -> list[str]:
    """Spec sections 3 and 4: the exact device names of a ``--backend`` value in written
    order, entries naming one device collapsed (``text`` is the flag value for spans)."""
    out: list[str] = []
    for r in value.refs:
        n = idx.resolve(r, "--backend", text)
        if n not in out:
            out.append(n)
    return out


def default_devices(pl: Placement, idx: DeviceIndex) -> list[str]:
    """Spec sections 4 and 5: the devices of the ``--backend`` default, else the default
    device of section 3."""
    if pl.default is None:
        return [idx.default] if idx.default is not None else []
    return device_names(pl.default, idx, pl.texts.get("--backend"))


def runtime_devices(pl: Placement, idx: DeviceIndex, default_list: list[str]
                    ) -> tuple[dict[str, list[str]], list[PlanWarning]]:
    """Spec section 5: each module's runtime devices (its entry, else ``default_list``).

    A list on a module other than ``diffusion``/``te`` keeps its first device (warning
    ``split_not_supported``; one warning names every module that has the default list, so a
    plan and its canonical strings agree); a list with the CPU keeps its first device
    (warning ``split_with_cpu``).
    """
    text = pl.texts.get("--backend")
    devices: dict[str, list[str]] = {}
    warnings: list[PlanWarning] = []
    inherited: list[str] = []
    for m in PLACED_MODULES:
        value = pl.runtime.get(m)
        devs = device_names(value, idx, text) if value is not None else list(default_list)
        if len(devs) > 1 and m not in SPLITTABLE:
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
    return devices, warnings


def params_residency(pl: Placement, module: str, devices: list[str], idx: DeviceIndex
                     ) -> Params:
    """Spec section 5: where ``module``'s weights live (its ``--params-backend`` entry, else
    the params default, else follow runtime); a params device that is the module's only
    runtime device is reported as follow runtime."""
    pv = pl.params.get(module, pl.params_default)
    if pv is None or pv.kind == "runtime":
        return Params("runtime")
    if pv.kind == "disk":
        return Params("disk")
    assert pv.ref is not None
    name = idx.resolve(pv.ref, "--params-backend", pl.texts.get("--params-backend"))
    if devices == [name]:
        return Params("runtime")
    return Params("device", name)


def budget_entries(pl: Placement, idx: DeviceIndex
                   ) -> tuple[dict[str, Decimal], list[PlanWarning]]:
    """Spec section 7: the winning ``--max-vram`` GiB entry per device named (later wins,
    warning ``duplicate_max_vram_device``).

    Raises:
        PlanError: ``unknown_max_vram_device`` or ``ambiguous_device`` with the key's span.
    """
    text = pl.texts.get("--max-vram")
    per: dict[str, Decimal] = {}
    warnings: list[PlanWarning] = []
    for b in pl.budgets:
        name = idx.resolve(b.key, "--max-vram", text, not_found="unknown_max_vram_device")
        if name in per:
            warnings.append(PlanWarning("duplicate_max_vram_device", f"--max-vram names {name} "
                                        f"twice; the later value ({b.key.text}="
                                        f"{b.gib}) wins"))
            del per[name]
        per[name] = b.gib
    return per, warnings


def budget_bytes(inventory: Inventory, per: Mapping[str, Decimal], default: Decimal | None
                 ) -> tuple[dict[str, int], list[PlanWarning]]:
    """Spec section 7: every device's budget in bytes (0 = none or disabled) from its entry
    in ``per``, else ``default``. Only GPU-like devices have budgets; a spare (negative)
    budget is free memory minus it, disabled with warning ``max_vram_disabled`` when that
    leaves nothing."""
    out: dict[str, int] = {}
    warnings: list[PlanWarning] = []
    for d in inventory:
        gib = per.get(d.name, default)
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
    return out, warnings


def row_splits(pl: Placement, runtime: Mapping[str, list[str]],
               devices: Mapping[str, Device], profile: Profile | None
               ) -> tuple[dict[str, Layout], list[PlanWarning]]:
    """Spec section 12: the modules that run in row mode, with their row shares.

    A split module whose ``--split-mode`` is ``row`` keeps it when all its devices belong to
    one registry of :data:`ROW_SPLIT_REGISTRIES` and (with a profile) it has blocks;
    otherwise it falls back to a layer split with warning ``row_split_unavailable``. Each
    device's share of the block bytes is proportional to ``max(free - 2 GiB, free / 8)`` (1
    when not positive; stable-diffusion.cpp's ``tensor_split`` weights), floored; the main
    device holds the non-block bytes.
    """
    rows: dict[str, Layout] = {}
    warnings: list[PlanWarning] = []
    for m in SPLITTABLE:
        devs = runtime.get(m) or []
        if len(devs) < 2 or pl.split_mode_of(m) != "row":
            continue
        registries = {devices[d].registry.upper() for d in devs}
        mp = profile.get(m) if profile is not None else None
        reason = None
        if len(registries) > 1:
            reason = f"its devices {' & '.join(devs)} span registries {', '.join(sorted(registries))}"
        elif not registries <= ROW_SPLIT_REGISTRIES:
            reason = (f"{devices[devs[0]].registry} devices have no row-split buffer type "
                      "(CUDA only)")
        elif mp is not None and not mp.blocks:
            reason = "it has no transformer blocks to split by rows"
        if reason is not None:
            warnings.append(PlanWarning("row_split_unavailable", f"{m}: row split unavailable "
                                        f"({reason}); it uses a layer split"))
            continue
        shares: dict[str, int] = {}
        if mp is not None:
            w = [max(devices[d].free - 2 * GIB, devices[d].free // 8) for d in devs]
            w = [x if x > 0 else 1 for x in w]
            block_bytes = sum(mp.blocks)
            shares = {d: block_bytes * x // sum(w) for d, x in zip(devs, w, strict=True)}
        rows[m] = Layout(list(devs), [], mp.other if mp is not None else 0, shares)
    return rows, warnings


def layer_splits(runtime: Mapping[str, list[str]], budgets: Mapping[str, int],
                 devices: Mapping[str, Device], profile: Profile | None,
                 target: Target | None = None, split_ratio: SplitRatio | None = None
                 ) -> tuple[dict[str, Layout], list[PlanWarning]]:
    """Spec sections 8 and 14.3-14.4 for every module in :data:`PLACED_MODULES` order (see
    :func:`layer_split`)."""
    layouts: dict[str, Layout] = {}
    warnings: list[PlanWarning] = []
    for m in PLACED_MODULES:
        if m not in runtime:
            continue
        mp = profile.get(m) if profile is not None else None
        layouts[m], found = layer_split(m, runtime[m], mp, budgets, devices, target or Target(),
                                        split_ratio)
        warnings += found
    return layouts, warnings


def layer_split(module: str, runtime: list[str], mp: ModuleProfile | None,
                budgets: Mapping[str, int], devices: Mapping[str, Device],
                target: Target | None = None, split_ratio: SplitRatio | None = None
                ) -> tuple[Layout, list[PlanWarning]]:
    """The layout of one module on ``runtime`` (several devices = a split).

    Budgets on a split module's devices give warning ``split_disables_max_vram`` (they cap
    its ranges instead). Ranges (warning ``device_gets_no_blocks`` for each device left
    without one):

    - ``--split-ratio r0,r1,...``: fixed fractions of the block bytes
      (:func:`~sdplan.core.planning.sdcli_split.ratio_ranges`);
    - for an sd-cli target, or ``--split-ratio vram``: each device filled in order as that
      sd-cli fills it (:func:`sdcli_ranges`), a UNet's stages spread too; ``auto`` (the
      newest sd-cli's default) gives warning ``split_ratio_auto``;
    - for sdplan's engine: ``--split-ratio auto`` by the devices' measured speed
      (:func:`~sdplan.core.planning.speed_split.speed_ranges`), else section 8
      (:func:`split_ranges`); a module without blocks (UNet) runs on its first device
      (warning ``no_blocks``, saying what sd-cli does instead).
    """
    target = target or Target()
    if len(runtime) <= 1:
        return Layout(runtime, [], 0), []
    if target.sdcli and target.dialect == "snapshot":
        split_ratio = None  # the snapshot has no --split-ratio (its written flags drop it)
    units = mp.blocks or (mp.stages if target.sdcli else ()) if mp is not None else ()
    kind = split_ratio.kind if split_ratio is not None else ("auto" if target.sdcli else "")
    if mp is not None and not units:
        if mp.stages:
            return Layout(runtime[:1], [], 0), [PlanWarning(
                "no_blocks", f"{module} has no splittable blocks (UNet); sdplan's engine runs it "
                f"on {runtime[0]} (sd-cli instead cuts its graph into segments and spreads "
                f"them over {' & '.join(runtime)})")]
        return Layout(runtime[:1], [], 0), [PlanWarning(
            "no_blocks", f"{module} has no splittable blocks (UNet); it runs on {runtime[0]}")]
    warnings: list[PlanWarning] = []
    budgeted = [d for d in runtime if budgets[d] > 0]
    if budgeted:
        warnings.append(PlanWarning("split_disables_max_vram", f"{module} is split, so "
                                    "--max-vram segmentation is off for it; the "
                                    f"budgets of {', '.join(budgeted)} cap its ranges"))
    if mp is None:
        return Layout(runtime, [], 0), warnings
    fixed = mp.other - (sum(mp.stages) if not mp.blocks else 0)
    unit = "block" if mp.blocks else "stage"
    if split_ratio is not None and split_ratio.kind == "ratios":
        ranges = ratio_ranges(runtime, split_ratio.fractions(), units)
    elif target.sdcli or kind == "vram":
        ranges, found = sdcli_ranges(module, runtime, units, fixed, budgets, devices,
                                     target.dialect if target.sdcli else "newest")
        warnings += found
        if target.sdcli and kind == "auto" and target.dialect == "newest":
            warnings.append(PlanWarning("split_ratio_auto", f"{module}: sd-cli's --split-ratio "
                                        "auto measures the devices at start-up and may move "
                                        "blocks to where they run fastest; the ranges shown "
                                        "fill each device in order (--split-ratio vram)"))
    else:
        fast = None
        if kind == "auto":  # sdplan's engine: blocks by the devices' measured speed
            fast, found = speed_ranges(module, runtime, mp, devices, budgets)
            warnings += found
        free = [min(devices[d].free, budgets[d]) if budgets[d] > 0 else devices[d].free
                for d in runtime]
        ranges = fast if fast is not None else split_ranges(runtime, free, mp)
    for d in runtime:
        if not any(r.device == d for r in ranges):
            warnings.append(PlanWarning("device_gets_no_blocks", f"{module}: {d} gets no "
                                        f"{unit}s (too little memory or too few {unit}s)"))
    return Layout(runtime, ranges, fixed, unit=unit), warnings


def sdcli_ranges(module: str, runtime: list[str], units: Sequence[int], fixed: int,
                 budgets: Mapping[str, int], devices: Mapping[str, Device], dialect: str
                 ) -> tuple[list[Range], list[PlanWarning]]:
    """Spec section 14.3: the ranges sd-cli in ``dialect`` fills
    (:mod:`sdplan.core.planning.sdcli_split`); the snapshot stops when its last device cannot
    hold the rest (warning ``split_over_capacity``), the newest streams the excess (warning
    ``split_streams``)."""
    free = [devices[d].free for d in runtime]
    budget = [budgets[d] for d in runtime]
    caps = sdcli_capacities(free, budget, dialect)
    total = fixed + sum(units)
    fill = caps if dialect == "snapshot" else spread_capacities(
        caps, [newest_budget(f, b) for f, b in zip(free, budget, strict=True)], total)
    ranges = fill_first(runtime, fill, units, fixed, caps)
    warnings = []
    streamed = sum(r.streamed for r in ranges)
    if streamed and dialect == "snapshot":
        warnings.append(PlanWarning("split_over_capacity", f"{module}: {streamed / GIB:.2f} GiB "
                                    f"more than {' & '.join(runtime)} hold (free memory less 2 "
                                    "GiB, capped by --max-vram); the snapshot sd-cli stops "
                                    "with 'segment ... needs ... MB'"))
    elif streamed:
        warnings.append(PlanWarning("split_streams", f"{module}: {streamed / GIB:.2f} GiB of "
                                    f"weights beyond what {' & '.join(runtime)} keep (budget "
                                    "less 2 GiB headroom each) are streamed per segment"))
    return ranges, warnings


def stream_layers_warnings(stream_layers: bool, diffusion: ModulePlan,
                           budgets: Mapping[str, int], devices: Mapping[str, Device]
                           ) -> list[PlanWarning]:
    """Spec section 9: ``--stream-layers`` works only for an unsplit diffusion whose params
    live on the CPU and whose device has a budget; otherwise warning
    ``split_disables_stream_layers`` (split) or ``stream_layers_inactive``."""
    if not stream_layers:
        return []
    if len(diffusion.devices) > 1:
        return [PlanWarning("split_disables_stream_layers", "--stream-layers has no effect: "
                            "diffusion is split across devices")]
    params = diffusion.params
    on_cpu = params.mode == "device" and params.device is not None and \
        devices[params.device].type == "cpu"
    if not on_cpu or budgets[diffusion.devices[0]] <= 0:
        return [PlanWarning("stream_layers_inactive", "--stream-layers needs the diffusion "
                            "weights on the CPU (--offload-to-cpu) and a --max-vram budget on "
                            f"{diffusion.devices[0]}; it has no effect")]
    return []


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


def canonical_placement(pl: Placement, idx: DeviceIndex, default_list: list[str],
                        per: Mapping[str, Decimal]) -> Placement:
    """Spec section 3 (sdplan writes exact names): the placement with exact device names,
    an explicit default and one budget entry per device named (inventory order); entries
    equal to their default are dropped."""

    def par(v: ParamsValue) -> ParamsValue:
        if v.kind != "device" or v.ref is None:
            return ParamsValue(v.kind)
        return ParamsValue("device", Ref(idx.resolve(v.ref, "--params-backend", None)))

    budgets = tuple(BudgetEntry(Ref(d.name), per[d.name]) for d in idx.inventory
                    if d.name in per)
    default = RuntimeValue.of(*default_list)
    p_default = par(pl.params_default) if pl.params_default else None
    runtime = {m: RuntimeValue.of(*device_names(pl.runtime[m], idx, None))
               for m in PLACED_MODULES if m in pl.runtime}
    params = {m: par(pl.params[m]) for m in PLACED_MODULES if m in pl.params}
    cfg = RuntimeValue.of(*device_names(pl.cfg, idx, None)) if pl.cfg is not None else None
    return Placement(default=default,
                     split_default=pl.split_default, split_modes=dict(pl.split_modes),
                     auto_fit=pl.auto_fit, auto_fit_word=pl.auto_fit_word,
                     split_ratio=pl.split_ratio, cfg=cfg, disable_prefetch=pl.disable_prefetch,
                     disable_segmented_compute=pl.disable_segmented_compute,
                     runtime={m: v for m, v in runtime.items() if v != default},
                     params_default=p_default,
                     params={m: v for m, v in params.items() if v != p_default and not (
                         v.kind == "runtime" and p_default is None)},
                     budget_default=pl.budget_default,
                     budgets=tuple(b for b in budgets if b.gib != pl.budget_default),
                     stream_layers=pl.stream_layers, rpc_servers=pl.rpc_servers)
