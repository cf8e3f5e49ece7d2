"""The engine's entry for Qwen-Image (the registry's ``pipeline``, ``dry_run`` and ``work``): a checked
request on a :class:`~sdplan.core.pipelines.qwen_image.pipeline.QwenImagePipeline` placed by the
run's plan (kept loaded for the next request with the same files and placements), with its
image input, its reference pictures (``-r``: Qwen-Image Edit), sd-cli's scheduler and sampling
options, the hires fix, one picture per seed of the batch; and the compute dry run and the work
count of its graphs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sdplan.core.errors import SdplanError
from sdplan.core.models.qwen25vl_vision import PATCH
from sdplan.core.pipelines.flux2.pipeline import load_ref_image
from sdplan.core.pipelines.qwen_image.edit import (
    EDIT_DROP,
    EDIT_TEMPLATE,
    edit_prefix,
    vae_size,
    vl_size,
)
from sdplan.core.pipelines.qwen_image.pipeline import (
    DROP,
    TEMPLATE,
    QwenImageModels,
    QwenImagePipeline,
)
from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.run_context import FamilyResult, RunContext
from sdplan.core.pipelines.stages.hires import flow_hires
from sdplan.core.pipelines.stages.img2img import image_size
from sdplan.core.pipelines.stages.lora import apply_request_loras
from sdplan.core.pipelines.work import input_shapes
from sdplan.core.runtime.placement import ModulePlacement

__all__ = ["generate", "measure", "work", "DRY_RUN_TOKENS"]

#: The prompt tokens (after the template's dropped 34) the dry run measures the encoder and
#: the DiT with: sd-cli does not pad Qwen-Image's prompt, so a long prompt's share (the
#: family's estimate constant).
DRY_RUN_TOKENS = 256


def generate(request: GenerationRequest, plan: Mapping[str, ModulePlacement], progress: RunContext) -> FamilyResult:
    """Generate the request's pictures with Qwen-Image (CFG with the negative prompt when not 1;
    with reference pictures, an edit of them).

    Raises:
        ModelFileError / EngineError / SdplanError: bad files, devices or pictures.
    """
    models = QwenImageModels(request.file("diffusion_model"), request.file("llm"), request.file("vae"),  # type: ignore[arg-type]
                             request.overrides.flux_axes, request.overrides.qwen_image_zero_cond_t)
    refs = [load_ref_image(p) for p in request.ref_images]  # unreadable pictures refused before loading
    pipe = progress.cached(("qwen_image", repr(models), repr(sorted(plan.items()))),
                           lambda: QwenImagePipeline(models, None, progress.pool(), dict(plan), 0, cancel=progress.cancel))
    prompt, init, info = apply_request_loras(pipe, request)
    steps, seed = int(request.steps or 0), request.seed
    with flow_hires(pipe, request, plan, progress):
        images, seconds = progress.batch(steps, lambda b, cb: pipe.txt2img(
            prompt, int(request.width or 0), int(request.height or 0), steps=steps, seed=seed + b,
            sampler=str(request.sampling_method), cfg_scale=float(request.cfg_scale or 0.0),
            negative_prompt=request.negative_prompt, preview=cb, init=init, init_seed=seed,
            scheduler=request.scheduler, sampling=request.sampling, vae_tile=request.vae_tiling, ref_images=refs))
    return {"images": images, "timings": {"sampling_and_decode": seconds}, "info": {**info, **pipe.run_info()},
            "runners": pipe.runners}


def _graphs(pipe: Any, width: int, height: int, cfg: bool, vae_tile: tuple[int, int] | None,
            refs: Sequence[tuple[int, int]] = ()) -> dict[str, list[tuple[Any, dict[str, tuple[int, ...]]]]]:
    """Module -> ``[(runner, input shapes of one graph)]`` of a Qwen-Image generation (the
    graphs :func:`measure` describes); ``refs``: the reference pictures' ``(width, height)``."""
    h, w = height // 8, width // 8
    ref_lat = [np.zeros((1, 16, vh // 8, vw // 8), np.float32)
               for vw, vh in (vae_size(width, height, rw, rh) for rw, rh in refs)]
    te: list[tuple[Any, dict[str, tuple[int, ...]]]]
    if refs and pipe.vision is not None:  # the Edit prompt with the pictures' tokens
        vl = [vl_size(rw, rh) for rw, rh in refs]
        grids = [(1, vh // PATCH, vw // PATCH) for vw, vh in vl]
        head = len(pipe.tokenizer.encode(edit_prefix(grids)))
        tail = len(pipe.tokenizer.encode(EDIT_TEMPLATE[1]))
        n = head + DRY_RUN_TOKENS + tail
        pictures = sum(t * gh * gw for t, gh, gw in grids) // 4
        tokens = [n - EDIT_DROP] + ([head + tail - EDIT_DROP] if cfg else [])
        te = [(pipe.vision_runner(), {"patches": (t * gh * gw, 1176)}) for t, gh, gw in grids]
        te.append((pipe.runners["llm"], {"ids": (1, n), "images": (pictures, pipe.llm.cfg.hidden), "sel": (n,)}))
    else:
        tokens = [DRY_RUN_TOKENS] + ([pipe.tokenizer.encode_prompt("", *TEMPLATE).length - DROP] if cfg else [])
        te = [(pipe.runners["llm"], {"ids": (1, DROP + DRY_RUN_TOKENS)})]
    dit = [pipe.dit.inputs(np.zeros((1, 16, h, w), np.float32),
                           np.zeros((1, t, pipe.dit.cfg.context), np.float32), 1.0, ref_lat) for t in tokens]
    vae = (1, 16, vae_tile[1], vae_tile[0]) if vae_tile else (1, 16, h, w)
    graphs = {"te": te, "diffusion": [(pipe.runners["diffusion"], input_shapes(d)) for d in dit],
              "vae": [(pipe.runners["vae"], {"z": vae})]}
    if refs:  # the autoencoder's encoder, on the VAE's device, for the reference latents
        enc = pipe.vae_encoder_runner()
        graphs["vae"] += [(enc, {"image": (1, 3, r.shape[2] * 8, r.shape[3] * 8)}) for r in ref_lat]
    return graphs


def _refs(overrides: Mapping[str, Any], width: int, height: int) -> list[tuple[int, int]]:
    """The reference pictures' ``(width, height)`` a dry run is given: ``overrides["ref_images"]``
    (paths, sizes from the headers; an unreadable one is left out: the run refuses it) or
    ``overrides["ref_count"]`` pictures of the output's size (``sdplan plan`` reads none)."""
    sizes = [(width, height)] * int(overrides.get("ref_count") or 0)
    for p in overrides.get("ref_images") or ():
        try:
            sizes.append(image_size(p, "-r/--ref-image"))
        except SdplanError:
            continue
    return sizes


def _pipeline(model_files: Mapping[str, list[str]], pool: Any, placements: Mapping[str, Any] | None,
              overrides: Mapping[str, Any]) -> QwenImagePipeline:
    models = QwenImageModels(model_files["diffusion_model"][0], model_files["llm"][0], model_files["vae"][0],
                             tuple(overrides["flux_axes"]) if overrides.get("flux_axes") else None,
                             overrides.get("qwen_image_zero_cond_t"))
    return QwenImagePipeline(models, None, pool, placements)


def measure(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
            pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
            vae_tile: tuple[int, int] | None = None) -> dict[str, int]:
    """Compute-buffer bytes per module of a Qwen-Image generation: the LLM on the template and
    :data:`DRY_RUN_TOKENS` prompt tokens; the DiT on one latent with those text tokens and, with
    ``cfg``, its graph for the empty negative prompt's tokens too (the prompt is not padded, so
    the two passes have graphs of their own, and the engine keeps both over the sampling loop;
    ``batch`` does not grow it: pictures run one after another); the autoencoder's decoder on one
    latent (or one tile of ``vae_tile`` ``(w, h)`` latent pixels). With reference pictures
    (``overrides["ref_images"]`` or ``["ref_count"]``, :func:`_refs`), the Edit run's graphs: the vision
    tower on each picture at sd-cli's size, the LLM on the Edit template with the pictures'
    tokens and :data:`DRY_RUN_TOKENS`, the DiT with the reference latents' tokens, the
    autoencoder's encoder on each reference.

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    with _pipeline(model_files, pool, placements, overrides) as pipe:
        graphs = _graphs(pipe, width, height, cfg, vae_tile, _refs(overrides, width, height))
        return {module: sum(sum(r.measure(s).values()) for r, s in parts) for module, parts in graphs.items()}


def work(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
         pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
         vae_tile: tuple[int, int] | None = None) -> dict[str, list[Any]]:
    """The work of a Qwen-Image generation's graphs (those :func:`measure` reserves), per module
    as :class:`~sdplan.core.planning.work.ModuleWork`: the LLM once for the prompt (the empty
    negative prompt's encoding, a few template tokens, is left out), the DiT's prompt graph
    and, with CFG, its negative prompt's graph once per sampler evaluation and picture, the
    decoder once per picture (:mod:`sdplan.core.pipelines.work`).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    from sdplan.core.planning.work import ModuleWork

    phase = {"te": "text", "diffusion": "step", "vae": "decode"}
    calls = {"te": 1, "diffusion": batch, "vae": batch}
    with _pipeline(model_files, pool, placements, overrides) as pipe:
        graphs = _graphs(pipe, width, height, cfg, vae_tile, _refs(overrides, width, height))
        return {module: [ModuleWork(module, phase[module], r.work(s), calls[module]) for r, s in parts]
                for module, parts in graphs.items()}
