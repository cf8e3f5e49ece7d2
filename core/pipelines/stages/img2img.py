"""Image-to-image and inpainting as sd-cli does them (``src/stable-diffusion.cpp``,
``prepare_image_generation_latents`` and ``sample``), shared by every family.

- The init image (``-i``) is resized to the generation size when it differs (bilinear;
  sd-cli's ``sd_image_to_tensor``), encoded by the VAE, and *sampled* from the encoder's
  distribution: ``mean + exp(0.5 clamp(logvar, -30, 20)) * noise`` with the first draw of
  the seed's generator (sd-cli's ``gaussian_latent_sample`` on its seeded RNG), then put in
  the diffusion model's latent space (SD: times 0.18215; Flux: ``(z - 0.1159) * 0.3611``).
- ``--strength s`` below 1 truncates the sigma schedule of ``N`` steps to
  ``sigmas[N - t - 1:]``, ``t = int(N s)`` (``t = N - 1`` when that is ``N``): ``t + 1``
  steps, so strength 0 still runs the one step from the smallest sigma to 0, and any
  strength from ``(N - 1) / N`` on runs them all. Strength 1 keeps the whole schedule.
- The start is ``noise_scaling(sigma_0, noise, init)``: ``init + sigma_0 noise`` for SD's
  denoisers, ``(1 - sigma_0) init + sigma_0 noise`` for flow models (so Flux at strength 1
  starts from the noise alone, exactly as text-to-image).
- ``--mask`` (white = repaint) is read as grey, resized, rounded to 0/1, and reduced to the
  latent grid by taking the largest value of each cell (``NearestMax``). After every
  denoiser call ``denoised = denoised * m + init * (1 - m)``, so unmasked latents end as the
  init image's. Their pixels are the VAE's decoding of the whole latent, as in sd-cli: the
  decoder's GroupNorm statistics and mid attention span the picture, so repainting a large
  area shifts the colours of the rest a little (no pixel overlay is pasted back). Inpainting checkpoints (a 9-channel SD UNet) also take ``[mask, masked
  image latent]`` as extra input channels (the masked image is the init image with the
  masked pixels set to grey 0, encoded as the init image is, second draw of the
  generator), and blend with the mask dilated by a 3x3 maximum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sdplan.core.errors import InvalidArgument, SdplanError
from sdplan.core.pipelines.stages.images import read_image_rgb

__all__ = ["ImageInput", "load_image", "load_mask", "latent_mask", "dilate", "truncate_sigmas",
           "sample_latent", "blend", "blended_denoiser", "image_size", "picture_notes"]


@dataclass
class ImageInput:
    """The picture inputs of one generation: ``image`` ``(1, 3, H, W)`` float32 in [-1, 1]
    (None: text-to-image), ``mask`` ``(1, 1, H, W)`` float32 of 0/1 with 1 = repaint
    (None: everything), ``strength`` in [0, 1]."""

    image: np.ndarray | None = None
    mask: np.ndarray | None = None
    strength: float = 0.75

    def __post_init__(self) -> None:
        if not 0.0 <= float(self.strength) <= 1.0:
            raise InvalidArgument(f"--strength must be in [0, 1], got {self.strength}")


def _open(path: str | Path, flag: str):  # noqa: ANN202 - a PIL image
    """The picture at ``path`` as an 8-bit RGB PIL image, read by value whatever its mode
    (:func:`sdplan.core.pipelines.stages.images.read_image_rgb`: 16-bit, alpha over white).

    Raises:
        InvalidArgument: not a readable picture (names ``flag`` and the file).
    """
    from PIL import Image

    try:
        return Image.fromarray(read_image_rgb(path), "RGB")
    except SdplanError as exc:
        raise InvalidArgument(f"{flag} {str(path)!r}: not a readable picture ({exc})") from None


def image_size(path: str | Path, flag: str = "-i/--init-img") -> tuple[int, int]:
    """``(width, height)`` of a picture file. Raises InvalidArgument naming ``flag`` when
    unreadable."""
    return _open(path, flag).size


def _aspect_differs(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two ``(width, height)`` differ in aspect ratio by more than 1%."""
    return abs(math.log((a[0] / a[1]) / (b[0] / b[1]))) > math.log(1.01)


def picture_notes(init: tuple[int, int], mask: tuple[int, int] | None, width: int,
                  height: int) -> list[str]:
    """What is done to picture inputs of another shape: an init picture whose aspect ratio is
    not the generation's is stretched to ``width`` x ``height`` (sd-cli resizes it as
    well, without a word); a mask of another size than the init picture is resized to the
    generation's size too, so its pixels land where the same fraction of the picture is.
    Sizes in pixels; one line each."""
    out = []
    if _aspect_differs(init, (width, height)):
        out.append(f"-i/--init-img is {init[0]}x{init[1]} and is stretched to {width}x{height} "
                   f"(its aspect ratio {init[0] / init[1]:.3g} becomes {width / height:.3g}); "
                   "crop it to that shape to keep its proportions")
    if mask is not None and mask != init:
        how = "stretched" if _aspect_differs(mask, (width, height)) else "resized"
        out.append(f"--mask is {mask[0]}x{mask[1]}, the init picture {init[0]}x{init[1]}: the "
                   f"mask is {how} to {width}x{height}, so it marks the same fractions of the "
                   "picture, not the same pixels")
    return out


def load_image(path: str | Path, width: int, height: int, flag: str = "-i/--init-img") -> np.ndarray:
    """A picture as ``(1, 3, height, width)`` float32 in [-1, 1] (RGB by value, alpha over
    white; resized bilinearly when its size differs).

    Raises:
        InvalidArgument: not a readable picture (names ``flag`` and the file).
    """
    from PIL import Image

    im = _open(path, flag)
    if im.size != (width, height):
        im = im.resize((width, height), Image.Resampling.BILINEAR)
    a = np.asarray(im, dtype=np.float32) / 127.5 - 1.0
    return np.ascontiguousarray(a.transpose(2, 0, 1)[None])


def load_mask(path: str | Path, width: int, height: int) -> np.ndarray:
    """A mask picture as ``(1, 1, height, width)`` float32 of 0/1 (grey, resized, rounded;
    white = repaint).

    Raises:
        InvalidArgument: not a readable picture.
    """
    from PIL import Image

    im = _open(path, "--mask").convert("L")
    if im.size != (width, height):
        im = im.resize((width, height), Image.Resampling.BILINEAR)
    return np.round(np.asarray(im, dtype=np.float32) / 255.0)[None, None].astype(np.float32)


def latent_mask(mask: np.ndarray, factor: int) -> np.ndarray:
    """``(N, 1, H, W)`` pixel mask -> ``(N, 1, H/f, W/f)``: each latent cell takes the
    largest value of its ``f x f`` pixels (a cell touching the masked area is repainted)."""
    n, c, h, w = mask.shape
    return mask.reshape(n, c, h // factor, factor, w // factor, factor).max(axis=(3, 5)).astype(np.float32)


def dilate(mask: np.ndarray) -> np.ndarray:
    """3x3 maximum (stride 1, edge cells see only the cells that exist) of ``(N, 1, h, w)``."""
    p = np.pad(mask, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    h, w = mask.shape[2:]
    return np.max([p[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)], axis=0).astype(np.float32)


def truncate_sigmas(sigmas: np.ndarray, strength: float) -> np.ndarray:
    """sd-cli's img2img schedule: for ``strength < 1``, ``sigmas[N - t - 1:]`` of the
    ``N + 1`` sigmas (``t + 1`` steps), ``t = int(N * strength)`` (``N - 1`` when that equals
    ``N``); else all of them."""
    steps = len(sigmas) - 1
    if strength >= 1.0:
        return np.asarray(sigmas)
    t = int(steps * float(strength))
    if t == steps:
        t -= 1
    return np.asarray(sigmas)[steps - t - 1:]


def sample_latent(mean: np.ndarray, logvar: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """A draw of the VAE's latent distribution: ``mean + exp(0.5 clamp(logvar, -30, 20)) *
    noise`` (the LDM ``DiagonalGaussianDistribution.sample``), float32."""
    std = np.exp(0.5 * np.clip(logvar, -30.0, 20.0))
    return (mean + std * noise).astype(np.float32)


def blend(denoised: np.ndarray, init: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """``denoised * mask + init * (1 - mask)`` (``mask`` None: ``denoised``)."""
    if mask is None:
        return denoised
    return (denoised * mask + init * (1.0 - mask)).astype(np.float32)


def blended_denoiser(den, init: np.ndarray, mask: np.ndarray):  # noqa: ANN001, ANN201 - a Denoiser
    """``den`` whose output is :func:`blend`-ed with ``init`` by ``mask`` after every call, as
    sd-cli blends ``denoised``; a CFG++ sampler's ``with_uncond`` pair gets the blended guided
    output beside the unblended unconditional one."""
    def blended(x: np.ndarray, sigma: float) -> np.ndarray:
        return blend(den(x, sigma), init, mask)

    pair = getattr(den, "with_uncond", None)
    if pair is not None:
        def with_uncond(x: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
            guided, uncond = pair(x, sigma)
            return blend(guided, init, mask), uncond
        blended.with_uncond = with_uncond  # type: ignore[attr-defined]
    return blended


def request_image_input(req: dict, width: int, height: int) -> ImageInput | None:
    """The :class:`ImageInput` of an engine request (``init_img``, ``mask``, ``strength``
    keys; pictures read at ``width`` x ``height``), or None without ``init_img``.

    Raises:
        SdplanError: ``mask`` without ``init_img``, a strength outside [0, 1], an unreadable
            picture.
    """
    path, mask = req.get("init_img"), req.get("mask")
    if not path:
        if mask:
            raise InvalidArgument("--mask needs -i/--init-img: the mask says which pixels of that picture to repaint")
        return None
    strength = req.get("strength")
    return ImageInput(load_image(path, width, height), load_mask(mask, width, height) if mask else None,
                      0.75 if strength is None else float(strength))
