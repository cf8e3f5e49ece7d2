"""The thread choice counts the engine's own process tree (the engine and the client that
started it) as its own CPU time, never as other programs' load; a core kept busy by another
program still lowers the count."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from sdplan.core.runtime import threads as th


class _Clock:
    """A stand-in for the ``time`` module: wall and this process's CPU seconds set by hand."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def monotonic(self) -> float:
        return self.wall

    def process_time(self) -> float:
        return self.cpu

    def sleep(self, s: float) -> None:
        self.wall += s


def _machine(monkeypatch: pytest.MonkeyPatch) -> tuple[_Clock, dict[str, float], list[list[int]]]:
    """2 usable CPUs with hand-set busy ticks (100 ticks per CPU per second), this process's
    CPU time and its parent's; the measuring window starts now."""
    clock, parent, busy = _Clock(), {"s": 5.0}, [[0, 0]]
    monkeypatch.setattr(th, "time", clock)
    monkeypatch.setattr(th, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(th, "parent_cpu_seconds", lambda pid=None: parent["s"])
    monkeypatch.setattr(th, "cpu_ticks", lambda cpus: (tuple(busy[0]), (int(clock.wall * 100),) * 2))
    monkeypatch.setattr(th, "_tree_parent", None)
    monkeypatch.setattr(th, "_tree_last", 0.0)
    th.mark()
    return clock, parent, busy


def test_a_quiet_machine_gives_the_engine_every_requested_thread(monkeypatch) -> None:
    """An engine process on a quiet 2-core machine, 1 s window: its client (the parent) used
    0.1 s before the engine's first job and 0.7 s after it (plan tables, headers), the engine
    0.2 s; nothing else ran. ``-t 2`` gives 2 threads. (Crediting the parent only up to the
    first job left 0.7 cores of 'other programs' and chose 1 thread.)"""
    clock, parent, busy = _machine(monkeypatch)
    clock.wall, parent["s"] = 0.1, 5.1
    th.count_parent_as_own()  # the first job arrives
    clock.wall, clock.cpu, parent["s"] = 1.0, 0.2, 5.8
    busy[0] = [50, 50]  # 1.0 core-second in all: exactly the engine's and its client's
    choice = th.choose_threads(2)
    assert choice.threads == 2
    assert choice.busy_elsewhere == pytest.approx(0.0)
    assert "busy with other programs" not in choice.reason


def test_a_core_busy_in_another_program_still_lowers_the_count(monkeypatch) -> None:
    """The same window with another program holding one core throughout: 1 thread, and the
    reason names the core busy elsewhere."""
    clock, parent, busy = _machine(monkeypatch)
    th.count_parent_as_own()
    clock.wall, clock.cpu, parent["s"] = 1.0, 0.2, 5.8
    busy[0] = [100, 100]  # 2.0 core-seconds: 1.0 of the tree, 1.0 of another program
    choice = th.choose_threads(2)
    assert choice.threads == 1
    assert choice.busy_elsewhere == pytest.approx(1.0)
    assert "1.0 cores busy with other programs" in choice.reason


def test_the_client_stays_counted_in_later_windows(monkeypatch) -> None:
    """Between sampler steps the governor's windows count the client too: the client
    decoding previews at 0.9 core does not take a thread away, another program does."""
    clock, parent, busy = _machine(monkeypatch)
    th.count_parent_as_own()
    gov = th.ThreadGovernor(th.ThreadChoice(2, 2, 2, 0.0, ""), lambda n: None, interval=1.0)
    clock.wall, clock.cpu, parent["s"] = 1.0, 1.0, 5.9  # engine 1 core, client 0.9
    busy[0] = [100, 90]
    assert gov.check() is None  # still 2
    clock.wall, clock.cpu, parent["s"] = 2.0, 2.0, 5.9
    busy[0] = [200, 190]  # the engine 1 core, another program 1 core
    changed = gov.check()
    assert changed is not None and changed.threads == 1


def test_without_counting_the_parent_its_time_is_other_load(monkeypatch) -> None:
    """A process that is not an engine (no :func:`count_parent_as_own`) keeps counting its
    parent as another program, as any other process."""
    clock, parent, busy = _machine(monkeypatch)
    clock.wall, clock.cpu, parent["s"] = 1.0, 0.2, 5.8
    busy[0] = [50, 50]
    choice = th.choose_threads(2)
    assert choice.busy_elsewhere == pytest.approx(0.8)
    assert choice.threads == 1


def test_an_engine_counts_its_real_parents_cpu_time_after_its_first_job() -> None:
    """Two real processes: a child that counts its parent as its own (as the engine does at
    its first job), and this process burning about 0.3 s of CPU after that; the child's own
    CPU time over the window includes the parent's burn."""
    code = textwrap.dedent("""
        import sys
        from sdplan.core.runtime import threads as th
        th.count_parent_as_own()
        a = th.CpuSample.now()
        print("ready", flush=True)
        sys.stdin.readline()
        b = th.CpuSample.now()
        print(b.own - a.own, flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().strip() == "ready"
    c0 = time.process_time()
    while time.process_time() - c0 < 0.3:
        sum(i * i for i in range(1000))
    burned = time.process_time() - c0
    child.stdin.write("go\n")
    child.stdin.flush()
    own = float(child.stdout.readline())
    child.wait(timeout=60)
    # /proc's ticks are 10 ms; the child's own CPU in the window adds a little
    assert burned - 0.03 <= own <= burned + 0.1
