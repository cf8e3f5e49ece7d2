"""What a generation runs beyond its model set, for the board, the generation panel and the
queue, without Qt: the hires fix, VAE tiling and ControlNet (sd-cli's request keys: ``hires``,
``vae_tiling``, ``control_net``, ``control_image``, ``control_strength``, ``canny``).

- :func:`option_refusals`: per panel group, the line the open family's registry entry
  refuses it with (the family's capability: :meth:`~sdplan.core.families.declaration.Family.honours`),
  or None where the family takes it.
- :func:`esrgan_models`: the ESRGAN models a hires upscalers folder holds, by the names
  ``--hires-upscaler`` takes.
- :func:`late_modules` and :func:`with_late_modules`: the ``upscaler`` and ``controlnet``
  modules the settings run (their files), added to the profile so the board shows their
  cards, the plan places them and the estimate counts their weights, as ``sdplan generate``
  counts them (``core/commands/generate_modules.py``; the tests hold the two equal).
- :func:`peak_size`: the largest picture a run samples (the hires fix's second pass).
- :func:`ref_pictures`: an edit's reference pictures (``ref_images``, ``-r`` each).
- :func:`module_flags`: these settings as sd-cli's flags in a dialect (``--vae-tile-size``
  in image pixels for the newest, latent pixels for the snapshot).
- :func:`module_summary`: one phrase per option a queued request runs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sdplan.core.errors import InvalidArgument, PlanError, SdplanError
from sdplan.core.families import family_of
from sdplan.core.families import options as o
from sdplan.core.pipelines.request_parts import (
    HIRES_UPSCALERS,
    MODEL_EXTENSIONS,
    HiresFix,
    VideoSettings,
)
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.vae_tiling import VaeTiling, convert_tile_size
from sdplan.core.sampling.names import SAMPLERS

__all__ = ["GROUP_OPTIONS", "option_refusals", "esrgan_models", "late_modules",
           "late_module_profile", "with_late_modules", "peak_size", "module_flags",
           "module_summary", "command_changes", "lift_module_args", "UPSCALER_WEIGHT_BYTES",
           "HIGH_NOISE_FLAGS", "takes_high_noise", "ref_pictures"]

#: The generation panel's groups -> the registry option each one sets.
GROUP_OPTIONS = {"hires": o.HIRES, "vae_tiling": o.VAE_TILING, "control": o.CONTROL}
#: The family a model set no rule recognises runs as (``sdplan.core.pipelines.request.FALLBACK``).
_FALLBACK = "sd1"
#: Bytes per upscaler parameter as the engine holds it: f32 (``stages/upscale.py``).
UPSCALER_WEIGHT_BYTES = 4


def option_refusals(architecture: str | None) -> dict[str, str | None]:
    """Group (``hires``, ``vae_tiling``, ``control``) -> the one line the family of
    ``architecture`` refuses it with, in the engine's words
    (:meth:`~sdplan.core.pipelines.request.GenerationRequest.check`: ``--hires: FLUX.2 klein
    does not take it in sdplan``), or None where it takes it. An unknown architecture runs
    as SD 1.x (the engine's fallback)."""
    fam = family_of(architecture) or family_of(_FALLBACK)
    out: dict[str, str | None] = {}
    for group, option in GROUP_OPTIONS.items():
        if fam is None or fam.honours(option):
            out[group] = None
        else:
            out[group] = f"{o.OPTIONS[option]}: {fam.title} does not take it in sdplan"
    return out


def esrgan_models(folder: str | Path | None) -> list[str]:
    """The model names ``--hires-upscaler`` takes from ``folder`` (``--hires-upscalers-dir``):
    each file with one of :data:`MODEL_EXTENSIONS` (``.gguf``, ``.safetensors``, ``.pt``,
    ``.pth``), named without path or extension, sorted, each once; names sd-cli keeps for its
    own upscalers are left out. Empty for no folder or one that cannot be listed."""
    if not folder:
        return []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    names = {Path(e.name).stem for e in entries
             if e.name.lower().endswith(MODEL_EXTENSIONS) and e.is_file()}
    return sorted(n for n in names if n not in HIRES_UPSCALERS)


def late_modules(generation: Mapping[str, Any], model_files: Mapping[str, Sequence[str]]
                 ) -> dict[str, str]:
    """Module (``upscaler``, ``controlnet``) -> the file it runs: the ``upscale_model`` file,
    else the hires fix's ESRGAN model (when on and its file is found); the ``control_net``
    setting. A hires model name without a file is left out here (the request's check names
    it)."""
    out: dict[str, str] = {}
    up = next(iter(model_files.get("upscale_model") or ()), None)
    if not up:
        try:
            up = HiresFix.from_request(generation).model_path()
        except InvalidArgument:
            up = None
    if up:
        out["upscaler"] = str(up)
    if generation.get("control_net"):
        out["controlnet"] = str(generation["control_net"])
    return out


def late_module_profile(module: str, path: str) -> ModuleProfile:
    """The weight bytes of ``module`` (``upscaler`` or ``controlnet``) as the engine holds
    them: an upscaler's parameters in f32 (a safetensors/GGUF header's shapes; a ``.pth``
    pickle's file size, its f32 storage), a ControlNet's tensors as stored (its header).

    Raises:
        ModelFileError: an unreadable file or one that is no model.
    """
    from sdplan.core.modelfiles.checkpoint import read_model_files
    from sdplan.core.modelfiles.readers import check_model_file, read_tensor_file

    check_model_file(path)
    if module == "upscaler":
        if path.lower().endswith((".pth", ".ckpt", ".pt")):
            return ModuleProfile(other=os.path.getsize(path))
        tf = read_tensor_file(path)
        return ModuleProfile(other=sum(math.prod(t.shape) for t in tf.tensors) * UPSCALER_WEIGHT_BYTES)
    return read_model_files({"control_net": [path]}).module_profile("controlnet")


def with_late_modules(profile: Profile | None, late: Mapping[str, str],
                      notes: list[str] | None = None) -> Profile | None:
    """``profile`` with the modules of ``late`` (:func:`late_modules`) added with their
    weights (:func:`late_module_profile`); a file that cannot be read is left out, with a
    line in ``notes``. None stays None (sizes unknown)."""
    if profile is None or not late:
        return profile
    mods = dict(profile.modules)
    for module, path in late.items():
        try:
            mods[module] = late_module_profile(module, path)
        except (SdplanError, OSError, ValueError) as exc:
            if notes is not None:
                notes.append(f"{module} not counted: {exc}")
    return replace(profile, modules=mods) if mods != dict(profile.modules) else profile


def peak_size(generation: Mapping[str, Any], architecture: str | None) -> tuple[int, int]:
    """``(width, height)`` in pixels of the largest picture a run of ``generation`` samples:
    the hires fix's second pass when it is on (aligned as the family's pipeline aligns it: 64
    pixels for a UNet, two latent pixels for a flow DiT), else the picture (1024 when unset)."""
    w, h = int(generation.get("width") or 1024), int(generation.get("height") or 1024)
    try:
        fix = HiresFix.from_request(generation)
    except InvalidArgument:
        return w, h
    if not fix.active:
        return w, h
    fam = family_of(architecture) or family_of(_FALLBACK)
    multiple = 64 if fam is None or fam.size_rule == "unet" else 2 * fam.vae_scale
    return fix.target(w, h, multiple)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def module_flags(generation: Mapping[str, Any], dialect: str | None = None, scale: int = 8) -> list[str]:
    """A video run's ``-M vid_gen`` and ``--video-frames`` (``--fps`` away from sd-cli's 16),
    a two-stage model's ``--high-noise-*`` and ``--moe-boundary`` (:data:`HIGH_NOISE_FLAGS`,
    each away from sd-cli's default), ``-r PATH`` per reference picture (``ref_images``, in
    order: :func:`ref_pictures`), then the hires fix, ControlNet and VAE tiling of ``generation`` as sd-cli's flags, each
    written only when on, values away from sd-cli's defaults only. ``--vae-tile-size`` is in
    image pixels, converted to latent pixels (``scale`` image pixels each) for the
    ``snapshot`` dialect (spec section 14.7).

    Raises:
        InvalidArgument: malformed video, hires or ControlNet values (naming the flag);
            PlanError: malformed tiling.
    """
    argv: list[str] = []
    video = VideoSettings.from_request(generation)
    if video.video:
        argv += ["-M", "vid_gen", "--video-frames", str(video.frames)]
        argv += ["--fps", str(video.fps)] if video.fps != VideoSettings.fps else []
    for flag, key in HIGH_NOISE_FLAGS.items():  # a two-stage model's first phase
        value, default = video.to_request()[key], VideoSettings().to_request()[key]
        if value is not None and value != default:
            argv += [flag, _num(value) if isinstance(value, (int, float)) else str(value)]
    for path in ref_pictures(generation):  # an edit's reference pictures, in order
        argv += ["-r", path]
    fix = HiresFix.from_request(generation)
    if fix.enabled:
        d = HiresFix()
        argv.append("--hires")
        for flag, value, default in (("--hires-upscaler", fix.upscaler, d.upscaler),
                                     ("--hires-upscalers-dir", fix.upscalers_dir, d.upscalers_dir),
                                     ("--hires-scale", fix.scale, d.scale),
                                     ("--hires-width", fix.width, d.width),
                                     ("--hires-height", fix.height, d.height),
                                     ("--hires-steps", fix.steps, d.steps),
                                     ("--hires-denoising-strength", fix.denoising_strength,
                                      d.denoising_strength)):
            if value != default and value is not None:
                argv += [flag, _num(value) if isinstance(value, (int, float)) else str(value)]
    if generation.get("control_net"):
        argv += ["--control-net", str(generation["control_net"])]
        if generation.get("control_image"):
            argv += ["--control-image", str(generation["control_image"])]
        strength = generation.get("control_strength")
        if strength is not None and float(strength) != 0.9:
            argv += ["--control-strength", _num(float(strength))]
        if generation.get("canny"):
            argv.append("--canny")
    raw = generation.get("vae_tiling")
    tiling = VaeTiling.from_json(raw) if raw else VaeTiling()
    if tiling.enabled or tiling.customised:
        argv += ["--vae-tiling"] if tiling.enabled else []
        if any(tiling.tile_px):
            text = f"{tiling.tile_px[0]}x{tiling.tile_px[1]}"
            if dialect == "snapshot":
                text = convert_tile_size(text, "newest", "snapshot", scale)
            argv += ["--vae-tile-size", text]
        if tiling.overlap != 0.5:
            argv += ["--vae-tile-overlap", _num(tiling.overlap)]
        if tiling.relative is not None:
            argv += ["--vae-relative-tile-size", "x".join(_num(v) for v in tiling.relative)]
    return argv


def ref_pictures(generation: Mapping[str, Any]) -> list[str]:
    """The reference pictures (``ref_images``: sd-cli's ``-r/--ref-image``, repeated) of
    ``generation`` as paths in order; none for an absent, empty or malformed value (one path
    given as a string is one picture)."""
    value = generation.get("ref_images")
    if isinstance(value, (str, Path)):
        return [str(value)] if str(value) else []
    if not isinstance(value, (list, tuple)):
        return []
    return [str(p) for p in value if p not in (None, "")]


def module_summary(request: Mapping[str, Any]) -> list[str]:
    """One phrase per option a request (a queued job's JSON, or settings) runs beyond its
    model set, for people: ``hires 2× Latent, 10 steps, denoise 0.5``, ``ControlNet
    canny_cn.safetensors × 0.8 (Canny)``, ``VAE tiles 256×256 px``, ``edit of 2 reference
    pictures``, ``upscaler x4.safetensors``. Malformed parts are left out (the engine names them)."""
    out: list[str] = []
    try:
        fix = HiresFix.from_request(request)
    except InvalidArgument:
        fix = HiresFix()
    if fix.active:
        size = f"{fix.width or fix.height}×{fix.height or fix.width} px" if (fix.width or fix.height) \
            else f"{_num(fix.scale)}×"
        parts = [f"hires {size} {fix.upscaler}"]
        parts += [f"{fix.steps} steps"] if fix.steps else []
        parts.append(f"denoise {_num(fix.denoising_strength)}")
        out.append(", ".join(parts))
    if request.get("control_net"):
        given = request.get("control")
        ctl: Mapping[str, Any] = given if isinstance(given, Mapping) else request
        strength = ctl.get("control_strength")
        text = f"ControlNet {Path(str(request['control_net'])).name} × " \
               f"{_num(float(strength) if strength is not None else 0.9)}"
        out.append(text + (" (Canny)" if ctl.get("canny") else ""))
    try:
        raw = request.get("vae_tiling")
        tiling = VaeTiling.from_json(raw) if raw else VaeTiling()
    except PlanError:
        tiling = VaeTiling()
    if tiling.enabled:
        if tiling.relative is not None:
            out.append("VAE tiles " + "×".join(_num(v) for v in tiling.relative) + " relative")
        else:
            w, h = (v or 256 for v in tiling.tile_px)
            out.append(f"VAE tiles {w}×{h} px")
    refs = ref_pictures(request)
    if refs:
        out.append(f"edit of {len(refs)} reference picture{'s' if len(refs) != 1 else ''}")
    files = request.get("model_files") or {}
    up = next(iter(files.get("upscale_model") or ()), None) if isinstance(files, Mapping) else None
    if up:
        out.append(f"upscaler {Path(str(up)).name}")
    return out


def command_changes(before: str, after: str) -> list[str]:
    """What ``after`` (a shell-quoted command line) changes of ``before``, token by token, for
    people: ``+ --auto-fit off`` (added), ``- --stream-layers`` (left out),
    ``--vae-tile-size 16x16 → 128x128`` (a value changed; the flag before it named). Empty when
    they are the same."""
    import difflib
    import shlex

    a, b = shlex.split(before), shlex.split(after)
    out: list[str] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "insert":
            out.append("+ " + shlex.join(b[j1:j2]))
        elif op == "delete":
            out.append("- " + shlex.join(a[i1:i2]))
        elif op == "replace":
            flag = a[i1 - 1] + " " if i1 > 0 and a[i1 - 1].startswith("-") and not a[i1].startswith("-") else ""
            out.append(f"{flag}{shlex.join(a[i1:i2])} → {shlex.join(b[j1:j2])}")
    return out


#: ``--hires-*`` flags -> the hires fix's attribute and its type.
_HIRES_FLAGS = {"--hires-upscaler": ("upscaler", str), "--hires-upscalers-dir": ("upscalers_dir", str),
                "--hires-scale": ("scale", float), "--hires-width": ("width", int),
                "--hires-height": ("height", int), "--hires-steps": ("steps", int),
                "--hires-denoising-strength": ("denoising_strength", float)}
_TILE_FLAGS = ("--vae-tiling", "--vae-tile-size", "--vae-tile-overlap", "--vae-relative-tile-size")
_CONTROL_FLAGS = ("--control-image", "--control-strength", "--canny")
#: A video run's flags -> their request keys (taken with ``-M vid_gen``).
_VIDEO_FLAGS = {"--mode": "mode", "--video-frames": "video_frames", "--fps": "fps"}
#: A two-stage model's high-noise phase: sd-cli's flags -> their request keys
#: (:class:`~sdplan.core.pipelines.request_parts.VideoSettings`), in written order.
HIGH_NOISE_FLAGS = {"--high-noise-steps": "high_noise_steps", "--high-noise-cfg-scale": "high_noise_cfg_scale",
                    "--high-noise-sampling-method": "high_noise_sampling_method",
                    "--high-noise-eta": "high_noise_eta", "--moe-boundary": "moe_boundary"}


def takes_high_noise(architecture: str | None) -> bool:
    """Whether the family (and variant) of ``architecture`` honours the high-noise phase's
    options (:data:`sdplan.core.families.options.HIGH_NOISE`: ``--high-noise-diffusion-model``,
    ``--high-noise-*``, ``--moe-boundary``), as its registry entry says."""
    from sdplan.core.families import variant_of

    fam = family_of(architecture)
    return fam is not None and fam.honours(o.HIGH_NOISE, variant_of(architecture))


def lift_module_args(kept: Sequence[str], control_net: str | None, dialect: str | None,
                     scale: int, *, high_noise: bool = False) -> tuple[dict[str, Any], list[str]]:
    """A pasted command's kept arguments split into the settings of the panel's groups
    (sd-cli's request keys ``hires``, ``vae_tiling``, ``control_net``, ``control_image``,
    ``control_strength``, ``canny``; a video's ``mode``, ``video_frames``, ``fps``; with
    ``high_noise`` (the family takes them: :func:`takes_high_noise`) the high-noise phase's
    :data:`HIGH_NOISE_FLAGS` keys; ``ref_images``: each ``-r/--ref-image`` path, in order) and
    the arguments still kept, in order.

    The video flags are taken with ``-M vid_gen`` (without it sd-cli makes pictures: they stay
    kept). The high-noise flags stay kept when sd-cli would refuse a value (a sampler it does
    not have, a boundary outside 0..1).
    The hires flags are taken with ``--hires`` (without it sd-cli ignores them: they stay
    kept); the ControlNet's with its file ``control_net`` (a pasted ``--control-net``); the
    VAE tiling's always, ``--vae-tile-size`` read in ``dialect``'s units (snapshot: latent
    pixels, ``scale`` image pixels each; None: image pixels). A part whose values sd-cli would
    refuse stays kept as written (the written command carries it; the request names it).
    """
    from sdplan.core.planning.sdcli import parse_sdcli_args
    from sdplan.core.planning.vae_tiling import parse_overlap, parse_relative_size, parse_tile_size

    args = parse_sdcli_args(list(kept))
    given = {a.flag for a in args}
    parts: dict[str, list[Any]] = {"hires": [], "tiles": [], "control": [], "video": [], "high": [],
                                   "refs": []}
    rest: list[Any] = []
    video = any(a.flag == "--mode" and a.values == ("vid_gen",) for a in args)
    for a in args:
        if a.flag == "--ref-image" and a.values and a.values[0]:
            parts["refs"].append(a)
        elif a.flag in _VIDEO_FLAGS and a.values and video:
            parts["video"].append(a)
        elif a.flag in HIGH_NOISE_FLAGS and a.values and high_noise:
            parts["high"].append(a)
        elif a.flag == "--hires" or (a.flag in _HIRES_FLAGS and a.values and "--hires" in given):
            parts["hires"].append(a)
        elif a.flag in _TILE_FLAGS and (a.values or a.flag == "--vae-tiling"):
            parts["tiles"].append(a)
        elif a.flag in _CONTROL_FLAGS and control_net and (a.values or a.flag == "--canny"):
            parts["control"].append(a)
        else:
            rest.append(a)
    out: dict[str, Any] = {}
    if parts["refs"]:
        out["ref_images"] = [a.values[0] for a in parts["refs"]]
    if parts["video"]:
        keys = {_VIDEO_FLAGS[a.flag]: a.values[0] for a in parts["video"]}  # the last one wins
        try:
            v = VideoSettings.from_request(keys)
            out.update(mode=v.mode, video_frames=v.frames, fps=v.fps)
        except InvalidArgument:
            rest += parts["video"]
    if parts["high"]:
        keys = {HIGH_NOISE_FLAGS[a.flag]: a.values[0] for a in parts["high"]}  # the last one wins
        try:
            hv = VideoSettings.from_request(keys)
            if hv.high_sampling_method not in (None, *SAMPLERS):
                raise InvalidArgument(f"--high-noise-sampling-method {hv.high_sampling_method!r}")
            out.update({k: v for k, v in hv.to_request().items() if k in keys})
        except InvalidArgument:
            rest += parts["high"]
    if parts["hires"]:
        d: dict[str, Any] = {"enabled": True}
        try:
            for a in parts["hires"]:
                if a.flag in _HIRES_FLAGS:
                    key, typ = _HIRES_FLAGS[a.flag]
                    d[key] = typ(a.values[0])
            out["hires"] = HiresFix.from_request({"hires": d}).to_json()
        except (ValueError, InvalidArgument):
            rest += parts["hires"]
    if parts["tiles"]:
        tiling = VaeTiling()
        try:
            for a in parts["tiles"]:
                if a.flag == "--vae-tiling":
                    tiling = replace(tiling, enabled=True)
                elif a.flag == "--vae-tile-size":
                    text = convert_tile_size(a.values[0], dialect or "newest", "newest", scale)
                    tiling = replace(tiling, tile_px=parse_tile_size(text))
                elif a.flag == "--vae-tile-overlap":
                    tiling = replace(tiling, overlap=min(max(parse_overlap(a.values[0]), 0.0), 0.5))
                else:
                    tiling = replace(tiling, relative=parse_relative_size(a.values[0]))
            out["vae_tiling"] = tiling.to_json()
        except PlanError:
            rest += parts["tiles"]
    if control_net:
        c: dict[str, Any] = {"control_net": control_net, "control_image": None, "control_strength": 0.9,
                             "canny": False}
        try:
            for a in parts["control"]:
                if a.flag == "--canny":
                    c["canny"] = True
                elif a.flag == "--control-image":
                    c["control_image"] = a.values[0]
                else:
                    c["control_strength"] = float(a.values[0])
                    if not math.isfinite(c["control_strength"]):
                        raise ValueError(a.values[0])
            out.update(c)
        except ValueError:
            rest += parts["control"]
            out["control_net"] = control_net
    order = {id(a): i for i, a in enumerate(args)}
    return out, [t for a in sorted(rest, key=lambda a: order[id(a)]) for t in a.tokens]
