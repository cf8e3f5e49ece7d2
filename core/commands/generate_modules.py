"""The modules a generation places beyond its model set: the upscaler (``--upscale-model``, a
hires fix's ESRGAN) and ControlNet (``--control-net``), sized for the plan's estimate.

``sdplan generate`` reads the model set's headers before the engine starts; the files read
later by their own stages (an upscaler may be a ``.pth`` pickle the engine reads) join the
profile here so the plan places them and the estimate counts their weights on their devices.
Pure Python: no numpy before the engine has its job.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from sdplan.core.planning.profile import ModuleProfile, Profile

__all__ = ["UPSCALER_WEIGHT_BYTES", "late_module_profile", "with_late_modules"]

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
