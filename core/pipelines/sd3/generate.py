"""The engine's entry for SD3 / SD3.5 (the registry's ``pipeline``, ``dry_run`` and ``work``): a checked
request on an :class:`~sdplan.core.pipelines.sd3.pipeline.Sd3Pipeline` placed by the run's
plan (kept loaded for the next request with the same files and placements), with skip-layer
guidance and image input, one picture per seed of the batch; :func:`measure` is its compute
dry run, :func:`work` the work count of the same graphs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.run_context import FamilyResult, RunContext
from sdplan.core.pipelines.sd3.pipeline import Sd3Pipeline
from sdplan.core.pipelines.stages.hires import flow_hires
from sdplan.core.pipelines.stages.lora import apply_request_loras
from sdplan.core.runtime.placement import ModulePlacement

__all__ = ["generate", "measure", "work"]


def generate(request: GenerationRequest, plan: Mapping[str, ModulePlacement], progress: RunContext) -> FamilyResult:
    """Generate the request's pictures with SD3 / SD3.5.

    Raises:
        ModelFileError / EngineError / SdplanError: bad files, devices or pictures.
    """
    files = {k: v for k, v in request.files.items() if k != "upscale_model"}
    heads = request.overrides.clip_heads
    pipe = progress.cached(("sd3", repr(sorted(files.items())), repr(sorted(plan.items())), heads),
                           lambda: Sd3Pipeline(files, None, progress.pool(), dict(plan), 0, cancel=progress.cancel,
                                               clip_heads=heads))
    prompt, init, info = apply_request_loras(pipe, request)
    steps, seed = int(request.steps or 0), request.seed
    with flow_hires(pipe, request, plan, progress):
        images, seconds = progress.batch(steps, lambda b, cb: pipe.txt2img(
            prompt, int(request.width or 0), int(request.height or 0), negative_prompt=request.negative_prompt,
            cfg_scale=float(request.cfg_scale or 0.0), steps=steps, seed=seed + b, sampler=str(request.sampling_method),
            clip_skip=request.clip_skip, preview=cb, scheduler=request.scheduler, sampling=request.sampling,
            slg=request.slg, init=init, init_seed=seed, tae_decode=bool(request.taesd_decode and request.file("taesd")),
            vae_tile=request.vae_tiling))
    return {"images": images, "timings": {"sampling_and_decode": seconds}, "info": {**info, **pipe.run_info()}, "runners": pipe.runners}


def measure(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
            pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
            vae_tile: tuple[int, int] | None = None) -> dict[str, int]:
    """Compute-buffer bytes per module of an SD3 / SD3.5 generation: CLIP-L, bigG and T5-XXL on
    one 77-token chunk each (the largest counts: they run one after another); the MMDiT on one
    latent with 77 + 77 text tokens (the CFG passes run one after another, so neither ``batch``
    nor ``cfg`` grows it); the VAE decoder on one latent (or one tile of ``vae_tile`` ``(w, h)``
    latent pixels).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    with Sd3Pipeline(dict(model_files), None, pool, placements, clip_heads=overrides.get("clip_heads")) as pipe:
        graphs = pipe.dry_run_inputs(width, height)
        if vae_tile:
            graphs["vae"] = [(r, {"z": (*s["z"][:2], vae_tile[1], vae_tile[0])}) for r, s in graphs["vae"]]
        return {module: max(sum(r.measure(shapes).values()) for r, shapes in runs)
                for module, runs in graphs.items()}


def work(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
         pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
         vae_tile: tuple[int, int] | None = None) -> dict[str, list[Any]]:
    """The work of an SD3 / SD3.5 generation's graphs (those :func:`measure` reserves), per
    module as :class:`~sdplan.core.planning.work.ModuleWork`: each text encoder once per prompt
    (twice with CFG's negative prompt), the MMDiT once per pass (a pass per prompt, one
    picture at a time), the VAE decoder once per picture (:mod:`sdplan.core.pipelines.work`).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    from sdplan.core.planning.work import ModuleWork

    prompts = 2 if cfg else 1
    phase = {"te": "text", "diffusion": "step", "vae": "decode"}
    calls = {"te": prompts, "diffusion": prompts * batch, "vae": batch}
    with Sd3Pipeline(dict(model_files), None, pool, placements, clip_heads=overrides.get("clip_heads")) as pipe:
        graphs = pipe.dry_run_inputs(width, height)
        if vae_tile:
            graphs["vae"] = [(r, {"z": (*s["z"][:2], vae_tile[1], vae_tile[0])}) for r, s in graphs["vae"]]
        return {module: [ModuleWork(module, phase[module], r.work(shapes), calls[module]) for r, shapes in runs]
                for module, runs in graphs.items()}
