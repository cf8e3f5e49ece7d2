"""An engine client for the app's tests: replays recorded engine messages."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any


class ReplayEngineClient:
    """An engine client that replays recorded messages, ``delay_s`` apart.

    ``fail_on_start``: raise this exception from :meth:`start` (an engine process that does
    not come up). :meth:`cancel` makes the next message ``{"type": "cancelled"}``.
    """

    def __init__(self, messages: Sequence[dict[str, Any]], delay_s: float = 0.0,
                 fail_on_start: Exception | None = None) -> None:
        self.messages = list(messages)
        self.delay_s = delay_s
        self.fail_on_start = fail_on_start
        self.requests: list[dict[str, Any]] = []
        self._cancel = threading.Event()
        self._pos = 0
        self.closed = False

    def start(self, request: dict[str, Any]) -> None:
        if self.fail_on_start is not None:
            raise self.fail_on_start
        self.requests.append(dict(request))
        self._cancel.clear()
        self._pos = 0

    def next_message(self, timeout: float) -> dict[str, Any] | None:
        if self._cancel.wait(self.delay_s):
            self._pos = len(self.messages)
            return {"type": "cancelled"}
        if self._pos >= len(self.messages):
            return {"type": "error", "message": "the engine process ended without a result"}
        msg = self.messages[self._pos]
        self._pos += 1
        return msg

    def cancel(self) -> None:
        self._cancel.set()

    def close(self) -> None:
        self.closed = True
