"""Pictures in and out of a server: a request's pictures checked and written as files the
engine reads, and the engine's uint8 images encoded for the answer.

A request's picture (bytes the client sent) is opened with Pillow, refused when it is not
a picture or is over the server's pixel limit, and written as a PNG in the job's own
temporary folder (removed when the job ends); a mask is made one channel (and inverted for
A1111's ``inpainting_mask_invert``). The answer's pictures are PNG with sdplan's text
chunks (the picture's record, :func:`sdplan.core.pipelines.stages.results.picture_text`),
or JPEG / WebP at the requested quality.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sdplan.core.errors import RequestRefused

__all__ = ["write_pictures", "encode_image", "b64"]


#: An object's repr in an exception's text (Pillow names the buffer it read).
_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")


def _open(data: bytes, name: str, max_pixels: int) -> Any:
    """``data`` opened as a picture; refusals name ``name`` (the client's field)."""
    from PIL import Image, UnidentifiedImageError

    try:
        pic = Image.open(io.BytesIO(data))
        w, h = pic.size
        if w * h > max_pixels:
            raise RequestRefused(f"{name}: {w}x{h} px is over this server's limit of {max_pixels} pixels",
                                 "too_large", 400)
        pic.load()
    except RequestRefused:
        raise
    except UnidentifiedImageError:
        raise RequestRefused(f"{name}: not a picture (PNG, JPEG, WebP or another format Pillow reads)",
                             "invalid_image", 400) from None
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        why = _REPR.sub("the picture", str(exc))
        raise RequestRefused(f"{name}: not a picture Pillow reads ({why})", "invalid_image", 400) from None
    return pic


def write_pictures(pictures: Mapping[str, Any], folder: Path, *, max_pixels: int,
                   mask_invert: bool = False, names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Write a request's pictures (``init_img``, ``mask``: bytes; ``ref_images``: list of
    bytes) as PNG files in ``folder``; returns the request keys with their paths
    (``ref_images`` a list). ``names``: request key -> the client's field name
    (``init_images[0]``...) the refusals name; the request key without one.

    Raises:
        RequestRefused: bytes that are not a picture (``invalid_image``) or one over
            ``max_pixels`` (``too_large``).
    """
    from PIL import ImageOps

    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {}
    for key in ("init_img", "mask"):
        if pictures.get(key) is None:
            continue
        pic = _open(pictures[key], (names or {}).get(key, key), max_pixels)
        if key == "mask":
            pic = pic.convert("L")
            if mask_invert:
                pic = ImageOps.invert(pic)
        else:
            pic = pic.convert("RGB")
        path = folder / f"{key}.png"
        pic.save(path, format="PNG")
        out[key] = str(path)
    refs = []
    for i, data in enumerate(pictures.get("ref_images") or ()):
        path = folder / f"ref_{i}.png"
        _open(data, f"{(names or {}).get('ref_images', 'ref_images')}[{i}]", max_pixels).convert("RGB").save(path, format="PNG")
        refs.append(str(path))
    if refs:
        out["ref_images"] = refs
    return out


def encode_image(image: Any, fmt: str = "png", quality: int = 100,
                 text: Mapping[str, str] | None = None) -> bytes:
    """uint8 ``(H, W, 3)`` ``image`` as ``png`` (with ``text`` chunks), ``jpeg`` or ``webp``
    (``quality`` 0..100) bytes."""
    import numpy as np
    from PIL import Image, PngImagePlugin

    pic = Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8))
    buf = io.BytesIO()
    if fmt == "png":
        info = PngImagePlugin.PngInfo()
        for k, v in (text or {}).items():
            info.add_text(k, v)
        pic.save(buf, format="PNG", pnginfo=info)
    else:
        pic.save(buf, format="JPEG" if fmt == "jpeg" else "WEBP", quality=max(1, min(100, quality)))
    return buf.getvalue()


def b64(data: bytes) -> str:
    """``data`` as base64 text."""
    return base64.b64encode(data).decode("ascii")
