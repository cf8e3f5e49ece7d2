"""The data a resolved placement is made of: :class:`Plan` and its parts.

:func:`sdplan.core.planning.plan.resolve` builds a :class:`Plan`: a :class:`ModulePlan` per
module (runtime devices, :class:`Params` residency, layer-split :class:`Range` list), a
budget per device, :class:`PlanWarning` entries, the canonical strings and the canonical
placement. All are frozen values with a ``to_json`` for ``sdplan plan --json``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sdplan.core.planning.modules import PLACED_MODULES
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.target import Target


@dataclass(frozen=True)
class Range:
    """Blocks ``first_block``..``last_block`` (inclusive) of a split module on ``device``;
    ``bytes`` is the sum of those blocks' weight bytes."""

    device: str
    first_block: int
    last_block: int
    bytes: int

    def to_json(self) -> dict[str, object]:
        return {"device": self.device, "first_block": self.first_block,
                "last_block": self.last_block, "bytes": self.bytes}


@dataclass(frozen=True)
class Params:
    """Residency of a module's weights: ``mode`` ``runtime`` (device None), ``device``
    (``device`` names where they live) or ``disk`` (device None)."""

    mode: str
    device: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"mode": self.mode, "device": self.device}


@dataclass(frozen=True)
class ModulePlan:
    """What one module gets.

    Attributes:
        devices: runtime devices, main device first (several only for a layer split).
        params: where its weights live between uses.
        ranges: block ranges per device (layer split with a profile), else empty.
        main_other_bytes: non-block weight bytes on the main device when ``ranges`` or
            ``row_shares`` is set.
        split_mode: ``layer`` or ``row``: how a module on several devices distributes its
            weights (spec section 12), the mode in effect after any fallback.
        row_shares: in row mode with a profile: device -> bytes of the block weights'
            rows it holds (spec section 12), else empty.
    """

    devices: list[str]
    params: Params
    ranges: list[Range] = field(default_factory=list)
    main_other_bytes: int = 0
    split_mode: str = "layer"
    row_shares: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"devices": list(self.devices), "params": self.params.to_json(),
                                "ranges": [r.to_json() for r in self.ranges]}
        if self.ranges or self.row_shares:
            d["main_other_bytes"] = self.main_other_bytes
        if len(self.devices) > 1:
            d["split_mode"] = self.split_mode
        if self.row_shares:
            d["row_shares"] = dict(self.row_shares)
        return d


@dataclass(frozen=True)
class PlanWarning:
    """A warning with the spec's stable ``code`` (spec section 11)."""

    code: str
    message: str

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True)
class Plan:
    """A resolved placement.

    Attributes:
        modules: every module of :data:`PLACED_MODULES` -> its :class:`ModulePlan`.
        budgets: every inventory device -> budget in bytes (0 = none/disabled).
        warnings: in the order found.
        backend, params_backend, max_vram, split_mode: canonical flag values.
        placement: the canonical placement (exact device names) to edit.
        stream_layers, rpc_servers: as given.
        auto_fit: the placement sd-cli's auto-fit derived (an
            :class:`~sdplan.core.planning.autofit.AutoFit` for the snapshot's switch, a
            :class:`~sdplan.core.planning.autofit_newest.NewestAutoFit` for the newest
            sd-cli) when one applies, else None.
        target: what the plan is for (:class:`~sdplan.core.planning.target.Target`).
    """

    modules: dict[str, ModulePlan]
    budgets: dict[str, int]
    warnings: list[PlanWarning]
    backend: str
    params_backend: str
    max_vram: str
    placement: Placement
    stream_layers: bool = False
    rpc_servers: tuple[str, ...] = ()
    split_mode: str = ""
    auto_fit: object | None = None
    target: Target = field(default_factory=Target)

    def warning_codes(self) -> list[str]:
        """The warnings' codes, in order."""
        return [w.code for w in self.warnings]

    def to_json(self) -> dict[str, object]:
        """The ``sdplan plan --json`` object (issue 3's contract), ``ok`` true."""
        out: dict[str, object] = {
            "ok": True, "backend": self.backend, "params_backend": self.params_backend,
            "max_vram": self.max_vram, "split_mode": self.split_mode,
            "modules": {m: self.modules[m].to_json() for m in PLACED_MODULES},
            "budgets": dict(self.budgets),
            "warnings": [w.to_json() for w in self.warnings],
            "stream_layers": self.stream_layers, "rpc_servers": list(self.rpc_servers),
            "target": self.target.to_json(),
        }
        if self.auto_fit is not None:
            out["auto_fit"] = self.auto_fit.to_json()  # type: ignore[attr-defined]
        return out
