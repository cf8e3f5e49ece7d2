"""CPU thread counts under affinity and load: ``sdplan generate --demo`` timed as a user
runs it, in one script, and the three ratios of the thread-count rule
(:mod:`sdplan.core.runtime.threads`):

1. ``-t 8`` against ``-t 2`` (more threads than cores; target <= 1.5);
2. under ``taskset -c 0`` (affinity of one CPU), the default against ``-t 1`` (target <= 1.5);
3. with one core kept busy by another process, the default against the better of ``-t 1``
   and ``-t 2`` (target <= 1.3);
4. the engine in its own process (the default) against ``--in-process``, both with the default
   thread count (target <= 1.1 on a quiet machine: the engine's own process tree is never
   counted as other programs keeping cores busy).

Each case runs ``--repeat`` times, cases interleaved so a change in the machine's load
hits all of them alike; the median counts. Two times per run: the whole command (process
start, model load, sampling, decode, writing the PNG) and the engine's own generation time
(``total`` of the engine timings ``-v`` prints). The load average before and after is printed: on a shared
machine the ratios mean something only when the load was low.

Usage: ``python bench/bench_threads.py [--steps 3] [--repeat 3] [--only default,in_process]``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "a yellow triangle on a green background"


def run(threads: int | None, steps: int, out: Path, cpus: set[int] | None = None,
        in_process: bool = False) -> tuple[float, float]:
    """(seconds of the whole command, seconds of the engine's generation)."""
    cmd = [sys.executable, "-m", "sdplan.core.cli", "-v", "generate", "--demo", "-p", PROMPT,
           "--steps", str(steps), "-o", str(out), *(["--in-process"] if in_process else [])]
    if threads is not None:
        cmd += ["-t", str(threads)]
    pre = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pre, timeout=900)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
    m = re.search(r"'total': ([\d.]+)", res.stderr)  # the engine's timings of -v
    return wall, float(m.group(1)) if m else float("nan")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def median(xs: list[tuple[float, float]], i: int) -> float:
    return statistics.median(x[i] for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", help="comma-separated cases (default: all)")
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    print(f"CPUs {len(cpus)}; load average before: {load()}", flush=True)
    cases: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "x.png"
        busy = None
        plan = [("t2", 2, None), ("t8", 8, None), ("pin_t1", 1, {cpus[0]}),
                ("pin_default", None, {cpus[0]}), ("busy_t1", 1, None),
                ("busy_t2", 2, None), ("busy_default", None, None), ("default", None, None),
                ("in_process", None, None)]
        if a.only:
            plan = [c for c in plan if c[0] in a.only.split(",")]
        for _ in range(a.repeat):
            for name, threads, pin in plan:
                if name.startswith("busy") and busy is None:
                    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    time.sleep(1.0)
                if not name.startswith("busy") and busy is not None:
                    busy.kill()
                    busy.wait()
                    busy = None
                cases.setdefault(name, []).append(run(threads, a.steps, out, pin, name == "in_process"))
                print(f"  {name:13s} command {cases[name][-1][0]:6.2f} s  generation "
                      f"{cases[name][-1][1]:6.2f} s  (load {load()})", flush=True)
        if busy is not None:
            busy.kill()
            busy.wait()
    print(f"load average after: {load()}")
    for i, what in ((0, "whole command"), (1, "generation")):
        if "default" in cases and "in_process" in cases:
            r4 = median(cases["default"], i) / median(cases["in_process"], i)
            print(f"{what}: engine process / --in-process = {r4:.2f} (<= 1.1)")
        if not {"t8", "t2", "pin_default", "pin_t1", "busy_default", "busy_t1", "busy_t2"} <= set(cases):
            continue
        r1 = median(cases["t8"], i) / median(cases["t2"], i)
        r2 = median(cases["pin_default"], i) / median(cases["pin_t1"], i)
        r3 = median(cases["busy_default"], i) / min(median(cases["busy_t1"], i),
                                                   median(cases["busy_t2"], i))
        print(f"{what}: -t 8 / -t 2 = {r1:.2f} (<= 1.5)   taskset -c 0: default / -t 1 = "
              f"{r2:.2f} (<= 1.5)   one core busy: default / best of -t 1, -t 2 = {r3:.2f} (<= 1.3)")


if __name__ == "__main__":
    main()
