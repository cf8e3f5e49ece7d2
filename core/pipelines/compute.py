"""Compute buffers of sdplan's engine, measured by a dry run of its own graphs.

:func:`measure_compute` asks the family's dry run (the registry's
:attr:`~sdplan.core.families.declaration.Family.dry_run`: SD 1.x / 2.x and SD3 / SD3.5 have
one) to build the graphs a generation runs at a size and ggml's scheduler to reserve their
compute buffers without loading a weight or computing anything
(:meth:`~sdplan.core.runtime.runner.ModuleRunner.measure`): the bytes the engine will
allocate, with its own attention path and convolution method. A dry run takes well under a
second per module at real size.

:func:`compute_job` is the same as an engine job (``"sdplan.core.pipelines.compute:compute_job"``),
so ``sdplan generate`` measures in the engine process, on the planned devices' backends.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sdplan.core.errors import SdplanError
from sdplan.core.families import UNKNOWN, family
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.pipelines.job_names import COMPUTE_JOB as COMPUTE_JOB
from sdplan.core.runtime.devices import BackendManager
from sdplan.core.runtime.runner import BackendPool

log = logging.getLogger(__name__)


def measure_compute(model_files: Mapping[str, Sequence[str]], *, width: int, height: int,
                    batch: int = 1, cfg: bool = True, pool: Any = None,
                    placements: Mapping[str, Any] | None = None,
                    overrides: Mapping[str, Any] | None = None,
                    vae_tiling: Any = None, headers: dict[str, Any] | None = None) -> dict[str, int]:
    """Compute-buffer bytes per module (``te``, ``diffusion``, ``vae``, and ``upscaler`` for an
    ``upscale_model`` file; all devices of a module summed) of a generation at ``width`` x ``height`` pixels, measured by the family's
    dry-run reserve. Empty for families without one (the caller falls back to a formula).

    Args:
        model_files: sd-cli model flags -> paths (``model``, ``vae``...).
        width, height: image size in pixels (multiples of the model's factor);
            batch: images per run; cfg: classifier-free guidance runs (SD's UNet: a batch
            of ``2 * batch``).
        pool: backends (None: a private CPU pool, closed afterwards).
        placements: module -> ModulePlacement (None: the CPU).
        overrides: pipeline settings for tiny models (``clip_heads``).
        vae_tiling: ``--vae-tiling`` (a :class:`~sdplan.core.planning.vae_tiling.VaeTiling` or
            its JSON form): the VAE is measured on one of its tiles. Without it, a VAE whose
            whole decode does not fit its placement's budget (weights plus compute) is
            measured on the tile the engine's retry settles on
            (:func:`~sdplan.core.pipelines.stages.vae_tiles.retry_tiles`): the tiled peak.
        headers: the files' headers already read (path -> header), as
            :func:`~sdplan.core.modelfiles.checkpoint.read_model_files` takes them: the family
            and the VAE's bytes are read from them (the dry run's graphs still open the files).

    Raises:
        ModelFileError: unreadable files. Graph errors (a size the model cannot draw) give
        an empty result, logged.
    """
    files = {k: [str(p) for p in v] for k, v in model_files.items()
             if k not in ("taesd", "upscale_model")}
    arch = read_model_files({k: v for k, v in files.items() if k != "control_net"}, headers).architecture
    fam = family(arch.family) if arch.family != UNKNOWN else None
    if fam is None or fam.dry_run is None:
        return {}
    module, _, func = fam.dry_run.partition(":")
    measure = getattr(importlib.import_module(module), func)
    own = pool is None
    pool = pool if pool is not None else BackendPool(BackendManager(cpu_threads=1))
    try:
        from sdplan.core.planning.vae_tiling import VaeTiling

        def run(tile: tuple[int, int] | None) -> dict[str, int]:
            extra = {"vae_tile": tile} if tile else {}
            return dict(measure(files, width=width, height=height, batch=batch, cfg=cfg, pool=pool,
                                placements=placements, overrides=dict(overrides or {}), **extra))

        tiling = VaeTiling.from_json(vae_tiling) if vae_tiling else None
        scale = fam.vae_scale
        if tiling is not None and tiling.enabled:
            out = run(tiling.tile_latent(width, height, scale))
        else:
            out = run(None)
            budget = int(getattr((placements or {}).get("vae"), "budget", 0) or 0)
            weights = read_model_files(files, headers).module_profile("vae").total if budget else 0
            if budget and "vae" in out and weights + out["vae"] > budget:  # the engine retries in tiles
                from sdplan.core.pipelines.stages.vae_tiles import retry_tiles

                for tile in retry_tiles(width // scale, height // scale, tiling, scale):
                    out["vae"] = run(tile)["vae"]
                    if weights + out["vae"] <= budget:
                        break
        upscaler = list(model_files.get("upscale_model") or ())
        if upscaler:  # it upscales the decoded picture, after every other module
            from sdplan.core.pipelines.stages.upscale import measure_upscaler

            out["upscaler"] = measure_upscaler(upscaler[0], width, height,
                                               (placements or {}).get("upscaler"), pool)
        return out
    except (ValueError, RuntimeError, SdplanError) as exc:
        log.info("dry-run reserve unavailable: %s", exc)
        return {}
    finally:
        if own:
            pool.manager.close()


def compute_job(ctx: Any, model_files: Mapping[str, Sequence[str]], width: int, height: int,
                batch: int = 1, cfg: bool = True, placements: Mapping[str, Any] | None = None,
                overrides: Mapping[str, Any] | None = None, vae_tiling: Any = None) -> dict[str, int]:
    """:func:`measure_compute` in the engine process, on its shared backends."""
    return measure_compute(model_files, width=width, height=height, batch=batch, cfg=cfg,
                           pool=ctx.pool(), placements=placements, overrides=overrides,
                           vae_tiling=vae_tiling)
