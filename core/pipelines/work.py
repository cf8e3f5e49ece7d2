"""The work of a generation's graphs, counted from the graphs the engine builds.

:func:`count_work` asks the family's work count (the registry's
:attr:`~sdplan.core.families.declaration.Family.work`: SD 1.x / 2.x, SDXL, SD3 / SD3.5, FLUX.1,
Chroma, FLUX.2, Z-Image, Qwen-Image and Wan have one) to build the graphs a generation runs, as the compute dry run does
(:mod:`sdplan.core.pipelines.compute`: no weights loaded, nothing computed), on the planned
devices, and counts each graph's operations and bytes per device
(:meth:`~sdplan.core.runtime.runner.ModuleRunner.work`), with how often each runs per
picture: SD's text encoder once per prompt (twice with CFG's negative prompt), its UNet on
the CFG batch once per sampler evaluation (a ControlNet beside it on the conditional batch),
its VAE decoder once per batch; SD3's three encoders per prompt, its MMDiT once per pass (a
pass per prompt), its decoder per picture; Qwen-Image's LLM once, its DiT's prompt and
negative-prompt graphs once per evaluation, its decoder per picture; FLUX.1's T5 and CLIP-L,
Chroma's T5 and FLUX.2's LLM per prompt at their padded lengths, Z-Image's LLM per prompt
unpadded, their DiTs once per pass (Chroma's and Z-Image's passes on graphs of their own:
the prompts' text rows differ), their decoders per picture (:mod:`sdplan.core.pipelines.flux.work`,
:mod:`sdplan.core.pipelines.flux2.work`, :mod:`sdplan.core.pipelines.z_image.work`); Wan's UMT5 and DiT once
per CFG pass, at the video's frames (``overrides["video_frames"]``), its decoder per video.
With VAE tiling the decoder is counted on one tile, run once per tile of the grid. Other families give {} (the
prediction falls back to a formula and says so; :mod:`sdplan.core.planning.timing`).

:func:`work_job` is the same as an engine job (:data:`WORK_JOB`), so ``sdplan generate``
counts in the engine process, on the planned devices' backends.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sdplan.core.errors import SdplanError
from sdplan.core.families import UNKNOWN, family
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.pipelines.job_names import WORK_JOB as WORK_JOB
from sdplan.core.planning.work import ModuleWork
from sdplan.core.runtime.devices import BackendManager
from sdplan.core.runtime.runner import BackendPool

#: Modules the engine's work count covers (a ControlNet where the family's count has one).
COUNTED = ("te", "diffusion", "controlnet", "vae")

log = logging.getLogger(__name__)


def input_shapes(inputs: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Input name -> shape (a tuple of ints) of a graph's input arrays (a model's ``inputs(...)``:
    numpy arrays of any dtype, or anything with a ``shape``): what
    :meth:`~sdplan.core.runtime.runner.ModuleRunner.work` and ``measure`` build the graph from,
    so the families' work counts and dry runs pass zeros of the run's shapes through the model's
    own input preparation and keep only the shapes."""
    return {k: tuple(v.shape) for k, v in inputs.items()}


def count_work(model_files: Mapping[str, Sequence[str]], *, width: int, height: int,
               batch: int = 1, cfg: bool = True, pool: Any = None,
               placements: Mapping[str, Any] | None = None,
               overrides: Mapping[str, Any] | None = None, vae_tiling: Any = None,
               reasons: list[str] | None = None, headers: dict[str, Any] | None = None) -> dict[str, list[ModuleWork]]:
    """Module (``te``, ``diffusion``, ``vae``, ``controlnet``) -> its graphs' work and how
    often each runs in a ``width`` x ``height`` generation of ``batch`` images (module
    docstring); {} for families without a count, an incomplete set of files, files that do not
    make the family's graphs or a size the model cannot draw (logged, and the reason appended
    to ``reasons`` when given: a line naming the file or the size at fault).

    Args:
        model_files: sd-cli model flags -> paths.
        width, height: image size in pixels; batch: images per run; cfg: guidance with a
            negative prompt (``--cfg-scale`` other than 1).
        pool: backends (None: a private CPU pool, closed afterwards).
        placements: module -> ModulePlacement (None: the CPU).
        overrides: pipeline settings for tiny models (``clip_heads``).
        vae_tiling: ``--vae-tiling`` (a :class:`~sdplan.core.planning.vae_tiling.VaeTiling` or
            its JSON form): the decoder counted on one tile, its calls the tiles of sd-cli's
            grid (:func:`~sdplan.core.pipelines.stages.vae_tiles.calc_tiles`).
        headers: the files' headers already read (path -> header), as
            :func:`~sdplan.core.modelfiles.checkpoint.read_model_files` takes them: the family is
            read from them (the family's graphs still open the files they load).

    Raises:
        ModelFileError: unreadable files.
    """
    files = {k: [str(p) for p in v] for k, v in model_files.items() if k not in ("taesd", "upscale_model")}
    arch = read_model_files({k: v for k, v in files.items() if k != "control_net"}, headers).architecture
    fam = family(arch.family) if arch.family != UNKNOWN else None
    if fam is None or fam.work is None:
        return {}
    if not any(all(k in files for k in group) for group in fam.files):  # a set still being opened
        need = " or ".join(", ".join(f"--{k.replace('_', '-')}" for k in group) for group in fam.files)
        _why(reasons, f"{fam.title} needs {need}; the time of the modules given is the formula's")
        return {}
    module, _, func = fam.work.partition(":")
    count = getattr(importlib.import_module(module), func)
    own = pool is None
    pool = pool if pool is not None else BackendPool(BackendManager(cpu_threads=1))
    try:
        from sdplan.core.planning.vae_tiling import VaeTiling

        tiling = VaeTiling.from_json(vae_tiling) if vae_tiling else None
        tile = tiles = None
        if tiling is not None and tiling.enabled:
            from sdplan.core.pipelines.stages.vae_tiles import calc_tiles

            tile = tiling.tile_latent(width, height, fam.vae_scale)
            lw, lh = width // fam.vae_scale, height // fam.vae_scale
            tiles = (calc_tiles(lw, tile[0], tiling.clamped_overlap)[0]
                     * calc_tiles(lh, tile[1], tiling.clamped_overlap)[0])
        out: dict[str, list[ModuleWork]] = dict(count(
            files, width=width, height=height, batch=batch, cfg=cfg, pool=pool, placements=placements,
            overrides=dict(overrides or {}), **({"vae_tile": tile} if tile else {})))
        if tiles and "vae" in out:
            out["vae"] = [replace(w, calls=w.calls * tiles) for w in out["vae"]]
        return out
    except (ValueError, RuntimeError, SdplanError) as exc:
        _why(reasons, f"the engine cannot build {fam.title}'s graphs from these files: {_message(exc)}")
        return {}
    finally:
        if own:
            pool.manager.close()


def _message(exc: BaseException) -> str:
    """An error's own one-line message (an SdplanError's text without its kind)."""
    return (str(getattr(exc, "message", "") or exc).splitlines() or [type(exc).__name__])[0]


def _why(reasons: list[str] | None, text: str) -> None:
    log.info("no work count: %s", text)
    if reasons is not None:
        reasons.append(text)


def plan_placements(plan: Any) -> dict[str, Any]:
    """The placements the work count builds a plan's graphs on: the counted modules' and a
    parallel-CFG copy's (:func:`~sdplan.core.runtime.placement.cfg_placement`)."""
    from sdplan.core.runtime.placement import CFG, ModulePlacement, cfg_placement

    out: dict[str, Any] = {m: ModulePlacement.from_plan(plan, m) for m in COUNTED if m in plan.modules}
    cfg = cfg_placement(plan)
    if cfg is not None:
        out[CFG] = cfg
    return out


def count_plan(model_files: Mapping[str, Sequence[str]], plan: Any, device_names: Sequence[str], *,
               width: int, height: int, batch: int = 1, cfg: bool = True, live: bool = False,
               vae_tiling: Any = None, frames: int = 1, accelerators: Sequence[str] = (),
               reasons: list[str] | None = None, headers: dict[str, Any] | None = None) -> dict[str, list[ModuleWork]]:
    """:func:`count_work` of a plan's graphs in this process: on the planned devices when
    ``live`` (the plan's inventory is this process's), else on CPU backends standing in for
    ``device_names`` (another machine's devices, or a process that touches no device but its
    CPU, like the app's). Those of ``accelerators`` (the devices that are not CPUs: GPUs, RPC
    servers) stand in as such (``Backend.stand_in``): their graphs take ggml's own ops, as on
    the device, so the kernels counted are the ones its profile measured (an RPC server runs
    ggml's flash attention and im2col convolutions, not this CPU's kernels; counted as a CPU,
    the demo UNet's step on one was priced at a third of its time). ``vae_tiling``: a :class:`~sdplan.core.planning.vae_tiling.VaeTiling` (the
    decoder in its tiles) or None; ``frames``: a video's frames. {} when the engine cannot
    count them (logged; why appended to ``reasons`` when given, as :func:`count_work`; ``headers``
    as :func:`count_work`'s)."""
    try:
        from sdplan.core.runtime.native import native

        placements = plan_placements(plan)
        manager = BackendManager(cpu_threads=1)
        extra = {} if live else {d: native().init_backend("CPU") for d in device_names if d != "CPU"}
        for d, b in extra.items():
            b.stand_in = d in accelerators
        try:
            return count_work(model_files, width=width, height=height, batch=batch, cfg=cfg,
                              pool=BackendPool(manager, extra), placements=placements,
                              overrides={"video_frames": frames}, vae_tiling=vae_tiling.to_json() if vae_tiling is not None and vae_tiling.enabled
                              else None, reasons=reasons, headers=headers)
        finally:
            manager.close()
    except (ImportError, RuntimeError, ValueError, SdplanError) as exc:
        _why(reasons, f"no count of the engine's graphs: {_message(exc)}")
        return {}


def work_job(ctx: Any, model_files: Mapping[str, Sequence[str]], width: int, height: int,
             batch: int = 1, cfg: bool = True, placements: Mapping[str, Any] | None = None,
             overrides: Mapping[str, Any] | None = None, vae_tiling: Any = None) -> dict[str, list[dict[str, object]]]:
    """:func:`count_work` in the engine process, on its shared backends; JSON-ready
    (:func:`sdplan.core.planning.work.works_from_json` reads it back)."""
    works = count_work(model_files, width=width, height=height, batch=batch, cfg=cfg, pool=ctx.pool(),
                       placements=placements, overrides=overrides, vae_tiling=vae_tiling)
    return {m: [w.to_json() for w in ws] for m, ws in works.items()}
