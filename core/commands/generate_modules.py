"""The modules a generation places beyond its model set: the upscaler (``--upscale-model``, a
hires fix's ESRGAN) and ControlNet (``--control-net``), sized for the plan's estimate; and the
flags of ``sdplan generate`` that run them and the VAE's tiles, as the newest sd-cli spells
them (``--vae-tiling``, ``--vae-tile-size WxH``, ``--vae-tile-overlap``,
``--vae-relative-tile-size``).

``sdplan generate`` reads the model set's headers before the engine starts; the files read
later by their own stages (an upscaler may be a ``.pth`` pickle the engine reads) join the
profile here so the plan places them and the estimate counts their weights on their devices.
Pure Python: no numpy before the engine has its job.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from sdplan.core.errors import InvalidArgument, PlanError
from sdplan.core.pipelines.limits import MAX_PICTURE_PX, MAX_STEPS, check_hires_scale
from sdplan.core.planning.profile import ModuleProfile, Profile

__all__ = ["UPSCALER_WEIGHT_BYTES", "late_module_profile", "with_late_modules", "add_module_arguments",
           "module_request", "hires_size", "MAX_TILE_PX"]

#: Largest ``--vae-tile-size`` side (image pixels): the largest picture side generate draws.
MAX_TILE_PX = MAX_PICTURE_PX


def add_module_arguments(p: argparse.ArgumentParser) -> None:
    """Add the VAE tiling, hires fix and ControlNet flags (module docstring) to ``sdplan
    generate``."""
    h = p.add_argument_group("hires fix (sd-cli's flags)")
    h.add_argument("--hires", action="store_true", help="a second pass at a larger size (sd-cli's hires fix)")
    h.add_argument("--hires-upscaler", default="Latent",
                   help="Latent, Latent (nearest), Latent (nearest-exact), Latent (antialiased), Latent (bicubic), "
                        "Latent (bicubic antialiased), Lanczos, Nearest, None, or an ESRGAN model's name in "
                        "--hires-upscalers-dir (default: Latent)")
    h.add_argument("--hires-upscalers-dir", metavar="DIR", help="folder of the ESRGAN models --hires-upscaler names")
    h.add_argument("--hires-scale", type=float, default=2.0, help="hires size over the picture's (default 2)")
    h.add_argument("--hires-width", type=int, default=0, help="hires width in pixels (0: from --hires-scale)")
    h.add_argument("--hires-height", type=int, default=0, help="hires height in pixels (0: from --hires-scale)")
    h.add_argument("--hires-steps", type=int, default=0, help="second pass steps (0: --steps)")
    h.add_argument("--hires-denoising-strength", type=float, default=0.7,
                   help="how much the second pass changes the upscaled picture, (0, 1] (default 0.7)")
    c = p.add_argument_group("ControlNet (sd-cli's flags)")
    c.add_argument("--control-net", metavar="PATH", help="ControlNet model file (SD 1.x/2.x, SDXL)")
    c.add_argument("--control-image", metavar="PATH", help="the picture that steers ControlNet")
    c.add_argument("--control-strength", type=float, default=0.9, help="ControlNet's strength (default 0.9)")
    c.add_argument("--canny", action="store_true", help="apply the Canny edge preprocessor to --control-image")
    g = p.add_argument_group("VAE tiling (the newest sd-cli's flags)")
    g.add_argument("--vae-tiling", action="store_true",
                   help="decode (and encode) the picture in overlapping tiles")
    g.add_argument("--vae-tile-size", metavar="N|WxH", default="0",
                   help="tile size in image pixels (0: 256); without --vae-tiling, the tiles of the "
                        "retry after a decode that does not fit the VAE's device")
    g.add_argument("--vae-tile-overlap", metavar="F", default="0.5",
                   help="overlap of the tiles, a fraction of a tile (0..0.5; default 0.5)")
    g.add_argument("--vae-relative-tile-size", metavar="R|RxR",
                   help="tile size relative to the picture: up to 1 a fraction of it, above 1 "
                        "tiles per side (overrides --vae-tile-size)")


def module_request(args: argparse.Namespace) -> dict[str, Any]:
    """The request keys of the flags :func:`add_module_arguments` adds (``vae_tiling``).

    Raises:
        InvalidArgument: a malformed or out-of-range value, naming its flag.
    """
    from sdplan.core.planning.vae_tiling import (
        VaeTiling,
        parse_overlap,
        parse_relative_size,
        parse_tile_size,
    )

    try:
        size = parse_tile_size(str(getattr(args, "vae_tile_size", "0") or "0"))
        overlap = parse_overlap(str(getattr(args, "vae_tile_overlap", "0.5") or "0.5"))
        rel_text = getattr(args, "vae_relative_tile_size", None)
        relative = parse_relative_size(str(rel_text)) if rel_text else None
    except PlanError as exc:
        raise InvalidArgument(str(exc)) from None
    if max(size) > MAX_TILE_PX:
        raise InvalidArgument(f"--vae-tile-size {args.vae_tile_size}: at most {MAX_TILE_PX} pixels a side")
    if relative is not None and max(relative) > MAX_TILE_PX:
        raise InvalidArgument(f"--vae-relative-tile-size {rel_text}: at most {MAX_TILE_PX} tiles a side")
    tiling = VaeTiling(bool(getattr(args, "vae_tiling", False)), size, overlap, relative)
    out: dict[str, Any] = {"vae_tiling": tiling.to_json() if tiling.enabled or tiling.customised else None}
    if getattr(args, "hires", False):
        from sdplan.core.pipelines.request_parts import HiresFix

        for flag, value, high in (("--hires-width", args.hires_width, MAX_TILE_PX),
                                  ("--hires-height", args.hires_height, MAX_TILE_PX),
                                  ("--hires-steps", args.hires_steps, MAX_STEPS)):
            if not 0 <= int(value) <= high:
                raise InvalidArgument(f"{flag} {value}: must be in 0..{high}")
        check_hires_scale(args.hires_scale)
        fix = HiresFix(True, args.hires_upscaler, args.hires_scale, args.hires_width, args.hires_height,
                       args.hires_steps, args.hires_denoising_strength, args.hires_upscalers_dir)
        fix.check()
        out["hires"] = fix.to_json()
    if getattr(args, "control_net", None):
        if not math.isfinite(args.control_strength) or args.control_strength < 0:
            raise InvalidArgument(f"--control-strength {args.control_strength:g}: must be a finite number >= 0 "
                                  "(the scale of the ControlNet's residuals)")
        out.update(control_net=str(args.control_net), control_image=args.control_image,
                   control_strength=args.control_strength, canny=bool(args.canny))
    return out


def hires_size(args: argparse.Namespace) -> tuple[int, int]:
    """The largest picture a run of ``args`` samples: the hires fix's target with
    ``--hires`` (the second pass), aligned to ``args.hires_multiple`` (the family's, set when
    the request is checked; 8 before), else ``-W`` x ``-H``."""
    if not getattr(args, "hires", False):
        return int(args.width), int(args.height)
    from sdplan.core.pipelines.request_parts import HiresFix

    check_hires_scale(args.hires_scale)
    fix = HiresFix(True, args.hires_upscaler, args.hires_scale, args.hires_width, args.hires_height)
    return fix.target(int(args.width), int(args.height), int(getattr(args, "hires_multiple", 8) or 8))

#: Bytes per upscaler parameter as the engine holds it: f32 (``stages/upscale.py``; its
#: convolution kernels may be bf16 on AMX CPUs, which only makes the figure an upper bound).
UPSCALER_WEIGHT_BYTES = 4


def late_module_profile(module: str, path: str) -> ModuleProfile:
    """The weight bytes of ``module`` (``upscaler`` or ``controlnet``) as the engine holds
    them: an upscaler's parameters in f32 (a safetensors/GGUF header's shapes; a ``.pth``
    pickle's file size, which is its f32 storage and a few KB of pickle), a ControlNet's
    tensors as stored (the file's header).

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


def with_late_modules(profile: Profile, files: Mapping[str, Sequence[str]],
                      hires_model: str | None = None) -> Profile:
    """``profile`` with the ``upscaler`` (``upscale_model``, else ``hires_model``) and
    ``controlnet`` (``control_net``) modules of ``files`` added (:func:`late_module_profile`).

    Raises:
        ModelFileError: as :func:`late_module_profile`.
    """
    mods: dict[str, Any] = dict(profile.modules)
    up = next(iter(files.get("upscale_model") or ()), None) or hires_model
    if up:
        mods["upscaler"] = late_module_profile("upscaler", str(up))
    cn = next(iter(files.get("control_net") or ()), None)
    if cn:
        mods["controlnet"] = late_module_profile("controlnet", str(cn))
    return dataclasses.replace(profile, modules=mods) if len(mods) != len(profile.modules) else profile
