"""Z-Image text-to-image (Turbo and base): a Qwen3 language model's hidden states as the
prompt, flow-matching sampling with the single-stream DiT, the FLUX.1 16-channel autoencoder,
TAEF1 previews.

As sd-cli runs it (stable-diffusion.cpp ``conditioner.hpp``, ``stable-diffusion.cpp``):

* prompt: ``<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n``
  (:data:`TEMPLATE`, the Qwen chat template diffusers applies too), tokenised by the
  encoder's own tokenizer (a GGUF file's metadata, else the shipped Qwen vocabulary); the
  state after all blocks but the last (``hidden_states[-2]``) for every token, no padding;
  ``(text:weight)`` prompt weights scale it with sd-cli's mean-keeping rule;
* sampling: sigmas of the discrete flow schedule with shift 3
  (:func:`~sdplan.core.sampling.flow.discrete_flow_sigmas`), the DiT at ``t = 1 - sigma``,
  euler by default; classifier-free guidance ``uncond + cfg (cond - uncond)`` with the
  negative prompt only when ``cfg_scale != 1`` (Turbo runs 8 steps at CFG 1:
  :data:`DEFAULTS`);
* decoding: ``latent / 0.3611 + 0.1159`` through the FLUX.1 autoencoder.

Modules: ``diffusion`` (the DiT; its main layers are the layer-split blocks), ``te`` (the
LLM, runner ``llm``; its blocks split too) and ``vae``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import ModelFileError, SdplanError
from sdplan.core.families import family, generation_defaults
from sdplan.core.models.llm import LLMEncoder, llm_config
from sdplan.core.models.z_image import ZImageDiT, unpatchify
from sdplan.core.pipelines.stages.base import module_placements
from sdplan.core.pipelines.stages.flow_dit import FlowDiTPipeline
from sdplan.core.pipelines.stages.flow_dit import shapes as _shapes
from sdplan.core.pipelines.stages.img2img import ImageInput
from sdplan.core.sampling.flow import discrete_flow_sigmas, guided_velocity
from sdplan.core.sampling.options import SamplingOptions
from sdplan.core.text.bpe_tokenizer import BPETokenizer
from sdplan.core.text.prompt import apply_prompt_weights

__all__ = ["ZImageModels", "ZImagePipeline", "TEMPLATE", "DEFAULTS", "SHIFT", "MODULES"]

#: sd-cli's Z-Image prompt template (prefix, suffix).
TEMPLATE = ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")
#: The flow shift of Z-Image (its scheduler config; sd-cli's default for the family).
SHIFT = 3.0
#: Recommended settings of Z-Image Turbo (8 steps, CFG 1, euler), the family's defaults.
DEFAULTS: dict[str, Any] = generation_defaults("z_image")
MODULES = ("diffusion", "te", "vae")


@dataclass
class ZImageModels:
    """The model files of a Z-Image run (sd-cli's ``--diffusion-model``, ``--llm``, ``--vae``,
    ``--taesd``) and the RoPE axes override tiny models need."""

    diffusion_model: str | Path
    llm: str | Path
    vae: str | Path
    taesd: str | Path | None = None
    axes: tuple[int, int, int] | None = None


class ZImagePipeline(FlowDiTPipeline):
    """Z-Image txt2img over engine module runners (see the module docstring); the FLUX.1
    autoencoder, its previews and the DiT session come from
    :class:`~sdplan.core.pipelines.stages.flow_dit.FlowDiTPipeline`.

    Args:
        models: the model files.
        plan: a resolved ``Plan`` giving each module's placement; None: the CPU.
        pool, placements, n_threads, dtypes, cancel: as :class:`~sdplan.core.pipelines.flux.pipeline.FluxPipeline`.
        flash: ggml's flash attention in the DiT (sd-cli's ``--diffusion-fa``).

    Raises:
        ModelLayoutError / ModelFileError: files that are not the expected models.
        ModelFileError: an encoder whose width is not the DiT's caption width (``sdplan plan``
            and ``generate`` refuse it from the headers first:
            :mod:`sdplan.core.modelfiles.file_sets`).
        EngineError: a device without a backend, or memory that cannot be allocated.
    """

    #: sd-cli's Z-Image denoiser is the discrete flow schedule (SD3's time shift, shift 3).
    schedule_kind = "sd3"

    def __init__(self, models: ZImageModels, plan: Any = None, pool: Any = None,
                 placements: Mapping[str, Any] | None = None, n_threads: int = 0,
                 dtypes: Mapping[str, str] | None = None, cancel: Any = None, flash: bool = False) -> None:
        super().__init__(pool, n_threads, cancel)
        self.placements = module_placements(MODULES, plan, placements)
        self.dit = ZImageDiT.from_weights(_shapes(models.diffusion_model), models.axes, flash)
        cfg = llm_config(_shapes(models.llm))
        if cfg.hidden != self.dit.cfg.context:
            raise ModelFileError(models.llm, f"the text encoder's width {cfg.hidden} is not the Z-Image "
                                             f"DiT's caption width {self.dit.cfg.context}")
        self.llm = LLMEncoder(cfg, family("z_image").llm_out_layers(cfg.n_blocks))  # hidden_states[-2]
        self.tokenizer = BPETokenizer.from_gguf(models.llm) if is_gguf(models.llm) else BPETokenizer.qwen()
        pads = {self.dit.cfg.prefix + n: "f32" for n in ("x_pad_token", "cap_pad_token")}
        self.runners["diffusion"] = self._runner("diffusion", self.dit, models.diffusion_model,
                                                 self.placements["diffusion"], {**pads, **(dtypes or {})})
        self.runners["llm"] = self._runner("llm", self.llm, models.llm, self.placements["te"], dtypes)
        self._init_vae(models.vae, models.taesd)

    # ------------------------------------------------------------------ stages
    def encode_prompt(self, prompt: str) -> np.ndarray:
        """The LLM's states ``(1, T, width)`` float32 for ``prompt`` in the template, weighted.

        Raises:
            PromptError: a malformed weight; ValueError: token ids beyond the encoder's
                vocabulary (a tokenizer that does not belong to it).
        """
        tok = self.tokenizer.encode_prompt(prompt, *TEMPLATE)
        hidden = self.runners["llm"].run(self.llm.inputs(tok.ids))["hidden"]
        return apply_prompt_weights(hidden, tok.weights).astype(np.float32)

    def velocity(self, x: np.ndarray, sigma: float, context: np.ndarray, pooled: np.ndarray | None = None,
                 guidance: float | None = None) -> np.ndarray:
        """The DiT's velocity ``noise - x0`` for latent ``x`` ``(1, 16, H, W)`` at ``sigma``
        and LLM states ``context`` (Z-Image has no pooled vector and no distilled guidance:
        ``pooled`` and ``guidance`` are ignored)."""
        out = self.runners["diffusion"].run(self.dit.inputs(x, context, sigma))["out"]
        return unpatchify(out, x.shape[2], x.shape[3])

    def txt2img(self, prompt: str, width: int, height: int, *, steps: int | None = None,
                seed: int = 42, sampler: str = "euler", cfg_scale: float = 1.0, negative_prompt: str = "",
                shift: float = SHIFT, noise: np.ndarray | None = None,
                preview: Callable[[int, np.ndarray], None] | None = None,
                vae_scale: int = 8, init: ImageInput | None = None,
                init_seed: int | None = None, scheduler: str = "default",
                sampling: SamplingOptions | None = None, tae_decode: bool = False,
                vae_tile: int | None = None) -> dict[str, np.ndarray]:
        """Generate one image.

        Args:
            prompt, negative_prompt: sd-cli weighting syntax; the negative prompt is used only
                with ``cfg_scale != 1``.
            width, height: image size in pixels (multiples of ``2 * vae_scale``).
            steps: sampling steps (default 8, Turbo's).
            seed: Philox seed of the starting noise (and of ancestral samplers).
            sampler: a :data:`sdplan.core.sampling.flow.FLOW_SAMPLERS` name.
            cfg_scale: classifier-free guidance scale (1: none).
            shift: the flow shift of the sigma schedule (``sampling.flow_shift`` wins).
            noise: an explicit starting noise ``(1, 16, h, w)`` instead of the seed's.
            preview: ``preview(step, rgb_uint8 (H, W, 3))`` after each step.
            vae_scale: pixels per latent cell (8 for the FLUX.1 autoencoder).
            init: the picture (and mask) to start from (:mod:`sdplan.core.pipelines.stages.img2img`);
                ``init_seed`` seeds the draw of its latent (default ``seed``).
            scheduler, sampling: sd-cli's ``--scheduler`` (``default``: the discrete flow
                schedule of ``shift``) and its other sampling options (``--sigmas``, ``--eta``,
                ``--flow-shift``, ``--rng``...), through the shared flow loop
                (:meth:`~sdplan.core.pipelines.stages.flow_dit.FlowDiTPipeline._sample`).
            tae_decode: the ``taesd`` TAE decodes the final image instead of the VAE.
            vae_tile: the VAE decodes in tiles of this many latent pixels (``--vae-tiling``).

        Returns:
            ``{"latent": (1, 16, h, w), "image": (1, 3, H, W) float32, "sigmas": ...}``.

        Raises:
            SdplanError: a size that is not a multiple of ``2 * vae_scale``, ``tae_decode``
                without a TAE; SamplingError.
        """
        if width % (2 * vae_scale) or height % (2 * vae_scale) or width <= 0 or height <= 0:
            raise SdplanError(f"Z-Image image size {width}x{height} must be positive multiples of {2 * vae_scale}")
        h, w = height // vae_scale, width // vae_scale
        context = self.encode_prompt(prompt)
        uncond = self.encode_prompt(negative_prompt) if cfg_scale != 1.0 else None

        vel = guided_velocity(lambda x, s: self.velocity(x, s, context),
                              None if uncond is None else lambda x, s: self.velocity(x, s, uncond), cfg_scale)

        return self._sample(vel, h, w, steps or int(DEFAULTS["steps"]), shift=False, seed=seed,
                            sampler=sampler, noise=noise, preview=preview, scheduler=scheduler,
                            sampling=sampling, flow_shift=shift, init=init, init_seed=init_seed,
                            tae_decode=tae_decode, vae_tile=vae_tile)

    def _default_sigmas(self, steps: int, tokens: int, shift: bool, flow_shift: float) -> np.ndarray:
        """Z-Image's own sigmas: the discrete flow schedule of ``flow_shift``."""
        return discrete_flow_sigmas(steps, flow_shift)


def is_gguf(path: str | Path) -> bool:
    """True when ``path`` starts with the GGUF magic."""
    with open(path, "rb") as fh:
        return fh.read(4) == b"GGUF"
