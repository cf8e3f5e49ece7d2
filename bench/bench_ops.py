"""Per-op speed of sdplan's graph ops on the CPU against PyTorch (or numpy), same threads.

Each case builds one small graph holding the op at an SD 1.5 size (3x3 convolutions at the
VAE decoder's and the UNet's widths, linear layers at CLIP's and the UNet's token counts,
group norm, attention, the layout copies around attention blocks), computes it ``--repeat``
times after a warm-up and keeps the best time; the reference computes the same op with torch in a subprocess
(``--torch-python``, default /work/venv-ref/bin/python, ``torch.set_num_threads``) or, when
that interpreter is missing, with numpy in this process (matrix products only). Printed:
seconds per op for both and the ratio sdplan / reference (below 1: sdplan is faster).

Conv cases run once per path (``variants``): the kernel dtype (f16: what SD checkpoints
hold, f32) and the method of ``Graph.conv_2d`` (``auto``, ``im2col``, ``cpu_im2col``,
``winograd``, ``direct``, ``fma``, ``bf16``: f16 kernels rounded to bf16 in sdplan's bf16 product
where the CPU runs one; ``SDPLAN_FMA_GEMM=off`` in the environment times the linear
cases and ``auto`` with ggml's products instead of sdplan's FMA ones); attention cases once
per path of ``graph.attention`` (``auto``, ``flash``: the flash kernel, sdplan's own where the
CPU runs one, else ggml's; ``plain``: matrix products and softmax).

Usage: ``python bench/bench_ops.py [--threads 2] [--repeat 3] [--only SUBSTRING]
[--methods auto,im2col,direct] [--dtypes f16,f32] [--attention auto,flash,plain] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _timing
import numpy as np

DEFAULT_TORCH = "/work/venv-ref/bin/python"

#: (name, kind, params). Conv: (N, IC, OC, H, W, K); matmul: (rows, in, out);
#: group_norm: (N, C, H, W); attention: (B, heads, Nq, Nk, head dim, causal mask).
CASES: list[tuple[str, str, tuple[Any, ...]]] = [
    ("conv3x3 vae 128ch 256x256", "conv", (1, 128, 128, 256, 256, 3)),
    ("conv3x3 vae 256ch 128x128", "conv", (1, 256, 256, 128, 128, 3)),
    ("conv3x3 vae 512ch 64x64", "conv", (1, 512, 512, 64, 64, 3)),
    ("conv3x3 vae 512ch 32x32", "conv", (1, 512, 512, 32, 32, 3)),
    ("conv3x3 vae 128->3 256x256", "conv", (1, 128, 3, 256, 256, 3)),
    ("conv3x3 unet 320ch 32x32 b2", "conv", (2, 320, 320, 32, 32, 3)),
    ("conv3x3 unet 640ch 32x32 b2", "conv", (2, 640, 640, 32, 32, 3)),
    ("conv3x3 unet 640ch 16x16 b2", "conv", (2, 640, 640, 16, 16, 3)),
    ("conv3x3 unet 1280ch 8x8 b2", "conv", (2, 1280, 1280, 8, 8, 3)),
    ("conv1x1 vae 512ch 32x32", "conv", (1, 512, 512, 32, 32, 1)),
    ("conv3x3 unet 320ch 64x64 b2", "conv", (2, 320, 320, 64, 64, 3)),
    ("linear clip 77x768->768", "matmul", (77, 768, 768)),
    ("linear clip 77x768->3072", "matmul", (77, 768, 3072)),
    ("linear unet 2048x320->320", "matmul", (2048, 320, 320)),
    ("linear unet 2048x320->2560", "matmul", (2048, 320, 2560)),
    ("linear vae 1024x512->512", "matmul", (1024, 512, 512)),
    ("group_norm vae 128ch 256x256", "group_norm", (1, 128, 256, 256)),
    ("group_norm unet 320ch 32x32 b2", "group_norm", (2, 320, 32, 32)),
    ("attention vae 1x1024 d512", "attention", (1, 1, 1024, 1024, 512, False)),
    ("attention unet 2x8x1024 d40", "attention", (2, 8, 1024, 1024, 40, False)),
    ("attention unet cross 2x8x1024x77 d40", "attention", (2, 8, 1024, 77, 40, False)),
    ("attention clip 12x77 d64 causal", "attention", (1, 12, 77, 77, 64, True)),
    ("layout unet 320ch 64x64 b2 to tokens", "layout", ((2, 320, 64, 64), (0, 2, 3, 1))),
    ("layout unet tokens to 320ch 64x64 b2", "layout", ((2, 64, 64, 320), (0, 3, 1, 2))),
    ("layout unet 1280ch 16x16 b2 to tokens", "layout", ((2, 1280, 16, 16), (0, 2, 3, 1))),
]

TORCH_SCRIPT = r"""
import json, sys, time, torch
import torch.nn.functional as F
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"]); torch.set_grad_enabled(False)
def best(fn):
    fn(); ts = []
    for _ in range(a["repeat"]):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return min(ts)
out = {}
for name, kind, p in a["cases"]:
    if kind == "conv":
        n, ic, oc, h, w, k = p
        x = torch.randn(n, ic, h, w); wt = torch.randn(oc, ic, k, k) * 0.02
        out[name] = best(lambda: F.conv2d(x, wt, padding=k // 2))
    elif kind == "matmul":
        r, i, o = p
        x = torch.randn(r, i); wt = torch.randn(o, i) * 0.02
        out[name] = best(lambda: F.linear(x, wt))
    elif kind == "group_norm":
        x = torch.randn(*p)
        out[name] = best(lambda: F.group_norm(x, 32, eps=1e-6))
    elif kind == "layout":
        x = torch.randn(*p[0])
        out[name] = best(lambda: x.permute(*p[1]).contiguous())
    else:
        b, hh, nq, nk, d, causal = p
        q = torch.randn(b, hh, nq, d); k = torch.randn(b, hh, nk, d); v = torch.randn(b, hh, nk, d)
        out[name] = best(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
print(json.dumps(out))
"""


def best(fn: Callable[[], Any], repeat: int) -> float:
    """Best of ``repeat`` timed calls after one warm-up (seconds)."""
    return _timing.best(fn, repeat, warmup=1)


def sdplan_case(cpu: Any, kind: str, p: tuple[Any, ...], threads: int, repeat: int,
                wdtype: str = "f16", method: str = "auto") -> float:
    """Seconds for one op of ``kind`` at parameters ``p`` on the CPU backend ``cpu``."""
    return best(build_case(cpu, kind, p, threads, wdtype, method).compute, repeat)


def build_case(cpu: Any, kind: str, p: tuple[Any, ...], threads: int, wdtype: str = "f16",
               method: str = "auto") -> Any:
    """The graph of one :data:`CASES` op of ``kind`` at parameters ``p`` on the CPU backend
    ``cpu``, its inputs set (seeded random f32, weights of ``wdtype`` scaled by 0.02): ready
    for ``compute()`` or ``profile()``."""
    from sdplan.core.runtime import graph as gr

    rng = np.random.default_rng(0)
    g = gr.new_graph([cpu], n_threads=threads)
    # the bf16 method multiplies f16 kernels as the UNet's runner has it on AVX512_BF16 CPUs:
    # rounded to bf16 in the product
    g.f16_as_bf16 = method == "bf16"
    arrays: dict[str, np.ndarray] = {}

    def inp(name: str, shape: tuple[int, ...], dtype: str = "f32", scale: float = 1.0) -> Any:
        arr = (rng.standard_normal(shape, dtype=np.float32) * scale)
        arrays[name] = arr.astype(np.float16 if dtype == "f16" else np.float32)
        return g.input(name, shape, dtype)

    if kind == "conv":
        n, ic, oc, h, w, k = p
        x, wt = inp("x", (n, ic, h, w)), inp("w", (oc, ic, k, k), wdtype, 0.02)
        y = gr.conv2d(g, x, wt, padding=k // 2, method=method)
    elif kind == "matmul":
        r, i, o = p
        x, wt = inp("x", (r, i)), inp("w", (o, i), wdtype, 0.02)
        y = gr.linear(g, x, wt)
    elif kind == "group_norm":
        y = g.group_norm(inp("x", p), 32, 1e-6)
    elif kind == "layout":  # the contiguous copy of a permuted view (attention blocks' layouts)
        y = g.cont(g.permute(inp("x", tuple(p[0])), list(p[1])))
    else:
        b, hh, nq, nk, d, causal = p
        q, k_, v = inp("q", (b, hh, nq, d)), inp("k", (b, hh, nk, d)), inp("v", (b, hh, nk, d))
        mask = None
        if causal:
            mask = g.input("mask", (nq, nk), "f32")
            arrays["mask"] = np.triu(np.full((nq, nk), -np.inf, np.float32), 1)
        y = gr.attention(g, q, k_, v, mask, flash={"auto": None, "flash": True, "plain": False}[method])
    g.output("y", y)
    for name, arr in arrays.items():
        g.set_input(name, arr)
    return g


def torch_times(python: str, cases: list[tuple[str, str, tuple[Any, ...]]], threads: int,
                repeat: int) -> dict[str, float] | None:
    """Reference seconds per case from torch in a subprocess, or None without that interpreter."""
    if not Path(python).exists():
        return None
    arg = json.dumps({"cases": cases, "threads": threads, "repeat": repeat})
    res = subprocess.run([python, "-c", TORCH_SCRIPT, arg], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def numpy_time(kind: str, p: tuple[Any, ...], repeat: int) -> float:
    """numpy reference for matrix products (nan for the other kinds)."""
    if kind != "matmul":
        return math.nan
    r, i, o = p
    x = np.random.default_rng(0).standard_normal((r, i), dtype=np.float32)
    w = np.random.default_rng(1).standard_normal((o, i), dtype=np.float32)
    return best(lambda: x @ w.T, repeat)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    ap.add_argument("--methods", default="auto", help="conv methods to compare, comma-separated")
    ap.add_argument("--attention", default="auto", help="attention paths to compare: auto,flash,plain")
    ap.add_argument("--dtypes", default="f16", help="weight dtypes to compare, comma-separated")
    ap.add_argument("--torch-python", default=DEFAULT_TORCH)
    ap.add_argument("--json", action="store_true", help="also print the results as JSON (stderr)")
    a = ap.parse_args()
    import sdplan._ggml as native

    cases = [c for c in CASES if a.only in c[0]]
    ref = torch_times(a.torch_python, cases, a.threads, a.repeat)
    ref_name = "torch" if ref is not None else "numpy"
    mgr = native.BackendManager(a.threads)
    cpu = mgr.get("CPU")
    rows = []
    print(f"{'case':40} {'variant':16} {'sdplan s':>9} {ref_name + ' s':>9} {'ratio':>6}")
    for name, kind, p in cases:
        r = ref[name] if ref is not None else numpy_time(kind, p, a.repeat)
        variants = [(d, m) for d in a.dtypes.split(",") for m in
                    (a.methods.split(",") if kind == "conv" else ["auto"])]
        if kind == "group_norm":
            variants = [("f32", "auto")]
        if kind == "attention":
            variants = [("f32", m) for m in a.attention.split(",")]
        for wdtype, method in variants:
            t = sdplan_case(cpu, kind, p, a.threads, a.repeat, wdtype, method)
            label = f"{wdtype} {method}" if kind in ("conv", "attention") else wdtype
            print(f"{name:40} {label:16} {t:9.4f} {r:9.4f} {t / r:6.2f}", flush=True)
            rows.append({"case": name, "variant": label, "sdplan_s": t, "ref_s": r, "ratio": t / r})
    mgr.close()
    if a.json:
        print(json.dumps(rows), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
