"""Start ``sdplan rpc-server`` processes on free loopback ports for tests.

``rpc_servers(n)`` is a context manager yielding ``RpcServer`` records once every server
accepts TCP connections; on exit it stops them (SIGTERM, then SIGKILL) and asserts that
each process is gone. RPC clients must live in subprocesses too: ggml aborts a client
process whose registered server disappears.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PYTHON = sys.executable

#: The environment for a client process whose graphs must compute like RPC devices do: RPC
#: devices multiply with ggml's products (sdplan's FMA product runs on CPU-only graphs), so a
#: split over RPC servers is compared with a CPU run that uses ggml's products too.
GGML_PRODUCTS_ENV = {**os.environ, "SDPLAN_FMA_GEMM": "off"}


@contextlib.contextmanager
def ggml_products() -> Iterator[None]:
    """Graphs built inside use ggml's products, not the FMA product (see GGML_PRODUCTS_ENV)."""
    from sdplan._ggml import fma_gemm, set_fma_gemm

    before = fma_gemm()
    set_fma_gemm(False)
    try:
        yield
    finally:
        set_fma_gemm(before)


def sdplan_cmd(*args: str) -> list[str]:
    """The command line running ``sdplan ARGS`` with this interpreter."""
    return [PYTHON, "-m", "sdplan.core.cli", *args]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepts(port: int, timeout: float = 0.2) -> bool:
    """True when 127.0.0.1:``port`` accepts a TCP connection."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class RpcServer:
    """One running server: its process, port, endpoint and log file."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def stop(server: RpcServer, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
    """Stop ``server`` with ``sig`` (SIGKILL after ``timeout`` s); returns its exit code and
    asserts the process no longer exists."""
    proc = server.proc
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    code = proc.returncode
    assert code is not None, f"rpc-server pid {proc.pid} still running"
    assert not Path(f"/proc/{proc.pid}").exists() or _is_other_process(proc.pid), (
        f"rpc-server pid {proc.pid} still exists")
    return int(code)


def _is_other_process(pid: int) -> bool:
    """True when ``pid`` was reused by a process that is not an rpc-server of ours."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"rpc-server" not in cmdline


@contextlib.contextmanager
def rpc_servers(n: int, *, threads: int = 1, timeout: float = 30.0) -> Iterator[list[RpcServer]]:
    """Run ``n`` ``sdplan rpc-server`` processes serving the CPU on free loopback ports.

    Yields once all accept connections; raises AssertionError (with the server's output)
    when one exits or does not listen within ``timeout`` seconds. Always stops them all.
    """
    servers: list[RpcServer] = []
    with tempfile.TemporaryDirectory(prefix="sdplan-rpc-") as tmp:
        try:
            for i in range(n):
                port = free_port()
                log = Path(tmp) / f"server{i}.log"
                with open(log, "wb") as out:
                    proc = subprocess.Popen(
                        sdplan_cmd("rpc-server", "--port", str(port), "--threads", str(threads)),
                        stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
                servers.append(RpcServer(proc, port, log))
            deadline = time.monotonic() + timeout
            for s in servers:
                while not accepts(s.port):
                    assert s.proc.poll() is None, (
                        f"rpc-server on port {s.port} exited with {s.proc.returncode}:\n{s.output()}")
                    assert time.monotonic() < deadline, (
                        f"rpc-server on port {s.port} did not listen in {timeout} s:\n{s.output()}")
                    time.sleep(0.05)
            yield servers
        finally:
            for s in servers:
                stop(s)
