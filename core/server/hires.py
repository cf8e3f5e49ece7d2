"""The hires fix of a client's request: A1111's ``enable_hr`` fields and sd-server's ``hires``
object read into sdplan's hires request (sd-cli's ``--hires-*`` keys, read by
:class:`~sdplan.core.pipelines.request_parts.HiresFix`), and the parts only the served model
settles (:func:`resolve_hires`: a target keeping the picture's aspect ratio, an upscaler model
of the server's library).

A1111's semantics where they differ from sd-cli's: one of ``hr_resize_x`` / ``hr_resize_y``
keeps the picture's aspect ratio (the other side is ``x * height // width``, as A1111's
``calculate_target_resolution``); both with another aspect ratio are refused (A1111 crops,
sdplan does not); ``hr_upscaler`` ``None`` is refused (sd-cli's ``None`` turns the fix off);
a second-pass sampler, scheduler, prompt, CFG or checkpoint other than the first pass's is
refused by name. sd-server's ``hires`` object (``examples/server/api.md``) keeps sd-cli's
semantics; its ``custom_sigmas`` and an ``upscale_tile_size`` other than its default are
refused, as is a field it does not define. Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from sdplan.core.pipelines.request_parts import HIRES_UPSCALERS
from sdplan.core.server.fields import (
    ParsedRequest,
    limit,
    put,
    read_bool,
    read_int,
    read_num,
    read_str,
    refuse,
    text,
)

__all__ = ["HIRES_FIELDS", "SDCPP_UPSCALE_TILE", "native_hires", "sdapi_hires", "resolve_hires"]

#: sd-server's ``hires`` object's fields (``examples/server/api.md``) -> sdplan's hires keys
#: (None: read by hand).
HIRES_FIELDS = {"enabled": "enabled", "upscaler": "upscaler", "scale": "scale", "target_width": "width",
                "target_height": "height", "steps": "steps", "denoising_strength": "denoising_strength",
                "custom_sigmas": None, "upscale_tile_size": None}
#: sd-server's default ``hires.upscale_tile_size`` (its capabilities' default).
SDCPP_UPSCALE_TILE = 128
#: A1111's second-pass fields and the values that mean "as the first pass".
_SDAPI_SAME = {"hr_checkpoint_name": ("use same checkpoint",), "hr_sampler_name": ("use same sampler",),
               "hr_scheduler": ("use same scheduler",), "hr_prompt": (), "hr_negative_prompt": (),
               "hr_cfg": (), "hr_distilled_cfg": (), "hr_additional_modules": ("use same choices",)}


def native_hires(hires: Any, out: ParsedRequest, name: str) -> None:
    """sd-server's ``hires`` object (:data:`HIRES_FIELDS`, sd-cli's semantics) as sdplan's
    hires request; an unknown field, ``custom_sigmas`` or a ``upscale_tile_size`` other than
    sd-server's default are refused by name."""
    if not isinstance(hires, dict):
        raise refuse(name, "must be an object")
    unknown = sorted(k for k in hires if k not in HIRES_FIELDS)
    if unknown:
        raise refuse(f"{name}.{unknown[0]}", "is not a field of sd-server's hires object (its fields: "
                     + ", ".join(HIRES_FIELDS) + ")")
    at = name + "."
    if hires.get("custom_sigmas"):
        raise refuse(at + "custom_sigmas", "sdplan's hires fix takes its sigmas from the schedule and "
                     "hires.denoising_strength; send none")
    tile = read_int(hires, "upscale_tile_size", low=0, where=at)
    if tile not in (None, 0, SDCPP_UPSCALE_TILE):
        raise refuse(at + "upscale_tile_size", f"sdplan's upscaler cuts its own tiles; send {SDCPP_UPSCALE_TILE} "
                     f"or none, got {tile}")
    enabled = read_bool(hires, "enabled")
    if not enabled:
        return
    fix: dict[str, Any] = {"enabled": True}
    upscaler = read_str(hires, "upscaler")
    if upscaler is not None:
        fix["upscaler"] = _canonical_upscaler(upscaler)
        out.fields["hires_upscaler"] = at + "upscaler"
    scale = read_num(hires, "scale", key="hires_scale", where=at)
    put(fix, scale=scale, width=read_int(hires, "target_width", low=0, key="hires_width", where=at),
        height=read_int(hires, "target_height", low=0, key="hires_height", where=at),
        steps=read_int(hires, "steps", low=0, key="hires_steps", where=at),
        denoising_strength=_strength(hires, "denoising_strength", at))
    if scale is not None and scale <= 0 and not (fix.get("width") or fix.get("height")):
        raise refuse(at + "scale", f"must be positive when no target size is set, got {scale:g}")
    out.settings["hires"] = fix


def _strength(body: Mapping[str, Any], name: str, where: str = "") -> float | None:
    """A hires denoising strength: (0, 1] as sd-cli's ``--hires-denoising-strength``."""
    v = read_num(body, name, where=where)
    if v is not None and not 0.0 < v <= 1.0:
        raise refuse(where + name, f"must be in (0, 1], got {v:g}")
    return v


def _canonical_upscaler(name: str) -> str:
    """sd-cli's spelling of a built-in upscaler named in any case; another name as given."""
    for known in HIRES_UPSCALERS:
        if name.strip().lower() == known.lower():
            return known
    return name.strip()


def sdapi_hires(body: Mapping[str, Any], out: ParsedRequest) -> None:
    """A1111's hires fields (module docstring) as sdplan's hires request."""
    fix: dict[str, Any] = {"enabled": True}
    upscaler = read_str(body, "hr_upscaler")
    if upscaler is not None and upscaler.strip():
        name = _canonical_upscaler(upscaler)
        if name == "None":
            raise refuse("hr_upscaler", "'None' would turn sdplan's hires fix off; name an upscaler ("
                         + ", ".join(HIRES_UPSCALERS[1:]) + ", or an upscaler model of this server's "
                         "library) or send enable_hr false")
        fix["upscaler"] = name
        out.fields["hires_upscaler"] = "hr_upscaler"
    scale = read_num(body, "hr_scale", key="hires_scale")
    rx = read_int(body, "hr_resize_x", low=0, key="hires_width") or 0
    ry = read_int(body, "hr_resize_y", low=0, key="hires_height") or 0
    if rx or ry:
        out.hires_resize = (rx, ry)
        out.fields["hires_resize"] = "hr_resize_x/hr_resize_y"
    elif scale is not None:
        if scale <= 0:
            raise refuse("hr_scale", f"must be positive when hr_resize_x and hr_resize_y are 0, got {scale:g}")
        fix["scale"] = scale
    steps = read_int(body, "hr_second_pass_steps", low=0, key="hires_steps")
    alias = read_int(body, "hr_steps", low=0, key="hires_steps")  # sd-server's name
    if steps is not None and alias is not None and steps != alias:
        raise refuse("hr_steps", f"differs from hr_second_pass_steps ({alias} and {steps}); send one")
    put(fix, steps=steps if steps is not None else alias,
        denoising_strength=_strength(body, "denoising_strength"))
    first = {"hr_sampler_name": body.get("sampler_name"), "hr_scheduler": body.get("scheduler"),
             "hr_prompt": body.get("prompt"), "hr_negative_prompt": body.get("negative_prompt"),
             "hr_cfg": body.get("cfg_scale")}
    for name, same in _SDAPI_SAME.items():
        v = body.get(name)
        if v is None or v == "" or v == [] or v == first.get(name):
            continue
        if isinstance(v, str) and v.strip().lower() in same:
            continue
        if isinstance(v, list) and [str(x).strip().lower() for x in v] == list(same):
            continue
        raise refuse(name, f"sdplan's hires fix runs the second pass with the first pass's settings; "
                     f"send {name} empty or the same as the first pass, got {text(v)}")
    out.settings["hires"] = fix


def resolve_hires(parsed: ParsedRequest, settings: dict[str, Any], width: int, height: int,
                  upscalers: Mapping[str, str]) -> None:
    """Finish ``settings``' hires request (``parsed.settings`` with the model's defaults
    under it) for a first pass of ``width`` x ``height`` pixels: A1111's ``hr_resize_x`` /
    ``hr_resize_y`` as a target size (module docstring), and a model upscaler's name found in
    ``upscalers`` (model stem -> file path, the server's library) as sd-cli's
    ``--hires-upscaler NAME --hires-upscalers-dir DIR``. ``parsed.settings`` gets the result
    (what the engine runs).

    Raises:
        RequestRefused: a target with another aspect ratio than the picture, or an upscaler
            model the library does not hold, naming the client's field and value.
    """
    fix = settings.get("hires")
    if not isinstance(fix, dict) or not fix.get("enabled"):
        return
    fix = dict(fix)
    if parsed.hires_resize is not None and width > 0 and height > 0:
        rx, ry = parsed.hires_resize
        name = parsed.fields.get("hires_resize", "hr_resize_x/hr_resize_y")
        if rx and ry and rx * height != ry * width:
            raise refuse(name, f"{rx}x{ry} has another aspect ratio than the {width}x{height} picture; "
                         "A1111 crops to it, sdplan's hires fix does not: give one side (0 for the other) "
                         "or a size of the picture's aspect ratio")
        if not ry:
            rx, ry = rx, rx * height // width
        elif not rx:
            rx, ry = ry * width // height, ry
        if not rx or not ry:
            raise refuse(name, f"{parsed.hires_resize[0]}x{parsed.hires_resize[1]} leaves no picture at the "
                         f"{width}x{height} picture's aspect ratio")
        for key, v in (("hires_width", rx), ("hires_height", ry)):
            limit(name, key, v)
        fix.update(width=rx, height=ry)
    up = str(fix.get("upscaler") or "Latent")
    if up not in HIRES_UPSCALERS:
        field_name = parsed.fields.get("hires_upscaler", "hires.upscaler")
        path = upscalers.get(up) or next((p for p in upscalers.values() if PurePath(p).name == up), None)
        if path is None:
            have = ", ".join(sorted(upscalers)) or "none"
            raise refuse(field_name, f"{up[:80]!r} is neither one of sdplan's upscalers ("
                         + ", ".join(u for u in HIRES_UPSCALERS if u != "None")
                         + f") nor an upscaler model of this server's library (its upscaler models: {have})")
        fix.update(upscaler=PurePath(path).stem, upscalers_dir=str(PurePath(path).parent))
    parsed.settings["hires"] = settings["hires"] = fix
