"""The work of a FLUX.1 or Chroma generation's graphs, for the time the plan predicts (the
registry's ``work``; :mod:`sdplan.core.pipelines.work`): each graph built as the engine builds
it and counted by :meth:`~sdplan.core.runtime.runner.ModuleRunner.work`, never run.

Per module, as :class:`~sdplan.core.planning.work.ModuleWork`:

* FLUX.1 (:func:`flux_work`, :class:`~sdplan.core.pipelines.flux.pipeline.FluxPipeline`):
  ``te`` is two graphs, T5-XXL over the prompt padded to ``overrides["t5_length"]`` tokens
  (:data:`FLUX_T5_LENGTH`, 256, the engine's default as ``generate`` runs it) and CLIP-L over
  its one 77-token chunk, each once per prompt, twice with CFG's negative prompt
  (``cfg_scale != 1``); ``diffusion``: the DiT on one ``(1, 16, H/8, W/8)`` latent with those
  T5 rows and the pooled CLIP vector, once per step and picture, twice with CFG (the negative
  prompt's pass has the same shapes: both are padded);
* Chroma (:func:`chroma_work`, :class:`~sdplan.core.pipelines.chroma.pipeline.ChromaPipeline`):
  ``te``: T5-XXL over the prompt padded to ``overrides["t5_length"]`` tokens
  (:data:`~sdplan.core.pipelines.chroma.pipeline.T5_LENGTH`, 512, as sd-cli), once per prompt,
  twice with CFG; ``diffusion``: the DiT attends to the kept T5 rows only
  (:func:`~sdplan.core.models.chroma.kept_tokens`: the prompt's tokens and ``</s>`` plus
  ``chroma_t5_mask_pad`` padding rows, all of them with ``chroma_use_dit_mask`` off), so the
  prompt's pass and the negative prompt's have graphs of their own: the prompt's with
  :data:`PROMPT_TOKENS` tokens (the count of the prompt is not known to a plan; the share of a
  long prompt, as Qwen-Image's and FLUX.2 dev's dry runs), the empty negative prompt's with
  its one ``</s>``; each once per step and picture;
* ``vae`` (both): the decoder on one ``(1, 16, H/8, W/8)`` latent (or one tile of
  ``vae_tile`` ``(w, h)`` latent pixels) per picture.

RoPE axes: ``overrides["flux_axes"]``, else the DiT's default split, else (a head width
without one: tiny test models) any even split of the head width, since the axes set the
rotation tables' values and never a graph's shapes or work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from sdplan.core.pipelines.work import input_shapes

__all__ = ["flux_work", "chroma_work", "FLUX_T5_LENGTH", "PROMPT_TOKENS"]

#: T5 tokens of FLUX.1's prompt when the request names none (``generate``'s default).
FLUX_T5_LENGTH = 256
#: The prompt's T5 tokens (``</s>`` included) the Chroma count gives the DiT.
PROMPT_TOKENS = 256
#: Pixels per latent cell of the FLUX.1 autoencoder.
VAE_SCALE = 8


def flux_work(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
              pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
              vae_tile: tuple[int, int] | None = None) -> dict[str, list[Any]]:
    """FLUX.1 dev / schnell's work (module docstring); ``model_files`` as sd-cli's flags
    (``diffusion_model``, ``t5xxl``, ``clip_l``, ``vae``).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    from sdplan.core.models.clip import causal_mask
    from sdplan.core.pipelines.flux.pipeline import FluxModels, FluxPipeline
    from sdplan.core.planning.work import ModuleWork

    dit = model_files["diffusion_model"][0]
    heads = overrides.get("flux_heads")
    models = FluxModels(dit, model_files["t5xxl"][0], model_files["clip_l"][0], model_files["vae"][0], None,
                        heads, _axes(dit, heads, overrides), overrides.get("clip_heads"))
    t5_length = int(overrides.get("t5_length") or FLUX_T5_LENGTH)
    prompts = 2 if cfg else 1
    with FluxPipeline(models, None, pool, placements) as pipe:
        h, w = pipe._latent_size(width, height, VAE_SCALE)
        t5 = input_shapes(pipe.t5.inputs(np.zeros((1, t5_length), np.int32)))
        clip = {"ids": (1, 77), "mask": causal_mask(77).shape}
        step = input_shapes(pipe.dit.inputs(np.zeros((1, 16, h, w), np.float32),
                                       np.zeros((1, t5_length, pipe.dit.cfg.context), np.float32),
                                       np.zeros((1, pipe.dit.cfg.pooled), np.float32), 1.0,
                                       1.0 if pipe.dit.cfg.guidance else None))
        return {"te": [ModuleWork("te", "text", pipe.runners["t5xxl"].work(t5), prompts),
                       ModuleWork("te", "text", pipe.runners["clip_l"].work(clip), prompts)],
                "diffusion": [ModuleWork("diffusion", "step", pipe.runners["diffusion"].work(step), prompts * batch)],
                "vae": [_decode(pipe, h, w, vae_tile, batch)]}


def chroma_work(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
                pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
                vae_tile: tuple[int, int] | None = None) -> dict[str, list[Any]]:
    """Chroma's work (module docstring); ``model_files`` as sd-cli's flags (``diffusion_model``,
    ``t5xxl``, ``vae``); ``overrides`` may hold ``t5_length``, ``chroma_t5_mask_pad`` and
    ``chroma_use_dit_mask`` as the request's.

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    from sdplan.core.models.chroma import kept_tokens
    from sdplan.core.pipelines.chroma.pipeline import T5_LENGTH, ChromaModels, ChromaPipeline
    from sdplan.core.planning.work import ModuleWork

    dit = model_files["diffusion_model"][0]
    heads = overrides.get("flux_heads")
    models = ChromaModels(dit, model_files["t5xxl"][0], model_files["vae"][0], None, heads,
                          _axes(dit, heads, overrides))
    t5_length = int(overrides.get("t5_length") or T5_LENGTH)
    pad = overrides.get("chroma_t5_mask_pad")
    mask = overrides.get("chroma_use_dit_mask")
    keep = [kept_tokens(min(n, t5_length), t5_length, 1 if pad is None else int(pad), True if mask is None else bool(mask))
            for n in ((PROMPT_TOKENS, 1) if cfg else (PROMPT_TOKENS,))]
    with ChromaPipeline(models, None, pool, placements) as pipe:
        h, w = pipe._latent_size(width, height, VAE_SCALE)
        t5 = input_shapes(pipe.t5.inputs(np.zeros((1, t5_length), np.int32)))
        steps = [input_shapes(pipe.dit.inputs(np.zeros((1, 16, h, w), np.float32),
                                         np.zeros((1, k, pipe.dit.cfg.context), np.float32), None, 1.0))
                 for k in keep]
        return {"te": [ModuleWork("te", "text", pipe.runners["t5xxl"].work(t5), len(keep))],
                "diffusion": [ModuleWork("diffusion", "step", pipe.runners["diffusion"].work(s), batch) for s in steps],
                "vae": [_decode(pipe, h, w, vae_tile, batch)]}


def _decode(pipe: Any, h: int, w: int, vae_tile: tuple[int, int] | None, batch: int) -> Any:
    """The decoder's work on one ``(1, 16, h, w)`` latent (or one tile), once per picture."""
    from sdplan.core.planning.work import ModuleWork

    z = (1, 16, vae_tile[1], vae_tile[0]) if vae_tile else (1, 16, h, w)
    return ModuleWork("vae", "decode", pipe.runners["vae"].work({"z": z}), batch)


def _axes(dit: str, heads: int | None, overrides: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """The RoPE axes the count builds the DiT with (module docstring): None for the default."""
    from sdplan.core.models.base import ModelLayoutError
    from sdplan.core.models.flux import flux_config
    from sdplan.core.pipelines.stages.flow_dit import shapes

    if overrides.get("flux_axes"):
        a, r, c = (int(x) for x in overrides["flux_axes"])
        return a, r, c
    weights = shapes(dit)
    try:
        flux_config(weights, heads)
        return None
    except ModelLayoutError:
        hd = next((s[0] for n, s in weights.items() if n.endswith("double_blocks.0.img_attn.norm.query_norm.scale")), 0)
        if heads:
            hd = next((s[0] for n, s in weights.items() if n.endswith("img_in.weight")), 0) // heads
        if hd < 6 or hd % 2:
            return None  # the pipeline names the layout error
        first = max(2, hd // 16 * 2)
        second = (hd - first) // 4 * 2
        return first, second, hd - first - second
