"""Wan 2.x text to video and Wan 2.2 I2V-A14B and TI2V-5B image to video: UMT5's masked states as
the prompt,
flow-matching sampling with one DiT or the two experts of Wan 2.2 A14B (high noise, then low
noise), the Wan 2.1 autoencoder decoding the latent video (the Wan 2.2 one for Wan 2.2
TI2V-5B; and, for image to video, encoding the start picture's video:
:mod:`sdplan.core.pipelines.wan.i2v`, or the picture alone as TI2V-5B's first latent frame:
:mod:`sdplan.core.pipelines.wan.ti2v`).

As sd-cli runs it (stable-diffusion.cpp ``generate_video``, ``T5CLIPEmbedder`` with
``is_umt5``, ``wan.hpp``, ``wan_vae.hpp``):

* prompt: UMT5's pieces and ``</s>`` padded to 512 (:mod:`sdplan.core.text.umt5_tokenizer`),
  the padding masked out of the encoder's attention, ``(text:weight)`` weights applied with
  sd-cli's mean-keeping rule, then the padded rows zeroed (``zero_out_masked``);
* latent: the autoencoder's channels, ``(frames - 1) / 4 + 1`` latent frames at its scale (16
  channels at 1/8 with the Wan 2.1 autoencoder; 48 at 1/16 with Wan 2.2's, TI2V-5B's:
  :mod:`sdplan.core.pipelines.wan.autoencoder`); the starting noise drawn in the latent's
  ``(C, T, H, W)`` order. TI2V-5B's per-token timesteps (diffusers ``expand_timesteps``) are
  all one value in text to video: the DiT's single timestep; in image to video the picture's
  latent frame is held at timestep 0 (:mod:`sdplan.core.pipelines.wan.ti2v`);
* sampling: sigmas of the discrete flow schedule with shift 5 (sd-cli's default for Wan) over
  ``steps`` (plus ``--high-noise-steps`` when given); with a high-noise expert its phase is the
  steps whose sigma is at least ``--moe-boundary`` (0.875; or the first ``--high-noise-steps``),
  with its own CFG scale (``--high-noise-cfg-scale``, sd-cli's default 7), sampler and eta; the
  low-noise expert (``--diffusion-model``) samples the rest with ``--cfg-scale``. CFG is
  ``uncond + cfg (cond - uncond)`` with the negative prompt when the scale is not 1;
* image to video (a 36-input DiT): the start picture's condition (the mask and the normalised
  latent of ``[picture, grey frames...]``, :mod:`sdplan.core.pipelines.wan.i2v`) concatenated
  after the noise channels at every DiT call (both experts, both CFG passes); for TI2V-5B
  (a 48-input DiT) the picture's latent as the first latent frame, its timestep 0 and the x0
  estimate's first frame put back after every call (:mod:`sdplan.core.pipelines.wan.ti2v`);
* decoding: ``latent * std + mean`` per channel (the autoencoder's published statistics)
  through the autoencoder, the video clamped to [-1, 1].

Modules: ``diffusion`` (both experts on its placement: runners ``diffusion`` and
``diffusion_high``), ``te`` (UMT5, runner ``t5xxl``; its blocks split) and ``vae``. With
``keep_both`` False each expert is loaded for its phase only: the high-noise one is released
before the low-noise one loads, which is released before the decoder runs
(:mod:`sdplan.core.planning.phases`). Image to video adds the runner ``vae_encode`` (the
autoencoder's encoder, on the ``vae`` placement), run once before sampling; a TI2V-5B pipeline
has it when the autoencoder file holds its encoder (text to video never runs it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import SdplanError
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.base import FunctionGraph
from sdplan.core.models.qwen_image_vae import weight_file
from sdplan.core.models.t5 import T5Encoder, t5_config
from sdplan.core.models.wan import WanDiT, head_dim_of
from sdplan.core.models.wan import weight_file as dit_weight_file
from sdplan.core.models.wan_vae import latent_frames, video_frames
from sdplan.core.pipelines.stages.base import module_placements
from sdplan.core.pipelines.stages.flow_dit import FlowDiTPipeline, shapes
from sdplan.core.pipelines.wan import ti2v
from sdplan.core.pipelines.wan.autoencoder import wan_autoencoder
from sdplan.core.pipelines.wan.i2v import MASK_CHANNELS, condition, condition_video
from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.finite import check_finite, finite_steps
from sdplan.core.sampling.flow import (
    FLOW_SAMPLER_FUNCTIONS,
    FLOW_SAMPLERS,
    TAKES_EXTRA,
    discrete_flow_sigmas,
    flow_denoiser,
    guided_velocity,
)
from sdplan.core.sampling.options import SamplingOptions, prepare
from sdplan.core.sampling.schedules_more import FlowSchedule
from sdplan.core.text.prompt import apply_prompt_weights
from sdplan.core.text.umt5_tokenizer import WAN_MAX_LENGTH, UMT5Tokenizer

__all__ = ["WanModels", "HighNoise", "WanPipeline", "SHIFT", "BOUNDARY", "MODULES"]

#: sd-cli's default flow shift for Wan.
SHIFT = 5.0
#: sd-cli's ``--moe-boundary`` default: the sigma below which the low-noise expert samples.
BOUNDARY = 0.875
MODULES = ("diffusion", "te", "vae")
#: The input channels of a Wan 2.2 I2V-A14B DiT: noise, mask and picture latent (16 + 4 + 16).
I2V_INPUTS = 36
#: The input channels of a Wan 2.2 TI2V-5B DiT: the 48 latent channels of the Wan 2.2 autoencoder.
TI2V_INPUTS = 48


@dataclass
class WanModels:
    """The model files of a Wan run (sd-cli's ``--diffusion-model``, ``--t5xxl``, ``--vae`` and,
    for an A14B pair, ``--high-noise-diffusion-model``)."""

    diffusion_model: str | Path
    t5xxl: str | Path
    vae: str | Path
    high_noise_diffusion_model: str | Path | None = None


@dataclass(frozen=True)
class HighNoise:
    """The high-noise phase's settings (sd-cli's ``--high-noise-*`` and ``--moe-boundary``):
    ``steps`` -1 (the boundary decides), 0 (no phase) or a count; ``cfg_scale``; ``sampler``
    (None: the low-noise phase's); ``eta`` (None: the sampler's default); ``boundary``."""

    steps: int = -1
    cfg_scale: float = 7.0
    sampler: str | None = None
    eta: float | None = None
    boundary: float = BOUNDARY


def _dit(path: str | Path, flash: bool) -> WanDiT:
    return WanDiT.from_weights(shapes(path), head_dim_of(read_tensor_file(path).metadata), flash)


def _phase(method: str, vel: Callable[[np.ndarray, float], np.ndarray], x: np.ndarray, sigmas: np.ndarray, *,
           noise: Any, eta: float | None, callback: Callable[[int, np.ndarray, np.ndarray], None],
           extra: Mapping[str, str] | None, first: np.ndarray | None = None) -> np.ndarray:
    """One phase of the sampling from the latent ``x`` at ``sigmas[0]`` down to ``sigmas[-1]``
    (a fresh sampler, as sd-cli starts one per expert); ``first``: TI2V-5B's picture latent
    held as the x0 estimate's frame 0 (:func:`~sdplan.core.pipelines.wan.ti2v.keep_first`)."""
    if method not in FLOW_SAMPLERS:
        raise SamplingError(f"--sampling-method {method!r} does not apply to flow matching "
                            f"(Wan takes: {', '.join(FLOW_SAMPLERS)})")
    kwargs = {"extra": extra} if method in TAKES_EXTRA else {}
    den = flow_denoiser(vel) if first is None else ti2v.keep_first(flow_denoiser(vel), first)
    out = FLOW_SAMPLER_FUNCTIONS[method](den, x, sigmas, noise=noise, eta=eta,
                                         callback=finite_steps(callback, len(sigmas) - 1), **kwargs)
    return check_finite(out, "latent")


class WanPipeline(FlowDiTPipeline):
    """Wan text to video and image to video over engine module runners (module docstring).

    Args:
        models: the model files.
        plan, pool, placements, n_threads, dtypes, cancel: as the other flow pipelines'.
        flash: ggml's flash attention in the DiTs (sd-cli's ``--diffusion-fa``).
        keep_both: keep the high-noise expert's weights after its phase (both fit).

    Raises:
        ModelLayoutError / ModelFileError: files that are not the expected models (a T5 that is
            not UMT5, a file without its tokenizer blob).
        SdplanError: an encoder whose width is not the DiT's text width, experts that differ,
            an autoencoder whose latent channels are not the DiT's (Wan 2.2 TI2V-5B's 48 need
            the Wan 2.2 autoencoder; the others' 16 the Wan 2.1 one), a Wan 2.1 I2V/FLF2V DiT
            (img_emb), an I2V-A14B run with an autoencoder file without its encoder.
        EngineError: a device without a backend, or memory that cannot be allocated.
    """

    schedule_kind = "sd3"
    latent_format = "wan21_vae"

    def __init__(self, models: WanModels, plan: Any = None, pool: Any = None,
                 placements: Mapping[str, Any] | None = None, n_threads: int = 0,
                 dtypes: Mapping[str, str] | None = None, cancel: Any = None, flash: bool = False,
                 keep_both: bool = True) -> None:
        self.dit = _dit(models.diffusion_model, flash)
        self.i2v = self.dit.cfg.in_channels == I2V_INPUTS  # noise, mask and picture latent
        self.ti2v = self.dit.cfg.in_channels == TI2V_INPUTS  # the picture latent as the first frame
        if self.i2v and any(n.startswith("img_emb.") for n in shapes(models.diffusion_model)):
            raise SdplanError(f"{models.diffusion_model}: Wan 2.1 I2V/FLF2V (CLIP vision image embeddings, "
                              "img_emb); sdplan runs Wan 2.2 I2V-A14B image to video, not this one")
        self.high = _dit(models.high_noise_diffusion_model, flash) if models.high_noise_diffusion_model else None
        if self.high is not None and self.high.cfg != self.dit.cfg:
            raise SdplanError(f"{models.high_noise_diffusion_model}: the high-noise expert's layout is not the "
                              f"low-noise one's ({models.diffusion_model})")
        te = t5_config(shapes(models.t5xxl))
        if not te.per_block_bias:
            raise SdplanError(f"{models.t5xxl}: a T5 encoder with one shared position table, not UMT5 (Wan reads "
                              "umt5_xxl)")
        if te.width != self.dit.cfg.text:
            raise SdplanError(f"{models.t5xxl}: the text encoder's width {te.width} is not the Wan DiT's text "
                              f"width {self.dit.cfg.text}")
        vae_shapes = shapes(models.vae)
        self.ae = wan_autoencoder(vae_shapes)
        self.vae_cfg = self.ae.cfg
        want = "Wan 2.2 TI2V-5B's 48 channels need the Wan 2.2 autoencoder" if self.dit.cfg.in_channels == 48 else \
            "Wan 2.1 and Wan 2.2 A14B take the Wan 2.1 autoencoder"
        latent_c = self.dit.cfg.in_channels - (MASK_CHANNELS + self.ae.z if self.i2v else 0)
        if self.ae.z != self.ae.mean.shape[1] or not self.ae.has_decoder or latent_c != self.ae.z:
            raise SdplanError(f"{models.vae}: the {self.ae.name} autoencoder with {self.ae.z} latent channels"
                              f"{'' if self.ae.has_decoder else ' and no decoder'} does not decode the DiT's "
                              f"{latent_c} latent channels ({want})")
        self.latent_format = self.ae.latent_format
        if self.i2v and not self.ae.has_encoder(vae_shapes):
            raise SdplanError(f"{models.vae}: an autoencoder without its encoder; Wan image to video encodes the "
                              "start picture (-i/--init-img) with it")
        self.t5 = T5Encoder(te)
        self.tokenizer = UMT5Tokenizer.from_file(models.t5xxl)
        self.keep_both = keep_both
        super().__init__(pool, n_threads, cancel)
        self.placements = module_placements(MODULES, plan, placements)
        self._vae_path, self._vae_shapes = models.vae, vae_shapes
        try:
            self.runners["diffusion"] = self._dit_runner("diffusion", self.dit, models.diffusion_model, dtypes)
            if self.high is not None:
                self.runners["diffusion_high"] = self._dit_runner("diffusion_high", self.high,
                                                                  models.high_noise_diffusion_model, dtypes)
            self.runners["t5xxl"] = self._runner("t5xxl", self.t5, models.t5xxl, self.placements["te"], dtypes)
            dec = self.ae.decoder_names(vae_shapes)
            wf = weight_file(models.vae, dec, self.pool.get(self.placements["vae"].devices[0]))
            self.runners["vae"] = self.new_runner("vae", FunctionGraph(dec, {"z": "f32"}, self._decode), wf,
                                                  self.placements["vae"])
            if self.i2v or (self.ti2v and self.ae.has_encoder(vae_shapes)):
                enc = self.ae.encoder_names(vae_shapes)
                ewf = weight_file(models.vae, enc, self.pool.get(self.placements["vae"].devices[0]))
                self.runners["vae_encode"] = self.new_runner(
                    "vae_encode", FunctionGraph(enc, {"video": "f32"}, self._encode), ewf, self.placements["vae"])
        except BaseException:
            self.close()
            raise

    def _dit_runner(self, name: str, dit: WanDiT, path: Any, dtypes: Mapping[str, str] | None) -> Any:
        placement = self.placements["diffusion"]
        names = dit.other_tensors() + [n for i in range(dit.n_blocks) for n in dit.block_tensors(i)]
        wf = dit_weight_file(path, names, dtypes, self.pool.get(placement.devices[0]))
        return self.new_runner(name, dit, wf, placement)

    def _decode(self, g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        return {"video": self.ae.decode(g, w, ins["z"], self._vae_shapes)}

    def _encode(self, g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        return {"z": self.ae.encode(g, w, ins["video"], self._vae_shapes)}

    # ------------------------------------------------------------------ stages
    def encode_condition(self, picture: np.ndarray, frames: int) -> np.ndarray:
        """The image-to-video condition ``(1, 20, T, h, w)`` float32 of a start picture
        ``(1, 3, H, W)`` in [-1, 1] for a video of ``frames`` frames (``1 + 4 (T - 1)`` of them
        encoded: :mod:`sdplan.core.pipelines.wan.i2v`)."""
        video = condition_video(picture, video_frames(latent_frames(frames)))
        z = self.runners["vae_encode"].run({"video": video})["z"]  # (T, 16, h, w); compute freed after
        return condition(z, self.ae.mean, self.ae.std)

    def encode_first_frame(self, picture: np.ndarray) -> np.ndarray:
        """TI2V-5B's first latent frame ``(1, 48, 1, h, w)`` float32: the start picture ``(1, 3,
        H, W)`` in [-1, 1] encoded alone, normalised (:mod:`sdplan.core.pipelines.wan.ti2v`)."""
        z = self.runners["vae_encode"].run({"video": np.ascontiguousarray(picture, np.float32)})["z"]  # (1, 48, h, w)
        return ti2v.first_frame(z, self.ae.mean, self.ae.std)

    def encode_prompt(self, prompt: str, length: int = WAN_MAX_LENGTH) -> np.ndarray:
        """UMT5's states ``(1, length, width)`` float32 of ``prompt`` (module docstring)."""
        tok = self.tokenizer.tokenize(prompt, length)
        hidden = self.runners["t5xxl"].run(self.t5.inputs(tok.ids, tok.mask))["hidden"]
        hidden = apply_prompt_weights(hidden, tok.weights)
        return np.ascontiguousarray(hidden * tok.mask[..., None], dtype=np.float32)

    def velocity_of(self, runner: str, x: np.ndarray, sigma: float, context: np.ndarray,
                    cond: np.ndarray | None = None, first: np.ndarray | None = None) -> np.ndarray:
        """Runner ``runner``'s velocity ``noise - x0`` ``(1, C, T, h, w)`` for a latent video
        ``x`` ``(1, C, T, h, w)``; ``cond``: I2V-A14B's 20 condition channels after it;
        ``first``: TI2V-5B's picture latent ``(1, C, 1, h, w)`` in place of frame 0, at
        timestep 0."""
        dit = self.high if runner == "diffusion_high" and self.high is not None else self.dit
        z = x if cond is None else np.concatenate([x, cond], axis=1)
        if first is None:
            ins = dit.inputs(z, context, sigma)
        else:
            ins = dit.inputs(ti2v.model_input(z, first), context, sigma,
                             frame_sigmas=ti2v.frame_sigmas(x.shape[2] // dit.cfg.patch[0], sigma))
        out = self.runners[runner].run(ins)["out"]
        return dit.velocity(out, x.shape)

    def decode_video(self, latent: np.ndarray) -> np.ndarray:
        """The video ``(1, 3, F, f h, f w)`` in [-1, 1] of a normalised latent ``(1, C, T, h, w)``
        (``C`` and ``f``: the autoencoder's channels and scale)."""
        z = np.asarray(latent, np.float32) * self.ae.std + self.ae.mean
        frames = np.ascontiguousarray(np.transpose(z[0], (1, 0, 2, 3)))  # (T, C, h, w)
        out = self.runners["vae"].run({"z": frames})["video"]  # (F, 3, H, W)
        return np.clip(np.transpose(out, (1, 0, 2, 3))[None], -1.0, 1.0).astype(np.float32)

    def switch_step(self, sigmas: np.ndarray, high: HighNoise, high_steps: int) -> int:
        """Steps the high-noise expert samples: ``high_steps`` when given (> 0), else the
        first step whose sigma is below the boundary (sd-cli's rule); 0 without an expert."""
        if self.high is None or high.steps == 0:
            return 0
        if high_steps > 0:
            return high_steps
        below = [i for i, s in enumerate(sigmas) if s < high.boundary]
        return below[0] if below else len(sigmas) - 1

    def txt2vid(self, prompt: str, width: int, height: int, frames: int, *, steps: int = 20, seed: int = 42,
                sampler: str = "euler", cfg_scale: float = 6.0, negative_prompt: str = "",
                shift: float = SHIFT, high: HighNoise | None = None, noise: np.ndarray | None = None,
                sampling: SamplingOptions | None = None, scheduler: str = "default",
                preview: Callable[[int, np.ndarray], None] | None = None,
                step_hook: Callable[[int, int], None] | None = None,
                picture: np.ndarray | None = None) -> dict[str, Any]:
        """Generate one video (image to video with ``picture`` on a 36-input DiT, or on
        TI2V-5B's 48-input one).

        Args:
            prompt, negative_prompt: sd-cli weighting syntax; the negative prompt is encoded
                when a phase's CFG scale is not 1.
            width, height: frame size in pixels (positive multiples of twice the
                autoencoder's scale: 16, or 32 for Wan 2.2 TI2V-5B; the DiT's 2x2 patches).
            frames: video frames (``--video-frames``; ``(frames - 1) // 4 * 4 + 1`` are made).
            steps: the low-noise phase's steps (the whole schedule without ``high.steps``).
            seed: seed of the starting noise (and of the samplers that add noise).
            sampler, cfg_scale: the (low-noise) phase's sampler and CFG scale.
            shift: flow shift (``sampling.flow_shift`` wins).
            high: the high-noise phase's settings (None: sd-cli's defaults).
            noise: an explicit starting noise ``(1, C, T, h, w)`` (``C``: the latent channels).
            sampling, scheduler: sd-cli's other sampling options and ``--scheduler``.
            preview: ``preview(step, rgb_uint8)`` of the first frame after each step.
            step_hook: ``step_hook(done, n)`` before the first step and after each.
            picture: the start picture ``(1, 3, height, width)`` in [-1, 1]
                (:func:`~sdplan.core.pipelines.wan.i2v.start_picture`); needed by an
                I2V-A14B DiT, optional with TI2V-5B (its first frame), refused by a
                text-to-video one.

        Returns:
            ``{"latent": (1, C, T, h, w), "video": (1, 3, F, H, W) float32, "sigmas",
            "switch": the high-noise steps}``.

        Raises:
            SdplanError: a size that is not a positive multiple of the above, frames below 1, a
                picture missing (I2V-A14B) or given (text to video; TI2V-5B with an autoencoder
                file without its encoder) or of another size;
            SamplingError.
        """
        side = 2 * self.ae.factor
        if width % side or height % side or width <= 0 or height <= 0:
            raise SdplanError(f"Wan frame size {width}x{height} must be positive multiples of {side} (the "
                              f"{self.ae.name} autoencoder's {self.ae.factor}x and the DiT's 2x2 patches)")
        if frames < 1:
            raise SdplanError(f"Wan --video-frames must be at least 1, got {frames}")
        if self.i2v and picture is None:
            raise SdplanError("-i/--init-img missing: a Wan image-to-video model animates a start picture")
        if not self.i2v and not self.ti2v and picture is not None:
            raise SdplanError("-i/--init-img: a Wan text-to-video model takes no start picture")
        if self.ti2v and picture is not None and "vae_encode" not in self.runners:
            raise SdplanError(f"{self._vae_path}: an autoencoder without its encoder; Wan 2.2 TI2V-5B image to "
                              "video encodes the start picture (-i/--init-img) with it")
        if picture is not None and tuple(np.shape(picture)) != (1, 3, height, width):
            raise SdplanError(f"Wan start picture must be (1, 3, {height}, {width}), got {np.shape(picture)}")
        high = high or HighNoise()
        opts = sampling or SamplingOptions()
        h, w, t = height // self.ae.factor, width // self.ae.factor, latent_frames(frames)
        fshift = opts.flow_shift if opts.flow_shift is not None else shift
        extra = max(0, high.steps) if self.high is not None else 0
        total = steps + extra
        tokens = t * (h // 2) * (w // 2)
        rng, sampler_noise, sigmas = prepare(opts, seed, total, "discrete" if scheduler == "default" else scheduler,
                                             FlowSchedule(fshift, self.schedule_kind), image_tokens=tokens)
        if scheduler == "default" and not opts.sigmas:
            sigmas = discrete_flow_sigmas(total, fshift)
        k = min(self.switch_step(sigmas, high, extra), len(sigmas) - 1)
        cond = self.encode_condition(picture, frames) if picture is not None and self.i2v else None
        first = self.encode_first_frame(picture) if picture is not None and self.ti2v else None
        context = self.encode_prompt(prompt)
        needs_uncond = cfg_scale != 1.0 or (k > 0 and high.cfg_scale != 1.0)
        uncond = self.encode_prompt(negative_prompt) if needs_uncond else None
        x = rng((1, self.ae.z, t, h, w)) if noise is None else np.asarray(noise, dtype=np.float32)
        x = (x * np.float32(sigmas[0])).astype(np.float32) if first is None else \
            ti2v.start_latent(x, first, float(sigmas[0]))
        n_steps = len(sigmas) - 1
        if step_hook is not None:
            step_hook(0, n_steps)

        def cb_from(offset: int) -> Callable[[int, np.ndarray, np.ndarray], None]:
            def cb(i: int, x_: np.ndarray, den: np.ndarray) -> None:
                if step_hook is not None:
                    step_hook(offset + i + 1, n_steps)
                if preview is not None:
                    preview(offset + i, self._preview_rgb(den[:, :, 0]))
            return cb

        def guided(runner: str, scale: float) -> Callable[[np.ndarray, float], np.ndarray]:
            un = None if uncond is None or scale == 1.0 else (
                lambda z, s: self.velocity_of(runner, z, s, uncond, cond, first))
            return guided_velocity(lambda z, s: self.velocity_of(runner, z, s, context, cond, first), un, scale)

        if k > 0:
            runner = self.runners["diffusion_high"]
            with runner.session():
                x = _phase(high.sampler or sampler, guided("diffusion_high", high.cfg_scale), x, sigmas[:k + 1],
                           noise=sampler_noise, eta=high.eta, callback=cb_from(0), extra=opts.extra, first=first)
            if not self.keep_both:  # one expert at a time: the high-noise one makes room
                runner.release()
            else:  # its weights stay for the next video; its graph's buffers make room
                runner.free_compute()
        if k < n_steps:
            with self.runners["diffusion"].session():
                x = _phase(sampler, guided("diffusion", cfg_scale), x, sigmas[k:], noise=sampler_noise,
                           eta=opts.eta, callback=cb_from(k), extra=opts.extra, first=first)
            if not self.keep_both and k > 0:  # each expert only for its phase: the decoder's turn
                self.runners["diffusion"].release()
        return {"latent": x, "video": self.decode_video(x), "sigmas": sigmas, "switch": k}
