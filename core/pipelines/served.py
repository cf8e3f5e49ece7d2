"""The engine jobs of a server: generation that reports the loaded pipeline's memory, the
memory of what stays loaded between requests, and its release.

A server keeps one engine process per device group and the process keeps the last
request's pipeline loaded (:meth:`sdplan.core.pipelines.run_context.RunContext.cached`).
:func:`serve_job` runs :func:`~sdplan.core.pipelines.jobs.generate_job` and adds what the
server reports: whether this request loaded the pipeline (a new model, placement or
settings that shape the graphs) or reused the loaded one, the bytes each module holds per
device now and at the peak of the run, and, when the request replaced another model's
pipeline, the bytes that pipeline's buffers held before and after it was closed (measured
from the buffers themselves, so a model swap shows its memory freed).

Memory is reported per module (the pipeline's runner names), per device, in bytes:
``{"weights", "staging", "compute", "lora"}`` now (``cache``: what stays between
requests) and at the peak of the last run (``peak``). ``rss`` is the engine process's
resident set in bytes (Linux ``/proc/self/status``; None elsewhere).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from sdplan.core.pipelines.jobs import generate_job
from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.run_context import cached_pipeline, close_cached

__all__ = ["serve_job", "loaded_job", "release_job", "pipeline_memory", "held_bytes", "process_rss"]

#: The parts of a device's memory a report names (:class:`sdplan.core.runtime.runner.DeviceMemory`).
PARTS = ("weights", "staging", "compute", "lora")


def process_rss() -> int | None:
    """This process's resident set size in bytes (``VmRSS`` of ``/proc/self/status``), or
    None where that file does not exist."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _runners(pipe: Any) -> dict[str, Any]:
    return dict(getattr(pipe, "runners", None) or {}) if pipe is not None else {}


def pipeline_memory(pipe: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """Module -> device -> ``{"cache": {part: bytes}, "peak": {part: bytes}}`` of a loaded
    pipeline (any object with ``runners``: name -> ModuleRunner): ``cache`` the buffers
    allocated now (kept between requests), ``peak`` the largest of the last run; {} for
    None."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, r in _runners(pipe).items():
        now = r.memory()
        per: dict[str, dict[str, Any]] = {}
        for dev in sorted(set(now) | set(r.last_peak)):
            per[dev] = {"cache": _parts(now.get(dev)), "peak": _parts(r.last_peak.get(dev))}
        if per:
            out[name] = per
    return out


def _parts(mem: Any) -> dict[str, int]:
    return {k: int(v) for k, v in asdict(mem).items()} if mem is not None else dict.fromkeys(PARTS, 0)


def held_bytes(runners: Mapping[str, Any]) -> int:
    """Bytes the buffers of ``runners`` (name -> ModuleRunner) hold now, all devices."""
    total = 0
    for r in runners.values():
        for m in r.memory().values():
            total += sum(int(getattr(m, k)) for k in PARTS)
    return total


def serve_job(ctx: Any, request: GenerationRequest | Mapping[str, Any]) -> dict[str, Any]:
    """Run one request (:func:`~sdplan.core.pipelines.jobs.generate_job`) and add
    ``"serving": {"loaded", "seconds", "memory", "released", "rss"}``: ``loaded`` True when
    the pipeline was made for this request (False: the loaded one was reused), ``seconds``
    the job's wall time, ``memory`` :func:`pipeline_memory` of the loaded pipeline after the
    run, ``released`` (when another pipeline was replaced) ``{"before": bytes, "after":
    bytes}`` its buffers held before and after it was closed, ``rss`` :func:`process_rss`.

    Raises:
        what :func:`~sdplan.core.pipelines.jobs.generate_job` raises.
    """
    before = cached_pipeline()
    old = _runners(before)
    held = held_bytes(old)
    t0 = time.perf_counter()
    res = generate_job(ctx, request)
    seconds = time.perf_counter() - t0
    after = cached_pipeline()
    loaded = after is not before or before is None
    released = {"before": held, "after": held_bytes(old)} if before is not None and after is not before else None
    res["serving"] = {"loaded": loaded, "seconds": seconds, "memory": pipeline_memory(after),
                      "released": released, "rss": process_rss()}
    return res


def loaded_job(ctx: Any) -> dict[str, Any]:
    """``{"loaded": bool, "memory": pipeline_memory, "rss": bytes}`` of the engine process's
    loaded pipeline (the last request's), without running anything."""
    pipe = cached_pipeline()
    return {"loaded": pipe is not None, "memory": pipeline_memory(pipe), "rss": process_rss()}


def release_job(ctx: Any) -> dict[str, Any]:
    """Close the loaded pipeline (its weights and graphs are freed) and report
    ``{"before": bytes, "after": bytes, "rss_before", "rss_after"}``: what its buffers held
    before and after, and the process's resident set around it."""
    pipe = cached_pipeline()
    old = _runners(pipe)
    held, rss = held_bytes(old), process_rss()
    close_cached()
    return {"before": held, "after": held_bytes(old), "rss_before": rss, "rss_after": process_rss()}
