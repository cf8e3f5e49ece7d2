"""Auto plan, reviewed before it is offered: is the proposal better than the plan the user
has, what limits it, and which alternatives would fit.

:func:`sdplan.core.planning.autoplan.auto_plan` keeps the user's ``--max-vram`` budgets
and can end with a plan that fits worse than the current one. :func:`review_auto_plan`
compares the two estimates (:func:`sdplan.core.planning.estimate.estimate_plan`), names a
budget of the user's that is the limit (not the hardware), and tries alternatives, each
checked by the estimate: the current plan or the proposal with every module's weights in
RAM (sd-cli's ``--offload-to-cpu``: the devices hold only what runs, within their
budgets), Auto plan without those budgets, at half the image size, with one image per
batch, and keeping the current plan when it already fits.

Given the run (:class:`~sdplan.core.planning.timing.RunSettings`), Auto plan prefers the
fastest plan that fits where device speeds are measured
(:func:`~sdplan.core.planning.autoplan.fastest`), and the review carries the predicted time
of the current plan and of the proposal
(:func:`~sdplan.core.planning.timing.predict_fitted`).

The board's Auto plan dialog and the command line's "What would fit" advice
(:func:`review_advice`, ``sdplan plan`` and ``sdplan generate`` on a plan that does not fit)
both come from this one search.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from sdplan.core.planning.autoplan import AutoPlan, auto_plan, plan_diff
from sdplan.core.planning.estimate import FitReport, estimate_plan
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.plan_types import Plan
from sdplan.core.planning.profile import Profile
from sdplan.core.planning.timing import RunSettings, TimeReport, predict_fitted


@dataclass(frozen=True)
class Alternative:
    """A placement (with the image size and batch it was checked at) that fits."""

    label: str
    placement: Placement
    width: int
    height: int
    batch: int


@dataclass(frozen=True)
class AutoPlanReview:
    """The proposal with what the dialog says about it.

    Attributes:
        proposal: Auto plan's proposal.
        fit, current_fit: estimates of the proposal and of the current plan.
        worse: the proposal fits worse than the current plan (it does not fit where the
            current one does, or overflows more bytes); the dialog keeps the current plan.
        limits: one line per ``--max-vram`` budget of the user's that the proposal runs
            into while the device has more free memory.
        alternatives: placements that fit (only when the proposal does not, or is worse).
        time, current_time: the predicted time of the proposal and of the current plan
            (None without the run's settings).
    """

    proposal: AutoPlan
    fit: FitReport
    current_fit: FitReport
    worse: bool
    limits: list[str] = field(default_factory=list)
    alternatives: list[Alternative] = field(default_factory=list)
    time: TimeReport | None = None
    current_time: TimeReport | None = None


def overflow(fit: FitReport) -> int:
    """Bytes over free memory or budget, summed over the devices."""
    total = 0
    for t in fit.devices.values():
        limit = min(t.free, t.budget) if t.budget else t.free
        total += max(t.total - limit, 0)
    return total


def budget_limits(fit: FitReport, placement: Placement) -> list[str]:
    """The user's budgets that the plan runs into: a device over its ``--max-vram`` budget
    while its total is within its free memory."""
    out = []
    for t in fit.devices.values():
        if t.budget and t.budget < t.total <= t.free:
            given = "the default --max-vram" if not any(
                b.key.text == t.device for b in placement.budgets) else f"--max-vram {t.device}"
            out.append(f"your budget is the limit, not the hardware: {t.device} needs "
                       f"{t.total / GIB:.2f} GiB, {given} allows {t.budget / GIB:.2f} GiB and "
                       f"the device has {t.free / GIB:.2f} GiB free")
    return out


def offloaded(placement: Placement, profile: Profile, inventory: Inventory) -> Placement | None:
    """``placement`` with every module's weights in RAM on the CPU (sd-cli's
    ``--offload-to-cpu``), or None without a CPU device."""
    cpu = next((d.name for d in inventory if d.type == "cpu"), None)
    if cpu is None:
        return None
    for m in profile.modules:
        placement = placement.set_residency(m, "device", cpu)
    return placement


def review_auto_plan(inventory: Inventory, profile: Profile, current: Placement, *,
                     width: int, height: int, batch: int = 1, engine: str = "sdplan",
                     measured: Mapping[str, int] | None = None,
                     run: RunSettings | None = None) -> AutoPlanReview:
    """Auto plan from ``current`` with the review described in the module docstring
    (``engine``, ``measured``: as :func:`~sdplan.core.planning.estimate.estimate_plan`;
    ``run``: the steps, sampler and guidance the plans are timed at, at ``width`` x
    ``height`` and ``batch``; None: chosen by memory, no times).

    Raises:
        PlanError: ``current`` does not resolve on ``inventory``.
    """
    def estimate(pl: Placement, w: int = width, h: int = height, b: int = batch) -> FitReport:
        return estimate_plan(resolve(pl, inventory, profile), profile, inventory,
                             width=w, height=h, batch=b, engine=engine,
                             measured=measured if (w, h, b) == (width, height, batch) else None)

    def auto(pl: Placement, w: int = width, h: int = height, b: int = batch) -> AutoPlan:
        return auto_plan(inventory, profile, pl, width=w, height=h, batch=b, engine=engine,
                         measured=measured if (w, h, b) == (width, height, batch) else None,
                         run=run)

    proposal = auto(current)
    fit = estimate(proposal.placement)
    now = estimate(current)
    worse = (now.fits and not fit.fits) or (not now.fits and not fit.fits
                                             and overflow(fit) > overflow(now))
    limits = budget_limits(fit, current)
    alts: list[Alternative] = []
    if not fit.fits or worse:
        if now.fits:
            alts.append(Alternative("keep the current plan (it fits)", current, width,
                                    height, batch))
        for base, label in ((current, "the current plan"), (proposal.placement, "Auto plan")):
            off = offloaded(base, profile, inventory)
            if off is not None and not now.fits and estimate(off).fits:
                alts.append(Alternative(f"{label} with every module's weights in RAM "
                                        "(--offload-to-cpu)", off, width, height, batch))
                break
        if current.budgets or current.budget_default is not None:
            free = dataclasses.replace(current, budgets=(), budget_default=None)
            alt = auto(free)
            if estimate(alt.placement).fits:
                alts.append(Alternative("Auto plan without your --max-vram budgets",
                                        alt.placement, width, height, batch))
        smaller = [(max(width // 2 // 64 * 64, 64), max(height // 2 // 64 * 64, 64), batch)]
        if batch > 1:
            smaller.insert(0, (width, height, 1))
        for w, h, b in smaller:
            alt = auto(current, w, h, b)
            if estimate(alt.placement, w, h, b).fits:
                what = f"at {w}x{h}" if (w, h) != (width, height) else "one image per batch"
                alts.append(Alternative(f"Auto plan {what}", alt.placement, w, h, b))
                break
    times: list[TimeReport | None] = [None, None]
    if run is not None:
        run = dataclasses.replace(run, width=width, height=height, batch=batch)
        times = [predict_fitted(plan, inventory, profile, run, f)
                 for plan, f in ((proposal.plan, fit), (resolve(current, inventory, profile), now))]
    return AutoPlanReview(proposal, fit, now, worse, limits, alts, times[0], times[1])


def review_advice(plan: Plan, profile: Profile, inventory: Inventory, *, width: int,
                  height: int, batch: int = 1, engine: str = "sdplan",
                  measured: Mapping[str, int] | None = None) -> list[str]:
    """For a plan that does not fit: what would, from :func:`review_auto_plan` (the board's
    search) started at the plan's own placement. Lines: the proposal's changes (each module
    that moves, ``diffusion: CUDA0 -> CUDA0, weights on CPU``, then ``use:`` and the
    flags) when it fits; else the first alternative that fits, named first (``the current
    plan with every module's weights in RAM (--offload-to-cpu):``, or at another size);
    else one line saying that no placement on these devices fits at this size.

    Raises:
        PlanError: the plan's placement does not resolve on ``inventory``.
    """
    review = review_auto_plan(inventory, profile, plan.placement, width=width, height=height,
                              batch=batch, engine=engine, measured=measured)
    if review.fit.fits and not review.worse:
        return _changes(plan, review.proposal.plan, profile)
    for alt in review.alternatives:
        if alt.placement == plan.placement:
            continue
        head = alt.label if (alt.width, alt.height, alt.batch) == (width, height, batch) else \
            f"{alt.label} (-W {alt.width} -H {alt.height} -b {alt.batch})"
        return [f"{head}:", *_changes(plan, resolve(alt.placement, inventory, profile), profile)]
    return [f"no placement on these devices fits {width}x{height} (batch {batch}); "
            "a smaller size or a quantized model would need less"]


def _changes(old: Plan, new: Plan, profile: Profile) -> list[str]:
    rows = plan_diff(old, new, list(profile.modules))
    lines = [f"{what}: {a} -> {b}" for what, a, b in rows if not what.startswith("--")]
    flags = " ".join(f"{f} \"{v}\"" for f, v in (("--backend", new.backend),
                                                ("--params-backend", new.params_backend),
                                                ("--max-vram", new.max_vram)) if v)
    return [*lines, f"use: {flags}"]
