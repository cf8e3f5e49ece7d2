#!/usr/bin/env python3
"""Generate the Wan 2.2 TI2V-5B fixtures: a tiny seeded 48-channel Wan DiT (diffusers
``WanTransformer3DModel``) and a tiny Wan 2.2 autoencoder (diffusers ``AutoencoderKLWan`` with
``is_residual=True``, ``z_dim`` 48, ``patch_size`` 2) in the original Wan names sd-cli reads, with
reference outputs.

Run with the ``ref`` extra (torch, diffusers, transformers); nothing of sdplan is imported (the
UMT5 encoder, the DiT's name conversion and the seeded weights are ``make_wan_fixtures``')::

    /work/venv-ref/bin/python tools/make_wan22_fixtures.py

Writes into ``tests/fixtures/``:

* ``wan_ti2v_tiny.safetensors``: the DiT of ``make_wan_fixtures`` (width 48, 2 heads of 24, 2
  blocks, FFN 64, text width 32) with 48 input and output channels: the TI2V-5B layout.
* ``wan22_vae_tiny.safetensors``: the autoencoder (encoder base width 8, decoder base width 8,
  multipliers (1, 2, 4, 4), two residual blocks per level, temporal downsampling (False, True,
  True), 12 image channels: 3 colours in 2x2 patches, so 16x spatial and 4x temporal) in the
  original Wan 2.2 names: ``{encoder.downsamples,decoder.upsamples}.I.{downsamples,upsamples}.J``
  (diffusers' ``down_blocks.I.resnets.J`` / ``downsampler`` and ``up_blocks.I.resnets.J`` /
  ``upsampler``), the rest as Wan 2.1's (``conv1``, ``conv2``, ``middle``, ``head``).
* ``wan22_ref.safetensors``: the decoder's output (unclamped, unpatchified) on random latents of
  1, 2 and 3 frames (frame by frame with its causal cache and ``first_chunk`` as
  ``AutoencoderKLWan._decode`` runs it); the encoder's mean on a random video of 9 frames and on
  its first frame (``_encode``: the first frame alone, then 4 at a time); the DiT's output on a random latent
  ``(1, 48, 2, 4, 6)``; a 4-step run of diffusers' ``WanPipeline`` with ``expand_timesteps``
  (the TI2V-5B config: per-token timesteps, the 16x autoencoder) at 5 frames of 64x96 with
  sd-cli's sigmas (shift 5), CFG 3.5, the prompt's and the empty prompt's states padded to 512
  rows: the sigmas, the final latent and the decoded video.

Matrices are stored in f16 (vectors f32) and every reference is computed in f32 from the
f16-rounded weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_wan_fixtures as w21  # noqa: E402

OUT = w21.OUT
DIT = dict(w21.DIT, in_channels=48, out_channels=48)
#: Wan 2.2's published latent statistics (``Wan2.2-TI2V-5B-Diffusers/vae/config.json``).
MEAN = [-0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
        0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
        -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
        -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667]
STD = [0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
       0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
       0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
       0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744]
VAE = dict(base_dim=8, decoder_base_dim=8, z_dim=48, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
           temperal_downsample=[False, True, True], is_residual=True, in_channels=12, out_channels=12,
           patch_size=2, scale_factor_temporal=4, scale_factor_spatial=16, latents_mean=MEAN, latents_std=STD)
FRAMES, HEIGHT, WIDTH = 5, 64, 96
STEPS = 4
CFG = 3.5


# --------------------------------------------------------------------------- autoencoder names

def vae_to_wan22(vae) -> dict:
    """diffusers ``AutoencoderKLWan(is_residual=True)`` names -> the original Wan 2.2 names."""
    n_res = {"encoder": VAE["num_res_blocks"], "decoder": VAE["num_res_blocks"] + 1}
    out = {}
    for k, v in vae.state_dict().items():
        name = next((b + k[len(a):] for a, b in w21.TOP.items() if k == a or k.startswith(a + ".")), None)
        if name is None:
            part, rest = k.split(".", 1)
            if rest.startswith("mid_block."):
                kind, i, tail = rest[len("mid_block."):].split(".", 2)
                idx = {"resnets": {"0": 0, "1": 2}, "attentions": {"0": 1}}[kind][i]
                name = f"{part}.middle.{idx}.{w21.resname(tail) if kind == 'resnets' else tail}"
            else:
                blocks, outer = ("down_blocks.", "downsamples") if part == "encoder" else ("up_blocks.", "upsamples")
                i, kind, tail = rest[len(blocks):].split(".", 2)
                if kind == "resnets":
                    j, tail = tail.split(".", 1)
                    name = f"{part}.{outer}.{i}.{outer}.{j}.{w21.resname(tail)}"
                elif kind in ("downsampler", "upsampler"):
                    name = f"{part}.{outer}.{i}.{outer}.{n_res[part]}.{tail}"
        if name is None:
            raise KeyError(f"unconverted tensor {k}")
        out[name] = v
    return out


def vae_decode_raw(vae, z: np.ndarray) -> np.ndarray:
    """The decoder's output for ``(1, 48, T, h, w)`` frame by frame with its causal cache and
    ``first_chunk`` on the first (``AutoencoderKLWan._decode``), unpatchified, before its clamp."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

    vae.clear_cache()
    with torch.no_grad():
        x = vae.post_quant_conv(torch.from_numpy(z))
        outs = []
        for i in range(x.shape[2]):
            vae._conv_idx = [0]
            outs.append(vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx,
                                    first_chunk=i == 0))
        out = unpatchify(torch.cat(outs, 2), patch_size=2)
    vae.clear_cache()
    return out.numpy()


def vae_encode_mean(vae, video: np.ndarray) -> np.ndarray:
    """The mean of the latent of ``(1, 3, F, H, W)`` (``AutoencoderKLWan._encode``: patchified,
    the first frame alone and then 4 frames at a time with the causal cache, ``quant_conv``)."""
    with torch.no_grad():
        enc = vae._encode(torch.from_numpy(video))
    return enc[:, :VAE["z_dim"]].numpy()


# --------------------------------------------------------------------------- pipeline

def pipeline(dit, vae, cond: torch.Tensor, uncond: torch.Tensor, noise: np.ndarray) -> dict[str, np.ndarray]:
    from diffusers import WanPipeline

    sched = w21.sdcli_scheduler(STEPS)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=sched, transformer=dit,
                       expand_timesteps=True)
    assert pipe.vae_scale_factor_spatial == 16
    with torch.no_grad():
        latent = pipe(prompt_embeds=cond, negative_prompt_embeds=uncond, height=HEIGHT, width=WIDTH,
                      num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=CFG,
                      latents=torch.from_numpy(noise), output_type="latent").frames
        mean = torch.tensor(MEAN).view(1, 48, 1, 1, 1)
        std = torch.tensor(STD).view(1, 48, 1, 1, 1)
        video = vae.decode(latent * std + mean).sample
    return {"sigmas": sched.sigmas.numpy().astype(np.float32), "latent": latent.numpy(), "video": video.numpy()}


def main() -> None:
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from safetensors.numpy import save_file

    umt5, _ = w21.make_umt5()
    ids, neg = w21.prompt_ids(w21.PROMPT), w21.prompt_ids("")
    dit = w21.randomize(WanTransformer3DModel(**DIT), 21, gain=1.0)
    wan_dit = w21.dit_to_wan(dit.state_dict())
    w21.check_dit(wan_dit, dit)
    rng = np.random.default_rng(7)
    latent = rng.standard_normal((1, 48, 2, 4, 6)).astype(np.float32)
    context = rng.standard_normal((1, 9, DIT["text_dim"])).astype(np.float32)
    ref = {"dit.latent": latent, "dit.context": context, "dit.sigma": np.array([0.7], np.float32),
           "dit.out": w21.dit_out(dit, latent, context, 0.7)}

    vae = w21.randomize(AutoencoderKLWan(**VAE), 25, gain=1.0)
    wan_vae = vae_to_wan22(vae)
    assert len(wan_vae) == len(vae.state_dict())
    z = rng.standard_normal((1, 48, 3, 4, 6)).astype(np.float32)
    ref.update({"vae.z": z, "vae.decoded3": vae_decode_raw(vae, z), "vae.decoded2": vae_decode_raw(vae, z[:, :, :2]),
                "vae.decoded1": vae_decode_raw(vae, z[:, :, :1])})

    video = np.random.default_rng(11).uniform(-1, 1, (1, 3, 9, HEIGHT, WIDTH)).astype(np.float32)
    ref.update({"enc.video": video, "enc.mean9": vae_encode_mean(vae, video),
                "enc.mean1": vae_encode_mean(vae, video[:, :, :1])})

    cond, uncond = w21.encode(umt5, ids, w21.CONTEXT), w21.encode(umt5, neg, w21.CONTEXT)
    noise = rng.standard_normal((1, 48, (FRAMES - 1) // 4 + 1, HEIGHT // 16, WIDTH // 16)).astype(np.float32)
    ref["pipe.noise"] = noise
    for k, v in pipeline(dit, vae, cond, uncond, noise).items():
        ref[f"pipe.{k}"] = v

    head = {"sdplan.head_dim": str(DIT["attention_head_dim"])}
    save_file(w21.to_numpy(wan_dit), str(OUT / "wan_ti2v_tiny.safetensors"), metadata=head)
    save_file(w21.to_numpy(wan_vae), str(OUT / "wan22_vae_tiny.safetensors"))
    save_file({k: np.ascontiguousarray(v) for k, v in ref.items()}, str(OUT / "wan22_ref.safetensors"))
    for name in ("wan_ti2v_tiny", "wan22_vae_tiny", "wan22_ref"):
        print(name, (OUT / f"{name}.safetensors").stat().st_size, "bytes")


if __name__ == "__main__":
    main()
