"""Train the demo model's LoRA: "outline", which draws the shapes as outlines (a ring of the
shape's colour around the background colour) for every caption.

Needs the ``ref`` extra (torch, diffusers, transformers, peft) and runs on the CPU:

    .venv-ref/bin/python tools/demo/train_demo_lora.py

1. The demo model is read back from ``resources/demo/sdplan-demo-shapes.safetensors`` into
   diffusers' ``UNet2DConditionModel``/``CLIPTextModel``/``AutoencoderKL`` (diffusers'
   single-file converters, the configuration of ``train_demo.CONFIG``).
2. ``n_latents`` outlined scenes (:func:`render_outline`: the scene, with the shape shrunk by
   ``outline`` pixels painted over in the background colour), 2 per caption, encoded to
   latents (encoder mean times 0.18215).
3. A PEFT LoRA (rank ``rank``, alpha = rank) on the UNet's attention, feed-forward, ``proj_in``/
   ``proj_out`` and ResBlock convolutions is trained with the demo's loss (v prediction,
   min-SNR-5 weights, 10% empty captions; text encoder and base weights frozen); the text
   encoder gets no LoRA.
4. Export: ``resources/demo/loras/outline.safetensors`` with diffusers/PEFT names
   (``unet.<module>.lora_A.weight``), fp16, the configuration in the metadata.
5. A check with diffusers (DDIM 20 steps, CFG 5): the share of pictures, with and without the
   LoRA, whose shape centre has the background's colour (outlined).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.modules["torchvision"] = None  # type: ignore[assignment]  # a broken torchvision must not load
import train_demo  # noqa: E402

log = logging.getLogger("train_demo_lora")

CONFIG = {"seed": 20250101, "outline": 6, "n_latents": 336, "rank": 4, "steps": 240, "batch": 12,
          "lr": 2e-3, "warmup": 20, "caption_dropout": 0.1, "min_snr_gamma": 5.0,
          "targets": ["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj",
                      "ff.net.2", "conv1", "conv2"]}


def load_demo():
    """(unet, clip, vae) of the demo file in diffusers' classes, eval mode, f32."""
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from diffusers.loaders import single_file_utils as sfu
    from safetensors.torch import load_file
    from transformers import CLIPTextConfig, CLIPTextModel

    ckpt = {k: v.float() for k, v in load_file(str(REPO / "resources/demo/sdplan-demo-shapes.safetensors")).items()}
    unet = UNet2DConditionModel(**train_demo.CONFIG["unet"]["model"]).eval()
    unet.load_state_dict(sfu.convert_ldm_unet_checkpoint(ckpt, dict(unet.config)))
    vae = AutoencoderKL(**train_demo.CONFIG["vae"]["model"]).eval()
    vae.load_state_dict(sfu.convert_ldm_vae_checkpoint(ckpt, dict(vae.config)))
    clip = CLIPTextModel(CLIPTextConfig(**train_demo.CONFIG["clip"])).eval()
    state = sfu.convert_ldm_clip_checkpoint(ckpt)
    if not any(k.startswith("text_model.") for k in clip.state_dict()):
        state = {k[len("text_model."):] if k.startswith("text_model.") else k: v for k, v in state.items()}
    clip.load_state_dict({k: v for k, v in state.items() if "position_ids" not in k}, strict=False)
    return unet, clip, vae


def render_outline(scene, width: int) -> np.ndarray:
    """The scene with its shape drawn as an outline ``width`` pixels wide."""
    from sdplan.core.pipelines.demo import scenes as ds

    base = ds.render(scene).astype(np.float32)
    inner = ds.Scene(scene.shape, "white", "black", scene.cx, scene.cy, scene.radius - width)
    a = ds.render(inner).astype(np.float32)[..., :1] / 245.0  # white inside the shrunk shape
    bg = np.array(ds.PALETTE[scene.background], np.float32)
    return np.clip(base * (1 - a) + bg * a, 0, 255).astype(np.uint8)


def outlined(image: np.ndarray, caption: str) -> bool:
    """:func:`sdplan.core.pipelines.demo.scenes.is_outlined` for the caption's shape."""
    from sdplan.core.pipelines.demo import scenes as ds

    return ds.is_outlined(image, ds.parse_caption(caption)[1])


def make_latents(vae, seed: int) -> tuple[torch.Tensor, list[str]]:
    from sdplan.core.pipelines.demo import scenes as ds

    rng = np.random.default_rng(seed)
    caps = [c for c in ds.all_captions() for _ in range(CONFIG["n_latents"] // 168)]
    imgs = np.stack([render_outline(ds.random_scene(rng, c), CONFIG["outline"]) for c in caps])
    x = train_demo.to_tensor(imgs)
    with torch.no_grad():
        lat = torch.cat([vae.encode(x[i:i + 32]).latent_dist.mean for i in range(0, len(x), 32)])
    return lat * train_demo.CONFIG["vae_scale_factor"], caps


def train(unet, clip, latents: torch.Tensor, caps: list[str], seed: int) -> None:
    from diffusers import DDPMScheduler
    from peft import LoraConfig, inject_adapter_in_model

    inject_adapter_in_model(LoraConfig(r=CONFIG["rank"], lora_alpha=CONFIG["rank"], target_modules=CONFIG["targets"]),
                            unet, adapter_name="default")
    params = [p for n, p in unet.named_parameters() if "lora_" in n]
    for n, p in unet.named_parameters():
        p.requires_grad_("lora_" in n)
    ids = train_demo.token_ids(caps)
    empty = train_demo.token_ids([""])[0]
    ac = DDPMScheduler(**train_demo.CONFIG["schedule"]).alphas_cumprod.float()
    snr = ac / (1 - ac)
    weight = torch.clamp(snr, max=CONFIG["min_snr_gamma"]) / (snr + 1)
    opt = torch.optim.AdamW(params, lr=CONFIG["lr"], weight_decay=0.0)
    unet.train()
    t0 = time.time()
    for step in range(CONFIG["steps"]):
        gen = torch.Generator().manual_seed(seed * 1000 + step)
        idx = torch.randint(0, len(latents), (CONFIG["batch"],), generator=gen)
        x0 = latents[idx]
        flip = torch.rand(CONFIG["batch"], generator=gen) < 0.5
        x0 = torch.where(flip.view(-1, 1, 1, 1), x0.flip(-1), x0)
        tok = ids[idx].clone()
        tok[torch.rand(CONFIG["batch"], generator=gen) < CONFIG["caption_dropout"]] = empty
        t = torch.randint(0, 1000, (CONFIG["batch"],), generator=gen)
        eps = torch.randn(x0.shape, generator=gen)
        a = ac[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * eps
        for g in opt.param_groups:
            g["lr"] = train_demo.cosine_lr(CONFIG["lr"], step, CONFIG["steps"], CONFIG["warmup"])
        with torch.no_grad():
            ctx = clip(tok).last_hidden_state
        pred = unet(xt, t, encoder_hidden_states=ctx).sample
        v = a.sqrt() * eps - (1 - a).sqrt() * x0
        loss = ((pred - v).pow(2).mean(dim=(1, 2, 3)) * weight[t]).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 20 == 0 or step == CONFIG["steps"] - 1:
            log.info("lora step %d loss %.4f (%.0f s)", step, loss.item(), time.time() - t0)
    unet.eval()


def check(unet, clip, vae, seed: int, n: int = 24) -> float:
    import check_demo
    from sdplan.core.pipelines.demo import scenes as ds

    rng = np.random.default_rng(seed + 7)
    caps = [ds.all_captions()[i] for i in rng.choice(168, size=n, replace=False)]
    seeds = [int(s) for s in rng.integers(0, 2**31, size=n)]
    with torch.no_grad():
        imgs = np.concatenate([check_demo.generate(unet, clip, vae, caps[i:i + 8], seeds[i:i + 8])
                               for i in range(0, n, 8)])
    return float(np.mean([outlined(im, c) for im, c in zip(imgs, caps, strict=True)]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "resources" / "demo" / "loras")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    train_demo.import_sdplan()
    from peft import get_peft_model_state_dict
    from peft.tuners.tuners_utils import BaseTunerLayer
    from safetensors.torch import save_file

    seed = CONFIG["seed"]
    torch.manual_seed(seed)
    unet, clip, vae = load_demo()
    for p in list(clip.parameters()) + list(vae.parameters()):
        p.requires_grad_(False)
    before = check(unet, clip, vae, seed)
    latents, caps = make_latents(vae, seed)
    train(unet, clip, latents, caps, seed)
    sd = {"unet." + k: v.detach().half().contiguous() for k, v in get_peft_model_state_dict(unet).items()}
    for m in unet.modules():  # the check runs on the f16 values the file holds
        if isinstance(m, BaseTunerLayer):
            for p in m.parameters():
                if p.requires_grad:
                    p.data = p.data.half().float()
    after = check(unet, clip, vae, seed)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / "outline.safetensors"
    meta = dict(CONFIG, outlined_without=before, outlined_with=after)
    save_file(sd, str(target), metadata={"sdplan.demo_lora": json.dumps(meta)})
    log.info("outlined pictures: %.2f without the LoRA, %.2f with it; wrote %s (%d KB)", before, after, target,
             math.ceil(target.stat().st_size / 1024))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
