#!/usr/bin/env python3
"""Generate the Wan 2.2 TI2V-5B image-to-video references: diffusers' ``WanImageToVideoPipeline``
with ``expand_timesteps`` (the TI2V-5B config: the start picture encoded alone by the Wan 2.2
autoencoder as the first latent frame, the first-frame mask, per-token timesteps with the
first frame's tokens at 0, the first frame put back after every step) on the tiny TI2V
fixtures, and the DiT's output with per-token timesteps.

Reuses ``wan_ti2v_tiny.safetensors``, ``wan22_vae_tiny.safetensors`` (rebuilt here from
``make_wan22_fixtures``' seeds and checked equal to the stored files) and
``umt5_tiny.safetensors``. Run with the ``ref`` extra (torch, diffusers, transformers); nothing
of sdplan is imported::

    /work/venv-ref/bin/python tools/make_wan_ti2v_i2v_fixtures.py

Writes ``tests/fixtures/wan_ti2v_i2v_ref.safetensors``:

* ``dit.latent`` ``(1, 48, 2, 4, 6)``, ``dit.context``, ``dit.timestep`` ``(2,)`` (the timestep
  of each latent frame: 0 and 700) and ``dit.out``: ``WanTransformer3DModel`` with the timestep
  ``(1, 12)`` per token (each frame's 6 tokens at its frame's timestep), as the pipeline calls it;
* ``pipe.picture`` ``(64, 96, 3)`` uint8: the start picture (its PNG gives the same pixels);
  ``pipe.condition`` ``(1, 48, 1, 4, 6)``: the picture's normalised latent
  (``prepare_latents``); ``pipe.noise``; ``pipe.sigmas``, ``pipe.latent`` and ``pipe.video``:
  a 4-step run at 5 frames of 64x96 with sd-cli's discrete sigmas (shift 5), CFG 3.5, the
  prompt's and the empty prompt's UMT5 states padded to 512 rows.

Every reference is computed in f32 from the fixtures' f16-rounded weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_wan22_fixtures as w22  # noqa: E402
import make_wan_fixtures as w21  # noqa: E402
import make_wan_i2v_fixtures as i2v  # noqa: E402

OUT = w21.OUT
FRAMES, HEIGHT, WIDTH, STEPS, CFG = w22.FRAMES, w22.HEIGHT, w22.WIDTH, w22.STEPS, w22.CFG


def same_as_stored(ours: dict, name: str) -> None:
    from safetensors.torch import load_file

    stored = load_file(str(OUT / name))
    assert set(stored) == set(ours), name
    for k, v in ours.items():
        assert torch.equal(v.float(), stored[k].float()), (name, k)


def picture() -> np.ndarray:
    """The start picture of ``make_wan_i2v_fixtures`` at this size, its disc scaled with it."""
    return i2v.picture(HEIGHT, WIDTH, (60, 28, 300))


def dit_out(dit, latent: np.ndarray, context: np.ndarray, frame_t: list[float]) -> np.ndarray:
    tokens_per_frame = (latent.shape[3] // 2) * (latent.shape[4] // 2)
    ts = torch.tensor([[t for t in frame_t for _ in range(tokens_per_frame)]], dtype=torch.float32)
    with torch.no_grad():
        return dit(hidden_states=torch.from_numpy(latent), timestep=ts,
                   encoder_hidden_states=torch.from_numpy(context), return_dict=False)[0].numpy()


def pipeline(dit, vae, cond, uncond, noise: np.ndarray, pic: np.ndarray) -> dict[str, np.ndarray]:
    from diffusers import WanImageToVideoPipeline
    from PIL import Image

    sched = w21.sdcli_scheduler(STEPS)
    pipe = WanImageToVideoPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=sched,
                                   image_processor=None, image_encoder=None, transformer=dit,
                                   expand_timesteps=True)
    assert pipe.vae_scale_factor_spatial == 16
    image = Image.fromarray(pic)
    with torch.no_grad():
        pre = pipe.video_processor.preprocess(image, height=HEIGHT, width=WIDTH).float()
        _, condition, mask = pipe.prepare_latents(pre, 1, 48, HEIGHT, WIDTH, FRAMES, torch.float32,
                                                  torch.device("cpu"), None, torch.from_numpy(noise))
        assert float(mask[0, 0, 0].abs().max()) == 0.0 and float(mask[0, 0, 1:].min()) == 1.0
        latent = pipe(image=image, prompt_embeds=cond, negative_prompt_embeds=uncond, height=HEIGHT, width=WIDTH,
                      num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=CFG,
                      latents=torch.from_numpy(noise), output_type="latent").frames
        mean = torch.tensor(w22.MEAN).view(1, 48, 1, 1, 1)
        std = torch.tensor(w22.STD).view(1, 48, 1, 1, 1)
        video = vae.decode(latent * std + mean).sample
    return {"sigmas": sched.sigmas.numpy().astype(np.float32), "condition": condition.numpy(),
            "latent": latent.numpy(), "video": video.numpy()}


def main() -> None:
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from safetensors.numpy import save_file

    umt5 = i2v.load_umt5()
    dit = w21.randomize(WanTransformer3DModel(**w22.DIT), 21, gain=1.0)
    same_as_stored(dit_to := w21.dit_to_wan(dit.state_dict()), "wan_ti2v_tiny.safetensors")
    w21.check_dit(dit_to, dit)
    vae = w21.randomize(AutoencoderKLWan(**w22.VAE), 25, gain=1.0)
    same_as_stored(w22.vae_to_wan22(vae), "wan22_vae_tiny.safetensors")

    rng = np.random.default_rng(17)
    latent = rng.standard_normal((1, 48, 2, 4, 6)).astype(np.float32)
    context = rng.standard_normal((1, 9, w22.DIT["text_dim"])).astype(np.float32)
    frame_t = [0.0, 700.0]
    ref = {"dit.latent": latent, "dit.context": context, "dit.timestep": np.array(frame_t, np.float32),
           "dit.out": dit_out(dit, latent, context, frame_t)}

    pic = picture()
    cond = w21.encode(umt5, w21.prompt_ids(w21.PROMPT), w21.CONTEXT)
    uncond = w21.encode(umt5, w21.prompt_ids(""), w21.CONTEXT)
    noise = rng.standard_normal((1, 48, (FRAMES - 1) // 4 + 1, HEIGHT // 16, WIDTH // 16)).astype(np.float32)
    ref.update({"pipe.picture": pic, "pipe.noise": noise})
    for k, v in pipeline(dit, vae, cond, uncond, noise, pic).items():
        ref[f"pipe.{k}"] = v
    path = OUT / "wan_ti2v_i2v_ref.safetensors"
    save_file({k: np.ascontiguousarray(v) for k, v in ref.items()}, str(path))
    print(path.name, path.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
