"""The engine's entry for FLUX.1 dev / schnell (the registry's ``pipeline``): a checked request
on a :class:`~sdplan.core.pipelines.flux.pipeline.FluxPipeline` placed by the run's plan (kept
loaded for the next request with the same files and placements), with its LoRAs and image
input, real CFG with the negative prompt, the TAE's final decode, one picture per seed of the
batch."""

from __future__ import annotations

from collections.abc import Mapping

from sdplan.core.pipelines.flux.pipeline import FluxModels, FluxPipeline
from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.run_context import FamilyResult, RunContext
from sdplan.core.pipelines.stages.hires import flow_hires
from sdplan.core.pipelines.stages.lora import apply_request_loras
from sdplan.core.runtime.placement import ModulePlacement

__all__ = ["generate"]


def generate(request: GenerationRequest, plan: Mapping[str, ModulePlacement], progress: RunContext) -> FamilyResult:
    """Generate the request's pictures with FLUX.1 (``guidance``: its distilled guidance; real
    CFG with the negative prompt when ``cfg_scale`` is not 1, as sd-cli; the TAE's final decode
    when asked).

    Raises:
        ModelFileError / EngineError / SdplanError: bad files, devices, LoRAs or pictures.
    """
    ov = request.overrides
    models = FluxModels(request.file("diffusion_model"), request.file("t5xxl"), request.file("clip_l"),  # type: ignore[arg-type]
                        request.file("vae"), request.file("taesd"), ov.flux_heads, ov.flux_axes,  # type: ignore[arg-type]
                        ov.clip_heads)
    pipe = progress.cached(("flux", repr(models), repr(sorted(plan.items()))),
                           lambda: FluxPipeline(models, None, progress.pool(), dict(plan), 0, cancel=progress.cancel))
    prompt, init, info = apply_request_loras(pipe, request)
    steps, seed = int(request.steps or 0), request.seed
    with flow_hires(pipe, request, plan, progress):
        images, seconds = progress.batch(steps, lambda b, cb: pipe.txt2img(
            prompt, int(request.width or 0), int(request.height or 0), steps=steps, seed=seed + b,
            sampler=str(request.sampling_method), guidance=float(request.guidance or 0.0),
            t5_length=ov.t5_length or 256, preview=cb, init=init, init_seed=seed, scheduler=request.scheduler,
            sampling=request.sampling, negative_prompt=request.negative_prompt,
            cfg_scale=float(request.cfg_scale if request.cfg_scale is not None else 1.0),
            tae_decode=bool(request.taesd_decode and models.taesd), vae_tile=request.vae_tiling))
    return {"images": images, "timings": {"sampling_and_decode": seconds}, "info": {**info, **pipe.run_info()}, "runners": pipe.runners}
