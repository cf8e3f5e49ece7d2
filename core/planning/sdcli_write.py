"""Placement flags as a given sd-cli dialect spells them, and commands that run as planned
on the newest sd-cli (spec section 14.2).

:func:`placement_argv` writes a placement's flags for ``snapshot``, ``newest`` or, with no
dialect, exactly as held (a pasted command written back). :func:`newest_placement` is the
placement to write so that the newest sd-cli, whose auto-fit is on unless turned off,
runs a plan as it was planned: a plan's placement writes an explicit ``--params-backend``
entry for every module whose weights do not follow its runtime device (any explicit entry
turns auto-fit off); when none does and its auto-fit would choose otherwise,
``--auto-fit off`` is written.
"""

from __future__ import annotations

import dataclasses

from sdplan.core.planning.autofit_newest import NewestAutoFit
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.plan_types import Plan
from sdplan.core.planning.profile import Profile
from sdplan.core.planning.target import Target

__all__ = ["placement_argv", "unwritable", "newest_placement", "same_residency",
           "written_placement"]


def placement_argv(placement: Placement, dialect: str | None = None) -> list[str]:
    """The placement flags, in fixed order: ``--backend``, ``--params-backend``,
    ``--split-mode``, ``--split-ratio``, ``--max-vram``, ``--rpc-servers``,
    ``--stream-layers``, ``--auto-fit``, ``--disable-prefetch``,
    ``--disable-segmented-compute``.

    ``dialect`` None writes what the placement holds as it holds it (``--auto-fit`` bare,
    ``on`` or ``off``); ``snapshot`` writes only what the snapshot has (the bare switch for
    on, nothing for off, no ``cfg=``, ``--split-ratio`` or ``--disable-*``); ``newest``
    writes ``--auto-fit on|off`` and never ``--stream-layers``.
    """
    if dialect == "snapshot" and placement.cfg is not None:
        placement = dataclasses.replace(placement, cfg=None)
    strings = placement.to_strings()
    argv: list[str] = []
    for flag, text in (("--backend", strings["backend"]),
                       ("--params-backend", strings["params_backend"]),
                       ("--split-mode", placement.split_mode_text()),
                       ("--split-ratio", placement.split_ratio.text()
                        if placement.split_ratio is not None and dialect != "snapshot" else ""),
                       ("--max-vram", strings["max_vram"])):
        if text:
            argv += [flag, text]
    if placement.rpc_servers:
        argv += ["--rpc-servers", ",".join(placement.rpc_servers)]
    if placement.stream_layers and dialect != "newest":
        argv.append("--stream-layers")
    mode = placement.auto_fit_mode
    if mode is not None:
        if dialect == "snapshot":
            argv += ["--auto-fit"] if mode != "off" else []
        elif dialect == "newest":
            argv += ["--auto-fit", "off" if mode == "off" else "on"]
        else:
            argv += ["--auto-fit"] if mode == "switch" else ["--auto-fit", mode]
    if dialect != "snapshot":
        argv += ["--disable-prefetch"] if placement.disable_prefetch else []
        argv += ["--disable-segmented-compute"] if placement.disable_segmented_compute else []
    return argv


def unwritable(placement: Placement, dialect: str) -> list[str]:
    """What ``dialect`` cannot say of ``placement`` (left out by :func:`placement_argv`), one
    phrase each: the snapshot has no ``cfg=``, ``--split-ratio`` or ``--disable-*``; the
    newest has no ``--stream-layers`` (it streams by itself)."""
    out: list[str] = []
    if dialect == "snapshot":
        if placement.cfg is not None:
            out.append("--backend cfg= (parallel CFG)")
        if placement.split_ratio is not None:
            out.append("--split-ratio")
        out += [f for f, on in (("--disable-prefetch", placement.disable_prefetch),
                                ("--disable-segmented-compute",
                                 placement.disable_segmented_compute)) if on]
    elif placement.stream_layers:
        out.append("--stream-layers (the newest sd-cli streams offloaded weights by itself)")
    return out


def same_residency(a: Plan, b: Plan) -> bool:
    """Whether two plans run every module on the same devices with the same residency."""
    return all(a.modules[m].devices == b.modules[m].devices and
               a.modules[m].params == b.modules[m].params for m in a.modules)


def newest_placement(plan: Plan, inventory: Inventory, profile: Profile | None
                     ) -> tuple[Placement, list[str]]:
    """The placement to write for the newest sd-cli so that it runs ``plan`` (spec section
    14.2), and notes on what was added or left out.

    A plan already made for the newest sd-cli keeps its placement. Otherwise (a plan for
    sdplan's engine or the snapshot) the written strings are pinned (the snapshot switch's
    derived strings, exact device names), ``--stream-layers`` is left out, and the newest
    sd-cli's reading of them (:func:`~sdplan.core.planning.plan.resolve` for that target) is
    compared with the plan: the placement carries an explicit ``--params-backend`` entry for
    every module whose weights do not follow runtime (which turns auto-fit off), so residency
    can differ only where all follow runtime; then ``--auto-fit off`` is written.

    Raises:
        PlanError: as :func:`~sdplan.core.planning.plan.resolve` (not for a resolved plan's
            own placement).
    """
    newest = Target("sd-cli", "newest", True, "the written command")
    if plan.target.sdcli and plan.target.dialect == "newest":
        return plan.placement, []
    notes = unwritable(plan.placement, "newest")
    base = dataclasses.replace(plan.placement, stream_layers=False)
    if plan.auto_fit is not None:  # pin the choice shown, not the switch
        pinned = Placement.from_strings(plan.backend, plan.params_backend)
        base = dataclasses.replace(base, default=pinned.default, runtime=pinned.runtime,
                                   params_default=pinned.params_default, params=pinned.params,
                                   auto_fit=False, auto_fit_word="")
    if same_residency(resolve(base, inventory, profile, newest), plan):
        return base, notes
    notes.append("--auto-fit off (the newest sd-cli's auto-fit would move weights; here they "
                 "follow their runtime devices)")
    return dataclasses.replace(base, auto_fit=False, auto_fit_word="off"), notes



def written_placement(plan: Plan, dialect: str, inventory: Inventory, profile: Profile | None
                      ) -> tuple[Placement, list[str]]:
    """The placement to write for sd-cli in ``dialect`` so it runs ``plan``, and notes on what
    was added or left out: :func:`newest_placement` for the newest; for the snapshot, the
    plan's placement, with the newest auto-fit's choice pinned as explicit strings (the
    snapshot has no such auto-fit) and what the snapshot cannot say left out
    (:func:`unwritable`).

    Raises:
        PlanError: as :func:`newest_placement`.
    """
    if dialect == "newest":
        return newest_placement(plan, inventory, profile)
    notes = unwritable(plan.placement, "snapshot")
    if isinstance(plan.auto_fit, NewestAutoFit):
        pinned = Placement.from_strings(plan.backend, plan.params_backend)
        return dataclasses.replace(plan.placement, default=pinned.default,
                                   runtime=pinned.runtime, params_default=pinned.params_default,
                                   params=pinned.params, auto_fit=False,
                                   auto_fit_word=""), notes
    return plan.placement, notes
