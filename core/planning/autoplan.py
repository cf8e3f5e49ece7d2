"""Auto plan: propose a placement that fits the devices (the app shows it as a diff).

Rule (issue 8): the largest modules go to the device with the most free memory; when no
single device holds a splittable module it is split over the GPUs with the most free
memory; while the estimate still does not fit, the largest resident module on the most
over-committed device keeps its weights in RAM (``--params-backend m=CPU``), or on disk
when RAM is short too; a single-device module whose staging alone overflows gets a
``--max-vram`` budget so it runs in segments. Every step is checked with
:func:`sdplan.core.planning.estimate.estimate_plan`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sdplan.core.planning.estimate import estimate_plan, module_compute
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB, SPLITTABLE
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.plan_types import Plan
from sdplan.core.planning.profile import Profile

#: Free memory kept back on every device when packing (bytes): driver and fragmentation.
HEADROOM = GIB // 2


@dataclass(frozen=True)
class AutoPlan:
    """A proposal: the placement, its resolved plan, whether the estimate fits, and one
    human-readable line per decision (``notes``)."""

    placement: Placement
    plan: Plan
    fits: bool
    notes: list[str]


def _capacity(inv: Inventory, budgets: dict[str, int]) -> dict[str, int]:
    out = {}
    for d in inv:
        cap = d.free - HEADROOM
        if budgets.get(d.name, 0) > 0:
            cap = min(cap, budgets[d.name])
        out[d.name] = max(cap, 0)
    return out


def auto_plan(inventory: Inventory, profile: Profile, base: Placement, *, width: int = 1024,
              height: int = 1024, batch: int = 1, engine: str = "sdplan",
              measured: Mapping[str, int] | None = None) -> AutoPlan:
    """Propose a placement for ``profile`` on ``inventory`` starting from ``base`` (its
    budgets and RPC servers are kept; module entries are rewritten).

    ``width``/``height`` (pixels) and ``batch`` size the compute estimate of ``engine``
    (``measured``: compute bytes per module from a dry run, as for
    :func:`~sdplan.core.planning.estimate.estimate_plan`)
    (:func:`sdplan.core.planning.estimate.module_compute`, sdplan's engine). Each device keeps :data:`HEADROOM` bytes
    free when packing. The result's ``fits`` is the verdict of
    :func:`sdplan.core.planning.estimate.estimate_plan` on the proposed plan.

    Raises:
        PlanError: ``base`` does not resolve on ``inventory``.
    """
    notes: list[str] = []
    base_plan = resolve(base, inventory, profile)
    gpus = [d for d in inventory if d.is_gpu_like]
    cpu = next((d for d in inventory if d.type == "cpu"), None)
    runners = gpus or ([cpu] if cpu else list(inventory))
    cap = _capacity(inventory, base_plan.budgets)
    left = {d.name: cap[d.name] for d in runners}

    placement = Placement(default=None, budget_default=base.budget_default,
                          budgets=base.budgets, stream_layers=base.stream_layers,
                          rpc_servers=base.rpc_servers)
    order = sorted(profile.modules, key=lambda m: -profile.modules[m].total)
    for m in order:
        mp = profile.modules[m]
        need = mp.total + module_compute(m, mp, profile.architecture, width=width,
                                         height=height, batch=batch, engine=engine,
                                         measured=measured)[0]
        best = max(left, key=lambda n: left[n])
        if left[best] >= need or len(left) == 1 or m not in SPLITTABLE:
            placement = placement.assign(m, best)
            left[best] -= mp.total
            notes.append(f"{m} ({mp.total / GIB:.1f} GiB) on {best}")
            continue
        chosen: list[str] = []
        for name in sorted(left, key=lambda n: -left[n]):
            chosen.append(name)
            if sum(left[c] for c in chosen) >= need:
                break
        placement = placement.assign(m, chosen[0])
        for name in chosen[1:]:
            placement = placement.add_split_device(m, name)
        room = sum(max(left[c], 1) for c in chosen)
        for name in chosen:
            left[name] -= mp.total * max(left[name], 1) // room
        notes.append(f"{m} ({mp.total / GIB:.1f} GiB) split over {' & '.join(chosen)}")
    return _settle(placement, inventory, profile, cpu.name if cpu else None, notes,
                   width, height, batch, {"engine": engine, "measured": measured})


def _settle(placement: Placement, inventory: Inventory, profile: Profile, cpu: str | None,
            notes: list[str], width: int, height: int, batch: int,
            est: dict[str, Any]) -> AutoPlan:
    """Move weights off over-committed devices until the estimate fits (or nothing is left
    to move)."""
    moved: set[str] = set()
    for _ in range(24):
        plan = resolve(placement, inventory, profile)
        fit = estimate_plan(plan, profile, inventory, width=width, height=height, batch=batch,
                            **est)
        if fit.fits:
            return AutoPlan(plan.placement, plan, True, notes)
        worst = max(fit.devices.values(), key=lambda t: t.total - (min(t.free, t.budget)
                                                                   if t.budget else t.free))
        limit = min(worst.free, worst.budget) if worst.budget else worst.free
        over = worst.total - limit
        resident = sorted((e.weights.get(worst.device, 0), m) for m, e in fit.modules.items()
                          if e.weights.get(worst.device, 0) > 0 and m not in moved)
        transient_fits = worst.staging + worst.compute <= limit
        if resident and transient_fits:
            # the smallest module whose weights cover the overflow, else the largest
            m = next((m for w, m in resident if w >= over), resident[-1][1])
            moved.add(m)
            cpu_left = fit.devices[cpu].free - fit.devices[cpu].total if cpu and \
                cpu in fit.devices else (inventory_free(inventory, cpu) if cpu else 0)
            if cpu and cpu != worst.device and cpu_left > profile.modules[m].total + GIB:
                placement = placement.set_residency(m, "device", cpu)
                notes.append(f"{m} weights kept in RAM ({cpu}) and staged to the device")
            else:
                placement = placement.set_residency(m, "disk")
                notes.append(f"{m} weights read from disk when it runs")
            continue
        dev = next(d for d in inventory if d.name == worst.device)
        single = [m for m, e in fit.modules.items()
                  if e.devices == (dev.name,) and profile.modules[m].blocks]
        if dev.is_gpu_like and single and not any(b.key.text == dev.name
                                                  for b in placement.budgets):
            gib = max(round((dev.free - HEADROOM) / GIB, 1), 0.5)
            placement = placement.set_budget(dev.name, gib)
            notes.append(f"--max-vram {dev.name}={gib}: {', '.join(single)} run in segments")
            continue
        break
    plan = resolve(placement, inventory, profile)
    fit = estimate_plan(plan, profile, inventory, width=width, height=height, batch=batch)
    capped = [t.device for t in fit.devices.values() if t.budget and t.budget < t.total <= t.free]
    notes.append(f"still does not fit: the --max-vram budget of {', '.join(capped)} is the "
                 "limit, not the device's memory" if capped else
                 "still does not fit: the model needs more memory than these devices have")
    return AutoPlan(plan.placement, plan, False, notes)


def inventory_free(inventory: Inventory, name: str) -> int:
    """Free bytes of the device ``name`` (0 when absent)."""
    return next((d.free for d in inventory if d.name == name), 0)


def describe_plan(plan: Plan, modules: list[str]) -> dict[str, str]:
    """One line per module: its devices and where its weights live (for diffs)."""
    out = {}
    for m in modules:
        mp = plan.modules[m]
        where = " & ".join(mp.devices)
        if mp.params.mode == "disk":
            where += ", weights on disk"
        elif mp.params.mode == "device":
            where += f", weights on {mp.params.device}"
        out[m] = where
    return out


def plan_diff(old: Plan, new: Plan, modules: list[str]) -> list[tuple[str, str, str]]:
    """``(what, before, after)`` for every module (in ``modules`` order) and then every flag
    (``--backend``, ``--params-backend``, ``--max-vram``) whose value differs between
    ``old`` and ``new``; empty flags read ``(empty)``."""
    rows = []
    a, b = describe_plan(old, modules), describe_plan(new, modules)
    for m in modules:
        if a[m] != b[m]:
            rows.append((m, a[m], b[m]))
    for flag, x, y in (("--backend", old.backend, new.backend),
                       ("--params-backend", old.params_backend, new.params_backend),
                       ("--max-vram", old.max_vram, new.max_vram)):
        if x != y:
            rows.append((flag, x or "(empty)", y or "(empty)"))
    return rows
