"""Text-to-image for SDXL (base, refiner and the checkpoints in their layout: Pony,
Illustrious, NoobAI, SDXL-Turbo/Lightning, SSD-1B, Vega) on sdplan's engine.

:class:`StableDiffusionXL` is :class:`~sdplan.core.pipelines.sd.pipeline.StableDiffusion` with SDXL's
parts: the two-encoder conditioner with its pooled embedding and vector
(:mod:`sdplan.core.pipelines.sdxl.conditioner`), the UNet with ``label_emb``
(:mod:`sdplan.core.models.unet`; depths per block from the shapes) and the VAE with its
0.13025 latent scale. Every layout users download loads: the original single file
(``model.diffusion_model.``, ``conditioner.embedders.N.``, ``first_stage_model.``), separate
``--diffusion-model`` (with or without the ``model.diffusion_model.`` prefix, safetensors or
GGUF, quantised as sd-cli or city96 write them), ``--clip_l``, ``--clip_g`` and ``--vae``
files (a ``--vae`` file replaces the checkpoint's VAE, as in sd-cli).

sd-cli's VAE rule: with SDXL's own VAE (no ``--vae``) or ``--force-sdxl-vae-conv-scale``,
every VAE convolution runs as ``conv(x / 32) * 32`` (:data:`~sdplan.core.models.vae.SDXL_CONV_SCALE`),
which keeps the original SDXL VAE's activations inside f16 on GPUs.

Placement as for SD: ``te`` (bigG takes te's layer split; ViT-L its main device), the UNet
as one module whose stages ``--max-vram`` cuts into segments, the VAE whole.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import ModelFileError
from sdplan.core.families import family as registry_family
from sdplan.core.modelfiles.checkpoint import ModelTensor, read_model_files
from sdplan.core.models import unet as unet_m
from sdplan.core.models import vae as vae_m
from sdplan.core.pipelines.layout_errors import naming_the_file
from sdplan.core.pipelines.sd.pipeline import Cond, GenerateParams, StableDiffusion, model_overrides
from sdplan.core.pipelines.sdxl.conditioner import (
    DEFAULT_AESTHETIC,
    DEFAULT_NEGATIVE_AESTHETIC,
    SdxlConditioner,
)
from sdplan.core.pipelines.stages.base import Pipeline, module_placements
from sdplan.core.pipelines.stages.parallel_cfg import add_cfg_copy
from sdplan.core.runtime.weights import WeightFile
from sdplan.core.sampling.schedules import DiscreteSchedule

__all__ = ["StableDiffusionXL"]


class StableDiffusionXL(StableDiffusion):
    """An SDXL model ready to run on the engine (see the module docstring).

    Args:
        model: a single-file checkpoint, or sd-cli model flags (``{"model": [...],
            "diffusion_model": [...], "clip_l": [...], "clip_g": [...], "vae": [...]}``).
        plan / pool / n_threads / placements / cancel: as :class:`StableDiffusion`.
        prediction: ``eps`` (default) or ``v`` (v-prediction finetunes).
        clip_heads / unet_heads / unet_head_dim: override the head rules (tiny models; both
            encoders take ``clip_heads``).
        force_vae_conv_scale: sd-cli's ``--force-sdxl-vae-conv-scale`` (the scale also
            applies without it when the VAE is the checkpoint's own).
        aesthetic_score / negative_aesthetic_score: the refiner's vector values.
        family: accepted for the engine's overrides; this class is always ``sdxl``.

    Unset hyper-parameters are read from the files' ``sdplan.*`` metadata.

    Raises:
        ModelFileError: unreadable files, a missing module, no bigG encoder, or a UNet
            without ``label_emb``.
        EngineError: a planned device that has no backend here (when a module first runs).
    """

    def __init__(self, model: str | Path | Mapping[str, Sequence[str | Path]], plan: Any = None,
                 pool: Any = None, n_threads: int = 0, prediction: str | None = None,
                 clip_heads: int | None = None, unet_heads: int | None = None,
                 unet_head_dim: int | None = None, placements: Mapping[str, Any] | None = None,
                 cancel: Any = None, force_vae_conv_scale: bool = False,
                 aesthetic_score: float = DEFAULT_AESTHETIC,
                 negative_aesthetic_score: float = DEFAULT_NEGATIVE_AESTHETIC, family: str | None = None) -> None:
        Pipeline.__init__(self, pool, n_threads, cancel)
        flags = {"model": [model]} if isinstance(model, (str, Path)) else {k: list(v) for k, v in model.items()}
        self.ms = read_model_files(flags)
        self.path = str(self.ms.files[0].path)
        missing = [m for m in ("te", "diffusion", "vae") if not self.ms.module_tensors(m)]
        if missing:
            raise ModelFileError(self.path, f"no {', '.join(missing)} tensors: not an SDXL model set")
        meta = model_overrides(self.ms)
        self.family = "sdxl"
        self.declared = registry_family(self.family)
        self.prediction = prediction or meta.get("prediction") or "eps"
        diff = self.ms.module_tensors("diffusion")
        shapes = {t.info.name: tuple(t.info.shape) for t in diff}
        prefix = unet_m.find_prefix(shapes)
        with naming_the_file(diff[0].info.file, {"unet_heads": unet_heads, "unet_head_dim": unet_head_dim},
                             meta):  # shapes and heads, before any graph
            self.unet_cfg = unet_m.unet_config(shapes, "sdxl", unet_heads or meta.get("unet_heads"),
                                               unet_head_dim or meta.get("unet_head_dim"), prefix)
        if not self.unet_cfg.adm_in_channels:
            raise ModelFileError(diff[0].info.file, "the UNet has no label_emb: not an SDXL UNet")
        self.placements = module_placements(("te", "diffusion", "vae"), plan, placements)
        self.cond = SdxlConditioner(self, self.ms, self.placements["te"], self.unet_cfg.adm_in_channels,
                                    clip_heads or meta.get("clip_heads"))
        self.refiner = self.cond.refiner
        if self.cond.context_dim != self.unet_cfg.context_dim:
            raise ModelFileError(self.path, f"text encoders give a {self.cond.context_dim}-wide context, the "
                                            f"UNet takes {self.unet_cfg.context_dim}")
        self.aesthetic = (aesthetic_score, negative_aesthetic_score)
        vae = _vae_tensors(self.ms.module_tensors("vae"), flags.get("vae") or [])
        vae_shapes = {t.info.name: tuple(t.info.shape) for t in vae}
        self.vae_cfg = vae_m.vae_config(vae_shapes, "first_stage_model." if any(
            n.startswith("first_stage_model.") for n in vae_shapes) else "")
        self.scale_factor = vae_m.SDXL_SCALE_FACTOR
        self.vae_conv_scale = vae_m.SDXL_CONV_SCALE if force_vae_conv_scale or not flags.get("vae") else 1.0
        self.schedule = DiscreteSchedule()
        self.tokenizer = self.cond.tokenizer
        diff_wf = _weight_file(diff, "diffusion")
        self.runners["diffusion"] = self._runner("diffusion", unet_m.UNetGraph(self.unet_cfg, _names(diff)), diff_wf)
        add_cfg_copy(self, placements, unet_m.UNetGraph(self.unet_cfg, _names(diff)), diff_wf)
        self.runners["vae"] = self._runner("vae", vae_m.VaeGraph(self.vae_cfg, _names(vae), self.vae_conv_scale),
                                           _weight_file(vae, "vae"))
        self._te_key = None
        self.timings: dict[str, float] = {}

    def close(self) -> None:
        """Free every weight buffer and graph (and the private backends). Idempotent."""
        super().close()
        self.cond.release()

    # ------------------------------------------------------------------ text encoders

    def _skip(self, clip_skip: int) -> int:
        return clip_skip if clip_skip > 0 else 2

    @contextlib.contextmanager
    def text_session(self, clip_skip: int = 0) -> Iterator[None]:
        """Keep both encoders' run-scoped weights loaded for several encodings."""
        with self.cond.session(clip_skip):
            yield

    def encode_ids(self, ids: np.ndarray, clip_skip: int = 0, final_ln: bool = False) -> np.ndarray:
        """Hidden states of token-id chunks ``(K, 77)`` -> ``(K, 77, context_dim)`` float32
        (ViT-L's then bigG's, without the final LayerNorm; ``final_ln`` is not used)."""
        t0 = time.perf_counter()
        hidden = self.cond.encode_ids(ids, clip_skip)[0]
        self.timings["text_encode"] = time.perf_counter() - t0
        return hidden

    def encode_prompt(self, prompt: str, clip_skip: int = 0) -> np.ndarray:
        """The context of a prompt: ``(1, 77*K, context_dim)`` float32 (sd-cli's weights and chunks)."""
        return self.cond.encode(prompt, clip_skip)[0]

    def encode_text(self, prompt: str, clip_skip: int = 0, zero_out: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(context (1, 77*K, context_dim), pooled (1, P))`` of a prompt (see
        :meth:`SdxlConditioner.encode`)."""
        return self.cond.encode(prompt, clip_skip, zero_out)

    def conditioning(self, p: GenerateParams) -> tuple[Cond, Cond | None]:
        """``{"c": context, "vec": vector}`` of the prompt and (with CFG) the negative prompt,
        sd-cli's way: an empty negative prompt gives a zero context (base model) with the
        pooled embedding of the empty text; the shorter context is padded by repeating its
        last 77-token chunk."""
        with self.text_session(p.clip_skip):
            c, pooled = self.encode_text(p.prompt, p.clip_skip)
            cond = {"c": c, "vec": self.cond.vector(pooled, p.width, p.height, self.aesthetic[0])}
            if p.cfg_scale == 1.0:
                return cond, None
            zero = not p.negative_prompt and not self.refiner
            u, upooled = self.encode_text(p.negative_prompt, p.clip_skip, zero_out=zero)
        uncond = {"c": u, "vec": self.cond.vector(upooled, p.width, p.height, self.aesthetic[1])}
        k = max(c.shape[1], u.shape[1])
        cond["c"], uncond["c"] = _pad(c, k), _pad(u, k)
        return cond, uncond


def _pad(ctx: np.ndarray, tokens: int) -> np.ndarray:
    while ctx.shape[1] < tokens:
        ctx = np.concatenate([ctx, ctx[:, -77:]], 1)
    return ctx


def _names(tensors: list[ModelTensor]) -> dict[str, str]:
    return {t.info.name: t.info.name for t in tensors}


def _weight_file(tensors: list[ModelTensor], module: str) -> WeightFile:
    """The one file holding ``tensors`` as a :class:`WeightFile` (runtime dtypes by policy).

    Raises:
        ModelFileError: the module spread over several files.
    """
    files = sorted({t.info.file for t in tensors})
    if len(files) > 1:
        raise ModelFileError(files[1], f"module {module} spans several files: {', '.join(files)}")
    return WeightFile(files[0], [t.info.name for t in tensors])


def _vae_tensors(tensors: list[ModelTensor], vae_files: Sequence[str | Path]) -> list[ModelTensor]:
    """The VAE's tensors: those of a ``--vae`` file when one is given (it replaces the
    checkpoint's VAE, as in sd-cli), else all."""
    given = {str(Path(p)) for p in vae_files}
    chosen = [t for t in tensors if str(Path(t.info.file)) in given]
    return chosen or tensors
