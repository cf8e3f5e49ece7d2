"""The prediction benchmark's command line (bench/bench_predict.py): ``--help`` names every
flag with a help text that states its default. The benchmark itself is run by hand, not here."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import bench_predict  # noqa: E402

FLAGS = ("--threads", "--repeat", "--steps", "--size", "--only", "--shared", "--verbose")


def test_help_names_every_flag_with_what_it_does_and_its_default() -> None:
    done = subprocess.run([sys.executable, str(BENCH / "bench_predict.py"), "--help"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "COLUMNS": "400"})
    assert done.returncode == 0, done.stderr
    # each option's entry: its invocation ("--size {demo,sd15,both}"), then its help on the same
    # line or on the lines below it (a long invocation)
    options = done.stdout.split("options:\n", 1)[1]
    helps = {}
    for entry in re.split(r"\n(?=  -)", options.strip("\n")):
        invocation, _, text = entry.strip().partition("  ")
        flag = re.match(r"(?:-\w, )?(--[a-z-]+)", invocation)
        assert flag is not None, entry
        helps[flag[1]] = " ".join(text.split())
    assert set(helps) == {*FLAGS, "--help"}, helps.keys()  # --worker, the worker process's, is hidden
    for flag in FLAGS:
        assert len(helps[flag]) > 20 and "default" in helps[flag], (flag, helps[flag])
    assert "(default: 4)" in helps["--steps"] and "default: 1)" in helps["--threads"]
    assert "(default: 2)" in helps["--repeat"] and "(default: both)" in helps["--size"]
    assert all(name in helps["--only"] for name in bench_predict.PLACEMENTS)
    # and a flag added later without a help text fails here too
    visible = [a for a in bench_predict.parser()._actions if a.help != argparse.SUPPRESS and a.dest != "help"]
    assert sorted(s for a in visible for s in a.option_strings) == sorted(FLAGS)
    assert all(a.help and a.help.strip() for a in visible)
