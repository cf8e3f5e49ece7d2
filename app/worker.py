"""The engine seam of the GUI: a worker QObject, living in a QThread, drives an engine
client and reports progress, previews, results and errors as Qt signals.

An engine client is anything with this small interface (:class:`EngineClient`)::

    start(request: dict) -> None          # begin one generation (see GenerationPanel.request)
    next_message(timeout: float) -> dict | None   # block up to timeout s for the next message
    cancel() -> None                      # ask the engine to stop (thread-safe)
    close() -> None                       # release the engine process

Messages are dicts: ``{"type": "progress", "step": int, "total": int, "preview":
ndarray (H, W, 3) uint8 or float in [0, 1], or None}``, ``{"type": "result", "images":
[ndarray, ...], "params": dict}``, ``{"type": "error", "message": str}`` and
``{"type": "cancelled"}``; the last three end a run. The real one is
:class:`sdplan.core.runtime.client.EngineClient` running
:data:`sdplan.core.pipelines.jobs.GENERATE_JOB`.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from PySide6.QtCore import QObject, Signal, Slot
from sdplan.core.pipelines.jobs import GENERATE_JOB
from sdplan.core.runtime.client import EngineClient as PollingClient

log = logging.getLogger(__name__)

TERMINAL = ("result", "error", "cancelled")


class EngineClient(Protocol):
    """What the worker needs of an engine (see module docstring)."""

    def start(self, request: dict[str, Any]) -> None: ...
    def next_message(self, timeout: float) -> dict[str, Any] | None: ...
    def cancel(self) -> None: ...
    def close(self) -> None: ...


ClientFactory = Callable[[], EngineClient]


def engine_unavailable_reason() -> str | None:
    """Why the engine cannot run here (the native module is missing from this build), or
    None. The engine process imports it; the app itself never does."""
    try:
        found = importlib.util.find_spec("sdplan._ggml") is not None
    except (ImportError, ValueError) as exc:
        return f"Engine not available: {exc}"
    return None if found else "Engine not available: this build has no native module (sdplan._ggml)"


def default_client_factory() -> EngineClient:
    """A client of the real engine: image generation in a child process."""
    return PollingClient(GENERATE_JOB)


class GenerationWorker(QObject):
    """Runs one request on an engine client in its thread; the panel connects its signals
    to slots of GUI-thread objects (queued across threads)."""

    progress = Signal(int, int, object)  # step, total, preview ndarray or None
    result = Signal(object, object)  # images (list of ndarray), the engine's record (params, plan...)
    error = Signal(str)
    cancelled = Signal()
    finished = Signal()

    def __init__(self, client: EngineClient, request: dict[str, Any],
                 poll_s: float = 0.1) -> None:
        super().__init__()
        self.client, self.request, self.poll_s = client, request, poll_s
        self._cancel = threading.Event()

    def cancel(self) -> None:
        """Ask the engine to stop (callable from any thread)."""
        self._cancel.set()
        try:
            self.client.cancel()
        except Exception:  # noqa: BLE001 - a dead engine cannot be cancelled; run() reports
            log.debug("engine cancel failed", exc_info=True)

    @Slot()
    def run(self) -> None:
        """Start the request and relay messages until a terminal one (or a failure). The
        model file's SHA-256 its pictures record is read meanwhile on a thread of its own
        (:func:`warm_model_hash`; once per file), so saving the result never waits for it."""
        hashing = threading.Thread(target=warm_model_hash, args=(self.request,), daemon=True)
        hashing.start()
        try:
            self.client.start(self.request)
            while True:
                msg = self.client.next_message(self.poll_s)
                if msg is None:
                    if self._cancel.is_set():
                        self.cancelled.emit()
                        break
                    continue
                kind = msg.get("type")
                if kind == "progress":
                    self.progress.emit(int(msg["step"]), int(msg["total"]), msg.get("preview"))
                elif kind == "result":
                    record = dict(msg.get("record") or {})
                    record["params"] = dict(msg.get("params") or record.get("params") or {})
                    hashing.join()
                    self.result.emit(list(msg.get("images") or []), record)
                    break
                elif kind == "error":
                    self.error.emit(str(msg.get("message") or "the engine failed"))
                    break
                elif kind == "cancelled":
                    self.cancelled.emit()
                    break
                else:
                    log.debug("ignoring engine message %r", kind)
        except Exception as exc:  # noqa: BLE001 - every engine failure becomes a message
            self.error.emit(f"{type(exc).__name__}: {exc}")
        finally:
            self.finished.emit()


def warm_model_hash(request: dict[str, Any]) -> None:
    """Read the SHA-256 of the request's main model file into the library's cache
    (:func:`sdplan.core.modelfiles.library.file_sha256`) so that the picture's record finds
    it there; a file that cannot be read is left to the record (which then has no hash)."""
    from sdplan.core.modelfiles.library import file_sha256

    files = request.get("model_files") or {}
    paths = files.get("model") or files.get("diffusion_model") or []
    if paths:
        try:
            file_sha256(str(paths[0]))
        except OSError as exc:
            log.debug("no model hash for %s: %s", paths[0], exc)


def now() -> float:
    """Monotonic seconds (steps/s and ETA)."""
    return time.monotonic()
