"""The engine's entry for SDXL (the registry's ``pipeline``): the UNet run of
:func:`sdplan.core.pipelines.sd.generate.run_unet` on a
:class:`~sdplan.core.pipelines.sdxl.pipeline.StableDiffusionXL` (and its refiner), with
sd-cli's ``--force-sdxl-vae-conv-scale``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.run_context import FamilyResult, RunContext
from sdplan.core.pipelines.sd.generate import run_unet
from sdplan.core.pipelines.sdxl.pipeline import StableDiffusionXL
from sdplan.core.runtime.placement import ModulePlacement

__all__ = ["generate"]


def generate(request: GenerationRequest, plan: Mapping[str, ModulePlacement], progress: RunContext) -> FamilyResult:
    """Generate the request's pictures with SDXL (base or refiner).

    Raises:
        ModelFileError / EngineError / SdplanError: bad files, devices, LoRAs or pictures.
    """
    scale = request.force_sdxl_vae_conv_scale

    def make(files: dict[str, list[str]], kw: dict[str, Any]) -> Any:
        return StableDiffusionXL(files, None, kw.pop("pool"), 0, force_vae_conv_scale=scale, **kw)

    return run_unet(request, plan, progress, make, key=("sdxl", scale))
