"""Two ggml builds under sdplan, per op and for a whole UNet step: which build is faster here.

sdplan links the ggml of the libggml-python it is installed with; the README builds that
ggml generic (``GGML_NATIVE=OFF``: AVX2, FMA, F16C, no AVX-512). This script runs the same
work in two interpreters (``--python-a``, ``--python-b``: each a venv with sdplan installed
against one ggml build, e.g. the README's and the same command with
``-C cmake.define.GGML_NATIVE=ON``) and prints the time of each and the ratio B / A (below 1:
B is faster).

Per op (one small graph per op, built with sdplan's graph API on the CPU backend with
``--threads``; the best of ``--repeat`` computes after a warm-up), at SD 1.5 UNet / VAE / CLIP
sizes, in three groups:

* ``default``: what ggml itself still runs in sdplan's default engine on a CPU with sdplan's
  bf16 kernel (``SDPLAN_BF16_KERNEL`` unset): ADD, MUL, NORM, SILU, GELU, CONT (permuted
  copies), CONCAT, UPSCALE, SOFT_MAX (the products, convolutions, attention, group norm and
  GEGLU run sdplan's own kernels there).
* ``off``: what ggml runs when sdplan's bf16 kernel is off (``SDPLAN_BF16_KERNEL=off``): matrix
  products with f16 weights at CLIP / UNet / VAE linear sizes, 3x3 convolutions in f16 by the
  method the engine picks (sdplan's Winograd, or its im2col and ggml's MUL_MAT) and by ggml's
  IM2COL, flash attention, f32 -> f16 copies. The linear, convolution and attention cases
  are bench_ops.py's (:data:`bench_ops.CASES`).
* ``control``: sdplan's own kernels (group norm, bf16 attention), compiled the same way
  in both interpreters: their ratio shows this machine's noise.

The ``ggml op`` column names the ggml ops that took at least 15% of the case's time in one
profiled compute (``Graph.profile``; ``sdplan`` is sdplan's own kernel), so each row says
what it measured.

Whole step: one UNet step of an SD 1.5-size checkpoint (``--model``; default: random fp16
weights written by bench_sd.write_sd15_checkpoint to a temporary folder) at ``--px`` (256)
with CFG (batch 2), for each of ``--kernels`` (default ``auto,off``: sdplan's bf16 kernel as
the CPU picks it, AMX on Sapphire Rapids, then ggml's f16 products), in both interpreters: the
median of ``--step-repeat`` steps after a warm-up step; then one profiled step, summed per
ggml op, so the step's time splits into what each op costs in each build.

Every measurement runs in a fresh process; rounds interleave A and B (alternating order) and
the table shows medians over ``--rounds``. The ``spread`` column is the larger, over A and B,
of max / min across rounds: a ratio B / A nearer 1 than the spread is within noise.

Usage: ``python bench/bench_ggml_build.py --python-a .venv/bin/python
--python-b .venv-native/bin/python [--label-a generic --label-b native] [--rounds 3]
[--threads 2] [--repeat 5] [--model sd15.safetensors] [--px 256] [--kernels auto,off]
[--only SUBSTRING] [--no-ops] [--no-step]``. Run it with either interpreter; the table goes to
stdout, the raw medians as JSON to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

#: (group, name, kind, params). Kinds of this script: binary ``add``/``mul`` (shape a, shape b),
#: ``norm`` (layer norm over the last axis), ``unary`` (ggml op name, shape), ``cont``
#: (shape, permutation), ``concat`` (shape, shape, axis), ``upscale`` (shape, factor),
#: ``soft_max`` (scores shape, scale), ``cast`` (shape, dtype), ``bf16_attention`` (q, k and
#: v shape: sdplan's attention op with the CPU's bf16 kernel); the others are bench_ops.py's
#: kinds and parameters (``conv``, ``matmul``, ``group_norm``, ``attention``), with the weight
#: dtype and method as ``kind:dtype:method``.
OPS: list[tuple[str, str, str, tuple[Any, ...]]] = [
    ("default", "add residual unet 2x320x64x64", "add", ((2, 320, 64, 64), (2, 320, 64, 64))),
    ("default", "add time emb unet 2x320x64x64 + 2x320x1x1", "add", ((2, 320, 64, 64), (2, 320, 1, 1))),
    ("default", "add tokens unet 2x4096x320", "add", ((2, 4096, 320), (2, 4096, 320))),
    ("default", "add residual vae 1x128x256x256", "add", ((1, 128, 256, 256), (1, 128, 256, 256))),
    ("default", "mul tokens unet 2x4096x320 * 320", "mul", ((2, 4096, 320), (320,))),
    ("default", "layer norm unet 2x4096x320", "norm", ((2, 4096, 320),)),
    ("default", "layer norm clip 1x77x768", "norm", ((1, 77, 768),)),
    ("default", "silu unet 2x320x64x64", "unary", ("silu", (2, 320, 64, 64))),
    ("default", "silu vae 1x128x256x256", "unary", ("silu", (1, 128, 256, 256))),
    ("default", "gelu (tanh) unet 2x4096x1280", "unary", ("gelu", (2, 4096, 1280))),
    ("default", "gelu_quick clip 1x77x3072", "unary", ("gelu_quick", (1, 77, 3072))),
    ("default", "cont 2x320x64x64 -> channels last", "cont", ((2, 320, 64, 64), (0, 2, 3, 1))),
    ("default", "cont 2x64x64x320 -> channels first", "cont", ((2, 64, 64, 320), (0, 3, 1, 2))),
    ("default", "concat skip unet 2x320x64x64 x2 (axis 1)", "concat", ((2, 320, 64, 64), (2, 320, 64, 64), 1)),
    ("default", "upscale x2 unet 2x640x32x32", "upscale", ((2, 640, 32, 32), 2)),
    ("default", "upscale x2 vae 1x512x128x128", "upscale", ((1, 512, 128, 128), 2)),
    ("default", "soft_max scores unet 2x8x1024x1024", "soft_max", ((2, 8, 1024, 1024), 1 / math.sqrt(40))),
    ("off", "linear clip 77x768->768", "matmul:f16:auto", (77, 768, 768)),
    ("off", "linear clip 77x768->3072", "matmul:f16:auto", (77, 768, 3072)),
    ("off", "linear unet 2048x320->320", "matmul:f16:auto", (2048, 320, 320)),
    ("off", "linear unet 2048x320->2560", "matmul:f16:auto", (2048, 320, 2560)),
    ("off", "linear vae 1024x512->512", "matmul:f16:auto", (1024, 512, 512)),
    ("off", "conv3x3 unet 320ch 32x32 b2", "conv:f16:auto", (2, 320, 320, 32, 32, 3)),
    ("off", "conv3x3 unet 320ch 32x32 b2 (ggml im2col)", "conv:f16:im2col", (2, 320, 320, 32, 32, 3)),
    ("off", "conv3x3 unet 640ch 16x16 b2", "conv:f16:auto", (2, 640, 640, 16, 16, 3)),
    ("off", "conv3x3 unet 1280ch 8x8 b2", "conv:f16:auto", (2, 1280, 1280, 8, 8, 3)),
    ("off", "conv3x3 unet 1280ch 8x8 b2 (ggml im2col)", "conv:f16:im2col", (2, 1280, 1280, 8, 8, 3)),
    ("off", "conv3x3 vae 512ch 64x64", "conv:f16:auto", (1, 512, 512, 64, 64, 3)),
    ("off", "conv1x1 vae 512ch 32x32", "conv:f16:auto", (1, 512, 512, 32, 32, 1)),
    ("off", "flash attention unet 2x8x1024 d40", "attention:f32:flash", (2, 8, 1024, 1024, 40, False)),
    ("off", "flash attention unet cross 2x8x1024x77 d40", "attention:f32:flash", (2, 8, 1024, 77, 40, False)),
    ("off", "flash attention clip 12x77 d64 causal", "attention:f32:flash", (1, 12, 77, 77, 64, True)),
    ("off", "attention vae 1x1024 d512 (engine's path)", "attention:f32:auto", (1, 1, 1024, 1024, 512, False)),
    ("off", "cast f32->f16 2x8x4096x40", "cast", ((2, 8, 4096, 40), "f16")),
    ("control", "group norm unet 320ch 32x32 b2", "group_norm:f32:auto", (2, 320, 32, 32)),
    ("control", "attention unet 2x8x1024 d40 (sdplan bf16)", "bf16_attention", (2, 8, 1024, 40)),
]


# --------------------------------------------------------------------------- workers


def _build_own(cpu: Any, kind: str, p: tuple[Any, ...], threads: int) -> Any:
    """The graph of one of this script's own kinds (see :data:`OPS`), inputs set."""
    import numpy as np
    from sdplan.core.runtime import graph as gr

    rng = np.random.default_rng(0)
    g = gr.new_graph([cpu], n_threads=threads)
    arrays: dict[str, Any] = {}

    def inp(shape: tuple[int, ...]) -> Any:
        name = f"x{len(arrays)}"
        arrays[name] = rng.standard_normal(shape, dtype=np.float32)
        return g.input(name, shape, "f32")

    if kind in ("add", "mul"):
        y = getattr(g, kind)(inp(p[0]), inp(p[1]))
    elif kind == "norm":
        y = g.norm(inp(p[0]), 1e-5)
    elif kind == "unary":
        y = g.unary(p[0], inp(p[1]))
    elif kind == "cont":
        y = g.cont(g.permute(inp(p[0]), p[1]))
    elif kind == "concat":
        y = g.concat(inp(p[0]), inp(p[1]), p[2])
    elif kind == "upscale":
        y = g.upscale(inp(p[0]), p[1])
    elif kind == "soft_max":
        y = g.soft_max(inp(p[0]), None, p[1])
    elif kind == "cast":
        y = g.cast(inp(p[0]), p[1])
    elif kind == "bf16_attention":  # sdplan's attention op (the CPU's bf16 kernel), f32 q, k, v
        g.bf16_attention = True
        y = gr.attention(g, inp(p), inp(p), inp(p), flash=True)
    else:
        raise ValueError(f"unknown case kind {kind!r}")
    g.output("y", y)
    for name, arr in arrays.items():
        g.set_input(name, arr)
    return g


def _ops_of(rows: list[Any]) -> str:
    """The ggml ops taking at least 15% of a profiled compute, slowest first."""
    per: dict[str, float] = {}
    for op, _name, _shape, _src, s in rows:
        per[op] = per.get(op, 0.0) + s
    total = sum(per.values()) or 1.0
    big = sorted((s, op) for op, s in per.items() if s >= 0.15 * total)[::-1]
    return "+".join("sdplan" if op == "CUSTOM" else op for _, op in big)


def worker_ops(threads: int, repeat: int, only: str) -> dict[str, Any]:
    """Seconds (best of ``repeat`` after a warm-up) and the ggml ops of each :data:`OPS` case."""
    import _timing
    import bench_ops
    from sdplan.core.runtime.native import native

    ng = native()
    default_kernel = str(ng.bf16_kernel())
    mgr = ng.BackendManager(threads)
    cpu = mgr.get("CPU")
    out: dict[str, Any] = {}
    for group, name, kind, p in OPS:
        if only not in name:
            continue
        ng.set_bf16_kernel("off" if group == "off" else default_kernel)
        base, _, rest = kind.partition(":")
        if rest:
            wdtype, method = rest.split(":")
            g = bench_ops.build_case(cpu, base, p, threads, wdtype, method)
        else:
            g = _build_own(cpu, base, p, threads)
        g.compute()
        ops = _ops_of(g.profile())
        out[name] = {"s": _timing.best(g.compute, repeat, warmup=1), "ops": ops}
        del g
    ng.set_bf16_kernel(default_kernel)
    mgr.close()
    return {"cases": out, **_build_info()}


def _build_info() -> dict[str, Any]:
    from sdplan.core.runtime.native import native

    ng = native()
    feats = dict(ng.backend_features("CPU"))
    return {"ggml": str(ng.ggml_version()), "module": str(Path(ng.__file__).parent),
            "cpu_features": " ".join(k for k, v in feats.items() if v not in ("", "0"))}


def worker_step(model: Path, threads: int, px: int, repeat: int) -> dict[str, Any]:
    """One UNet step with CFG (batch 2) at ``px``: median of ``repeat`` after a warm-up,
    and one profiled step summed per ggml op (seconds)."""
    import numpy as np
    from sdplan.core.pipelines.sd.pipeline import StableDiffusion
    from sdplan.core.runtime.native import native

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, px // 8, px // 8)).astype(np.float32)
    ctx = rng.standard_normal((2, 77, 768)).astype(np.float32)
    with StableDiffusion(model, n_threads=threads) as sd:
        runner = sd.runners["diffusion"]
        runner.prepare()
        with sd.unet_session() as unet:
            unet(x, np.float32(500.0), ctx)
            steps = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                unet(x, np.float32(500.0), ctx)
                steps.append(time.perf_counter() - t0)
            (g, _), = runner._graphs.values()  # the step's one graph, inputs still set
            per: dict[str, float] = {}
            for op, _name, _shape, _src, s in g.profile():
                per[op] = per.get(op, 0.0) + s
    return {"step_s": statistics.median(steps), "steps": steps, "profile": per,
            "kernel": str(native().bf16_kernel()), **_build_info()}


# --------------------------------------------------------------------------- driver


def _run(python: str, args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    res = subprocess.run([python, __file__, *args], capture_output=True, text=True,
                         env=dict(os.environ, **(env or {})))
    if res.returncode:
        raise SystemExit(f"{python} {' '.join(args)} failed:\n{res.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def _spread(xs: list[float]) -> float:
    return max(xs) / min(xs) if xs and min(xs) > 0 else math.nan


def _geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python-a", help="interpreter of build A (sdplan installed)")
    ap.add_argument("--python-b", help="interpreter of build B")
    ap.add_argument("--label-a", default="A")
    ap.add_argument("--label-b", default="B")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5, help="computes per op per process (best)")
    ap.add_argument("--step-repeat", type=int, default=3, help="timed steps per process (median)")
    ap.add_argument("--model", help="an SD 1.5-size checkpoint (default: write a random one)")
    ap.add_argument("--shared", default=str(REPO.parent / "shared"))
    ap.add_argument("--px", type=int, default=256)
    ap.add_argument("--kernels", default="auto,off", help="SDPLAN_BF16_KERNEL values for the step")
    ap.add_argument("--only", default="", help="the op cases whose name contains this")
    ap.add_argument("--no-ops", action="store_true")
    ap.add_argument("--no-step", action="store_true")
    ap.add_argument("--worker", choices=["ops", "step"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker == "ops":
        print(json.dumps(worker_ops(a.threads, a.repeat, a.only)))
        return 0
    if a.worker == "step":
        print(json.dumps(worker_step(Path(a.model), a.threads, a.px, a.step_repeat)))
        return 0
    for opt in ("python_a", "python_b"):
        if not getattr(a, opt) or not Path(getattr(a, opt)).exists():
            ap.error(f"--{opt.replace('_', '-')}: give an existing interpreter, got {getattr(a, opt)!r}")
    if a.model and not Path(a.model).is_file():
        ap.error(f"--model: no such file: {a.model}")
    if a.rounds < 1 or a.threads < 1 or a.repeat < 1 or a.step_repeat < 1 or a.px % 8:
        ap.error("--rounds, --threads, --repeat, --step-repeat must be >= 1 and --px a multiple of 8")
    kernels = [k for k in a.kernels.split(",") if k]
    builds = {a.label_a: a.python_a, a.label_b: a.python_b}
    labels = list(builds)
    print(f"load average before: {os.getloadavg()}; threads {a.threads}; {a.rounds} rounds", flush=True)

    ops: dict[str, list[dict[str, Any]]] = {lb: [] for lb in labels}
    steps: dict[tuple[str, str], list[dict[str, Any]]] = {(lb, k): [] for lb in labels for k in kernels}
    info: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as d:
        model = Path(a.model) if a.model else Path(d) / "sd15_random.safetensors"
        if not a.no_step and not a.model:
            from bench_sd import write_sd15_checkpoint
            write_sd15_checkpoint(model, Path(a.shared))
        common = ["--threads", str(a.threads)]
        for r in range(a.rounds):
            order = labels if r % 2 == 0 else labels[::-1]
            if not a.no_ops:
                for lb in order:
                    res = _run(builds[lb], ["--worker", "ops", *common, "--repeat", str(a.repeat),
                                            "--only", a.only])
                    ops[lb].append(res["cases"])
                    info[lb] = {k: res[k] for k in ("ggml", "module", "cpu_features")}
                    print(f"  round {r + 1} ops {lb} done (load average {os.getloadavg()[0]:.2f})", flush=True)
            if not a.no_step:
                for k in kernels:
                    for lb in order:
                        res = _run(builds[lb], ["--worker", "step", *common, "--model", str(model),
                                                "--px", str(a.px), "--step-repeat", str(a.step_repeat)],
                                   {"SDPLAN_BF16_KERNEL": k})
                        steps[(lb, k)].append(res)
                        info[lb] = {k2: res[k2] for k2 in ("ggml", "module", "cpu_features")}
                        print(f"  round {r + 1} step {k} ({res['kernel']}) {lb}: "
                              + " ".join(f"{s:.3f}" for s in res["steps"])
                              + f" s (load average {os.getloadavg()[0]:.2f})", flush=True)

    print(f"\nload average after: {os.getloadavg()}")
    for lb in labels:
        print(f"{lb}: {builds[lb]} ({info[lb]['module']}), ggml {info[lb]['ggml']}, "
              f"CPU {info[lb]['cpu_features']}")
    A, B = labels
    dump: dict[str, Any] = {"builds": {lb: {"python": builds[lb], **info[lb]} for lb in labels}}
    if not a.no_ops:
        print(f"\nper op: medians of {a.rounds} interleaved processes, each the best of {a.repeat} "
              f"computes; ms; ratio {B} / {A}; spread = max/min over rounds (the larger of the two)")
        print(f"{'path':8} {'ggml op':22} {'case':46} {A + ' ms':>9} {B + ' ms':>9} {B + '/' + A:>6} "
              f"{'spread':>6}")
        rows, by_group = [], {}
        for group, name, _kind, _p in OPS:
            if a.only not in name:
                continue
            ta = [run[name]["s"] for run in ops[A]]
            tb = [run[name]["s"] for run in ops[B]]
            ma, mb = statistics.median(ta), statistics.median(tb)
            spread = max(_spread(ta), _spread(tb))
            opname = ops[A][0][name]["ops"]
            if ops[B][0][name]["ops"] != opname:
                opname += f" / {ops[B][0][name]['ops']}"
            print(f"{group:8} {opname:22} {name:46} {ma * 1e3:9.2f} {mb * 1e3:9.2f} {mb / ma:6.2f} "
                  f"{spread:6.2f}")
            rows.append({"path": group, "ops": opname, "case": name, A: ma, B: mb, "ratio": mb / ma,
                         "spread": spread})
            by_group.setdefault(group, []).append(mb / ma)
        for group, rs in by_group.items():
            print(f"{group:8} geometric mean {B}/{A} {_geomean(rs):.2f} over {len(rs)} cases "
                  f"(min {min(rs):.2f}, max {max(rs):.2f})")
        dump["ops"] = rows
    if not a.no_step:
        print(f"\nwhole UNet step, SD 1.5 size, {a.px} px, CFG batch 2: medians of {a.rounds} "
              f"processes, each the median of {a.step_repeat} steps; s")
        print(f"{'kernel':8} {A + ' s':>9} {B + ' s':>9} {B + '/' + A:>6} {'spread':>6}")
        dump["step"] = {}
        for k in kernels:
            sa = [r["step_s"] for r in steps[(A, k)]]
            sb = [r["step_s"] for r in steps[(B, k)]]
            ma, mb = statistics.median(sa), statistics.median(sb)
            kname = steps[(A, k)][0]["kernel"]
            print(f"{kname:8} {ma:9.3f} {mb:9.3f} {mb / ma:6.2f} {max(_spread(sa), _spread(sb)):6.2f}")
            dump["step"][kname] = {A: ma, B: mb, "ratio": mb / ma}
        for k in kernels:
            kname = steps[(A, k)][0]["kernel"]
            prof = {lb: [r["profile"] for r in steps[(lb, k)]] for lb in labels}
            names = sorted({op for p in prof[A] + prof[B] for op in p},
                           key=lambda op: -statistics.median(p.get(op, 0.0) for p in prof[A]))
            tot_a = statistics.median(sum(p.values()) for p in prof[A])
            print(f"\nstep with kernel {kname}, one profiled step per process summed per ggml op "
                  f"(sdplan = sdplan's own kernels); medians; s")
            print(f"{'op':20} {A + ' s':>9} {B + ' s':>9} {B + '/' + A:>6} {'share of ' + A:>12}")
            dump[f"step_profile_{kname}"] = {}
            for op in names:
                pa = statistics.median(p.get(op, 0.0) for p in prof[A])
                pb = statistics.median(p.get(op, 0.0) for p in prof[B])
                if pa < 1e-3 and pb < 1e-3:
                    continue
                ratio = pb / pa if pa > 0 else math.nan
                print(f"{'sdplan' if op == 'CUSTOM' else op:20} {pa:9.4f} {pb:9.4f} {ratio:6.2f} "
                      f"{100 * pa / tot_a:11.1f}%")
                dump[f"step_profile_{kname}"][op] = {A: pa, B: pb}
    print(json.dumps(dump), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
