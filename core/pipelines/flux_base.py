"""What the FLUX.1-family pipelines (FLUX.1 dev/schnell, Chroma) share: the DiT runner and
its sampling loop, the 16-channel autoencoder with FLUX.1's latent scaling, TAEF1 previews.

Modules run on the engine (:class:`sdplan.core.runtime.runner.ModuleRunner`) per their
:class:`~sdplan.core.runtime.runner.ModulePlacement`: ``diffusion`` (the DiT; its double then
single blocks are the layer-split blocks) and ``vae`` (and the TAEF1 preview decoder on the
VAE's main device). A family's pipeline adds its text encoders and prompt encoding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import InvalidArgument, SdplanError
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.base import FunctionGraph
from sdplan.core.models.flux import unpatchify
from sdplan.core.models.tae import detect_tae, split_tae, tae_decode
from sdplan.core.models.vae import vae_config, vae_decode
from sdplan.core.pipelines.base import Pipeline
from sdplan.core.runtime.runner import ModulePlacement
from sdplan.core.runtime.weights import WeightFile
from sdplan.core.sampling.flow import flux_sigmas, sample_flow
from sdplan.core.sampling.options import SamplingOptions, prepare
from sdplan.core.sampling.preview import latent_to_rgb
from sdplan.core.sampling.schedules_more import FlowSchedule

__all__ = ["FluxFamilyPipeline", "SCALE_FACTOR", "SHIFT_FACTOR", "shapes"]

#: FLUX.1 autoencoder latent scaling: ``z_model = (z_vae - SHIFT) * SCALE``.
SCALE_FACTOR = 0.3611
SHIFT_FACTOR = 0.1159

#: ``velocity(x, sigma) -> v``: the DiT's (guided) velocity for a latent ``(1, 16, h, w)``.
Velocity = Callable[[np.ndarray, float], np.ndarray]


def shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a weight file's header (no data read)."""
    return {t.name: tuple(t.shape) for t in read_tensor_file(path).tensors}


class FluxFamilyPipeline(Pipeline):
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
    preview_family = "flux"
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
        self.runners["vae"] = self._runner("vae", FunctionGraph(dec, {"z": "f32"}, self._decode), vae,
                                           self.placements["vae"], None)
        self.preview = self._tae_decoder(taesd) if taesd is not None else None

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

    def decode(self, latent: np.ndarray) -> np.ndarray:
        """Image ``(1, 3, 8h, 8w)`` (about [-1, 1]) of a model-space latent: the VAE decodes
        ``latent / SCALE_FACTOR + SHIFT_FACTOR``."""
        z = (latent / self.scale_factor + self.shift_factor).astype(np.float32)
        return self.runners["vae"].run({"z": z})["image"]

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
                flow_shift: float = 1.0,
                step_hook: Callable[[int, int], None] | None = None) -> dict[str, np.ndarray]:
        """Sample a ``(1, 16, h, w)`` latent from the seed's noise (``sampling.rng``; or
        ``noise``) and decode it. Returns ``{"latent", "image", "sigmas"}``.

        The sigmas: ``sampling.sigmas`` when given; else for ``scheduler`` ``default``
        :func:`~sdplan.core.sampling.flow.flux_sigmas` (``shift``: the image-size time shift),
        else that sd-cli scheduler over a flow schedule with ``sampling.flow_shift`` (default
        ``flow_shift``). ``step_hook(done, n)``: the steps done (0 before the first) of ``n``."""
        opts = sampling or SamplingOptions()
        tokens = (h // 2) * (w // 2)
        fshift = opts.flow_shift if opts.flow_shift is not None else flow_shift
        rng, sampler_noise, sigmas = prepare(opts, seed, steps,
                                             "discrete" if scheduler == "default" else scheduler,
                                             FlowSchedule(fshift, self.schedule_kind), image_tokens=tokens)
        if scheduler == "default" and not opts.sigmas:
            sigmas = self._default_sigmas(steps, tokens, shift, fshift)
        start = rng((1, 16, h, w)) if noise is None else np.asarray(noise, dtype=np.float32)

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
        return {"latent": latent, "image": self.decode(latent), "sigmas": sigmas}

    def _default_sigmas(self, steps: int, tokens: int, shift: bool, flow_shift: float) -> np.ndarray:
        """The family's own sigmas (``--scheduler`` not given): FLUX.1's schedule, time-shifted
        by the image's ``tokens`` when ``shift``."""
        return flux_sigmas(steps, tokens, shift=shift)

    def _preview_rgb(self, latent: np.ndarray) -> np.ndarray:
        if self.preview is not None:
            img = self.preview(latent / self.scale_factor + self.shift_factor)
            return (np.clip(img[0].transpose(1, 2, 0), 0, 1) * 255).round().astype(np.uint8)
        return latent_to_rgb(latent, self.preview_family)
