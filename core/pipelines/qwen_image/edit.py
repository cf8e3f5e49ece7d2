"""Qwen-Image Edit's conditioning of reference pictures (``-r/--ref-image``), as sd-cli does it
(stable-diffusion.cpp ``conditioner.hpp`` ``LLMEmbedder`` for Qwen-Image with reference
pictures and an encoder with a vision tower; ``stable-diffusion.cpp``'s reference latents with
the ``qwen`` reference-image preset):

* prompt: Qwen-Image-Edit-2509's template (diffusers ``QwenImageEditPlusPipeline``'s) for every
  Edit model: the system text of :data:`EDIT_TEMPLATE`, then ``Picture k: <|vision_start|>``,
  one ``<|image_pad|>`` per merged token of picture ``k``, ``<|vision_end|>`` for each picture,
  the prompt, the suffix; the states of the template's first :data:`EDIT_DROP` (64) tokens
  dropped (the pictures' tokens stay);
* the vision tower's picture: the picture's sides rounded to multiples of 28, then scaled (area
  kept, sides floored to 28) to at most 560 x 560 pixels or (sides ceiled) to at least 384 x 384
  (:func:`vl_size`), resized nearest with the aspect kept and centre-cropped (sd-cli's
  ``clip_preprocess``), CLIP-normalised;
* the reference latent: the picture resized nearest to the area ``min(1024^2, W H)`` of the
  output at the picture's aspect, sides rounded to multiples of 32 (:func:`vae_size`), encoded
  to the autoencoder's mean and normalised, its tokens after the image's at frame index 1, 2, ...
  (the DiT's ``RefIndexMode::INCREASE``);
* Qwen-Image-Edit-2511: the DiT's ``zero_cond_t`` (reference tokens modulated at ``t = 0``),
  set by the DiT file's ``__index_timestep_zero__`` tensor or the ``qwen_image_zero_cond_t``
  override (sd-cli's ``--model-args qwen_image_zero_cond_t=true``).

Where diffusers differs: ``QwenImageEditPlusPipeline`` sizes the vision tower's picture to an
area of 384^2 (sides multiples of 32, then the processor's rounding to 28) with PIL's resampling,
and the reference latent to an area of 1024^2 whatever the output size; the first
``QwenImageEditPipeline`` (Qwen-Image-Edit) has no ``Picture k:`` prefix. transformers gives a
picture's tokens M-RoPE positions over (time, row, column); sd-cli's Qwen2.5-VL counts every
token on (its 3-D positions are Qwen3-VL's only): :data:`POSITIONS` picks (sd-cli's by default).
The DiT centres a reference grid of odd side ``n`` at ``-(n // 2)`` (sd-cli), diffusers at
``-(n - n // 2)``, and starts the text positions after the image's grid alone (sd-cli), diffusers
after the largest of the image's and the references' grids.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from sdplan.core.models.qwen25vl_vision import MERGE, PATCH, patchify
from sdplan.core.pipelines.flux2.pipeline import resize_nearest

__all__ = ["EDIT_TEMPLATE", "EDIT_DROP", "PICTURE", "POSITIONS", "vl_size", "vae_size", "vl_picture",
           "edit_prefix", "VL_MIN", "VL_MAX", "VAE_MAX_PIXELS", "VAE_FACTOR"]

#: The Edit template (prefix, suffix): sd-cli's and diffusers' ``QwenImageEditPlusPipeline``'s.
EDIT_TEMPLATE = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
                 "objects, background), then explain how the user's text instruction should alter or modify the "
                 "image. Generate a new image that meets the user's requirements while maintaining consistency "
                 "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n",
                 "<|im_end|>\n<|im_start|>assistant\n")
#: Tokens of the Edit template's prefix dropped from the states (``prompt_template_encode_start_idx``).
EDIT_DROP = 64
#: One picture's part of the prompt (``{k}``: 1, 2, ...; ``{pads}``: its ``<|image_pad|>`` tokens).
PICTURE = "Picture {k}: <|vision_start|>{pads}<|vision_end|>"
#: The encoder's positions of a prompt with pictures: ``sd-cli`` (every token counts on) or
#: ``mrope`` (transformers' M-RoPE rows over the pictures' grids).
POSITIONS = ("sd-cli", "mrope")
#: sd-cli's bounds of the vision tower's picture (pixels a side of the equal-area square).
VL_MIN, VL_MAX = 384, 560
#: sd-cli's largest reference-latent picture (pixels) and its side multiple for Qwen-Image.
VAE_MAX_PIXELS, VAE_FACTOR = 1024 * 1024, 32


def vl_size(width: int, height: int) -> tuple[int, int]:
    """``(width, height)`` of the vision tower's picture for a ``width x height`` reference
    (sd-cli's ``resize_image_dims`` in area mode, factor 28 = patch 14 x merge 2): the sides
    rounded to multiples of 28; above 560^2 pixels both scaled by ``sqrt(area / 560^2)`` and
    floored, below 384^2 scaled up and ceiled (to multiples of 28, at least 28)."""
    f = PATCH * MERGE
    w = math.floor(width / f + 0.5) * f  # std::round: halves away from zero
    h = math.floor(height / f + 0.5) * f
    if w * h > VL_MAX ** 2:
        beta = math.sqrt(height * width / VL_MAX ** 2)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif w * h < VL_MIN ** 2:
        beta = math.sqrt(VL_MIN ** 2 / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return max(f, w), max(f, h)


def vae_size(width: int, height: int, ref_width: int, ref_height: int) -> tuple[int, int]:
    """``(width, height)`` sd-cli resizes a ``ref_width x ref_height`` reference to before
    encoding it for a ``width x height`` output: the area ``min(1024^2, width height)`` at the
    reference's aspect (sd-cli's integer division ``area * ref_width / ref_height`` under the
    square root), sides rounded to multiples of 32, at least 32."""
    area = min(VAE_MAX_PIXELS, width * height)
    w = math.sqrt(area * ref_width // ref_height)
    h = w * ref_height / ref_width
    f = VAE_FACTOR
    return max(f, int(math.floor(w / f + 0.5)) * f), max(f, int(math.floor(h / f + 0.5)) * f)


def vl_picture(picture: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
    """The vision tower's patches of a reference ``picture`` u8 ``(H, W, 3)``: resized nearest
    to cover :func:`vl_size` with its aspect kept (the larger of the two scales, float32 as
    sd-cli), centre-cropped, then :func:`~sdplan.core.models.qwen25vl_vision.patchify`. Returns
    f32 ``(N, 1176)`` and the patch grid ``(1, h, w)``."""
    h, w = picture.shape[:2]
    tw, th = vl_size(w, h)
    scale = max(np.float32(tw) / np.float32(w), np.float32(th) / np.float32(h))
    rw, rh = int(scale * np.float32(w)), int(scale * np.float32(h))
    resized = resize_nearest(picture, rw, rh)
    y0, x0 = max((rh - th) // 2, 0), max((rw - tw) // 2, 0)
    return patchify(resized[y0:y0 + th, x0:x0 + tw])


def edit_prefix(grids: Sequence[tuple[int, int, int]]) -> str:
    """The Edit template's prefix with each picture's part for patch grids ``grids``."""
    parts = "".join(PICTURE.format(k=k + 1, pads="<|image_pad|>" * (t * h * w // (MERGE * MERGE)))
                    for k, (t, h, w) in enumerate(grids))
    return EDIT_TEMPLATE[0] + parts

