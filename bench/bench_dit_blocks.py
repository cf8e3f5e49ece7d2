"""Every DiT family and its autoencoder at native size (1024 px): sdplan against diffusers
(PyTorch bf16 on this CPU), a DiT step measured per block.

A whole 12-20B DiT step at 1024 px takes many minutes per engine on two cores, and its bf16
weights do not fit in RAM beside diffusers'. Every block of one stack has the same shapes, so
each family's model is cut to its first ``--blocks`` block(s) of every stack
(bench/dit_cut.py: the real tensor names and shapes of ``../shared/models/
real_size_key_layouts.json``; Chroma's derived from FLUX.1-dev's, there being no Chroma
layout) and one call of it is timed at the native token count: 4096 image tokens at 1024 px
and the text tokens the family's pipeline passes (dit_cut.DITS). Per engine and family, a
process of its own (peak RSS per process):

- sdplan: random weights in the released dtype (bf16; SD3-medium's f16) written once, the family's model class
  ``from_weights``, ``ModuleRunner`` on the CPU with ``--threads`` threads and sdplan's
  default CPU bf16 kernel choice and attention (no flash attention: sd-cli's default);
- diffusers (``--ref-python``, torch CPU): the family's transformer class built from the
  released configuration with the block counts cut alike, its random init, ``.to(bfloat16)``,
  ``torch.set_num_threads``, inference mode, its default attention processor (SDPA).

Each engine makes one warm-up call then ``--repeat`` timed calls (best and median printed).
Measured: the cut model's call (s/call) and, from it, the time per block (s/call over the
blocks of the cut: the embedders and final layer share it). Computed, not measured: the real
model's step, ``s/call x F(real) / F(cut)`` with F the multiply-adds of the blocks per stack
(dit_cut.block_flops: each matrix times the tokens it sees, attention's products), which
weighs stacks of different cost (Z-Image's text refiner, 512 tokens, against its 4096-token
layers); for a family of one stack it is blocks x per block. Two parts of the rest do not
scale like this, both under 1% of a 1024 px step and alike in both engines: SD3's cut ends
with the real last joint block (no text-stream outputs, diffusers' ``context_pre_only``), and
Chroma's distilled guidance layer makes 3 S + 12 D + 2 modulation rows (17 in a 1+1 cut, 344
in the real model).

The autoencoders' decode at the same size (latent ``px/8``), one per distinct architecture
(dit_cut.VAES): FLUX.1's (FLUX.1, Chroma, Z-Image; SD3's is the same architecture), FLUX.2's
and Qwen-Image's (one frame): sdplan's decoder graph as its pipeline builds it (weights in the
released file's dtype, held as sdplan's CPU policy chooses: printed) against diffusers'
AutoencoderKL (16 channels), AutoencoderKLFlux2, AutoencoderKLQwenImage in bf16.

Usage::

    python bench/bench_dit_blocks.py [--families flux,chroma,sd3,flux2,z_image,qwen_image]
        [--vaes flux1_ae,flux2_vae,qwen_image_vae] [--parts sdplan,diffusers] [--threads 2]
        [--size 1024] [--blocks 1] [--repeat 1] [--txt N] [--json OUT]

Prints the load average before and after and the threads; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
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

import _timing  # noqa: E402
import dit_cut  # noqa: E402
import real_size_files as rsf  # noqa: E402

SHARED = REPO.parent / "shared"
REF_PYTHON = next((str(p) for p in (REPO / ".venv-ref/bin/python", Path("/work/venv-ref/bin/python")) if p.exists()),
                  "python3")

# --------------------------------------------------------------------------- sdplan workers


def _vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _timed(runner: Any, inputs: dict[str, Any], repeat: int) -> dict[str, Any]:
    ts = _timing.timings(lambda: runner.run(inputs), repeat, warmup=1)
    held = sorted({d for n, d in runner.wf.dtypes.items() if len(runner.wf.infos[n].shape) >= 2})
    return {"s": ts, "held": ",".join(held)}


def sdplan_dit(family: str, path: str, px: int, txt: int, threads: int, repeat: int) -> dict[str, Any]:
    """One warm-up and ``repeat`` timed calls of ``family``'s DiT from ``path`` (seconds)."""
    from sdplan.core.pipelines.stages.flow_dit import shapes as file_shapes
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.native import native
    from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner
    from sdplan.core.runtime.weights import WeightFile

    model = dit_cut.model_class(family).from_weights(file_shapes(path))
    ins = dit_cut.native_inputs(family, model, px, txt)
    with BackendManager(cpu_threads=threads) as m:
        r = ModuleRunner(model, WeightFile(path), ModulePlacement(("CPU",)), BackendPool(m), n_threads=threads)
        out = _timed(r, ins, repeat)
        r.release()
    out.update(kernel=str(native().bf16_kernel()), flash=bool(model.flash), peak_rss=_vm_hwm(),
               image_tokens=dit_cut.image_tokens(family, model, px), blocks=model.n_blocks)
    return out


def sdplan_vae(vae: str, path: str, px: int, threads: int, repeat: int) -> dict[str, Any]:
    """One warm-up and ``repeat`` timed decodes of a ``px/8`` latent by ``vae``'s decoder graph
    as sdplan's pipeline builds it (stages.flow_dit for FLUX.1's and FLUX.2's autoencoders,
    the Qwen-Image pipeline's for the Wan-style one)."""
    import numpy as np
    from sdplan.core.models.base import FunctionGraph
    from sdplan.core.pipelines.stages.flow_dit import VAE_BF16
    from sdplan.core.pipelines.stages.flow_dit import shapes as file_shapes
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner
    from sdplan.core.runtime.weights import WeightFile

    shp = file_shapes(path)
    z = np.random.default_rng(2).standard_normal((1, dit_cut.VAES[vae][2], px // 8, px // 8)).astype(np.float32)
    with BackendManager(cpu_threads=threads) as m:
        pool = BackendPool(m)
        if vae == "qwen_image_vae":
            from sdplan.core.models import qwen_image_vae as qv

            cfg = qv.wan_vae_config(shp)
            dec = [n for n in shp if n.startswith((cfg.prefix + "decoder.", cfg.prefix + "conv2."))]
            graph = FunctionGraph(dec, {"z": "f32"}, lambda g, w, i: {"image": qv.vae_decode(g, w, i["z"], cfg, shp)})
            wf = qv.weight_file(path, dec, pool.get("CPU"))
        else:
            from sdplan.core.models.vae import vae_config, vae_decode

            vcfg = vae_config(shp, "")
            dec = [n for n in shp if n.startswith("decoder.")]
            graph = FunctionGraph(dec, {"z": "f32"}, lambda g, w, i: {"image": vae_decode(g, w, i["z"], vcfg)},
                                  VAE_BF16)
            wf = WeightFile(path, dec)
        r = ModuleRunner(graph, wf, ModulePlacement(("CPU",)), pool, n_threads=threads)
        out = _timed(r, {"z": z}, repeat)
        r.release()
    out["peak_rss"] = _vm_hwm()
    return out


# --------------------------------------------------------------------------- diffusers

REF_CODE = r'''
import json, sys, time, resource, torch
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"]); torch.manual_seed(0)
dt = torch.bfloat16
fam, px, T, rep = a["name"], a["px"], a["txt"], a["repeat"]
g = px // 16                      # image tokens per side (2x2 patches of a px/8 latent)
N = g * g
r = lambda *s: torch.randn(*s, dtype=dt)
def grid(cols):                   # (N, cols) position ids: [0, row, col, 0...]
    i = torch.zeros(g, g, cols); i[..., 1] = torch.arange(g)[:, None]; i[..., 2] = torch.arange(g)[None, :]
    return i.reshape(N, cols)
t0 = time.perf_counter()
if a["kind"] == "vae":
    from diffusers import AutoencoderKL, AutoencoderKLFlux2, AutoencoderKLQwenImage
    h = px // 8
    if fam == "flux1_ae":
        m = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
                          up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512),
                          layers_per_block=2, latent_channels=16, use_quant_conv=False, use_post_quant_conv=False)
        z = r(1, 16, h, h)
    elif fam == "flux2_vae":
        m = AutoencoderKLFlux2(); z = r(1, 32, h, h)
    else:
        m = AutoencoderKLQwenImage(); z = r(1, 16, 1, h, h)
    call = lambda: m.decode(z)
else:
    import diffusers
    m = getattr(diffusers, a["cls"])(**a["config"])
    if fam in ("flux", "chroma"):
        kw = dict(hidden_states=r(1, N, 64), encoder_hidden_states=r(1, T, 4096), timestep=torch.tensor([0.5], dtype=dt),
                  img_ids=grid(3), txt_ids=torch.zeros(T, 3))
        if fam == "flux":
            kw.update(pooled_projections=r(1, 768), guidance=torch.tensor([3.5], dtype=dt))
    elif fam == "sd3":
        kw = dict(hidden_states=r(1, 16, px // 8, px // 8), encoder_hidden_states=r(1, T, 4096),
                  pooled_projections=r(1, 2048), timestep=torch.tensor([500.0], dtype=dt))
    elif fam == "flux2":
        txt_ids = torch.zeros(1, T, 4); txt_ids[0, :, 3] = torch.arange(T)
        kw = dict(hidden_states=r(1, N, 128), encoder_hidden_states=r(1, T, 7680),
                  timestep=torch.tensor([0.5], dtype=dt), img_ids=grid(4)[None], txt_ids=txt_ids)
    elif fam == "qwen_image":
        kw = dict(hidden_states=r(1, N, 64), encoder_hidden_states=r(1, T, 3584), encoder_hidden_states_mask=None,
                  timestep=torch.tensor([0.5], dtype=dt), img_shapes=[[(1, g, g)]])
    if fam == "z_image":
        x, cap = [r(16, 1, px // 8, px // 8)], [r(T, 2560)]
        call = lambda: m(x, torch.tensor([0.5], dtype=dt), cap)
    else:
        call = lambda: m(**kw)
m = m.eval().to(dt)
build = time.perf_counter() - t0
ts = []
with torch.inference_mode():
    call()
    for _ in range(rep):
        t1 = time.perf_counter(); call(); ts.append(time.perf_counter() - t1)
proc = getattr(m, "attn_processors", {})
print(json.dumps({"s": ts, "build": build, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "attn": sorted({type(p).__name__ for p in proc.values()}), "torch": torch.__version__,
                  "params": sum(p.numel() for p in m.parameters())}))
'''


#: family -> (diffusers class, its released configuration but the block counts), checked
#: against sdplan's reading of the real layouts by tests/test_bench_dit_blocks.py
REF_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "flux": ("FluxTransformer2DModel", dict(
        in_channels=64, attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
        pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=[16, 56, 56])),
    "chroma": ("ChromaTransformer2DModel", dict(
        in_channels=64, attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
        axes_dims_rope=[16, 56, 56], approximator_num_channels=64, approximator_hidden_dim=5120,
        approximator_layers=5)),
    "sd3": ("SD3Transformer2DModel", dict(
        sample_size=128, patch_size=2, in_channels=16, attention_head_dim=64, num_attention_heads=24,
        joint_attention_dim=4096, caption_projection_dim=1536, pooled_projection_dim=2048, out_channels=16,
        pos_embed_max_size=192)),
    "flux2": ("Flux2Transformer2DModel", dict(
        in_channels=128, attention_head_dim=128, num_attention_heads=24, joint_attention_dim=7680, mlp_ratio=3.0,
        axes_dims_rope=[32, 32, 32, 32], rope_theta=2000, guidance_embeds=False)),
    "z_image": ("ZImageTransformer2DModel", dict(
        in_channels=16, dim=3840, n_heads=30, n_kv_heads=30, cap_feat_dim=2560, axes_dims=[32, 48, 48])),
    "qwen_image": ("QwenImageTransformer2DModel", dict(
        patch_size=2, in_channels=64, out_channels=16, attention_head_dim=128, num_attention_heads=24,
        joint_attention_dim=3584, axes_dims_rope=[16, 56, 56])),
}
#: family -> the diffusers arguments that count each stack's blocks, in dit_cut.stacks' terms
REF_BLOCKS: dict[str, dict[str, str]] = {
    "flux": {"num_layers": "double_blocks", "num_single_layers": "single_blocks"},
    "chroma": {"num_layers": "double_blocks", "num_single_layers": "single_blocks"},
    "sd3": {"num_layers": "joint_blocks"},
    "flux2": {"num_layers": "double_blocks", "num_single_layers": "single_blocks"},
    "z_image": {"n_layers": "layers", "n_refiner_layers": "noise_refiner"},  # both refiners
    "qwen_image": {"num_layers": "transformer_blocks"},
}


def ref_config(family: str, counts: dict[str, int]) -> tuple[str, dict[str, Any]]:
    """The diffusers class and configuration of ``family`` with ``counts`` blocks per stack."""
    cls, cfg = REF_CONFIGS[family]
    return cls, dict(cfg, **{arg: counts[stack] for arg, stack in REF_BLOCKS[family].items()})


# --------------------------------------------------------------------------- driver


def _child(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode:
        raise RuntimeError((p.stderr.strip() or p.stdout.strip())[-1500:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def _sdplan_cmd(kind: str, name: str, path: Path, a: argparse.Namespace, txt: int) -> list[str]:
    return [sys.executable, __file__, "--worker", kind, name, str(path), "--size", str(a.size), "--txt", str(txt),
            "--threads", str(a.threads), "--repeat", str(a.repeat)]


def _ref(a: argparse.Namespace, kind: str, name: str, txt: int,
         counts: dict[str, int] | None = None) -> dict[str, Any]:
    arg = {"kind": kind, "name": name, "px": a.size, "txt": txt, "threads": a.threads, "repeat": a.repeat}
    if counts is not None:
        arg["cls"], arg["config"] = ref_config(name, counts)
    return _child([a.ref_python, "-c", REF_CODE, json.dumps(arg)])


def _stats(res: dict[str, Any] | None) -> dict[str, Any] | None:
    if res is None:
        return None
    return dict(res, best=min(res["s"]), median=statistics.median(res["s"]))


def _run(label: str, fn: Any) -> dict[str, Any] | None:
    t0 = time.perf_counter()
    try:
        res = _stats(fn())
    except (RuntimeError, ValueError) as e:
        print(f"  {label}: failed: {str(e).splitlines()[-1:]}", flush=True)
        return None
    assert res is not None
    res["wall"] = time.perf_counter() - t0  # the process's whole time: build, load, warm-up, calls
    print(f"  {label}: best {res['best']:.3f} s, median {res['median']:.3f} s "
          f"(peak RSS {res['peak_rss'] / 2**30:.2f} GiB; {time.perf_counter() - t0:.0f} s in all)", flush=True)
    return res


def bench_dit(a: argparse.Namespace, fam: str, layouts: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Both engines on ``fam``'s cut DiT: the row of the table."""
    d = dit_cut.DITS[fam]
    txt = a.txt or d.txt
    full = dit_cut.dit_layout(fam, layouts)
    cut = dit_cut.cut_layout(full, a.blocks)
    n_full, n_cut = dit_cut.stacks(full), dit_cut.stacks(cut)
    model = dit_cut.model_class(fam).from_weights(cut)
    n_img = dit_cut.image_tokens(fam, model, a.size)
    per = dit_cut.block_flops(full, n_img, txt, int(full[d.width_key][0]))
    scale = dit_cut.flops_of(n_full, per) / dit_cut.flops_of(n_cut, per)
    row: dict[str, Any] = {"family": fam, "title": d.title, "blocks_cut": n_cut, "blocks_full": n_full,
                           "image_tokens": n_img, "text_tokens": txt, "step_scale": scale}
    print(f"{d.title}: {n_cut} of {n_full} blocks, {n_img} image + {txt} text tokens", flush=True)
    if "sdplan" in a.parts:
        path = tmp / f"{fam}.safetensors"
        mf = rsf.ModelFile("--diffusion-model", path.name, (rsf.FilePart("cut"),), d.dtype)
        t0 = time.perf_counter()
        size = rsf.write_random(path, mf, {"cut": {n: list(s) for n, s in cut.items()}})
        print(f"  wrote {path.name} ({size / 2**30:.2f} GiB, {d.dtype}) in {time.perf_counter() - t0:.0f} s", flush=True)
        row["sdplan"] = _run("sdplan", lambda: _child(_sdplan_cmd("dit", fam, path, a, txt)))
        path.unlink()
    if "diffusers" in a.parts:
        row["diffusers"] = _run("diffusers", lambda: _ref(a, "dit", fam, txt, n_cut))
    return row


def bench_vae(a: argparse.Namespace, vae: str, layouts: dict[str, Any], tmp: Path) -> dict[str, Any]:
    key, dtype, ch, used = dit_cut.VAES[vae]
    row: dict[str, Any] = {"vae": vae, "used_by": used, "latent": [1, ch, a.size // 8, a.size // 8]}
    print(f"VAE {vae} ({used}): decode of a {ch}x{a.size // 8}x{a.size // 8} latent", flush=True)
    if "sdplan" in a.parts:
        path = tmp / f"{vae}.safetensors"
        mf = rsf.ModelFile("--vae", path.name, (rsf.FilePart(key),), dtype)
        rsf.write_random(path, mf, layouts)
        row["file_dtype"] = dtype
        row["sdplan"] = _run("sdplan", lambda: _child(_sdplan_cmd("vae", vae, path, a, 0)))
        path.unlink()
    if "diffusers" in a.parts:
        row["diffusers"] = _run("diffusers", lambda: _ref(a, "vae", vae, 0))
    return row


def _f(x: float | None, w: int = 9, p: int = 3) -> str:
    return f"{x:{w}.{p}f}" if x is not None else f"{'-':>{w}s}"


def _best(row: dict[str, Any], engine: str) -> float | None:
    r = row.get(engine)
    return r["best"] if r else None


def _rss(row: dict[str, Any]) -> str:
    """``sdplan/diffusers`` peak RSS of the row's processes in GiB (``-`` where not run)."""
    return "/".join(f"{row[e]['peak_rss'] / 2**30:.1f}" if row.get(e) else "-" for e in ("sdplan", "diffusers"))


def print_tables(a: argparse.Namespace, dits: list[dict[str, Any]], vaes: list[dict[str, Any]]) -> None:
    print(f"\nDiT: one call of the model cut to {a.blocks} block(s) per stack at {a.size} px (best of {a.repeat}; "
          f"measured), per block = s/call / blocks in the cut (measured), step = s/call x F(real)/F(cut) (computed)")
    print(f"{'family':17s}{'cut to':>14s}{'sdplan s/call':>14s}{'diffusers':>11s}{'ratio':>7s}{'sdplan/blk':>11s}"
          f"{'real blocks':>16s}{'step sdplan':>12s}{'step diffusers':>15s}{'peak RSS GiB':>14s}")
    for row in dits:
        s, d = _best(row, "sdplan"), _best(row, "diffusers")
        ncut = sum(row["blocks_cut"].values())
        cut = "+".join(str(v) for v in row["blocks_cut"].values())
        full = "+".join(str(v) for v in row["blocks_full"].values())
        print(f"{row['title']:17s}{cut:>14s}{_f(s, 14)}{_f(d, 11)}{_f(s / d if s and d else None, 7, 2)}"
              f"{_f(s / ncut if s else None, 11)}{full:>16s}{_f(s * row['step_scale'] if s else None, 12, 1)}"
              f"{_f(d * row['step_scale'] if d else None, 15, 1)}{_rss(row):>14s}")
    if dits:
        print("  stacks: " + "; ".join(f"{r['title']} " + ", ".join(r["blocks_full"]) for r in dits))
        held = {r["title"]: f"{r['sdplan']['held']} (kernel {r['sdplan']['kernel']}, flash {r['sdplan']['flash']})"
                for r in dits if r.get("sdplan")}
        print("  sdplan weights held as: " + "; ".join(f"{k} {v}" for k, v in held.items()))
        attn = {r["title"]: "/".join(r["diffusers"]["attn"]) or "its own (no processors)" for r in dits
                if r.get("diffusers")}
        print("  diffusers bf16, attention processors: " + "; ".join(f"{k} {v}" for k, v in attn.items()))
    if vaes:
        print(f"\nVAE decode at {a.size} px (best of {a.repeat}; sdplan: the file's dtype, held as printed; "
              "diffusers: bf16)")
        print(f"{'VAE':16s}{'sdplan s':>10s}{'diffusers s':>13s}{'ratio':>7s}{'peak RSS GiB':>14s}  sdplan weights held")
        for row in vaes:
            s, d = _best(row, "sdplan"), _best(row, "diffusers")
            held = f"{row['sdplan']['held']} (file {row['file_dtype']})" if row.get("sdplan") else "-"
            print(f"{row['vae']:16s}{_f(s, 10)}{_f(d, 13)}{_f(s / d if s and d else None, 7, 2)}{_rss(row):>14s}  {held}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--families", default=",".join(dit_cut.DITS), help=f"DiTs to run, comma-separated ({', '.join(dit_cut.DITS)})")
    ap.add_argument("--vaes", default=",".join(dit_cut.VAES), help="autoencoders to decode with ('' for none)")
    ap.add_argument("--parts", default="sdplan,diffusers", help="engines to run: sdplan, diffusers or both")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads of both engines")
    ap.add_argument("--size", type=int, default=1024, help="picture side in pixels")
    ap.add_argument("--blocks", type=int, default=1, help="blocks kept of every stack")
    ap.add_argument("--repeat", type=int, default=1, help="timed calls after one warm-up")
    ap.add_argument("--txt", type=int, default=0, help="text tokens (0: each family's, dit_cut.DITS)")
    ap.add_argument("--shared", default=str(SHARED), help="the shared inputs folder (models/real_size_key_layouts.json)")
    ap.add_argument("--ref-python", default=REF_PYTHON, help="a Python with torch and diffusers")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--worker", nargs=3, metavar=("KIND", "NAME", "FILE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        kind, name, path = a.worker
        out = (sdplan_dit(name, path, a.size, a.txt, a.threads, a.repeat) if kind == "dit"
               else sdplan_vae(name, path, a.size, a.threads, a.repeat))
        print(json.dumps(out))
        return 0
    families = [f for f in a.families.split(",") if f]
    vaes = [v for v in a.vaes.split(",") if v]
    bad = [f for f in families if f not in dit_cut.DITS] + [v for v in vaes if v not in dit_cut.VAES]
    if bad:
        raise SystemExit(f"unknown --families/--vaes {bad}: families {list(dit_cut.DITS)}, vaes {list(dit_cut.VAES)}")
    problems = [msg for bad, msg in (
        (a.size % 32 or a.size <= 0, f"--size {a.size}: a positive multiple of 32"),
        (a.blocks < 1, f"--blocks {a.blocks}: at least 1"), (a.repeat < 1, f"--repeat {a.repeat}: at least 1"),
        (a.threads < 1, f"--threads {a.threads}: at least 1"), (a.txt < 0, f"--txt {a.txt}: 0 (the family's) or more"),
        (not set(a.parts.split(",")) <= {"sdplan", "diffusers"} or not a.parts,
         f"--parts {a.parts!r}: sdplan, diffusers or both (comma-separated)"),
        (not (Path(a.shared) / "models" / "real_size_key_layouts.json").is_file(),
         f"--shared {a.shared}: no models/real_size_key_layouts.json there"),
        (bool(a.json) and not Path(a.json).resolve().parent.is_dir(), f"--json {a.json}: its folder does not exist"),
    ) if bad]
    if problems:
        raise SystemExit("bench_dit_blocks: " + "; ".join(problems))
    a.parts = set(a.parts.split(","))
    layouts = rsf.layouts(Path(a.shared))
    load0 = os.getloadavg()
    print(f"load average before: {load0}; threads {a.threads}; {a.size} px; {a.blocks} block(s) per stack")
    dit_rows, vae_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for fam in families:
            dit_rows.append(bench_dit(a, fam, layouts, Path(tmp)))
        for vae in vaes:
            vae_rows.append(bench_vae(a, vae, layouts, Path(tmp)))
    load1 = os.getloadavg()
    print(f"load average after: {load1}")
    print_tables(a, dit_rows, vae_rows)
    if a.json:
        Path(a.json).write_text(json.dumps({"size": a.size, "blocks": a.blocks, "threads": a.threads,
                                            "repeat": a.repeat, "load_before": load0, "load_after": load1,
                                            "dits": dit_rows, "vaes": vae_rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
