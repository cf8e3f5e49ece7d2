"""How many CPU threads a ggml compute uses, and why.

ggml's CPU backend synchronises its threads after every graph node with a barrier that
spins (``ggml_barrier`` in ggml-cpu.c busy-waits on an atomic counter; it never sleeps or
yields). A thread that is not running holds every other thread at the next barrier until
the OS schedules it again, so a compute with more threads than cores it can really use
does not slow down by the share it lost: it collapses (measured on a 2-core machine:
``generate --demo`` with 3 threads 26x slower than with 2; with one core busy in another
process, 2 threads 2.3x slower than 1). ggml's thread-pool polling level only governs
waiting *between* graphs, not these barriers, so the count itself must fit.

The rule (:func:`choose_threads`):

- the CPUs this process may use are its affinity mask (``os.sched_getaffinity``; a
  ``taskset`` or a container's cpuset), not ``os.cpu_count()``;
- a thread count the user gives (``-t N``) is an upper limit, capped at that number;
- the count used is that limit less the cores other processes kept busy while this one
  started (Linux: ``/proc/stat`` busy time of those CPUs, less the CPU time of this
  process's own tree, over the window since :func:`mark` or since this module was imported),
  rounded to the nearest whole core, at least 1; during a run
  :class:`ThreadGovernor` re-measures between sampler steps and follows the load as it
  changes.

An engine process's own tree is the engine and the client that started it (its parent:
the command line or the app): :func:`count_parent_as_own` makes every later sample count the
parent's CPU time as this process's own, from the start of the measuring window on and for
the rest of the process's life. The client's start-up, its header reads and plan, the
tables it prints after it sent the job, and its handling of previews are then never "other
programs" (before, the parent was credited only up to the engine's first job, and on a
quiet 2-core machine ``generate -t 2`` ran on 1 thread).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Shortest window (seconds) over which the load of other processes is measured; a shorter
#: one is extended by sleeping.
MIN_WINDOW_S = 0.2

#: Clock ticks per second of /proc/stat (USER_HZ).
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def usable_cpus() -> list[int]:
    """The CPU numbers this process may run on (its affinity mask), sorted; where the OS
    has no affinity call, ``range(os.cpu_count())``."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def parent_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system, all its threads) process ``pid`` has used, by default this
    process's parent (Linux ``/proc/PID/stat``; 0.0 where it cannot be read)."""
    try:
        with open(f"/proc/{os.getppid() if pid is None else pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _HZ  # utime, stime (fields 14, 15)
    except (OSError, ValueError, IndexError):
        return 0.0


#: The parent counted as part of this process's tree (:func:`count_parent_as_own`): its pid and
#: its CPU seconds at the start of the window in which counting began; None: not counted.
_tree_parent: tuple[int, float] | None = None
_tree_last = 0.0  # the parent's seconds last read (kept when it can no longer be read)


def _tree_seconds() -> float:
    """CPU seconds of the parent counted as this process's own since counting began (0.0
    when it is not counted; never decreasing)."""
    global _tree_last
    if _tree_parent is None:
        return 0.0
    pid, base = _tree_parent
    _tree_last = max(_tree_last, parent_cpu_seconds(pid) - base)
    return _tree_last


@dataclass(frozen=True)
class CpuSample:
    """A point in time: wall clock (s), this process tree's CPU time (s: this process, all
    threads, plus its parent's since :func:`count_parent_as_own` began counting it), and
    the busy and total clock ticks of each CPU in ``cpus`` (empty where /proc/stat is
    absent)."""

    wall: float
    own: float
    busy: tuple[int, ...]
    total: tuple[int, ...]

    @classmethod
    def now(cls, cpus: list[int] | None = None) -> CpuSample:
        """Sample the CPUs ``cpus`` (default :func:`usable_cpus`)."""
        busy, total = cpu_ticks(usable_cpus() if cpus is None else cpus)
        return cls(time.monotonic(), time.process_time() + _tree_seconds(), busy, total)


def cpu_ticks(cpus: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Busy and total clock ticks (USER_HZ) of each CPU in ``cpus`` since boot, from
    ``/proc/stat`` (busy: user, nice, system, irq, softirq, steal; total adds idle and
    iowait); two empty tuples where it cannot be read."""
    busy: list[int] = []
    total: list[int] = []
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            rows = {}
            for line in fh:
                if line.startswith("cpu") and line[3:4].isdigit():
                    name, *vals = line.split()
                    rows[int(name[3:])] = [int(v) for v in vals]
        for c in cpus:
            v = rows[c]
            idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
            t = sum(v[:8])  # user nice system idle iowait irq softirq steal
            busy.append(t - idle)
            total.append(t)
    except (OSError, KeyError, ValueError, IndexError):
        return (), ()
    return tuple(busy), tuple(total)


def other_load(before: CpuSample, after: CpuSample) -> float | None:
    """Cores kept busy by other processes between two samples of the same CPUs: their busy
    time less this process's CPU time, divided by the wall time (0 <= x <= CPUs). None when
    the samples hold no CPU ticks (no /proc/stat) or no time passed."""
    wall = after.wall - before.wall
    ticks = sum(after.total) - sum(before.total)
    if not after.busy or len(after.busy) != len(before.busy) or wall <= 0 or ticks <= 0:
        return None
    n = len(after.busy)
    busy_cores = (sum(after.busy) - sum(before.busy)) / ticks * n
    own_cores = (after.own - before.own) / wall
    return min(float(n), max(0.0, busy_cores - own_cores))


_mark = CpuSample.now()
_mark_parent = parent_cpu_seconds()


def mark() -> None:
    """Start a new measuring window for the next default choice (the first starts when this
    module is imported)."""
    global _mark, _mark_parent
    _mark, _mark_parent = CpuSample.now(), parent_cpu_seconds()


def count_parent_as_own() -> None:
    """Count the parent process (the engine's client) as part of this process's own tree:
    its CPU time from the start of the current measuring window on, and in every later
    window, is this process's own, never other programs' load. The engine process calls it
    when its first job arrives: started ahead of need, it waited while its client started
    up, and the client goes on working (headers, plan, printing) while the engine starts the
    job. A second call changes nothing; a parent that has gone (the process was re-parented)
    is read as 0 more seconds."""
    global _tree_parent
    if _tree_parent is None:
        _tree_parent = (os.getppid(), _mark_parent)


@dataclass(frozen=True)
class ThreadChoice:
    """A thread count and why: ``threads`` (>= 1), ``cpus`` (CPUs this process may use),
    ``requested`` (0: default), ``busy_elsewhere`` (cores other processes used, or None
    when unmeasured) and ``reason`` (one line for the user)."""

    threads: int
    cpus: int
    requested: int
    busy_elsewhere: float | None
    reason: str


def _fit(limit: int, cpus: int, load: float | None) -> int:
    """Threads for ``load`` cores busy elsewhere: the free cores rounded, 1..``limit``."""
    if load is None:
        return limit
    return max(1, min(limit, int(cpus - load + 0.5)))


def _reason(n: int, limit: int, cpus: int, requested: int, load: float | None) -> str:
    """One line saying why ``n`` threads (see :func:`choose_threads`)."""
    head = f"-t {requested}" if requested else "default"
    why_cpus = (f"{cpus} CPU{'s' if cpus != 1 else ''} this process may use"
                + ("" if cpus == (os.cpu_count() or cpus) else f" of {os.cpu_count()}"))
    parts = [f"{head}: the {why_cpus}" if not requested or requested > cpus else head]
    if requested > cpus:
        parts[0] += f" (-t {requested} is capped there)"
    if n < limit and load is not None:
        parts.append(f"less {load:.1f} cores busy with other programs")
    if n < (requested or cpus):
        parts.append("ggml's threads busy-wait, so more threads than free cores stall "
                     "each other")
    return "; ".join(parts)


def choose_threads(requested: int = 0, *, measure: bool = True) -> ThreadChoice:
    """The CPU thread count of a compute (rule in the module docstring): at most
    ``requested`` (0: no limit) and the CPUs this process may use, fewer while other
    programs keep cores busy.

    Args:
        requested: the user's ``-t`` (0: choose).
        measure: measure other processes' load (False: the CPUs alone, as ``sdplan
            devices`` reports without waiting).

    Returns:
        A :class:`ThreadChoice`; measuring may sleep up to :data:`MIN_WINDOW_S` seconds.

    Raises:
        ValueError: ``requested`` < 0.
    """
    if requested < 0:
        raise ValueError(f"thread count must be >= 0 (0: automatic), got {requested}")
    cpus_list = usable_cpus()
    cpus = len(cpus_list)
    limit = min(requested or cpus, cpus)
    load = None
    if limit > 1 and measure:
        global _mark, _mark_parent
        start = _mark
        wait = MIN_WINDOW_S - (time.monotonic() - start.wall)
        if wait > 0:
            time.sleep(wait)
        now = CpuSample.now(cpus_list)
        load = other_load(start, now) if len(start.busy) == cpus else None
        _mark, _mark_parent = now, parent_cpu_seconds()
    n = _fit(limit, cpus, load)
    return ThreadChoice(n, cpus, requested, load, _reason(n, limit, cpus, requested, load))


class ThreadGovernor:
    """Keeps a thread count fitted to the load while a run goes on: :meth:`check` (called
    between sampler steps) re-measures other programs' load over the time since the last
    check (at least ``interval`` seconds) and, when the rounded count of free cores
    changed, calls ``apply(threads)``; never above the user's ``-t`` or the usable CPUs."""

    def __init__(self, choice: ThreadChoice, apply: Callable[[int], None],
                 interval: float = 1.0) -> None:
        self.choice = choice
        self.apply = apply
        self.interval = interval
        self._last = CpuSample.now()

    def check(self) -> ThreadChoice | None:
        """Re-measure when ``interval`` has passed; returns the new choice when the count
        changed (after applying it), else None."""
        c = self.choice
        limit = min(c.requested or c.cpus, c.cpus)
        if limit == 1 or time.monotonic() - self._last.wall < self.interval:
            return None
        now = CpuSample.now()
        load = other_load(self._last, now)
        self._last = now
        if load is None:
            return None
        n = _fit(limit, c.cpus, load)
        if n == c.threads:
            return None
        self.choice = ThreadChoice(n, c.cpus, c.requested, load,
                                   _reason(n, limit, c.cpus, c.requested, load))
        self.apply(n)
        return self.choice


_RUN: dict[str, ThreadGovernor] = {}  # the governor of this process's running request


def start_run(manager: Any, requested: int, report: Callable[..., None]) -> ThreadChoice:
    """Choose the CPU thread count of a run (:func:`choose_threads`), set it on ``manager``
    (a BackendManager: its CPU-like backends), report it as ``report(phase="threads",
    threads=n, reason=...)`` and keep a :class:`ThreadGovernor` for
    :func:`check_between_steps`. Returns the choice."""
    choice = choose_threads(requested)
    manager.cpu_threads = choice.threads
    report(phase="threads", threads=choice.threads, reason=choice.reason)

    def apply(n: int) -> None:
        manager.cpu_threads = n

    _RUN["now"] = ThreadGovernor(choice, apply)
    return choice


def check_between_steps(report: Callable[..., None]) -> None:
    """Between two sampler steps: let the run's governor follow the load, reporting a new
    count as :func:`start_run` does."""
    gov = _RUN.get("now")
    changed = gov.check() if gov is not None else None
    if changed is not None:
        report(phase="threads", threads=changed.threads, reason=changed.reason)
