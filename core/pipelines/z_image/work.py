"""The work of a Z-Image generation's graphs, for the time the plan predicts (the registry's
``work``; :mod:`sdplan.core.pipelines.work`): each graph built as the engine builds it
(:class:`~sdplan.core.pipelines.z_image.pipeline.ZImagePipeline`) and counted by
:meth:`~sdplan.core.runtime.runner.ModuleRunner.work`, never run.

sd-cli does not pad Z-Image's prompt: the LLM runs over the chat template
(:data:`~sdplan.core.pipelines.z_image.pipeline.TEMPLATE`) and the prompt's tokens, and the DiT
reads that many caption rows. A plan does not know the prompt, so the count gives it
:data:`PROMPT_TOKENS` tokens (the share of a long prompt, as Qwen-Image's and FLUX.2 dev's dry
runs). Per module, as :class:`~sdplan.core.planning.work.ModuleWork`:

* ``te``: the LLM over the template and :data:`PROMPT_TOKENS` once; with CFG
  (``cfg_scale != 1``) also over the template alone (the empty negative prompt), once;
* ``diffusion``: the DiT on one ``(1, 16, H/8, W/8)`` latent with the prompt's caption rows,
  once per step and picture; with CFG its graph with the negative prompt's rows too, as often;
* ``vae``: the decoder on one ``(1, 16, H/8, W/8)`` latent (or one tile of ``vae_tile``
  ``(w, h)`` latent pixels) per picture.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from sdplan.core.pipelines.work import input_shapes

__all__ = ["work", "PROMPT_TOKENS"]

#: The prompt's tokens (between the template's) the count gives the LLM and the DiT.
PROMPT_TOKENS = 256


def work(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
         pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
         vae_tile: tuple[int, int] | None = None) -> dict[str, list[Any]]:
    """Z-Image's work (module docstring); ``model_files`` as sd-cli's flags
    (``diffusion_model``, ``llm``, ``vae``).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    from sdplan.core.pipelines.z_image.pipeline import TEMPLATE, ZImageModels, ZImagePipeline
    from sdplan.core.planning.work import ModuleWork

    models = ZImageModels(model_files["diffusion_model"][0], model_files["llm"][0], model_files["vae"][0])
    with ZImagePipeline(models, None, pool, placements) as pipe:
        h, w = pipe._latent_size(width, height, 8)
        template = pipe.tokenizer.encode_prompt("", *TEMPLATE).length
        tokens = [template + PROMPT_TOKENS] + ([template] if cfg else [])
        llm, dit, vae = pipe.runners["llm"], pipe.runners["diffusion"], pipe.runners["vae"]
        te = [ModuleWork("te", "text", llm.work(input_shapes(pipe.llm.inputs(np.zeros((1, t), np.int32)))), 1)
              for t in tokens]
        steps = [ModuleWork("diffusion", "step", dit.work(input_shapes(pipe.dit.inputs(
            np.zeros((1, pipe.dit.cfg.channels, h, w), np.float32),
            np.zeros((1, t, pipe.dit.cfg.context), np.float32), 1.0))), batch) for t in tokens]
        z = (1, pipe.dit.cfg.channels, vae_tile[1], vae_tile[0]) if vae_tile else (1, pipe.dit.cfg.channels, h, w)
        return {"te": te, "diffusion": steps, "vae": [ModuleWork("vae", "decode", vae.work({"z": z}), batch)]}
