"""A finished run, as the app keeps it: the record its pictures carry and the caption it
shows (no Qt; the pictures themselves are written by
:func:`sdplan.core.pipelines.stages.results.picture_text` and ``save_png``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdplan.core.errors import SdplanError

#: The request keys of a video run (``-M vid_gen``, ``--video-frames``, ``--fps``, and a
#: two-stage model's ``--high-noise-*`` and ``--moe-boundary``) that "Reuse settings" gives
#: back with the generation flags.
VIDEO_KEYS = ("mode", "video_frames", "fps", "high_noise_steps", "high_noise_cfg_scale",
              "high_noise_sampling_method", "high_noise_eta", "moe_boundary")


def describe_params(params: Mapping[str, Any]) -> str:
    """One caption line for a result's parameters: prompt, size, steps, CFG, seed, sampler,
    a video's frames and frame rate, and the run time in seconds when known
    (``timings['total']``)."""
    parts = []
    if params.get("prompt"):
        parts.append(f"“{params['prompt']}”")
    if params.get("width") and params.get("height"):
        parts.append(f"{params['width']}×{params['height']}")
    for key, label in (("steps", "steps"), ("cfg_scale", "CFG"), ("seed", "seed"),
                       ("sampling_method", "")):
        if params.get(key) is not None:
            parts.append(f"{label} {params[key]}".strip())
    video = params.get("video")  # the engine's word on a video run, else the request's
    if isinstance(video, dict):
        parts.append(f"{video.get('frames') or 1} frames at {video.get('fps') or 16} fps")
    elif params.get("mode") == "vid_gen":
        parts.append(f"{params.get('video_frames') or 1} frames at {params.get('fps') or 16} fps")
    timings = params.get("timings")
    if isinstance(timings, dict) and isinstance(timings.get("total"), (int, float)):
        parts.append(f"{timings['total']:.1f} s")
    return "  ·  ".join(parts)


def request_settings(request: Mapping[str, Any]) -> dict[str, Any]:
    """The settings an engine request (JSON form) asked for; empty for a malformed one."""
    from sdplan.core.pipelines.request import GenerationRequest

    try:
        return GenerationRequest.from_dict(request).settings()
    except (SdplanError, ValueError, TypeError):
        return {}


def run_record(result: Mapping[str, Any], request: Mapping[str, Any]) -> dict[str, Any]:
    """The record a run's pictures carry: the engine's ``result`` (``params``, ``plan``,
    ``model_flags``, ``placements``, ``timings``; or its params alone) over the settings of
    the ``request`` it came from (the engine's word wins), and the request's own plan
    strings when the engine named none."""
    record = dict(result) if "params" in result else {"params": dict(result)}
    record["params"] = {**request_settings(request), **record["params"]}
    if not record.get("plan"):
        plan = request.get("plan") or {}
        record["plan"] = dict(plan.get("strings") or {}) if isinstance(plan, dict) else {}
    return record
