"""``--split-ratio auto|vram|r0,r1,...``: how the newest sd-cli places a layer split's
blocks (spec section 14.4), parsed with character spans like the other placement flags.

- ``auto`` (sd-cli's default): sd-cli measures each device once at start-up and places each
  block where its estimated cost is lowest; sdplan cannot measure that ahead, so a plan for
  sd-cli shows the ``vram`` ranges and says so.
- ``vram``: fill each listed device in order (spec section 14.3).
- ``r0,r1,...``: fixed fractions of the parameter-bearing blocks per listed device, in
  ``--backend`` order; their count must match the device list; they are normalised.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal

from sdplan.core.errors import PlanError
from sdplan.core.planning.assignment import Span, format_gib, short_text

__all__ = ["SplitRatio", "parse_split_ratio", "SPLIT_RATIO_KINDS"]

#: The kinds of ``--split-ratio`` value.
SPLIT_RATIO_KINDS = ("auto", "vram", "ratios")
_FLAG = "--split-ratio"
_NUMBER = re.compile(r"\+?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
#: Ratios above this are refused (they would only be normalised away; keeps Decimal cheap).
_MAX_RATIO = Decimal(10) ** 9


@dataclass(frozen=True)
class SplitRatio:
    """A parsed ``--split-ratio``.

    Attributes:
        kind: ``auto``, ``vram`` or ``ratios``.
        ratios: for ``ratios``, one non-negative number per listed device (not normalised).
        spans: each ratio's half-open span in the flag's value (excluded from equality).
    """

    kind: str
    ratios: tuple[Decimal, ...] = ()
    spans: tuple[Span, ...] = field(default=(), compare=False)

    def text(self) -> str:
        """The canonical flag value: ``auto``, ``vram`` or the ratios as plain numbers."""
        if self.kind != "ratios":
            return self.kind
        return ",".join(format_gib(r) for r in self.ratios)

    def fractions(self) -> list[Decimal]:
        """The ratios normalised to sum 1 (``ratios`` only)."""
        total = sum(self.ratios, Decimal(0))
        return [r / total for r in self.ratios]

    def to_json(self) -> dict[str, object]:
        return {"kind": self.kind, "ratios": [float(r) for r in self.ratios],
                "text": self.text()}


def parse_split_ratio(text: str) -> SplitRatio | None:
    """The ``--split-ratio`` value ``text`` (the last one given), or None when empty.

    Raises:
        PlanError: ``invalid_split_ratio`` with the offending part's span: an empty part,
            a part that is not a plain non-negative number (units, ``inf``, ``nan``,
            negative numbers), a ratio above 1e9, or ratios that are all zero.
    """
    stripped = text.strip()
    if not stripped:
        return None
    low = stripped.lower()
    if low in ("auto", "vram"):
        return SplitRatio(low)
    ratios: list[Decimal] = []
    spans: list[Span] = []
    pos = 0
    for raw in text.split(","):
        part = raw.strip()
        start = pos + (len(raw) - len(raw.lstrip()))
        span = (start, start + len(part)) if part else (pos, pos + len(raw))
        pos += len(raw) + 1
        if not part:
            raise PlanError("invalid_split_ratio", f"{_FLAG}: empty ratio in "
                            f"'{short_text(text)}' (write auto, vram or one number per device, "
                            "e.g. 3,1)", flag=_FLAG, text=text, span=span)
        if not _NUMBER.fullmatch(part) or Decimal(part) > _MAX_RATIO:
            raise PlanError("invalid_split_ratio", f"{_FLAG}: '{short_text(part)}' is not a "
                            "ratio (write auto, vram or non-negative numbers such as 3,1)",
                            flag=_FLAG, text=text, span=span)
        ratios.append(Decimal(part))
        spans.append(span)
    if not any(ratios):
        raise PlanError("invalid_split_ratio", f"{_FLAG}: the ratios '{short_text(text)}' are "
                        "all zero; give at least one device a share", flag=_FLAG, text=text,
                        span=(spans[0][0], spans[-1][1]))
    return SplitRatio("ratios", tuple(ratios), tuple(spans))
