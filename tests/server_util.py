"""Run ``sdplan serve`` on a free loopback port for tests.

``serving(*args)`` is a context manager yielding a :class:`LiveServer` once ``/health``
answers; on exit it stops the server (SIGTERM, then SIGKILL) and asserts the process and
its engine children are gone. Only loopback addresses are used.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rpc_util import free_port, sdplan_cmd


@dataclass
class LiveServer:
    """A running server: its process, base URL and log file."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    auth: dict[str, str] | None = None  # headers every request sends (an API key)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """``GET path``: (status, JSON body)."""
        return self.request("GET", path, None, headers)

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """``POST path`` with a JSON body (or raw bytes): (status, JSON body)."""
        return self.request("POST", path, body, headers)

    def request(self, method: str, path: str, body: Any, headers: dict[str, str] | None = None
                ) -> tuple[int, Any]:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(self.auth or {}),
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def metrics(self) -> dict[str, Any]:
        status, body = self.get("/metrics")
        assert status == 200, body
        return body


def picture(data: str | bytes) -> np.ndarray:
    """A base64 picture (or its bytes) as a uint8 ``(H, W, 3)`` array."""
    from PIL import Image

    raw = base64.b64decode(data) if isinstance(data, str) else data
    return np.asarray(Image.open(io.BytesIO(raw)).convert("RGB"))


def engine_children(pid: int) -> list[int]:
    """Process ids of ``pid``'s children (Linux ``/proc``)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


@contextlib.contextmanager
def serving(*args: str, timeout: float = 90.0, env: dict[str, str] | None = None) -> Iterator[LiveServer]:
    """Run ``sdplan serve ARGS --port P`` until ``/health`` answers (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="sdplan-serve-test-") as tmp:
        port = free_port()
        log = Path(tmp) / "serve.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(sdplan_cmd("serve", *args, "--port", str(port)), stdout=out,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1", "XDG_CACHE_HOME": tmp,
                                         **(env or {})})
        server = LiveServer(proc, port, log)
        children: list[int] = []
        try:
            deadline = time.monotonic() + timeout
            while True:
                assert proc.poll() is None, f"sdplan serve exited with {proc.returncode}:\n{server.output()}"
                assert time.monotonic() < deadline, f"sdplan serve did not answer in {timeout} s:\n{server.output()}"
                try:
                    with urllib.request.urlopen(server.url + "/health", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.1)
            children = engine_children(proc.pid)
            yield server
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            deadline = time.monotonic() + 10
            while any(Path(f"/proc/{c}").exists() for c in children) and time.monotonic() < deadline:
                time.sleep(0.1)
            left = [c for c in children if Path(f"/proc/{c}").exists()
                    and "sdplan" in Path(f"/proc/{c}/cmdline").read_text(errors="replace")]
            assert not left, f"engine processes left running: {left}"
