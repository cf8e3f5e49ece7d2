"""SD 1.x on sdplan's engine against diffusers on the CPU, same threads, in one script.

Measures seconds per sampling step (UNet with CFG: one batch of 2), VAE decode and text
encoding, on the tiny fixture model and on an SD 1.5-size random-weight model at 256x256
(32x32 latent), plus peak RSS of each side. diffusers runs in a subprocess with the
reference interpreter (``--ref-python``, default /work/venv-ref/bin/python; torch 2.13 CPU).
Target: sdplan time <= 0.8 x diffusers' for the step and the decode.

Usage: ``python bench/bench_sd.py [--threads 2] [--size tiny|sd15|both] [--repeat 3]``.
The SD 1.5-size checkpoint (random fp16 weights with the real names from
``../shared/models``, about 2 GB) is written to a temporary folder and removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import _timing
import numpy as np

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests/fixtures"

REF_CODE = r'''
import json, sys, time, resource, torch
from diffusers import AutoencoderKL, UNet2DConditionModel
from transformers import CLIPTextConfig, CLIPTextModel
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"]); torch.set_grad_enabled(False); torch.manual_seed(0)
if a["size"] == "tiny":
    c = json.load(open(a["configs"]))["sd1"]
    unet = UNet2DConditionModel(**c["unet"]); vae = AutoencoderKL(**c["vae"])
    clip = CLIPTextModel(CLIPTextConfig(**c["clip"])); ctx_dim = c["unet"]["cross_attention_dim"]
else:
    unet = UNet2DConditionModel(cross_attention_dim=768, attention_head_dim=8)
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",)*4,
                        up_block_types=("UpDecoderBlock2D",)*4, layers_per_block=2, latent_channels=4)
    clip = CLIPTextModel(CLIPTextConfig(hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                                        num_hidden_layers=12, hidden_act="quick_gelu")); ctx_dim = 768
for m in (unet, vae, clip): m.eval()
h = w = a["latent"]
x = torch.randn(2, 4, h, w); ctx = torch.randn(2, 77, ctx_dim); ids = torch.randint(0, 49000, (1, 77))
def best(fn):
    fn(); ts = []
    for _ in range(a["repeat"]):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return min(ts)
out = {"step": best(lambda: unet(x, torch.tensor([500.0, 500.0]), encoder_hidden_states=ctx)),
       "decode": best(lambda: vae.decode(x[:1])),
       "text": best(lambda: clip(ids))}
out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(out))
'''


def write_sd15_checkpoint(path: Path, shared: Path) -> None:
    """Random fp16 weights (std 0.02; norms 1) with the SD 1.5 names and shapes."""
    import struct

    layouts = json.loads((shared / "models/real_size_key_layouts.json").read_text())
    shapes = {**layouts["sd15_unet_ldm"], **layouts["sd_vae_ldm"]}
    shapes |= {"cond_stage_model.transformer.text_model." + k: v for k, v in layouts["clip_l_hf"].items()}
    header, off = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape) * 2
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    rng = np.random.default_rng(0)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        for name, shape in shapes.items():
            if len(shape) == 1:
                arr = np.ones(shape, np.float16) if "norm" in name else np.zeros(shape, np.float16)
            else:
                arr = (rng.standard_normal(math.prod(shape), dtype=np.float32) * 0.02).astype(np.float16)
            fh.write(arr.tobytes())


def best(fn, repeat: int) -> float:
    return _timing.best(fn, repeat, warmup=1)


def bench_sdplan(model: Path, latent: int, threads: int, repeat: int, tiny: bool) -> dict[str, float]:
    from sdplan.core.pipelines.sd.pipeline import StableDiffusion

    kw = {"clip_heads": 2} if tiny else {}
    rng = np.random.default_rng(0)
    with StableDiffusion(model, n_threads=threads, **kw) as sd:
        d = sd.clip_cfg.width
        ctx = rng.standard_normal((2, 77, sd.unet_cfg.context_dim)).astype(np.float32)
        x = rng.standard_normal((2, 4, latent, latent)).astype(np.float32)
        ids = np.full((1, 77), 49407, np.int32)
        ids[0, :5] = [49406, 320, 1125, 539, 320]
        out = {"text": best(lambda: sd.encode_ids(ids), repeat)}
        with sd.unet_session() as unet:
            out["step"] = best(lambda: unet(x, np.float32(500.0), ctx), repeat)
        out["decode"] = best(lambda: sd.decode(x[:1]), repeat)
        assert d > 0
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def bench_ref(python: str, size: str, latent: int, threads: int, repeat: int) -> dict[str, float]:
    arg = json.dumps({"size": size, "latent": latent, "threads": threads, "repeat": repeat,
                      "configs": str(FIX / "fixture_configs.json")})
    res = subprocess.run([python, "-c", REF_CODE, arg], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def report(name: str, ours: dict[str, float], ref: dict[str, float]) -> None:
    print(f"\n== {name}")
    print(f"{'':10} {'sdplan s':>10} {'diffusers s':>12} {'ratio':>7}")
    for k in ("step", "decode", "text"):
        print(f"{k:10} {ours[k]:10.3f} {ref[k]:12.3f} {ours[k] / ref[k]:7.2f}")
    print(f"{'peak MiB':10} {ours['peak_rss_mib']:10.0f} {ref['peak_rss_mib']:12.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", choices=("tiny", "sd15", "both"), default="both")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ref-python", default="/work/venv-ref/bin/python")
    ap.add_argument("--shared", default=str(REPO.parent / "shared"))
    a = ap.parse_args()
    results = {}
    if a.size in ("tiny", "both"):
        ref = bench_ref(a.ref_python, "tiny", 8, a.threads, a.repeat)
        ours = bench_sdplan(FIX / "sd1_tiny.safetensors", 8, a.threads, a.repeat, tiny=True)
        report("tiny SD1 (8x8 latent, CFG batch 2)", ours, ref)
        results["tiny"] = {"sdplan": ours, "diffusers": ref}
    if a.size in ("sd15", "both"):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "sd15_random.safetensors"
            write_sd15_checkpoint(path, Path(a.shared))
            ours = bench_sdplan(path, 32, a.threads, a.repeat, tiny=False)
        ref = bench_ref(a.ref_python, "sd15", 32, a.threads, a.repeat)
        report("SD 1.5 size, 256x256 (32x32 latent, CFG batch 2)", ours, ref)
        results["sd15"] = {"sdplan": ours, "diffusers": ref}
    print(json.dumps(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
