"""Stable Diffusion 3 / 3.5 text-to-image: CLIP-L + CLIP-G + T5-XXL conditioning, classifier-free
guidance with the negative prompt, flow-matching sampling with the MMDiT, decoding with the
16-channel autoencoder.

Files as sd-cli takes them: one file holding everything (``-m``: ``model.diffusion_model.``,
``first_stage_model.``, ``text_encoders.{clip_l,clip_g,t5xxl}.transformer.``; T5 may be absent)
or separate ``--diffusion-model``, ``--clip_l``, ``--clip_g``, ``--t5xxl``, ``--vae`` files,
in any mix. Conditioning: :mod:`sdplan.core.pipelines.sd3.conditioner`. Sigmas: sd-cli's
discrete flow schedule (:func:`~sdplan.core.sampling.flow.discrete_flow_sigmas`) with
``--flow-shift`` (default 3.0, sd-cli's for SD3), or an sd-cli ``--scheduler`` over the SD3
flow map; the DiT takes the timestep ``1000 sigma``. With ``cfg_scale != 1`` every step runs
the DiT on the prompt and on the negative prompt and takes ``uncond + cfg (cond - uncond)``.
Latent scaling of the SD3 autoencoder: ``z_model = (z_vae - 0.0609) * 1.5305`` (SD3's VAE
config: ``scaling_factor`` 1.5305, ``shift_factor`` 0.0609). Defaults as sd-cli: 20 steps,
euler, CFG 7. Image to image and inpainting come from the FLUX.1-family base (the init
picture encoded by the SD3 autoencoder's encoder, at SD3's latent scaling); LoRAs are refused
(:meth:`Sd3Pipeline.lora_aliases`).

Modules: ``diffusion`` (the MMDiT; its joint blocks are the layer-split blocks), ``te`` (T5-XXL
split; both CLIPs on te's main device), ``vae`` (and a TAESD3 preview decoder), each per its
ModulePlacement; the runner and autoencoder code is :mod:`~sdplan.core.pipelines.stages.flow_dit`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import InvalidArgument, ModelFileError, SdplanError
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.modelfiles.lora_names import AliasTable
from sdplan.core.models.mmdit import MMDiT, unpatch
from sdplan.core.pipelines.sd3.conditioner import CHUNK, Sd3Conditioner
from sdplan.core.pipelines.stages.base import module_placements
from sdplan.core.pipelines.stages.flow_dit import FlowDiTPipeline, shapes
from sdplan.core.pipelines.stages.img2img import ImageInput
from sdplan.core.pipelines.work import input_shapes
from sdplan.core.sampling.flow import discrete_flow_sigmas
from sdplan.core.sampling.slg import SkipLayerGuidance

__all__ = ["Sd3Pipeline", "MODULES", "DEFAULT_STEPS", "DEFAULT_CFG", "FLOW_SHIFT", "SCALE", "SHIFT"]

#: The plan modules of an SD3 run.
MODULES = ("diffusion", "te", "vae")
#: sd-cli's defaults for SD3: 20 steps, CFG 7, flow shift 3.
DEFAULT_STEPS = 20
DEFAULT_CFG = 7.0
FLOW_SHIFT = 3.0
#: The SD3 autoencoder's latent scaling (its ``scaling_factor`` and ``shift_factor``).
SCALE = 1.5305
SHIFT = 0.0609


def _file_of(ms: Any, module: str, label: str) -> str:
    files = sorted({t.info.file for t in ms.module_tensors(module)})
    if not files:
        raise ModelFileError("<request>", f"an SD3 run needs {label}")
    if len(files) > 1:
        raise ModelFileError(files[1], f"the SD3 {module} spans several files: {', '.join(files)}")
    return files[0]


class Sd3Pipeline(FlowDiTPipeline):
    """SD3 / SD3.5 txt2img over engine module runners.

    Args:
        files: sd-cli model flags -> paths (``model``, ``diffusion_model``, ``clip_l``,
            ``clip_g``, ``t5xxl``, ``vae``, ``taesd``).
        plan: a resolved plan (modules ``diffusion``, ``te``, ``vae``); None: the CPU.
        pool: backends by device name (default: a private ``BackendManager``'s).
        placements: module -> ``ModulePlacement`` overriding the plan's.
        n_threads: CPU threads (0: the backend's setting).
        dtypes: weight name -> runtime dtype overrides.
        cancel: a shared ``CancelToken``.
        heads: the MMDiT's heads (default: from its qk norm, else width / 64).
        clip_heads: heads of both CLIP encoders (default width / 64).

    Raises:
        ModelFileError / ModelLayoutError: files that are not an SD3 set (no MMDiT, a missing
            CLIP encoder or VAE, widths that do not fit).
        EngineError: a device without a backend, or memory that cannot be allocated.
    """

    scale_factor = SCALE
    shift_factor = SHIFT
    latent_format = "sd3_ae"
    schedule_kind = "sd3"

    def __init__(self, files: Mapping[str, Sequence[str | Path]], plan: Any = None, pool: Any = None,
                 placements: Mapping[str, Any] | None = None, n_threads: int = 0,
                 dtypes: Mapping[str, str] | None = None, cancel: Any = None, heads: int | None = None,
                 clip_heads: int | None = None) -> None:
        core = {k: [str(p) for p in v] for k, v in files.items() if k not in ("taesd",) and v}
        taesd = next(iter(files.get("taesd") or ()), None)
        ms = read_model_files(core)
        dit_file = _file_of(ms, "diffusion", "an MMDiT (-m or --diffusion-model)")
        vae_file = _file_of(ms, "vae", "the SD3 autoencoder (--vae, or -m holding first_stage_model.)")
        self.dit = MMDiT.from_weights(shapes(dit_file), heads)
        super().__init__(pool, n_threads, cancel)
        self.placements = module_placements(MODULES, plan, placements)
        try:
            self.runners["diffusion"] = self._runner("diffusion", self.dit, dit_file, self.placements["diffusion"],
                                                     dtypes)
            self.cond = Sd3Conditioner(self, ms, self.placements["te"], self.dit.cfg.context, self.dit.cfg.pooled,
                                       clip_heads, dtypes)
            self._init_vae(vae_file, taesd)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ stages
    def encode_prompt(self, prompt: str, clip_skip: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(context (1, 154 K, 4096), pooled (1, 2048))`` float32 of ``prompt``."""
        return self.cond.encode(prompt, clip_skip)

    def lora_aliases(self) -> AliasTable:
        """SD3 takes no LoRA in sdplan yet (the MMDiT's fused attention weights have no LoRA
        name table).

        Raises:
            SdplanError: always.
        """
        raise SdplanError("SD3 takes no LoRAs in sdplan yet")

    def velocity(self, x: np.ndarray, sigma: float, context: np.ndarray, pooled: np.ndarray | None,
                 guidance: float | None = None) -> np.ndarray:
        """The MMDiT's velocity for latent ``x`` ``(1, 16, H, W)`` at ``sigma``."""
        out = self.runners["diffusion"].run(self.dit.inputs(x, context, pooled, sigma))["out"]
        return unpatch(out, x.shape[2], x.shape[3], self.dit.cfg.patch)

    def dry_run_inputs(self, width: int, height: int) -> dict[str, list[tuple[Any, dict[str, tuple[int, ...]]]]]:
        """Module -> ``(runner, input shapes)`` of the graphs a ``width x height`` generation
        runs (one 77 + 77-token chunk; the DiT once per pass, CFG runs a second pass of the
        same size; the VAE decoder on one latent), for a dry-run reserve of their compute
        buffers (:mod:`sdplan.core.pipelines.compute`).

        Raises:
            InvalidArgument: a bad size; ValueError: a latent larger than the DiT's positions.
        """
        h, w = self._latent_size(width, height, self.vae_cfg.factor)
        c = self.dit.cfg
        dit = self.dit.inputs(np.zeros((1, 16, h, w), np.float32),
                              np.zeros((1, 2 * CHUNK, c.context), np.float32), np.zeros((1, c.pooled), np.float32), 1.0)
        return {"te": self.cond.dry_run_inputs(),
                "diffusion": [(self.runners["diffusion"], input_shapes(dit))],
                "vae": [(self.runners["vae"], {"z": (1, 16, h, w)})]}

    def _default_sigmas(self, steps: int, tokens: int, shift: bool, flow_shift: float) -> np.ndarray:
        return discrete_flow_sigmas(steps, flow_shift)

    def txt2img(self, prompt: str, width: int, height: int, *, negative_prompt: str = "",
                cfg_scale: float = DEFAULT_CFG, steps: int | None = None, seed: int = 42, sampler: str = "euler",
                clip_skip: int = 0, noise: np.ndarray | None = None,
                preview: Callable[[int, np.ndarray], None] | None = None, scheduler: str = "default",
                sampling: Any = None, slg: SkipLayerGuidance | None = None, init: ImageInput | None = None,
                init_seed: int | None = None, tae_decode: bool = False,
                vae_tile: int | None = None) -> dict[str, np.ndarray]:
        """Generate one image.

        Args:
            prompt, negative_prompt: the prompts (sd-cli weighting syntax).
            width, height: image size in pixels (multiples of twice the autoencoder's factor).
            cfg_scale: classifier-free guidance (``--cfg-scale``; 1 runs the prompt alone).
            steps: sampling steps (default 20).
            seed: the seed of the starting noise (and of ancestral samplers).
            sampler: a :data:`sdplan.core.sampling.flow.FLOW_SAMPLERS` name.
            clip_skip: CLIP layers skipped from the end (0: sd-cli's default 2).
            noise: an explicit starting noise ``(1, 16, h, w)`` instead of the seed's.
            preview: ``preview(step, rgb_uint8 (H, W, 3))`` after each step.
            scheduler: ``default`` (sd-cli's discrete flow sigmas) or an sd-cli scheduler.
            sampling: ``SamplingOptions`` (``--flow-shift``, ``--eta``, ``--sigmas``, ``--rng``...).
            slg: skip-layer guidance (:mod:`sdplan.core.sampling.slg`): on the steps of its
                window a third DiT pass on the prompt with its blocks passed through, on the same
                loaded weights; ``pred += scale (cond - skip)`` after CFG, as sd-cli (its window
                counts the steps that run: the truncated schedule's with an init picture).
            init: image to image / inpainting (picture ``(1, 3, H, W)`` in [-1, 1], optional
                mask, strength), as :class:`~sdplan.core.pipelines.stages.flow_dit.FlowDiTPipeline`
                does it; ``init_seed`` (default ``seed``) seeds the init latent's draw.
            tae_decode: the ``taesd`` TAE (TAESD3) decodes the final image instead of the VAE.
            vae_tile: the VAE decodes in tiles of this many latent pixels (``--vae-tiling``).

        Returns:
            ``{"latent": (1, 16, h, w), "image": (1, 3, H, W) float32, "sigmas": ...}``.

        Raises:
            InvalidArgument: a bad size, a non-finite ``cfg_scale``, skip layers outside the
                MMDiT's blocks; SdplanError: an init picture of the wrong size, an
                autoencoder without its encoder, ``tae_decode`` without a TAE; SamplingError.
        """
        h, w = self._latent_size(width, height, self.vae_cfg.factor)
        if not np.isfinite(cfg_scale):
            raise InvalidArgument(f"SD3 cfg_scale must be finite, got {cfg_scale}")
        skip_dit = None
        if slg is not None and slg.enabled:
            try:
                skip_dit = self.dit.skipping(slg.layers)
            except ValueError as exc:
                raise InvalidArgument(f"--skip-layers: {exc}") from None
        step = [0, 0]  # steps done, of n
        with self.cond.session(clip_skip):
            cond = self.encode_prompt(prompt, clip_skip)
            uncond = self.encode_prompt(negative_prompt, clip_skip) if cfg_scale != 1.0 else None

        def both(x: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray]:
            """``(guided velocity, unconditional velocity)`` (CFG++ samplers read the second;
            without a negative pass it is the guided one, as for a velocity guided already)."""
            v = self.velocity(x, s, *cond)
            out, u = v, None
            if uncond is not None:
                u = self.velocity(x, s, *uncond)
                out = (u + np.float32(cfg_scale) * (v - u)).astype(np.float32)
            if skip_dit is not None and slg is not None and slg.active(step[0], step[1]):
                with self.runners["diffusion"].variant(skip_dit):
                    vs = self.velocity(x, s, *cond)
                out = (out + np.float32(slg.scale) * (v - vs)).astype(np.float32)
            return out, (out if u is None else u)

        def vel(x: np.ndarray, s: float) -> np.ndarray:
            return both(x, s)[0]

        vel.with_uncond = both  # type: ignore[attr-defined]

        def hook(done: int, n: int) -> None:
            step[:] = [done, n]

        return self._sample(vel, h, w, steps or DEFAULT_STEPS, shift=False, seed=seed, sampler=sampler,
                            noise=noise, preview=preview, scheduler=scheduler, sampling=sampling,
                            flow_shift=FLOW_SHIFT, init=init, init_seed=init_seed, step_hook=hook,
                            tae_decode=tae_decode, vae_tile=vae_tile)
