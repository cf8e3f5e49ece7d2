"""Wan 2.2 TI2V-5B image to video: the start picture's latent as the first latent frame, held
there while the other frames are sampled.

As sd-cli runs it (stable-diffusion.cpp ``generate_video`` for ``Wan2.2-TI2V-5B`` with an init
image, ``sample`` with its ``denoise_mask``, ``process_timesteps``; ``wan.hpp`` with a timestep
per frame):

* the picture (``-i/--init-img``, read as for Wan 2.2 I2V-A14B:
  :func:`~sdplan.core.pipelines.wan.i2v.start_picture`) encoded alone, one frame, by the Wan 2.2
  autoencoder and normalised ``(z - mean) / std``: the first latent frame ``first``
  ``(1, 48, 1, h, w)``;
* the start latent ``init (1 - sigma_0) + noise sigma_0`` (the flow denoiser's noise scaling)
  with ``init`` ``first`` on frame 0 and zeros elsewhere;
* every DiT call (both CFG passes) sees ``first`` on frame 0 in place of the sampled latent,
  with the timestep 0 on that frame and ``1000 sigma`` on the others
  (:meth:`~sdplan.core.models.wan.WanDiT.inputs` with ``frame_sigmas``);
* after every call the x0 estimate's frame 0 is ``first`` (the denoised latent blended with the
  condition by the mask) before the sampler uses it, so the sampled frame 0 ends on ``first``.

diffusers' ``WanImageToVideoPipeline`` with ``expand_timesteps`` (TI2V-5B's config) feeds the
DiT the same input and timesteps (one per token, the same within a frame) but leaves the
sampled frame 0 alone and puts ``first`` back only at the end; the other frames get the same
values with the deterministic samplers (frame 0 never reaches the DiT). sdplan follows sd-cli.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["first_frame", "start_latent", "model_input", "frame_sigmas", "keep_first"]


def first_frame(latent: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """The first latent frame ``(1, z, 1, h, w)`` float32 of the encoder's mean ``latent``
    ``(1, z, h, w)`` of the picture alone, normalised ``(latent - mean) / std`` (``mean``,
    ``std``: ``(1, z, 1, 1, 1)``)."""
    z = np.asarray(latent, np.float32)[:, :, None]
    return np.ascontiguousarray((z - mean) / std, dtype=np.float32)


def start_latent(noise: np.ndarray, first: np.ndarray, sigma: float) -> np.ndarray:
    """sd-cli's start ``init (1 - sigma) + noise sigma`` ``(1, z, T, h, w)`` float32 with
    ``init`` ``first`` on frame 0 and zeros on the others."""
    s = np.float32(sigma)
    x = (np.asarray(noise, np.float32) * s).astype(np.float32)
    x[:, :, :1] += np.asarray(first, np.float32) * (np.float32(1.0) - s)
    return x


def model_input(x: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The DiT's latent: ``x`` ``(1, z, T, h, w)`` with frame 0 replaced by ``first``."""
    z = np.array(x, np.float32, copy=True)
    z[:, :, :1] = first
    return z


def frame_sigmas(frames: int, sigma: float) -> np.ndarray:
    """``(frames,)`` float32: 0 on the picture's frame, ``sigma`` on the others."""
    out = np.full(frames, sigma, np.float32)
    out[0] = 0.0
    return out


def keep_first(denoise: Any, first: np.ndarray) -> Any:
    """A denoiser whose x0 estimate holds ``first`` on frame 0 (sd-cli blends the guided
    estimate only; a CFG++ sampler's unconditional one is left as it is)."""

    def blended(d: np.ndarray) -> np.ndarray:
        out = np.array(d, np.float32, copy=True)
        out[:, :, :1] = first
        return out

    def den(x: np.ndarray, s: float) -> np.ndarray:
        return blended(denoise(x, s))

    pair = getattr(denoise, "with_uncond", None)

    def both(x: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray]:
        if pair is None:
            d = blended(denoise(x, s))
            return d, d
        g, u = pair(x, s)
        return blended(g), u

    den.with_uncond = both  # type: ignore[attr-defined]
    return den
