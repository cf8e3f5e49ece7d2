"""Seconds for one 128x128 picture of the demo model (20 Euler steps, CFG 5), sdplan against
diffusers running the same weights, in one script.

sdplan runs in this process on the CPU backend (model load timed apart from generation);
diffusers runs in a subprocess with the reference interpreter (``--ref-python``, default
/work/venv-ref/bin/python), reading the same file with diffusers' single-file converters
(``tools/demo/check_demo.py``). Both use the same number of threads. Each side reports the
best of ``--repeat`` pictures after one warm-up picture, and the ratio sdplan / diffusers.

Usage: ``python bench/bench_demo.py [--threads 2] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "resources/demo/sdplan-demo-shapes.safetensors"
PROMPT = "a yellow triangle on a green background"

REF_CODE = r'''
import json, sys, time, torch
a = json.loads(sys.argv[1])
sys.path.insert(0, a["tools"])
torch.set_num_threads(a["threads"])
import check_demo, train_demo
train_demo.import_sdplan()
t0 = time.perf_counter()
unet, clip, vae, _ = check_demo.load_file_models(__import__("pathlib").Path(a["model"]))
load = time.perf_counter() - t0
ts = []
for i in range(a["repeat"] + 1):
    t0 = time.perf_counter()
    check_demo.generate(unet, clip, vae, [a["prompt"]], [42], 20, 5.0, "euler")
    ts.append(time.perf_counter() - t0)
print(json.dumps({"load": load, "picture": min(ts[1:])}))
'''


def sdplan_side(threads: int, repeat: int) -> dict[str, float]:
    """``{"load": s, "picture": s}`` for sdplan on the CPU backend."""
    from sdplan import _ggml as G
    from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
    from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion
    from sdplan.core.planning.inventory import Device, Inventory
    from sdplan.core.planning.plan import resolve
    from sdplan.core.runtime.runner import BackendPool

    inv = Inventory((Device("CPU", "host", "cpu", "CPU", 16 << 30, 16 << 30),))
    plan = resolve(["--backend", "CPU"], inv, profile_from_model_flags({"model": [MODEL]}))
    pool = BackendPool(G.BackendManager(threads))
    try:
        t0 = time.perf_counter()
        sd = StableDiffusion(MODEL, plan, pool, n_threads=threads)
        load = time.perf_counter() - t0
        with sd:
            p = GenerateParams(PROMPT, "", 128, 128, 20, 5.0, 42, "euler", "discrete")
            ts = []
            for _ in range(repeat + 1):
                t0 = time.perf_counter()
                sd.txt2img(p)
                ts.append(time.perf_counter() - t0)
    finally:
        pool.manager.close()
    return {"load": load, "picture": min(ts[1:])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ref-python", default="/work/venv-ref/bin/python")
    args = ap.parse_args()
    ours = sdplan_side(args.threads, args.repeat)
    a = {"threads": args.threads, "repeat": args.repeat, "model": str(MODEL), "prompt": PROMPT,
         "tools": str(REPO / "tools/demo")}
    out = subprocess.run([args.ref_python, "-c", REF_CODE, json.dumps(a)], check=True,
                         capture_output=True, text=True).stdout
    ref = json.loads(out.strip().splitlines()[-1])
    print(f"demo model, 128x128, 20 Euler steps, CFG 5, {args.threads} threads, best of {args.repeat}")
    print(f"{'':10} {'sdplan':>8} {'diffusers':>10} {'ratio':>6}")
    for k in ("load", "picture"):
        print(f"{k:10} {ours[k]:8.3f} {ref[k]:10.3f} {ours[k] / ref[k]:6.2f}")
    print(json.dumps({"sdplan": ours, "diffusers": ref}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
