"""One SDXL-size UNet step and the SDXL VAE decode on sdplan's engine against diffusers on
the CPU, same threads, same random weights, in one script (it needs torch: run it with the
``ref`` environment, e.g. ``.venv-ref/bin/python bench/bench_sdxl.py``).

The UNet is diffusers' ``UNet2DConditionModel`` with SDXL base's published configuration
(2.57 B parameters: levels 320/640/1280, transformer depths 1/2/10, context 2048, vector
2816) and the VAE its ``AutoencoderKL`` (scaling factor 0.13025), randomly initialised by
torch (seed 0) and rounded to fp16. The same weights are written once, streamed, as an
original-layout single file (``model.diffusion_model.``, ``first_stage_model.``; fp16, about
5.3 GB in a temporary folder, removed afterwards) that sdplan's runners read.

Measured (best of ``--repeat`` after one warm-up call, seconds): one sampling step at
512x512 with classifier-free guidance (the UNet on a batch of 2: 64x64 latents, 77-token
contexts, vectors), and the decode of one 64x64 latent to 512x512. Reported as ratios
sdplan / diffusers (below 1: sdplan faster), with each side's output difference (max abs
error over max |diffusers|) as a check that both computed the same thing. diffusers runs
first and is freed before sdplan loads (peak memory about 11 GB, diffusers' f32 weights).

Usage: ``python bench/bench_sdxl.py [--threads 2] [--repeat 2]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import struct
import sys
import tempfile
import time
from pathlib import Path

import _timing
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "fixtures"))

#: stabilityai/stable-diffusion-xl-base-1.0 unet/config.json and vae/config.json
UNET_CONFIG = dict(sample_size=128, in_channels=4, out_channels=4, layers_per_block=2,
                   block_out_channels=(320, 640, 1280),
                   down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                   up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                   transformer_layers_per_block=(1, 2, 10), attention_head_dim=(5, 10, 20),
                   cross_attention_dim=2048, use_linear_projection=True, addition_embed_type="text_time",
                   addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816)
VAE_CONFIG = dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2,
                  block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
                  up_block_types=("UpDecoderBlock2D",) * 4, scaling_factor=0.13025, sample_size=1024)
LATENT = 64  # 512x512 pixels


def write_single_file(path: Path, tensors: dict) -> int:
    """Stream ``name -> torch tensor`` as fp16 safetensors (one tensor in memory at a time)."""
    import torch

    header, off = {}, 0
    for name, t in tensors.items():
        n = t.numel() * 2
        header[name] = {"dtype": "F16", "shape": list(t.shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        for t in tensors.values():
            fh.write(t.detach().to(torch.float16).contiguous().numpy().tobytes())
    return off


def diffusers_side(folder: Path, threads: int, repeat: int) -> tuple[dict, dict]:
    import convert_ldm
    import torch
    from diffusers import AutoencoderKL, UNet2DConditionModel

    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)
    torch.manual_seed(0)
    unet = UNet2DConditionModel(**UNET_CONFIG).eval()
    vae = AutoencoderKL(**VAE_CONFIG).eval()
    for m in (unet, vae):
        for p in m.parameters():
            p.data = p.data.half().float()
    params = sum(p.numel() for p in unet.parameters())
    assert params == 2_567_463_684, params  # SDXL base's UNet
    ckpt = {**convert_ldm.unet_to_ldm(unet.state_dict(), dict(unet.config)),
            **convert_ldm.vae_to_ldm(vae.state_dict(), dict(vae.config))}
    t0 = time.perf_counter()
    nbytes = write_single_file(folder / "sdxl_random.safetensors", ckpt)
    print(f"wrote {nbytes / 2**30:.2f} GiB of random SDXL weights in {time.perf_counter() - t0:.0f} s")
    del ckpt
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 4, LATENT, LATENT, generator=g)
    ctx = torch.randn(2, 77, 2048, generator=g)
    pooled = torch.randn(2, 1280, generator=g)
    time_ids = torch.tensor([[512.0, 512, 0, 0, 512, 512]] * 2)
    t = torch.tensor([500.0, 500.0])
    vec = torch.cat([pooled, unet.add_time_proj(time_ids.flatten()).reshape(2, -1)], -1)
    cond = {"text_embeds": pooled, "time_ids": time_ids}
    z = torch.randn(1, 4, LATENT, LATENT, generator=g)
    out: dict = {}
    ins = {"x": x.numpy(), "t": t.numpy(), "c": ctx.numpy(), "vec": vec.numpy(), "z": z.numpy()}
    out["step"] = _timing.best(lambda: out.__setitem__(
        "y", unet(x, t, encoder_hidden_states=ctx, added_cond_kwargs=cond).sample.numpy()), repeat, warmup=1)
    out["decode"] = _timing.best(lambda: out.__setitem__("image", vae.decode(z).sample.numpy()), repeat, warmup=1)
    return out, ins


def sdplan_side(path: Path, ins: dict, threads: int, repeat: int) -> dict:
    from sdplan.core.modelfiles.readers import read_tensor_file
    from sdplan.core.models import unet as unet_m
    from sdplan.core.models import vae as vae_m
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner
    from sdplan.core.runtime.weights import WeightFile

    shapes = {t.name: tuple(t.shape) for t in read_tensor_file(path).tensors}
    pool = BackendPool(BackendManager(cpu_threads=threads))
    out: dict = {}
    try:
        names = {n: n for n in shapes if n.startswith(unet_m.PREFIX)}
        cfg = unet_m.unet_config(shapes, "sdxl")
        runner = ModuleRunner(unet_m.UNetGraph(cfg, names), WeightFile(path, list(names)),
                              ModulePlacement(("CPU",)), pool, name="diffusion", n_threads=threads)
        feed = {k: np.ascontiguousarray(ins[k], dtype=np.float32) for k in ("x", "t", "c", "vec")}
        t0 = time.perf_counter()
        runner.prepare()
        print(f"sdplan: UNet weights loaded in {time.perf_counter() - t0:.0f} s")
        out["step"] = _timing.best(lambda: out.__setitem__("y", runner.run(feed)["y"]), repeat, warmup=1)
        runner.release()
        vnames = {n: n for n in shapes if n.startswith(vae_m.PREFIX)}
        vrun = ModuleRunner(vae_m.VaeGraph(vae_m.vae_config(shapes), vnames), WeightFile(path, list(vnames)),
                            ModulePlacement(("CPU",)), pool, name="vae", n_threads=threads)
        z = {"z": np.ascontiguousarray(ins["z"], dtype=np.float32)}
        out["decode"] = _timing.best(lambda: out.__setitem__("image", vrun.run(z)["image"]), repeat, warmup=1)
        vrun.release()
    finally:
        pool.manager.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sdplan-bench-sdxl-") as d:
        ref, ins = diffusers_side(Path(d), a.threads, a.repeat)
        gc.collect()
        ours = sdplan_side(Path(d) / "sdxl_random.safetensors", ins, a.threads, a.repeat)
    print(f"\n== SDXL size, 512x512 (64x64 latent), UNet step with CFG (batch 2), VAE decode; "
          f"{a.threads} threads")
    print(f"{'':8} {'sdplan s':>10} {'diffusers s':>12} {'ratio':>7} {'out diff':>9}")
    rows = {}
    for k, o in (("step", "y"), ("decode", "image")):
        diff = float(np.abs(ours[o] - ref[o]).max() / np.abs(ref[o]).max())
        rows[k] = {"sdplan_s": ours[k], "diffusers_s": ref[k], "ratio": ours[k] / ref[k], "out_diff": diff}
        print(f"{k:8} {ours[k]:10.2f} {ref[k]:12.2f} {ours[k] / ref[k]:7.2f} {diff:9.1e}")
    print(json.dumps(rows), file=sys.stderr)
    return 0 if all(math.isfinite(r["ratio"]) for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
