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
from sdplan.core.planning.split_ratio import SplitRatio
from sdplan.core.planning.target import Target


@dataclass(frozen=True)
class Range:
    """Blocks ``first_block``..``last_block`` (inclusive) of a split module on ``device``;
    ``bytes`` is the sum of those blocks' weight bytes; ``streamed`` the part of them the
    newest sd-cli streams per segment rather than keeping resident (spec section 14.3).
    For a UNet planned for sd-cli the units are its stages (:attr:`ModulePlan.range_unit`)."""

    device: str
    first_block: int
    last_block: int
    bytes: int
    streamed: int = 0

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"device": self.device, "first_block": self.first_block,
                                "last_block": self.last_block, "bytes": self.bytes}
        if self.streamed:
            d["streamed"] = self.streamed
        return d


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
        range_unit: what ``ranges`` count: ``block`` (transformer blocks), or ``stage``
            (a UNet's input blocks, middle block, output blocks: the graph-cut segments
            sd-cli spreads over the devices, spec section 14.3).
    """

    devices: list[str]
    params: Params
    ranges: list[Range] = field(default_factory=list)
    main_other_bytes: int = 0
    split_mode: str = "layer"
    row_shares: dict[str, int] = field(default_factory=dict)
    range_unit: str = "block"

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"devices": list(self.devices), "params": self.params.to_json(),
                                "ranges": [r.to_json() for r in self.ranges]}
        if self.ranges or self.row_shares:
            d["main_other_bytes"] = self.main_other_bytes
        if len(self.devices) > 1:
            d["split_mode"] = self.split_mode
        if self.row_shares:
            d["row_shares"] = dict(self.row_shares)
        if self.ranges and self.range_unit != "block":
            d["range_unit"] = self.range_unit
        return d


@dataclass(frozen=True)
class DiffusionPhase:
    """One phase of a two-stage diffusion module (:mod:`sdplan.core.planning.phases`).

    Attributes:
        name: ``high_noise`` (first) or ``low_noise``.
        flag: the model flag of its file.
        ranges: its blocks per device when the module is split (the same devices as the
            ``diffusion`` module, each expert split by its own block bytes), else empty.
        bytes: all its weight bytes.
        main_other_bytes: its non-block bytes (on the main device).
    """

    name: str
    flag: str
    ranges: list[Range] = field(default_factory=list)
    bytes: int = 0
    main_other_bytes: int = 0

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "flag": self.flag, "bytes": self.bytes,
                "main_other_bytes": self.main_other_bytes,
                "ranges": [r.to_json() for r in self.ranges]}


@dataclass(frozen=True)
class CfgPlan:
    """Parallel CFG (spec section 14.5): ``device`` holds a second copy of the diffusion
    weights (following diffusion's residency) and runs the unconditional pass beside the
    conditional one; ``active`` False when sd-cli keeps the sequential path, ``reasons``
    saying why."""

    device: str
    active: bool = True
    reasons: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {"device": self.device, "active": self.active, "reasons": list(self.reasons)}


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
        split_ratio: ``--split-ratio`` as parsed (spec section 14.4), or None.
        cfg: the parallel-CFG device and whether sd-cli uses it (spec section 14.5), or None.
        phases: a two-stage diffusion model's phases in running order (high noise, then low
            noise: :mod:`sdplan.core.planning.phases`), each on ``modules["diffusion"]``'s
            devices and residency; empty for a one-stage model.
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
    split_ratio: SplitRatio | None = None
    cfg: CfgPlan | None = None
    phases: tuple[DiffusionPhase, ...] = ()

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
            "split_ratio": self.split_ratio.to_json() if self.split_ratio is not None else None,
            "cfg": self.cfg.to_json() if self.cfg is not None else None,
        }
        if self.phases:
            out["phases"] = [p.to_json() for p in self.phases]
        if self.auto_fit is not None:
            out["auto_fit"] = self.auto_fit.to_json()  # type: ignore[attr-defined]
        return out
