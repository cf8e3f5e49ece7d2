"""The ``sdplan`` record of a picture (its PNG text chunk, JSON) and the generation settings
of a saved plan kept to the shapes their readers expect: a picture or a session is anyone's
file, and a record whose ``settings`` is a list or whose ``model_files`` hold numbers must
not stop the gallery, the history, the app's start or ``--from-image``.

:func:`checked_record` keeps each known field only when it has its type (settings by their
sd-cli request key: text, whole numbers, numbers, a list of numbers for ``sigmas``, a map of
texts for ``extra_sample_args``, a list of texts for ``ref_images``) and drops the rest; every value that stays is one a reader
can format, compare and convert without an exception.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["checked_record", "checked_settings"]

_TEXT = frozenset({"prompt", "negative_prompt", "sampling_method", "scheduler", "rng",
                   "sampler_rng", "lora_model_dir", "lora_apply_mode", "init_img", "mask",
                   "skip_layers"})
_INT = frozenset({"width", "height", "steps", "seed", "batch_count", "clip_skip",
                  "timestep_shift", "vae_tile_size", "upscale_repeats"})
_FLOAT = frozenset({"cfg_scale", "guidance", "eta", "flow_shift", "slg_scale",
                    "skip_layer_start", "skip_layer_end", "strength"})
#: Settings that are maps of plain values (VAE tiling, hires fix, ControlNet).
_MAPS = frozenset({"vae_tiling", "hires", "control"})
#: Longest text kept from a record (characters): a prompt is at most 10,000.
MAX_TEXT = 100_000
#: Most reference pictures (``ref_images``, sd-cli's repeated ``-r``) kept from a record.
MAX_REFS = 64


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _keep(key: str, v: object) -> bool:
    if v is None:
        return True
    if key in _TEXT:
        return isinstance(v, str) and len(v) <= MAX_TEXT
    if key in _INT:  # a seed is sd-cli's int64; the others fit a 32-bit spin box
        return isinstance(v, int) and not isinstance(v, bool) and abs(v) < (
            2**63 if key == "seed" else 2**31)
    if key in _FLOAT:
        return _number(v)
    if key == "sigmas":
        return (isinstance(v, list) and len(v) <= 10_000 and all(_number(x) for x in v)) or (
            isinstance(v, str) and len(v) <= MAX_TEXT)
    if key in _MAPS:
        return isinstance(v, dict) and len(v) <= 64 and all(
            x is None or isinstance(x, bool) or _number(x) or (isinstance(x, str) and len(x) <= MAX_TEXT)
            or (isinstance(x, list) and len(x) <= 4 and all(_number(y) for y in x)) for x in v.values())
    if key == "ref_images":  # file names (a picture's) or paths (the app's index)
        return isinstance(v, list) and len(v) <= MAX_REFS and all(
            isinstance(x, str) and 0 < len(x) <= MAX_TEXT for x in v)
    if key == "extra_sample_args":
        return (isinstance(v, dict) and all(isinstance(x, str) for x in v.values())) or (
            isinstance(v, str) and len(v) <= MAX_TEXT)
    return isinstance(v, (str, bool)) or _number(v)  # another key: a plain value only


def checked_settings(settings: object) -> dict[str, Any]:
    """The entries of a record's ``settings`` that have their key's type (module docstring);
    {} when ``settings`` is not a map."""
    if not isinstance(settings, dict):
        return {}
    return {str(k): v for k, v in settings.items() if _keep(str(k), v)}


def _texts(v: object) -> list[str] | None:
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and all(isinstance(x, str) for x in v):
        return list(v)
    return None


def checked_record(doc: object) -> dict[str, Any] | None:
    """``doc`` (a parsed ``sdplan`` chunk) with ``settings``, ``model_files`` (key -> list of
    paths), ``placement`` (key -> text) and ``model_flags`` (list of texts) of their types;
    a field of another type is dropped. None when ``doc`` is not a map."""
    if not isinstance(doc, dict):
        return None
    out = dict(doc)
    out["settings"] = checked_settings(doc.get("settings"))
    files = doc.get("model_files")
    out["model_files"] = ({str(k): t for k, v in files.items() if (t := _texts(v)) is not None}
                          if isinstance(files, dict) else {})
    place = doc.get("placement")
    out["placement"] = ({str(k): str(v) for k, v in place.items()
                         if isinstance(v, str) or _number(v)} if isinstance(place, dict) else {})
    flags = _texts(doc.get("model_flags"))
    if flags is None:
        out.pop("model_flags", None)
    else:
        out["model_flags"] = flags
    return out
