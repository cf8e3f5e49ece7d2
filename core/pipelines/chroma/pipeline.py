"""Chroma text-to-image: T5-XXL conditioning with sd-cli's padding mask, classifier-free
guidance with the negative prompt, flow-matching sampling with the Chroma DiT, decoding with
FLUX.1's 16-channel autoencoder, TAEF1 previews.

Conditioning as sd-cli's ``T5CLIPEmbedder`` for Chroma: the prompt is tokenized and padded
to 512 tokens, T5-XXL encodes all of them without an attention mask (``chroma_use_t5_mask``
off), the prompt weights are applied to the states (sd-cli's mean-keeping rule); the DiT then
attends to the prompt's tokens and ``</s>`` plus ``mask_pad`` padding tokens
(``chroma_t5_mask_pad``, 1) unless the DiT mask is off (``chroma_use_dit_mask=false``): see
:func:`sdplan.core.models.chroma.kept_tokens`. The negative prompt (empty by default) is
encoded the same way; with ``cfg_scale != 1`` each step runs the DiT on both and takes
``uncond + cfg (cond - uncond)``. Sigmas: FLUX.1's schedule shifted by the image size (sd-cli's
default ``flux`` scheduler for Chroma, diffusers' ``ChromaPipeline``), 20 steps by default.

Modules: ``diffusion`` (the DiT, double then single blocks split), ``te`` (T5-XXL, its blocks
split) and ``vae`` (with the TAEF1 preview decoder), each per its ModulePlacement.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import SdplanError
from sdplan.core.models.chroma import ChromaDiT, kept_tokens
from sdplan.core.models.t5 import T5Encoder
from sdplan.core.pipelines.stages.base import module_placements
from sdplan.core.pipelines.stages.flow_dit import FlowDiTPipeline, shapes
from sdplan.core.pipelines.stages.img2img import ImageInput
from sdplan.core.sampling.flow import guided_velocity
from sdplan.core.sampling.options import SamplingOptions
from sdplan.core.text.prompt import apply_prompt_weights
from sdplan.core.text.t5_tokenizer import T5Tokenizer

log = logging.getLogger(__name__)

__all__ = ["ChromaModels", "ChromaPipeline", "MODULES", "DEFAULT_STEPS", "T5_LENGTH"]

#: The plan modules of a Chroma run.
MODULES = ("diffusion", "te", "vae")
#: sd-cli's default step count, and the T5 chunk length its Chroma conditioner pads to.
DEFAULT_STEPS = 20
T5_LENGTH = 512


@dataclass
class ChromaModels:
    """The model files of a Chroma run (sd-cli's ``--diffusion-model``, ``--t5xxl``,
    ``--vae``, ``--taesd``) and the DiT hyper-parameter overrides tiny models need."""

    diffusion_model: str | Path
    t5xxl: str | Path
    vae: str | Path
    taesd: str | Path | None = None
    heads: int | None = None
    axes: tuple[int, int, int] | None = None


class ChromaPipeline(FlowDiTPipeline):
    """Chroma txt2img over engine module runners.

    Args:
        models: the model files.
        plan: a resolved ``sdplan.core.planning.plan_types.Plan`` giving each module's
            placement (modules ``diffusion``, ``te``, ``vae``); None puts everything on the CPU.
        pool: backends by device name (default: a private ``BackendManager``'s).
        placements: module -> ``ModulePlacement`` overriding the plan's.
        n_threads: CPU threads (0: the backend's setting).
        dtypes: weight name -> runtime dtype overrides (default: the weights module's policy).
        cancel: a shared ``CancelToken`` (default: a new one).

    Raises:
        ModelLayoutError / ModelFileError: files that are not the expected models (a FLUX.1
            DiT included: it has no distilled guidance layer).
        SdplanError: Chroma Radiance (pixel space), which this pipeline does not run.
        EngineError: a device without a backend, or memory that cannot be allocated.
    """

    def __init__(self, models: ChromaModels, plan: Any = None, pool: Any = None,
                 placements: Mapping[str, Any] | None = None, n_threads: int = 0,
                 dtypes: Mapping[str, str] | None = None, cancel: Any = None) -> None:
        dit_shapes = shapes(models.diffusion_model)
        if any(n.endswith("img_in_patch.weight") for n in dit_shapes):
            raise SdplanError(f"{models.diffusion_model}: Chroma Radiance (pixel space) is not supported; "
                              "sdplan runs Chroma1 (HD, Base, Flash, v40...) DiTs")
        self.dit = ChromaDiT.from_weights(dit_shapes, models.heads, models.axes)
        self.t5 = T5Encoder.from_weights(shapes(models.t5xxl))
        if self.t5.cfg.width != self.dit.cfg.context:
            raise SdplanError(f"{models.t5xxl}: T5 width {self.t5.cfg.width} does not fit the Chroma DiT's "
                              f"context width {self.dit.cfg.context}")
        super().__init__(pool, n_threads, cancel)
        self.placements = module_placements(MODULES, plan, placements)
        try:
            self.runners["diffusion"] = self._runner("diffusion", self.dit, models.diffusion_model,
                                                     self.placements["diffusion"], dtypes)
            self.runners["t5xxl"] = self._runner("t5xxl", self.t5, models.t5xxl, self.placements["te"], dtypes)
            self._init_vae(models.vae, models.taesd)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ stages
    def encode_prompt(self, prompt: str, t5_length: int = T5_LENGTH, *, mask_pad: int = 1,
                      dit_mask: bool = True) -> np.ndarray:
        """The T5 states the DiT attends to, float32 ``(1, T, t5 width)``: ``prompt``
        (sd-cli weighting syntax) padded to ``t5_length`` tokens and encoded without a mask,
        weighted, then cut to :func:`~sdplan.core.models.chroma.kept_tokens` rows."""
        tok = T5Tokenizer().tokenize(prompt, t5_length)
        hidden = self.runners["t5xxl"].run(self.t5.inputs(tok.ids))["hidden"]
        context = apply_prompt_weights(hidden, tok.weights)
        keep = kept_tokens(tok.length, tok.ids.shape[1], mask_pad, dit_mask)
        return np.ascontiguousarray(context[:, :keep], dtype=np.float32)

    def txt2img(self, prompt: str, width: int, height: int, *, negative_prompt: str = "",
                cfg_scale: float = 4.0, steps: int | None = None, seed: int = 42, sampler: str = "euler",
                t5_length: int = T5_LENGTH, mask_pad: int = 1, dit_mask: bool = True,
                noise: np.ndarray | None = None, preview: Callable[[int, np.ndarray], None] | None = None,
                vae_scale: int = 8, init: ImageInput | None = None,
                init_seed: int | None = None, scheduler: str = "default",
                sampling: SamplingOptions | None = None, tae_decode: bool = False,
                vae_tile: int | None = None) -> dict[str, np.ndarray]:
        """Generate one image.

        Args:
            prompt, negative_prompt: the prompts (sd-cli weighting syntax).
            width, height: image size in pixels (multiples of ``2 * vae_scale``).
            cfg_scale: classifier-free guidance (``--cfg-scale``; 1 runs the prompt alone).
            scheduler, sampling: sd-cli's ``--scheduler`` (``default``: FLUX.1's time-shifted
                schedule) and its other sampling options (``--sigmas``, ``--eta``,
                ``--flow-shift``, ``--rng``...).
            steps: sampling steps (default 20).
            seed: Philox seed of the starting noise (and of ancestral samplers).
            sampler: a :data:`sdplan.core.sampling.flow.FLOW_SAMPLERS` name.
            t5_length: T5 tokens after padding (512 as sd-cli).
            mask_pad, dit_mask: sd-cli's ``chroma_t5_mask_pad`` and ``chroma_use_dit_mask``.
            noise: an explicit starting noise ``(1, 16, h, w)`` instead of the seed's.
            preview: ``preview(step, rgb_uint8 (H, W, 3))`` after each step.
            vae_scale: pixels per latent cell (8 for the FLUX.1 autoencoder).
            init: the picture (and mask) to start from (:mod:`sdplan.core.pipelines.stages.img2img`);
                ``init_seed`` seeds the draw of its latent (default ``seed``; sd-cli draws it
                once per request with the request's seed).
            tae_decode: the ``taesd`` TAE decodes the final image instead of the VAE.
            vae_tile: the VAE decodes in tiles of this many latent pixels (``--vae-tiling``).

        Returns:
            ``{"latent": (1, 16, h, w), "image": (1, 3, H, W) float32, "sigmas": ...}``.

        Raises:
            SdplanError: a bad size, a non-finite ``cfg_scale``, ``tae_decode`` without a TAE;
                SamplingError.
        """
        h, w = self._latent_size(width, height, vae_scale)
        if not np.isfinite(cfg_scale):
            raise SdplanError(f"Chroma cfg_scale must be finite, got {cfg_scale}")
        cond = self.encode_prompt(prompt, t5_length, mask_pad=mask_pad, dit_mask=dit_mask)
        uncond = (self.encode_prompt(negative_prompt, t5_length, mask_pad=mask_pad, dit_mask=dit_mask)
                  if cfg_scale != 1.0 else None)

        vel = guided_velocity(lambda x, s: self.velocity(x, s, cond, None, None),
                              None if uncond is None else lambda x, s: self.velocity(x, s, uncond, None, None),
                              cfg_scale)

        return self._sample(vel, h, w, steps or DEFAULT_STEPS, shift=True, seed=seed, sampler=sampler,
                            noise=noise, preview=preview, init=init, init_seed=init_seed,
                            scheduler=scheduler, sampling=sampling, tae_decode=tae_decode,
                            vae_tile=vae_tile)


def txt2img(models: ChromaModels, plan: Any, prompt: str, width: int, height: int, pool: Any = None,
            **kw: Any) -> dict[str, Any]:
    """One-call Chroma txt2img: builds a :class:`ChromaPipeline` for ``plan`` (None: the
    CPU), runs :meth:`ChromaPipeline.txt2img` (keyword arguments as there), frees it; returns
    its result plus ``memory`` (:meth:`ChromaPipeline.memory`)."""
    pipe = ChromaPipeline(models, plan, pool)
    try:
        out: dict[str, Any] = dict(pipe.txt2img(prompt, width, height, **kw))
        out["memory"] = pipe.memory()
        return out
    finally:
        pipe.close()
