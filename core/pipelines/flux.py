"""Flux.1 text-to-image: T5-XXL + CLIP-L pooled conditioning, flow-matching sampling with the
DiT, decoding with the 16-channel autoencoder, TAEF1 previews.

Every module runs on the engine (:class:`sdplan.core.runtime.runner.ModuleRunner`) per its
:class:`~sdplan.core.runtime.runner.ModulePlacement`: ``diffusion`` (the DiT; double then single
blocks are the layer-split blocks), ``te`` (T5-XXL with its blocks split; CLIP-L runs on the
``te`` main device with the same residency) and ``vae`` (and the TAEF1 preview decoder).
Placements come from a resolved plan (:meth:`ModulePlacement.from_plan`) or are given per
module; devices are looked up by name in a :class:`~sdplan.core.runtime.runner.BackendPool`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import SdplanError
from sdplan.core.modelfiles.lora_names import AliasTable, flux_aliases
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.base import FunctionGraph
from sdplan.core.models.clip import causal_mask, clip_config, clip_text
from sdplan.core.models.flux import FluxDiT, unpatchify
from sdplan.core.models.t5 import T5Encoder
from sdplan.core.models.tae import detect_tae, split_tae, tae_decode
from sdplan.core.models.vae import vae_config, vae_decode, vae_moments
from sdplan.core.pipelines.base import Pipeline, module_placements
from sdplan.core.pipelines.img2img import (
    ImageInput,
    blend,
    latent_mask,
    sample_latent,
    truncate_sigmas,
)
from sdplan.core.runtime.runner import ModulePlacement
from sdplan.core.runtime.weights import WeightFile
from sdplan.core.sampling.flow import DEFAULT_STEPS, flux_sigmas, sample_flow
from sdplan.core.sampling.noise import PhiloxNoise
from sdplan.core.sampling.preview import latent_to_rgb
from sdplan.core.text.clip_tokenizer import EOS_ID, ClipTokenizer
from sdplan.core.text.prompt import apply_prompt_weights
from sdplan.core.text.t5_tokenizer import T5Tokenizer

log = logging.getLogger(__name__)

__all__ = ["FluxModels", "FluxPipeline", "txt2img", "SCALE_FACTOR", "SHIFT_FACTOR", "MODULES"]

#: Flux autoencoder latent scaling: ``z_model = (z_vae - SHIFT) * SCALE``.
SCALE_FACTOR = 0.3611
SHIFT_FACTOR = 0.1159
#: The plan modules of a Flux run.
MODULES = ("diffusion", "te", "vae")


def _shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.shape) for t in read_tensor_file(path).tensors}


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


class FluxPipeline(Pipeline):
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
        self.models = models
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
            "clip_l", FunctionGraph(clip_names, {"ids": "i32", "mask": "f32"}, self._clip), models.clip_l, clip_pl, dtypes)
        vae_shapes = _shapes(models.vae)
        prefix = "first_stage_model." if any(n.startswith("first_stage_model.") for n in vae_shapes) else ""
        self.vae_cfg = vae_config(vae_shapes, prefix)
        dec = [n for n in vae_shapes if n.startswith(prefix + "decoder.")]
        self.runners["vae"] = self._runner("vae", FunctionGraph(dec, {"z": "f32"}, self._decode), models.vae,
                                           self.placements["vae"], None)
        self._vae_names = [n for n in vae_shapes if n.startswith((prefix + "encoder.", prefix + "quant_conv."))]
        self.preview: Callable[[np.ndarray], np.ndarray] | None = None
        if models.taesd is not None:
            self.preview = self._tae_decoder(models.taesd)

    def _runner(self, name: str, model: Any, path: str | Path, placement: Any,
                dtypes: Mapping[str, str] | None) -> Any:
        names = list(model.other_tensors()) + [n for i in range(model.n_blocks) for n in model.block_tensors(i)]
        wf = WeightFile(path, names, dtypes=dtypes, backend=self.pool.get(placement.devices[0]))
        return self.new_runner(name, model, wf, placement)

    def _tae_decoder(self, path: str | Path) -> Callable[[np.ndarray], np.ndarray]:
        """TAEF1 decoder of ``path`` on the VAE's device: ``decode(latent (1, 16, h, w)) ->
        image (1, 3, 8h, 8w)`` in about [0, 1]."""
        shapes = _shapes(path)
        layouts = detect_tae(shapes, str(path))
        if "decoder" not in layouts:
            raise SdplanError(f"{path}: no TAE decoder")

        def fn(g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
            return {"image": tae_decode(g, split_tae(w, layouts["decoder"]), ins["z"])}

        pl = ModulePlacement(self.placements["vae"].devices[:1])
        runner = self._runner("preview", FunctionGraph(list(shapes), {"z": "f32"}, fn), path, pl, None)
        self.runners["preview"] = runner
        return lambda z: runner.run({"z": np.ascontiguousarray(z, dtype=np.float32)})["image"]

    def lora_aliases(self) -> AliasTable:
        """The LoRA names of the DiT, CLIP-L and T5 (:func:`~sdplan.core.modelfiles.lora_names.flux_aliases`)."""
        runners = {m: self.runners[m] for m in ("diffusion", "clip_l", "t5xxl")}
        return flux_aliases({m: list(r.wf.infos) for m, r in runners.items()},
                            {n: tuple(i.shape) for r in runners.values() for n, i in r.wf.infos.items()})

    def encode_sample(self, img: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Image ``(1, 3, H, W)`` in [-1, 1] -> a draw of the autoencoder's latent
        distribution with standard normal ``noise`` ``(1, 16, H/8, W/8)`` in model space
        (``(z - SHIFT_FACTOR) * SCALE_FACTOR``). The encoder runs where the VAE is placed.

        Raises:
            SdplanError: the autoencoder file has no encoder.
        """
        if "vae_encoder" not in self.runners:
            if not self._vae_names:
                raise SdplanError(f"{self.models.vae}: the autoencoder has no encoder: img2img needs one")

            def enc(g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
                mean, logvar = vae_moments(g, w, ins["image"], self.vae_cfg)
                return {"mean": mean, "logvar": logvar}

            self.runners["vae_encoder"] = self._runner(
                "vae_encoder", FunctionGraph(self._vae_names, {"image": "f32"}, enc), self.models.vae,
                self.placements["vae"], None)
        out = self.runners["vae_encoder"].run({"image": np.ascontiguousarray(img, dtype=np.float32)})
        z = sample_latent(out["mean"], out["logvar"], noise)
        return ((z - SHIFT_FACTOR) * SCALE_FACTOR).astype(np.float32)

    def _clip(self, g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        return {"hidden": clip_text(g, w, ins["ids"], ins["mask"], self.clip_cfg)}

    def _decode(self, g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        return {"image": vae_decode(g, w, ins["z"], self.vae_cfg)}

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

    def velocity(self, x: np.ndarray, sigma: float, context: np.ndarray, pooled: np.ndarray,
                 guidance: float | None) -> np.ndarray:
        """The DiT's velocity for latent ``x`` ``(1, 16, H, W)`` at ``sigma``."""

        out = self.runners["diffusion"].run(self.dit.inputs(x, context, pooled, sigma, guidance))["out"]
        return unpatchify(out, x.shape[2], x.shape[3])

    @contextlib.contextmanager
    def diffusion_session(self) -> Iterator[None]:
        """Keep the DiT's run-scoped weights (params on a device, or disk) loaded across the
        steps of a sampling loop; released when the block exits."""
        with self.runners["diffusion"].session():
            yield

    def decode(self, latent: np.ndarray) -> np.ndarray:
        """Image ``(1, 3, 8h, 8w)`` (about [-1, 1]) of a model-space latent: the VAE decodes
        ``latent / SCALE_FACTOR + SHIFT_FACTOR``."""
        z = (latent / SCALE_FACTOR + SHIFT_FACTOR).astype(np.float32)
        return self.runners["vae"].run({"z": z})["image"]

    def txt2img(self, prompt: str, width: int, height: int, *, steps: int | None = None,
                seed: int = 42, sampler: str = "euler", guidance: float = 3.5,
                t5_length: int = 256, noise: np.ndarray | None = None,
                preview: Callable[[int, np.ndarray], None] | None = None,
                vae_scale: int = 8, init: ImageInput | None = None,
                init_seed: int | None = None) -> dict[str, np.ndarray]:
        """Generate one image (from ``init``'s picture and mask when given:
        :mod:`sdplan.core.pipelines.img2img`; the flow start is ``(1 - s) init + s noise``).

        Args:
            prompt: the prompt (sd-cli weighting syntax).
            width, height: image size in pixels (multiples of ``2 * vae_scale``).
            steps: sampling steps (default: 4 for schnell, 20 for dev).
            seed: Philox seed of the starting noise (and of ancestral samplers).
            sampler: a :data:`sdplan.core.sampling.flow.FLOW_SAMPLERS` name.
            guidance: dev's distilled guidance (``--guidance``; schnell ignores it).
            t5_length: T5 tokens after padding (256 as sd-cli for Flux).
            noise: an explicit starting noise ``(1, 16, h, w)`` instead of the seed's.
            preview: ``preview(step, rgb_uint8 (H, W, 3))`` after each step, from TAEF1 when
                a ``taesd`` file is given, else the latent-to-RGB projection.
            vae_scale: pixels per latent cell (8 for Flux's autoencoder).
            init: the picture (and mask) to start from; ``init_seed`` seeds the draw of its
                latent (default ``seed``; sd-cli draws it once per request with the request's seed).

        Returns:
            ``{"latent": (1, 16, h, w), "image": (1, 3, H, W) float32, "sigmas": ...}``.

        Raises:
            SdplanError: a size that is not a multiple of ``2 * vae_scale``; SamplingError.
        """

        if width % (2 * vae_scale) or height % (2 * vae_scale) or width <= 0 or height <= 0:
            raise SdplanError(f"Flux image size {width}x{height} must be positive multiples of {2 * vae_scale}")
        h, w = height // vae_scale, width // vae_scale
        variant = self.dit.cfg.variant
        steps = steps or DEFAULT_STEPS[variant]
        sigmas = flux_sigmas(steps, (h // 2) * (w // 2), shift=variant == "dev")
        context, pooled = self.encode_prompt(prompt, t5_length)
        rng = PhiloxNoise(seed)
        start = rng.randn((1, 16, h, w)) if noise is None else np.asarray(noise, dtype=np.float32)
        g = guidance if self.dit.cfg.guidance else None
        ref, mask = None, None
        if init is not None and init.image is not None:
            f = self.vae_cfg.factor
            if init.image.shape[2:] != (h * f, w * f):
                raise SdplanError(f"init image {init.image.shape[3]}x{init.image.shape[2]}: this autoencoder "
                                  f"needs {w * f}x{h * f} pixels for a {width}x{height} generation")
            ref = self.encode_sample(init.image, PhiloxNoise(seed if init_seed is None else init_seed).randn(
                (1, 16, h, w)))
            sigmas = truncate_sigmas(sigmas, init.strength)
            s0 = np.float32(sigmas[0])
            start = (ref * (np.float32(1.0) - s0) + start * s0).astype(np.float32)
            if init.mask is not None:
                mask = latent_mask(init.mask, f)

        def vel(x: np.ndarray, s: float) -> np.ndarray:
            v = self.velocity(x, s, context, pooled, g)
            if mask is None or ref is None or s <= 0:
                return v
            den = blend(x - np.float32(s) * v, ref, mask)  # blend the prediction, as sd-cli
            return ((x - den) / np.float32(s)).astype(np.float32)

        def cb(i: int, x: np.ndarray, den: np.ndarray) -> None:
            if preview is not None:
                preview(i, self._preview_rgb(den))

        with self.diffusion_session():
            latent = sample_flow(sampler, vel, start, sigmas, noise=rng, callback=cb)
        return {"latent": latent, "image": self.decode(latent), "sigmas": sigmas}

    def _preview_rgb(self, latent: np.ndarray) -> np.ndarray:
        if self.preview is not None:
            img = self.preview(latent / SCALE_FACTOR + SHIFT_FACTOR)
            return (np.clip(img[0].transpose(1, 2, 0), 0, 1) * 255).round().astype(np.uint8)

        return latent_to_rgb(latent, "flux")


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
