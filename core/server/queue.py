"""A server's queue: the jobs its clients sent, run in order by its device groups.

Every job is recorded in a :class:`~sdplan.core.pipelines.job_queue.JobQueue` (the app's
queue format, ``origin`` ``server``; saved to a file with ``--queue-file``, which the app's
queue view reads), and kept here with what the record does not hold: the checked request,
the pictures made (until delivered, or :data:`KEEP_SECONDS` for the polled jobs), the
error's code and the event its client waits on. Device groups take jobs in order
(:meth:`ServerQueue.take`), one at a time each; a job is cancelled while queued at once,
and while running through its group's engine.

Each job's predicted seconds come from a time model (:class:`TimeModel`): the default,
:class:`MeasuredRate`, multiplies the steps by the seconds per step measured on the
finished jobs of the same model and size (and adds the measured load time when the model
is not the one loaded); a calibrated time model plugs in through the same method.
"""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sdplan.core.errors import RequestRefused
from sdplan.core.pipelines.job_queue import FINISHED, JobQueue

__all__ = ["ServerJob", "ServerQueue", "TimeModel", "MeasuredRate", "KEEP_SECONDS", "KEEP_RECORDS"]

#: Seconds a finished job's pictures stay for a client that polls for them.
KEEP_SECONDS = 600.0
#: Finished jobs kept in the record (older ones are dropped from it).
KEEP_RECORDS = 200


@dataclass
class ServerJob:
    """One client request in the queue.

    Attributes:
        id: ``job_`` and hex digits.
        kind: ``img_gen``.
        parsed: the client's request (:class:`~sdplan.core.server.apis.ParsedRequest`).
        model: the :class:`~sdplan.core.server.models.ServedModel` it runs.
        request: the checked :class:`~sdplan.core.pipelines.request.GenerationRequest`.
        settings: the settings it was built from (sd-cli request keys, picture paths).
        folder: the temporary folder of its pictures (removed when it ends), or None.
        state: ``queued``, ``running``, ``done``, ``failed``, ``cancelled``.
        images: the encoded pictures (bytes) once done.
        record: the engine's result but the pictures (params, timings, serving memory).
        error: ``(code, message)`` of a failed or cancelled job.
        group: the device group that ran it.
        created, started, finished: ``time.time()`` seconds.
    """

    id: str
    parsed: Any
    model: Any
    request: Any
    settings: dict[str, Any]
    folder: Path | None = None
    kind: str = "img_gen"
    state: str = "queued"
    images: list[bytes] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)
    error: tuple[str, str] | None = None
    group: str | None = None
    created: float = field(default_factory=time.time)
    started: float | None = None
    finished: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    cancel_requested: bool = False
    canceller: Any = None  # the running group's cancel (a callable)

    @property
    def steps(self) -> int:
        """Sampling steps of the whole job (steps x images)."""
        return max(int(self.request.steps or 1), 1) * max(int(self.request.batch_count), 1)


class TimeModel(Protocol):
    """Predicts a job's seconds (None: no prediction). ``loaded``: the model the job needs
    is the one its group has loaded."""

    def predict(self, job: ServerJob, loaded: bool) -> float | None: ...

    def observe(self, job: ServerJob, seconds: float, loaded_now: bool) -> None: ...


class MeasuredRate:
    """Seconds per step measured per model and picture size on finished jobs, and the
    seconds a model took to load (module docstring)."""

    def __init__(self) -> None:
        self.per_step: dict[tuple[str, int, int], float] = {}
        self.load: dict[str, float] = {}

    def predict(self, job: ServerJob, loaded: bool) -> float | None:
        """``steps x measured seconds per step`` (+ the measured load time when not loaded)."""
        key = (job.model.name, int(job.request.width or 0), int(job.request.height or 0))
        rate = self.per_step.get(key)
        if rate is None:
            return None
        return job.steps * rate + (0.0 if loaded else self.load.get(job.model.name, 0.0))

    def observe(self, job: ServerJob, seconds: float, loaded_now: bool) -> None:
        """Learn from a finished job that took ``seconds`` (engine time) and loaded its model
        (``loaded_now``) or not."""
        key = (job.model.name, int(job.request.width or 0), int(job.request.height or 0))
        if loaded_now:
            rate = self.per_step.get(key)
            if rate is not None:
                self.load[job.model.name] = max(seconds - job.steps * rate, 0.0)
            return
        self.per_step[key] = seconds / job.steps


class ServerQueue:
    """The queue (module docstring).

    Args:
        max_queue: jobs queued or running at once; one more is refused (429).
        path: the record's file (None: in memory).
        time_model: predicts each job's seconds (default :class:`MeasuredRate`).
    """

    def __init__(self, max_queue: int = 64, path: str | Path | None = None,
                 time_model: TimeModel | None = None) -> None:
        self.max_queue = max_queue
        self.record = JobQueue(path)
        for j in self.record.jobs:  # a previous server's jobs: their clients are gone
            if j.origin == "server" and j.state not in FINISHED:
                j.state, j.error, j.finished = "cancelled", "the server stopped", time.time()
        self.record.save()
        self.time_model: TimeModel = time_model or MeasuredRate()
        self.jobs: OrderedDict[str, ServerJob] = OrderedDict()
        self.cond = threading.Condition()
        self.totals = {"done": 0, "failed": 0, "cancelled": 0}
        self.loaded: dict[str, str | None] = {}  # group -> model name loaded there
        self.closed = False

    # ------------------------------------------------------------------ clients
    def submit(self, job: ServerJob) -> ServerJob:
        """Queue ``job`` (its id is set when empty).

        Raises:
            RequestRefused: ``queue_full`` (429) with :attr:`max_queue` jobs waiting or running,
                ``shutting_down`` (503) once closed.
        """
        with self.cond:
            if self.closed:
                raise RequestRefused("the server is stopping", "shutting_down", 503)
            active = sum(1 for j in self.jobs.values() if j.state in ("queued", "running"))
            if active >= self.max_queue:
                raise RequestRefused(f"the queue is full ({active} jobs); try again later",
                                     "queue_full", 429)
            job.id = job.id or f"job_{uuid.uuid4().hex[:16]}"
            self.jobs[job.id] = job
            rec = self.record.add(job.request.to_dict(), origin="server", job_id=job.id)
            rec.predicted = self.time_model.predict(job, job.model.name in self.loaded.values())
            self._prune()
            self.record.save()
            self.cond.notify_all()
        return job

    def get(self, job_id: str) -> ServerJob:
        """The job ``job_id``.

        Raises:
            RequestRefused: ``not_found`` (404) for an id never seen, ``gone`` (410) for a
                finished job whose pictures were dropped.
        """
        with self.cond:
            job = self.jobs.get(job_id)
            if job is None:
                if any(j.id == job_id for j in self.record.jobs):
                    raise RequestRefused(f"job {job_id} ended and its result is gone", "gone", 410)
                raise RequestRefused(f"no job {job_id[:60]!r}", "not_found", 404)
            return job

    def position(self, job: ServerJob) -> int:
        """Jobs before ``job`` in the queue (0: running or next)."""
        with self.cond:
            if job.state != "queued":
                return 0
            return [j.id for j in self.jobs.values() if j.state == "queued"].index(job.id)

    def predicted(self, job: ServerJob) -> float | None:
        """The job's predicted seconds (its record's)."""
        try:
            return self.record.get(job.id).predicted
        except KeyError:
            return None

    def cancel(self, job_id: str) -> str:
        """Cancel a job: a queued one ends ``cancelled`` at once; a running one is asked to
        stop (it ends ``cancelled`` when its engine stops). Returns the state now.

        Raises:
            RequestRefused: unknown (404), gone (410) or already finished (``finished``, 409).
        """
        job = self.get(job_id)
        with self.cond:
            if job.state in FINISHED:
                raise RequestRefused(f"job {job_id} already ended {job.state}", "finished", 409)
            job.cancel_requested = True
            if job.state == "queued":
                self._end(job, "cancelled", ("cancelled", "job cancelled by client"))
                return "cancelled"
            canceller = job.canceller
        if canceller is not None:
            canceller()
        return job.state

    # ------------------------------------------------------------------ groups
    def take(self, group: str, timeout: float = 0.5) -> ServerJob | None:
        """The next queued job, now ``running`` on ``group``; None after ``timeout`` seconds
        without one, or once closed."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                if self.closed:
                    return None
                job = next((j for j in self.jobs.values() if j.state == "queued"), None)
                if job is not None:
                    job.state, job.group, job.started = "running", group, time.time()
                    rec = self.record.start(job.id)
                    rec.group = group
                    self.record.save()
                    return job
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def progress(self, job: ServerJob, steps_done: int) -> None:
        """Record the running job's steps done (all its images together)."""
        try:
            self.record.get(job.id).steps_done = steps_done
        except KeyError:
            pass

    def finish(self, job: ServerJob, state: str, error: tuple[str, str] | None = None) -> None:
        """End a running job ``done``, ``failed`` or ``cancelled`` (a cancel asked for turns
        ``failed`` into ``cancelled``)."""
        with self.cond:
            if job.state in FINISHED:
                return
            if job.cancel_requested and state == "failed":
                state, error = "cancelled", ("cancelled", "job cancelled by client")
            self._end(job, state, error)

    def _end(self, job: ServerJob, state: str, error: tuple[str, str] | None) -> None:
        job.state, job.error, job.finished = state, error, time.time()
        job.canceller = None
        self.totals[state] += 1
        if job.folder is not None:
            shutil.rmtree(job.folder, ignore_errors=True)
        try:
            self.record.finish(job.id, state, error=error[1] if error else None)
        except KeyError:
            pass
        job.done.set()
        self.cond.notify_all()

    def delivered(self, job: ServerJob) -> None:
        """The client has the job's pictures: drop them and the job."""
        with self.cond:
            if job.state in FINISHED:
                self.jobs.pop(job.id, None)

    def _prune(self) -> None:
        """Drop finished jobs older than :data:`KEEP_SECONDS` and records past :data:`KEEP_RECORDS`."""
        now = time.time()
        for jid in [j.id for j in self.jobs.values()
                    if j.state in FINISHED and (j.finished or now) < now - KEEP_SECONDS]:
            self.jobs.pop(jid, None)
        ended = [j for j in self.record.jobs if j.state in FINISHED]
        if len(ended) > KEEP_RECORDS:
            drop = {j.id for j in ended[:len(ended) - KEEP_RECORDS]}
            self.record.jobs = [j for j in self.record.jobs if j.id not in drop]

    def counts(self) -> dict[str, int]:
        """Jobs ``queued`` and ``running`` now, and ``done``, ``failed``, ``cancelled`` since start."""
        with self.cond:
            now = {s: sum(1 for j in self.jobs.values() if j.state == s) for s in ("queued", "running")}
            return {**now, **self.totals}

    def close(self) -> None:
        """Refuse new jobs, cancel the queued ones and wake the groups."""
        with self.cond:
            self.closed = True
            for j in list(self.jobs.values()):
                if j.state == "queued":
                    self._end(j, "cancelled", ("shutting_down", "the server stopped"))
            self.cond.notify_all()
