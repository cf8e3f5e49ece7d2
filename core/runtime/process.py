"""The engine child process and the :class:`Engine` API that drives it.

By default the engine lives in a child process (``python -m sdplan.core.runtime.process``), so a
fault that makes ggml abort (out of memory inside a backend, a lost RPC server) ends only
the child: the caller gets an :class:`EngineError` naming the cause (exit signal or code
and the child's last stderr lines) and the next call starts a fresh child.

Protocol: length-prefixed pickles (4-byte little-endian size) on the child's stdin (jobs,
``cancel``, ``quit``) and on a private copy of its stdout (``progress``, ``preview``,
``result``, ``error``); the child points its fd 1 at stderr so stray prints cannot corrupt
the stream. Arrays travel as numpy arrays inside the pickles, never as files.

A job is a function ``"package.module:function"`` called in the child as
``function(ctx, **params)``; ``ctx`` is a :class:`JobContext` (progress, preview, cancel
token, backends, RPC servers). :func:`run_module_job` runs one module per a placement.

:func:`sdplan.core.runtime.prestart.prestart` starts a child before any :class:`Engine`
asks for one (the command line, as soon as it knows the command needs one): its Python
start and its imports of the named job modules overlap the caller's own start-up, and the
next isolated :class:`Engine` of the process takes it.
"""

from __future__ import annotations

import collections
import functools
import importlib
import logging
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import IO, Any

from sdplan.core.errors import EngineError, SdplanError
from sdplan.core.runtime import prestart

# The runner (numpy, the native module) is imported where a job runs, in the engine process
# or in-process: the caller that only drives a child process never loads it.

log = logging.getLogger(__name__)

_POOL: Any = None  # the BackendPool of this process, created by the first job

#: stderr lines of the child kept for error messages.
STDERR_LINES = 200

#: Substrings of stderr lines that state why ggml aborted (preferred over backtraces).
_CAUSE_MARKERS = ("GGML_ASSERT", "GGML_ABORT", "error", "Error", "failed", "fatal", ".cpp:", ".c:",
                  "Remote RPC", "out of memory")


def _send(stream: IO[bytes], msg: Any) -> None:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _recv(stream: IO[bytes]) -> Any:
    """The next message, or None at end of stream."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack("<I", head)
    data = stream.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)


class JobContext:
    """What a job sees: ``progress(**info)``, ``preview(array)``, ``cancel`` (a
    :class:`~sdplan.core.runtime.runner.CancelToken`), ``pool()`` (shared backends) and
    ``add_rpc_servers(endpoints)``."""

    def __init__(self, emit: Callable[[str, Any], None], cancel: Any) -> None:
        self._emit = emit
        self.cancel = cancel

    def progress(self, **info: Any) -> None:
        self._emit("progress", info)

    def preview(self, array: Any) -> None:
        self._emit("preview", array)

    def add_rpc_servers(self, endpoints: list[str]) -> list[str]:
        from sdplan.core.runtime.devices import add_rpc_servers

        return add_rpc_servers(endpoints) if endpoints else []

    def pool(self) -> Any:
        """The process's shared backends (one instance per device for every job)."""
        global _POOL
        if _POOL is None:
            from sdplan.core.runtime.runner import BackendPool

            _POOL = BackendPool()
        return _POOL


def run_module_job(ctx: JobContext, model: str, model_args: dict[str, Any], path: str,
                   placement: dict[str, Any], inputs: dict[str, Any], runs: int = 1,
                   rpc_servers: list[str] | None = None) -> dict[str, Any]:
    """Run a module ``runs`` times on ``inputs`` (numpy arrays).

    ``model``: ``"package.module:factory"`` called with ``model_args`` to make the
    ModuleGraph; ``placement``: keyword arguments of
    :class:`~sdplan.core.runtime.runner.ModulePlacement` (ranges as ``(device, first, last)``).
    Returns ``{"outputs", "peak", "after"}`` (memory as ``{device: {weights, staging,
    compute}}`` bytes)."""
    from sdplan.core.runtime.runner import BlockRange, ModulePlacement, ModuleRunner
    from sdplan.core.runtime.weights import WeightFile

    ctx.add_rpc_servers(list(rpc_servers or []))
    pl = dict(placement)
    pl["devices"] = tuple(pl["devices"])
    pl["ranges"] = tuple(BlockRange(*r) for r in pl.get("ranges", ()))
    mod, _, fn = model.partition(":")
    graph_model = getattr(importlib.import_module(mod), fn)(**model_args)
    runner = ModuleRunner(graph_model, WeightFile(path), ModulePlacement(**pl), ctx.pool(), ctx.cancel)
    try:
        out: dict[str, Any] = {}
        for i in range(runs):
            out = runner.run(inputs)
            ctx.progress(step=i + 1, steps=runs)
        return {"outputs": out, "peak": {d: asdict(m) for d, m in runner.last_peak.items()},
                "after": {d: asdict(m) for d, m in runner.memory().items()}}
    finally:
        runner.release()


def _emit_for_job(emit: Any, job: int, kind: str, payload: Any) -> None:
    """Send one progress/preview message of ``job`` through the child's ``emit``."""
    emit(kind, job, payload)


def _end_with_parent(parent: int) -> None:
    """Make this process end when process ``parent`` does. On Linux the kernel sends SIGKILL
    when the thread that started this process ends (``prctl(PR_SET_PDEATHSIG)``): the parent
    names itself only when its main thread starts the child (:func:`prestart.spawn`). Exits
    at once when ``parent`` is already gone (it ended before the request took effect)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # no prctl: the end of stdin still ends the child
            log.debug("prctl(PR_SET_PDEATHSIG) unavailable", exc_info=True)
    if os.getppid() != parent:
        os._exit(0)


def _set_name(name: str) -> None:
    """Name this process ``name`` in ``/proc/PID/comm`` (Linux ``prctl(PR_SET_NAME)``, at
    most 15 bytes kept); elsewhere nothing."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name.encode()[:15]))  # 15: PR_SET_NAME
        except (OSError, AttributeError):
            log.debug("prctl(PR_SET_NAME) unavailable", exc_info=True)


def child_main(argv: Sequence[str] = ()) -> int:
    """Entry of the child process: with ``--parent PID`` end with that process
    (:func:`_end_with_parent`), with ``--name NAME`` take that process name (a forked child:
    :func:`sdplan.core.runtime.prestart.fork_engine`), import the ``--preload`` modules
    (comma-separated) of ``argv`` (an entry ``module:function`` also calls that function of
    the module, without arguments: a warm-up such as building a tokenizer), then serve jobs
    until ``quit``. The end of input without
    ``quit`` means the parent is gone: the child exits at once, also in the middle of a job."""
    opts = dict(zip(argv[::2], argv[1::2], strict=False))  # "--name value" pairs
    if "--name" in opts:
        _set_name(opts["--name"])
    if "--parent" in opts:
        _end_with_parent(int(opts["--parent"]))
    from sdplan.core.runtime.runner import Cancelled, CancelToken

    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    jobs: queue.Queue[Any] = queue.Queue()
    token = CancelToken()
    lock = threading.Lock()

    def emit(kind: str, job: int, payload: Any) -> None:
        with lock:
            _send(out, (kind, job, payload))

    def reader() -> None:
        while True:
            msg = _recv(inp)
            if msg is None:  # the parent died (it sends quit before it closes the pipe)
                os._exit(0)
            if msg[0] == "quit":
                jobs.put(None)
                return
            if msg[0] == "cancel":
                token.cancel()
            else:
                jobs.put(msg)

    threading.Thread(target=reader, daemon=True).start()
    if "--preload" in opts:
        for name in opts["--preload"].split(","):
            mod_name, _, func = name.partition(":")
            try:
                mod = importlib.import_module(mod_name)
                if func:  # "module:function": a warm-up the first job would otherwise pay
                    getattr(mod, func)()
            except BaseException:  # noqa: BLE001  the job that needs it reports the error; a
                # warm-up's SystemExit or KeyboardInterrupt must not end the child either
                log.debug("preload of %s failed", name, exc_info=True)
    first = True
    while (msg := jobs.get()) is not None:
        if first:  # the client's start-up until now is not other programs' CPU load
            from sdplan.core.runtime.threads import count_parent_as_own

            count_parent_as_own()
            first = False
        _, job, func, params = msg
        token.reset()
        ctx = JobContext(functools.partial(_emit_for_job, emit, job), token)
        try:
            mod, _, name = func.partition(":")
            result = getattr(importlib.import_module(mod), name)(ctx, **params)
            emit("result", job, result)
        except Cancelled as exc:
            emit("error", job, ("cancelled", str(exc)))
        except Exception as exc:  # reported to the caller, the child keeps serving
            log.debug("job %s failed", func, exc_info=True)
            # sdplan's own errors are written for the user; others keep their type's name
            text = str(exc) if isinstance(exc, SdplanError) else f"{type(exc).__name__}: {exc}"
            emit("error", job, (getattr(exc, "code", type(exc).__name__), text))
    return 0


class Engine:
    """Runs engine jobs in a child process (``isolated=True``, the default) or in this
    process. Thread-safe for ``cancel``; one job at a time.

    Raises EngineError from :meth:`call` when the job fails (``code`` from the job's
    error; ``cancelled`` after :meth:`cancel`) or the child dies (the message names the
    signal or exit code and the child's last stderr lines).
    """

    def __init__(self, isolated: bool = True, env: dict[str, str] | None = None) -> None:
        self.isolated = isolated
        self.env = env
        self._proc: prestart.Child | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_LINES)
        self._write_lock = threading.Lock()
        self._job = 0
        self._pending: tuple[int, str, dict[str, Any]] | None = None  # submitted, result not read yet
        self._local_cancel: Any = None

    @property
    def pid(self) -> int | None:
        """Process id of the running child (None when none)."""
        return self._proc.pid if self._proc and self._proc.poll() is None else None

    def start(self) -> None:
        """Start the child now (otherwise the first call does)."""
        if not self.isolated or self.pid is not None:
            return
        self._stderr.clear()
        spare = prestart.take_prestarted() if self.env is None else None
        if spare is not None and spare.poll() is not None:  # it died waiting: start another
            prestart.end_unused(spare)
            spare = None
        self._proc = spare or prestart.spawn(self.env)
        threading.Thread(target=self._drain, args=(self._proc,), daemon=True).start()

    def _drain(self, proc: prestart.Child) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            text = line.decode(errors="replace").rstrip()
            self._stderr.append(text)
            log.debug("engine: %s", text)

    def call(self, func: str, params: dict[str, Any], on_progress: Callable[[dict[str, Any]], None] | None = None,
             on_preview: Callable[[Any], None] | None = None) -> Any:
        """Run job ``func`` (``"module:function"``) with ``params``; returns its result."""
        return self.result(self.submit(func, params), on_progress, on_preview)

    def submit(self, func: str, params: dict[str, Any]) -> int:
        """Send job ``func`` with ``params`` now, so that the child starts on it while this
        process does other work; :meth:`result` then waits for it (one job at a time). In
        process the job runs when :meth:`result` is called. Returns the job's number.

        Raises:
            EngineError: the child died.
        """
        if self._pending is not None:
            raise ValueError(f"job {self._pending[0]} is still waiting for its result")
        self._job += 1
        self._pending = (self._job, func, params)
        if not self.isolated:
            return self._job
        self.start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None
        try:
            with self._write_lock:
                _send(proc.stdin, ("job", self._job, func, params))
        except (BrokenPipeError, OSError):
            self._pending = None
            raise self._died(proc) from None
        return self._job

    def result(self, job: int, on_progress: Callable[[dict[str, Any]], None] | None = None,
               on_preview: Callable[[Any], None] | None = None) -> Any:
        """The result of job number ``job`` (:meth:`submit`), handing its progress and
        previews to ``on_progress`` and ``on_preview`` as they come.

        Raises:
            EngineError: the job failed or the child died.
        """
        if self._pending is None or self._pending[0] != job:
            raise ValueError(f"job {job} is not waiting for its result")
        _, func, params = self._pending
        self._pending = None
        if not self.isolated:
            return self._call_local(func, params, on_progress, on_preview)
        proc = self._proc  # submit() started it; close() would have dropped the pending job
        assert proc is not None and proc.stdout is not None
        while True:
            msg = _recv(proc.stdout)
            if msg is None:
                raise self._died(proc)
            kind, _, payload = msg
            if kind == "progress" and on_progress:
                on_progress(payload)
            elif kind == "preview" and on_preview:
                on_preview(payload)
            elif kind == "result":
                return payload
            elif kind == "error":
                err = EngineError(payload[1])
                err.code = payload[0]
                raise err

    def _died(self, proc: prestart.Child) -> EngineError:
        code = proc.wait()
        self._proc = None
        if code < 0:
            try:
                cause = f"signal {signal.Signals(-code).name}"
            except ValueError:
                cause = f"signal {-code}"
            if -code == getattr(signal, "SIGBUS", None):  # weights are mapped from their files
                cause += ": a model file was truncated or replaced while in use"
        else:
            cause = f"exit code {code}"
        lines = list(self._stderr)
        # ggml prints its message, then a debugger backtrace: prefer the message lines
        key = [ln for ln in lines if any(k in ln for k in _CAUSE_MARKERS)
               and not ln[:1].isdigit() and not ln.startswith("#") and "No such file" not in ln]
        tail = "\n".join((key or lines)[-8:])
        err = EngineError(f"the engine process died ({cause}); last output:\n{tail}" if tail
                          else f"the engine process died ({cause})")
        err.code = "engine_died"
        return err

    def _call_local(self, func: str, params: dict[str, Any], on_progress: Any, on_preview: Any) -> Any:
        from sdplan.core.runtime.runner import CancelToken

        token = self._local_cancel = CancelToken()

        def emit(kind: str, payload: Any) -> None:
            cb = on_progress if kind == "progress" else on_preview
            if cb:
                cb(payload)

        mod, _, name = func.partition(":")
        return getattr(importlib.import_module(mod), name)(JobContext(emit, token), **params)

    def cancel(self) -> None:
        """Ask the running job to stop (it raises EngineError with code ``cancelled``)."""
        if not self.isolated:
            if self._local_cancel is not None:
                self._local_cancel.cancel()
            return
        proc = self._proc
        if proc is not None and proc.stdin is not None:
            try:
                with self._write_lock:
                    _send(proc.stdin, ("cancel",))
            except (BrokenPipeError, OSError):
                pass

    def close(self) -> None:
        """Stop the child (idempotent); a job submitted and not waited for is cancelled."""
        proc, self._proc = self._proc, None
        running, self._pending = self._pending is not None, None
        if proc is None:
            return
        try:
            with self._write_lock:
                assert proc.stdin is not None
                if running:
                    _send(proc.stdin, ("cancel",))
                _send(proc.stdin, ("quit",))
                proc.stdin.close()
            proc.wait(5)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
