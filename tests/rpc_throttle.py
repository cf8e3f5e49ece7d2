"""A TCP proxy on loopback that makes a narrow link: bandwidth and latency, per direction.

Put it between sdplan and a ggml RPC server (``sdplan rpc-server``) to emulate a remote
device behind a slow network: every byte each way is delayed by ``latency_ms`` (one way, so
a round trip takes twice that) and the bytes of each direction pass at most ``mbps`` MB/s
(10**6 bytes per second), in chunks of at most 64 KiB.

In a test or bench::

    with Throttle(("127.0.0.1", server_port), mbps=100, latency_ms=1) as link:
        ... use link.endpoint ("127.0.0.1:PORT") as the RPC server ...

or as its own process: ``python tests/rpc_throttle.py --upstream 127.0.0.1:50052 --mbps 100
--latency-ms 1 [--port PORT]`` (prints ``127.0.0.1:PORT`` once it listens, runs until
killed).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import socket
import sys
import threading
import time
from types import TracebackType

CHUNK = 64 << 10


class _Pipe:
    """One direction of one connection: a reader thread stamps each chunk as it arrives; a
    writer thread sends it ``latency`` seconds later, paced to ``bps``."""

    def __init__(self, src: socket.socket, dst: socket.socket, bps: float, latency: float) -> None:
        self.src, self.dst, self.bps, self.latency = src, dst, bps, latency
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.cond = threading.Condition()
        self.closed = False
        self.sent = 0
        for target in (self._read, self._write):
            threading.Thread(target=target, daemon=True).start()

    def _read(self) -> None:
        try:
            while True:
                data = self.src.recv(CHUNK)
                if not data:
                    break
                with self.cond:
                    self.queue.append((time.monotonic(), data))
                    self.cond.notify()
        except OSError:
            pass
        with self.cond:
            self.closed = True
            self.cond.notify()

    def _write(self) -> None:
        free_at = 0.0  # when the link has passed every byte sent so far
        try:
            while True:
                with self.cond:
                    while not self.queue and not self.closed:
                        self.cond.wait()
                    if not self.queue:
                        break
                    arrived, data = self.queue.popleft()
                start = max(arrived + self.latency, free_at)
                free_at = start + len(data) / self.bps
                wait = free_at - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                self.dst.sendall(data)
                self.sent += len(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            self.dst.shutdown(socket.SHUT_WR)


class Throttle:
    """A listening proxy to ``upstream`` (host, port) with ``mbps`` MB/s and ``latency_ms``
    per direction; ``endpoint`` is its ``127.0.0.1:PORT``. Use as a context manager (or
    :meth:`close`)."""

    def __init__(self, upstream: tuple[str, int], mbps: float, latency_ms: float, port: int = 0) -> None:
        self.upstream = upstream
        self.bps = mbps * 1e6
        self.latency = latency_ms / 1000.0
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = int(self.listener.getsockname()[1])
        self.pipes: list[_Pipe] = []
        self._socks: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._socks.append(s)
            self.pipes += [_Pipe(client, server, self.bps, self.latency),
                           _Pipe(server, client, self.bps, self.latency)]

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._stop = True
        with contextlib.suppress(OSError):
            self.listener.close()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()

    def __enter__(self) -> Throttle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, help="HOST:PORT of the RPC server")
    ap.add_argument("--mbps", type=float, required=True, help="MB/s per direction")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="one-way delay (ms)")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (0: any free one)")
    a = ap.parse_args(argv)
    host, _, port = a.upstream.rpartition(":")
    link = Throttle((host, int(port)), a.mbps, a.latency_ms, a.port)
    print(link.endpoint, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        link.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
