"""Generate with the demo model in diffusers and measure the pictures against their captions.

Needs the ``ref`` extra. Reads the shipped single-file checkpoint, converts it back with
diffusers' own single-file converters (so the file itself is what is tested), samples
``--n`` trained captions with DDIM (20 steps, CFG 5, SD 1.x settings), and scores each picture
with :func:`sdplan.core.pipelines.demo.scenes.caption_matches`. Writes a contact sheet PNG.

    /work/venv-ref/bin/python tools/demo/check_demo.py --n 48 --sheet /tmp/demo_sheet.png
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_demo  # noqa: E402

log = logging.getLogger("check_demo")


def load_file_models(path: Path):
    """(unet, clip, vae, config) built from the checkpoint's metadata and weights (float32)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.loaders import single_file_utils as sfu
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import CLIPTextConfig, CLIPTextModel

    with safe_open(str(path), "pt") as f:
        cfg = json.loads(f.metadata()["sdplan.demo"])
    ckpt = {k: v.float() for k, v in load_file(str(path)).items()}
    unet = UNet2DConditionModel(**cfg["unet"]["model"])
    unet.load_state_dict(sfu.convert_ldm_unet_checkpoint(ckpt, dict(unet.config)))
    vae = AutoencoderKL(**cfg["vae"]["model"])
    vae.load_state_dict(sfu.convert_ldm_vae_checkpoint(ckpt, dict(vae.config)))
    clip = CLIPTextModel(CLIPTextConfig(**cfg["clip"]))
    sd = sfu.convert_ldm_clip_checkpoint(ckpt)
    own = clip.state_dict()
    sd = {
        (k[len("text_model.") :] if k not in own and k.startswith("text_model.") else k): v
        for k, v in sd.items()
    }
    missing, unexpected = clip.load_state_dict(sd, strict=False)
    bad = [k for k in missing + unexpected if not k.endswith("position_ids")]
    if bad:
        raise RuntimeError(f"CLIP weights do not fit: {bad[:5]}")
    return unet.eval(), clip.eval(), vae.eval(), cfg


@torch.no_grad()
def generate(unet, clip, vae, captions, seeds, steps=20, cfg_scale=5.0, sampler="ddim"):
    """uint8 images ``(N, 128, 128, 3)`` for ``captions`` with per-image ``seeds``."""
    from diffusers import DDIMScheduler, EulerDiscreteScheduler

    kw = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
              prediction_type=train_demo.CONFIG["schedule"]["prediction_type"])
    if sampler == "ddim":
        sch = DDIMScheduler(**kw, clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    else:
        sch = EulerDiscreteScheduler(**kw, steps_offset=1)
    ids = train_demo.token_ids(list(captions))
    empty = train_demo.token_ids([""]).expand(len(captions), -1)
    ctx = torch.cat([clip(empty).last_hidden_state, clip(ids).last_hidden_state])
    lat = torch.stack(
        [torch.randn(4, 16, 16, generator=torch.Generator().manual_seed(s)) for s in seeds]
    )
    sch.set_timesteps(steps)
    lat = lat * sch.init_noise_sigma
    for t in sch.timesteps:
        inp = sch.scale_model_input(torch.cat([lat, lat]), t)
        eu, ec = unet(inp, t, encoder_hidden_states=ctx).sample.chunk(2)
        lat = sch.step(eu + cfg_scale * (ec - eu), t, lat).prev_sample
    img = vae.decode(lat / 0.18215).sample
    img = ((img.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1)
    return img.numpy()


def contact_sheet(images: np.ndarray, path: Path, cols: int = 8) -> None:
    from PIL import Image

    n = len(images)
    rows = -(-n // cols)
    sheet = Image.new("RGB", (cols * 132, rows * 132), (128, 128, 128))
    for i, im in enumerate(images):
        sheet.paste(Image.fromarray(im), ((i % cols) * 132 + 2, (i // cols) * 132 + 2))
    sheet.save(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--model",
        type=Path,
        default=train_demo.REPO / "resources/demo/sdplan-demo-shapes.safetensors",
    )
    ap.add_argument("--work", type=Path, help="score the training checkpoint here instead")
    ap.add_argument("--n", type=int, default=48)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--cfg-scale", type=float, default=5.0)
    ap.add_argument("--sampler", choices=["ddim", "euler"], default="ddim")
    ap.add_argument("--sheet", type=Path, default=Path("/tmp/sdplan_demo_sheet.png"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(2)
    train_demo.import_sdplan()
    from sdplan.core.pipelines.demo import scenes as ds

    if args.work:
        unet, clip, vae = train_demo.load_trained(args.work)
    else:
        unet, clip, vae, cfg = load_file_models(args.model)
        train_demo.CONFIG["schedule"] = cfg["schedule"]
    rng = np.random.default_rng(args.seed)
    caps = [ds.all_captions()[i] for i in rng.choice(168, size=args.n, replace=args.n > 168)]
    seeds = [int(s) for s in rng.integers(0, 2**31, size=args.n)]
    t0 = time.time()
    imgs = np.concatenate(
        [
            generate(
                unet,
                clip,
                vae,
                caps[i : i + 8],
                seeds[i : i + 8],
                args.steps,
                args.cfg_scale,
                args.sampler,
            )
            for i in range(0, args.n, 8)
        ]
    )
    rates = ds.caption_match_rates(imgs, caps)
    log.info("%d pictures in %.1f s; match rates %s", args.n, time.time() - t0, rates)
    log.info("chance: background 0.125, color 0.143, shape 0.333, all 0.006")
    contact_sheet(imgs[:32], args.sheet)
    (args.sheet.with_suffix(".txt")).write_text("\n".join(caps[:32]) + "\n")
    print(json.dumps({"n": args.n, "sampler": args.sampler, "rates": rates}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
