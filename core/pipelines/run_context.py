"""What a family's ``generate(request, plan, progress)`` gets as ``progress``: the engine job's
backends, cancel token, messages (progress per step, previews) and the loaded-pipeline cache.

The engine process keeps the last request's pipeline loaded (:meth:`RunContext.cached`): a
request with the same files (unchanged on disk), placements and settings that shape the
graphs reuses it; another one closes it first, so its weights are freed before the new ones
load.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from sdplan.core.modelfiles.readers import file_version
from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.runtime.threads import check_between_steps

__all__ = ["RunContext", "FamilyResult", "file_stamps", "close_cached", "cached_pipeline"]

_CACHE: dict[str, Any] = {}  # the engine process's loaded pipeline, reused by the next request

#: What a family's ``generate`` returns: ``images`` (uint8 ``(H, W, 3)`` arrays), ``timings``
#: (phase -> seconds), ``info`` (what inputs applied: LoRAs, strength...), ``runners``
#: (module -> ModuleRunner, for the segment report).
FamilyResult = dict[str, Any]


def file_stamps(files: Mapping[str, list[str]]) -> tuple[tuple[Any, ...], ...]:
    """Each model file's identity and version (path, device, inode, size, modification and
    change times, ns; the path alone when it cannot be read), for the pipeline cache's key: a
    file replaced or rewritten between requests loads again instead of reusing old weights."""
    out: list[tuple[Any, ...]] = []
    for key in sorted(files):
        for path in files[key]:
            try:
                st = os.stat(path)
            except OSError:
                out.append((key, path))
                continue
            out.append((key, path, *file_version(st)))
    return tuple(out)


def cached_pipeline() -> Any:
    """The loaded pipeline of the last request, or None."""
    return _CACHE.get("obj")


def close_cached() -> None:
    """Close and forget the loaded pipeline (its weights are freed)."""
    old = _CACHE.pop("obj", None)
    _CACHE.clear()
    if old is not None:
        old.close()


class RunContext:
    """One generation job's context (module docstring).

    Args:
        ctx: the engine job's context (``pool()``, ``cancel``, ``progress(**msg)``,
            ``preview(msg)``; :class:`sdplan.core.runtime.process.JobContext`).
        request: the checked request (its ``previews`` says whether previews are sent).
    """

    def __init__(self, ctx: Any, request: GenerationRequest) -> None:
        self.ctx = ctx
        self.request = request
        self.total = int(request.steps or 0)

    @property
    def cancel(self) -> Any:
        """The job's cancel token."""
        return self.ctx.cancel

    def pool(self) -> Any:
        """The engine process's shared backends."""
        return self.ctx.pool()

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """The pipeline of the previous request when ``key`` (with the request's file stamps)
        matches, else ``make()`` after closing the old one; its cancel token is this job's."""
        full = (key, file_stamps(self.request.files))
        if _CACHE.get("key") != full:
            close_cached()
            _CACHE["obj"] = make()
            _CACHE["key"] = full
        pipe = _CACHE["obj"]
        if hasattr(pipe, "set_cancel"):
            pipe.set_cancel(self.ctx.cancel)
        return pipe

    def step(self, step: int, total: int) -> None:
        """Report step ``step`` (1-based) of ``total`` done (and let the thread governor
        follow the machine's load)."""
        self.total = total
        check_between_steps(self.ctx.progress)
        self.ctx.progress(step=step, total=total, phase="sampling")

    def phase(self, name: str) -> None:
        """Report a phase (``upscale``, ``decode``...)."""
        self.ctx.progress(phase=name)

    def preview(self, step: int, rgb: np.ndarray) -> None:
        """Send the preview of step ``step`` (uint8 ``(H, W, 3)``) when the request wants them."""
        if self.request.previews:
            self.ctx.preview({"step": step, "total": self.total,
                              "image": np.ascontiguousarray(rgb, dtype=np.uint8)})

    @property
    def wants_previews(self) -> bool:
        """True when previews are sent (a pipeline may skip making them otherwise)."""
        return bool(self.request.previews)

    def per_step(self, steps: int) -> Callable[[int, np.ndarray], None]:
        """A sampling loop's callback ``cb(i, rgb)``: step ``i + 1`` of ``steps`` done, with its
        preview."""
        def cb(i: int, rgb: np.ndarray) -> None:
            self.step(i + 1, steps)
            self.preview(i + 1, rgb)
        return cb

    def batch(self, steps: int, one: Callable[[int, Callable[[int, np.ndarray], None]], Mapping[str, Any]]
              ) -> tuple[list[np.ndarray], float]:
        """Run ``one(b, cb)`` for each of the request's ``batch_count`` images (``b`` = 0, 1...;
        ``cb`` from :meth:`per_step`) and return the uint8 images (``one``'s ``image``,
        ``(1, 3, H, W)`` in [-1, 1]) and the seconds taken."""
        from sdplan.core.pipelines.stages.results import image_to_uint8

        t0 = time.perf_counter()
        cb = self.per_step(steps)
        images = [image_to_uint8(one(b, cb)["image"][0]) for b in range(self.request.batch_count)]
        return images, time.perf_counter() - t0
