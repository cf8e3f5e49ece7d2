"""Upscale throughput of sdplan's engine against the same network in PyTorch, on the CPU.

Run: ``python bench/bench_upscale.py [--model FILE] [--size PX] [--threads N] [--runs N]
[--torch-python PATH]``. Both halves upscale the same random ``size`` x ``size`` picture
with the same SRVGGNetCompact weights (default: ``../shared/weights/realesr-animevideov3``)
and the same thread count, whole (no tiles), after one warm-up run; each reports the best
of ``runs`` timings as output megapixels per second. The PyTorch half runs in a
subprocess with the reference environment's interpreter (``/work/venv-ref/bin/python``,
torch 2.13.0 CPU), which also returns its output so the two results are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO.parent / "shared" / "weights" / "realesr-animevideov3.safetensors"
DEFAULT_TORCH = "/work/venv-ref/bin/python"

# The PyTorch half: SRVGGNetCompact written out with torch.nn, weights from the file.
TORCH_SCRIPT = r"""
import json, sys, time
import numpy as np
import torch
from safetensors.torch import load_file

model, inp, out, threads, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
sd = load_file(model)
n = 1 + max(int(k.split(".")[1]) for k in sd)
layers = []
for i in range(n):  # same indices as the file: conv (with bias) or PReLU (slopes only)
    w = sd[f"body.{i}.weight"]
    layers.append(torch.nn.Conv2d(w.shape[1], w.shape[0], 3, 1, 1) if f"body.{i}.bias" in sd
                  else torch.nn.PReLU(w.shape[0]))
body = torch.nn.Sequential(*layers)
body.load_state_dict({k[len("body."):]: v.float() for k, v in sd.items()})
scale = int(round((sd[f"body.{n - 1}.weight"].shape[0] // 3) ** 0.5))
x = torch.from_numpy(np.load(inp))

def run():
    y = torch.nn.functional.pixel_shuffle(body(x), scale)
    return y + torch.nn.functional.interpolate(x, scale_factor=scale, mode="nearest")

with torch.inference_mode():
    run()
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        y = run()
        best = min(best, time.perf_counter() - t0)
np.save(out, y.numpy())
print(json.dumps({"seconds": best, "threads": torch.get_num_threads(), "torch": torch.__version__}))
"""


def bench_sdplan(model: Path, x: np.ndarray, threads: int, runs: int) -> tuple[float, np.ndarray]:
    """Best seconds of ``runs`` whole-picture upscales on the CPU, and the output."""
    from sdplan.core.pipelines.stages.upscale import Upscaler
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    with BackendManager(cpu_threads=threads) as m:
        up = Upscaler(model, pool=BackendPool(m), tile=max(x.shape[2:]), n_threads=threads)
        try:
            with up.runner.session():  # weights and graph stay loaded across the runs
                y = up.upscale_array(x)
                best = float("inf")
                for _ in range(runs):
                    t0 = time.perf_counter()
                    y = up.upscale_array(x)
                    best = min(best, time.perf_counter() - t0)
        finally:
            up.close()
    return best, y


def bench_torch(python: str, model: Path, x: np.ndarray, threads: int, runs: int) -> tuple[dict, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        inp, out = Path(tmp) / "x.npy", Path(tmp) / "y.npy"
        np.save(inp, x)
        res = subprocess.run([python, "-c", TORCH_SCRIPT, str(model), str(inp), str(out), str(threads),
                              str(runs)], capture_output=True, text=True, timeout=1800)
        if res.returncode != 0:
            raise SystemExit(f"PyTorch half failed:\n{res.stderr[-3000:]}")
        return json.loads(res.stdout.strip().splitlines()[-1]), np.load(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--size", type=int, default=128, help="input width and height in pixels")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--torch-python", default=DEFAULT_TORCH)
    args = ap.parse_args()
    if not args.model.is_file():
        print(f"no model at {args.model}", file=sys.stderr)
        return 2
    x = np.random.default_rng(0).random((1, 3, args.size, args.size), dtype=np.float32)
    t_sd, y_sd = bench_sdplan(args.model, x, args.threads, args.runs)
    mpix = y_sd.shape[2] * y_sd.shape[3] / 1e6
    print(f"input {args.size}x{args.size}, output {y_sd.shape[3]}x{y_sd.shape[2]} ({mpix:.3f} MP), "
          f"{args.threads} threads, best of {args.runs}")
    print(f"sdplan (ggml CPU): {t_sd:.3f} s  {mpix / t_sd:.3f} MP/s")
    if not Path(args.torch_python).exists():
        print(f"PyTorch half skipped: no interpreter at {args.torch_python}")
        return 0
    info, y_t = bench_torch(args.torch_python, args.model, x, args.threads, args.runs)
    t_t = info["seconds"]
    print(f"PyTorch {info['torch']} (CPU, {info['threads']} threads): {t_t:.3f} s  {mpix / t_t:.3f} MP/s")
    print(f"ratio sdplan/PyTorch throughput: {t_t / t_sd:.2f}   max |difference|: "
          f"{float(np.abs(y_sd - y_t).max()):.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
