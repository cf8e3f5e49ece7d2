"""The work of a generation's graphs, counted from the graphs the engine builds.

:func:`count_work` builds the graphs a generation runs, as the compute dry run does
(:mod:`sdplan.core.pipelines.compute`: no weights loaded, nothing computed), on the planned
devices, and counts each graph's operations and bytes per device
(:meth:`~sdplan.core.runtime.runner.ModuleRunner.work`). For SD 1.x / 2.x: the CLIP text
encoder on one 77-token chunk (run once per prompt: twice with CFG's negative prompt), the
UNet on the CFG batch (once per sampler evaluation), the VAE decoder on the batch (once per
picture). For SD3 / SD3.5: CLIP-L, bigG and T5-XXL on one chunk each (per prompt), the
MMDiT on one latent (twice per evaluation with CFG: the passes run one after another), the
VAE decoder on one latent (per image). Other families give {} (the prediction falls back
to a formula; :mod:`sdplan.core.planning.timing`).

:func:`work_job` is the same as an engine job (:data:`WORK_JOB`), so ``sdplan generate``
counts in the engine process, on the planned devices' backends.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from sdplan.core.errors import SdplanError
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.pipelines.job_names import WORK_JOB as WORK_JOB
from sdplan.core.pipelines.sd import StableDiffusion
from sdplan.core.planning.work import ModuleWork
from sdplan.core.runtime.devices import BackendManager
from sdplan.core.runtime.runner import BackendPool

log = logging.getLogger(__name__)


def count_work(model_files: Mapping[str, Sequence[str]], *, width: int, height: int,
               batch: int = 1, cfg: bool = True, pool: Any = None,
               placements: Mapping[str, Any] | None = None,
               overrides: Mapping[str, Any] | None = None) -> dict[str, list[ModuleWork]]:
    """Module (``te``, ``diffusion``, ``vae``) -> its graphs' work and how often each runs
    in a ``width`` x ``height`` generation of ``batch`` images (module docstring); {} for
    families without a count or a size the model cannot draw (logged).

    Args:
        model_files: sd-cli model flags -> paths.
        width, height: image size in pixels; batch: images per run; cfg: guidance with a
            negative prompt (``--cfg-scale`` other than 1).
        pool: backends (None: a private CPU pool, closed afterwards).
        placements: module -> ModulePlacement (None: the CPU).
        overrides: pipeline settings for tiny models (``clip_heads``).

    Raises:
        ModelFileError: unreadable files.
    """
    files = {k: [str(p) for p in v] for k, v in model_files.items() if k not in ("taesd", "upscale_model")}
    models = read_model_files(files)
    family = models.architecture.family
    if family not in ("sd1", "sd2", "sd3"):
        return {}
    own = pool is None
    pool = pool if pool is not None else BackendPool(BackendManager(cpu_threads=1))
    prompts = 2 if cfg else 1
    try:
        if family == "sd3":
            return _sd3(files, width, height, batch, prompts, pool, placements, overrides or {})
        heads = (overrides or {}).get("clip_heads")
        sd = StableDiffusion(models, None, pool, placements=placements, clip_heads=heads or None)
        try:
            lh, lw = height // sd.vae_cfg.factor, width // sd.vae_cfg.factor
            n = batch * prompts
            te = sd._te(sd._skip(0), True).work({"ids": (1, 77), "mask": (77, 77)})
            unet = sd.runners["diffusion"].work({"x": (n, sd.unet_cfg.in_channels, lh, lw), "t": (n,),
                                                 "c": (n, 77, sd.unet_cfg.context_dim)})
            vae = sd.runners["vae"].work({"z": (batch, sd.unet_cfg.out_channels, lh, lw)})
            return {"te": [ModuleWork("te", "text", te, prompts)],
                    "diffusion": [ModuleWork("diffusion", "step", unet, 1)],
                    "vae": [ModuleWork("vae", "decode", vae, 1)]}
        finally:
            sd.close()
    except (ValueError, RuntimeError, SdplanError) as exc:
        log.info("no work count: %s", exc)
        return {}
    finally:
        if own:
            pool.manager.close()


def _sd3(files: Mapping[str, list[str]], width: int, height: int, batch: int, prompts: int, pool: Any,
         placements: Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> dict[str, list[ModuleWork]]:
    from sdplan.core.pipelines.sd3 import Sd3Pipeline  # SD3's code loads for SD3 files only

    phase = {"te": "text", "diffusion": "step", "vae": "decode"}
    with Sd3Pipeline(files, None, pool, placements, clip_heads=overrides.get("clip_heads")) as pipe:
        out: dict[str, list[ModuleWork]] = {}
        for module, graphs in pipe.dry_run_inputs(width, height).items():
            # images run one after another; the DiT runs a pass per prompt
            calls = {"te": prompts, "diffusion": prompts * batch, "vae": batch}[module]
            out[module] = [ModuleWork(module, phase[module], runner.work(shapes), calls)
                           for runner, shapes in graphs]
        return out


def work_job(ctx: Any, model_files: Mapping[str, Sequence[str]], width: int, height: int,
             batch: int = 1, cfg: bool = True, placements: Mapping[str, Any] | None = None,
             overrides: Mapping[str, Any] | None = None) -> dict[str, list[dict[str, object]]]:
    """:func:`count_work` in the engine process, on its shared backends; JSON-ready
    (:func:`sdplan.core.planning.work.works_from_json` reads it back)."""
    works = count_work(model_files, width=width, height=height, batch=batch, cfg=cfg, pool=ctx.pool(),
                       placements=placements, overrides=overrides)
    return {m: [w.to_json() for w in ws] for m, ws in works.items()}
