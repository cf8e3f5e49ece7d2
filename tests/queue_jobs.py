"""An engine job for the queue tests: counts steps like image generation and returns a
small image; ``die_at`` kills its own engine process (SIGKILL) at that step."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np


def fake_generate(ctx: Any, request: dict[str, Any]) -> dict[str, Any]:
    steps = int(request.get("steps") or 1)
    for step in range(1, steps + 1):
        ctx.cancel.check()
        time.sleep(float(request.get("sleep_s") or 0.02))
        if request.get("die_at") == step:
            os.kill(os.getpid(), signal.SIGKILL)
        ctx.progress(step=step, total=steps)
    image = np.full((8, 8, 3), int(request.get("seed") or 0) % 256, np.uint8)
    params = {k: request.get(k) for k in ("prompt", "seed", "steps")}
    return {"images": [image], "params": params, "timings": {"total": 0.0},
            "pid": os.getpid()}
