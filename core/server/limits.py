"""What a server takes: the stated limits every request is checked against before any work.

A request over a limit is refused with a :class:`~sdplan.core.errors.RequestRefused`
naming the limit (HTTP 413 for a body too large, 400 for a picture too large or too many
steps or images, 429 for a full queue), before it is queued. The limits are the server's
flags (``sdplan serve --max-body-mb --max-pixels --max-batch --max-steps --max-queue``) and
are published in sd-server's ``capabilities`` ``limits`` object. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sdplan.core.errors import RequestRefused

__all__ = ["ServerLimits", "MIB"]

MIB = 1 << 20


@dataclass(frozen=True)
class ServerLimits:
    """A server's limits.

    Attributes:
        max_body_bytes: bytes of one request body (pictures in base64 included).
        max_pixels: width x height of one picture, in pixels.
        max_side: the largest width or height, in pixels.
        max_batch: images per request.
        max_steps: sampling steps per request.
        max_queue: jobs waiting or running at once (more: 429, ``queue_full``).
        max_prompt_chars: characters of the prompt and of the negative prompt.
    """

    max_body_bytes: int = 32 * MIB
    max_pixels: int = 2048 * 2048
    max_side: int = 4096
    max_batch: int = 8
    max_steps: int = 150
    max_queue: int = 64
    max_prompt_chars: int = 20_000

    def check_body(self, length: int) -> None:
        """Refuse a body of ``length`` bytes over :attr:`max_body_bytes`.

        Raises:
            RequestRefused: ``too_large``, HTTP 413.
        """
        if length > self.max_body_bytes:
            raise RequestRefused(f"the request body is {length} bytes; this server takes at most "
                                 f"{self.max_body_bytes} bytes ({self.max_body_bytes / MIB:g} MiB)",
                                 "too_large", 413)

    def check_request(self, req: Any) -> None:
        """Refuse a checked request (a
        :class:`~sdplan.core.pipelines.request.GenerationRequest` with its size, steps and
        batch resolved) over the picture, step, batch or prompt limits; a hires fix's second
        pass (its target, aligned to 8 px, and its steps) counts as well.

        Raises:
            RequestRefused: ``too_large``, HTTP 400, naming the limit.
        """
        w, h = int(req.width or 0), int(req.height or 0)
        sizes = [("", w, h)]
        hires = getattr(req, "hires", None)
        if hires is not None and hires.active:
            sizes.append(("the hires pass's ", *hires.target(w, h, 8)))
            if int(hires.steps) > self.max_steps:
                raise RequestRefused(f"{hires.steps} hires steps; this server runs at most {self.max_steps}",
                                     "too_large", 400)
        for what, sw, sh in sizes:
            if sw > self.max_side or sh > self.max_side or sw * sh > self.max_pixels:
                raise RequestRefused(f"{what}{sw}x{sh} px is over this server's limit ({self.max_pixels} pixels, "
                                     f"sides up to {self.max_side} px)", "too_large", 400)
        if int(req.batch_count) > self.max_batch:
            raise RequestRefused(f"{req.batch_count} images in one request; this server makes at most "
                                 f"{self.max_batch}", "too_large", 400)
        if int(req.steps or 0) > self.max_steps:
            raise RequestRefused(f"{req.steps} steps; this server runs at most {self.max_steps}",
                                 "too_large", 400)
        for name, text in (("prompt", req.prompt), ("negative_prompt", req.negative_prompt)):
            if len(text) > self.max_prompt_chars:
                raise RequestRefused(f"{name}: {len(text)} characters; this server takes at most "
                                     f"{self.max_prompt_chars}", "too_large", 400)

    def to_json(self) -> dict[str, int]:
        """sd-server's ``capabilities.limits`` (``min_width``... ``max_queue_size``) with
        sdplan's own limits beside them."""
        return {"min_width": 8, "max_width": self.max_side, "min_height": 8,
                "max_height": self.max_side, "max_batch_count": self.max_batch,
                "max_queue_size": self.max_queue, "max_pixels": self.max_pixels,
                "max_steps": self.max_steps, "max_body_bytes": self.max_body_bytes}
