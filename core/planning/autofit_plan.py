"""sd-cli's auto-fit inside a plan: which auto-fit a placement asks for, and the placement
it gives (spec sections 13 and 14.1).

- The snapshot's bare ``--auto-fit`` switch (section 13) ignores ``--backend`` and
  ``--params-backend`` and derives both (:mod:`sdplan.core.planning.autofit`).
- The newest sd-cli's auto-fit (section 14.1) is on unless ``--auto-fit off`` or an explicit
  ``--params-backend`` entry (``--offload-to-cpu`` too) turns it off; it keeps ``--backend``
  and chooses the residency (:mod:`sdplan.core.planning.autofit_newest`).

Which one applies depends on the plan's :class:`~sdplan.core.planning.target.Target`
(:func:`auto_fit_semantics`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from decimal import Decimal

from sdplan.core.planning.assignment import ParamsValue, Ref, RuntimeValue
from sdplan.core.planning.autofit import AutoFit, auto_fit, component_bytes, undersized
from sdplan.core.planning.autofit_newest import (
    NewestAutoFit,
    largest_budget,
    newest_auto_fit,
    newest_undersized,
)
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import PLACED_MODULES
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan_types import PlanWarning
from sdplan.core.planning.profile import Profile
from sdplan.core.planning.target import Target

__all__ = ["auto_fit_semantics", "fit_placement", "snapshot_auto_fit_placement",
           "newest_auto_fit_placement"]


def _has_params(pl: Placement) -> bool:
    return pl.params_default is not None or bool(pl.params)


def auto_fit_semantics(pl: Placement, target: Target) -> str | None:
    """Which auto-fit the placement gets: ``snapshot`` (section 13), ``newest`` (section
    14.1) or None.

    For an sd-cli target the target's dialect decides: the snapshot runs section 13 when
    ``--auto-fit`` is on; the newest runs 14.1 unless it is off (``--auto-fit off``, an
    explicit ``--params-backend`` entry, ``--offload-to-cpu``). For sdplan's engine, which
    runs no auto-fit of its own, the spelling decides: the bare switch shows section 13's
    choice, ``--auto-fit on`` the newest's (when no params entry turns it off).
    """
    if target.sdcli and target.dialect == "snapshot":
        return "snapshot" if pl.auto_fit else None
    if target.sdcli:
        return None if pl.auto_fit_word == "off" or _has_params(pl) else "newest"
    if pl.auto_fit_mode == "switch":
        return "snapshot"
    if pl.auto_fit_mode == "on" and not _has_params(pl):
        return "newest"
    return None


def fit_placement(pl: Placement, inventory: Inventory, per_device: Mapping[str, Decimal],
                  profile: Profile | None, target: Target,
                  names: Callable[[RuntimeValue], list[str]]
                  ) -> tuple[Placement, AutoFit | NewestAutoFit | None, list[PlanWarning]]:
    """The placement the plan resolves (auto-fit's when one applies), the auto-fit choice
    (None when none applies) and its warnings; ``names`` gives the exact devices of a
    ``--backend`` value. Warning ``auto_fit_off`` when ``--auto-fit on`` is written with
    explicit ``--params-backend`` entries (the newest sd-cli turns it off)."""
    semantics = auto_fit_semantics(pl, target)
    if semantics == "snapshot":
        return snapshot_auto_fit_placement(pl, inventory, per_device, profile)
    if semantics == "newest":
        return newest_auto_fit_placement(pl, inventory, per_device, profile, names, target)
    if pl.auto_fit_word == "on" and _has_params(pl):
        return pl, None, [PlanWarning("auto_fit_off", "--params-backend entries turn the newest "
                                      "sd-cli's auto-fit off (whatever the order), so --auto-fit "
                                      "on has no effect")]
    return pl, None, []


def snapshot_auto_fit_placement(pl: Placement, inventory: Inventory,
                                per_device: Mapping[str, Decimal], profile: Profile | None
                                ) -> tuple[Placement, AutoFit | None, list[PlanWarning]]:
    """Spec section 13: with ``--auto-fit``, the placement whose runtime and params entries
    are the ones sd-cli derives (:func:`~sdplan.core.planning.autofit.auto_fit` for the
    profile's component sizes and the ``--max-vram`` entries per device), and the
    :class:`~sdplan.core.planning.autofit.AutoFit` itself.

    Warnings: ``auto_fit_overrides`` when ``--backend``/``--params-backend`` (or the
    compatibility flags) were given too (sd-cli ignores them), ``auto_fit_no_gpu`` without
    a GPU-type device, ``auto_fit_needs_model`` without a profile (no sizes: the default
    placement), ``auto_fit_will_not_fit`` where the choice does not hold for the sizes
    sd-cli loads (:func:`~sdplan.core.planning.autofit.undersized`).
    """
    warnings: list[PlanWarning] = []
    if pl.default is not None or pl.runtime or pl.params_default is not None or pl.params:
        warnings.append(PlanWarning("auto_fit_overrides", "--auto-fit ignores --backend and "
                                    "--params-backend (sd-cli chooses them itself)"))
    cleared = dataclasses.replace(pl, default=None, runtime={}, params_default=None, params={},
                                  shadowed=(), texts={**pl.texts, "--backend": "",
                                                      "--params-backend": ""})
    if profile is None:
        warnings.append(PlanWarning("auto_fit_needs_model", "--auto-fit sizes the model; "
                                    "without model files or a profile the default placement "
                                    "is shown"))
        return cleared, None, warnings
    fitted = auto_fit(component_bytes(profile), inventory, per_device, pl.budget_default)
    if not fitted.devices:
        warnings.append(PlanWarning("auto_fit_no_gpu", "--auto-fit found no GPU; sd-cli "
                                    "uses the default placement"))
    if profile.autofit_loaded:
        for reason in undersized(fitted, profile.autofit_loaded):
            warnings.append(PlanWarning("auto_fit_will_not_fit", "sd-cli's --auto-fit choice "
                                        f"will not fit: {reason}"))
    derived = Placement.from_strings(fitted.backend, fitted.params_backend)
    return dataclasses.replace(cleared, runtime=derived.runtime, params=derived.params,
                               texts={**cleared.texts, "--backend": fitted.backend,
                                      "--params-backend": fitted.params_backend}
                               ), fitted, warnings


def newest_auto_fit_placement(pl: Placement, inventory: Inventory,
                              per_device: Mapping[str, Decimal], profile: Profile | None,
                              names: Callable[[RuntimeValue], list[str]], target: Target
                              ) -> tuple[Placement, NewestAutoFit, list[PlanWarning]]:
    """Spec section 14.1: the placement with the newest auto-fit's choice: every written
    ``--backend`` entry kept, modules without one on the largest-budget GPU, each component's
    residency from :func:`~sdplan.core.planning.autofit_newest.newest_auto_fit`.

    Warnings: ``auto_fit_needs_model`` without a profile (no sizes: weights stay where they
    run), ``auto_fit_will_not_fit`` where the choice does not hold for the sizes sd-cli
    allocates (:func:`~sdplan.core.planning.autofit_newest.newest_undersized`).
    """
    runtime: dict[str, list[str] | None] = {}
    for m in PLACED_MODULES:
        value = pl.runtime.get(m, pl.default)
        runtime[m] = names(value) if value is not None else None
    warnings: list[PlanWarning] = []
    sizes = component_bytes(profile) if profile is not None else {}
    if profile is None:
        where = "the sd-cli target" if target.sdcli else "--auto-fit on"
        warnings.append(PlanWarning("auto_fit_needs_model", f"{where}: the newest sd-cli's "
                                    "auto-fit (on unless --auto-fit off or --params-backend) "
                                    "chooses residency from the model's size; without model "
                                    "files or a profile the weights are shown where they run"))
    fitted = newest_auto_fit(sizes, inventory, runtime, max_vram=per_device,
                             max_vram_default=pl.budget_default)
    if profile is not None and profile.autofit_loaded:
        for reason in newest_undersized(fitted, profile.autofit_loaded):
            warnings.append(PlanWarning("auto_fit_will_not_fit", "the newest sd-cli's auto-fit "
                                        f"choice will not fit: {reason}"))
    first = largest_budget(fitted.devices)
    default = pl.default if pl.default is not None or first is None else RuntimeValue.of(first)
    params = {}
    for c, (mode, dev) in fitted.residency.items():
        if mode == "disk":
            params[c] = ParamsValue("disk")
        elif mode == "device" and dev is not None:
            params[c] = ParamsValue("device", Ref(dev))
    return dataclasses.replace(pl, default=default, params=params), fitted, warnings
