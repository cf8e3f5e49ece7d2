"""The fields of a client's request body read one at a time: :class:`ParsedRequest` (a
request in sdplan's terms) and the readers of a whole number, a finite number, text and a
flag, each refusing a value of the wrong type, or out of the command line's limits
(:data:`sdplan.core.pipelines.limits.SETTING_RANGES`), with a
:class:`~sdplan.core.errors.RequestRefused` naming the field as the client spelled it. Pure
Python.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sdplan.core.errors import InvalidArgument, RequestRefused
from sdplan.core.pipelines.limits import check_setting

__all__ = ["ParsedRequest", "refuse", "read_int", "read_num", "read_str", "read_bool", "put", "limit", "text"]


@dataclass
class ParsedRequest:
    """One client request in sdplan's terms.

    Attributes:
        api: ``sdapi``, ``openai`` or ``sdcpp`` (how the answer is shaped).
        settings: sd-cli's request keys (``prompt``, ``width``, ``steps``, ``cfg_scale``,
            ``sampling_method``, ``batch_count``, ``strength``...); absent keys take the
            family's defaults.
        model: the model the request names (None: the served default).
        pictures: ``init_img``, ``mask`` (bytes) and ``ref_images`` (list of bytes) the
            request carries; written to files for the engine before the job runs. An
            OpenAI edit's pictures are ``edit`` (list of bytes) until the model's family
            says whether it edits from an init picture or from reference pictures.
        mask_invert: invert the mask (A1111's ``inpainting_mask_invert``).
        output_format: ``png``, ``jpeg`` or ``webp``; output_compression: 0..100.
        echo: the body as received, for A1111's ``parameters`` in the answer.
        fields: a request key (``init_img``, ``mask``, ``ref_images``, ``hires_upscaler``,
            ``hires_resize``) -> the field the client named it with (``init_images[0]``,
            ``hr_upscaler``...), for the refusals of later checks.
        hires_resize: A1111's ``(hr_resize_x, hr_resize_y)`` in pixels (either may be 0),
            resolved against the first pass's size by :func:`resolve_hires`; None without.
    """

    api: str
    settings: dict[str, Any]
    model: str | None = None
    pictures: dict[str, Any] = field(default_factory=dict)
    mask_invert: bool = False
    output_format: str = "png"
    output_compression: int = 100
    echo: dict[str, Any] = field(default_factory=dict)
    fields: dict[str, str] = field(default_factory=dict)
    hires_resize: tuple[int, int] | None = None


def refuse(name: str, what: str) -> RequestRefused:
    """``NAME: WHAT`` as a 400 ``invalid_parameter`` refusal."""
    return RequestRefused(f"{name}: {what}", "invalid_parameter", 400)


def limit(name: str, key: str | None, value: float) -> None:
    """The command line's limit of the request key ``key`` (None: none) on ``value``."""
    if key is not None:
        try:
            check_setting(name, key, value)
        except InvalidArgument as exc:  # "NAME must be ..." as every refusal here: "NAME: must be ..."
            text = str(exc)
            raise refuse(name, text[len(name):].strip() if text.startswith(name) else text) from None


def read_int(body: Mapping[str, Any], name: str, *, low: int | None = None, key: str | None = None,
         where: str = "") -> int | None:
    """``body[name]`` as a whole number (None when absent), at least ``low`` and within the
    limit of request key ``key``; refusals name ``where + name``."""
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise refuse(where + name, f"must be a whole number, got {text(v)}")
    if low is not None and v < low:
        raise refuse(where + name, f"must be at least {low}, got {text(v)}")
    limit(where + name, key, v)
    return int(v)


def read_num(body: Mapping[str, Any], name: str, *, key: str | None = None, where: str = "") -> float | None:
    """``body[name]`` as a finite number (None when absent) within the limit of request key
    ``key``; refusals name ``where + name``."""
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
        raise refuse(where + name, f"must be a finite number, got {text(v)}")
    limit(where + name, key, float(v))
    return float(v)


def text(v: Any) -> str:
    """A client's value as short JSON text (NaN and infinities as Python writes them)."""
    try:
        return json.dumps(v)[:40]
    except (TypeError, ValueError):
        return repr(v)[:40]


def read_str(body: Mapping[str, Any], name: str) -> str | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, str):
        raise refuse(name, f"must be text, got {json.dumps(v)[:40]}")
    return v


def read_bool(body: Mapping[str, Any], name: str) -> bool:
    v = body.get(name)
    if v is None:
        return False
    if isinstance(v, bool) or v in (0, 1):
        return bool(v)
    raise refuse(name, f"must be true or false, got {json.dumps(v)[:40]}")


def put(settings: dict[str, Any], **values: Any) -> None:
    """Set the ``values`` that are not None in ``settings``."""
    settings.update({k: v for k, v in values.items() if v is not None})
