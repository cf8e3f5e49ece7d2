"""The engine jobs of image generation: what the engine process runs for a request.

Jobs run in the engine process (:class:`sdplan.core.runtime.process.Engine`), named by
:data:`GENERATE_JOB` and :data:`INVENTORY_JOB`. :func:`generate_job` takes a
:class:`~sdplan.core.pipelines.request.GenerationRequest` (or its dict form), reads the model
files' headers, finds the family in the registry (:mod:`sdplan.core.families`), checks the
request against it, checks the run's plan against the live devices
(:meth:`~sdplan.core.runtime.run_plan.RunPlan.check`: a device gone or shrunk is one clear
error), and calls the family's pipeline (``generate(request, plan, progress)``), then the
upscaler on its own planned device.

Messages: progress ``{"step", "total", "phase"}``, preview ``{"step", "total", "image"}``
(uint8 (H, W, 3)), and once ``{"phase": "threads", "threads", "reason"}`` (the CPU threads
chosen); the result is ``{"images": [uint8 (H, W, 3)], "params", "timings", "threads",
"segments", "placements", "model_flags"}``: ``params`` the settings that ran (the checked
request's, :meth:`~sdplan.core.pipelines.request.GenerationRequest.settings`, with the
architecture and what the inputs applied), ``segments`` module -> the ``--max-vram`` segments
of its last run for the modules that were cut, ``placements`` module -> where it ran.
"""

from __future__ import annotations

import importlib
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sdplan.core.errors import ModelFileError, SdplanError
from sdplan.core.families import Family
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags, read_model_files
from sdplan.core.pipelines.finite import explains_non_finite
from sdplan.core.pipelines.job_names import GENERATE_JOB as GENERATE_JOB
from sdplan.core.pipelines.job_names import INVENTORY_JOB as INVENTORY_JOB
from sdplan.core.pipelines.request import GenerationRequest, family_for
from sdplan.core.pipelines.run_context import RunContext, cached_pipeline
from sdplan.core.planning.sdcli import model_file_flags
from sdplan.core.runtime.devices import live_inventory
from sdplan.core.runtime.placement import ModulePlacement
from sdplan.core.runtime.run_plan import RunPlan
from sdplan.core.runtime.threads import start_run

__all__ = ["GENERATE_JOB", "INVENTORY_JOB", "generate_job", "inventory_job", "request_of"]


def inventory_job(ctx: Any, rpc_servers: Sequence[str] = ()) -> dict[str, Any]:
    """The engine process's live devices (after adding ``rpc_servers``) as Inventory JSON."""
    return live_inventory(rpc_servers=list(rpc_servers)).to_json()


def request_of(request: GenerationRequest | Mapping[str, Any]) -> GenerationRequest:
    """``request`` as a :class:`GenerationRequest` (a dict is read with
    :meth:`~GenerationRequest.from_dict`; a legacy ``placements`` mapping is its plan).

    Raises:
        ModelFileError: no model files; InvalidArgument / SamplingError: malformed values.
    """
    req = request if isinstance(request, GenerationRequest) else GenerationRequest.from_dict(request)
    if not req.model_files:
        raise ModelFileError("<request>", "no model files given")
    return req


def _plan(ctx: Any, req: GenerationRequest, files: Mapping[str, list[str]]) -> RunPlan:
    """The run's plan: the request's (checked against the live devices), else the placement
    strings resolved here against them."""
    if req.plan is not None:
        if req.plan.rpc_servers:
            try:
                ctx.add_rpc_servers(list(req.plan.rpc_servers))
            except SdplanError as exc:  # a server of the plan stopped or unreachable
                raise req.plan.unreachable(str(exc)) from None
        if req.plan.devices:
            req.plan.check(live_inventory(rpc_servers=list(req.plan.rpc_servers)))
        return req.plan
    from sdplan.core.planning.placement import Placement
    from sdplan.core.planning.plan import resolve

    s = dict(req.placement_strings)
    rpc = [r for r in str(s.get("rpc_servers") or "").split(",") if r] if isinstance(s.get("rpc_servers"), str) \
        else list(s.get("rpc_servers") or [])
    placement = Placement.from_strings(s.get("backend") or "", s.get("params_backend") or "",
                                       s.get("max_vram") or "", stream_layers=bool(s.get("stream_layers")),
                                       rpc_servers=rpc)
    if placement.rpc_servers:
        ctx.add_rpc_servers(list(placement.rpc_servers))
    inventory = live_inventory(rpc_servers=list(placement.rpc_servers))
    resolved = resolve(placement, inventory, profile_from_model_flags(files))
    return RunPlan.from_plan(resolved, modules=tuple(m for m in req.modules() if m in resolved.modules))


@explains_non_finite  # a NaN/inf latent or picture: an error naming the likely cause
def generate_job(ctx: Any, request: GenerationRequest | Mapping[str, Any]) -> dict[str, Any]:
    """Run one request in this process (module docstring).

    Raises:
        ModelFileError / PlanError / EngineError: bad files, placement or devices (a device
            of the plan gone or shrunk); InvalidArgument: an option the family does not take;
        NonFiniteError: a latent or picture became NaN/inf (naming the likely cause);
        Cancelled: ``ctx.cancel`` fired; ValueError: bad sizes.
    """
    req = request_of(request)
    models = read_model_files(req.model_set)
    fam, variant = family_for(models.architecture)
    req = req.check(fam, variant)
    plan = _plan(ctx, req, req.model_set)
    if req.seed < 0:
        req = req.with_seed(random.randrange(2**31))
    threads = start_run(ctx.pool().manager, req.threads, ctx.progress)
    t0 = time.perf_counter()
    run = _pipeline(fam)
    out = run(req, dict(plan.placements), RunContext(ctx, req))
    images = list(out["images"])
    segments = {m: r.last_segments for m, r in (out.get("runners") or {}).items() if r.last_segments}
    upscaler = req.file("upscale_model")
    where = {m: _where(p) for m, p in plan.placements.items() if m in req.modules()}
    if "upscaler" in req.modules():
        where["upscaler"] = _where(upscaler_placement(plan))
    if upscaler:
        ctx.progress(phase="upscale")
        images = _upscale(ctx, upscaler, upscaler_placement(plan), images, req.upscale_repeats)
    timings = {**out.get("timings", {}), "total": time.perf_counter() - t0}
    params = {**req.settings(fam), "architecture": fam.name if variant is None else f"{fam.name}-{variant}",
              **out.get("info", {})}
    flags = (["--prediction", req.overrides.prediction] if req.overrides.prediction else
             model_file_flags([f.metadata for f in models.files], models.architecture.family))
    return {"images": images, "params": params, "timings": timings, "segments": segments,
            "threads": {"threads": threads.threads, "reason": threads.reason},
            "placements": where,
            "plan": dict(plan.strings), "model_flags": flags}


def _pipeline(fam: Family) -> Any:
    """The family's ``generate`` function (its module loads here: a request loads only its own
    family's code)."""
    module, _, func = str(fam.pipeline).partition(":")
    return getattr(importlib.import_module(module), func)


def _where(p: ModulePlacement) -> dict[str, Any]:
    """Where a module ran, for the picture's record: devices, ranges, residency."""
    out: dict[str, Any] = {"devices": list(p.devices), "params": p.params_mode}
    if p.params_device:
        out["params_device"] = p.params_device
    if p.ranges:
        out["ranges"] = [[r.device, r.first_block, r.last_block] for r in p.ranges]
    if p.budget:
        out["budget"] = p.budget
    return out


def upscaler_placement(plan: RunPlan) -> ModulePlacement:
    """Where the ``upscaler`` module runs: its placement in the plan (runtime device,
    residency, budget), or, for a plan made without it (a request of an older sdplan), the
    VAE's main device with resident weights."""
    place = plan.placements.get("upscaler")
    return place if place is not None else ModulePlacement(plan.placements["vae"].devices[:1])


def _upscale(ctx: Any, path: str, place: ModulePlacement, images: list[np.ndarray], repeats: int) -> list[np.ndarray]:
    """Upscale uint8 images with the ESRGAN file as ``place`` says (its main device, its
    residency, its budget's tile)."""
    from sdplan.core.pipelines.stages.upscale import Upscaler

    with Upscaler(path, placement=ModulePlacement(place.devices[:1], (), place.params_mode, place.params_device,
                                                   place.budget), pool=ctx.pool()) as up:
        up.runner.cancel = ctx.cancel
        return [up.upscale_image(img, repeats) for img in images]


def loaded_pipeline() -> Any:
    """The engine process's loaded pipeline (the last request's), or None."""
    return cached_pipeline()
