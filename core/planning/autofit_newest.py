"""The newest sd-cli's ``--auto-fit on`` (spec section 14.1): it keeps the written
``--backend`` and chooses where each component's weights live, predicted exactly so a plan
for that sd-cli shows what it will do.

The rules (stable-diffusion.cpp's newest ``docs/backend.md``, "Automatic placement"):

- Auto-fit is on unless ``--auto-fit off`` is given or any explicit ``--params-backend``
  entry is (so does ``--offload-to-cpu``, which prepends ``*=cpu``).
- Every explicit ``--backend`` entry is kept, device lists included; a module without a
  runtime entry gets the GPU with the largest budget (the first on a tie).
- Budgets as for section 13 (:func:`~sdplan.core.planning.autofit.autofit_budget`).
- Components ``diffusion``, ``te``, ``vae`` in that order (sizes as section 13 counts them);
  each one's weights go to the first place with room:

  1. its own compute GPU(s): the weights already resident there, its weights (a component
     split over several GPUs counts its full size on each), the largest compute room needed
     there (its own reserve, 2 GiB for diffusion and te and 1 GiB for vae; the reserve of
     every other component computing there; the full weights plus reserve of a
     higher-priority component computing there whose weights were offloaded) and staging
     room for the largest tensor of each later component computing there must fit the
     budget;
  2. CPU RAM, keeping the larger of 2 GiB or 10% of the available RAM free (skipped when the
     RAM is unknown, free 0);
  3. another GPU: the one with the largest remaining budget (budget minus resident weights
     minus the compute room of what computes there) that holds the whole component;
  4. disk.

  A component computing on the CPU uses RAM (its runtime device) or disk. When offloaded
  diffusion already needs the whole budget of its main GPU, te and vae are offloaded too:
  the room kept there for diffusion's staged weights and reserve (step 1) leaves them none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from sdplan.core.planning.autofit import COMPONENTS, RESERVES, AutoFitDevice, autofit_budget
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB

__all__ = ["NewestAutoFit", "newest_auto_fit", "ram_keep", "TIERS", "newest_undersized",
           "largest_budget"]

#: Where a component's weights went, by tier number (module docstring).
TIERS = {1: "compute GPU", 2: "RAM", 3: "another GPU", 4: "disk"}


def ram_keep(available: int) -> int:
    """RAM auto-fit leaves free: the larger of 2 GiB or 10% of ``available`` bytes."""
    return max(2 * GIB, available // 10)


@dataclass(frozen=True)
class NewestAutoFit:
    """What the newest sd-cli's auto-fit chooses.

    Attributes:
        devices: the GPUs it considered, with their budgets (bytes).
        components: component -> bytes as auto-fit counts them.
        runtime: every module it placed -> its compute devices (exact names).
        residency: component -> ``(mode, device)``: ``runtime`` (resident where it runs),
            ``device`` (RAM on the CPU, or another GPU) or ``disk``; device None unless
            ``device``.
        tiers: component -> the tier of :data:`TIERS` its weights went to.
        backend, params_backend: the strings that pin the choice (exact names).
    """

    devices: tuple[AutoFitDevice, ...]
    components: dict[str, int]
    runtime: dict[str, list[str]] = field(default_factory=dict)
    residency: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    tiers: dict[str, int] = field(default_factory=dict)
    backend: str = ""
    params_backend: str = ""

    def to_json(self) -> dict[str, object]:
        return {"dialect": "newest", "backend": self.backend,
                "params_backend": self.params_backend, "components": dict(self.components),
                "reserves": {c: RESERVES[c] for c in self.components},
                "runtime": {m: list(d) for m, d in self.runtime.items()},
                "residency": {c: {"mode": m, "device": d} for c, (m, d) in self.residency.items()},
                "tiers": {c: TIERS[t] for c, t in self.tiers.items()},
                "devices": [d.to_json() for d in self.devices]}


def largest_budget(devices: Sequence[AutoFitDevice]) -> str | None:
    """The name of the GPU with the largest budget (the first on a tie), or None."""
    best: AutoFitDevice | None = None
    for d in devices:
        if best is None or d.budget > best.budget:
            best = d
    return best.name if best is not None else None


def newest_auto_fit(components: Mapping[str, int], inventory: Inventory,
                    runtime: Mapping[str, Sequence[str] | None], *,
                    max_vram: Mapping[str, Decimal] | None = None,
                    max_vram_default: Decimal | None = None,
                    largest: Mapping[str, int] | None = None) -> NewestAutoFit:
    """The newest sd-cli's auto-fit choice (module docstring).

    Args:
        components: ``diffusion``/``te``/``vae`` -> bytes as auto-fit counts them.
        inventory: the devices in enumeration order (free bytes; the CPU's free bytes are
            the available RAM).
        runtime: module -> its explicit ``--backend`` devices (exact names), or None for a
            module without a runtime entry (it gets the largest-budget GPU).
        max_vram, max_vram_default: ``--max-vram`` GiB per exact device name and default.
        largest: component -> bytes of its largest tensor (staging room; 0 when unknown).

    Returns:
        A :class:`NewestAutoFit`; without a GPU-type device the runtime entries are kept,
        modules without one are not placed, and components keep their weights where they
        run when the RAM holds them.
    """
    per = max_vram or {}
    big = largest or {}
    devices = tuple(AutoFitDevice(d.name, d.free, autofit_budget(d.free, per.get(d.name,
                                                                                  max_vram_default)))
                    for d in inventory if d.type == "gpu")
    budget = {d.name: d.budget for d in devices}
    first_gpu = largest_budget(devices)
    placed_runtime: dict[str, list[str]] = {}
    for m, devs in runtime.items():
        if devs:
            placed_runtime[m] = list(devs)
        elif first_gpu is not None:
            placed_runtime[m] = [first_gpu]
    sizes = {c: int(components.get(c, 0)) for c in COMPONENTS}
    cpu = next((d for d in inventory if d.type == "cpu"), None)
    ram_free = cpu.free if cpu is not None else 0
    ram_room = ram_free - ram_keep(ram_free) if ram_free > 0 else 0
    used = dict.fromkeys(budget, 0)  # resident weights per GPU
    work = dict.fromkeys(budget, 0)  # compute room of what runs there (reserves, staged copies)
    for c in COMPONENTS:  # every present component's reserve is room on its compute GPUs
        for d in placed_runtime.get(c, []) if sizes[c] else []:
            if d in work:
                work[d] = max(work[d], RESERVES[c])
    residency: dict[str, tuple[str, str | None]] = {}
    tiers: dict[str, int] = {}
    order = [c for c in COMPONENTS if sizes[c] and c in placed_runtime]
    for pos, c in enumerate(order):
        size, devs = sizes[c], placed_runtime[c]
        gpus = [d for d in devs if d in budget]
        tier = 0
        if gpus and len(gpus) == len(devs):
            fits = True
            for d in gpus:
                staging = sum(big.get(later, 0) for later in order[pos + 1:]
                              if d in placed_runtime[later])
                if used[d] + size + max(work[d], RESERVES[c]) + staging > budget[d]:
                    fits = False
            if fits:
                tier = 1
                for d in gpus:
                    used[d] += size
        if not tier and size <= ram_room:
            tier, ram_room = 2, ram_room - size
        if not tier and gpus:
            others = [d for d in devices if d.name not in devs]
            best = None
            for d in others:
                room = budget[d.name] - used[d.name] - work[d.name]
                if size <= room and (best is None or room > best[1]):
                    best = (d.name, room)
            if best is not None:
                tier = 3
                used[best[0]] += size
                residency[c] = ("device", best[0])
        if not tier:
            tier = 4
        tiers[c] = tier
        if tier == 1 or (tier == 2 and not gpus):
            residency[c] = ("runtime", None)
        elif tier == 2:
            residency[c] = ("device", cpu.name if cpu is not None else "CPU")
        elif tier == 4:
            residency[c] = ("disk", None)
        if tier > 1 and gpus:  # offloaded: its weights are staged where it runs
            for d in gpus:
                work[d] = max(work[d], size + RESERVES[c])
    backend = ",".join(f"{m}={'&'.join(d)}" for m, d in placed_runtime.items())
    params = []
    for c, (mode, dev) in residency.items():
        if mode == "disk":
            params.append(f"{c}=disk")
        elif mode == "device" and dev is not None:
            params.append(f"{c}={dev}")
        elif len(placed_runtime[c]) == 1:
            params.append(f"{c}={placed_runtime[c][0]}")
    return NewestAutoFit(devices, sizes, placed_runtime, residency, tiers, backend,
                         ",".join(params) if any(m != "runtime" for m, _ in residency.values())
                         else "")


def newest_undersized(fitted: NewestAutoFit, loaded: Mapping[str, int]) -> list[str]:
    """Where the choice does not hold once the components are sized as sd-cli allocates them
    (``loaded``, component -> bytes; spec 14.1: auto-fit counts file dtypes): every GPU
    holding resident components must still fit their loaded sizes plus the largest reserve
    there. One reason per failing GPU; empty when the choice holds."""
    budget = {d.name: d.budget for d in fitted.devices}
    need: dict[str, int] = {}
    reserve: dict[str, int] = {}
    grew: dict[str, list[str]] = {}
    for c, (mode, dev) in fitted.residency.items():
        size = int(loaded.get(c, fitted.components.get(c, 0)))
        where = list(fitted.runtime.get(c, [])) if mode == "runtime" else \
            [dev] if mode == "device" and dev is not None else []
        for d in where:
            if d not in budget:
                continue
            need[d] = need.get(d, 0) + size
            reserve[d] = max(reserve.get(d, 0), RESERVES[c])
            if size != fitted.components.get(c, 0):
                grew.setdefault(d, []).append(f"{c} {size / GIB:.2f} GiB as loaded (auto-fit "
                                              f"counts {fitted.components[c] / GIB:.2f})")
    reasons = []
    for d, n in need.items():
        if n + reserve[d] > budget[d]:
            reasons.append(f"{d}: {(n + reserve[d]) / GIB:.2f} GiB with compute reserves over "
                           f"its {budget[d] / GIB:.2f} GiB budget"
                           f" ({', '.join(grew.get(d, [])) or 'sizes as counted'})")
    return reasons
