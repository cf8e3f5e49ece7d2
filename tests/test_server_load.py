"""``sdplan serve`` under load and on two device groups.

Load: 50 requests from 8 concurrent clients on the demo model (64 px, 2 steps) with a queue
of 6 (a refused client waits 0.2 s before its next request): every request is answered with pictures or refused with a JSON code (``queue_full``),
none is lost (the server's counts match the answers), and the engine's and the server's
resident memory stay flat after the run.

Two device groups (two RPC servers on loopback, the plan ``--backend RPC0`` replicated in
each group's engine): two concurrent requests run on both groups, each picture equal to a
one-device run within 1/255. Their wall time against one after the other is measured in
``bench/server_groups.py`` (speed is a bench's ratio, not a test's assertion).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from rpc_util import GGML_PRODUCTS_ENV, rpc_servers, sdplan_cmd
from server_util import picture, serving

DEMO_PROMPT = "a blue square on a red background"


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
def test_fifty_requests_from_eight_clients():
    with serving("--demo", "-t", "1", "--max-queue", "6") as srv:
        url = srv.url + "/sdapi/v1/txt2img"
        body = {"prompt": DEMO_PROMPT, "width": 64, "height": 64, "steps": 2}
        for seed in range(3):  # warm: the model loaded, the allocator's pools made
            assert _post(url, {**body, "seed": seed})[0] == 200
        engine = srv.metrics()["groups"][0]["engine_pid"]
        before = (_rss(engine), _rss(srv.proc.pid))
        answers: list[tuple[int, dict]] = []
        lock = threading.Lock()
        todo = list(range(50))

        def client() -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                got = _post(url, {**body, "seed": 100 + i})
                with lock:
                    answers.append(got)
                if got[0] == 429:  # a refused client waits a moment before its next request
                    time.sleep(0.2)

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        assert len(answers) == 50
        ok = [a for s, a in answers if s == 200]
        refused = [(s, a["error"]["code"]) for s, a in answers if s != 200]
        assert all(r == (429, "queue_full") for r in refused), refused
        assert all(picture(a["images"][0]).shape == (64, 64, 3) for a in ok)
        m = srv.metrics()
        assert m["processing"]["total_completed"] == len(ok) + 3
        assert m["processing"]["total_failed"] == 0
        assert m["processing"]["active"] == {"queued": 0, "generating": 0}
        after = (_rss(engine), _rss(srv.proc.pid))
        print(f"\n{len(ok)} answered, {len(refused)} refused (queue_full); engine RSS "
              f"{before[0] >> 20} -> {after[0] >> 20} MiB, server RSS {before[1] >> 20} -> {after[1] >> 20} MiB")
        assert after[0] - before[0] < 32 << 20
        assert after[1] - before[1] < 48 << 20
        assert len(ok) >= 20


def _cli_rpc_picture(tmp_path: Path, endpoint: str, seed: int) -> np.ndarray:
    out = tmp_path / f"one_{seed}.png"
    subprocess.run(sdplan_cmd("generate", "--demo", "-p", DEMO_PROMPT, "-W", "64", "-H", "64", "--steps", "2",
                              "-s", str(seed), "--rpc-servers", endpoint, "--backend", "RPC0", "-o", str(out),
                              "-t", "1"), check=True, capture_output=True, timeout=180, env=GGML_PRODUCTS_ENV)
    return picture(out.read_bytes())


@pytest.mark.rpc
@pytest.mark.slow
def test_two_device_groups_serve_two_requests_at_once(tmp_path):
    with rpc_servers(2) as (a, b):
        with serving("--demo", "-t", "1", "--backend", "RPC0", "--device-group", f"rpc:{a.endpoint}",
                     "--device-group", f"rpc:{b.endpoint}") as srv:
            url = srv.url + "/sdapi/v1/txt2img"
            got: dict[int, tuple[int, dict]] = {}

            def one(seed: int) -> None:
                got[seed] = _post(url, {"prompt": DEMO_PROMPT, "width": 64, "height": 64, "steps": 2,
                                        "sampler_name": "Euler", "cfg_scale": 5, "seed": seed})

            threads = [threading.Thread(target=one, args=(s,)) for s in (11, 12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            groups = {json.loads(got[s][1]["info"])["device_group"] for s in got}
            assert {s: got[s][0] for s in got} == {11: 200, 12: 200}
            assert groups == {"g0", "g1"}
            m = srv.metrics()
            assert [g["plan"]["backend"] for g in m["groups"]] == ["RPC0", "RPC0"]
            assert [g["rpc_servers"] for g in m["groups"]] == [[a.endpoint], [b.endpoint]]
        for seed in (11, 12):
            served = picture(got[seed][1]["images"][0]).astype(int)
            one_device = _cli_rpc_picture(tmp_path, a.endpoint, seed).astype(int)
            assert np.abs(served - one_device).max() <= 1
