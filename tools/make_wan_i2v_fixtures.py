#!/usr/bin/env python3
"""Generate the Wan 2.2 I2V-A14B fixtures: two tiny seeded image-to-video DiT experts (diffusers
``WanTransformer3DModel`` with 36 input channels: the 16 noise channels, the 4-channel mask and
the 16 channels of the start picture's video latent; no ``img_emb``) and reference outputs of
diffusers' ``AutoencoderKLWan`` encoder and ``WanImageToVideoPipeline``.

Reuses ``wan_vae_tiny.safetensors`` and ``umt5_tiny.safetensors`` (written by
``tools/make_wan_fixtures.py``, whose converters and settings it imports). Run with the ``ref``
extra (torch, diffusers, transformers); nothing of sdplan is imported::

    /work/venv-ref/bin/python tools/make_wan_i2v_fixtures.py

Writes into ``tests/fixtures/``:

* ``wan_i2v_tiny.safetensors`` (the low-noise expert, ``--diffusion-model``) and
  ``wan_i2v_high_noise_tiny.safetensors`` (``--high-noise-diffusion-model``): the T2V fixture's
  layout (width 48, 2 heads of 24, 2 blocks, text width 32) with 36 input channels and 16
  output channels, in the original Wan names (checked against ``convert_wan_transformer_to_diffusers``).
* ``wan_i2v_ref.safetensors``:

  - ``enc.video`` ``(1, 3, 9, 32, 48)`` in [-1, 1] and ``enc.mean``: the mean of diffusers'
    ``AutoencoderKLWan.encode`` (first frame alone, then chunks of four with its causal cache;
    the quant convolution; the first 16 channels), ``(1, 16, 3, 4, 6)``; ``enc.mean1`` the
    mean of its first frame alone;
  - ``pipe.picture`` ``(32, 48, 3)`` uint8: the start picture (its PNG gives the same pixels);
    ``pipe.noise``; ``pipe.condition`` ``(1, 20, 2, 4, 6)``: the pipeline's mask and
    normalised picture latent (``prepare_latents``); ``pipe.sigmas``, ``pipe.latent`` and
    ``pipe.video``: a 4-step run of ``WanImageToVideoPipeline`` with both experts
    (``boundary_ratio`` 0.875, sd-cli's ``--moe-boundary`` default; the high-noise expert first)
    at 5 frames of 32x48 with sd-cli's discrete sigmas (shift 5), CFG 3.5 (high noise) and 2
    (low noise), the prompt's and the empty prompt's UMT5 states padded to 512 rows.

Matrices are stored in f16 (vectors f32) and every reference is computed in f32 from the
f16-rounded weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_wan_fixtures as base  # noqa: E402

OUT = base.OUT
DIT = {**base.DIT, "in_channels": 36, "out_channels": 16}
FRAMES, HEIGHT, WIDTH, STEPS = base.FRAMES, base.HEIGHT, base.WIDTH, base.STEPS


def load_vae():
    """diffusers ``AutoencoderKLWan`` holding ``wan_vae_tiny.safetensors``'s weights."""
    from diffusers import AutoencoderKLWan
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
    from safetensors.torch import load_file

    sd = {k: v.float() for k, v in load_file(str(OUT / "wan_vae_tiny.safetensors")).items()}
    vae = AutoencoderKLWan(**base.VAE)
    vae.load_state_dict(convert_wan_vae_to_diffusers(sd), strict=True)
    return vae.eval()


def load_umt5():
    """The seeded UMT5 of ``make_wan_fixtures`` checked against ``umt5_tiny.safetensors``."""
    from safetensors.torch import load_file

    model, sd = base.make_umt5()
    stored = load_file(str(OUT / "umt5_tiny.safetensors"))
    for k, v in sd.items():
        assert torch.equal(v.float(), stored[k].float()), k
    return model


def encode_mean(vae, video: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return vae.encode(torch.from_numpy(video)).latent_dist.mode().numpy()


def picture(height: int = HEIGHT, width: int = WIDTH, disc: tuple[int, int, int] = (30, 14, 81)) -> np.ndarray:
    """A smooth start picture (gradients and a disc at ``(x, y)`` of squared radius
    ``disc[2]``) as ``(height, width, 3)`` uint8."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 255 * x / (width - 1)
    g = 255 * y / (height - 1)
    b = np.where((x - disc[0]) ** 2 + (y - disc[1]) ** 2 < disc[2], 230.0, 40.0)
    return np.stack([r, g, b], -1).round().astype(np.uint8)


def pipeline(high, low, vae, cond, uncond, noise: np.ndarray, pic: np.ndarray) -> dict[str, np.ndarray]:
    from diffusers import WanImageToVideoPipeline
    from PIL import Image

    sched = base.sdcli_scheduler(STEPS)
    pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=sched,
                                   image_processor=None, image_encoder=None, transformer=high,
                                   transformer_2=low, boundary_ratio=base.BOUNDARY)
    image = Image.fromarray(pic)
    with torch.no_grad():
        pre = pipe.video_processor.preprocess(image, height=HEIGHT, width=WIDTH).float()
        _, condition = pipe.prepare_latents(pre, 1, 16, HEIGHT, WIDTH, FRAMES, torch.float32, torch.device("cpu"),
                                            None, torch.from_numpy(noise))
        latent = pipe(image=image, prompt_embeds=cond, negative_prompt_embeds=uncond, height=HEIGHT, width=WIDTH,
                      num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=3.5, guidance_scale_2=2.0,
                      latents=torch.from_numpy(noise), output_type="latent").frames
        mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
        video = vae.decode(latent * std + mean).sample
    return {"sigmas": sched.sigmas.numpy().astype(np.float32), "condition": condition.numpy(),
            "latent": latent.numpy(), "video": video.numpy()}


def main() -> None:
    from diffusers import WanTransformer3DModel
    from safetensors.numpy import save_file

    vae = load_vae()
    umt5 = load_umt5()
    low = base.randomize(WanTransformer3DModel(**DIT), 21, gain=1.0)
    high = base.randomize(WanTransformer3DModel(**DIT), 22, gain=1.0)
    wan_low, wan_high = base.dit_to_wan(low.state_dict()), base.dit_to_wan(high.state_dict())
    base.check_dit(wan_low, low)
    base.check_dit(wan_high, high)
    assert not any(k.startswith("img_emb.") for k in wan_low)

    rng = np.random.default_rng(7)
    video = np.tanh(rng.standard_normal((1, 3, 9, HEIGHT, WIDTH))).astype(np.float32)
    ref = {"enc.video": video, "enc.mean": encode_mean(vae, video), "enc.mean1": encode_mean(vae, video[:, :, :1])}

    pic = picture()
    cond = base.encode(umt5, base.prompt_ids(base.PROMPT), base.CONTEXT)
    uncond = base.encode(umt5, base.prompt_ids(""), base.CONTEXT)
    noise = rng.standard_normal((1, 16, (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8)).astype(np.float32)
    ref.update({"pipe.picture": pic, "pipe.noise": noise})
    for k, v in pipeline(high, low, vae, cond, uncond, noise, pic).items():
        ref[f"pipe.{k}"] = v

    head = {"sdplan.head_dim": str(DIT["attention_head_dim"])}
    save_file(base.to_numpy(wan_low), str(OUT / "wan_i2v_tiny.safetensors"), metadata=head)
    save_file(base.to_numpy(wan_high), str(OUT / "wan_i2v_high_noise_tiny.safetensors"), metadata=head)
    save_file({k: np.ascontiguousarray(v) for k, v in ref.items()}, str(OUT / "wan_i2v_ref.safetensors"))
    for name in ("wan_i2v_tiny", "wan_i2v_high_noise_tiny", "wan_i2v_ref"):
        print(name, (OUT / f"{name}.safetensors").stat().st_size, "bytes")


if __name__ == "__main__":
    main()
