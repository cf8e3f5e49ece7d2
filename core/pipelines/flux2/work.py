"""The work of a FLUX.2 generation's graphs (klein and dev), for the time the plan predicts
(the registry's ``work``; :mod:`sdplan.core.pipelines.work`): each graph built as the engine
builds it and counted by :meth:`~sdplan.core.runtime.runner.ModuleRunner.work`, never run.

Per module, as :class:`~sdplan.core.planning.work.ModuleWork`:

* ``te``: the LLM once per prompt, twice with CFG's negative prompt (``cfg_scale != 1``).
  klein runs it over the template and prompt padded to
  :data:`~sdplan.core.pipelines.flux2.pipeline.MIN_TOKENS` (512) tokens; dev over the BOS, the
  template and :data:`~sdplan.core.pipelines.flux2_dev.generate.DRY_RUN_TOKENS` prompt tokens
  (as its compute-buffer dry run);
* ``diffusion``: the DiT on one ``(1, 128, H/16, W/16)`` latent with 512 text rows, once per
  step and picture, twice with CFG (the negative prompt's pass has the same shapes);
* ``vae``: the decoder on one ``(1, 32, H/8, W/8)`` latent (or one tile of ``vae_tile``
  ``(w, h)`` latent pixels) per picture.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from sdplan.core.pipelines.work import input_shapes

__all__ = ["klein_work", "dev_work"]


def klein_work(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
               pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
               vae_tile: tuple[int, int] | None = None) -> dict[str, list[Any]]:
    """FLUX.2 klein's work (module docstring); ``model_files`` as sd-cli's flags (a single
    ``model`` file may hold all three modules).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    from sdplan.core.pipelines.flux2.pipeline import MIN_TOKENS, KleinModels, KleinPipeline

    one: str | None = next(iter(model_files.get("model") or ()), None)
    paths = {k: next(iter(model_files.get(k) or ()), one) for k in ("diffusion_model", "llm", "vae")}
    models = KleinModels(paths["diffusion_model"], paths["llm"], paths["vae"], None,  # type: ignore[arg-type]
                         _axes(overrides))
    with KleinPipeline(models, None, pool, placements) as pipe:
        return _work(pipe, MIN_TOKENS, width, height, batch, cfg, vae_tile)


def dev_work(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
             pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
             vae_tile: tuple[int, int] | None = None) -> dict[str, list[Any]]:
    """FLUX.2 dev's work (module docstring).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    from sdplan.core.pipelines.flux2_dev.generate import DRY_RUN_TOKENS
    from sdplan.core.pipelines.flux2_dev.pipeline import TEMPLATE, DevModels, DevPipeline

    models = DevModels(model_files["diffusion_model"][0], model_files["llm"][0], model_files["vae"][0],
                       _axes(overrides))
    with DevPipeline(models, None, pool, placements) as pipe:
        template = 1 + pipe.tokenizer.encode_prompt("", *TEMPLATE).length
        return _work(pipe, template + DRY_RUN_TOKENS, width, height, batch, cfg, vae_tile)


def _axes(overrides: Mapping[str, Any]) -> tuple[int, ...] | None:
    return tuple(overrides["flux_axes"]) if overrides.get("flux_axes") else None


def _work(pipe: Any, te_tokens: int, width: int, height: int, batch: int, cfg: bool,
          vae_tile: tuple[int, int] | None) -> dict[str, list[Any]]:
    from sdplan.core.pipelines.flux2.pipeline import MIN_TOKENS
    from sdplan.core.planning.work import ModuleWork

    h, w = height // 16, width // 16
    te = input_shapes(pipe.llm.inputs(np.zeros((1, te_tokens), np.int32)))
    dit = pipe.dit.inputs(np.zeros((1, pipe.dit.cfg.in_channels, h, w), np.float32),
                          np.zeros((1, MIN_TOKENS, pipe.dit.cfg.context), np.float32), 1.0)
    vae = (1, 32, vae_tile[1], vae_tile[0]) if vae_tile else (1, 32, 2 * h, 2 * w)
    prompts = 2 if cfg else 1
    graphs = {"te": ("text", pipe.runners["llm"], te, prompts),
              "diffusion": ("step", pipe.runners["diffusion"], input_shapes(dit), prompts * batch),
              "vae": ("decode", pipe.runners["vae"], {"z": vae}, batch)}
    return {module: [ModuleWork(module, phase, runner.work(shapes), calls)]
            for module, (phase, runner, shapes, calls) in graphs.items()}
