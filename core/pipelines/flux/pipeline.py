"""Flux.1 text-to-image: T5-XXL + CLIP-L pooled conditioning, flow-matching sampling with the
DiT, decoding with the 16-channel autoencoder, TAEF1 previews.

Every module runs on the engine (:class:`sdplan.core.runtime.runner.ModuleRunner`) per its
:class:`~sdplan.core.runtime.runner.ModulePlacement`: ``diffusion`` (the DiT; double then single
blocks are the layer-split blocks), ``te`` (T5-XXL with its blocks split; CLIP-L runs on the
``te`` main device with the same residency) and ``vae`` (and the TAEF1 preview decoder); the
DiT runner, the autoencoder and previews are :mod:`sdplan.core.pipelines.stages.flow_dit`'s.
Placements come from a resolved plan (:meth:`ModulePlacement.from_plan`) or are given per
module; devices are looked up by name in a :class:`~sdplan.core.runtime.runner.BackendPool`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import SdplanError
from sdplan.core.models.base import FunctionGraph
from sdplan.core.models.clip import ClipGraph, causal_mask, clip_config, clip_text
from sdplan.core.models.flux import FluxDiT
from sdplan.core.models.t5 import T5Encoder
from sdplan.core.pipelines.stages.base import module_placements
from sdplan.core.pipelines.stages.flow_dit import FlowDiTPipeline
from sdplan.core.pipelines.stages.flow_dit import shapes as _shapes
from sdplan.core.pipelines.stages.img2img import ImageInput
from sdplan.core.runtime.runner import ModulePlacement
from sdplan.core.sampling.flow import DEFAULT_STEPS, guided_velocity
from sdplan.core.sampling.options import SamplingOptions
from sdplan.core.text.clip_tokenizer import EOS_ID, ClipTokenizer
from sdplan.core.text.prompt import apply_prompt_weights
from sdplan.core.text.t5_tokenizer import T5Tokenizer

log = logging.getLogger(__name__)

__all__ = ["FluxModels", "FluxPipeline", "txt2img", "MODULES"]

#: The plan modules of a Flux run.
MODULES = ("diffusion", "te", "vae")


@dataclass
class FluxModels:
    """The model files of a Flux run (sd-cli's ``--diffusion-model``, ``--t5xxl``,
    ``--clip_l``, ``--vae``, ``--taesd``) and the hyper-parameter overrides tiny models need
    (``heads``/``axes`` of the DiT, ``clip_heads``)."""

    diffusion_model: str | Path
    t5xxl: str | Path
    clip_l: str | Path
    vae: str | Path
    taesd: str | Path | None = None
    heads: int | None = None
    axes: tuple[int, int, int] | None = None
    clip_heads: int | None = None


class FluxPipeline(FlowDiTPipeline):
    """Flux.1 txt2img over engine module runners.

    Args:
        models: the model files.
        plan: a resolved ``sdplan.core.planning.plan_types.Plan`` giving each module's placement (modules
            ``diffusion``, ``te``, ``vae``); None puts everything on the CPU.
        pool: backends by device name (default: a private ``BackendManager``'s).
        placements: module -> ``ModulePlacement`` overriding the plan's.
        n_threads: CPU threads (0: the backend's setting).
        dtypes: weight name -> runtime dtype overrides (default: the weights module's policy).
        cancel: a shared ``CancelToken`` (default: a new one).

    Raises:
        ModelLayoutError / ModelFileError: files that are not the expected models.
        EngineError: a device without a backend, or memory that cannot be allocated.
    """

    def __init__(self, models: FluxModels, plan: Any = None, pool: Any = None,
                 placements: Mapping[str, Any] | None = None, n_threads: int = 0,
                 dtypes: Mapping[str, str] | None = None, cancel: Any = None) -> None:
        super().__init__(pool, n_threads, cancel)
        self.placements = module_placements(MODULES, plan, placements)
        te = self.placements["te"]
        # CLIP-L: the te main device and residency, no blocks to split
        clip_pl = ModulePlacement(te.devices[:1], (), te.params_mode, te.params_device)
        self.dit = FluxDiT.from_weights(_shapes(models.diffusion_model), models.heads, models.axes)
        self.t5 = T5Encoder.from_weights(_shapes(models.t5xxl))
        self.runners["diffusion"] = self._runner("diffusion", self.dit, models.diffusion_model,
                                                 self.placements["diffusion"], dtypes)
        self.runners["t5xxl"] = self._runner("t5xxl", self.t5, models.t5xxl, te, dtypes)
        clip_shapes = _shapes(models.clip_l)
        self.clip_cfg = clip_config(clip_shapes, n_heads=models.clip_heads)
        clip_names = [n for n in clip_shapes if n.startswith(self.clip_cfg.prefix) and "position_ids" not in n
                      and "text_projection" not in n]
        self.runners["clip_l"] = self._runner(
            "clip_l", FunctionGraph(clip_names, {"ids": "i32", "mask": "f32"}, self._clip, ClipGraph.cpu_bf16_kernels),
            models.clip_l, clip_pl, dtypes)
        self._init_vae(models.vae, models.taesd)

    def _clip(self, g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        return {"hidden": clip_text(g, w, ins["ids"], ins["mask"], self.clip_cfg)}

    # ------------------------------------------------------------------ stages
    def encode_prompt(self, prompt: str, t5_length: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """``(context (1, T, t5 width), pooled (1, clip width))`` float32 for ``prompt``:
        T5 hidden states with the prompt weights applied (sd-cli's mean-keeping rule), and
        CLIP-L's final-LayerNorm state at the first end-of-text token."""

        tok = T5Tokenizer().tokenize(prompt, t5_length)
        hidden = self.runners["t5xxl"].run(self.t5.inputs(tok.ids))["hidden"]
        context = apply_prompt_weights(hidden, tok.weights)
        clip = ClipTokenizer(EOS_ID).tokenize(prompt)
        ids = clip.ids[:1]
        h = self.runners["clip_l"].run({"ids": np.ascontiguousarray(ids, dtype=np.int32),
                                        "mask": causal_mask(77)})["hidden"]
        eos = int(np.argmax(ids[0] == EOS_ID))
        return context.astype(np.float32), h[:, eos, :].astype(np.float32)

    def txt2img(self, prompt: str, width: int, height: int, *, steps: int | None = None,
                seed: int = 42, sampler: str = "euler", guidance: float = 3.5,
                t5_length: int = 256, noise: np.ndarray | None = None,
                preview: Callable[[int, np.ndarray], None] | None = None,
                vae_scale: int = 8, scheduler: str = "default",
                sampling: SamplingOptions | None = None, init: ImageInput | None = None,
                init_seed: int | None = None, negative_prompt: str = "", cfg_scale: float = 1.0,
                tae_decode: bool = False, vae_tile: int | None = None) -> dict[str, np.ndarray]:
        """Generate one image.

        Args:
            prompt: the prompt (sd-cli weighting syntax).
            width, height: image size in pixels (multiples of ``2 * vae_scale``).
            steps: sampling steps (default: 4 for schnell, 20 for dev).
            seed: Philox seed of the starting noise (and of ancestral samplers).
            sampler: a :data:`sdplan.core.sampling.flow.FLOW_SAMPLERS` name.
            guidance: dev's distilled guidance (``--guidance``; schnell ignores it).
            negative_prompt, cfg_scale: real classifier-free guidance as sd-cli runs it for
                FLUX.1 with ``--cfg-scale`` other than 1: each step runs the DiT on the prompt
                and on the negative prompt (both with the distilled guidance) and takes
                ``uncond + cfg (cond - uncond)``; at 1 the negative prompt is not encoded.
            t5_length: T5 tokens after padding (256 as sd-cli for Flux).
            noise: an explicit starting noise ``(1, 16, h, w)`` instead of the seed's.
            preview: ``preview(step, rgb_uint8 (H, W, 3))`` after each step, from TAEF1 when
                a ``taesd`` file is given, else the latent-to-RGB projection.
            vae_scale: pixels per latent cell (8 for Flux's autoencoder).
            scheduler: ``default`` (BFL's schedule: dev shifted by the token count, schnell
                linear) or an sd-cli ``--scheduler`` name, run on the Flux flow
                (:class:`~sdplan.core.sampling.schedules_more.FlowSchedule`, shift
                ``--flow-shift``, default 1.15 for dev and 1 for schnell as sd-cli).
            sampling: ``--eta``, ``--sigmas``, ``--rng`` and the other options.
            init: the picture (and mask) to start from (:mod:`sdplan.core.pipelines.stages.img2img`);
                ``init_seed`` seeds the draw of its latent (default ``seed``; sd-cli draws it
                once per request with the request's seed).
            tae_decode: the ``taesd`` TAE decodes the final image instead of the VAE.
            vae_tile: the VAE decodes in tiles of this many latent pixels (``--vae-tiling``).

        Returns:
            ``{"latent": (1, 16, h, w), "image": (1, 3, H, W) float32, "sigmas": ...}``.

        Raises:
            SdplanError: a size that is not a multiple of ``2 * vae_scale``, a non-finite
                ``cfg_scale``, ``tae_decode`` without a TAE; SamplingError.
        """

        h, w = self._latent_size(width, height, vae_scale)
        if not np.isfinite(cfg_scale):
            raise SdplanError(f"FLUX.1 cfg_scale must be finite, got {cfg_scale}")
        variant = self.dit.cfg.variant
        steps = steps or DEFAULT_STEPS[variant]
        context, pooled = self.encode_prompt(prompt, t5_length)
        uncond = self.encode_prompt(negative_prompt, t5_length) if cfg_scale != 1.0 else None
        g = guidance if self.dit.cfg.guidance else None

        vel = guided_velocity(lambda x, s: self.velocity(x, s, context, pooled, g),
                              None if uncond is None else lambda x, s: self.velocity(x, s, *uncond, g), cfg_scale)

        return self._sample(vel, h, w, steps, shift=variant == "dev", seed=seed, sampler=sampler,
                            noise=noise, preview=preview, scheduler=scheduler, sampling=sampling,
                            flow_shift=1.15 if variant == "dev" else 1.0, init=init, init_seed=init_seed,
                            tae_decode=tae_decode, vae_tile=vae_tile)


def txt2img(models: FluxModels, plan: Any, prompt: str, width: int, height: int, pool: Any = None,
            **kw: Any) -> dict[str, Any]:
    """One-call Flux txt2img: builds a :class:`FluxPipeline` for ``plan`` (None: the CPU),
    runs :meth:`FluxPipeline.txt2img` (keyword arguments as there), frees it; returns its
    result plus ``memory`` (:meth:`FluxPipeline.memory`)."""
    pipe = FluxPipeline(models, plan, pool)
    try:
        out: dict[str, Any] = dict(pipe.txt2img(prompt, width, height, **kw))
        out["memory"] = pipe.memory()
        return out
    finally:
        pipe.close()
