"""Results: decoded images as pictures, and pictures as PNG files with their metadata.

The one place the command line and the desktop app turn a generation into files: both
write the same text chunks (prompt, settings, seed, model and its hash, placement).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

#: How :func:`model_hash` is computed (written beside it as ``model_hash_method``).
MODEL_HASH_METHOD = "sha256(first 1 MiB + decimal file size)"


def image_to_uint8(img: np.ndarray) -> np.ndarray:
    """``(3, H, W)`` float in [-1, 1] -> ``(H, W, 3)`` uint8 (clamped, rounded)."""
    x = np.clip((img + 1.0) * 127.5, 0, 255)
    return np.ascontiguousarray(np.round(x).astype(np.uint8).transpose(1, 2, 0))


def model_hash(path: str | Path) -> str:
    """Hex sha256 of the file's first MiB followed by its size as decimal ASCII
    (:data:`MODEL_HASH_METHOD`).

    Raises:
        OSError: the file cannot be read.
    """
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read(1 << 20))
    h.update(str(os.path.getsize(path)).encode())
    return h.hexdigest()


def generation_text(params: Mapping[str, Any], model_files: Mapping[str, Any],
                    placement: Mapping[str, str] | None = None) -> dict[str, str]:
    """The PNG text chunks of one generation.

    Args:
        params: the generation settings by sd-cli's request keys (``prompt``,
            ``negative_prompt``, ``seed``, ``steps``, ``sampling_method``, ``scheduler``,
            ``cfg_scale``, ``clip_skip``, ``width``, ``height``; ``guidance`` for Flux,
            ``upscale_model``/``upscale_repeats`` when upscaled). Missing keys are left out.
        model_files: model-file keys -> path or paths; ``model`` (else
            ``diffusion_model``) names the model and is hashed (:func:`model_hash`).
        placement: ``{"backend", "params_backend", "max_vram"}`` canonical strings.

    Returns:
        Text chunk name -> value (``software`` is ``sdplan``).
    """
    text: dict[str, str] = {}
    simple = (("prompt", "prompt"), ("negative_prompt", "negative_prompt"), ("seed", "seed"),
              ("steps", "steps"), ("sampler", "sampling_method"), ("scheduler", "scheduler"),
              ("clip_skip", "clip_skip"))
    for chunk, key in simple:
        if params.get(key) is not None:
            text[chunk] = str(params[key])
    if params.get("cfg_scale") is not None:
        text["cfg_scale"] = f"{float(params['cfg_scale']):g}"
    if params.get("width") and params.get("height"):
        text["size"] = f"{params['width']}x{params['height']}"
    main = _first(model_files.get("model")) or _first(model_files.get("diffusion_model"))
    if main:
        text["model"] = os.path.basename(main)
        try:
            text["model_hash"] = model_hash(main)
            text["model_hash_method"] = MODEL_HASH_METHOD
        except OSError:
            pass
    text["software"] = "sdplan"
    if "diffusion_model" in model_files and params.get("guidance") is not None:
        text["guidance"] = f"{float(params['guidance']):g}"
    upscaler = _first(model_files.get("upscale_model")) or params.get("upscale_model")
    if upscaler:
        text["upscale_model"] = os.path.basename(str(upscaler))
        text["upscale_repeats"] = str(params.get("upscale_repeats") or 1)
    for key, value in (placement or {}).items():
        text[key] = value
    text.update(input_text(params))
    return text


def input_text(params: Mapping[str, Any]) -> dict[str, str]:
    """The PNG text chunks of a generation's LoRAs and picture inputs: ``loras`` (``name:weight``
    each, from the job's ``loras``), ``lora_apply_mode``, ``init_img`` and ``mask`` (file
    names), ``strength``. Absent inputs give no chunk."""
    text: dict[str, str] = {}
    loras = params.get("loras") or []
    if loras:
        text["loras"] = ", ".join(f"{lo['name']}:{float(lo['weight']):g}" for lo in loras)
        if params.get("lora_apply_mode"):
            text["lora_apply_mode"] = str(params["lora_apply_mode"])
    for key in ("init_img", "mask"):
        if params.get(key):
            text[key] = os.path.basename(str(params[key]))
    if params.get("init_img") and params.get("strength") is not None:
        text["strength"] = f"{float(params['strength']):g}"
    return text


def _first(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (str, Path)):
        return str(value)
    values = list(value)
    return str(values[0]) if values else None


def save_png(image: np.ndarray, path: str | Path, text: Mapping[str, str] | None = None) -> Path:
    """Write uint8 ``(H, W, 3)`` ``image`` to ``path`` as PNG with ``text`` chunks (the
    folder is created). Returns the path.

    Raises:
        OSError: the file cannot be written.
    """
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    for k, v in (text or {}).items():
        info.add_text(k, v)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).save(out, pnginfo=info)
    return out


def read_png_text(path: str | Path) -> dict[str, str]:
    """The text chunks of a PNG file.

    Raises:
        OSError: not a readable image.
    """
    from PIL import Image

    with Image.open(path) as im:
        return {str(k): str(v) for k, v in getattr(im, "text", {}).items()}
