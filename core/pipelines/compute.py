"""Compute buffers of sdplan's engine, measured by a dry run of its own graphs.

:func:`measure_compute` builds the graphs an SD 1.x / 2.x generation runs at a size (the
text encoder on one 77-token chunk, the UNet on the CFG batch, the VAE decoder on the batch),
or an SD3 / SD3.5 generation (CLIP-L, bigG and T5-XXL on one 77-token chunk each, the largest
counting as they run one after another; the MMDiT on one latent with 77 + 77 text tokens, as
the engine runs the CFG passes one after another; the VAE decoder on one latent), and asks ggml's scheduler to reserve their compute buffers without loading a weight or
computing anything (:meth:`~sdplan.core.runtime.runner.ModuleRunner.measure`): the bytes the
engine will allocate, with its own attention path and convolution method. A dry run takes
well under a second per module at real size.

:func:`compute_job` is the same as an engine job (``"sdplan.core.pipelines.compute:compute_job"``),
so ``sdplan generate`` measures in the engine process, on the planned devices' backends.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sdplan.core.errors import SdplanError
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.pipelines.job_names import COMPUTE_JOB as COMPUTE_JOB
from sdplan.core.pipelines.sd import StableDiffusion
from sdplan.core.runtime.devices import BackendManager
from sdplan.core.runtime.runner import BackendPool

log = logging.getLogger(__name__)


def measure_compute(model_files: Mapping[str, Sequence[str]], *, width: int, height: int,
                    batch: int = 1, cfg: bool = True, pool: Any = None,
                    placements: Mapping[str, Any] | None = None,
                    overrides: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Compute-buffer bytes per module (``te``, ``diffusion``, ``vae``; all devices of a
    module summed) of an SD 1.x / 2.x or SD3 generation at ``width`` x ``height`` pixels,
    measured by a dry-run reserve. Empty for other families (the caller falls back to a
    formula). SD3 runs the images of a batch one after another, so its figures do not grow
    with ``batch`` or ``cfg``.

    Args:
        model_files: sd-cli model flags -> paths (``model``, ``vae``...).
        width, height: image size in pixels (multiples of the model's factor);
            batch: images per run; cfg: the UNet runs a batch of ``2 * batch``.
        pool: backends (None: a private CPU pool, closed afterwards).
        placements: module -> ModulePlacement (None: the CPU).
        overrides: pipeline settings for tiny models (SD3: ``clip_heads``).

    Raises:
        ModelFileError: unreadable files. Graph errors (a size the model cannot draw) give
        an empty result, logged.
    """
    files = {k: [str(p) for p in v] for k, v in model_files.items()
             if k not in ("taesd", "upscale_model")}
    models = read_model_files(files)
    family = models.architecture.family
    if family not in ("sd1", "sd2", "sd3"):
        return {}
    own = pool is None
    pool = pool if pool is not None else BackendPool(BackendManager(cpu_threads=1))
    if family == "sd3":
        return _measure_sd3(files, width, height, pool, own, placements, overrides or {})
    sd = StableDiffusion(models, None, pool, placements=placements)
    try:
        lh, lw = height // sd.vae_cfg.factor, width // sd.vae_cfg.factor
        n = batch * (2 if cfg else 1)
        shapes = {
            "te": (sd._te(sd._skip(0), True), {"ids": (1, 77), "mask": (77, 77)}),
            "diffusion": (sd.runners["diffusion"], {"x": (n, sd.unet_cfg.in_channels, lh, lw),
                                                    "t": (n,), "c": (n, 77, sd.unet_cfg.context_dim)}),
            "vae": (sd.runners["vae"], {"z": (batch, sd.unet_cfg.out_channels, lh, lw)}),
        }
        out: dict[str, int] = {}
        for module, (runner, inputs) in shapes.items():
            out[module] = sum(runner.measure(inputs).values())
        return out
    except (ValueError, RuntimeError, SdplanError) as exc:
        log.info("dry-run reserve unavailable: %s", exc)
        return {}
    finally:
        sd.close()
        if own:
            pool.manager.close()


def _measure_sd3(files: Mapping[str, list[str]], width: int, height: int, pool: Any, own: bool,
                 placements: Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> dict[str, int]:
    from sdplan.core.pipelines.sd3 import Sd3Pipeline  # SD3's code loads for SD3 files only

    try:
        with Sd3Pipeline(files, None, pool, placements, clip_heads=overrides.get("clip_heads")) as pipe:
            return {module: max(sum(r.measure(shapes).values()) for r, shapes in graphs)
                    for module, graphs in pipe.dry_run_inputs(width, height).items()}
    except (ValueError, RuntimeError, SdplanError) as exc:
        log.info("dry-run reserve unavailable: %s", exc)
        return {}
    finally:
        if own:
            pool.manager.close()


def compute_job(ctx: Any, model_files: Mapping[str, Sequence[str]], width: int, height: int,
                batch: int = 1, cfg: bool = True, placements: Mapping[str, Any] | None = None,
                overrides: Mapping[str, Any] | None = None) -> dict[str, int]:
    """:func:`measure_compute` in the engine process, on its shared backends."""
    return measure_compute(model_files, width=width, height=height, batch=batch, cfg=cfg,
                           pool=ctx.pool(), placements=placements, overrides=overrides)
