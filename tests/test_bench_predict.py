"""The prediction benchmark's command line (bench/bench_predict.py): ``--help`` names every
flag with a help text that states its default, and bad flags are refused before any work. The
benchmark itself is run by hand, not here."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(("flags", "line"), [
    (["--only", "cpu,bogus"], "--only 'cpu,bogus': unknown placements ['bogus']"),
    (["--only", ","], "--only ',': unknown placements (none given)"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--repeat", "0"], "--repeat must be at least 1, got 0"),
    (["--steps", "-1"], "--steps must be at least 1, got -1"),
    (["--shared", "/nonexistent-shared"], "--shared '/nonexistent-shared': no models/real_size_key_layouts.json"),
])
def test_bad_flags_are_refused_before_the_servers_start(flags: list[str], line: str) -> None:
    """``--repeat 0`` or an empty ``--only`` started three RPC servers and calibrated before
    failing or timing nothing, and a missing layouts file failed after the whole demo part:
    each is now one line first."""
    with pytest.raises(SystemExit) as exc:
        bench_predict.check_flags(bench_predict.parser().parse_args(flags))
    assert str(exc.value).startswith(line), exc.value
    bench_predict.check_flags(bench_predict.parser().parse_args(["--shared", "/nonexistent-shared",
                                                                 "--size", "demo"]))
