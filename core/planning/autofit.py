"""sd-cli's ``--auto-fit``: the placement stable-diffusion.cpp derives by itself (spec
section 13), predicted exactly so sdplan can show it and pin it as explicit strings.

The algorithm is stable-diffusion.cpp's ``src/core/backend_fit.cpp`` (commit 97d2990):

- Components ``diffusion``, ``te`` and ``vae``, each sized as sd-cli sizes it: the bytes of
  its tensors in their file types plus 64 bytes per tensor (the model-file reader computes
  that, :func:`sdplan.core.modelfiles.autofit_sizes.autofit_component_bytes`, into
  :attr:`Profile.autofit <sdplan.core.planning.profile.Profile.autofit>`; a profile without
  it is sized by its module totals). Compute reserves: 2048 MiB, 2048 MiB, 1024 MiB;
  ``diffusion`` and ``te`` can be split.
- Devices: the GPU-type devices (RPC devices included; integrated GPUs and the CPU not) in
  enumeration order, each with a budget: ``min(--max-vram, free)`` for a positive value,
  ``free + value`` for a negative one, ``free - 512 MiB`` for none or 0; at least 0.
- Resident attempt: by decreasing size, each component goes to the device with the most
  room left (budget minus sizes already placed) among those where sizes placed + its size +
  the larger of that device's largest reserve so far and its own reserve fit the budget;
  ties go to the first device. When every component finds a device, that is the plan.
- Otherwise time-share: by decreasing size, each component independently goes to the
  device with the largest budget where size + reserve fit (first on ties); else, when it
  can be split and there are several devices and its size fits the sum of
  ``max(budget - reserve, 0)``, over all devices ordered by decreasing budget (ties keep
  enumeration order); else the CPU. Every component on GPUs gets ``disk`` params.
- Written: ``diffusion=...,te=...,vae=...`` (devices joined with ``&``, ``cpu`` for the
  CPU), params ``module=disk`` in time-share; components of size 0 are left out. No GPU:
  no strings (the default placement).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from sdplan.core.planning.assignment import gib_to_bytes
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.profile import Profile

__all__ = ["MIB", "COMPONENTS", "RESERVES", "AutoFitDevice", "AutoFit", "component_bytes",
           "autofit_budget", "auto_fit", "undersized"]

MIB = 1 << 20
#: Auto-fit's components in the order sd-cli writes them.
COMPONENTS = ("diffusion", "te", "vae")
#: Compute reserve per component in bytes (``backend_fit.cpp``).
RESERVES = {"diffusion": 2048 * MIB, "te": 2048 * MIB, "vae": 1024 * MIB}
_SPLITTABLE = frozenset({"diffusion", "te"})
#: Headroom auto-fit leaves on a device without a budget.
MARGIN = 512 * MIB


@dataclass(frozen=True)
class AutoFitDevice:
    """A GPU auto-fit may use: its name, free bytes and the budget in bytes it plans with."""

    name: str
    free: int
    budget: int

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "free": self.free, "budget": self.budget}


@dataclass(frozen=True)
class AutoFit:
    """What ``--auto-fit`` chooses.

    Attributes:
        devices: the GPUs it considered, with their budgets.
        components: component -> bytes as auto-fit counts them.
        placement: component -> its devices (several for a split), ``["cpu"]`` for the CPU;
            components of size 0 are absent.
        time_share: True when the resident attempt failed (weights load per phase).
        backend, params_backend: the strings sd-cli derives (``""`` without a GPU).
    """

    devices: tuple[AutoFitDevice, ...]
    components: dict[str, int]
    placement: dict[str, list[str]] = field(default_factory=dict)
    time_share: bool = False
    backend: str = ""
    params_backend: str = ""

    def to_json(self) -> dict[str, object]:
        return {"backend": self.backend, "params_backend": self.params_backend,
                "time_share": self.time_share, "components": dict(self.components),
                "reserves": {c: RESERVES[c] for c in self.components},
                "placement": {c: list(d) for c, d in self.placement.items()},
                "devices": [d.to_json() for d in self.devices]}


def component_bytes(profile: Profile) -> dict[str, int]:
    """Component sizes for auto-fit: :attr:`Profile.autofit` when the files were read
    (sd-cli's own counting), else each module's total bytes (0 when absent)."""
    if profile.autofit:
        return {c: int(profile.autofit.get(c, 0)) for c in COMPONENTS}
    return {c: (profile.get(c).total if profile.get(c) is not None else 0)  # type: ignore[union-attr]
            for c in COMPONENTS}


def autofit_budget(free: int, gib: Decimal | None) -> int:
    """A device's auto-fit budget in bytes from its free bytes and its ``--max-vram`` value
    in GiB (None or 0: free minus 512 MiB; negative: free minus that much; positive: at
    most free); never below 0."""
    if gib is None or gib == 0:
        budget = free - MARGIN
    elif gib > 0:
        budget = min(gib_to_bytes(gib), free)
    else:
        budget = free + gib_to_bytes(gib)
    return max(budget, 0)


def auto_fit(components: Mapping[str, int], inventory: Inventory,
             max_vram: Mapping[str, Decimal] | None = None,
             max_vram_default: Decimal | None = None) -> AutoFit:
    """The placement ``sd-cli --auto-fit`` derives (module docstring).

    Args:
        components: ``diffusion``/``te``/``vae`` -> bytes (:func:`component_bytes`).
        inventory: the devices in enumeration order (free bytes used).
        max_vram: exact device name -> ``--max-vram`` GiB for that device.
        max_vram_default: the ``--max-vram`` default in GiB, or None.

    Returns:
        An :class:`AutoFit`; without GPU-type devices its strings are empty.
    """
    per = max_vram or {}
    devices = tuple(AutoFitDevice(d.name, d.free, autofit_budget(d.free, per.get(d.name,
                                                                                  max_vram_default)))
                    for d in inventory if d.type == "gpu")
    sizes = {c: int(components.get(c, 0)) for c in COMPONENTS}
    if not devices:
        return AutoFit(devices, sizes)
    order = sorted(COMPONENTS, key=lambda c: -sizes[c])  # stable: ties keep COMPONENTS order
    resident = _resident(order, sizes, devices)
    time_share = resident is None
    placement = resident if resident is not None else _time_share(order, sizes, devices)
    runtime, params = [], []
    for c in COMPONENTS:
        where = placement.get(c)
        if not where:
            continue
        runtime.append(f"{c}={'&'.join(where)}")
        if time_share and where != ["cpu"]:
            params.append(f"{c}=disk")
    return AutoFit(devices, sizes, placement, time_share, ",".join(runtime), ",".join(params))


def _resident(order: list[str], sizes: Mapping[str, int],
              devices: tuple[AutoFitDevice, ...]) -> dict[str, list[str]] | None:
    placed = [0] * len(devices)
    reserve = [0] * len(devices)
    out: dict[str, list[str]] = {}
    for c in order:
        if sizes[c] == 0:
            continue
        best = -1
        for i, d in enumerate(devices):
            need = placed[i] + sizes[c] + max(reserve[i], RESERVES[c])
            if need <= d.budget and (best < 0 or d.budget - placed[i] >
                                     devices[best].budget - placed[best]):
                best = i
        if best < 0:
            return None
        placed[best] += sizes[c]
        reserve[best] = max(reserve[best], RESERVES[c])
        out[c] = [devices[best].name]
    return out


def _time_share(order: list[str], sizes: Mapping[str, int],
                devices: tuple[AutoFitDevice, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for c in order:
        if sizes[c] == 0:
            continue
        best = -1
        for i, d in enumerate(devices):
            if sizes[c] + RESERVES[c] <= d.budget and (best < 0 or
                                                       d.budget > devices[best].budget):
                best = i
        if best >= 0:
            out[c] = [devices[best].name]
            continue
        if c in _SPLITTABLE and len(devices) > 1:
            capacity = sum(max(d.budget - RESERVES[c], 0) for d in devices)
            if sizes[c] <= capacity:
                out[c] = [d.name for d in sorted(devices, key=lambda d: -d.budget)]
                continue
        out[c] = ["cpu"]
    return out


def undersized(fitted: AutoFit, loaded: Mapping[str, int]) -> list[str]:
    """Where auto-fit's choice does not hold once the components are sized as sd-cli loads
    them (``loaded``: component -> bytes, :attr:`Profile.autofit_loaded`): the same checks
    auto-fit made for its choice, repeated with those sizes. One reason per failing device
    or component; empty when the choice still fits (or nothing was placed).
    """
    sizes = {c: int(loaded.get(c, fitted.components.get(c, 0))) for c in COMPONENTS}
    budget = {d.name: d.budget for d in fitted.devices}
    reasons: list[str] = []

    def grew(cs: list[str]) -> str:
        return ", ".join(f"{c} {sizes[c] / GIB:.2f} GiB as loaded (auto-fit counts "
                         f"{fitted.components[c] / GIB:.2f})" for c in cs
                         if sizes[c] != fitted.components[c]) or "sizes as counted"

    if not fitted.time_share:
        for d in fitted.devices:
            here = [c for c, where in fitted.placement.items() if where == [d.name]]
            if not here:
                continue
            need = sum(sizes[c] for c in here) + max(RESERVES[c] for c in here)
            if need > d.budget:
                reasons.append(f"{d.name}: {need / GIB:.2f} GiB with compute reserves over its "
                               f"{d.budget / GIB:.2f} GiB budget ({grew(here)})")
        return reasons
    for c, where in fitted.placement.items():
        if where == ["cpu"]:
            continue
        if len(where) == 1:
            need = sizes[c] + RESERVES[c]
            if need > budget[where[0]]:
                reasons.append(f"{where[0]}: {c} needs {need / GIB:.2f} GiB with its compute "
                               f"reserve, over the {budget[where[0]] / GIB:.2f} GiB budget "
                               f"({grew([c])})")
        else:
            capacity = sum(max(budget[n] - RESERVES[c], 0) for n in where)
            if sizes[c] > capacity:
                reasons.append(f"{c} split over {' & '.join(where)}: {sizes[c] / GIB:.2f} GiB "
                               f"over the {capacity / GIB:.2f} GiB they hold ({grew([c])})")
    return reasons
