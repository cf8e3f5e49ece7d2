"""The generation queue: jobs that run one after another on the engine, kept in a file.

A :class:`Job` is one engine request (the generation settings with their own placement
strings and model files, as :data:`sdplan.core.pipelines.jobs.GENERATE_JOB` takes it) and
its state: ``queued`` -> ``running`` -> ``done`` / ``failed`` / ``cancelled``. A
:class:`JobQueue` orders them, adds batches (one job per seed or per prompt), reorders,
cancels, pauses, estimates the time left, and saves itself as JSON after every change, so
the queue survives the app closing: a job that was running then is queued again when the
file is read back.

File format (``queue.json``)::

    {"sdplan_queue": 1, "paused": bool,
     "jobs": [{"id", "label", "request": {...}, "state", "error", "results": [paths],
               "created", "started", "finished", "steps_done", "seconds",
               "origin", "group", "predicted"}, ...]}

The same format holds a server's queue (``sdplan serve --queue-file``: ``origin``
``server``, the device ``group`` of each job and its ``predicted`` seconds);
:meth:`JobQueue.read` reads such a file without changing it (the app shows a server's
jobs beside its own).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sdplan.core.planning import paths
from sdplan.core.planning.bounded_json import read_json

log = logging.getLogger(__name__)

FORMAT_KEY = "sdplan_queue"
FORMAT_VERSION = 1
STATES = ("queued", "running", "done", "failed", "cancelled")
#: States a job ends in.
FINISHED = ("done", "failed", "cancelled")


@dataclass
class Job:
    """One queued generation.

    Attributes:
        id: a unique hex id.
        label: what the list shows (the prompt's start and the seed).
        request: the engine request (JSON values only).
        state: one of :data:`STATES`.
        error: why it failed (``failed``), or None.
        results: image files written for it.
        created, started, finished: wall-clock seconds (``time.time()``), or None.
        steps_done: sampling steps done so far (progress of the running job).
        seconds: run time of a finished job.
        origin: who queued it: ``app`` (the window) or ``server`` (a client of
            ``sdplan serve``, which keeps its jobs in a queue of this format).
        group: the device group that runs or ran it (a server's), or None.
        predicted: the seconds it is predicted to take, or None without a prediction.
    """

    id: str
    label: str
    request: dict[str, Any]
    state: str = "queued"
    error: str | None = None
    results: list[str] = field(default_factory=list)
    created: float = 0.0
    started: float | None = None
    finished: float | None = None
    steps_done: int = 0
    seconds: float | None = None
    origin: str = "app"
    group: str | None = None
    predicted: float | None = None

    @property
    def steps(self) -> int:
        """Sampling steps of the whole job (steps x batch count; 1 each where the request
        holds no whole number)."""
        r = self.request
        return max(_whole(r.get("steps")), 1) * max(_whole(r.get("batch_count")), 1)

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        """A job from :meth:`to_json`.

        Raises:
            KeyError, TypeError, ValueError: a malformed entry (not a map, no ``id`` or
                ``request``, a field of another type, an unknown state).
        """
        if not isinstance(data, Mapping) or not isinstance(data.get("request"), dict):
            raise TypeError("a job is a map with an 'id' and a 'request' map")
        state = str(data.get("state") or "queued")
        if state not in STATES:
            raise ValueError(f"unknown job state {state[:40]!r}")
        times = {k: data.get(k) for k in ("started", "finished", "seconds", "predicted")}
        for k, v in times.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise TypeError(f"job field {k!r} is not a number")
        results = data.get("results") or []
        if not isinstance(results, list) or not all(isinstance(p, str) for p in results):
            raise TypeError("job field 'results' is not a list of paths")
        return cls(id=str(data["id"]), label=str(data.get("label") or ""),
                   request=dict(data["request"]), state=state,
                   error=None if data.get("error") is None else str(data["error"]),
                   results=list(results), created=float(data.get("created") or 0.0),
                   started=times["started"], finished=times["finished"],
                   steps_done=int(data.get("steps_done") or 0), seconds=times["seconds"],
                   origin=str(data.get("origin") or "app"),
                   group=None if data.get("group") is None else str(data["group"]),
                   predicted=times["predicted"])


def job_label(request: Mapping[str, Any]) -> str:
    """``“a lighthouse at dusk…” · seed 42 · 20 steps``: the list's text for a request."""
    prompt = str(request.get("prompt") or "").strip().replace("\n", " ")
    short = prompt if len(prompt) <= 40 else prompt[:39] + "…"
    parts = [f"“{short}”" if short else "(no prompt)"]
    if request.get("seed") is not None:
        parts.append(f"seed {request['seed']}")
    parts.append(f"{request.get('steps') or '?'} steps")
    return " · ".join(parts)


def _whole(value: object) -> int:
    """``value`` as a whole number, 1 when it is none (a hostile file's text or list)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return 1
    return int(min(max(value, -2**31), 2**31))


class JobQueue:
    """Jobs in run order, saved to ``path`` after every change (no file: in memory only).

    The file is read with the bounded JSON reader
    (:func:`sdplan.core.planning.bounded_json.read_json`). Reading a file that does not
    exist gives an empty queue; one that cannot be read at all is set aside as
    ``<name>.bad`` and the queue starts empty; entries that are not jobs are set aside in
    ``<name>.bad`` and the good ones kept. Each is a line of :attr:`notes` (and logged).
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.jobs: list[Job] = []
        self.paused = False
        self.notes: list[str] = []
        if self.path is None:
            return
        try:
            there = paths.exists(self.path)
        except OSError as exc:  # a name too long, a folder without search permission
            self._note(f"the queue file cannot be read ({exc}); the queue starts empty")
            self.path = None  # nothing is saved where nothing could be read
            return
        if there:
            self._load()

    @classmethod
    def read(cls, path: str | Path) -> list[Job]:
        """The jobs of the queue file ``path`` as they are there, nothing changed or set aside
        (another process's queue: a server's); [] when it cannot be read or is not a queue,
        skipping entries that are not jobs."""
        try:
            data = read_json(Path(path), what="queue file")
        except (OSError, ValueError):
            return []
        if not isinstance(data, dict) or data.get(FORMAT_KEY) != FORMAT_VERSION \
                or not isinstance(data.get("jobs"), list):
            return []
        out = []
        for entry in data["jobs"]:
            try:
                out.append(Job.from_json(entry))
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
                continue
        return out

    # ------------------------------------------------------------------ file
    def _note(self, text: str) -> None:
        log.warning("%s", text)
        self.notes.append(text)

    def _set_aside(self, what: object) -> Path | None:
        """Write ``what`` (the file's entries that are not jobs) to ``<name>.bad``, or move
        the whole file there (``what`` None). Returns that path, None when it failed."""
        assert self.path is not None
        bad = self.path.with_name(self.path.name + ".bad")
        try:
            if what is None:
                os.replace(self.path, bad)
            else:
                bad.write_text(json.dumps(what, indent=1, default=str), encoding="utf-8")
        except OSError:
            return None
        return bad

    def _load(self) -> None:
        assert self.path is not None
        try:
            data = read_json(self.path, what="queue file")
            if not isinstance(data, dict) or data.get(FORMAT_KEY) != FORMAT_VERSION:
                raise ValueError(f"{self.path}: not an sdplan queue file")
            entries = data.get("jobs") or []
            if not isinstance(entries, list):
                raise ValueError(f"{self.path}: 'jobs' is not a list")
        except (OSError, ValueError) as exc:  # PathError, JsonRefused
            bad = self._set_aside(None)
            where = f"; it was set aside as {bad}" if bad else ""
            self._note(f"queue not restored: {exc}{where}; the queue starts empty")
            return
        jobs: list[Job] = []
        refused: list[object] = []
        for entry in entries:
            try:
                jobs.append(Job.from_json(entry))
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
                refused.append(entry)
        if refused:
            bad = self._set_aside(refused)
            where = f"; they were set aside in {bad}" if bad else ""
            self._note(f"{len(refused)} of {len(entries)} entries of the queue {self.path} are "
                       f"not jobs{where}; the other {len(jobs)} are kept")
        for j in jobs:
            if j.state == "running":  # the app closed while it ran: run it again
                j.state, j.started, j.steps_done = "queued", None, 0
        self.jobs = jobs
        self.paused = bool(data.get("paused"))

    def save(self) -> None:
        """Write the queue (atomically; a failure is logged, the queue stays in memory)."""
        if self.path is None:
            return
        data = {FORMAT_KEY: FORMAT_VERSION, "paused": self.paused,
                "jobs": [j.to_json() for j in self.jobs]}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("queue not saved to %s: %s", self.path, exc)

    # ------------------------------------------------------------------ adding
    def add(self, request: Mapping[str, Any], label: str | None = None, *, origin: str = "app",
            job_id: str | None = None) -> Job:
        """Append one job for ``request`` (copied; must be JSON values), queued by
        ``origin`` (``app``, ``server``), with ``job_id`` (default: a new hex id)."""
        req = json.loads(json.dumps(dict(request), default=str))
        job = Job(job_id or uuid.uuid4().hex[:12], label or job_label(req), req, created=time.time(),
                  origin=origin)
        self.jobs.append(job)
        self.save()
        return job

    def add_batch(self, request: Mapping[str, Any], *, seeds: Sequence[int] = (),
                  prompts: Sequence[str] = ()) -> list[Job]:
        """One job per seed, or per prompt (both given: every prompt with every seed).

        Raises:
            ValueError: neither seeds nor prompts given.
        """
        if not seeds and not prompts:
            raise ValueError("a batch needs seeds or prompts")
        out = []
        every_prompt: Sequence[Any] = prompts or [request.get("prompt")]
        every_seed: Sequence[Any] = seeds or [request.get("seed")]
        for prompt in every_prompt:
            for seed in every_seed:
                out.append(self.add({**request, "prompt": prompt, "seed": seed}))
        return out

    # ------------------------------------------------------------------ editing
    def get(self, job_id: str) -> Job:
        """The job with ``job_id`` (raises KeyError)."""
        for j in self.jobs:
            if j.id == job_id:
                return j
        raise KeyError(job_id)

    def move(self, job_id: str, index: int) -> None:
        """Move a job to position ``index`` (clamped) of the list."""
        job = self.get(job_id)
        self.jobs.remove(job)
        self.jobs.insert(max(0, min(index, len(self.jobs))), job)
        self.save()

    def cancel(self, job_id: str) -> bool:
        """Cancel a queued job (True). A running job is cancelled by the runner, which
        then calls :meth:`finish`; finished jobs are left as they are (False)."""
        job = self.get(job_id)
        if job.state != "queued":
            return False
        job.state, job.finished = "cancelled", time.time()
        self.save()
        return True

    def retry(self, job_id: str) -> bool:
        """Queue a failed or cancelled job again (True), at the end of the queue."""
        job = self.get(job_id)
        if job.state not in ("failed", "cancelled"):
            return False
        job.state, job.error, job.started, job.finished, job.steps_done = \
            "queued", None, None, None, 0
        self.jobs.remove(job)
        self.jobs.append(job)
        self.save()
        return True

    def remove(self, job_ids: Iterable[str]) -> None:
        """Remove jobs that are not running."""
        ids = set(job_ids)
        self.jobs = [j for j in self.jobs if j.id not in ids or j.state == "running"]
        self.save()

    def clear_finished(self) -> None:
        """Remove every done, failed and cancelled job."""
        self.jobs = [j for j in self.jobs if j.state not in FINISHED]
        self.save()

    def set_paused(self, paused: bool) -> None:
        """Pause (no new job starts; the running one finishes) or resume."""
        self.paused = bool(paused)
        self.save()

    # ------------------------------------------------------------------ running
    def next_queued(self) -> Job | None:
        """The first queued job, or None (also while paused)."""
        if self.paused:
            return None
        return next((j for j in self.jobs if j.state == "queued"), None)

    def running(self) -> Job | None:
        return next((j for j in self.jobs if j.state == "running"), None)

    def start(self, job_id: str) -> Job:
        """Mark a queued job running."""
        job = self.get(job_id)
        job.state, job.started, job.steps_done, job.error = "running", time.time(), 0, None
        self.save()
        return job

    def finish(self, job_id: str, state: str, *, error: str | None = None,
               results: Sequence[str] = ()) -> Job:
        """Mark a job ``done``, ``failed`` or ``cancelled`` (raises ValueError otherwise)."""
        if state not in FINISHED:
            raise ValueError(f"a job finishes done, failed or cancelled, not {state!r}")
        job = self.get(job_id)
        job.state, job.error, job.finished = state, error, time.time()
        job.results = [*job.results, *map(str, results)]
        if job.started is not None:
            job.seconds = job.finished - job.started
        self.save()
        return job

    def counts(self) -> dict[str, int]:
        """Jobs per state."""
        out = dict.fromkeys(STATES, 0)
        for j in self.jobs:
            out[j.state] += 1
        return out

    def seconds_per_step(self) -> float | None:
        """Mean seconds per sampling step of the jobs done so far (None before the first)."""
        done = [j for j in self.jobs if j.state == "done" and j.seconds]
        steps = sum(j.steps for j in done)
        return sum(j.seconds or 0.0 for j in done) / steps if steps else None

    def remaining_seconds(self, seconds_per_step: float | None = None) -> float | None:
        """Estimated seconds until every queued job and the running one are done: their
        steps left times ``seconds_per_step`` (default :meth:`seconds_per_step`); None
        without a rate."""
        rate = seconds_per_step if seconds_per_step else self.seconds_per_step()
        if not rate:
            return None
        left = sum(j.steps for j in self.jobs if j.state == "queued")
        run = self.running()
        if run is not None:
            left += max(run.steps - run.steps_done, 0)
        return left * rate
