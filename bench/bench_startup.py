"""Fixed cost of ``sdplan generate --demo``: seconds from starting the command to the first
engine work (the entry of ``sdplan.core.pipelines.jobs.generate_job``, in the engine process
or in-process with ``--in-process``), against a bare ``python -c pass`` in the same run.

The probe is a ``sitecustomize`` put on ``PYTHONPATH`` for the measured processes only: when
``jobs`` is imported it replaces ``generate_job`` by a function that writes the elapsed time to
a file and ends the process (no image is made; the command then reports a dead engine, which
is expected). Medians over ``--repeat`` interleaved runs; prints the load average.

``--bytecode env`` (the default) runs the processes with this environment's bytecode setting
(``PYTHONDONTWRITEBYTECODE=1`` makes every run compile sdplan's modules from source);
``--bytecode cached`` runs them with their compiled bytecode kept in a temporary
``PYTHONPYCACHEPREFIX`` filled by one unmeasured run of each command first, as an installed
sdplan has it (pip compiles a package's modules when it installs them).

Usage: ``python bench/bench_startup.py [--repeat 5] [--bytecode env|cached]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = r'''
import importlib.abc, importlib.util, os, sys, time
if os.environ.get("SDPLAN_PROBE_FILE"):
    class _Probe(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "sdplan.core.pipelines.jobs":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module
            def exec_module(module):
                run(module)
                def entered(*a, **k):
                    with open(os.environ["SDPLAN_PROBE_FILE"], "w") as fh:
                        fh.write(str(time.time() - float(os.environ["SDPLAN_PROBE_T0"])))
                    os._exit(0)
                module.generate_job = entered
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, _Probe())
'''


def to_first_work(extra: list[str], probe_dir: Path, bytecode: str = "env") -> float:
    out = probe_dir / "t.txt"
    out.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(probe_dir), SDPLAN_PROBE_FILE=str(out), SDPLAN_PROBE_T0=repr(time.time()))
    if bytecode == "cached":
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(probe_dir / "pycache")
    cmd = [sys.executable, "-m", "sdplan.core.cli", "generate", "--demo", "-p", "a red circle on a blue background",
           "-o", str(probe_dir / "out.png"), *extra]
    subprocess.run(cmd, env=env, capture_output=True, timeout=120)
    if not out.exists():
        raise SystemExit(f"no engine work reached: {' '.join(cmd)}")
    return float(out.read_text())


def bare_python() -> float:
    t0 = time.time()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--bytecode", choices=("env", "cached"), default="env",
                    help="env: this environment's setting; cached: compiled once, then reused")
    a = ap.parse_args()
    off = a.bytecode == "env" and bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    print(f"bytecode: {a.bytecode} ({'compiled from source every run' if off else 'cached'})")
    print(f"load average before: {os.getloadavg()}")
    res: dict[str, list[float]] = {"python -c pass": [], "generate --demo (engine process)": [],
                                   "generate --demo --in-process": []}
    with tempfile.TemporaryDirectory() as d:
        probe = Path(d)
        (probe / "sitecustomize.py").write_text(PROBE)
        if a.bytecode == "cached":  # fill the bytecode cache, unmeasured
            to_first_work([], probe, a.bytecode)
            to_first_work(["--in-process"], probe, a.bytecode)
        for _ in range(a.repeat):
            res["python -c pass"].append(bare_python())
            res["generate --demo (engine process)"].append(to_first_work([], probe, a.bytecode))
            res["generate --demo --in-process"].append(to_first_work(["--in-process"], probe, a.bytecode))
    print(f"load average after: {os.getloadavg()}")
    base = statistics.median(res["python -c pass"])
    for k, v in res.items():
        m = statistics.median(v)
        print(f"{k:36} median {m:6.3f} s  ({m / base:5.1f}x bare python; runs {', '.join(f'{x:.3f}' for x in v)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
