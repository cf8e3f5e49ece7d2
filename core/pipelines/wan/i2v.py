"""Wan 2.2 I2V-A14B's condition: the start picture as sd-cli reads it, the video the autoencoder
encodes, and the mask and normalised picture latent beside the noise (36 DiT inputs).

As sd-cli builds it (stable-diffusion.cpp ``prepare_video_generation_latents`` for
``Wan2.2-I2V-14B``; diffusers ``WanImageToVideoPipeline.prepare_latents`` alike):

* the picture (``-i/--init-img``) cropped to the video's aspect ratio about its centre and
  resized to the video's size (``load_sd_image_from_file``: crop sides ``(int)(height *
  dst_aspect)`` in float32, then ``stbir_resize`` with a box filter in the sRGB colour space);
* the video to encode: the picture as frame 0 and every later frame 0.5 grey in [0, 1]
  (0 in [-1, 1]), ``frames`` frames, encoded as a whole with the causal encoder to
  ``(frames - 1) / 4 + 1`` latent frames, normalised ``(z - mean) / std``;
* the mask: four channels, 1 over the first latent frame, 0 elsewhere;
* the DiT's input: ``[noise (16), mask (4), picture latent (16)]`` along the channels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["start_picture", "crop_box", "condition_video", "condition", "MASK_CHANNELS"]

#: The mask's channels (the temporal factor: one per frame of a latent frame).
MASK_CHANNELS = 4


def _to_linear(u8: np.ndarray) -> np.ndarray:
    c = u8.astype(np.float32) / 255.0
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4).astype(np.float32)


def _to_srgb(lin: np.ndarray) -> np.ndarray:
    lin = np.clip(lin, 0.0, 1.0)
    c = np.where(lin <= 0.0031308, lin * 12.92, 1.055 * lin ** (1 / 2.4) - 0.055)
    return np.clip(np.round(c * 255.0), 0, 255).astype(np.uint8)


def crop_box(width: int, height: int, out_w: int, out_h: int) -> tuple[int, int, int, int]:
    """``(x, y, w, h)`` of the centred crop of a ``width`` x ``height`` picture to the aspect
    ratio of ``out_w`` x ``out_h`` (sd-cli's float32 arithmetic and truncation), at least one
    pixel each way (a 1 x 4000 picture cropped for a wide video truncates to no rows, which
    would start the video from black)."""
    dst = np.float32(out_w) / np.float32(out_h)
    src = np.float32(width) / np.float32(height)
    if src > dst:
        w = max(1, int(np.float32(height) * dst))
        return (width - w) // 2, 0, w, height
    if src < dst:
        h = max(1, int(np.float32(width) / dst))
        return 0, (height - h) // 2, width, h
    return 0, 0, width, height


def start_picture(path: str | Path, width: int, height: int) -> np.ndarray:
    """The ``-i`` picture as ``(1, 3, height, width)`` float32 in [-1, 1], cropped and resized as
    sd-cli does (module docstring; the box filter is Pillow's, in linear light).

    Raises:
        InvalidArgument: not a readable picture (naming ``-i/--init-img``).
    """
    from PIL import Image
    from sdplan.core.pipelines.stages.img2img import _open

    im = _open(path, "-i/--init-img")
    rgb = np.asarray(im, dtype=np.uint8)
    if im.size != (width, height):
        x, y, w, h = crop_box(im.size[0], im.size[1], width, height)
        lin = _to_linear(rgb[y:y + h, x:x + w])
        chans = [np.asarray(Image.fromarray(np.ascontiguousarray(lin[..., c]), "F").resize(
            (width, height), Image.Resampling.BOX)) for c in range(3)]
        rgb = _to_srgb(np.stack(chans, -1))
    a = rgb.astype(np.float32) / 255.0 * 2.0 - 1.0
    return np.ascontiguousarray(a.transpose(2, 0, 1)[None])


def condition_video(picture: np.ndarray, frames: int) -> np.ndarray:
    """The video the autoencoder encodes: ``(frames, 3, H, W)`` float32, frame 0 the picture
    ``(1, 3, H, W)`` in [-1, 1], the others 0 (sd-cli's 0.5 grey)."""
    pic = np.asarray(picture, np.float32)
    video = np.zeros((frames, *pic.shape[1:]), np.float32)
    video[0] = pic[0]
    return video


def condition(latent: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """The 20 condition channels ``(1, 4 + z, T, h, w)`` float32: the mask (1 on latent frame 0)
    then ``(latent - mean) / std`` of the encoder's mean ``latent`` ``(T, z, h, w)``
    (``mean``, ``std``: the per-channel statistics broadcast over ``(1, z, 1, 1, 1)``)."""
    z = np.transpose(np.asarray(latent, np.float32), (1, 0, 2, 3))[None]  # (1, z, T, h, w)
    z = (z - mean) / std
    mask = np.zeros((1, MASK_CHANNELS, *z.shape[2:]), np.float32)
    mask[:, :, 0] = 1.0
    return np.ascontiguousarray(np.concatenate([mask, z], axis=1), dtype=np.float32)
