"""The engine's entry for SDXL (the registry's ``pipeline``): the UNet run of
:func:`sdplan.core.pipelines.sd.generate.run_unet` on a
:class:`~sdplan.core.pipelines.sdxl.pipeline.StableDiffusionXL` (and its refiner), with
sd-cli's ``--force-sdxl-vae-conv-scale``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.run_context import FamilyResult, RunContext
from sdplan.core.pipelines.sd.generate import run_unet, unet_work
from sdplan.core.pipelines.sdxl.pipeline import StableDiffusionXL
from sdplan.core.runtime.placement import ModulePlacement

__all__ = ["generate", "work"]


def generate(request: GenerationRequest, plan: Mapping[str, ModulePlacement], progress: RunContext) -> FamilyResult:
    """Generate the request's pictures with SDXL (base or refiner).

    Raises:
        ModelFileError / EngineError / SdplanError: bad files, devices, LoRAs or pictures.
    """
    scale = request.force_sdxl_vae_conv_scale

    def make(files: dict[str, list[str]], kw: dict[str, Any]) -> Any:
        return StableDiffusionXL(files, None, kw.pop("pool"), 0, force_vae_conv_scale=scale, **kw)

    return run_unet(request, plan, progress, make, key=("sdxl", scale))


def work(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
         pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
         vae_tile: tuple[int, int] | None = None) -> dict[str, list[Any]]:
    """The work of an SDXL generation's graphs (base or refiner):
    :func:`~sdplan.core.pipelines.sd.generate.unet_work` of its
    :class:`~sdplan.core.pipelines.sdxl.pipeline.StableDiffusionXL` (CLIP ViT-L and OpenCLIP
    bigG each per prompt, the refiner's bigG alone; the UNet with its ``vec`` vector).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    sd = StableDiffusionXL(dict(model_files), None, pool, placements=placements,
                           clip_heads=overrides.get("clip_heads") or None)
    return unet_work(sd, model_files, width=width, height=height, batch=batch, cfg=cfg, placements=placements,
                     vae_tile=vae_tile)
