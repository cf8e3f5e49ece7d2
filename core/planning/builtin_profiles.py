"""Built-in model profiles: plan for popular models without their files.

The profiles ship in ``sdplan.resources`` as ``profiles/builtin_profiles.json``, generated
by ``tools/make_profiles.py`` from the real tensor layouts and ggml's block sizes. Names
are ``<model>-<quant>``: models ``sd15``, ``sd21``, ``sdxl-base``, ``sd35-medium``,
``sd35-large``, ``flux1-dev``, ``flux1-schnell``, ``chroma1-hd``, ``z-image-turbo``,
``flux2-klein-4b``, ``flux2-klein-9b``, ``qwen-image``, ``flux2-dev``; quants ``f16``, ``q8_0``, ``q5_k``, ``q4_k``,
``q4_0`` (e.g. ``flux1-dev-q8_0``). Each profile holds the diffusion model in that quant
type with its usual text encoders (T5-XXL, or the LLM: Qwen3 for Z-Image and FLUX.2 klein,
Qwen2.5-VL-7B for Qwen-Image, Mistral-Small-3.2-24B for FLUX.2 dev, in F16/BF16 for ``-f16``,
Q8_0 otherwise) and VAE.

Index format (``format`` 1)::

    {"format": 1, "profiles": {NAME: {"title": str, "architecture": str, "quant": str,
        "modules": {module: {"blocks": [bytes...], "other": bytes,
                             "encoders"?: {encoder: bytes}, "block_encoder"?: str}},
        "diffusion_dtypes": {ggml type: bytes}, "files": {file: bytes}, "note"?: str}}}
"""

from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from sdplan.core.errors import ModelFileError, PlanError
from sdplan.core.planning import paths
from sdplan.core.planning.bounded_json import JsonLimits, JsonRefused, loads
from sdplan.core.planning.profile import Profile

log = logging.getLogger(__name__)

#: Resource path of the index inside ``sdplan.resources``.
INDEX = ("profiles", "builtin_profiles.json")


@dataclass(frozen=True)
class BuiltinProfileInfo:
    """One built-in profile's description.

    Attributes:
        name: the ``--model-profile`` name (``flux1-dev-q8_0``).
        title: display title (``FLUX.1 [dev] Q8_0``).
        architecture: sdplan's architecture name (``flux-dev``, ``sd3-large``...).
        quant: ggml type of the diffusion model's quantised tensors (``F16``, ``Q8_0``...).
        total_bytes: all weight bytes of all modules.
        module_bytes: bytes per module (``diffusion``: both experts of a two-stage model).
        files: bytes per published file it stands for.
        note: a caveat, or "".
    """

    name: str
    title: str
    architecture: str
    quant: str
    total_bytes: int
    module_bytes: dict[str, int]
    files: dict[str, int]
    note: str = ""


@lru_cache(maxsize=1)
def _index() -> dict[str, Any]:
    """The parsed index; raises :class:`ModelFileError` when missing or malformed."""
    source = "sdplan.resources/" + "/".join(INDEX)
    try:
        ref = resources.files("sdplan.resources").joinpath("/".join(INDEX))
        data = loads(ref.read_bytes(), source, JsonLimits(max_bytes=64 * 2**20))
    except (OSError, ModuleNotFoundError) as exc:
        raise ModelFileError(source, f"built-in profiles are missing ({exc})") from None
    except JsonRefused as exc:
        raise ModelFileError(source, f"built-in profiles are not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != 1 or not isinstance(
            data.get("profiles"), dict):
        raise ModelFileError(source, "built-in profiles: expected format 1 with 'profiles'")
    return data["profiles"]


def _info(name: str, entry: dict[str, Any]) -> BuiltinProfileInfo:
    mods = {m: sum(v.get("blocks", [])) + v.get("other", 0)
            for m, v in entry["modules"].items()}
    for v in (entry.get("phases") or {}).values():  # a two-stage model's other expert
        mods["diffusion"] = mods.get("diffusion", 0) + sum(v.get("blocks", [])) + v.get("other", 0)
    return BuiltinProfileInfo(name=name, title=entry["title"],
                              architecture=entry["architecture"], quant=entry["quant"],
                              total_bytes=sum(mods.values()), module_bytes=mods,
                              files=dict(entry.get("files", {})), note=entry.get("note", ""))


def list_profiles() -> list[BuiltinProfileInfo]:
    """Every built-in profile, in index order (model, then F16, Q8_0, Q5_K, Q4_K, Q4_0).

    Raises:
        ModelFileError: the shipped index is missing or malformed.
    """
    return [_info(n, e) for n, e in _index().items()]


def profile_names() -> list[str]:
    """Names accepted by :func:`load_builtin_profile`."""
    return list(_index())


def load_builtin_profile(name: str) -> Profile:
    """The planner :class:`Profile` of built-in profile ``name`` (case-insensitive, so
    ``FLUX1-dev-Q8_0`` works).

    Raises:
        ModelFileError: unknown name (the message lists the nearest names), or a
            malformed index.
    """
    profiles = _index()
    key = name.strip().lower()
    if key not in profiles:
        near = difflib.get_close_matches(key, list(profiles), n=5, cutoff=0.5)
        hint = (f"did you mean {', '.join(near)}?" if near
                else "see `sdplan plan --model-profile list`")
        raise ModelFileError(f"--model-profile {name}",
                             f"no built-in model profile {name!r}; {hint}")
    entry = profiles[key]
    data = {"modules": entry["modules"], "name": key, "architecture": entry["architecture"],
            "phases": entry.get("phases") or {}}
    return Profile.from_json(data, source=f"built-in profile {key}")


def load_profile_option(profile: str | None = None, model_profile: str | None = None) -> Profile | None:
    """The model profile of the shared ``--profile FILE|NAME`` / ``--model-profile NAME``
    options (``sdplan plan``, ``sdplan gui``): a built-in profile by name, or a profile JSON
    file (a ``--profile`` value that is not an existing file and does not end in ``.json``
    is taken as a built-in name). None when neither is given.

    Raises:
        PlanError: ``conflicting_model_sources`` when both are given.
        ModelFileError: an unreadable file or an unknown built-in name.
    """
    if model_profile and profile:
        raise PlanError("conflicting_model_sources", "--model-profile excludes --profile; give "
                        "one of them", flag="--model-profile")
    if model_profile:
        return load_builtin_profile(model_profile)
    if not profile:
        return None
    if paths.exists(profile) or profile.lower().endswith(".json"):
        return Profile.load(profile)
    return load_builtin_profile(profile)


#: A quantisation written in a file name (``Q4_K_M``, ``q8_0``, ``bf16``...).
_QUANT_RE = re.compile(r"(q\d_(?:k|0|1)(?:_[sml])?|bf16|fp16|f16|fp8|f32)", re.IGNORECASE)


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def match_builtin_profile(file_name: str) -> str | None:
    """The built-in profile a model file's name stands for, or None: the model named in it
    (``flux1-dev``, ``z_image_turbo``, a published file's name such as
    ``v1-5-pruned-emaonly``; case, ``-``, ``_`` and ``.`` ignored, the longest name found
    wins) and its quantisation (``Q8_0``, ``Q4_K_M`` -> ``q4_k``; ``bf16``/``fp16`` or a
    ``.safetensors`` file without one -> ``f16``).

    Raises:
        ModelFileError: the shipped index is missing or malformed.
    """
    base = Path(file_name.replace("\\", "/")).name
    stem, suffix = Path(base).stem, Path(base).suffix.lower()
    found = _QUANT_RE.search(stem)
    if found:
        q = found.group(1).lower()
        quant = "f16" if q in ("bf16", "fp16", "f16") else re.sub(r"_[sml]$", "", q)
    elif suffix in (".safetensors", ".sft", ".ckpt"):
        quant = "f16"
    else:
        return None
    text = _squash(_QUANT_RE.sub("", stem))
    best: tuple[int, str] | None = None
    for name, entry in _index().items():
        model = name.rsplit("-", 1)[0]
        keys = {_squash(model)}
        first = next(iter(entry.get("files") or {}), "")
        if name.endswith("-f16") and first:
            keys.add(_squash(_QUANT_RE.sub("", Path(first).stem)))
        for key in keys:
            if key and key in text and (best is None or len(key) > best[0]):
                best = (len(key), model)
    if best is None:
        return None
    name = f"{best[1]}-{quant}"
    return name if name in _index() else None
