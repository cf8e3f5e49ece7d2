"""The request bodies existing clients send, read into sd-cli's request keys.

Three API families, as stable-diffusion.cpp's ``sd-server`` documents them
(``examples/server/api.md``) and as their own clients send them:

- AUTOMATIC1111's web UI API (``POST /sdapi/v1/txt2img``, ``/img2img``): its parameter
  names (``sampler_name`` "Euler a", ``batch_size`` x ``n_iter``, ``denoising_strength``,
  ``init_images`` and ``mask`` as base64 or data URLs, ``override_settings``'
  ``sd_model_checkpoint`` naming the model);
- OpenAI's images API (``POST /v1/images/generations``, ``/v1/images/edits``): ``prompt``,
  ``n``, ``size`` ``WIDTHxHEIGHT``, ``model``, ``output_format``;
- sd-server's native schema (``POST /sdcpp/v1/img_gen``: ``sample_params`` with its
  ``guidance``, ``init_image``, ``mask_image``, ``ref_images``, ``lora``), which the other two
  may also embed in their prompt between ``<sd_cpp_extra_args>`` and
  ``</sd_cpp_extra_args>``.

Each reader returns a :class:`ParsedRequest`: the settings by sd-cli's request keys (what
:meth:`sdplan.core.pipelines.request.GenerationRequest.from_settings` takes), the model the
request names (None: the served one), its pictures as bytes, and the output format. A value
of the wrong type, or out of the command line's limits
(:data:`sdplan.core.pipelines.limits.SETTING_RANGES`: a seed within int64, a finite CFG
within +-100...), is a :class:`~sdplan.core.errors.RequestRefused` naming the field as the
client spelled it; what the family does not take is refused later by the request's own
check, as on the command line.

The hires fix: A1111's ``enable_hr`` fields and sd-server's ``hires`` object are read by
:mod:`sdplan.core.server.hires` (sd-cli's ``--hires-*`` semantics, A1111's where they
differ); what sdplan cannot honour is refused by name. Pure Python.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from sdplan.core.errors import RequestRefused
from sdplan.core.pipelines.limits import MAX_BATCH
from sdplan.core.server.fields import ParsedRequest
from sdplan.core.server.fields import put as _put
from sdplan.core.server.fields import read_bool as _bool
from sdplan.core.server.fields import read_int as _int
from sdplan.core.server.fields import read_num as _num
from sdplan.core.server.fields import read_str as _str
from sdplan.core.server.fields import refuse as _refuse
from sdplan.core.server.hires import HIRES_FIELDS, native_hires, resolve_hires, sdapi_hires

__all__ = ["ParsedRequest", "from_sdapi", "from_openai", "from_sdcpp", "decode_picture",
           "SDAPI_SAMPLERS", "SDAPI_SCHEDULERS", "split_extra_args", "parse_size", "resolve_hires", "check_finite",
           "HIRES_FIELDS"]

#: A1111's sampler names -> sd-cli's (their names for the same samplers).
SDAPI_SAMPLERS = {
    "euler a": "euler_a", "euler": "euler", "heun": "heun", "dpm2": "dpm2", "dpm2 a": "dpm2",
    "dpm++ 2s a": "dpm++2s_a", "dpm++ 2m": "dpm++2m", "dpm++ 2m v2": "dpm++2mv2",
    "dpm++ 2m sde": "dpm++2m_sde", "lms": "lms", "lcm": "lcm", "ddim": "ddim_trailing",
    "ipndm": "ipndm", "ipndm_v": "ipndm_v", "tcd": "tcd", "res multistep": "res_multistep",
    "er sde": "er_sde",
}
#: A1111's scheduler names -> sd-cli's (``Automatic``: the model's own).
SDAPI_SCHEDULERS = {
    "automatic": "default", "uniform": "discrete", "karras": "karras",
    "exponential": "exponential", "sgm uniform": "sgm_uniform", "simple": "simple",
    "align your steps": "ays", "kl optimal": "kl_optimal", "beta": "beta",
}
_EXTRA = re.compile(r"<sd_cpp_extra_args>(.*?)</sd_cpp_extra_args>", re.DOTALL)
_DATA_URL = re.compile(r"^data:image/[a-zA-Z0-9.+-]+;base64,", re.ASCII)


def decode_picture(value: Any, name: str) -> bytes:
    """The bytes of a picture sent as base64 text or a ``data:image/...;base64,`` URL.

    Raises:
        RequestRefused: not text, or not base64 (``invalid_image``, naming ``name``).
    """
    if not isinstance(value, str) or not value:
        raise RequestRefused(f"{name}: a picture is base64 text or a data URL", "invalid_image", 400)
    text = _DATA_URL.sub("", value.strip(), count=1)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise RequestRefused(f"{name}: not base64 picture data", "invalid_image", 400) from None


def check_finite(body: Any, where: str = "") -> None:
    """Refuse a NaN or infinite number anywhere in a parsed JSON ``body`` (Python's JSON
    reader takes ``NaN`` and ``Infinity``, which no answer could echo), naming its field
    (``hr_scale``, ``sample_params.eta``, ``lora[0].multiplier``).

    Raises:
        RequestRefused: ``invalid_parameter``, naming the first such field.
    """
    if isinstance(body, float) and not math.isfinite(body):
        raise _refuse(where or "body", f"must be a finite number, got {body}")
    if isinstance(body, dict):
        for k, v in body.items():
            check_finite(v, f"{where}.{k}" if where else str(k))
    elif isinstance(body, list):
        for i, v in enumerate(body):
            check_finite(v, f"{where}[{i}]")


def split_extra_args(prompt: str) -> tuple[str, dict[str, Any]]:
    """``prompt`` without its ``<sd_cpp_extra_args>{...}</sd_cpp_extra_args>`` block, and the
    block's JSON object ({} without one).

    Raises:
        RequestRefused: the block is not a JSON object (``invalid_json``).
    """
    m = _EXTRA.search(prompt)
    if m is None:
        return prompt, {}
    try:
        extra = json.loads(m.group(1))
    except ValueError as exc:
        raise RequestRefused(f"sd_cpp_extra_args: not JSON ({exc})", "invalid_json", 400) from None
    if not isinstance(extra, dict):
        raise RequestRefused("sd_cpp_extra_args: must be a JSON object", "invalid_json", 400)
    check_finite(extra, "sd_cpp_extra_args")
    return (prompt[:m.start()] + prompt[m.end():]).strip(), extra


def parse_size(text: Any, name: str = "size") -> tuple[int, int] | None:
    """``"WIDTHxHEIGHT"`` -> ``(width, height)`` pixels; None for None or ``auto``.

    Raises:
        RequestRefused: another form.
    """
    if text is None or text == "auto":
        return None
    m = re.fullmatch(r"\s*(\d{1,6})\s*[xX]\s*(\d{1,6})\s*", text) if isinstance(text, str) else None
    if m is None or not int(m.group(1)) or not int(m.group(2)):
        raise _refuse(name, f"must be WIDTHxHEIGHT in pixels, like 512x512, got {json.dumps(text)[:40]}")
    return int(m.group(1)), int(m.group(2))


def _prompt(body: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    prompt = _str(body, "prompt")
    if not prompt or not prompt.strip():
        raise RequestRefused("prompt: required", "invalid_parameter", 400)
    return split_extra_args(prompt)


def _output(body: Mapping[str, Any], out: ParsedRequest) -> None:
    fmt = (_str(body, "output_format") or "png").lower()
    if fmt == "jpg":
        fmt = "jpeg"
    if fmt not in ("png", "jpeg", "webp"):
        raise _refuse("output_format", f"must be png, jpeg or webp, got {fmt[:20]!r}")
    out.output_format = fmt
    comp = _int(body, "output_compression")
    out.output_compression = 100 if comp is None else max(0, min(100, comp))


def _lora_tags(entries: Any, name: str = "lora") -> str:
    """sd-server's structured ``lora`` list as sdplan's prompt tags (``<lora:NAME:WEIGHT>``)."""
    if entries is None:
        return ""
    if not isinstance(entries, list):
        raise _refuse(name, "must be a list of {path, multiplier}")
    tags = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("path"), str) or not e["path"].strip():
            raise _refuse(f"{name}[{i}]", "needs a path")
        stem = re.sub(r"\.(safetensors|sft|gguf|ckpt|pt|pth)$", "", e["path"].strip())
        mult = _num(e, "multiplier")
        tags.append(f"<lora:{stem}:{1.0 if mult is None else mult:g}>")
    return " ".join(tags)


def native_settings(body: Mapping[str, Any], out: ParsedRequest, *, where: str = "") -> None:
    """Read sd-server's native fields (``sample_params``, ``init_image``, ``lora``,
    ``hires``...) of ``body`` into ``out`` (over what is there); refusals name the field
    after ``where`` (``sd_cpp_extra_args.`` inside a prompt).

    Raises:
        RequestRefused: a field of the wrong type or out of the command line's limits.
    """
    s = out.settings
    _put(s, negative_prompt=_str(body, "negative_prompt"), width=_int(body, "width", low=1, key="width", where=where),
         height=_int(body, "height", low=1, key="height", where=where),
         seed=_int(body, "seed", key="seed", where=where),
         batch_count=_int(body, "batch_count", low=1, key="batch_count", where=where),
         strength=_num(body, "strength", where=where))
    clip = _int(body, "clip_skip", key="clip_skip", where=where)
    if clip is not None:
        s["clip_skip"] = max(clip, 0)
    sp = body.get("sample_params")
    if sp is not None:
        if not isinstance(sp, dict):
            raise _refuse(where + "sample_params", "must be an object")
        at = where + "sample_params."
        _put(s, sampling_method=_str(sp, "sample_method"), scheduler=_str(sp, "scheduler"),
             steps=_int(sp, "sample_steps", low=1, key="steps", where=at), eta=_num(sp, "eta", where=at),
             flow_shift=_num(sp, "flow_shift", where=at), timestep_shift=_int(sp, "shifted_timestep", where=at))
        if s.get("flow_shift") == 0.0:  # sd-server's "unset"
            s.pop("flow_shift")
        sig = sp.get("custom_sigmas")
        if sig:
            if not isinstance(sig, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool)
                                                     and math.isfinite(x) for x in sig):
                raise _refuse(at + "custom_sigmas", "must be a list of finite numbers")
            s["sigmas"] = [float(x) for x in sig]
        g = sp.get("guidance")
        if g is not None:
            if not isinstance(g, dict):
                raise _refuse(at + "guidance", "must be an object")
            ag = at + "guidance."
            _put(s, cfg_scale=_num(g, "txt_cfg", key="cfg_scale", where=ag),
                 guidance=_num(g, "distilled_guidance", key="guidance", where=ag))
            slg = g.get("slg")
            if isinstance(slg, dict) and _num(slg, "scale", where=ag + "slg."):
                _put(s, slg_scale=_num(slg, "scale", where=ag + "slg."), skip_layers=slg.get("layers"),
                     skip_layer_start=_num(slg, "layer_start", where=ag + "slg."),
                     skip_layer_end=_num(slg, "layer_end", where=ag + "slg."))
    tags = _lora_tags(body.get("lora"))
    if tags:
        s["prompt"] = f"{s.get('prompt', '')} {tags}".strip()
    for key, field_name in (("init_img", "init_image"), ("mask", "mask_image")):
        if body.get(field_name) is not None:
            out.pictures[key] = decode_picture(body[field_name], where + field_name)
            out.fields[key] = where + field_name
    refs = body.get("ref_images")
    if refs:
        if not isinstance(refs, list):
            raise _refuse(where + "ref_images", "must be a list of pictures")
        out.pictures["ref_images"] = [decode_picture(r, f"{where}ref_images[{i}]") for i, r in enumerate(refs)]
        out.fields["ref_images"] = where + "ref_images"
    if body.get("hires") is not None:
        native_hires(body["hires"], out, where + "hires")
    if body.get("control_image") is not None:
        s["control_net"] = "control_image"
    vt = body.get("vae_tiling_params")
    if isinstance(vt, dict) and vt.get("enabled"):
        s["vae_tile_size"] = _int(vt, "tile_size_x", low=0) or 32
    if body.get("model") is not None:
        out.model = _str(body, "model")


def from_sdcpp(body: Mapping[str, Any]) -> ParsedRequest:
    """sd-server's native ``img_gen`` body (module docstring).

    Raises:
        RequestRefused: a field of the wrong type, no prompt, or a picture that is not base64.
    """
    prompt = _str(body, "prompt")
    if not prompt or not prompt.strip():
        raise RequestRefused("prompt: required", "invalid_parameter", 400)
    out = ParsedRequest("sdcpp", {"prompt": prompt}, echo=dict(body))
    native_settings(body, out)
    _output(body, out)
    return out


def from_sdapi(body: Mapping[str, Any], *, img2img: bool = False) -> ParsedRequest:
    """An A1111 ``txt2img`` (or ``img2img``) body (module docstring).

    Raises:
        RequestRefused: a field of the wrong type, an unknown sampler or scheduler name, no
            prompt, no ``init_images`` for img2img, or a picture that is not base64.
    """
    prompt, extra = _prompt(body)
    out = ParsedRequest("sdapi", {"prompt": prompt}, echo=dict(body))
    s = out.settings
    _put(s, negative_prompt=_str(body, "negative_prompt"), width=_int(body, "width", low=1, key="width"),
         height=_int(body, "height", low=1, key="height"), steps=_int(body, "steps", low=1, key="steps"),
         cfg_scale=_num(body, "cfg_scale", key="cfg_scale"), seed=_int(body, "seed", key="seed"))
    size = _int(body, "batch_size", low=1, key="batch_count") or 1
    n_iter = _int(body, "n_iter", low=1, key="batch_count") or 1
    if size * n_iter > MAX_BATCH:
        raise _refuse("batch_size", f"must be at most {MAX_BATCH} images with n_iter, got {size} x {n_iter}")
    if size * n_iter > 1:
        s["batch_count"] = size * n_iter
    clip = _int(body, "clip_skip", key="clip_skip")
    if clip is not None:
        s["clip_skip"] = max(clip, 0)
    sampler = _str(body, "sampler_name") or _str(body, "sampler_index")
    if sampler:
        name = SDAPI_SAMPLERS.get(sampler.strip().lower(), sampler.strip())
        s["sampling_method"] = name
    sched = _str(body, "scheduler")
    if sched:
        s["scheduler"] = SDAPI_SCHEDULERS.get(sched.strip().lower(), sched.strip())
    if _bool(body, "enable_hr"):
        if img2img:
            raise _refuse("enable_hr", "A1111's img2img has no hires fix (its denoising_strength is the "
                          "img2img strength); send enable_hr false")
        sdapi_hires(body, out)
    over = body.get("override_settings")
    if over is not None:
        if not isinstance(over, dict):
            raise _refuse("override_settings", "must be an object")
        out.model = _str(over, "sd_model_checkpoint")
        clip = _int(over, "CLIP_stop_at_last_layers", key="clip_skip", where="override_settings.")
        if clip is not None:
            s["clip_skip"] = max(clip, 0)
    if body.get("alwayson_scripts"):
        raise _refuse("alwayson_scripts", "scripts (ControlNet...) are not run by sdplan's server")
    if img2img:
        images = body.get("init_images")
        if not isinstance(images, list) or not images:
            raise RequestRefused("init_images: img2img needs one picture", "invalid_parameter", 400)
        if len(images) > 1:
            raise _refuse("init_images", "sdplan takes one init picture per request")
        out.pictures["init_img"] = decode_picture(images[0], "init_images[0]")
        out.fields["init_img"] = "init_images[0]"
        if body.get("mask") is not None:
            out.pictures["mask"] = decode_picture(body["mask"], "mask")
            out.fields["mask"] = "mask"
            out.mask_invert = _bool(body, "inpainting_mask_invert")
        strength = _num(body, "denoising_strength")
        s["strength"] = 0.75 if strength is None else max(0.0, min(1.0, strength))
    if extra:
        native_settings(extra, out, where="sd_cpp_extra_args.")
    return out


def from_openai(body: Mapping[str, Any], files: Mapping[str, list[bytes]] | None = None) -> ParsedRequest:
    """An OpenAI images body: ``generations`` (JSON), or ``edits`` (its form fields as
    ``body`` and its uploaded ``image`` / ``image[]`` / ``mask`` files as ``files``).

    Raises:
        RequestRefused: a field of the wrong type, no prompt, a ``size`` that is not
            ``WIDTHxHEIGHT``, ``response_format`` ``url`` (pictures are returned inline), or
            an edit without a picture.
    """
    prompt, extra = _prompt(body)
    out = ParsedRequest("openai", {"prompt": prompt}, echo=dict(body))
    n = body.get("n")
    if isinstance(n, str) and n.isdigit():  # a form field
        n = int(n)
    n_val = _int({"n": n}, "n", low=1, key="batch_count")
    if n_val and n_val > 1:
        out.settings["batch_count"] = n_val
    size = parse_size(body.get("size"))
    if size is not None:
        out.settings["width"], out.settings["height"] = size
    if body.get("response_format") not in (None, "b64_json"):
        raise _refuse("response_format", "sdplan's server returns pictures inline: use b64_json")
    if body.get("model") is not None:
        out.model = _str(body, "model")
    comp = body.get("output_compression")
    if isinstance(comp, str) and comp.isdigit():
        body = {**body, "output_compression": int(comp)}
    _output(body, out)
    if files is not None:
        pics = [*files.get("image[]", []), *files.get("image", [])]
        if not pics:
            raise RequestRefused("image: an edit needs a picture", "invalid_parameter", 400)
        out.pictures["edit"] = list(pics)  # init or reference pictures: the family decides
        out.fields.update(init_img="image", ref_images="image")
        if files.get("mask"):
            out.pictures["mask"] = files["mask"][0]
            out.fields["mask"] = "mask"
    if extra:
        native_settings(extra, out, where="sd_cpp_extra_args.")
    return out
