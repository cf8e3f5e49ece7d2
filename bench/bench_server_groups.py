"""``sdplan serve`` on two device groups: two concurrent requests against the same two run one
after the other, in one script (the ratio is what counts, not the seconds).

Two ``sdplan rpc-server`` processes on loopback (one thread each) stand for two GPUs; the
server runs the demo model with ``--backend RPC0`` replicated in two groups
(``--device-group rpc:A --device-group rpc:B``). The reference is the same server, the same
two requests sent one after the other. A ratio under 1 means the groups ran in parallel.

    .venv/bin/python bench/bench_server_groups.py [--size 128] [--steps 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from rpc_util import rpc_servers  # noqa: E402
from server_util import serving  # noqa: E402


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    with rpc_servers(2) as (s0, s1):
        with serving("--demo", "-t", "1", "--backend", "RPC0", "--device-group", f"rpc:{s0.endpoint}",
                     "--device-group", f"rpc:{s1.endpoint}") as srv:
            url = srv.url + "/sdapi/v1/txt2img"
            body = {"prompt": "a red circle on a blue background", "width": a.size, "height": a.size,
                    "steps": a.steps}

            def serial() -> float:
                t0 = time.perf_counter()
                for seed in (1, 2):
                    _post(url, {**body, "seed": seed})
                return time.perf_counter() - t0

            def parallel() -> float:
                t0 = time.perf_counter()
                threads = [threading.Thread(target=_post, args=(url, {**body, "seed": s})) for s in (1, 2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                return time.perf_counter() - t0

            parallel()  # both groups load the model
            serial_s = min(serial() for _ in range(a.repeat))
            parallel_s = min(parallel() for _ in range(a.repeat))
    print(f"two requests, {a.size} px, {a.steps} steps: one after the other {serial_s:.3f} s, "
          f"at once on two device groups {parallel_s:.3f} s; ratio {parallel_s / serial_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
