"""The corpus of hostile inputs (tests/hostile_corpus.py: at least 150, across every reader
and flag): each is refused in one line, none takes more than 1 GiB of memory, none changes
an input file. The corpus runs in a child process, whose peak memory is its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def test_every_hostile_input_is_refused_in_one_line(tmp_path: Path) -> None:
    pytest.importorskip("sdplan._ggml")
    env = {**os.environ, "SDPLAN_CACHE_DIR": str(tmp_path / "cache"), "QT_QPA_PLATFORM": "offscreen"}
    res = subprocess.run([sys.executable, str(HERE / "hostile_corpus.py"), str(tmp_path / "corpus")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
                         stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert result["cases"] >= 150
    assert result["failures"] == {}
    assert result["changed"] == []
    assert result["peak_kib"] < 1 << 20, f"peak {result['peak_kib'] / 1024:.0f} MiB"
