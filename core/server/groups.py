"""Device groups: one engine process each, running the server's jobs one at a time with the
planned modules kept loaded between them.

A server runs on one group (the devices of its placement flags) or, with ``--device-group``
given several times, on several: each its own engine child process with its own devices
(``rpc:HOST:PORT[,HOST:PORT]``: those RPC servers' devices, named ``RPC0``... in that process;
``local``: this machine's; ``local:NAME=VALUE[,NAME=VALUE]``: this machine's as that
environment shows them, such as ``CUDA_VISIBLE_DEVICES=1``). The placement flags are one plan
replicated: they resolve in each group against that group's devices (a plan per group), and
each plan must fit on its own. Jobs go to whichever group is free (:class:`GroupWorker` takes
them from the shared :class:`~sdplan.core.server.queue.ServerQueue`), so two groups run two
jobs at once.

A group plans with a :class:`~sdplan.core.session.session.Session` per model (the app's
session: the plan, its estimate with the engine's dry-run compute at the request's size) and
builds each engine request with
:func:`~sdplan.core.pipelines.request.planned_request`. Its engine process keeps the last
request's pipeline loaded (:mod:`sdplan.core.pipelines.run_context`): a request for the same
model and plan skips loading; one for another model closes the loaded pipeline first, so its
memory is freed before the next model loads (:mod:`sdplan.core.pipelines.served` measures
both).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sdplan.core.errors import EngineError, InvalidArgument, SdplanError
from sdplan.core.pipelines.job_names import INVENTORY_JOB, SERVE_JOB
from sdplan.core.server.queue import ServerJob, ServerQueue

log = logging.getLogger(__name__)

__all__ = ["DeviceGroup", "parse_group", "GroupWorker"]


@dataclass(frozen=True)
class DeviceGroup:
    """One device group (module docstring).

    Attributes:
        name: ``g0``, ``g1``... (how jobs and metrics name it).
        rpc_servers: the RPC endpoints its engine adds (``host:port``).
        env: environment variables its engine process runs with (over this one's).
    """

    name: str
    rpc_servers: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "rpc_servers": list(self.rpc_servers), "env": dict(self.env)}


def parse_group(spec: str, index: int) -> DeviceGroup:
    """A ``--device-group`` value: ``local``, ``local:NAME=VALUE[,...]`` or
    ``rpc:HOST:PORT[,HOST:PORT]`` (module docstring), named ``g{index}``.

    Raises:
        InvalidArgument: another form, naming the value.
    """
    text = spec.strip()
    name = f"g{index}"
    if text == "local":
        return DeviceGroup(name)
    kind, _, rest = text.partition(":")
    items = [s.strip() for s in rest.split(",") if s.strip()]
    if kind == "rpc" and items and all(":" in s and s.rsplit(":", 1)[1].isdigit() for s in items):
        return DeviceGroup(name, tuple(items))
    if kind == "local" and items and all("=" in s and s.split("=", 1)[0].strip() for s in items):
        return DeviceGroup(name, env=tuple((k.strip(), v.strip()) for k, v in (s.split("=", 1) for s in items)))
    raise InvalidArgument(f"--device-group {spec[:80]!r}: use local, local:NAME=VALUE or rpc:HOST:PORT[,HOST:PORT]")


class GroupWorker:
    """Runs jobs of ``queue`` on one device group's engine (module docstring).

    Args:
        group: the group.
        queue: the shared queue.
        placement: the placement flags (:class:`~sdplan.core.planning.placement.Placement`);
            its RPC servers are replaced by the group's.
        encode: ``encode(job, result) -> list[bytes]``: the result's pictures for the answer.
        force: run plans that do not fit (the estimate's reasons are logged).
        engine_factory: makes the engine (tests); default an isolated
            :class:`~sdplan.core.runtime.process.Engine` with the group's environment.
    """

    def __init__(self, group: DeviceGroup, queue: ServerQueue, placement: Any,
                 encode: Callable[[ServerJob, dict[str, Any]], list[bytes]], *, force: bool = False,
                 engine_factory: Callable[[DeviceGroup], Any] | None = None) -> None:
        self.group = group
        self.queue = queue
        self.placement = placement.with_rpc_servers(group.rpc_servers) if group.rpc_servers else placement
        self.encode = encode
        self.force = force
        self.engine = (engine_factory or _engine)(group)
        self.inventory: Any = None
        self.sessions: dict[str, Any] = {}
        self.loaded: str | None = None  # the model the engine process holds
        self.memory: dict[str, Any] = {}  # the loaded pipeline's memory after the last job
        self.last: dict[str, Any] = {}  # the last job: model, seconds, loaded, released
        self.jobs_run = 0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # sessions: planning and metrics read them

    # ------------------------------------------------------------------ planning
    def start_engine(self) -> None:
        """Start the engine process and read its devices (RPC servers added).

        Raises:
            EngineError: the engine or an RPC server cannot be reached.
        """
        from sdplan.core.planning.inventory import Inventory

        self.engine.start()
        self.inventory = Inventory.from_json(self.engine.call(INVENTORY_JOB, {"rpc_servers": list(self.placement.rpc_servers)}))

    def session(self, model: Any) -> Any:
        """The planning session of ``model`` on this group's devices (made once).

        Raises:
            PlanError / SdplanError: the placement does not resolve on these devices or the
                files cannot be read.
        """
        with self._lock:
            sess = self.sessions.get(model.name)
            if sess is None:
                from sdplan.core.session.session import Session

                sess = Session(self.inventory, placement=self.placement)
                sess.load_model_files(model.files)
                self.sessions[model.name] = sess
            return sess

    def plan_for(self, model: Any, width: int, height: int, batch: int) -> Any:
        """The session of ``model`` estimated at ``width`` x ``height`` px, ``batch`` images."""
        sess = self.session(model)
        with self._lock:
            sess.set_generation(width=width, height=height, batch_count=batch)
            if sess.fit is None:
                sess.estimate()
        return sess

    def check_fits(self, model: Any, width: int, height: int) -> Any:
        """Plan ``model`` at ``width`` x ``height`` px and refuse a plan that does not fit
        (unless ``force``).

        Raises:
            SdplanError: the plan does not fit on this group, naming why.
        """
        sess = self.plan_for(model, width, height, 1)
        fit = sess.fit
        if fit is not None and not fit.fits and not self.force:
            raise SdplanError(f"device group {self.group.name}: the plan does not fit "
                              f"({'; '.join(fit.reasons)}); give it other devices or use --force")
        return sess

    # ------------------------------------------------------------------ running
    def start(self) -> None:
        """Start taking jobs in a thread of its own."""
        self._thread = threading.Thread(target=self._loop, name=f"sdplan-group-{self.group.name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self.queue.closed:
            job = self.queue.take(self.group.name)
            if job is None:
                continue
            try:
                self.run_job(job)
            except Exception as exc:  # noqa: BLE001 - a job's failure never ends the group
                log.exception("job %s failed", job.id)
                self.queue.finish(job, "failed", ("server_error", f"{type(exc).__name__}: {exc}"))

    def run_job(self, job: ServerJob) -> None:
        """Plan, run and encode one job; it ends done, failed or cancelled."""
        from sdplan.core.pipelines.request import planned_request

        req = job.request
        try:
            sess = self.plan_for(job.model, int(req.width), int(req.height), int(req.batch_count))
            fit = sess.fit
            if fit is not None and not fit.fits and not self.force:
                self.queue.finish(job, "failed", ("plan_does_not_fit", f"the plan does not fit on device "
                                                  f"group {self.group.name}: {'; '.join(fit.reasons)}"))
                return
            with self._lock:
                engine_req = planned_request(job.settings, job.model.files, sess.plan, fit, sess.inventory)
        except SdplanError as exc:
            self.queue.finish(job, "failed", (exc.code, str(exc)))
            return
        job.canceller = self.engine.cancel
        if job.cancel_requested:
            self.queue.finish(job, "cancelled", ("cancelled", "job cancelled by client"))
            return
        base = {"steps": 0, "last": 0}

        def on_progress(info: Mapping[str, Any]) -> None:
            if "step" in info:
                if info["step"] < base["last"]:  # the next image of a batch
                    base["steps"] += base["last"]
                base["last"] = int(info["step"])
                self.queue.progress(job, base["steps"] + base["last"])

        t0 = time.perf_counter()
        try:
            res = self.engine.call(SERVE_JOB, {"request": engine_req}, on_progress)
        except EngineError as exc:
            code = getattr(exc, "code", "engine_error")
            if code == "cancelled" or job.cancel_requested:
                self.queue.finish(job, "cancelled", ("cancelled", "job cancelled by client"))
            else:
                if code == "engine_died":
                    self.loaded, self.memory = None, {}
                self.queue.finish(job, "failed", (str(code), str(exc)))
            return
        seconds = time.perf_counter() - t0
        serving = dict(res.get("serving") or {})
        self.loaded = job.model.name
        self.queue.loaded[self.group.name] = job.model.name
        self.memory = dict(serving.get("memory") or {})
        self.last = {"model": job.model.name, "seconds": seconds, "loaded": bool(serving.get("loaded")),
                     "released": serving.get("released"), "rss": serving.get("rss"),
                     "timings": res.get("timings")}
        self.queue.time_model.observe(job, seconds, bool(serving.get("loaded")))
        self.jobs_run += 1
        job.record = {k: v for k, v in res.items() if k != "images"}
        job.images = self.encode(job, res)
        self.queue.finish(job, "done")

    def metrics(self) -> dict[str, Any]:
        """This group's part of ``/metrics``: its devices, the model loaded, the plan in
        effect with its estimate (bytes per device and module), the loaded pipeline's memory
        per module and device (``cache``: kept between requests; ``peak``: of the last run),
        and the last job's timing and release."""
        with self._lock:
            name = self.loaded or next(iter(self.sessions), None)
            sess = self.sessions.get(name) if name else None
            plan = fit = None
            if sess is not None:
                p = sess.plan
                plan = {"backend": p.backend, "params_backend": p.params_backend, "max_vram": p.max_vram,
                        "rpc_servers": list(p.rpc_servers), "command": sess.command_line()}
                fit = sess.fit.to_json() if sess.fit is not None else None
        peak = measured_peak(self.memory)
        ratio = {d: (fit["devices"][d]["total"] / n if n else None) for d, n in peak.items()
                 if fit is not None and d in fit["devices"]}
        return {**self.group.to_json(), "model": self.loaded, "jobs_run": self.jobs_run,
                "engine_pid": getattr(self.engine, "pid", None), "plan": plan, "estimate": fit,
                "memory": self.memory, "measured_peak": peak, "estimate_over_peak": ratio,
                "last_job": self.last}

    def close(self) -> None:
        """Stop the engine process (a running job is cancelled)."""
        self.engine.close()
        if self._thread is not None:
            self._thread.join(10)


def measured_peak(memory: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Each device's measured peak in bytes from a pipeline memory report
    (:func:`sdplan.core.pipelines.served.pipeline_memory`): the modules' weights, staging
    and LoRA bytes at their peaks together, plus the largest compute buffer of one module
    (modules run one after another and each frees its compute buffers after its run: their
    ``cache`` compute is 0), the quantity the plan's estimate predicts per device."""
    held: dict[str, int] = {}
    compute: dict[str, int] = {}
    for devices in memory.values():
        for dev, mem in devices.items():
            pk = mem["peak"]
            held[dev] = held.get(dev, 0) + int(pk["weights"]) + int(pk["staging"]) + int(pk["lora"])
            compute[dev] = max(compute.get(dev, 0), int(pk["compute"]))
    return {d: held[d] + compute.get(d, 0) for d in held}


def _engine(group: DeviceGroup) -> Any:
    from sdplan.core.runtime.process import Engine

    env = {**os.environ, **dict(group.env)} if group.env else None
    return Engine(isolated=True, env=env)


def groups_of(specs: Sequence[str]) -> list[DeviceGroup]:
    """The ``--device-group`` values as groups (none: one ``local`` group).

    Raises:
        InvalidArgument: a malformed value.
    """
    return [parse_group(s, i) for i, s in enumerate(specs)] or [DeviceGroup("g0")]
