"""Parsing helpers of :class:`~sdplan.core.planning.placement.Placement`: ``--max-vram``
entries, ``--split-mode`` (spec section 12), "later entry wins" (spec section 2) and the
``--backend cfg=DEVICE`` key (spec section 14.5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

from sdplan.core.errors import PlanError
from sdplan.core.planning.assignment import (
    Entry,
    ParamsValue,
    Ref,
    RuntimeValue,
    Span,
    parse_gib,
    parse_params_value,
    parse_runtime_value,
    split_entries,
)
from sdplan.core.planning.modules import SPLITTABLE

__all__ = ["BudgetEntry", "SPLIT_MODES", "parse_split_mode", "parse_max_vram", "last_wins",
           "CFG_KEY", "runtime_or_cfg", "params_not_cfg"]


@dataclass(frozen=True)
class BudgetEntry:
    """One ``--max-vram`` device entry: ``key`` names a device, ``gib`` in GiB (< 0 = spare)."""

    key: Ref
    gib: Decimal
    span: Span | None = field(default=None, compare=False)


#: The extra ``--backend`` key of parallel CFG.
CFG_KEY = frozenset({"cfg"})


def runtime_or_cfg(entry: Entry, text: str) -> RuntimeValue:
    """A ``--backend`` entry's value; the ``cfg`` key takes exactly one device.

    Raises:
        PlanError: as :func:`parse_runtime_value`; ``invalid_cfg_device`` for a device list
            or a default key's ``cfg`` value.
    """
    value = parse_runtime_value(entry, "--backend", text)
    if entry.module == "cfg" and value.is_list:
        raise PlanError("invalid_cfg_device", "--backend: cfg takes one device (the GPU that "
                        f"runs the unconditional pass), not the list '{entry.value}'",
                        flag="--backend", text=text, span=entry.value_span)
    return value


def params_not_cfg(entry: Entry, text: str) -> ParamsValue:
    """A ``--params-backend`` entry's value; ``cfg`` is not a params key (spec 14.5).

    Raises:
        PlanError: ``invalid_assignment`` for a ``cfg`` key; as :func:`parse_params_value`.
    """
    if entry.module == "cfg":
        raise PlanError("invalid_assignment", "--params-backend: cfg is a --backend key only "
                        "(the CFG copy follows diffusion's residency)", flag="--params-backend",
                        text=text, span=entry.key.span if entry.key is not None else entry.span)
    return parse_params_value(entry, "--params-backend", text)


def last_wins(entries: list[Entry], parse, flag: str,  # type: ignore[no-untyped-def]
               shadowed: list[tuple[str, object]]):
    """Apply "later entry wins" (spec section 2, steps 5-6); overridden values are kept in
    ``shadowed`` so resolution still checks their device names."""
    default = None
    per: dict[str, object] = {}
    for e in entries:
        value = parse(e)
        old = per.get(e.module) if e.module is not None else default
        if old is not None:
            shadowed.append((flag, old))
        if e.module is None:
            default = value
        else:
            per[e.module] = value
    return default, per


#: ``--split-mode`` values (spec section 12).
SPLIT_MODES = ("layer", "row")


def parse_split_mode(text: str) -> tuple[str | None, dict[str, str]]:
    """A joined ``--split-mode`` value (spec section 12): the default mode and the
    per-module modes (lower-case ``layer``/``row``; later entries win).

    Raises:
        PlanError: ``invalid_split_mode`` for an empty key or value, an unknown mode (a
            device list included) or a module that cannot be split; ``unknown_module``.
    """
    flag = "--split-mode"
    default: str | None = None
    modes: dict[str, str] = {}
    for e in split_entries(text, flag, error_code="invalid_split_mode"):
        value = e.value.strip().lower()
        if value not in SPLIT_MODES:
            raise PlanError("invalid_split_mode", f"{flag}: unknown mode '{e.value}' (use "
                            "layer or row)", flag=flag, text=text, span=e.value_span)
        if e.module is None:
            default = value
        elif e.module not in SPLITTABLE:
            raise PlanError("invalid_split_mode", f"{flag}: {e.module} cannot be split; "
                            f"--split-mode applies to {', '.join(SPLITTABLE)}", flag=flag,
                            text=text, span=e.key.span if e.key is not None else e.span)
        else:
            modes[e.module] = value
    return default, modes


def parse_max_vram(text: str) -> tuple[Decimal | None, tuple[BudgetEntry, ...]]:
    flag = "--max-vram"
    default = None
    budgets = []
    for e in split_entries(text, flag, error_code="invalid_max_vram", modules=False):
        gib = parse_gib(e.value, flag, text, e.value_span)
        if e.key is None or e.key.text.lower() in ("all", "default", "*"):
            default = gib
        else:
            budgets.append(BudgetEntry(e.key, gib, e.span))
    return default, tuple(budgets)
