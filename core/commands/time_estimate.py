"""The time prediction of a plan on the command line: its flags, its work count, its table.

``sdplan plan`` and ``sdplan generate`` predict seconds per step and per picture with
:func:`sdplan.core.planning.timing.predict_time`: the devices' profiles (the inventory
file's, else those measured here by ``sdplan devices --calibrate``), the work of the
engine's own graphs for the model files (counted in this process for ``plan``:
:func:`sdplan.core.pipelines.work.count_plan`, on the live devices it plans for, or on CPU
stand-ins named as the inventory's devices when it plans another machine; in the engine
process for ``generate``), else the formula.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from sdplan.core.commands.video_flags import video_frames
from sdplan.core.errors import InvalidArgument, SdplanError
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.timing import RunSettings, TimeReport, drive_of_files, predict_time
from sdplan.core.planning.work import ModuleWork

log = logging.getLogger(__name__)

def add_time_arguments(p: argparse.ArgumentParser) -> None:
    """``--steps``, ``--cfg-scale``, ``--sampling-method`` and ``-t/--threads`` for the time
    prediction of ``sdplan plan`` (sd-cli's spellings and defaults)."""
    g = p.add_argument_group("time prediction (as sd-cli spells them)")
    g.add_argument("--steps", type=int, default=None,
                   help="sampling steps (default: the model family's, as generate; else 20)")
    g.add_argument("--cfg-scale", type=float, default=None,
                   help="guidance scale; 1 runs no negative prompt (default: the model family's, as generate; else 7.0)")
    g.add_argument("--sampling-method", default=None,
                   help="sampler (default: the model family's, as generate; else euler_a)")
    g.add_argument("-t", "--threads", type=int, default=0,
                   help="CPU threads of the run (default: the CPUs this process may use, as generate; with --devices FILE the CPU profile's)")


def settings_of(args: argparse.Namespace, architecture: str | None = None) -> RunSettings:
    """The :class:`RunSettings` of parsed flags (``plan``'s or ``generate``'s); ``-t`` on this
    machine's devices (no ``--devices FILE``) capped at the CPUs this process may use, as
    generate caps it, and without ``-t`` those CPUs, generate's default on a quiet machine
    (:mod:`sdplan.core.runtime.threads`); with ``--devices FILE`` and no ``-t``, 0 (the CPU
    profile's own threads). Steps, CFG scale and sampler not given (None) are the defaults
    ``generate`` takes for ``architecture``'s family
    (:func:`~sdplan.core.families.registry.generation_defaults`), else sd-cli's (20, 7.0,
    euler_a).

    Raises:
        InvalidArgument: a step count below 1 (0 included), a negative thread count, a CFG
            scale that is not a finite number or a sampler sd-cli does not name, naming the flag.
    """
    from sdplan.core.families.registry import generation_defaults
    from sdplan.core.sampling.names import FLOW_SAMPLERS, SAMPLERS

    d = generation_defaults(architecture)
    steps = getattr(args, "steps", None)
    steps = int(d.get("steps", 20)) if steps is None else int(steps)  # type: ignore[call-overload]
    if steps < 1:
        raise InvalidArgument(f"--steps must be at least 1, got {steps}")
    threads = int(getattr(args, "threads", 0) or 0)
    if threads < 0:
        raise InvalidArgument(f"-t/--threads must be >= 0, got {threads}")
    if not getattr(args, "devices", None):  # this machine: generate caps -t at its CPUs, and
        from sdplan.core.runtime.threads import usable_cpus  # without -t takes them all

        threads = min(threads, len(usable_cpus())) if threads else len(usable_cpus())
    cfg = getattr(args, "cfg_scale", None)
    cfg = float(d.get("cfg_scale", 7.0) if cfg is None else cfg)  # type: ignore[arg-type]
    if not math.isfinite(cfg):
        raise InvalidArgument(f"--cfg-scale must be a finite number, got {cfg}")
    sampler = getattr(args, "sampling_method", None)  # given empty: named below, as generate does
    sampler = str(d.get("sampling_method") or "euler_a") if sampler is None else str(sampler)
    names = sorted(set(SAMPLERS) | set(FLOW_SAMPLERS) | {"ddim"})  # generate's list
    if sampler not in names:
        raise InvalidArgument(f"--sampling-method {sampler!r} is unknown; choose one of {', '.join(names)}")
    frames = video_frames(args)
    return RunSettings(width=int(args.width), height=int(args.height), batch=int(args.batch_count),
                       steps=steps, sampler=sampler, cfg=cfg != 1.0, threads=threads, frames=frames)


def with_profiles(inventory: Inventory, threads: int = 0) -> Inventory:
    """``inventory`` with the profiles measured here for devices that carry none
    (:func:`sdplan.core.runtime.profile_cache.with_cached_profiles`)."""
    from sdplan.core.runtime.profile_cache import with_cached_profiles

    return with_cached_profiles(inventory, threads)


def predict_plan(plan: Any, inventory: Inventory, profile: Any, settings: RunSettings,
                 files: Mapping[str, Sequence[str]], fit: Any = None, *, live: bool = True,
                 tiling: Any = None, asked_threads: int = 0, headers: dict[str, Any] | None = None) -> TimeReport:
    """``sdplan plan``'s prediction: the plan's graphs counted
    (:func:`~sdplan.core.pipelines.work.count_plan`: on the plan's devices when ``live``, else
    on stand-ins named as ``inventory``'s), priced with the devices' profiles kept here
    (:func:`with_profiles`) by :func:`predict`. Where the graphs cannot be counted (files that
    do not make the family's graphs, a set without one of its files) the notes say why, naming
    the file or flag, and the formula prices them; so do they where ``asked_threads`` (``-t``)
    was capped at the CPUs generate may use (:func:`settings_of`). ``headers``: the files' headers
    the command read before (path -> header; :func:`~sdplan.core.modelfiles.readers.read_header_once`),
    which the size check and the count read the files from.

    Raises:
        InvalidArgument: a size the model files cannot draw (``-W/-H``, as generate refuses it:
            :func:`~sdplan.core.pipelines.size_rule.check_size`).
    """
    from dataclasses import replace

    from sdplan.core.pipelines.work import count_plan

    if files:
        from sdplan.core.modelfiles.checkpoint import read_model_files
        from sdplan.core.pipelines.size_rule import check_size

        try:
            models = read_model_files({k: list(v) for k, v in files.items()}, headers)
        except SdplanError as exc:  # the count's note says it; the plan itself read its profile
            log.info("no size check: %s", exc)
        else:
            check_size(models, settings.width, settings.height)
    inventory = with_profiles(inventory, settings.threads)
    reasons: list[str] = []
    if settings.threads and asked_threads > settings.threads:
        reasons.append(f"-t {asked_threads}: generate runs at most {settings.threads} threads here (the CPUs "
                       f"it may use); priced at {settings.threads}")
    works = count_plan(files, plan, [d.name for d in inventory], width=settings.width, height=settings.height,
                       batch=settings.batch, cfg=settings.cfg, live=live, vae_tiling=tiling, frames=settings.frames,
                       accelerators=[d.name for d in inventory if d.type != "cpu"], reasons=reasons,
                       headers=headers) if files else {}
    report = predict(plan, inventory, profile, settings, works, files, fit)
    return replace(report, notes=(*reasons, *report.notes)) if reasons else report


def predict(plan: Any, inventory: Inventory, profile: Any, settings: RunSettings,
            works: Mapping[str, Sequence[ModuleWork]] | None, files: Mapping[str, Sequence[str]] | None,
            fit: Any = None) -> TimeReport:
    """:func:`~sdplan.core.planning.timing.predict_time` for a plan with its model files
    (their drives) and memory estimate (its ``--max-vram`` segments)."""
    paths = {m: [os.path.abspath(p) for p in ps] for m, ps in drive_of_files(files or {}).items()}
    segments = {m: list(e.segments) for m, e in (getattr(fit, "modules", None) or {}).items()
                if getattr(e, "segments", ())}
    return predict_time(plan, inventory, profile, settings, works, paths, segments)


def print_time(console: Any, report: TimeReport, measured: Mapping[str, float] | None = None) -> None:
    """The prediction as a table (per module and device: seconds per call, calls per
    picture, seconds per picture) and one summary line; with ``measured`` (``step_s``,
    ``image_s``...) the measured figures beside the predicted ones."""
    from rich.markup import escape
    from rich.table import Table

    s = report.settings
    table = Table(title=f"Time estimate ({s.steps} steps, {s.sampler}{', CFG' if s.cfg else ''}, "
                        f"{s.width}x{s.height}, batch {s.batch})")
    for col in ("module", "device", "s per call", "calls per picture", "s per picture"):
        table.add_column(col, justify="left" if col in ("module", "device") else "right")
    for module, times in report.modules.items():
        for t in times:
            uses = s.steps if t.phase == "step" else 1
            for dev, sec in t.call_s.items():
                if sec <= 0:
                    continue
                label = {"io": "(inputs, outputs)", "copies": "(split copies)",
                         "segments": "(--max-vram segments)"}.get(dev, dev)
                table.add_row(module, escape(label), f"{sec:.4f}", str(t.calls * uses), f"{sec * t.calls * uses:.3f}")
            if t.stage_s:
                table.add_row(module, "(weights per use)", "", "1", f"{t.stage_s:.3f}")
            if t.load_s:
                table.add_row(module, "(load)", "", "1", f"{t.load_s:.3f}")
    console.print(table)

    def both(key: str, value: float) -> str:
        got = (measured or {}).get(key)
        return f"{value:.3f} s" + (f" (measured {got:.3f} s, {value / got:.2f}x)" if got else "")

    console.print(f"Predicted: step {both('step_s', report.step_s)} · picture {both('image_s', report.image_s)} "
                  f"(load {report.load_s:.3f}, text {report.text_s:.3f}, sampling {report.sampling_s:.3f}, "
                  f"decode {report.decode_s:.3f})", highlight=False, markup=False)
    for note in report.notes:
        console.print(f"  note: {note}", highlight=False, markup=False)


def predict_run(args: argparse.Namespace, engine: Any, files: dict[str, list[str]], plan: Any,
                inventory: Inventory, profile: Any, fit: Any, req: Any = None) -> TimeReport | None:
    """The predicted time of this run (``-v``): the work of the engine's graphs counted in
    the engine process on the planned devices (:data:`~sdplan.core.pipelines.job_names.WORK_JOB`;
    a ControlNet and VAE tiles as the request asks), priced with the devices' measured
    profiles (:func:`predict`); the parts of ``req`` (a
    :class:`~sdplan.core.pipelines.request.GenerationRequest`) it does not price are named in
    its notes (:func:`unpriced`). None when it cannot be made (logged)."""
    from dataclasses import replace

    from sdplan.core.pipelines.job_names import WORK_JOB
    from sdplan.core.pipelines.work import plan_placements
    from sdplan.core.planning.work import works_from_json

    try:
        settings = settings_of(args)
        tiling = getattr(req, "vae_tiling", None)
        work_files = {**files, **({"control_net": [str(req.control_net)]} if getattr(req, "control_net", None) else {})}
        works = works_from_json(engine.call(WORK_JOB, {
            "model_files": work_files, "width": args.width, "height": args.height, "batch": args.batch_count,
            "cfg": settings.cfg, "overrides": {"clip_heads": getattr(args, "clip_heads", None), "video_frames": settings.frames},
            "placements": plan_placements(plan),
            "vae_tiling": tiling.to_json() if tiling is not None and tiling.enabled else None}))
        report = predict(plan, with_profiles(inventory, settings.threads), profile, settings, works, files, fit)
        extra = unpriced(req)
        return replace(report, notes=(*report.notes, *extra)) if extra else report
    except SdplanError as exc:
        log.info("no time prediction: %s", exc)
        return None


def unpriced(req: Any) -> list[str]:
    """Notes naming the parts of a request the prediction leaves out (never priced as
    nothing in silence): the hires fix's second pass (its steps and decode at the hires size,
    the upscale between the passes). Planned modules without a price (an upscaler) are named
    by :func:`~sdplan.core.planning.timing.predict_time` itself."""
    out = []
    hires = getattr(req, "hires", None)
    if hires is not None and getattr(hires, "active", False):
        out.append("hires fix: its second pass (sampling and decode at the hires size) and the "
                   "upscale between the passes are not priced; the prediction is the first pass's")
    return out


def measured_timings(step_times: list[float], engine_timings: dict[str, Any]) -> dict[str, float]:
    """A picture's measured ``{"step_s", "image_s"}``: the median of the intervals between
    the progress messages of consecutive sampler steps (``step_times``: seconds since the
    message before, the first one's 0; the first step also builds the graph, so it is left
    out; with one step, the engine's own ``per_step``), and the engine's whole time for the
    request (``total``: load, text, sampling, decode); a figure that was not measured is
    left out."""
    import statistics

    out: dict[str, float] = {}
    if len(step_times) > 1:
        out["step_s"] = round(statistics.median(step_times[1:]), 6)
    elif isinstance(engine_timings.get("per_step"), (int, float)):
        out["step_s"] = round(float(engine_timings["per_step"]), 6)
    if isinstance(engine_timings.get("total"), (int, float)):
        out["image_s"] = round(float(engine_timings["total"]), 6)
    return out
