"""Compute buffers of sdplan's own engine, by formula, where no dry run can measure them.

When the model files are at hand, ``sdplan generate`` and ``sdplan plan -m`` measure the
compute buffers with a dry-run reserve of the engine's own graphs
(:mod:`sdplan.core.pipelines.compute`): exact for that size, attention path and
convolution method. This module is for a profile alone (``--model-profile``, a saved
profile, the board before files are read): per-pixel figures fitted to those dry runs for
the architectures the engine runs, at real size (``../shared/models`` layouts, F16 weights;
bench/bench_estimate.py prints estimate against measured peak and refits them).

Fitted figures (bytes; CPU backend with AVX2+FMA, ggml 0.20.2; one latent per batch entry,
CFG doubles the UNet's batch):

- SD 1.x / 2.x UNet (320 channels, flash attention for its self- and cross-attention):
  :data:`UNET_BYTES_PER_PX` per image pixel per UNet batch entry (measured 444-460 from
  256 to 2048 px; the largest is used).
- SD VAE decoder (128..512 channels at image size, 3x3 convolutions): :data:`VAE_BYTES_PER_PX`
  per image pixel: 2816 when a single image is at least :data:`VAE_WIDE_PX` pixels wide
  (the Winograd F(4x4,3x3) path), 3328 otherwise (batches, narrow images).
- CLIP-L / OpenCLIP text encoders: :data:`TE_BYTES_PER_CHUNK` per 77-token chunk
  (1.49 MB measured for CLIP-L; one chunk per prompt of up to 75 tokens).
"""

from __future__ import annotations

from sdplan.core.families import family_of

UNET_BYTES_PER_PX = 460
VAE_BYTES_PER_PX = {"wide": 2816, "narrow": 3328}
VAE_WIDE_PX = 640
TE_BYTES_PER_CHUNK = 1_600_000



def sdplan_compute_bytes(module: str, architecture: str | None, *, width: int, height: int,
                         batch: int, cfg: bool = True) -> int | None:
    """Compute-buffer bytes of ``module`` on sdplan's engine from the fitted figures above,
    or None when they do not cover this module and architecture.

    Args:
        module: ``te``, ``diffusion`` or ``vae``.
        architecture: the profile's architecture (``sd1``, ``sd2``, ...).
        width, height: image size in pixels; batch: images per run.
        cfg: classifier-free guidance (the UNet runs both halves as one batch of 2*batch).
    """
    fam = family_of(architecture)
    if fam is None or not fam.fitted_compute:  # the figures were fitted on SD 1.x / 2.x
        return None
    pixels = width * height
    if module == "diffusion":
        return UNET_BYTES_PER_PX * pixels * batch * (2 if cfg else 1)
    if module == "vae":
        key = "wide" if batch == 1 and width >= VAE_WIDE_PX else "narrow"
        return VAE_BYTES_PER_PX[key] * pixels * batch
    if module == "te":
        return TE_BYTES_PER_CHUNK
    return None
