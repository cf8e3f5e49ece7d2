"""The image sizes a model set can draw, from its files' headers alone (no weights loaded).

Every pipeline refuses a size that its latent cannot hold when it starts (the SD UNet needs
``vae factor * 2^(levels - 1)`` pixels per side so that each downsampling halves a whole
number of cells; the DiTs patchify 2x2 latent cells, so ``2 * vae factor``). The same rule,
read from the tensor shapes that :func:`~sdplan.core.modelfiles.checkpoint.read_model_files`
already has, lets ``generate`` refuse such a size before the engine loads anything.
"""

from __future__ import annotations

import math
import re

from sdplan.core.errors import InvalidArgument
from sdplan.core.families import family as registry_family
from sdplan.core.modelfiles.checkpoint import ModelSet

__all__ = ["check_size", "max_side", "size_multiple"]

#: Pixels per latent cell of every autoencoder these families ship with (SD, SDXL, SD3,
#: FLUX.1 and FLUX.2 VAEs all downsample 3 times).
DEFAULT_VAE_FACTOR = 8


_DOWNSAMPLE = re.compile(r"^(?:model\.diffusion_model\.)?input_blocks\.(\d+)\.0\.op\.weight$")
_POS_EMBED = re.compile(r"^(?:model\.diffusion_model\.)?pos_embed$")
_UNET_STEM = re.compile(r"^(?:model\.diffusion_model\.)?input_blocks\.0\.0\.weight$")
_VAE_LEVEL = re.compile(r"^(?:first_stage_model\.)?(decoder\.up|encoder\.down)\.(\d+)\.")
#: The Wan 2.2 autoencoder's decoder resamples (``decoder.upsamples.I.upsamples.J.resample.1``)
#: and its head (``decoder.head.2``: 3 colours in ``p x p`` patches).
_WAN22_UP = re.compile(r"^(?:first_stage_model\.|vae\.)?decoder\.upsamples\.\d+\.upsamples\.\d+\.resample\.1\.weight$")
_WAN22_HEAD = re.compile(r"^(?:first_stage_model\.|vae\.)?decoder\.head\.2\.weight$")


def _names(models: ModelSet, module: str) -> list[str]:
    return [t.info.name for t in models.module_tensors(module)]


def _vae_factor(models: ModelSet) -> int:
    """2^(levels - 1) of the set's autoencoder (``decoder.up.N`` or ``encoder.down.N``, as
    :func:`sdplan.core.models.vae.vae_config` counts them); for the Wan 2.2 autoencoder 2 per
    decoder resample times its head's patch side (16, as
    :func:`sdplan.core.models.wan22_vae.wan22_vae_config` reads it); else
    :data:`DEFAULT_VAE_FACTOR`."""
    tensors = models.module_tensors("vae")
    ups = sum(1 for t in tensors if _WAN22_UP.match(t.info.name))
    if ups:  # the Wan 2.2 autoencoder (sdplan.core.models.wan22_vae): 2 per resample times its patches
        head = next((t.info.shape[0] for t in tensors if _WAN22_HEAD.match(t.info.name)), 3)
        return 2 ** ups * max(1, round((int(head) // 3) ** 0.5))
    levels: dict[str, set[int]] = {"decoder.up": set(), "encoder.down": set()}
    for name in _names(models, "vae"):
        if m := _VAE_LEVEL.match(name):
            levels[m[1]].add(int(m[2]))
    n = len(levels["decoder.up"]) or len(levels["encoder.down"])
    return 2 ** (n - 1) if n else DEFAULT_VAE_FACTOR


def size_multiple(models: ModelSet) -> int | None:
    """Pixels that each image side must be a positive multiple of for ``models``, or None
    when the headers do not tell (an unknown family without sd-cli's UNet names, a layout other
    than sd-cli's names: the pipeline still checks when it starts). An unknown family with a
    UNet is taken as SD's (the engine runs it with the SD pipeline).

    The rule is the family's :attr:`~sdplan.core.families.declaration.Family.size_rule`.
    Source: the pipelines' own checks (:meth:`sdplan.core.pipelines.sd.pipeline.StableDiffusion.generate`
    for the UNet families: ``vae factor * 2 ** (len(channel_mult) - 1)``, e.g. 64 for SD 1.5, 32
    for SDXL; ``2 * vae factor`` = 16 for SD3; ``2 * vae_scale`` = 16 for Flux, Chroma, Z-Image
    and FLUX.2, whose pipelines take ``vae_scale`` 8 whatever the autoencoder). The UNet's levels are its
    downsamplings plus one (``input_blocks.N.0.op``, as
    :func:`sdplan.core.models.unet.unet_config` counts them), read from the names alone: this
    runs in the command's process, which does not load numpy or the model graphs.
    """
    fam = registry_family(models.architecture.family)
    rule = fam.size_rule if fam is not None else "unet"  # unknown with a UNet: the SD pipeline runs it
    if rule == "patch8":
        return 2 * DEFAULT_VAE_FACTOR
    if rule == "patch":
        return 2 * _vae_factor(models)
    names = _names(models, "diffusion")
    if not any(_UNET_STEM.match(n) for n in names):
        return None
    downsamples = {m[1] for n in names if (m := _DOWNSAMPLE.match(n))}
    return _vae_factor(models) * 2 ** len(downsamples)


def max_side(models: ModelSet) -> int | None:
    """The largest image side in pixels that ``models`` can draw, or None where there is no
    bound: a 2 x 2 patch DiT with a fixed ``pos_embed`` table ``(1, M*M, width)`` (SD3's MMDiT)
    holds at most ``M`` patches per side, ``M * size_multiple`` pixels (3072 for SD3-medium's
    M = 192). Source: the pipeline's own check
    (:meth:`sdplan.core.models.mmdit.MMDiT` graph inputs: a latent larger than ``pos_embed`` is
    refused)."""
    fam = registry_family(models.architecture.family)
    if fam is None or fam.size_rule != "patch":  # a 2 x 2 patch DiT; only SD3's has a fixed table
        return None
    shape = next((t.info.shape for t in models.module_tensors("diffusion") if _POS_EMBED.match(t.info.name)), None)
    f = size_multiple(models)
    if not shape or len(shape) < 2 or not f:
        return None
    return math.isqrt(int(shape[-2])) * f


def check_size(models: ModelSet, width: int, height: int, from_init_img: bool = False) -> None:
    """Refuse ``width`` x ``height`` (pixels) that ``models`` cannot draw, before anything loads.
    ``from_init_img``: the size is the ``-i`` picture's (no ``-W``/``-H`` given), which the
    message then names.

    Raises:
        InvalidArgument: a side that is not a positive multiple of :func:`size_multiple`, in
            the words of the pipeline's own check (``-W/-H 100x64: ...``), or one over
            :func:`max_side`.
    """
    f = size_multiple(models)
    if f and (width % f or height % f or width <= 0 or height <= 0):
        rule = f"this model draws sizes that are positive multiples of {f} pixels"
        if from_init_img:
            raise InvalidArgument(f"-i/--init-img is {width}x{height} and {rule}: give -W/-H "
                                  "(the picture is resized to them)")
        raise InvalidArgument(f"-W/-H {width}x{height}: {rule}")
    side = max_side(models)
    if side and max(width, height) > side:
        what = "-i/--init-img is" if from_init_img else "-W/-H"
        raise InvalidArgument(f"{what} {width}x{height}: this model draws sides up to {side} pixels "
                              "(the positions its DiT was trained with)")
