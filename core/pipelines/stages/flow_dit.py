"""What the FLUX.1-family pipelines (FLUX.1 dev/schnell, Chroma) share: the DiT runner and
its sampling loop, the 16-channel autoencoder with FLUX.1's latent scaling, TAEF1 previews.

Modules run on the engine (:class:`sdplan.core.runtime.runner.ModuleRunner`) per their
:class:`~sdplan.core.runtime.runner.ModulePlacement`: ``diffusion`` (the DiT; its double then
single blocks are the layer-split blocks) and ``vae`` (and the TAEF1 preview decoder on the
VAE's main device). A family's pipeline adds its text encoders and prompt encoding.

Image to image and inpainting (:mod:`sdplan.core.pipelines.stages.img2img`) happen here for every
FLUX.1-family model: the autoencoder's encoder (a ``vae_encoder`` runner placed as the VAE,
made on first use) gives the init latent, the flow start is ``(1 - s) init + s noise`` over the
truncated schedule, and with a mask the DiT's prediction ``x - s v`` is blended with the init
latent each step. LoRAs map onto the DiT and text encoders by
:func:`~sdplan.core.modelfiles.lora_names.flux_aliases`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import InvalidArgument, SdplanError
from sdplan.core.modelfiles.lora_names import AliasTable, flux_aliases
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.base import FunctionGraph
from sdplan.core.models.flux import unpatchify
from sdplan.core.models.tae import detect_tae, split_tae, tae_decode
from sdplan.core.models.vae import VaeGraph, vae_config, vae_decode, vae_moments
from sdplan.core.pipelines.request_parts import HiresFix
from sdplan.core.pipelines.stages.base import Pipeline
from sdplan.core.pipelines.stages.hires import hires_sigmas, upscale_latent
from sdplan.core.pipelines.stages.img2img import (
    ImageInput,
    blend,
    latent_mask,
    sample_latent,
    truncate_sigmas,
)
from sdplan.core.pipelines.stages.vae_tiles import (
    as_tiling,
    decode_tiled,
    encode_tiled,
    fits_budget,
)
from sdplan.core.runtime.runner import ModulePlacement
from sdplan.core.runtime.weights import WeightFile
from sdplan.core.sampling.flow import flux_sigmas, sample_flow
from sdplan.core.sampling.noise import NoiseSource, make_noise
from sdplan.core.sampling.options import SamplingOptions, prepare
from sdplan.core.sampling.preview import latent_to_rgb
from sdplan.core.sampling.schedules_more import FlowSchedule

__all__ = ["FlowDiTPipeline", "SCALE_FACTOR", "SHIFT_FACTOR", "shapes"]

#: The CPU bf16 kernels with which the autoencoder's decoder and encoder functions hold their
#: weights in bf16: the SD VAE's rule (the same blocks; :class:`VaeGraph`).
VAE_BF16 = VaeGraph.cpu_bf16_kernels

#: FLUX.1 autoencoder latent scaling: ``z_model = (z_vae - SHIFT) * SCALE``.
SCALE_FACTOR = 0.3611
SHIFT_FACTOR = 0.1159

#: ``velocity(x, sigma) -> v``: the DiT's (guided) velocity for a latent ``(1, 16, h, w)``.
Velocity = Callable[[np.ndarray, float], np.ndarray]


def shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a weight file's header (no data read)."""
    return {t.name: tuple(t.shape) for t in read_tensor_file(path).tensors}


class FlowDiTPipeline(Pipeline):
    """Base of the FLUX.1-family pipelines: subclasses set :attr:`dit`, register the
    ``diffusion`` runner with :meth:`_runner` and call :meth:`_init_vae`.

    Attributes:
        placements: module -> ModulePlacement (``diffusion``, ``te``, ``vae``).
        dit: the DiT graph (a :class:`~sdplan.core.models.flux.FluxDiT`).
        preview: the TAEF1 decoder ``latent (1, 16, h, w) -> image (1, 3, 8h, 8w)`` or None.
    """

    placements: dict[str, ModulePlacement]
    dit: Any
    preview: Callable[[np.ndarray], np.ndarray] | None = None
    #: the autoencoder's latent scaling (``z_model = (z_vae - shift) * scale``), the latent
    #: projection of previews without a TAE, the flow schedule of sd-cli's schedulers.
    scale_factor = SCALE_FACTOR
    shift_factor = SHIFT_FACTOR
    latent_format = "flux_ae"
    schedule_kind = "flux"

    def _runner(self, name: str, model: Any, path: str | Path, placement: Any,
                dtypes: Mapping[str, str] | None) -> Any:
        names = list(model.other_tensors()) + [n for i in range(model.n_blocks) for n in model.block_tensors(i)]
        wf = WeightFile(path, names, dtypes=dtypes, backend=self.pool.get(placement.devices[0]))
        return self.new_runner(name, model, wf, placement)

    def _init_vae(self, vae: str | Path, taesd: str | Path | None) -> None:
        """The ``vae`` runner (decoder of the 16-channel autoencoder, with or without the
        ``first_stage_model.`` prefix) and, with ``taesd``, the TAEF1 preview decoder."""
        vae_shapes = shapes(vae)
        prefix = "first_stage_model." if any(n.startswith("first_stage_model.") for n in vae_shapes) else ""
        self.vae_cfg = vae_config(vae_shapes, prefix)
        dec = [n for n in vae_shapes if n.startswith(prefix + "decoder.")]
        self.runners["vae"] = self._runner("vae", FunctionGraph(dec, {"z": "f32"}, self._decode, VAE_BF16), vae,
                                           self.placements["vae"], None)
        self._vae_path = vae
        self._vae_encoder = [n for n in vae_shapes if n.startswith((prefix + "encoder.", prefix + "quant_conv."))]
        self.preview = self._tae_decoder(taesd) if taesd is not None else None

    def lora_aliases(self) -> AliasTable:
        """The LoRA names of the DiT and the text encoders it has
        (:func:`~sdplan.core.modelfiles.lora_names.flux_aliases`)."""
        runners = {m: self.runners[m] for m in ("diffusion", "clip_l", "t5xxl") if m in self.runners}
        return flux_aliases({m: list(r.wf.infos) for m, r in runners.items()},
                            {n: tuple(i.shape) for r in runners.values() for n, i in r.wf.infos.items()})

    def encode_sample(self, img: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Image ``(1, 3, H, W)`` in [-1, 1] -> a draw of the autoencoder's latent
        distribution with standard normal ``noise`` ``(1, 16, H/f, W/f)``, in model space
        (``(z - shift_factor) * scale_factor``). The encoder runs where the VAE is placed.

        Raises:
            SdplanError: the autoencoder file has no encoder.
        """
        if "vae_encoder" not in self.runners:
            if not self._vae_encoder:
                raise SdplanError(f"{self._vae_path}: the autoencoder has no encoder: img2img needs one")

            def enc(g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
                mean, logvar = vae_moments(g, w, ins["image"], self.vae_cfg)
                return {"mean": mean, "logvar": logvar}

            self.runners["vae_encoder"] = self._runner(
                "vae_encoder", FunctionGraph(self._vae_encoder, {"image": "f32"}, enc, VAE_BF16), self._vae_path,
                self.placements["vae"], None)
        runner = self.runners["vae_encoder"]

        def one(part: np.ndarray) -> np.ndarray:
            out = runner.run({"image": part})
            return np.concatenate([out["mean"], out["logvar"]], 1)

        with runner.session():
            both = encode_tiled(one, np.ascontiguousarray(img, dtype=np.float32), self.vae_tiling, self.vae_cfg.factor)
        c = both.shape[1] // 2
        z = sample_latent(both[:, :c], both[:, c:], noise)
        return ((z - self.shift_factor) * self.scale_factor).astype(np.float32)

    def _tae_decoder(self, path: str | Path) -> Callable[[np.ndarray], np.ndarray]:
        """TAEF1 decoder of ``path`` on the VAE's device: ``decode(latent (1, 16, h, w)) ->
        image (1, 3, 8h, 8w)`` in about [0, 1]."""
        tae_shapes = shapes(path)
        layouts = detect_tae(tae_shapes, str(path))
        if "decoder" not in layouts:
            raise SdplanError(f"{path}: no TAE decoder")

        def fn(g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
            return {"image": tae_decode(g, split_tae(w, layouts["decoder"]), ins["z"])}

        pl = ModulePlacement(self.placements["vae"].devices[:1])
        runner = self._runner("preview", FunctionGraph(list(tae_shapes), {"z": "f32"}, fn), path, pl, None)
        self.runners["preview"] = runner
        return lambda z: runner.run({"z": np.ascontiguousarray(z, dtype=np.float32)})["image"]

    def _decode(self, g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        return {"image": vae_decode(g, w, ins["z"], self.vae_cfg)}

    # ------------------------------------------------------------------ stages
    def velocity(self, x: np.ndarray, sigma: float, context: np.ndarray, pooled: np.ndarray | None,
                 guidance: float | None) -> np.ndarray:
        """The DiT's velocity for latent ``x`` ``(1, 16, H, W)`` at ``sigma`` (``pooled`` and
        ``guidance`` as the DiT's ``inputs`` takes them)."""
        out = self.runners["diffusion"].run(self.dit.inputs(x, context, pooled, sigma, guidance))["out"]
        return unpatchify(out, x.shape[2], x.shape[3])

    @contextlib.contextmanager
    def diffusion_session(self) -> Iterator[None]:
        """Keep the DiT's run-scoped weights (params on a device, or disk) loaded across the
        steps of a sampling loop; released when the block exits."""
        with self.runners["diffusion"].session():
            yield

    def decode(self, latent: np.ndarray, tile: Any = None) -> np.ndarray:
        """Image ``(1, 3, 8h, 8w)`` (about [-1, 1]) of a model-space latent: the VAE decodes
        ``latent / scale_factor + shift_factor`` (:meth:`vae_decode`; ``tile``: in tiles)."""
        return self.vae_decode((latent / self.scale_factor + self.shift_factor).astype(np.float32), tile)

    def vae_decode(self, z: np.ndarray, tile: Any = None) -> np.ndarray:
        """The VAE's image of its own latent ``z`` ``(1, C, h, w)``; with ``tile`` (a
        :class:`~sdplan.core.planning.vae_tiling.VaeTiling`, or latent pixels as the snapshot's
        ``--vae-tile-size``) in sd-cli's overlapping tiles, and a whole decode that does not
        fit the VAE's budget retried in tiles
        (:func:`~sdplan.core.pipelines.stages.vae_tiles.decode_tiled`)."""
        runner = self.runners["vae"]
        f = self.vae_cfg.factor

        def one(zt: np.ndarray) -> np.ndarray:
            return runner.run({"z": np.ascontiguousarray(zt, dtype=np.float32)})["image"]

        with runner.session():
            out, self.last_decode = decode_tiled(one, z, as_tiling(tile, f), f, fits_budget(runner))
        return out

    def _latent_size(self, width: int, height: int, vae_scale: int) -> tuple[int, int]:
        """``(h, w)`` of the latent of a ``width x height`` image.

        Raises:
            SdplanError: sizes that are not positive multiples of ``2 * vae_scale``.
        """
        if width % (2 * vae_scale) or height % (2 * vae_scale) or width <= 0 or height <= 0:
            raise InvalidArgument(f"Flux image size {width}x{height} must be positive multiples of {2 * vae_scale}")
        return height // vae_scale, width // vae_scale

    def _sample(self, vel: Velocity, h: int, w: int, steps: int, *, shift: bool, seed: int,
                sampler: str, noise: np.ndarray | None,
                preview: Callable[[int, np.ndarray], None] | None,
                scheduler: str = "default", sampling: SamplingOptions | None = None,
                flow_shift: float = 1.0, init: ImageInput | None = None,
                init_seed: int | None = None,
                step_hook: Callable[[int, int], None] | None = None,
                tae_decode: bool = False, vae_tile: Any = None) -> dict[str, np.ndarray]:
        """Sample a ``(1, 16, h, w)`` latent from the seed's noise (``sampling.rng``; or
        ``noise``) and decode it. Returns ``{"latent", "image", "sigmas"}``.

        The sigmas: ``sampling.sigmas`` when given; else for ``scheduler`` ``default``
        :func:`~sdplan.core.sampling.flow.flux_sigmas` (``shift``: the image-size time shift),
        else that sd-cli scheduler over a flow schedule with ``sampling.flow_shift`` (default
        ``flow_shift``). With ``init``'s picture (``(1, 3, h f, w f)``, ``f`` the
        autoencoder's factor): image to image (and its mask: inpainting) as the module
        docstring says; ``init_seed`` (default ``seed``) seeds the draw of the init latent
        from the same generator (``sampling.rng``). ``step_hook(done, n)``: the steps done
        (0 before the first) of ``n`` (the truncated schedule's steps with an init picture).
        ``tae_decode``: the ``taesd`` TAE decodes the final latent instead of the VAE
        (:meth:`tae_image`); ``vae_tile``: the VAE decodes in tiles (:meth:`vae_decode`).

        Raises:
            SdplanError: an init picture of the wrong size; ``tae_decode`` without a TAE.
        """
        if tae_decode and self.preview is None:
            raise SdplanError("decoding with the TAE needs a --taesd file")
        self.vae_tiling, self.last_decode = as_tiling(vae_tile, self.vae_cfg.factor), None
        opts = sampling or SamplingOptions()
        tokens = (h // 2) * (w // 2)
        fshift = opts.flow_shift if opts.flow_shift is not None else flow_shift
        rng, sampler_noise, sigmas = prepare(opts, seed, steps,
                                             "discrete" if scheduler == "default" else scheduler,
                                             FlowSchedule(fshift, self.schedule_kind), image_tokens=tokens)
        if scheduler == "default" and not opts.sigmas:
            sigmas = self._default_sigmas(steps, tokens, shift, fshift)
        start = rng((1, 16, h, w)) if noise is None else np.asarray(noise, dtype=np.float32)
        start, sigmas, vel = self._image_start(
            start, sigmas, vel, init, make_noise(opts.rng, seed if init_seed is None else init_seed))

        n_steps = len(sigmas) - 1
        if step_hook is not None:
            step_hook(0, n_steps)

        def cb(i: int, x: np.ndarray, den: np.ndarray) -> None:
            if step_hook is not None:
                step_hook(i + 1, n_steps)
            if preview is not None:
                preview(i, self._preview_rgb(den))

        with self.diffusion_session():
            latent = sample_flow(sampler, vel, start, sigmas, noise=sampler_noise, callback=cb,
                                 eta=opts.eta, extra=opts.extra)
        fix, upscaler = getattr(self, "hires", None) or (None, None)
        if fix is not None and fix.active:
            latent = self._hires_pass(latent, vel, fix, upscaler, seed, steps, scheduler, opts, shift, fshift,
                                      sampler, step_hook)
        image = self.tae_image(latent) if tae_decode else self.decode(latent, vae_tile)
        return {"latent": latent, "image": image, "sigmas": sigmas}

    def _hires_pass(self, latent: np.ndarray, vel: Velocity, fix: HiresFix, upscaler: Any, seed: int, steps: int,
                    scheduler: str, opts: SamplingOptions, shift: bool, fshift: float, sampler: str,
                    step_hook: Callable[[int, int], None] | None) -> np.ndarray:
        """The hires fix's second pass (:mod:`sdplan.core.pipelines.stages.hires`) of a
        model-space latent ``(1, C, h, w)``: upscaled, noised as flow image to image does
        (``(1 - s0) x + s0 noise``), sampled with the first pass's scheduler at the hires size.
        Set ``self.hires = (HiresFix, Upscaler or None)`` before a run to have it."""
        f = self.vae_cfg.factor
        target = fix.target(latent.shape[-1] * f, latent.shape[-2] * f, 2 * f)
        plain = replace(opts, sigmas=())
        gen, sampler_noise, _ = prepare(plain, seed, steps, "discrete" if scheduler == "default" else scheduler,
                                        FlowSchedule(fshift, self.schedule_kind))
        up = upscale_latent(latent, fix, target, f, lambda z: self.decode(z, self.vae_tiling), self.encode_sample,
                            gen, upscaler)
        noise = gen(up.shape)
        tokens = (up.shape[-2] // 2) * (up.shape[-1] // 2)

        def sigmas_for(n: int) -> np.ndarray:
            if scheduler == "default":
                return self._default_sigmas(n, tokens, shift, fshift)
            return prepare(plain, seed, n, scheduler, FlowSchedule(fshift, self.schedule_kind), image_tokens=tokens)[2]

        sigmas = hires_sigmas(sigmas_for, steps, fix)
        self.hires_sigmas = sigmas
        s0 = np.float32(sigmas[0])
        start = ((up * (np.float32(1.0) - s0) + noise * s0) / s0).astype(np.float32)  # sample_flow scales by s0
        n = len(sigmas) - 1

        def cb(i: int, x: np.ndarray, den: np.ndarray) -> None:
            if step_hook is not None:
                step_hook(i + 1, n)

        with self.diffusion_session():
            return sample_flow(sampler, vel, start, sigmas, noise=sampler_noise, callback=cb, eta=opts.eta,
                               extra=opts.extra)

    def _default_sigmas(self, steps: int, tokens: int, shift: bool, flow_shift: float) -> np.ndarray:
        """The family's own sigmas (``--scheduler`` not given): FLUX.1's schedule, time-shifted
        by the image's ``tokens`` when ``shift``."""
        return flux_sigmas(steps, tokens, shift=shift)

    def _image_start(self, start: np.ndarray, sigmas: np.ndarray, vel: Velocity, init: ImageInput | None,
                     init_noise: NoiseSource) -> tuple[np.ndarray, np.ndarray, Velocity]:
        """``(noise0, sigmas, vel)`` for ``init`` (None or no picture: unchanged): the init
        latent (drawn with ``init_noise``'s first draw) noised to the truncated schedule's first
        sigma ``s0``, ``(1 - s0) init + s0 noise``, given as the ``noise0`` that
        :func:`~sdplan.core.sampling.flow.sample_flow` scales by ``s0``; and ``vel`` blending
        the prediction with the init latent where the mask is 0.

        Raises:
            SdplanError: a picture that is not ``(1, 3, h f, w f)`` for the latent ``start``.
        """
        if init is None or init.image is None:
            return start, sigmas, vel
        n, c, h, w = start.shape
        f = self.vae_cfg.factor
        if init.image.shape[2:] != (h * f, w * f):
            raise SdplanError(f"init image {init.image.shape[3]}x{init.image.shape[2]}: this autoencoder "
                              f"needs {w * f}x{h * f} pixels for a {h}x{w} latent")
        ref = self.encode_sample(init.image, init_noise((1, c, h, w)))
        sigmas = truncate_sigmas(sigmas, init.strength)
        s0 = np.float32(sigmas[0])
        start = (ref * (np.float32(1.0) - s0) + start * s0).astype(np.float32)
        if s0 != 1.0:  # sample_flow starts from sigmas[0] * noise0
            start = (start / s0).astype(np.float32)
        if init.mask is not None:
            vel = _blended(vel, ref, latent_mask(init.mask, f))
        return start, sigmas, vel

    def tae_latent(self, latent: np.ndarray) -> np.ndarray:
        """The TAE decoder's input for a diffusion latent: the latent itself. TAESD, TAEF1 and
        TAESD3 decode the diffusion model's latent space (sd-cli's ``TinyAutoEncoder`` maps
        diffusion latents to its own unchanged; ComfyUI's TAESD scales a VAE latent back to
        it), not the autoencoder's ``latent / scale_factor + shift_factor``."""
        return latent

    def tae_image(self, latent: np.ndarray) -> np.ndarray:
        """Image ``(1, 3, H, W)`` float32 in about [-1, 1] of a diffusion latent decoded by the
        ``taesd`` TAE (sd-cli's final decode with ``--taesd`` without ``--taesd-preview-only``).

        Raises:
            SdplanError: no TAE decoder was loaded (no ``taesd`` file).
        """
        if self.preview is None:
            raise SdplanError("decoding with the TAE needs a --taesd file")
        return (self.preview(self.tae_latent(latent)) * np.float32(2.0) - np.float32(1.0)).astype(np.float32)

    def _preview_rgb(self, latent: np.ndarray) -> np.ndarray:
        if self.preview is not None:
            img = self.preview(self.tae_latent(latent))
            return (np.clip(img[0].transpose(1, 2, 0), 0, 1) * 255).round().astype(np.uint8)
        return latent_to_rgb(latent, self.latent_format)


def _blended(vel: Velocity, ref: np.ndarray, mask: np.ndarray) -> Velocity:
    """``vel`` whose prediction ``x - s v`` keeps ``ref`` where ``mask`` is 0 (sd-cli blends
    the denoised latent; a flow sampler's velocity is ``(x - denoised) / s``); a ``vel`` with
    ``with_uncond`` (:func:`~sdplan.core.sampling.flow.guided_velocity`) keeps it, both
    predictions blended."""
    def one(x: np.ndarray, s: float, v: np.ndarray) -> np.ndarray:
        if s <= 0:
            return v
        den = blend(x - np.float32(s) * v, ref, mask)
        return ((x - den) / np.float32(s)).astype(np.float32)

    def blended(x: np.ndarray, s: float) -> np.ndarray:
        return one(x, s, vel(x, s))

    pair = getattr(vel, "with_uncond", None)
    if pair is not None:
        def both(x: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray]:
            v, u = pair(x, s)
            return one(x, s, v), one(x, s, u)

        blended.with_uncond = both  # type: ignore[attr-defined]
    return blended
