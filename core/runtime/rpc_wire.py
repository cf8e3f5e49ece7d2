"""What a ggml RPC server speaks, asked over the wire without ggml: its protocol version and
the tensor-name length (``GGML_MAX_NAME``) it was built with.

ggml's RPC client serialises every tensor as a fixed record that ends with the tensor's name
(``char name[GGML_MAX_NAME]``), so a client and a server built with different name lengths
misread each other's records: sd-cli (stable-diffusion.cpp builds ggml with 160) against a
server with 64 dies at its first tensor upload, and a 64 client against a 160 server aborts
("Remote RPC server crashed or returned malformed response"). The record size cannot be
asked for, but a server refuses a message of the wrong size by closing the connection
(``recv_msg`` checks the size first), and nothing else: :func:`server_name_length` sends
``GET_ALLOC_SIZE`` (a read-only query about one 1-element F32 tensor) once per candidate
length, each on a fresh connection, and the length the server answers is its own.

Wire format (ggml RPC protocol 5, ``ggml/src/ggml-rpc/ggml-rpc.cpp``): a command is one
byte, a little-endian u64 size and that many bytes; ``HELLO`` (14) carries 24 bytes of
connection capabilities (zero: plain TCP) and is answered with ``major, minor, patch``, a
pad byte and 24 capability bytes; ``GET_ALLOC_SIZE`` (13) carries a u32 device index and 11
tensor records (the tensor and ``GGML_MAX_SRC`` = 10 sources) and is answered with a u64.
A tensor record is 232 bytes plus the name: id u64, type u32, buffer u64, ne[4] u32,
nb[4] u32, op u32, op_params[16] i32, flags i32, src[10] u64, view_src u64, view_offs u64,
data u64, name, 4 bytes of padding.

A ggml RPC server serves one client at a time: while another client holds it, the kernel
still accepts a new connection into the listen backlog, but nothing answers its ``HELLO``;
once the backlog is full (ggml listens with a backlog of 1) new connections are not accepted
at all. :func:`hello` reports either as :class:`RpcBusy` (callers check first that the
endpoint accepts TCP connections, so a silent one is busy rather than unreachable). A connection sdplan abandons with a request unanswered is closed
with a reset (``SO_LINGER`` 0, :func:`abandon`), so the server never finds a queued request
to answer later on a socket nobody reads (that write would kill a C++ server by SIGPIPE).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["CANDIDATE_NAME_LENGTHS", "RpcServerInfo", "RpcBusy", "tensor_record_size",
           "hello", "server_name_length", "probe_server", "abandon"]

#: Name lengths tried, most common first: ggml's default and stable-diffusion.cpp's.
CANDIDATE_NAME_LENGTHS = (64, 160, 128, 256)
_HELLO, _GET_ALLOC_SIZE = 14, 13
_CAPS = 24
_MAX_SRC = 10


@dataclass(frozen=True)
class RpcServerInfo:
    """What a server speaks: ``protocol`` ``(major, minor, patch)`` and ``max_name`` (the
    tensor-name length, None when no candidate was answered)."""

    endpoint: str
    protocol: tuple[int, int, int]
    max_name: int | None

    def describe(self) -> str:
        """``ggml RPC 5.0.0, tensor names of 160 bytes`` (for ``sdplan devices``)."""
        names = (f"tensor names of {self.max_name} bytes" if self.max_name is not None
                 else "tensor-name length unknown")
        return f"ggml RPC {'.'.join(map(str, self.protocol))}, {names}"


class RpcBusy(ConnectionError):
    """The server accepted the connection but did not answer: it is serving another client."""


def abandon(sock: socket.socket) -> None:
    """Close ``sock`` with a reset (``SO_LINGER`` on, 0 s) rather than an orderly shutdown,
    so a request it sent is not left queued for the server to answer later."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def tensor_record_size(max_name: int) -> int:
    """Bytes of one serialised tensor for a ``GGML_MAX_NAME`` of ``max_name``."""
    return 232 + max_name


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the server closed the connection")
        buf += chunk
    return buf


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.strip().rpartition(":")
    return host.strip("[]"), int(port)


def _connect(endpoint: str, timeout: float) -> tuple[socket.socket, tuple[int, int, int]]:
    try:
        sock = socket.create_connection(_split(endpoint), timeout=timeout)
    except TimeoutError:  # a listen queue full of waiting clients drops new ones
        raise RpcBusy(f"it did not accept the connection within {timeout:g} s (its queue of "
                      "waiting clients is full)") from None
    try:
        sock.sendall(struct.pack("<BQ", _HELLO, _CAPS) + bytes(_CAPS))
        try:
            size = struct.unpack("<Q", _recv_exact(sock, 8))[0]
        except TimeoutError:
            raise RpcBusy(f"it accepted the connection but did not answer within "
                          f"{timeout:g} s") from None
        if not 3 <= size <= 64:  # protocol 5 answers 28 bytes; anything else is no ggml
            raise ConnectionError(f"its HELLO reply says {size} bytes")
        reply = _recv_exact(sock, size)
        return sock, (reply[0], reply[1], reply[2])
    except BaseException:
        abandon(sock)
        raise


def hello(endpoint: str, timeout: float = 5.0) -> tuple[int, int, int]:
    """The server's RPC protocol version from its ``HELLO`` reply.

    Raises:
        RpcBusy: no connection accepted, or no reply, within ``timeout`` seconds (another
            client holds the server).
        OSError / ConnectionError: unreachable, or not answering as a ggml RPC server of
            protocol 4 or later.
    """
    sock, version = _connect(endpoint, timeout)
    sock.close()
    return version


def _answers(endpoint: str, max_name: int, timeout: float) -> bool:
    record = tensor_record_size(max_name)
    tensor = bytearray(record)
    # id 1, type F32 (0), buffer 0 (none), ne = 1 1 1 1, nb = 4 4 4 4
    struct.pack_into("<QIQ4I4I", tensor, 0, 1, 0, 0, 1, 1, 1, 1, 4, 4, 4, 4)
    body = struct.pack("<I", 0) + bytes(tensor) + bytes(record * _MAX_SRC)
    try:
        sock, _ = _connect(endpoint, timeout)
    except (OSError, ConnectionError):
        return False
    try:
        sock.sendall(struct.pack("<BQ", _GET_ALLOC_SIZE, len(body)) + body)
        size = struct.unpack("<Q", _recv_exact(sock, 8))[0]
        ok = size == 8 and len(_recv_exact(sock, 8)) == 8
    except (OSError, ConnectionError):
        abandon(sock)
        return False
    sock.close()
    return ok


def server_name_length(endpoint: str, candidates: Sequence[int] = CANDIDATE_NAME_LENGTHS,
                       timeout: float = 5.0) -> int | None:
    """The ``GGML_MAX_NAME`` the server at ``endpoint`` was built with: the first of
    ``candidates`` whose ``GET_ALLOC_SIZE`` it answers (module docstring), or None."""
    for n in candidates:
        if _answers(endpoint, n, timeout):
            return n
    return None


def probe_server(endpoint: str, candidates: Sequence[int] = CANDIDATE_NAME_LENGTHS,
                 timeout: float = 5.0) -> RpcServerInfo:
    """Protocol version and name length of the server at ``endpoint``.

    Raises:
        OSError / ConnectionError: as :func:`hello`.
    """
    version = hello(endpoint, timeout)
    return RpcServerInfo(endpoint, version, server_name_length(endpoint, candidates, timeout))
