"""The engine's entry for Z-Image (the registry's ``pipeline``): a checked request on a
:class:`~sdplan.core.pipelines.z_image.pipeline.ZImagePipeline` placed by the run's plan
(kept loaded for the next request with the same files and placements), with its LoRAs and
image input, sd-cli's scheduler and sampling options, one picture per seed of the batch."""

from __future__ import annotations

from collections.abc import Mapping

from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.run_context import FamilyResult, RunContext
from sdplan.core.pipelines.stages.hires import flow_hires
from sdplan.core.pipelines.stages.lora import apply_request_loras
from sdplan.core.pipelines.z_image.pipeline import ZImageModels, ZImagePipeline
from sdplan.core.runtime.placement import ModulePlacement

__all__ = ["generate"]


def generate(request: GenerationRequest, plan: Mapping[str, ModulePlacement], progress: RunContext) -> FamilyResult:
    """Generate the request's pictures with Z-Image (CFG with the negative prompt when not 1).

    Raises:
        ModelFileError / EngineError / SdplanError: bad files, devices, LoRAs or pictures.
    """
    models = ZImageModels(request.file("diffusion_model"), request.file("llm"), request.file("vae"),  # type: ignore[arg-type]
                          request.file("taesd"))
    pipe = progress.cached(("z_image", repr(models), repr(sorted(plan.items()))),
                           lambda: ZImagePipeline(models, None, progress.pool(), dict(plan), 0, cancel=progress.cancel))
    prompt, init, info = apply_request_loras(pipe, request)
    steps, seed = int(request.steps or 0), request.seed
    with flow_hires(pipe, request, plan, progress):
        images, seconds = progress.batch(steps, lambda b, cb: pipe.txt2img(
            prompt, int(request.width or 0), int(request.height or 0), steps=steps, seed=seed + b,
            sampler=str(request.sampling_method), cfg_scale=float(request.cfg_scale or 0.0),
            negative_prompt=request.negative_prompt, preview=cb, init=init, init_seed=seed,
            scheduler=request.scheduler, sampling=request.sampling,
            tae_decode=bool(request.taesd_decode and models.taesd), vae_tile=request.vae_tiling))
    return {"images": images, "timings": {"sampling_and_decode": seconds}, "info": {**info, **pipe.run_info()}, "runners": pipe.runners}
