"""Skip-layer guidance (SLG) as stable-diffusion.cpp's sd-cli offers it for SD3 / SD3.5.

On the steps inside the window, the DiT runs a third time on the prompt with the blocks in
``layers`` passed through, and the guided prediction moves away from it::

    pred = cfg_pred + scale * (pred_cond - pred_skip)

(sd-cli ``SkipLayerGuidance::forward``; diffusers' ``StableDiffusion3Pipeline`` with
``skip_guidance_layers`` does the same on the model output). The window, as sd-cli computes it
(``SkipLayerGuidance::is_enabled_for_step``) for step ``k = i + 1`` of ``n`` steps (1-based,
every model evaluation of step ``i`` alike) with ``n + 1`` sigmas::

    int(start * (n + 1)) < k < int(end * (n + 1))        (float32 products, truncated)

diffusers counts differently (``n * start < i < n * stop`` with the 0-based ``i``), so the same
numbers can select other steps there. Flags and defaults are sd-cli's: ``--slg-scale`` (0:
off), ``--skip-layers`` (``[7,8,9]``), ``--skip-layer-start`` (0.01), ``--skip-layer-end``
(0.2). SLG is on when the scale is not 0 and the layer list is not empty.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sdplan.core.errors import InvalidArgument

__all__ = ["SkipLayerGuidance", "parse_skip_layers", "format_layers", "DEFAULT_LAYERS", "DEFAULT_START", "DEFAULT_END"]

#: sd-cli's defaults (``examples/common``: ``skip_layers = {7, 8, 9}``; 0.01 and 0.2).
DEFAULT_LAYERS: tuple[int, ...] = (7, 8, 9)
DEFAULT_START = 0.01
DEFAULT_END = 0.2


def parse_skip_layers(text: str) -> tuple[int, ...]:
    """``--skip-layers`` text -> block indices, as sd-cli reads it: ``[`` ... ``]`` around
    integers separated by commas and/or spaces (``"[7,8,9]"``, ``"[7, 8]"``, ``"[]"``).

    Raises:
        InvalidArgument: no brackets, or an item that is not an integer (one line naming it).
    """
    body = text.strip()
    if len(body) < 2 or body[0] != "[" or body[-1] != "]":
        raise InvalidArgument(f"--skip-layers {text!r}: write the block indices in brackets, e.g. [7,8,9]")
    out = []
    for item in (t for t in re.split(r"[, ]+", body[1:-1]) if t):
        try:
            out.append(int(item))
        except ValueError:
            raise InvalidArgument(f"--skip-layers {text!r}: {item!r} is not a block index") from None
    return tuple(out)


@dataclass(frozen=True)
class SkipLayerGuidance:
    """SLG settings (module docstring).

    Attributes:
        scale: ``--slg-scale`` (0: off).
        layers: ``--skip-layers``: the DiT's blocks passed through on the guidance pass.
        start, end: ``--skip-layer-start`` / ``--skip-layer-end``: the window as fractions of
            the ``n + 1`` sigmas.
    """

    scale: float = 0.0
    layers: tuple[int, ...] = DEFAULT_LAYERS
    start: float = DEFAULT_START
    end: float = DEFAULT_END

    @property
    def enabled(self) -> bool:
        """True when SLG changes the picture: a scale other than 0 and at least one layer."""
        return self.scale != 0.0 and bool(self.layers)

    def active(self, step: int, steps: int) -> bool:
        """Whether the 0-based ``step`` of ``steps`` runs the skip-layer pass (sd-cli's window)."""
        if not self.enabled:
            return False
        import numpy as np  # float32 products, as sd-cli's window

        n = np.float32(steps + 1)
        first, last = int(np.float32(self.start) * n), int(np.float32(self.end) * n)
        return first < step + 1 < last

    def to_request(self) -> dict[str, object]:
        """The engine request keys ``slg_scale``, ``skip_layers`` (sd-cli's text, ``[7,8,9]``),
        ``skip_layer_start``, ``skip_layer_end``."""
        return {"slg_scale": self.scale, "skip_layers": format_layers(self.layers),
                "skip_layer_start": self.start, "skip_layer_end": self.end}

    @classmethod
    def from_request(cls, req: Mapping[str, object]) -> SkipLayerGuidance:
        """Read the request keys of :meth:`to_request` (absent or None: sd-cli's defaults;
        ``skip_layers`` a list or sd-cli's bracket text).

        Raises:
            InvalidArgument: a value that is not a number, malformed layers, or a negative layer.
        """
        def num(key: str, default: float) -> float:
            v = req.get(key)
            if v is None:
                return default
            try:
                f = float(v)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise InvalidArgument(f"--{key.replace('_', '-')}: {v!r} is not a number") from None
            if not math.isfinite(f):
                raise InvalidArgument(f"--{key.replace('_', '-')}: {v!r} is not a finite number")
            return f

        raw: Any = req.get("skip_layers")
        layers: tuple[int, ...]
        if raw is None:
            layers = DEFAULT_LAYERS
        elif isinstance(raw, str):
            layers = parse_skip_layers(raw)
        else:
            try:
                layers = tuple(int(v) for v in raw)
            except (TypeError, ValueError):
                raise InvalidArgument(f"--skip-layers {raw!r}: not a list of block indices") from None
        if any(i < 0 for i in layers):
            raise InvalidArgument(f"--skip-layers {list(layers)}: block indices start at 0")
        return cls(num("slg_scale", 0.0), layers, num("skip_layer_start", DEFAULT_START),
                   num("skip_layer_end", DEFAULT_END))


def format_layers(layers: Iterable[int]) -> str:
    """``--skip-layers`` text of ``layers``: ``[7,8,9]``."""
    return "[" + ",".join(str(int(i)) for i in layers) + "]"
