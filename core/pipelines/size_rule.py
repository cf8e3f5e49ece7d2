"""The image sizes a model set can draw, from its files' headers alone (no weights loaded).

Every pipeline refuses a size that its latent cannot hold when it starts (the SD UNet needs
``vae factor * 2^(levels - 1)`` pixels per side so that each downsampling halves a whole
number of cells; the DiTs patchify 2x2 latent cells, so ``2 * vae factor``). The same rule,
read from the tensor shapes that :func:`~sdplan.core.modelfiles.checkpoint.read_model_files`
already has, lets ``generate`` refuse such a size before the engine loads anything.
"""

from __future__ import annotations

from sdplan.core.errors import InvalidArgument, SdplanError
from sdplan.core.modelfiles.checkpoint import ModelSet

__all__ = ["check_size", "size_multiple"]

#: Families whose diffusion model is a UNet (factor: VAE factor times 2^(levels - 1)).
UNET_FAMILIES = ("sd1", "sd2", "sdxl")
#: Families whose diffusion model patchifies 2x2 latent cells (factor: twice the VAE's).
PATCH_FAMILIES = ("sd3", "flux", "chroma", "z_image", "flux2_klein", "flux2")
#: Pixels per latent cell of every autoencoder these families ship with (SD, SDXL, SD3,
#: FLUX.1 and FLUX.2 VAEs all downsample 3 times).
DEFAULT_VAE_FACTOR = 8


def _shapes(models: ModelSet, module: str) -> dict[str, tuple[int, ...]]:
    return {t.info.name: tuple(t.info.shape) for t in models.module_tensors(module)}


def _vae_factor(models: ModelSet) -> int:
    from sdplan.core.models import vae

    shapes = _shapes(models, "vae")
    for prefix in (vae.PREFIX, ""):
        try:
            return vae.vae_config(shapes, prefix).factor
        except (SdplanError, KeyError, IndexError, ValueError):
            continue
    return DEFAULT_VAE_FACTOR


def size_multiple(models: ModelSet) -> int | None:
    """Pixels that each image side must be a positive multiple of for ``models``, or None
    when the headers do not tell (an unknown family, a layout other than sd-cli's names: the
    pipeline still checks when it starts).

    Source: the pipelines' own checks (:meth:`sdplan.core.pipelines.sd.StableDiffusion.generate`
    for the UNet families: ``vae factor * 2 ** (len(channel_mult) - 1)``, e.g. 64 for SD 1.5, 32
    for SDXL; ``2 * vae factor`` = 16 for the patchifying DiTs).
    """
    family = models.architecture.family
    if family in PATCH_FAMILIES:
        return 2 * _vae_factor(models)
    if family not in UNET_FAMILIES:
        return None
    from sdplan.core.models import unet

    shapes = _shapes(models, "diffusion")
    try:
        cfg = unet.unet_config(shapes, family, prefix=unet.find_prefix(shapes))
    except (SdplanError, KeyError, IndexError, ValueError):
        return None
    return _vae_factor(models) * 2 ** (len(cfg.channel_mult) - 1)


def check_size(models: ModelSet, width: int, height: int) -> None:
    """Refuse ``width`` x ``height`` (pixels) that ``models`` cannot draw, before anything loads.

    Raises:
        InvalidArgument: a side that is not a positive multiple of :func:`size_multiple`, in
            the words of the pipeline's own check (``-W/-H 100x64: ...``).
    """
    f = size_multiple(models)
    if f and (width % f or height % f or width <= 0 or height <= 0):
        raise InvalidArgument(f"-W/-H {width}x{height}: this model draws sizes that are "
                              f"positive multiples of {f} pixels")
