"""The engine's measured peak over a finished run, for the estimate tests: each runner's own
peak on the CPU (its weights, staging and compute at its largest) over the weights of the
runners before it that stay resident."""

from __future__ import annotations

from collections.abc import Container, Sequence
from typing import Any


def cpu_peak(pipe: Any, order: Sequence[str], resident: Container[str] | None = None) -> tuple[int, dict[str, int]]:
    """``(peak bytes, {runner: its compute bytes})`` of ``pipe``'s runners named in ``order``
    (the order they ran), each runner's weights staying resident after it unless
    ``resident`` is given and leaves it out (a two-stage model's first expert released)."""
    peak = before = 0
    computes: dict[str, int] = {}
    for m in order:
        own = pipe.runners[m].last_peak["CPU"]
        computes[m] = own.compute
        peak = max(peak, before + own.weights + own.staging + own.compute)
        if resident is None or m in resident:
            before += pipe.runners[m].memory()["CPU"].weights
    return peak, computes
