"""SD 1.5 size on the CPU: sdplan with each bf16 kernel path against diffusers fp32 and bf16,
in one run, as ratios.

Each variant runs in its own process (interleaved rounds; medians over ``--rounds``): sdplan
with ``SDPLAN_BF16_KERNEL`` = each path this CPU runs (``amx``, ``avx512``, ``off``: f16 weights,
sdplan's AVX2/FMA product, the Winograd convolution), and diffusers (``--ref-python``, the
``ref`` extra) in fp32 and in bf16. Per process: text encode (CLIP, 77 tokens), one UNet step with CFG
(batch 2) and a VAE decode at each ``--sizes`` (pixels), after one warm-up call each; sdplan's
weight load (every module's weights into their buffers) against reading the file (warm page
cache); peak RSS. The checkpoint is random fp16 weights with SD 1.5's names and shapes
(bench_sd.write_sd15_checkpoint, about 2 GB), written to a temporary folder.

On a CPU without bf16 products (AVX2 only) sdplan runs its f16 path and diffusers runs in fp32
only. ``--isa avx2`` stands in for such a CPU on a newer one: sdplan without its bf16 kernels
and with its AVX2 GELU/GEGLU and Winograd convolution instead of the AVX-512 ones (ggml itself
must be a build without AVX-512, which ``sdplan devices`` shows), against diffusers fp32 with
PyTorch and oneDNN held to AVX2 (``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2`` for the convolutions and
``MKL_ENABLE_INSTRUCTIONS=AVX2`` for the linear layers and attention, which PyTorch hands to MKL:
without it they ran with AVX-512, 1.5-1.65x faster on this machine).

Usage: ``python bench/bench_cpu_bf16.py [--threads 2] [--sizes 256,512] [--rounds 3]
[--kernels amx,off] [--isa avx2] [--ref-dtypes fp32,bf16]`` (the ratios are to the fastest
diffusers dtype that ran). Prints the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

REF_CODE = r'''
import json, sys, time, resource, torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"]); torch.set_grad_enabled(False); torch.manual_seed(0)
dt = torch.bfloat16 if a["dtype"] == "bf16" else torch.float32
unet = UNet2DConditionModel(cross_attention_dim=768, attention_head_dim=8)
vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",)*4,
                    up_block_types=("UpDecoderBlock2D",)*4, layers_per_block=2, latent_channels=4)
clip = CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                                    num_hidden_layers=12, hidden_act="quick_gelu"))
for m in (unet, vae, clip): m.eval().to(dt)
def once(fn):
    fn(); t0 = time.perf_counter(); fn(); return time.perf_counter() - t0
ids = torch.randint(0, 49000, (1, 77))
out = {"text": once(lambda: clip(ids))}
for px in a["sizes"]:
    h = px // 8
    x = torch.randn(2, 4, h, h, dtype=dt); ctx = torch.randn(2, 77, 768, dtype=dt)
    out[f"step{px}"] = once(lambda: unet(x, torch.tensor([500.0, 500.0]), encoder_hidden_states=ctx))
    out[f"decode{px}"] = once(lambda: vae.decode(x[:1]))
out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
'''


def once(fn) -> float:
    fn()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def read_file_s(path: Path) -> float:
    """Seconds to read the whole file in 16 MiB chunks (after one untimed read: warm cache)."""
    def go() -> None:
        with open(path, "rb", buffering=0) as fh:
            while fh.read(16 << 20):
                pass
    return once(go)


def worker_sdplan(model: Path, threads: int, sizes: list[int], avx2: bool = False) -> dict[str, float]:
    from sdplan.core.pipelines.sd.pipeline import StableDiffusion
    from sdplan.core.runtime.native import native

    if avx2:  # the AVX2 GELU/GEGLU and Winograd convolution, as an AVX2-only CPU runs them
        native().set_glu_simd(True, False)
        native().set_wino_avx512(False)
    out: dict[str, float] = {}
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    with StableDiffusion(model, n_threads=threads) as sd:
        te = sd._te(1, True)
        for r in (te, sd.runners["diffusion"], sd.runners["vae"]):
            r.prepare()
        out["load"] = time.perf_counter() - t0
        # 1: the UNet's products run the bf16 kernel (f16 weights rounded as they are used)
        out["unet_bf16"] = float(sd.runners["diffusion"].bf16)
        out["vae_bf16"] = float(sd.runners["vae"].bf16)
        ids = np.full((1, 77), 49407, np.int32)
        ids[0, :5] = [49406, 320, 1125, 539, 320]
        with sd.text_session():  # weights stay loaded, as diffusers' do
            out["text"] = once(lambda: sd.encode_ids(ids))
        with sd.unet_session() as unet:
            for px in sizes:
                x = rng.standard_normal((2, 4, px // 8, px // 8)).astype(np.float32)
                ctx = rng.standard_normal((2, 77, 768)).astype(np.float32)
                out[f"step{px}"] = once(lambda x=x, ctx=ctx: unet(x, np.float32(500.0), ctx))
        with sd.runners["vae"].session():
            for px in sizes:
                z = rng.standard_normal((1, 4, px // 8, px // 8)).astype(np.float32)
                out[f"decode{px}"] = once(lambda z=z: sd.decode(z))
    out["kernel"] = native().bf16_kernel()  # type: ignore[assignment]
    out["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def run_variant(name: str, a: argparse.Namespace, model: Path) -> dict[str, float]:
    if name.startswith("diffusers"):
        arg = json.dumps({"threads": a.threads, "sizes": a.sizes, "dtype": name.split("-")[1]})
        cmd = [a.ref_python, "-c", REF_CODE, arg]
        env = dict(os.environ)
        if a.isa == "avx2":
            # PyTorch's linear layers and attention go to MKL, convolutions to oneDNN: hold both
            env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2", MKL_ENABLE_INSTRUCTIONS="AVX2")
    else:
        cmd = [sys.executable, __file__, "--worker", str(model), "--threads", str(a.threads),
               "--sizes", ",".join(map(str, a.sizes))] + (["--isa", a.isa] if a.isa else [])
        env = dict(os.environ, SDPLAN_BF16_KERNEL=name.split("-")[1])
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode:
        raise SystemExit(f"{name} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes", default="256,512")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kernels", default="", help="sdplan kernel paths (default: the CPU's and off)")
    ap.add_argument("--ref-python", default=str(REPO / ".venv-ref/bin/python"))
    ap.add_argument("--shared", default=str(REPO.parent / "shared"))
    ap.add_argument("--no-ref", action="store_true", help="sdplan's kernel paths only (ratios to the first)")
    ap.add_argument("--model", help="an SD 1.5-size checkpoint to reuse (default: write one)")
    ap.add_argument("--isa", choices=["avx2"], help="stand in for an AVX2-only CPU (see above)")
    ap.add_argument("--ref-dtypes", default="", help="diffusers dtypes to run (default: fp32, and bf16 "
                    "where the CPU multiplies bf16)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.sizes = [int(s) for s in str(a.sizes).split(",")]
    if a.worker:
        print(json.dumps(worker_sdplan(Path(a.worker), a.threads, a.sizes, a.isa == "avx2")))
        return 0
    from bench_sd import write_sd15_checkpoint
    from sdplan.core.runtime.native import native

    cpu_kernel = native().bf16_cpu_kernel()
    kernels = a.kernels.split(",") if a.kernels else ([cpu_kernel] if cpu_kernel != "off" else []) + ["off"]
    # diffusers in bf16 where the CPU multiplies bf16 (AVX512_BF16, AMX); elsewhere PyTorch
    # widens bf16 to f32 around each product and fp32 is its best dtype
    ref_variants = ["diffusers-fp32"] + (["diffusers-bf16"] if cpu_kernel != "off" else [])
    if a.isa == "avx2":  # no bf16 kernels, and no bf16 hardware to hold diffusers' bf16 to
        kernels, ref_variants = ["off"], ["diffusers-fp32"]
    if a.ref_dtypes:
        ref_variants = [f"diffusers-{d}" for d in a.ref_dtypes.split(",")]
    variants = [f"sdplan-{k}" for k in kernels] + ([] if a.no_ref else ref_variants)
    print(f"load average before: {os.getloadavg()}; CPU bf16 kernel: {cpu_kernel}; threads {a.threads}")
    res: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory() as d:
        model = Path(a.model) if a.model else Path(d) / "sd15_random.safetensors"
        if not a.model:
            write_sd15_checkpoint(model, Path(a.shared))
        file_s = []
        for r in range(a.rounds):
            file_s.append(read_file_s(model))
            order = variants if r % 2 == 0 else variants[::-1]  # interleaved, alternating order
            for v in order:
                res[v].append(run_variant(v, a, model))
                print(f"  round {r + 1} {v} (load average {os.getloadavg()[0]:.2f}): " + ", ".join(
                    f"{k} {x:.3f}" for k, x in res[v][-1].items() if isinstance(x, float)), flush=True)
        size_gib = model.stat().st_size / 2**30
    med = {v: {k: statistics.median(float(run[k]) for run in runs) for k in runs[0] if k != "kernel"}
           for v, runs in res.items()}
    read_s = statistics.median(file_s)
    keys = ["text"] + [f"{p}{px}" for px in a.sizes for p in ("step", "decode")]
    refs = [v for v in variants if v.startswith("diffusers")] or variants[:1]
    best_ref = {k: min(med[v][k] for v in refs) for k in keys}
    print(f"\nload average after: {os.getloadavg()}")
    print(f"medians of {a.rounds} interleaved processes, seconds (ratio to "
          f"{'diffusers best dtype' if not a.no_ref else variants[0]})")
    head = f"{'':10}" + "".join(f"{v:>22}" for v in variants)
    print(head)
    for k in keys:
        row = f"{k:10}"
        for v in variants:
            row += f"{med[v][k]:12.3f} ({med[v][k] / best_ref[k]:5.2f}x) "
        print(row)
    print(f"{'peak MiB':10}" + "".join(f"{med[v]['peak_mib']:22.0f}" for v in variants))
    print(f"\nfile {size_gib:.2f} GiB read (warm): {read_s:.3f} s")
    for v in variants:
        if "load" in med[v]:
            print(f"{v} weight load {med[v]['load']:.3f} s = {med[v]['load'] / read_s:.2f}x the file read")
    print(json.dumps({"medians": med, "file_read_s": read_s}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
