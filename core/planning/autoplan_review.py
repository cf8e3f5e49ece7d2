"""Auto plan, reviewed before it is offered: is the proposal better than the plan the user
has, what limits it, and which alternatives would fit.

:func:`sdplan.core.planning.autoplan.auto_plan` keeps the user's ``--max-vram`` budgets
and can end with a plan that fits worse than the current one. :func:`review_auto_plan`
compares the two estimates (:func:`sdplan.core.planning.estimate.estimate_plan`), names a
budget of the user's that is the limit (not the hardware), and tries alternatives, each
checked by the estimate: Auto plan without those budgets, at half the image size, with
one image per batch, and keeping the current plan when it already fits.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sdplan.core.planning.autoplan import AutoPlan, auto_plan
from sdplan.core.planning.estimate import FitReport, estimate_plan
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import Profile


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
    """

    proposal: AutoPlan
    fit: FitReport
    current_fit: FitReport
    worse: bool
    limits: list[str] = field(default_factory=list)
    alternatives: list[Alternative] = field(default_factory=list)


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


def review_auto_plan(inventory: Inventory, profile: Profile, current: Placement, *,
                     width: int, height: int, batch: int = 1) -> AutoPlanReview:
    """Auto plan from ``current`` with the review described in the module docstring.

    Raises:
        PlanError: ``current`` does not resolve on ``inventory``.
    """
    def estimate(pl: Placement, w: int = width, h: int = height, b: int = batch) -> FitReport:
        return estimate_plan(resolve(pl, inventory, profile), profile, inventory,
                             width=w, height=h, batch=b)

    proposal = auto_plan(inventory, profile, current, width=width, height=height, batch=batch)
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
        if current.budgets or current.budget_default is not None:
            free = dataclasses.replace(current, budgets=(), budget_default=None)
            alt = auto_plan(inventory, profile, free, width=width, height=height, batch=batch)
            if estimate(alt.placement).fits:
                alts.append(Alternative("Auto plan without your --max-vram budgets",
                                        alt.placement, width, height, batch))
        smaller = [(max(width // 2 // 64 * 64, 64), max(height // 2 // 64 * 64, 64), batch)]
        if batch > 1:
            smaller.insert(0, (width, height, 1))
        for w, h, b in smaller:
            alt = auto_plan(inventory, profile, current, width=w, height=h, batch=b)
            if estimate(alt.placement, w, h, b).fits:
                what = f"at {w}x{h}" if (w, h) != (width, height) else "one image per batch"
                alts.append(Alternative(f"Auto plan {what}", alt.placement, w, h, b))
                break
    return AutoPlanReview(proposal, fit, now, worse, limits, alts)
