"""Text-to-image for the SD 1.x / 2.x family on sdplan's engine.

:class:`StableDiffusion` reads a single-file checkpoint (``read_model_files``), infers each
module's hyper-parameters from its tensor shapes, and runs the CLIP text encoder (``te``), the
UNet (``diffusion``) and the VAE (``vae``) as engine module graphs
(:class:`~sdplan.core.models.clip.ClipGraph`, :class:`~sdplan.core.models.unet.UNetGraph`,
:class:`~sdplan.core.models.vae.VaeGraph`) through :class:`~sdplan.core.runtime.runner.ModuleRunner`,
each placed by :meth:`ModulePlacement.from_plan <sdplan.core.runtime.runner.ModulePlacement.from_plan>`
(runtime devices, CLIP layer split, params residency, ``--max-vram`` segments).

A "use" is one text encoding (both prompts), one whole sampling loop, or one decode: the
runner's ``session`` keeps staged or disk-read weights for exactly that long. The UNet graph
is built once per latent shape and batch and reused across steps; classifier-free guidance
runs the conditional and unconditional halves as one batch of 2N.

Hyper-parameters the weights do not carry (tiny test models) come from keyword arguments or
from the safetensors ``__metadata__`` of the model file (:data:`METADATA_KEYS`), arguments
first.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import InvalidArgument, ModelFileError
from sdplan.core.families import family as registry_family
from sdplan.core.modelfiles.checkpoint import ModelSet, read_model_files
from sdplan.core.modelfiles.lora_names import AliasTable, aliases_for_family
from sdplan.core.models import clip as clip_m
from sdplan.core.models import unet as unet_m
from sdplan.core.models import vae as vae_m
from sdplan.core.pipelines.layout_errors import naming_the_file
from sdplan.core.pipelines.request_parts import HiresFix
from sdplan.core.pipelines.stages.base import Pipeline, module_placements
from sdplan.core.pipelines.stages.control import controlled
from sdplan.core.pipelines.stages.hires import hires_sigmas, interpolate, upscale_latent
from sdplan.core.pipelines.stages.img2img import (
    ImageInput,
    blended_denoiser,
    dilate,
    latent_mask,
    sample_latent,
    truncate_sigmas,
)
from sdplan.core.pipelines.stages.parallel_cfg import add_cfg_copy, cfg_sessions, guided_batch
from sdplan.core.pipelines.stages.results import image_to_uint8
from sdplan.core.pipelines.stages.vae_tiles import (
    as_tiling,
    decode_tiled,
    encode_tiled,
    fits_budget,
)
from sdplan.core.runtime.weights import WeightFile
from sdplan.core.sampling.noise import NoiseSource, initial_latent, make_noise
from sdplan.core.sampling.options import SamplingOptions, prepare, shifted_timestep
from sdplan.core.sampling.preview import latent_to_rgb
from sdplan.core.sampling.samplers import sample
from sdplan.core.sampling.schedules import Denoiser, DiscreteSchedule, scalings
from sdplan.core.text.clip_tokenizer import ClipTokenizer
from sdplan.core.text.prompt import apply_prompt_weights

__all__ = ["StableDiffusion", "GenerateParams", "Cond", "module_weight_file", "model_overrides",
           "METADATA_KEYS"]

log = logging.getLogger(__name__)

#: The UNet's conditioning inputs besides ``x`` and ``t``: ``c`` the cross-attention context
#: ``(B, S, D)``, and for SDXL ``vec`` the vector ``(B, adm)``; float32.
Cond = dict[str, np.ndarray]

#: Optional ``__metadata__`` keys of a safetensors model file (string values) -> the
#: :class:`StableDiffusion` keyword they set: heads of tiny CLIP / UNet models, the
#: prediction type and the family.
METADATA_KEYS = {"sdplan.clip_heads": ("clip_heads", int), "sdplan.unet_heads": ("unet_heads", int),
                 "sdplan.unet_head_dim": ("unet_head_dim", int),
                 "sdplan.prediction": ("prediction", str), "sdplan.family": ("family", str)}


def module_weight_file(ms: ModelSet, module: str, keep: Callable[[str], bool] | None = None,
                       backend: Any = None, conv_dtype: str | None = None) -> tuple[Any, dict[str, str]]:
    """``(WeightFile, names)`` of ``module``'s tensors in ``ms`` (those ``keep(name)`` accepts):
    ``names`` maps each checkpoint name to its name in the weight store (the same name: the
    native store holds names of any length). Dtypes follow
    :func:`sdplan.core.runtime.weights.runtime_dtype` for ``backend``; ``conv_dtype`` (e.g. ``f32``)
    replaces the dtype of 4-D conv kernels.

    Raises:
        ModelFileError: no such tensors, or the module spread over several files.
    """
    tensors = [t.info for t in ms.module_tensors(module) if keep is None or keep(t.info.name)]
    files = sorted({t.file for t in tensors})
    if not tensors:
        raise ModelFileError(ms.files[0].path if ms.files else "?", f"no {module} tensors")
    if len(files) > 1:
        raise ModelFileError(files[1], f"module {module} spans several files: {', '.join(files)}")
    wf = WeightFile(files[0], [t.name for t in tensors], backend=backend)
    if conv_dtype:
        wf.dtypes = {n: conv_dtype if len(wf.infos[n].shape) == 4 else d for n, d in wf.dtypes.items()}
    return wf, {t.name: t.name for t in tensors}


def model_overrides(ms: ModelSet) -> dict[str, Any]:
    """The :data:`METADATA_KEYS` found in the files' metadata, as keyword arguments.

    Raises:
        ModelFileError: a value that is not of the key's type, or a head count or width
            outside 1..4096.
    """
    out: dict[str, Any] = {}
    for f in ms.files:
        for key, (kw, typ) in METADATA_KEYS.items():
            if key in f.metadata:
                try:
                    out[kw] = typ(f.metadata[key])
                except ValueError:
                    raise ModelFileError(f.path, f"metadata {key}={f.metadata[key][:40]!r} is "
                                                 f"not {typ.__name__}") from None
                if typ is int and not 1 <= out[kw] <= 4096:  # a head count or width
                    raise ModelFileError(f.path, f"metadata {key}={f.metadata[key][:40]!r}: a "
                                                 "head count or width is between 1 and 4096")
    return out


@dataclass
class GenerateParams:
    """What to generate (sd-cli's meanings): prompt, negative prompt, width/height in pixels,
    steps, cfg scale, seed, sampler (``--sampling-method``), scheduler, batch count, clip skip
    (0 = the family default); ``sampling``: sd-cli's other sampling options (``--eta``,
    ``--sigmas``, ``--rng``...; :class:`~sdplan.core.sampling.options.SamplingOptions`)."""

    prompt: str
    negative_prompt: str = ""
    width: int = 512
    height: int = 512
    steps: int = 20
    cfg_scale: float = 7.0
    seed: int = 42
    sampler: str = "euler_a"
    scheduler: str = "discrete"
    batch: int = 1
    clip_skip: int = 0
    sampling: SamplingOptions = field(default_factory=SamplingOptions)


class StableDiffusion(Pipeline):
    """An SD 1.x / 2.x checkpoint ready to run on the engine.

    Args:
        model: the single-file checkpoint (``-m``), sd-cli model flags
            (``{"model": [...], "vae": [...]}``), or those flags' files already read
            (:func:`~sdplan.core.modelfiles.checkpoint.read_model_files`).
        plan: a resolved :class:`~sdplan.core.planning.plan_types.Plan` (None: everything on the CPU).
        pool: an :class:`~sdplan.core.runtime.runner.BackendPool` (None: a private one whose CPU
            uses ``n_threads`` threads).
        n_threads: CPU threads per compute (0: the backend's setting).
        family: ``sd1`` or ``sd2`` (None: ``sd2`` for an OpenCLIP text encoder, else ``sd1``).
        prediction: ``eps`` or ``v`` (None: the family's, v for sd2).
        clip_heads / unet_heads / unet_head_dim: override the head rules (tiny models).
        placements: module -> :class:`~sdplan.core.runtime.runner.ModulePlacement`, taking
            precedence over ``plan``.
        cancel: a :class:`~sdplan.core.runtime.runner.CancelToken` shared by the modules.

    Unset hyper-parameters are read from the file's ``sdplan.*`` metadata (:data:`METADATA_KEYS`).

    Raises:
        ModelFileError: unreadable file or a missing module (te, diffusion, vae).
        EngineError: a planned device that has no backend here (when a module first runs).
    """

    def __init__(self, model: str | Path | Mapping[str, Sequence[str | Path]] | ModelSet, plan: Any = None,
                 pool: Any = None, n_threads: int = 0, family: str | None = None,
                 prediction: str | None = None, clip_heads: int | None = None,
                 unet_heads: int | None = None, unet_head_dim: int | None = None,
                 placements: Mapping[str, Any] | None = None, cancel: Any = None) -> None:
        super().__init__(pool, n_threads, cancel)
        if isinstance(model, ModelSet):
            self.ms = model
        else:
            self.ms = read_model_files({"model": [model]} if isinstance(model, (str, Path)) else dict(model))
        self.path = str(self.ms.files[0].path)
        missing = [m for m in ("te", "diffusion", "vae") if not self.ms.module_tensors(m)]
        if missing:
            raise ModelFileError(self.path, f"no {', '.join(missing)} tensors: not an SD checkpoint")
        meta = model_overrides(self.ms)
        given = {"clip_heads": clip_heads, "unet_heads": unet_heads, "unet_head_dim": unet_head_dim}
        family = family or meta.get("family")
        prediction = prediction or meta.get("prediction")
        clip_heads = clip_heads or meta.get("clip_heads")
        unet_heads = unet_heads or meta.get("unet_heads")
        unet_head_dim = unet_head_dim or meta.get("unet_head_dim")
        shapes = {t.info.name: tuple(t.info.shape) for t in self.ms.tensors}
        with naming_the_file(self.path, given, meta):  # shapes and heads, before any graph
            self.clip_cfg = clip_m.clip_config(shapes, n_heads=clip_heads)
            self.family = family or ("sd2" if self.clip_cfg.layout == "openclip" else "sd1")
            self.declared = registry_family(self.family)
            self.prediction = prediction or (self.declared.prediction if self.declared else None) or "eps"
            self.unet_cfg = unet_m.unet_config(shapes, self.family, unet_heads, unet_head_dim)
            self.vae_cfg = vae_m.vae_config(shapes)
        self.scale_factor = vae_m.SCALE_FACTOR
        self.tokenizer = ClipTokenizer.for_family(self.family)
        self.schedule = DiscreteSchedule()
        self.placements = module_placements(("te", "diffusion", "vae"), plan, placements)
        wf, names = module_weight_file(self.ms, "diffusion")
        self.runners["diffusion"] = self._runner("diffusion", unet_m.UNetGraph(self.unet_cfg, names), wf)
        add_cfg_copy(self, placements, unet_m.UNetGraph(self.unet_cfg, names), wf)
        # f16 conv kernels everywhere: the CPU's Winograd path (the VAE's 3x3 convolutions)
        # transforms them to f32 at each compute anyway (about 2.5 ms for a 512x512 kernel),
        # and with the column path f16 kernels ran 20-25% faster than f32 ones at SD 1.5 size
        # (bench/bench_ops.py, --dtypes): f32 copies would only double the VAE's memory
        wf, names = module_weight_file(self.ms, "vae")
        self.runners["vae"] = self._runner("vae", vae_m.VaeGraph(self.vae_cfg, names), wf)
        self._te_key: tuple[int, bool] | None = None
        self.timings: dict[str, float] = {}

    def _runner(self, module: str, graph: Any, wf: Any) -> Any:
        return self.new_runner(module, graph, wf, self.placements[module])

    def _te(self, skip: int, final_ln: bool) -> Any:
        """The text encoder's runner for this clip skip (rebuilt, weights reloaded, when the
        skip changes: layers after the stop are identity blocks of the graph)."""
        if self._te_key != (skip, final_ln) or "te" not in self.runners:
            clip_m.check_clip_skip(self.clip_cfg, skip)
            self._te_key = None  # a failed rebuild leaves no stale key behind
            if "te" in self.runners:
                self.runners.pop("te").release()
            p = self.clip_cfg.prefix

            def keep(n: str) -> bool:
                return n.startswith(p) and not n.endswith(("position_ids", "text_projection", "logit_scale"))

            wf, names = module_weight_file(self.ms, "te", keep)
            self.runners["te"] = self._runner("te", clip_m.ClipGraph(self.clip_cfg, names, skip, final_ln), wf)
            self._te_key = (skip, final_ln)
        return self.runners["te"]

    def close(self) -> None:
        """Free every weight buffer and graph (and the private backends). Idempotent."""
        super().close()
        self._te_key = None

    # ------------------------------------------------------------------ text encoder

    def _skip(self, clip_skip: int) -> int:
        return clip_skip if clip_skip > 0 else (self.declared.defaults.clip_skip if self.declared else 1)

    @contextlib.contextmanager
    def text_session(self, clip_skip: int = 0) -> Iterator[None]:
        """Keep the text encoder's run-scoped weights loaded for several encodings."""
        with self._te(self._skip(clip_skip), True).session():
            yield

    def encode_ids(self, ids: np.ndarray, clip_skip: int = 0, final_ln: bool = True) -> np.ndarray:
        """Hidden states of token-id chunks ``(K, 77)`` int32 -> ``(K, 77, D)`` float32.

        ``clip_skip`` 0 means the family default (1 for sd1, 2 for sd2)."""
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        t0 = time.perf_counter()
        runner = self._te(self._skip(clip_skip), final_ln)
        out = runner.run({"ids": ids, "mask": clip_m.causal_mask(ids.shape[1])})["hidden"]
        self.timings["text_encode"] = time.perf_counter() - t0
        return out

    def encode_prompt(self, prompt: str, clip_skip: int = 0) -> np.ndarray:
        """Context for a prompt with sd-cli's ``(word:1.2)`` weights, chunks of 77 tokens
        concatenated: ``(1, 77*K, D)`` float32."""
        tp = self.tokenizer.tokenize(prompt)
        ids = np.asarray(tp.ids, dtype=np.int32).reshape(-1, 77)
        hidden = self.encode_ids(ids, clip_skip)
        weights = np.asarray(tp.weights, dtype=np.float32).reshape(hidden.shape[:2])
        hidden = apply_prompt_weights(hidden, weights)
        return hidden.reshape(1, -1, hidden.shape[-1]).astype(np.float32)

    def conditioning(self, p: GenerateParams) -> tuple[Cond, Cond | None]:
        """The UNet's conditioning of ``p``'s prompt and (with CFG) negative prompt:
        ``{"c": (1, 77*K, D)}`` each, the shorter padded by repeating its last chunk."""
        with self.text_session(p.clip_skip):
            cond = self.encode_prompt(p.prompt, p.clip_skip)
            uncond = self.encode_prompt(p.negative_prompt, p.clip_skip) if p.cfg_scale != 1.0 else None
        if uncond is not None and uncond.shape != cond.shape:
            k = max(cond.shape[1], uncond.shape[1])
            cond, uncond = _pad_chunks(cond, k), _pad_chunks(uncond, k)
        return {"c": cond}, (None if uncond is None else {"c": uncond})

    # ------------------------------------------------------------------ UNet

    @contextlib.contextmanager
    def unet_session(self) -> Iterator[Callable[[np.ndarray, np.ndarray, Cond], np.ndarray]]:
        """``fn(x, t, cond) -> out`` with the UNet's weights in use (graph per shape);
        ``cond`` is the context array or a :data:`Cond` of every conditioning input (``c``,
        and SDXL's vector ``vec``), one row per latent."""
        runner = self.runners["diffusion"]
        with runner.session():
            def run(x: np.ndarray, t: np.ndarray, cond: Cond | np.ndarray) -> np.ndarray:
                ts = np.ascontiguousarray(np.broadcast_to(t, (x.shape[0],)), dtype=np.float32)
                ins = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in _as_cond(cond).items()}
                return runner.run({"x": np.ascontiguousarray(x, dtype=np.float32), "t": ts, **ins})["y"]
            with cfg_sessions(self, run) as both:  # --backend cfg=DEVICE: the copy's weights too
                yield both

    def step_scalings(self, sigma: float, timestep_shift: int = 0) -> tuple[float, float, float, float]:
        """``(t, c_skip, c_out, c_in)`` of a step at ``sigma``: the UNet's timestep and the
        prediction's :func:`~sdplan.core.sampling.schedules.scalings`; with ``timestep_shift``
        (sd-cli's ``--timestep-shift``, 1..1000) the UNet sees the shifted timestep and its
        output is combined with that timestep's scalings
        (:func:`~sdplan.core.sampling.options.shifted_timestep`)."""
        c_skip, c_out, c_in = scalings(float(sigma), self.prediction)
        t = self.schedule.sigma_to_t(float(sigma))
        if timestep_shift > 0:
            t, c_skip, c_out = shifted_timestep(float(sigma), timestep_shift, self.schedule,
                                                lambda s: scalings(s, self.prediction))
        return float(t), c_skip, c_out, c_in

    def denoiser(self, unet: Callable[..., np.ndarray], cond: Cond | np.ndarray,
                 uncond: Cond | np.ndarray | None, cfg_scale: float,
                 concat: np.ndarray | None = None, timestep_shift: int = 0) -> Denoiser:
        """A k-diffusion style denoiser (eps or v :func:`~sdplan.core.sampling.schedules.scalings`);
        with CFG both halves run as one batch: ``u + cfg (c - u)``. ``cond``/``uncond``: the
        context ``(1, S, D)`` or a :data:`Cond` of one-row arrays (repeated per latent).
        ``concat`` ``(N, C, h, w)`` joins the scaled latent as extra input channels
        (inpainting UNets). ``timestep_shift``: :meth:`step_scalings`."""
        guided = uncond is not None and cfg_scale != 1.0
        c = _as_cond(cond)
        u = _as_cond(uncond) if uncond is not None else None

        def denoise(x: np.ndarray, sigma: float) -> np.ndarray:
            ts, c_skip, c_out, c_in = self.step_scalings(sigma, timestep_shift)
            t = np.float32(ts)
            x_in = (x * c_in).astype(np.float32)
            if concat is not None:
                x_in = np.concatenate([x_in, concat], 1)
            n = x.shape[0]
            if guided:
                assert u is not None
                out = guided_batch(unet, x_in, t, c, u)  # both halves (at once with cfg=)
                out = out[n:] + cfg_scale * (out[:n] - out[n:])
            else:
                out = unet(x_in, t, {k: np.repeat(v, n, 0) for k, v in c.items()})
            return (x * c_skip + out * c_out).astype(np.float32)

        def with_uncond(x: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
            # CFG++ samplers: both halves of the guided batch, combined and unconditional
            ts, c_skip, c_out, c_in = self.step_scalings(sigma, timestep_shift)
            t = np.float32(ts)
            x_in = (x * c_in).astype(np.float32)
            if concat is not None:
                x_in = np.concatenate([x_in, concat], 1)
            n = x.shape[0]
            if not guided:
                d = denoise(x, sigma)
                return d, d
            assert u is not None
            out = guided_batch(unet, x_in, t, c, u)
            mixed = out[n:] + cfg_scale * (out[:n] - out[n:])
            return ((x * c_skip + mixed * c_out).astype(np.float32),
                    (x * c_skip + out[n:] * c_out).astype(np.float32))

        denoise.with_uncond = with_uncond  # type: ignore[attr-defined]
        return denoise

    # ------------------------------------------------------------------ VAE

    def decode(self, latent: np.ndarray, tile: Any = None) -> np.ndarray:
        """Latent as sampled (``(N, 4, h, w)``, scaled) -> images ``(N, 3, 8h, 8w)`` in [-1, 1].

        ``tile``: a :class:`~sdplan.core.planning.vae_tiling.VaeTiling` (or latent pixels, the
        snapshot's ``--vae-tile-size``) decodes in sd-cli's tiles; a whole decode that does
        not fit the VAE's budget is retried in tiles
        (:func:`~sdplan.core.pipelines.stages.vae_tiles.decode_tiled`)."""
        z = np.ascontiguousarray(latent / self.scale_factor, dtype=np.float32)
        runner = self.runners["vae"]
        f = self.vae_cfg.factor
        t0 = time.perf_counter()
        with runner.session():
            def one(zt: np.ndarray) -> np.ndarray:
                return runner.run({"z": zt})["image"]
            out, self.last_decode = decode_tiled(one, z, as_tiling(tile, f), f, fits_budget(runner))
        self.timings["decode"] = time.perf_counter() - t0
        return out

    def _moments(self, img: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(mean, logvar)`` of images ``(N, 3, H, W)`` in [-1, 1], in sd-cli's encode tiles
        when the run's :attr:`vae_tiling` is on."""
        runner = self.runners["vae"]
        img = np.ascontiguousarray(img, dtype=np.float32)
        with runner.session():
            def one(part: np.ndarray) -> np.ndarray:
                out = runner.run({"image": part})
                return np.concatenate([out["mean"], out["logvar"]], 1)
            both = encode_tiled(one, img, self.vae_tiling, self.vae_cfg.factor)
        c = both.shape[1] // 2
        return both[:, :c], both[:, c:]

    def encode_image(self, img: np.ndarray) -> np.ndarray:
        """Images ``(N, 3, H, W)`` in [-1, 1] -> latent means ``(N, 4, H/8, W/8)`` (unscaled)."""
        return self._moments(img)[0]

    def encode_sample(self, img: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Images ``(1, 3, H, W)`` in [-1, 1] -> a draw of their latent distribution with
        standard normal ``noise`` ``(1, 4, H/8, W/8)``, times the scale factor (SD's 0.18215,
        SDXL's 0.13025): the
        diffusion model's latent (:func:`~sdplan.core.pipelines.stages.img2img.sample_latent`)."""
        t0 = time.perf_counter()
        mean, logvar = self._moments(img)
        self.timings["encode"] = self.timings.get("encode", 0.0) + time.perf_counter() - t0
        return sample_latent(mean, logvar, noise) * np.float32(self.scale_factor)

    @property
    def inpaint(self) -> bool:
        """An inpainting checkpoint: its UNet takes 9 input channels (latent, mask, masked
        image latent)."""
        return self.unet_cfg.in_channels == 9

    def lora_aliases(self) -> AliasTable:
        """The LoRA names of this checkpoint's UNet and text encoder
        (:func:`~sdplan.core.modelfiles.lora_names.sd_aliases`)."""
        names = {m: [t.info.name for t in self.ms.module_tensors(m)] for m in ("diffusion", "te")}
        shapes = {t.info.name: tuple(t.info.shape) for t in self.ms.tensors}
        return aliases_for_family(self.family, names, shapes)

    def _image_latents(self, init: ImageInput | None, shape: tuple[int, ...],
                       gen: NoiseSource) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """``(init latent, blend mask, extra UNet channels)`` for ``init`` at the latent
        ``shape`` (module docstring of :mod:`sdplan.core.pipelines.stages.img2img`); ``gen`` is a
        fresh generator of the request's seed (sd-cli samples the encoder's distribution with
        the seed's RNG before it draws the starting noise)."""
        if init is None and not self.inpaint:
            return None, None, None
        init = init or ImageInput()
        n, _, h, w = shape
        f = self.vae_cfg.factor
        lat_shape = (1, self.vae_cfg.latent_channels, h, w)
        first = gen(lat_shape)
        lat = self.encode_sample(init.image, first) if init.image is not None else None
        pix = init.mask if init.mask is not None else np.ones((1, 1, h * f, w * f), np.float32)
        m = latent_mask(pix, f)
        concat = None
        if self.inpaint:
            masked = (self.encode_sample(init.image * (1.0 - pix), gen(lat_shape))
                      if init.image is not None else np.zeros(lat_shape, np.float32))
            concat = np.repeat(np.concatenate([m, masked], 1), n, 0)
            m = dilate(m)
        if lat is None:
            lat = np.zeros(lat_shape, np.float32)
        return np.repeat(lat, n, 0), (np.repeat(m, n, 0) if init.mask is not None or self.inpaint else None), concat

    # ------------------------------------------------------------------ txt2img

    def txt2img(self, p: GenerateParams,
                on_step: Callable[[int, int, np.ndarray], None] | None = None,
                preview: Callable[[int, np.ndarray], None] | None = None,
                noise: np.ndarray | None = None, sigmas: np.ndarray | None = None,
                vae_tile: Any = None,
                preview_decoder: Callable[[np.ndarray], np.ndarray] | None = None,
                decoder: Callable[[np.ndarray], np.ndarray] | None = None,
                init: ImageInput | None = None, hires: HiresFix | None = None,
                upscaler: Any = None, control: Any = None) -> list[np.ndarray]:
        """Generate ``p.batch`` images; returns ``(H, W, 3)`` uint8 arrays.

        ``init`` makes it image-to-image / inpainting (:mod:`sdplan.core.pipelines.stages.img2img`):
        its picture (``(1, 3, H, W)`` in [-1, 1], the generation's size) is encoded by the
        VAE, the schedule truncated by its strength, the latents outside its mask kept.

        ``on_step(step, total, latent)`` after every sampler step; ``preview(step, rgb)``
        with uint8 ``(h, w, 3)`` of the first image's denoised latent: the cheap
        latent-to-RGB projection, or ``preview_decoder(latent (1, 4, h, w)) -> uint8`` (a
        TAESD's :meth:`~sdplan.core.models.tae.Tae.preview`) when given. ``noise``/``sigmas``
        override the seeded Philox noise ``(batch, 4, H/8, W/8)`` and the schedule (tests).
        ``decoder(latent (1, 4, h, w)) -> float32 (1, 3, H, W)`` in about [0, 1] replaces the
        VAE for the final images (a TAESD's :meth:`~sdplan.core.models.tae.Tae.decode`: what
        sd-cli's ``--taesd`` does without ``--taesd-preview-only``). ``hires``: sd-cli's hires
        fix (:mod:`sdplan.core.pipelines.stages.hires`; ``upscaler``: its ESRGAN model's
        :class:`~sdplan.core.pipelines.stages.upscale.Upscaler`), a second pass per picture at
        the hires size before the final decode. ``control``: ``(ControlNetStage, picture
        (1, 3, H, W) in [0, 1], strength)`` (:mod:`sdplan.core.pipelines.stages.control`).

        Raises:
            InvalidArgument: width/height not positive multiples of the UNet's factor
                (8 * 2^(levels-1) for SD).
            ~sdplan.core.sampling.errors.SamplingError: unknown sampler or scheduler.
            Cancelled: the cancel token fired.
        """
        f = self.vae_cfg.factor * 2 ** (len(self.unet_cfg.channel_mult) - 1)
        if p.width % f or p.height % f or p.width <= 0 or p.height <= 0:
            raise InvalidArgument(f"-W/-H {p.width}x{p.height}: this model draws sizes that are "
                              f"positive multiples of {f} pixels")
        self.vae_tiling, self.last_decode = as_tiling(vae_tile, self.vae_cfg.factor), None
        t0 = time.perf_counter()
        cond, uncond = self.conditioning(p)
        self.timings["text_encode"] = time.perf_counter() - t0
        shape = (p.batch, self.vae_cfg.latent_channels, p.height // self.vae_cfg.factor,
                 p.width // self.vae_cfg.factor)
        gen, sampler_noise, planned = prepare(p.sampling, p.seed, p.steps, p.scheduler,
                                              self.schedule, self.family)
        init_lat, mask, concat = self._image_latents(init, shape, make_noise(p.sampling.rng, p.seed))
        if noise is None:
            noise = gen(shape)
        if sigmas is None:
            sigmas = planned
        if init is not None and init.image is not None and init_lat is not None:
            sigmas = truncate_sigmas(sigmas, init.strength)
            x = (init_lat + noise * np.float32(sigmas[0])).astype(np.float32)  # sd-cli's noise_scaling
        else:
            x = initial_latent(noise, sigmas)
        total = len(sigmas) - 1

        def cb(i: int, xi: np.ndarray, den: np.ndarray) -> None:
            if on_step:
                on_step(i + 1, total, xi)
            if preview:
                rgb = preview_decoder(den[:1]) if preview_decoder else latent_to_rgb(den[0], self.family)
                preview(i + 1, rgb)

        t0 = time.perf_counter()
        self._control = control
        with self.unet_session() as unet, self._controlled(unet, cond, shape[-1]) as unet:
            den = self.denoiser(unet, cond, uncond, p.cfg_scale, concat, p.sampling.timestep_shift)
            if mask is not None and init_lat is not None:
                den = blended_denoiser(den, init_lat, mask)
            latent = sample(p.sampler, den, x, sigmas, noise=sampler_noise, callback=cb,
                            schedule=self.schedule, eta=p.sampling.eta, extra=p.sampling.extra)
        self.timings["sampling"] = time.perf_counter() - t0
        self.timings["per_step"] = self.timings["sampling"] / max(total, 1)
        if hires is not None and hires.active:
            t0 = time.perf_counter()
            latent = np.concatenate([self._hires_pass(latent[b:b + 1], b, p, cond, uncond, hires, upscaler, on_step)
                                     for b in range(latent.shape[0])])
            self.timings["hires"] = time.perf_counter() - t0
        if decoder is not None:
            t0 = time.perf_counter()
            images = [decoder(latent[i:i + 1])[0] * 2.0 - 1.0 for i in range(latent.shape[0])]
            self.timings["decode"] = time.perf_counter() - t0
        else:
            images = list(self.decode(latent, vae_tile))
        return [image_to_uint8(im) for im in images]


    def _hires_pass(self, latent: np.ndarray, b: int, p: GenerateParams, cond: Cond, uncond: Cond | None,
                    fix: HiresFix, upscaler: Any,
                    on_step: Callable[[int, int, np.ndarray], None] | None) -> np.ndarray:
        """Picture ``b``'s hires fix second pass (:mod:`sdplan.core.pipelines.stages.hires`):
        its final latent ``(1, 4, h, w)`` upscaled and sampled again at the hires size."""
        levels = 2 ** (len(self.unet_cfg.channel_mult) - 1)
        f = self.vae_cfg.factor
        target = fix.target(p.width, p.height, math.lcm(f * 8, f * levels))  # sd-cli: VAE x UNet's 8
        opts = replace(p.sampling, sigmas=())
        gen, sampler_noise, _ = prepare(opts, p.seed + b, p.steps, p.scheduler, self.schedule, self.family)
        up = upscale_latent(latent, fix, target, f, lambda z: self.decode(z, self.vae_tiling),
                            self.encode_sample, gen, upscaler)
        noise = gen(up.shape)
        sigmas = hires_sigmas(lambda n: prepare(opts, p.seed + b, n, p.scheduler, self.schedule, self.family)[2],
                              p.steps, fix)
        self.hires_sigmas = sigmas
        x = (up + noise * np.float32(sigmas[0])).astype(np.float32)
        total = len(sigmas) - 1
        with self.unet_session() as unet, self._controlled(unet, cond, up.shape[-1]) as unet:
            den = self.denoiser(unet, cond, uncond, p.cfg_scale, None, p.sampling.timestep_shift)
            return sample(p.sampler, den, x, sigmas, noise=sampler_noise, schedule=self.schedule,
                          eta=p.sampling.eta, extra=p.sampling.extra,
                          callback=(lambda i, xi, d: on_step(i + 1, total, xi)) if on_step else None)


    @contextlib.contextmanager
    def _controlled(self, unet: Any, cond: Cond, latent_w: int) -> Iterator[Any]:
        """``unet`` with the run's ControlNet residuals (its weights in use meanwhile), the
        control picture resized to 8 pixels per latent pixel of a pass ``latent_w`` wide (a
        ControlNet's hint encoder divides by 8); ``unet`` itself without one."""
        if not getattr(self, "_control", None):
            yield unet
            return
        stage, hint, strength = self._control
        width = latent_w * 8
        if hint.shape[-1] != width:  # the hires pass: the picture at its size
            hint = interpolate(hint, hint.shape[-2] * width // hint.shape[-1], width, "bilinear")
        with stage.session():
            yield controlled(unet, stage, hint, strength, _as_cond(cond), self.vae_cfg.latent_channels)


def _as_cond(cond: Cond | np.ndarray) -> Cond:
    return {"c": cond} if isinstance(cond, np.ndarray) else dict(cond)


def _pad_chunks(ctx: np.ndarray, tokens: int) -> np.ndarray:
    """Repeat the last 77-token chunk until ``ctx`` has ``tokens`` tokens."""
    while ctx.shape[1] < tokens:
        ctx = np.concatenate([ctx, ctx[:, -77:]], 1)
    return ctx
