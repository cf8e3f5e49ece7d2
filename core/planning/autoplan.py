"""Auto plan: propose a placement that fits the devices (the app shows it as a diff).

Rule: when the user's plan does not fit, the smallest change of it that fits comes first
(:func:`smallest_change`: one module, then two, moved to another GPU, split onto one, its
weights kept in RAM or on disk; under the user's budgets). Otherwise the
largest modules go to the device with the most free memory; when no single device holds a
splittable module it is split over the GPUs with the most free memory; while the estimate
still does not fit, the largest resident module on the most over-committed device keeps its
weights in RAM (``--params-backend m=CPU``), or on disk when RAM is short too; a
single-device module whose staging alone overflows gets a ``--max-vram`` budget so it runs
in segments. The small change is proposed instead of a fresh packing that fits only when it
changes fewer modules. Every step is checked with
:func:`sdplan.core.planning.estimate.estimate_plan`.

Time: given the run (:class:`~sdplan.core.planning.timing.RunSettings`), Auto plan prices the
plans it chooses between that fit (the fresh packing, the smallest change, the plan as it
is when that fits, and a packing that puts each module on the fastest device it fits,
:data:`SPEED_WORK`) with :func:`~sdplan.core.planning.timing.predict_time` (the
parameter-count formula and the inventory devices' profiles) and proposes the fastest per
picture when every GPU and every device they run on has a measured profile; otherwise the
choice above stands and its notes say it was made by memory alone.
"""

from __future__ import annotations

import dataclasses
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
from sdplan.core.planning.timing import RunSettings, TimeReport, predict_fitted, seconds_text

#: Free memory kept back on every device when packing (bytes): driver and fragmentation.
HEADROOM = GIB // 2
#: FLOP of the product a device's speed is read at to rank devices for the packing by speed
#: (a large one: a diffusion model's matrix products at their measured peak).
SPEED_WORK = 1e12


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
              measured: Mapping[str, int] | None = None, run: RunSettings | None = None) -> AutoPlan:
    """Propose a placement for ``profile`` on ``inventory`` starting from ``base`` (its
    budgets and RPC servers are kept; module entries are rewritten).

    ``width``/``height`` (pixels) and ``batch`` size the compute estimate of ``engine``
    (``measured``: compute bytes per module from a dry run, as for
    :func:`~sdplan.core.planning.estimate.estimate_plan`)
    (:func:`sdplan.core.planning.estimate.module_compute`, sdplan's engine). Each device keeps :data:`HEADROOM` bytes
    free when packing. The result's ``fits`` is the verdict of
    :func:`sdplan.core.planning.estimate.estimate_plan` on the proposed plan. With ``run``
    (its steps, sampler and guidance; the size and batch are ``width``, ``height`` and
    ``batch``) the fastest plan that fits is chosen where device speeds are measured
    (module docstring, :func:`fastest`).

    Raises:
        PlanError: ``base`` does not resolve on ``inventory``.
    """
    greedy = _packed(inventory, profile, base, width, height, batch, engine, measured)
    base_plan = resolve(base, inventory, profile)
    est: dict[str, Any] = {"width": width, "height": height, "batch": batch, "engine": engine,
                           "measured": measured}
    if estimate_plan(base_plan, profile, inventory, **est).fits:
        chosen, others = greedy, [AutoPlan(base_plan.placement, base_plan, True,
                                           ["the current plan as it is"])]
    else:
        small = smallest_change(inventory, profile, base, **est)
        if small is None:
            chosen, others = greedy, []
        elif not greedy.fits or len(small.notes) < _changed(base_plan, greedy.plan, profile):
            chosen, others = small, [greedy]
        else:
            chosen, others = greedy, [small]
    if run is None or not chosen.fits:
        return chosen
    speeds = {d.name: d.profile.rate("mm", "formula", "f16", SPEED_WORK) for d in inventory
              if d.profile is not None}
    unmeasured = [d.name for d in inventory if d.is_gpu_like and d.name not in speeds]
    if unmeasured:
        return _by_memory(chosen, unmeasured)
    others.append(_packed(inventory, profile, base, width, height, batch, engine, measured, speeds))
    run = dataclasses.replace(run, width=width, height=height, batch=batch)
    return fastest(chosen, [o for o in others if o.fits], inventory, profile, run, est)


def _by_memory(chosen: AutoPlan, unmeasured: list[str]) -> AutoPlan:
    """``chosen`` with a note that it was chosen by memory alone, naming the devices without
    a measured profile."""
    return dataclasses.replace(chosen, notes=[
        *chosen.notes, f"chosen by memory alone: {', '.join(unmeasured)} "
        f"{'has' if len(unmeasured) == 1 else 'have'} no measured speed (sdplan devices --calibrate)"])


def fastest(chosen: AutoPlan, others: list[AutoPlan], inventory: Inventory, profile: Profile,
            run: RunSettings, est: Mapping[str, Any]) -> AutoPlan:
    """Of ``chosen`` and ``others`` (plans that fit), the fastest predicted per picture at
    ``run`` (:func:`~sdplan.core.planning.timing.predict_fitted` with each plan's estimate
    ``est``), its notes saying so; ``chosen`` (the choice by memory) on a tie, when there is
    nothing to choose from, or when a device they run on has no measured profile (its notes
    then say the choice was made by memory alone)."""
    cands: list[AutoPlan] = []
    seen: set[tuple] = set()
    for c in (chosen, *others):  # one of each plan (spelt alike or not)
        key = (tuple(sorted(describe_plan(c.plan, list(profile.modules)).items())), c.plan.max_vram)
        if key not in seen:
            seen.add(key)
            cands.append(c)
    if len(cands) < 2:
        return chosen
    reports: list[tuple[TimeReport, AutoPlan]] = [
        (predict_fitted(c.plan, inventory, profile, run, estimate_plan(c.plan, profile, inventory, **est)), c)
        for c in cands]
    unmeasured = sorted({d for r, _ in reports for d, src in r.profiles.items() if src == "default"})
    if unmeasured:
        return _by_memory(chosen, unmeasured)
    best_rep, best = min(reports, key=lambda t: t[0].image_s)
    rest = ", ".join(f"~{seconds_text(r.image_s)} s" for r, c in reports if c is not best)
    return dataclasses.replace(best, notes=[
        *best.notes, f"the fastest of {len(reports)} plans that fit: ~{seconds_text(best_rep.image_s)} "
        f"s/picture predicted (the other{'s' if len(reports) > 2 else ''}: {rest})"])


def _changed(old: Plan, new: Plan, profile: Profile) -> int:
    """How many of the profile's modules run or keep their weights elsewhere in ``new``."""
    a, b = describe_plan(old, list(profile.modules)), describe_plan(new, list(profile.modules))
    return sum(a[m] != b[m] for m in profile.modules)


#: Kinds of change :func:`smallest_change` tries, cheapest first (the rank breaks ties).
CHANGE_RANK = {"move": 0, "split": 1, "ram": 2, "disk": 3, "cpu": 4}


def _edits(base: Placement, plan: Plan, inventory: Inventory,
           profile: Profile) -> list[tuple[int, str, str, Placement]]:
    """Every single change of one module of ``plan``: ``(rank, module, note, placement)``."""
    cpu = next((d.name for d in inventory if d.type == "cpu"), None)
    gpus = [d.name for d in inventory if d.is_gpu_like]
    out: list[tuple[int, str, str, Placement]] = []
    for m in profile.modules:
        mp = plan.modules[m]
        for g in gpus:
            if mp.devices != [g]:
                out.append((CHANGE_RANK["move"], m, f"{m} on {g}", base.assign(m, g)))
            if m in SPLITTABLE and g not in mp.devices and profile.modules[m].blocks:
                out.append((CHANGE_RANK["split"], m, f"{m} split onto {g}",
                            base.add_split_device(m, g)))
        if cpu and mp.params.mode != "device" and cpu not in mp.devices:
            out.append((CHANGE_RANK["ram"], m, f"{m} weights kept in RAM ({cpu}) and staged "
                        "to the device", base.set_residency(m, "device", cpu)))
        if mp.params.mode != "disk":
            out.append((CHANGE_RANK["disk"], m, f"{m} weights read from disk when it runs",
                        base.set_residency(m, "disk")))
        if cpu and not gpus and mp.devices != [cpu]:
            out.append((CHANGE_RANK["cpu"], m, f"{m} on {cpu}", base.assign(m, cpu)))
    return out


def smallest_change(inventory: Inventory, profile: Profile, base: Placement, *,
                    width: int = 1024, height: int = 1024, batch: int = 1,
                    engine: str = "sdplan", measured: Mapping[str, int] | None = None,
                    most: int = 2) -> AutoPlan | None:
    """The smallest change of ``base`` (its budgets and RPC servers kept) that fits: one
    module changed before two (up to ``most``), then the cheapest kind (:data:`CHANGE_RANK`:
    another GPU, a split, weights in RAM, on disk, the CPU), then the most memory left on
    the fullest device; a module is moved to the CPU only where there is no GPU. Each candidate is checked with
    :func:`~sdplan.core.planning.estimate.estimate_plan` at ``width`` x ``height`` pixels and
    ``batch``. None when no such change fits; the proposal's notes name each change.

    Raises:
        PlanError: ``base`` does not resolve on ``inventory``.
    """
    import itertools

    from sdplan.core.errors import PlanError

    plan = resolve(base, inventory, profile)
    singles = _edits(base, plan, inventory, profile)
    est = {"width": width, "height": height, "batch": batch, "engine": engine,
           "measured": measured}
    best: tuple[tuple[int, int, int, int], AutoPlan] | None = None
    for n in range(1, most + 1):
        for combo in itertools.combinations(singles, n):
            if len({m for _, m, _, _ in combo}) < n:
                continue  # two changes of one module
            ranks = [r for r, _, _, _ in combo]
            on_cpu = int(CHANGE_RANK["cpu"] in ranks)
            if best is not None and (on_cpu, n) > best[0][:2]:
                continue
            try:
                pl = base
                for _, m, _, one in combo:
                    pl = _apply_edit(pl, one, m)
                cand = resolve(pl, inventory, profile)
            except PlanError:
                continue
            fit = estimate_plan(cand, profile, inventory, **est)
            if not fit.fits:
                continue
            room = min(((min(t.free, t.budget) if t.budget else t.free) - t.total
                        for t in fit.devices.values()), default=0)
            key = (on_cpu, n, sum(ranks), -room)
            if best is None or key < best[0]:
                best = (key, AutoPlan(cand.placement, cand, True, [t for _, _, t, _ in combo]))
    return best[1] if best is not None else None


def _apply_edit(placement: Placement, edited: Placement, module: str) -> Placement:
    """``placement`` with ``module``'s runtime and residency entries taken from ``edited``
    (a single change of the same base), so two changes of different modules combine."""
    runtime = {k: v for k, v in placement.runtime.items() if k != module}
    params = {k: v for k, v in placement.params.items() if k != module}
    if module in edited.runtime:
        runtime[module] = edited.runtime[module]
    if module in edited.params:
        params[module] = edited.params[module]
    return dataclasses.replace(placement, runtime=runtime, params=params)


def _packed(inventory: Inventory, profile: Profile, base: Placement, width: int, height: int,
            batch: int, engine: str, measured: Mapping[str, int] | None,
            speeds: Mapping[str, float] | None = None) -> AutoPlan:
    """The fresh packing of the module docstring, from ``base``'s budgets and RPC servers;
    with ``speeds`` (device -> FLOP/s) a module goes to the fastest device it fits on rather
    than the one with the most free memory."""
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
        holds = [n for n in left if left[n] >= need]
        if speeds and holds:
            best = max(holds, key=lambda n: speeds.get(n, 0.0))
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
