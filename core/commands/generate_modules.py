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
from sdplan.core.planning.profile import ModuleProfile, Profile

__all__ = ["UPSCALER_WEIGHT_BYTES", "late_module_profile", "with_late_modules", "add_module_arguments",
           "module_request", "MAX_TILE_PX"]

#: Largest ``--vae-tile-size`` side (image pixels): the largest picture side generate draws.
MAX_TILE_PX = 16384


def add_module_arguments(p: argparse.ArgumentParser) -> None:
    """Add the VAE tiling flags (module docstring) to ``sdplan generate``."""
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
    return {"vae_tiling": tiling.to_json() if tiling.enabled or tiling.customised else None}

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
