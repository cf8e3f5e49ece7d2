"""Wall-clock timing shared by the benchmarks (each bench script imports it from beside it)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timings(fn: Callable[[], object], repeat: int, warmup: int = 0) -> list[float]:
    """Seconds of ``repeat`` calls of ``fn`` after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def best(fn: Callable[[], object], repeat: int, warmup: int = 0) -> float:
    """Fastest of ``repeat`` timed calls (seconds)."""
    return min(timings(fn, repeat, warmup))


def median_s(fn: Callable[[], object], repeat: int, warmup: int = 0) -> float:
    """Median of ``repeat`` timed calls (seconds)."""
    return statistics.median(timings(fn, repeat, warmup))
