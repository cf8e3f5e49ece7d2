"""The engine's entry for FLUX.2 dev (the registry's ``pipeline``): a checked request on a
:class:`~sdplan.core.pipelines.flux2_dev.pipeline.DevPipeline` placed by the run's plan (kept
loaded for the next request with the same files and placements), with its distilled guidance,
editing its reference pictures, decoding with the TAE when asked, one picture per seed of the
batch."""

from __future__ import annotations

from collections.abc import Mapping

from sdplan.core.pipelines.flux2.pipeline import load_ref_image
from sdplan.core.pipelines.flux2_dev.pipeline import DevModels, DevPipeline
from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.run_context import FamilyResult, RunContext
from sdplan.core.runtime.placement import ModulePlacement

__all__ = ["generate"]


def generate(request: GenerationRequest, plan: Mapping[str, ModulePlacement], progress: RunContext) -> FamilyResult:
    """Generate the request's pictures with FLUX.2 dev (``--diffusion-model --llm --vae``).

    Raises:
        ModelFileError / EngineError / SdplanError: bad files, devices or pictures.
    """
    paths = {k: request.file(k) for k in ("diffusion_model", "llm", "vae")}
    models = DevModels(paths["diffusion_model"], paths["llm"], paths["vae"], request.file("taesd"),  # type: ignore[arg-type]
                       request.overrides.flux_axes)
    refs = [load_ref_image(p) for p in request.ref_images]
    pipe = progress.cached(("flux2", repr(models), repr(sorted(plan.items()))),
                           lambda: DevPipeline(models, None, progress.pool(), dict(plan), 0, cancel=progress.cancel))
    steps, seed = int(request.steps or 0), request.seed
    guidance = None if request.guidance is None else float(request.guidance)
    images, seconds = progress.batch(steps, lambda b, cb: pipe.txt2img(
        request.prompt, int(request.width or 0), int(request.height or 0), steps=steps, seed=seed + b,
        sampler=str(request.sampling_method), cfg_scale=float(request.cfg_scale or 0.0),
        negative_prompt=request.negative_prompt, ref_images=refs, preview=cb,
        tae_decode=bool(request.taesd_decode and models.taesd), scheduler=request.scheduler,
        sampling=request.sampling, vae_tile=request.vae_tiling, guidance=guidance))
    return {"images": images, "timings": {"sampling_and_decode": seconds}, "info": pipe.run_info(), "runners": pipe.runners}
