"""The "parameters" text of a picture: written as sd-cli writes it, read back from sd-cli's,
sdplan's and A1111-style tools' pictures.

sd-cli (``get_image_params`` in stable-diffusion.cpp's ``examples/common/common.cpp``,
commit 97d2990) stores one PNG text chunk ``parameters``: the prompt, a ``Negative prompt:``
line when there is one, then ``Key: value`` pairs (``Steps``, ``CFG scale`` and the other
floats with six decimals, ``Seed``, ``Size``, ``Model``, ``RNG``, ``Sampler: <method>
<scheduler>``, ``TE``/``Unet``/``VAE`` file names, ``Clip skip``, ``Version``) and, last,
``SDCPP: {json}`` with the same settings in the ``sdcpp.image.params/v1`` schema. Stable
Diffusion web UI and the galleries that read its pictures use the same layout (their
sampler names differ: ``Euler a``, ``DPM++ 2M Karras``...).

:func:`format_parameters` writes sdplan's run in sd-cli's layout (``Version: sdplan``,
``generator.name`` ``sdplan`` in the JSON); :func:`parse_parameters` reads any of the three
into generation settings under sd-cli's request keys.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sdplan.core.errors import SdplanError
from sdplan.core.planning.bounded_json import loads
from sdplan.core.sampling.slg import SkipLayerGuidance, format_layers, parse_skip_layers

__all__ = ["ImageParameters", "format_parameters", "parse_parameters", "SCHEMA"]

SCHEMA = "sdcpp.image.params/v1"
#: A1111 sampler names (lower-case) -> sd-cli's.
_A1111 = {"euler a": "euler_a", "euler": "euler", "heun": "heun", "dpm2": "dpm2",
          "dpm++ 2s a": "dpm++2s_a", "dpm++ 2m": "dpm++2m", "dpm++ 2m sde": "dpm++2m_sde",
          "dpm++ 2m sde gpu": "dpm++2m_sde_bt", "lms": "lms", "ddim": "ddim_trailing",
          "lcm": "lcm", "ipndm": "ipndm", "ipndm_v": "ipndm_v", "tcd": "tcd",
          "res multistep": "res_multistep", "er sde": "er_sde"}
_A1111_SCHEDULES = {"karras": "karras", "exponential": "exponential", "sgm uniform":
                    "sgm_uniform", "simple": "simple", "align your steps": "ays",
                    "kl optimal": "kl_optimal", "beta": "beta", "normal": "discrete",
                    "automatic": "default"}
#: sd-cli's TE file flags in the order it writes them.
_TE_KEYS = ("clip_l", "clip_g", "t5xxl", "llm")


@dataclass
class ImageParameters:
    """Settings read from a picture.

    Attributes:
        settings: generation settings by sd-cli's request keys (``prompt``,
            ``negative_prompt``, ``width``, ``height``, ``steps``, ``cfg_scale``, ``guidance``,
            ``seed``, ``sampling_method``, ``scheduler``, ``clip_skip``, ``eta``, ``rng``,
            ``sampler_rng``, ``sigmas`` (text), ``flow_shift``, ``timestep_shift``; with SLG on:
            ``slg_scale``, ``skip_layers`` (``[7,8,9]``), ``skip_layer_start``, ``skip_layer_end``).
        model_files: model-file key -> paths (full paths from sdplan's own pictures; file
            names only from sd-cli's).
        placement: ``backend``, ``params_backend``, ``max_vram``, ``split_mode``,
            ``rpc_servers`` strings (sdplan's pictures).
        source: ``sdplan``, ``sd-cli`` or ``a1111``.
        model_flags: sd-cli flags the model files call for (``--prediction v``), when the
            picture records them (sdplan's pictures), else None.
        architecture: the architecture that ran (sdplan's pictures), else None.
        model_hash: the model file's SHA-256 (sdplan's pictures: all of it) or its first 10
            hex digits (web UI's ``Model hash``), lower-case, when the picture records it.
    """

    settings: dict[str, Any] = field(default_factory=dict)
    model_files: dict[str, list[str]] = field(default_factory=dict)
    placement: dict[str, str] = field(default_factory=dict)
    source: str = ""
    model_flags: list[str] | None = None
    architecture: str | None = None
    model_hash: str | None = None


def _f(value: float) -> str:
    """C++ ``std::to_string(float)``: six decimals; ``inf``/``nan`` as C prints them."""
    v = float(value)
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if math.isnan(v):
        return "nan"
    return f"{v:.6f}"


def _base(path: Any) -> str:
    if isinstance(path, (list, tuple)):
        path = path[0] if path else ""
    return os.path.basename(str(path or "").replace("\\", "/"))


def format_parameters(params: Mapping[str, Any], model_files: Mapping[str, Any],
                      version: str = "sdplan", model_hash: str | None = None) -> str:
    """The ``parameters`` text of one picture in sd-cli's layout (module docstring).

    Args:
        params: settings by sd-cli's request keys (``prompt``, ``negative_prompt``, ``steps``,
            ``cfg_scale``, ``guidance``, ``eta``, ``seed``, ``width``, ``height``,
            ``sampling_method``, ``scheduler`` (``default``: none written), ``sigmas``
            (custom list), ``clip_skip`` (-1 or absent: not written), ``rng``,
            ``sampler_rng``, ``flow_shift``, ``timestep_shift``, ``extra_sample_args``,
            ``slg_scale``, ``skip_layers``, ``skip_layer_start``, ``skip_layer_end``: the SLG
            pairs are written only when SLG is on, as sd-cli does).
        model_files: model-file key -> path(s); file names are written.
        version: the ``Version`` value.
        model_hash: Stable Diffusion web UI's ``Model hash`` (the first 10 hex digits of the
            model file's SHA-256), written before ``Model`` as web UI does, when known.
    """
    p = dict(params)
    text = f"{p.get('prompt') or ''}\n"
    if p.get("negative_prompt"):
        text += f"Negative prompt: {p['negative_prompt']}\n"
    cfg = float(p.get("cfg_scale", 7.0))
    guidance = float(p.get("guidance", 3.5))
    eta = p.get("eta")
    eta_f = float("inf") if eta is None else float(eta)
    slg = SkipLayerGuidance.from_request(p)
    parts = [f"Steps: {int(p.get('steps') or 0)}", f"CFG scale: {_f(cfg)}"]
    if slg.enabled:  # sd-cli writes these only when SLG is on
        parts += [f"SLG scale: {_f(slg.scale)}", "Skip layers: [" + "".join(f"{i}, " for i in slg.layers) + "]",
                  f"Skip layer start: {_f(slg.start)}", f"Skip layer end: {_f(slg.end)}"]
    parts += [f"Guidance: {_f(guidance)}", f"Eta: {_f(eta_f)}"]
    extra = p.get("extra_sample_args")
    extra_text = extra if isinstance(extra, str) else ",".join(
        f"{k}={v}" for k, v in (extra or {}).items())
    if extra_text:
        parts.append(f"Extra sample args: {extra_text}")
    parts += [f"Seed: {int(p.get('seed') or 0)}",
              f"Size: {int(p.get('width') or 0)}x{int(p.get('height') or 0)}",
              *([f"Model hash: {model_hash}"] if model_hash else []),
              f"Model: {_base(model_files.get('model'))}",
              f"RNG: {p.get('rng') or 'cuda'}"]
    if p.get("sampler_rng"):
        parts.append(f"Sampler RNG: {p['sampler_rng']}")
    sampler = f"Sampler: {p.get('sampling_method') or 'euler_a'}"
    sigmas = p.get("sigmas")
    scheduler = p.get("scheduler") or "default"
    if sigmas:
        sampler += ", Custom Sigmas: [" + ", ".join(f"{float(s):.4f}" for s in sigmas) + "]"
    elif scheduler != "default":
        sampler += f" {scheduler}"
    parts.append(sampler)
    for key in _TE_KEYS:
        if model_files.get(key):
            parts.append(f"TE: {_base(model_files[key])}")
    if model_files.get("diffusion_model"):
        parts.append(f"Unet: {_base(model_files['diffusion_model'])}")
    if model_files.get("vae"):
        parts.append(f"VAE: {_base(model_files['vae'])}")
    clip_skip = p.get("clip_skip")
    if clip_skip is not None and int(clip_skip) != -1:
        parts.append(f"Clip skip: {int(clip_skip)}")
    parts.append(f"Version: {version}")
    sdcpp = {
        "schema": SCHEMA, "mode": "img_gen", "generator": {"name": version},
        "seed": int(p.get("seed") or 0), "width": int(p.get("width") or 0),
        "height": int(p.get("height") or 0),
        "prompt": {"positive": p.get("prompt") or "", "negative": p.get("negative_prompt") or ""},
        "sampling": {"steps": int(p.get("steps") or 0),
                     "eta": None if eta is None else float(eta),
                     "shifted_timestep": int(p.get("timestep_shift") or 0),
                     "flow_shift": p.get("flow_shift"), "extra_sample_args": extra_text,
                     "guidance": {"txt_cfg": cfg, "distilled_guidance": guidance,
                                  "slg": {"scale": slg.scale, "layers": list(slg.layers), "start": slg.start,
                                          "end": slg.end}},
                     "method": p.get("sampling_method") or "euler_a",
                     "custom_sigmas": [float(s) for s in (sigmas or [])]},
        "models": {k: _base(v) for k, v in model_files.items() if v},
        "clip_skip": -1 if clip_skip is None else int(clip_skip),
        "rng": p.get("rng") or "cuda",
    }
    if scheduler != "default":
        sdcpp["sampling"]["scheduler"] = scheduler  # type: ignore[index]
    if p.get("sampler_rng"):
        sdcpp["sampler_rng"] = p["sampler_rng"]
    return text + ", ".join(parts) + ", SDCPP: " + json.dumps(sdcpp, separators=(",", ":"))


def _split_pairs(line: str) -> list[tuple[str, str]]:
    """``Key: value, Key: value`` with commas inside brackets or quotes kept in the value."""
    out: list[tuple[str, str]] = []
    for m in re.finditer(r'\s*([\w][\w ()/-]*?):\s*("(?:\\.|[^"\\])*"|\[[^\]]*\]|[^,]*)(?:,|$)',
                         line):
        key, value = m.group(1).strip(), m.group(2).strip()
        if key:
            out.append((key, value.strip('"') if value.startswith('"') else value))
    return out


def _num(text: str, typ: type) -> Any:
    try:
        v = typ(float(text)) if typ is int else float(text)
    except ValueError:
        return None
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _from_sdcpp(data: Mapping[str, Any], out: ImageParameters) -> None:
    s = out.settings
    prompt = data.get("prompt") or {}
    s["prompt"] = prompt.get("positive", s.get("prompt", ""))
    if prompt.get("negative"):
        s["negative_prompt"] = prompt["negative"]
    for key in ("seed", "width", "height"):
        if isinstance(data.get(key), (int, float)):
            s[key] = int(data[key])
    samp = data.get("sampling") or {}
    if isinstance(samp.get("steps"), (int, float)):
        s["steps"] = int(samp["steps"])
    guid = samp.get("guidance") or {}
    if isinstance(guid.get("txt_cfg"), (int, float)):
        s["cfg_scale"] = float(guid["txt_cfg"])
    if isinstance(guid.get("distilled_guidance"), (int, float)):
        s["guidance"] = float(guid["distilled_guidance"])
    slg = guid.get("slg") or {}
    if isinstance(slg.get("scale"), (int, float)) and slg["scale"] != 0:
        s["slg_scale"] = round(float(slg["scale"]), 6)
        if isinstance(slg.get("layers"), list):
            s["skip_layers"] = format_layers(int(i) for i in slg["layers"])
        for key, name in (("skip_layer_start", "start"), ("skip_layer_end", "end")):
            if isinstance(slg.get(name), (int, float)):
                s[key] = round(float(slg[name]), 6)  # sd-cli writes float32 values
    if isinstance(samp.get("eta"), (int, float)):
        s["eta"] = float(samp["eta"])
    if isinstance(samp.get("flow_shift"), (int, float)):
        s["flow_shift"] = float(samp["flow_shift"])
    if samp.get("shifted_timestep"):
        s["timestep_shift"] = int(samp["shifted_timestep"])
    if samp.get("method"):
        s["sampling_method"] = str(samp["method"])
    if samp.get("scheduler"):
        s["scheduler"] = str(samp["scheduler"])
    if samp.get("custom_sigmas"):
        s["sigmas"] = ",".join(str(v) for v in samp["custom_sigmas"])
    if samp.get("extra_sample_args"):
        s["extra_sample_args"] = str(samp["extra_sample_args"])
    if isinstance(data.get("clip_skip"), int) and data["clip_skip"] != -1:
        s["clip_skip"] = data["clip_skip"]
    for key in ("rng", "sampler_rng"):
        if data.get(key):
            s[key] = str(data[key])
    for key, name in (data.get("models") or {}).items():
        if name and key not in out.model_files:
            out.model_files[str(key)] = [str(name)]


def parse_parameters(text: str) -> ImageParameters:
    """Generation settings from a ``parameters`` text (sd-cli's, sdplan's or A1111's).

    The ``SDCPP`` JSON wins where present; otherwise the ``Key: value`` pairs are read,
    A1111 sampler names (``DPM++ 2M Karras``) mapped to sd-cli's method and scheduler.
    Unknown keys are ignored; a text without any known key gives empty settings.
    """
    out = ImageParameters()
    body, sep, tail = text.partition(", SDCPP: {")
    sdcpp: dict[str, Any] | None = None
    if sep:
        try:  # the one bounded JSON reader (a picture's text is anyone's)
            sdcpp = loads("{" + tail, "the SDCPP record of a picture")
        except ValueError:
            sdcpp = None
    lines = body.split("\n")
    last = len(lines) - 1
    while last > 0 and not re.match(r"\s*Steps: ", lines[last]):
        last -= 1
    prompt_lines, negative = [], None
    for ln in lines[:last] if last > 0 or re.match(r"\s*Steps: ", lines[0]) else lines:
        if ln.startswith("Negative prompt:"):
            negative = ln[len("Negative prompt:"):].strip()
        elif negative is not None:
            negative += "\n" + ln
        else:
            prompt_lines.append(ln)
    s = out.settings
    s["prompt"] = "\n".join(prompt_lines)
    if negative:
        s["negative_prompt"] = negative
    pairs = dict(_split_pairs(lines[last])) if re.match(r"\s*Steps: ", lines[last]) else {}
    version = pairs.get("Version", "")
    out.source = "sdplan" if version.startswith("sdplan") else (
        "sd-cli" if "stable-diffusion.cpp" in version or sdcpp is not None else "a1111")
    for key, name, typ in (("steps", "Steps", int), ("cfg_scale", "CFG scale", float),
                           ("guidance", "Guidance", float), ("eta", "Eta", float),
                           ("seed", "Seed", int), ("clip_skip", "Clip skip", int)):
        if name in pairs and _num(pairs[name], typ) is not None:
            s[key] = _num(pairs[name], typ)
    if _num(pairs.get("SLG scale", ""), float):
        s["slg_scale"] = _num(pairs["SLG scale"], float)
        with contextlib.suppress(SdplanError):
            s["skip_layers"] = format_layers(parse_skip_layers(pairs.get("Skip layers", "")))
        for key, name in (("skip_layer_start", "Skip layer start"), ("skip_layer_end", "Skip layer end")):
            if _num(pairs.get(name, ""), float) is not None:
                s[key] = _num(pairs[name], float)
    if "Size" in pairs and re.fullmatch(r"\d+x\d+", pairs["Size"]):
        w, h = pairs["Size"].split("x")
        s["width"], s["height"] = int(w), int(h)
    for key, name in (("rng", "RNG"), ("sampler_rng", "Sampler RNG")):
        if pairs.get(name):
            s[key] = pairs[name]
    if pairs.get("Sampler"):
        _sampler(pairs["Sampler"], pairs.get("Schedule type"), s)
    if pairs.get("Model"):
        out.model_files["model"] = [pairs["Model"]]
    if re.fullmatch(r"[0-9a-fA-F]{8,64}", pairs.get("Model hash", "")):
        out.model_hash = pairs["Model hash"].lower()
    tes = re.findall(r"(?:^|, )TE: ([^,]+)", lines[last])
    for name in tes:
        out.model_files.setdefault("te", []).append(name.strip())
    for key, name in (("diffusion_model", "Unet"), ("vae", "VAE")):
        if pairs.get(name):
            out.model_files[key] = [pairs[name]]
    if isinstance(sdcpp, dict):
        with contextlib.suppress(TypeError, ValueError, AttributeError):  # a record of other shapes
            _from_sdcpp(sdcpp, out)
        out.model_files.pop("te", None)
    return out


def _sampler(text: str, schedule_type: str | None, s: dict[str, Any]) -> None:
    """``Sampler`` of either layout: sd-cli's ``euler_a karras`` or A1111's names."""
    low = text.strip().lower()
    for name, sched in _A1111_SCHEDULES.items():
        if low.endswith(" " + name) and low[:-len(name) - 1] in _A1111:
            s["sampling_method"] = _A1111[low[:-len(name) - 1]]
            s["scheduler"] = sched
            return
    if low in _A1111:
        s["sampling_method"] = _A1111[low]
    else:
        method, _, scheduler = text.strip().partition(" ")
        s["sampling_method"] = method
        if scheduler:
            s["scheduler"] = scheduler
    if schedule_type and schedule_type.strip().lower() in _A1111_SCHEDULES:
        s["scheduler"] = _A1111_SCHEDULES[schedule_type.strip().lower()]
