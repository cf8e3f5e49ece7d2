"""A fake ggml RPC server for tests: it answers HELLO (protocol 5.0.0) and GET_ALLOC_SIZE
only for tensor records of its own name length, and closes the connection on anything else,
as a real ggml RPC server built with that GGML_MAX_NAME does (``recv_msg`` checks sizes)."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager


def _recv(conn: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError
        buf += chunk
    return buf


def _serve(conn: socket.socket, max_name: int, protocol: tuple[int, int, int]) -> None:
    record = 232 + max_name
    with conn:
        try:
            cmd, size = struct.unpack("<BQ", _recv(conn, 9))
            if cmd != 14 or size != 24:
                return
            _recv(conn, 24)
            conn.sendall(struct.pack("<Q", 28) + bytes([*protocol, 0]) + bytes(24))
            while True:
                cmd, size = struct.unpack("<BQ", _recv(conn, 9))
                if cmd == 13 and size == 4 + 11 * record:
                    _recv(conn, size)
                    conn.sendall(struct.pack("<QQ", 8, 4))
                    continue
                return  # a record of another size: the server drops the client
        except (ConnectionError, OSError):
            return


@contextmanager
def fake_rpc_server(max_name: int, protocol: tuple[int, int, int] = (5, 0, 0)
                    ) -> Iterator[str]:
    """Serve on a free loopback port; yields the endpoint."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=_serve, args=(conn, max_name, protocol),
                             daemon=True).start()

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(2)
        srv.close()
