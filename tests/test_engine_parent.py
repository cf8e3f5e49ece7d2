"""The engine child process ends with the process that started it: ``sdplan generate`` ended
by SIGTERM or SIGKILL in the middle of a sampling step, and a process that drives the engine
from worker threads as the app does (the child outlives the thread that started it), killed
while a job runs.

Each long run is a demo picture of 1024x1024 on one thread, whose steps take about ten
seconds here: a child that outlived its parent would still be inside its first step when
checked, seconds later.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rpc_util import sdplan_cmd

pytest.importorskip("sdplan._ggml")
if not Path("/proc/self/stat").is_file():
    pytest.skip("needs /proc to see the engine child process", allow_module_level=True)

LONG = ["--demo", "-p", "a red circle on a blue background", "--steps", "4", "-W", "1024",
        "-H", "1024", "-t", "1"]


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None when the
    process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def alive(pid: int) -> bool:
    """The process exists and is neither a zombie nor dead."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def engine_children(parent: int) -> list[int]:
    """Process ids of the engine child processes whose parent is ``parent``: spawned (their
    command line runs the engine module) or forked by the command line (named
    ``sdplan-engine``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        st = _stat(int(entry.name))
        try:
            cmd = (entry / "cmdline").read_bytes()
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if st is not None and int(st[1]) == parent and (b"sdplan.core.runtime.process" in cmd
                                                          or name == "sdplan-engine"):
            found.append(int(entry.name))
    return found


def gone_within(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def _reap(proc: subprocess.Popen, children: list[int]) -> None:  # type: ignore[type-arg]
    """Leave nothing running when a check failed."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in children:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_generate_ended_mid_step_ends_its_engine_child(tmp_path: Path, sig: int) -> None:
    proc = subprocess.Popen(sdplan_cmd("generate", *LONG, "-o", str(tmp_path / "x.png")),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    children: list[int] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # printed just before the engine starts sampling
            if line.startswith("CPU threads"):
                break
        else:
            pytest.fail(f"generate ended early with {proc.wait()}")
        children = engine_children(proc.pid)
        assert len(children) == 1
        # the command line, single-threaded at its start, forked its child (not a new Python)
        assert Path(f"/proc/{children[0]}/comm").read_text().strip() == "sdplan-engine"
        time.sleep(1.0)
        assert alive(children[0])  # inside its first step
        proc.send_signal(sig)
        assert proc.wait(30) == -sig  # the conventional status: 128 + sig in a shell
        assert gone_within(children[0], 5.0)
        assert not (tmp_path / "x.png").exists()
    finally:
        _reap(proc, children)


DRIVER = """
import json, sys, time
from sdplan.core.pipelines.demo.model import demo_model_path
from sdplan.core.pipelines.jobs import GENERATE_JOB
from sdplan.core.runtime.client import EngineClient

def request(size, steps):
    return {"model_files": {"model": [str(demo_model_path())]}, "prompt": "a red circle",
            "negative_prompt": None, "width": size, "height": size, "steps": steps,
            "cfg_scale": 5.0, "seed": 1, "sampling_method": "euler", "scheduler": "discrete",
            "batch_count": 1, "backend": "", "params_backend": "", "max_vram": "",
            "rpc_servers": [], "stream_layers": False, "overrides": {}, "threads": 1}

client = EngineClient(GENERATE_JOB)
client.start(request(64, 1))  # a short job first: the thread that started the child ends
while (msg := client.next_message(120.0)) is not None and msg["type"] == "progress":
    pass
first = client.engine.pid
client.start(request(1024, 4))
print(json.dumps({"first": msg["type"], "pid": client.engine.pid, "same": first == client.engine.pid}),
      flush=True)
time.sleep(600)
"""


def test_a_process_driving_the_engine_from_threads_takes_its_child_when_killed() -> None:
    """As the app does: each job runs on a new worker thread; the child started by the
    first thread serves the second job after that thread ended, and when the process is
    killed (SIGKILL: nothing of it runs) the child ends within seconds."""
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, text=True)
    children: list[int] = []
    try:
        assert proc.stdout is not None
        got = json.loads(proc.stdout.readline() or "null")
        assert got is not None, f"the driver ended with {proc.wait()}"
        children = [got["pid"]]
        assert got["first"] == "result" and got["same"]
        time.sleep(2.0)
        assert alive(got["pid"])  # the second job runs on the child the first thread started
        proc.kill()
        assert proc.wait(30) == -signal.SIGKILL
        assert gone_within(got["pid"], 5.0)
    finally:
        _reap(proc, children)
