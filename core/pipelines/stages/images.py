"""Input pictures of any mode Pillow reads, as 8-bit RGB arrays.

Pillow's ``convert("RGB")`` clips deep modes instead of scaling them (a 16-bit picture
becomes almost white) and drops alpha, showing whatever colour transparent pixels happen to
hold. :func:`to_rgb8` converts by value instead:

- ``I;16*`` (16-bit) and ``I`` (32-bit integer, which Pillow uses for 16-bit PNGs): divided
  by 257 when the mode or the values are 16-bit (``max > 255``), kept otherwise; ``F``
  (float): values in [0, 1] scaled by 255, others clipped to [0, 255];
- alpha (``RGBA``, ``LA``, ``PA``, ``La``, ``RGBa``, palette transparency): composited over
  white, as the picture shows on a white page;
- palette, greyscale, bilevel, CMYK and YCbCr: Pillow's own conversions; the EXIF
  orientation is applied; an animation gives its first frame.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.readers import refuse_special_file

#: The colour transparent areas are composited over (RGB, 0..255).
BACKGROUND = (255, 255, 255)


def _deep_to_l(im: Any) -> Any:
    """A single-channel deep picture (``I;16*``, ``I``, ``F``) as 8-bit ``L``."""
    from PIL import Image

    a = np.asarray(im)
    if im.mode == "F":
        a = a.astype(np.float64)
        finite = a[np.isfinite(a)]
        a = np.nan_to_num(a, nan=0.0, posinf=255.0, neginf=0.0)
        if finite.size and finite.min() >= 0.0 and finite.max() <= 1.0:
            a = a * 255.0
    else:
        a = a.astype(np.float64)
        if im.mode.startswith("I;16") or (a.size and a.max() > 255):
            a = a / 257.0
    return Image.fromarray(np.clip(np.round(a), 0, 255).astype(np.uint8), "L")


def to_rgb8(im: Any) -> np.ndarray:
    """A Pillow image of any mode -> uint8 ``(H, W, 3)`` (rules in the module docstring).

    Raises:
        ValueError: a mode Pillow cannot turn into RGB.
    """
    from PIL import Image, ImageOps

    im = ImageOps.exif_transpose(im) or im
    if im.mode in ("I", "F") or im.mode.startswith("I;16"):
        im = _deep_to_l(im)
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
    if im.mode in ("RGBa", "La"):
        im = im.convert("RGBA")
    if im.mode in ("RGBA", "LA", "PA"):
        rgba = im.convert("RGBA")
        ground = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
        im = Image.alpha_composite(ground, rgba)
    return np.ascontiguousarray(np.asarray(im.convert("RGB"), dtype=np.uint8))


def read_image_rgb(path: str | Path) -> np.ndarray:
    """The picture at ``path`` as uint8 ``(H, W, 3)`` (:func:`to_rgb8`).

    Raises:
        ModelFileError: no such file, not a regular file (a FIFO, a device), not a picture
            Pillow reads, or a mode it cannot convert.
    """
    from PIL import Image, UnidentifiedImageError

    refuse_special_file(path)  # a FIFO would block the open until a writer comes
    try:
        with Image.open(path) as im:
            im.seek(0)
            return to_rgb8(im)
    except FileNotFoundError:
        raise ModelFileError(path, "no such image") from None
    except IsADirectoryError:
        raise ModelFileError(path, "is a folder, not an image") from None
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ModelFileError(path, f"cannot read image: {exc}") from None
