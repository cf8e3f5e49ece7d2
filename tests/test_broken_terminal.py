"""The picture survives a broken terminal: with stdout or stderr on a device that takes no
writes (``>/dev/full``: no space left on device) the plan's tables, the progress and the
path are lost, the picture is written and the exit code is 0."""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

import pytest
from rpc_util import sdplan_cmd
from sdplan.core.commands.messages import QuietStdout

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"
FULL = "/dev/full"


class _Full(io.StringIO):
    """A stream whose writes fail as /dev/full's do."""

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")


def test_a_stream_that_takes_no_writes_goes_quiet() -> None:
    q = QuietStdout(_Full())  # type: ignore[arg-type]
    assert q.write("tables") == 6 and q.broken
    assert q.write("more") == 4
    q.flush()


@pytest.mark.skipif(not os.path.exists(FULL), reason="no /dev/full on this system")
@pytest.mark.parametrize(("stdout_full", "stderr_full", "extra"), [
    (True, False, []), (False, True, []), (True, True, []), (True, True, ["--in-process"])])
def test_generate_writes_its_picture_with_a_full_terminal(tmp_path: Path, stdout_full: bool,
                                                          stderr_full: bool, extra: list[str]) -> None:
    pytest.importorskip("sdplan._ggml")
    out = tmp_path / "x.png"
    with open(FULL, "w") as full:
        res = subprocess.run(
            sdplan_cmd("generate", "-m", str(DEMO), "-p", "a red circle on a blue background",
                       "-W", "64", "-H", "64", "--steps", "2", "-t", "1", "-o", str(out), *extra),
            stdout=full if stdout_full else subprocess.PIPE,
            stderr=full if stderr_full else subprocess.PIPE, stdin=subprocess.DEVNULL,
            timeout=300)
    text = (res.stderr or b"").decode() + (res.stdout or b"").decode()
    assert res.returncode == 0, text
    assert "Traceback" not in text and "error" not in text
    assert out.stat().st_size > 0
    if not stdout_full:
        assert res.stdout.decode().strip().endswith(str(out))  # the path still printed
