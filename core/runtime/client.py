"""The polling engine client: one job at a time on the engine process, messages in order.

The desktop app drives generation through this client from a worker thread (the app's
``sdplan.app.worker.EngineClient`` protocol is what it implements); the command line calls
:class:`~sdplan.core.runtime.process.Engine` directly.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from typing import Any

from sdplan.core.errors import SdplanError
from sdplan.core.runtime.process import Engine

log = logging.getLogger(__name__)


class EngineClient:
    """A client that runs one job at a time on an :class:`~sdplan.core.runtime.process.Engine`
    from a thread of its own, for callers that poll (the desktop app's worker thread):
    :meth:`start` runs ``job`` with a request (for image generation,
    ``sdplan.core.pipelines.jobs.GENERATE_JOB``) in the engine process, :meth:`next_message` returns the app's messages in order:
    ``{"type": "progress", "step", "total", "preview": uint8 (H, W, 3) or None}``, then one
    of ``{"type": "result", "images", "params", "record"}`` (params also carry ``timings``;
    ``record`` is the engine's whole result but the images: what the picture's record needs),
    ``{"type": "error", "message"}`` (a failed job, or a dead engine process naming the
    signal and ggml's last message; the next :meth:`start` starts a fresh process) or
    ``{"type": "cancelled"}``.

    ``job``: the engine job (``"module:function"``) run with ``{"request": request}``;
    ``isolated``: the engine in a child process (default) or in this process (debugging).
    """

    def __init__(self, job: str, isolated: bool = True, engine: Engine | None = None) -> None:
        self.job = job
        self.engine = engine or Engine(isolated=isolated)
        self._messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self._thread: Any = None

    def start(self, request: Mapping[str, Any]) -> None:
        """Begin one generation. Raises RuntimeError while another is running."""
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError("a generation is already running")
        while not self._messages.empty():
            self._messages.get_nowait()
        self._thread = threading.Thread(target=self._run, args=(dict(request),), daemon=True,
                                        name="sdplan-engine-client")
        self._thread.start()

    def _run(self, request: dict[str, Any]) -> None:
        put = self._messages.put

        def progress(info: dict[str, Any]) -> None:
            if "step" in info:
                put({"type": "progress", "step": int(info["step"]), "total": int(info["total"]), "preview": None})

        def preview(info: dict[str, Any]) -> None:
            put({"type": "progress", "step": int(info["step"]), "total": int(info["total"]),
                 "preview": info["image"]})

        try:
            res = self.engine.call(self.job, {"request": request}, progress, preview)
            put({"type": "result", "images": list(res["images"]),
                 "params": {**res["params"], "timings": res["timings"]},
                 "record": {k: v for k, v in res.items() if k != "images"}})
        except SdplanError as exc:
            if getattr(exc, "code", None) == "cancelled":
                put({"type": "cancelled"})
            else:
                put({"type": "error", "message": str(exc)})
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error message
            log.debug("engine client failure", exc_info=True)
            put({"type": "error", "message": f"{type(exc).__name__}: {exc}"})

    def next_message(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or None after ``timeout`` seconds without one."""
        try:
            return self._messages.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def cancel(self) -> None:
        """Ask the running generation to stop (thread-safe); a ``cancelled`` message follows."""
        self.engine.cancel()

    def close(self) -> None:
        """Stop the engine process (idempotent)."""
        self.engine.close()
