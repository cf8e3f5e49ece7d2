"""Results: decoded images as pictures, and pictures as PNG files with their metadata.

The one place the command line and the desktop app turn a generation into files: both
write the same text chunks (prompt, settings, seed, model and its hash, placement), and the
one place they are read back (:func:`read_result`, for the app's gallery).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
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


# --------------------------------------------------------------------------- reading back

#: Text chunk (JSON) with the model files by sd-cli flag key, so a result can rebuild its
#: sd-cli command with full paths (``model`` holds only the main file's name).
MODEL_FILES_KEY = "model_files"
#: Chunk names of :func:`generation_text` -> the request key they hold.
_CHUNK_KEYS = {"prompt": "prompt", "negative_prompt": "negative_prompt", "seed": "seed",
               "steps": "steps", "sampler": "sampling_method", "scheduler": "scheduler",
               "clip_skip": "clip_skip", "cfg_scale": "cfg_scale", "guidance": "guidance"}
_INT_KEYS = ("seed", "steps", "clip_skip", "width", "height", "batch_count")
_FLOAT_KEYS = ("cfg_scale", "guidance")
#: "parameters" fields (``Steps: 20, Sampler: euler, ...``) -> request keys.
_PARAMETER_FIELDS = {"steps": "steps", "sampler": "sampling_method", "cfg scale": "cfg_scale",
                     "seed": "seed", "schedule type": "scheduler", "scheduler": "scheduler",
                     "guidance": "guidance", "clip skip": "clip_skip", "model": "model"}


def result_text(params: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, str]:
    """The PNG text chunks of one result of an engine ``request``: :func:`generation_text`
    of the result's ``params`` (falling back to the request's settings) with the request's
    model files and placement, plus the model files as JSON (:data:`MODEL_FILES_KEY`)."""
    files = request.get("model_files") or {}
    merged = {**{k: v for k, v in request.items() if k not in ("model_files",)},
              **{k: v for k, v in params.items() if v is not None}}
    placement = {k: str(request.get(k) or "") for k in ("backend", "params_backend", "max_vram")
                 if request.get(k)}
    text = generation_text(merged, files, placement)
    if files:
        text[MODEL_FILES_KEY] = json.dumps({k: [v] if isinstance(v, str) else list(v)
                                            for k, v in files.items()})
    return text


@dataclass
class ResultInfo:
    """What a result image says about itself.

    Attributes:
        path: the image file.
        settings: generation settings by sd-cli's request keys (``prompt``, ``seed``,
            ``width``, ``height``, ``steps``, ``cfg_scale``, ``sampling_method``...).
        model: the model's file name (empty when unknown).
        model_files: sd-cli model-file key -> paths, when the image records them.
        placement: ``backend`` / ``params_backend`` / ``max_vram`` strings it ran with.
        text: every text chunk as read.
    """

    path: str
    settings: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    model_files: dict[str, list[str]] = field(default_factory=dict)
    placement: dict[str, str] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)

    @property
    def prompt(self) -> str:
        return str(self.settings.get("prompt") or "")

    def matches(self, query: str) -> bool:
        """True when every word of ``query`` is in the prompt, negative prompt or model
        name (case-insensitive)."""
        hay = " ".join((self.prompt, str(self.settings.get("negative_prompt") or ""),
                        self.model, *(p for v in self.model_files.values() for p in v))).lower()
        return all(w in hay for w in query.lower().split())


def parse_parameters(text: str) -> dict[str, Any]:
    """Settings from an A1111-style ``parameters`` text chunk (as stable-diffusion.cpp and
    other tools write it): the prompt lines, an optional ``Negative prompt:`` line, then one
    line of ``Key: value`` fields separated by ``, ``. Unknown fields are dropped; a
    ``Size: WxH`` field gives ``width`` and ``height``; ``Model`` gives ``model``."""
    lines = text.strip().splitlines()
    fields_line = ""
    if lines and re.match(r"^\s*Steps:\s*\d", lines[-1]):
        fields_line = lines.pop()
    prompt: list[str] = []
    negative: list[str] = []
    in_negative = False
    for line in lines:
        if line.startswith("Negative prompt:"):
            in_negative = True
            line = line[len("Negative prompt:"):].strip()
        (negative if in_negative else prompt).append(line)
    out: dict[str, Any] = {"prompt": "\n".join(prompt).strip()}
    if negative:
        out["negative_prompt"] = "\n".join(negative).strip()
    for m in re.finditer(r"\s*([\w ]+?):\s*(\"[^\"]*\"|[^,]*)(?:,|$)", fields_line):
        key, value = m.group(1).strip().lower(), m.group(2).strip().strip('"')
        if key == "size" and re.fullmatch(r"\d+x\d+", value):
            w, h = value.split("x")
            out["width"], out["height"] = int(w), int(h)
        elif key in _PARAMETER_FIELDS:
            out[_PARAMETER_FIELDS[key]] = value
    return _typed(out)


def _typed(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    for key in _INT_KEYS:
        if key in out:
            try:
                out[key] = int(str(out[key]))
            except ValueError:
                del out[key]
    for key in _FLOAT_KEYS:
        if key in out:
            try:
                out[key] = float(str(out[key]))
            except ValueError:
                del out[key]
    return out


def read_result(path: str | Path) -> ResultInfo:
    """What a result image records: sdplan's text chunks (:func:`result_text`), else an
    A1111-style ``parameters`` chunk (:func:`parse_parameters`), else the JSON file of
    settings beside it (``<name>.json``, older app results).

    Raises:
        OSError: not a readable image.
    """
    text = read_png_text(path)
    settings: dict[str, Any] = {}
    if "parameters" in text:
        settings.update(parse_parameters(text["parameters"]))
    for chunk, key in _CHUNK_KEYS.items():
        if chunk in text:
            settings[key] = text[chunk]
    if re.fullmatch(r"\d+x\d+", text.get("size", "")):
        w, h = text["size"].split("x")
        settings["width"], settings["height"] = int(w), int(h)
    side = Path(path).with_suffix(".json")
    if not settings and side.is_file():
        try:
            data = json.loads(side.read_text(encoding="utf-8"))
            settings = {k: v for k, v in data.items() if isinstance(k, str)} \
                if isinstance(data, dict) else {}
        except (OSError, ValueError):
            settings = {}
    files: dict[str, list[str]] = {}
    try:
        raw = json.loads(text.get(MODEL_FILES_KEY) or "{}")
        files = {str(k): [str(p) for p in v] for k, v in raw.items() if isinstance(v, list)}
    except (ValueError, AttributeError):
        files = {}
    model = text.get("model") or str(settings.pop("model", "") or "")
    if not model and files:
        main = (files.get("model") or files.get("diffusion_model") or [""])[0]
        model = os.path.basename(main)
    placement = {k: text[k] for k in ("backend", "params_backend", "max_vram") if text.get(k)}
    settings = {k: v for k, v in _typed(settings).items()
                if k not in ("timings", "architecture", "model")}
    return ResultInfo(str(path), settings, model, files, placement, text)
