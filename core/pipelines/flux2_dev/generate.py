"""The engine's entry for FLUX.2 dev (the registry's ``pipeline``): a checked request on a
:class:`~sdplan.core.pipelines.flux2_dev.pipeline.DevPipeline` placed by the run's plan (kept
loaded for the next request with the same files and placements), with its distilled guidance,
editing its reference pictures, decoding with the TAE when asked, one picture per seed of the
batch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from sdplan.core.pipelines.flux2.pipeline import load_ref_image
from sdplan.core.pipelines.flux2_dev.pipeline import MIN_ROWS, TEMPLATE, DevModels, DevPipeline
from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.run_context import FamilyResult, RunContext
from sdplan.core.pipelines.work import input_shapes
from sdplan.core.runtime.placement import ModulePlacement

__all__ = ["generate", "measure", "DRY_RUN_TOKENS"]

#: Prompt tokens the dry run gives the encoder (after the template), as Qwen-Image's.
DRY_RUN_TOKENS = 256


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


def measure(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
            pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
            vae_tile: tuple[int, int] | None = None) -> dict[str, int]:
    """Compute-buffer bytes per module of a FLUX.2 dev generation: the Mistral on the BOS, the
    template and :data:`DRY_RUN_TOKENS` prompt tokens; the DiT on one ``(1, 128, H/16, W/16)``
    latent with the 512 zero-padded text rows (the negative prompt's states have the same
    shape, so ``cfg`` adds no graph, and ``batch`` runs pictures one after another); the
    autoencoder's decoder on one ``(1, 32, H/8, W/8)`` latent (or one tile of ``vae_tile``
    ``(w, h)`` latent pixels).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    models = DevModels(model_files["diffusion_model"][0], model_files["llm"][0], model_files["vae"][0],
                       tuple(overrides["flux_axes"]) if overrides.get("flux_axes") else None)
    with DevPipeline(models, None, pool, placements) as pipe:
        h, w = height // 16, width // 16
        template = 1 + pipe.tokenizer.encode_prompt("", *TEMPLATE).length
        dit = pipe.dit.inputs(np.zeros((1, pipe.dit.cfg.in_channels, h, w), np.float32),
                              np.zeros((1, MIN_ROWS, pipe.dit.cfg.context), np.float32), 1.0)
        vae = (1, 32, vae_tile[1], vae_tile[0]) if vae_tile else (1, 32, 2 * h, 2 * w)
        graphs = {"te": (pipe.runners["llm"], {"ids": (1, template + DRY_RUN_TOKENS)}),
                  "diffusion": (pipe.runners["diffusion"], input_shapes(dit)),
                  "vae": (pipe.runners["vae"], {"z": vae})}
        return {module: sum(r.measure(s).values()) for module, (r, s) in graphs.items()}
