"""A ggml RPC server serves one client at a time. sdplan reports a server held by another
client as busy (not as a version mismatch) within its connect timeout, closes the connection
it abandons with a reset so the server never answers a queued request into a closed socket,
and the server still serves afterwards. ``--host ::1`` is refused: ggml's RPC server listens
on IPv4 only."""

from __future__ import annotations

import socket
import struct
import subprocess
import time

import pytest
from conftest import require_or_skip
from rpc_util import rpc_servers, sdplan_cmd
from sdplan.core.runtime import devices
from sdplan.core.runtime.rpc_wire import hello


@pytest.fixture
def rpc() -> None:
    if not devices.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")


def _hold(port: int) -> socket.socket:
    """A client that has said HELLO and keeps the connection: the server now serves it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(struct.pack("<BQ", 14, 24) + bytes(24))
    size = struct.unpack("<Q", sock.recv(8, socket.MSG_WAITALL))[0]
    assert len(sock.recv(size, socket.MSG_WAITALL)) == size
    return sock


@pytest.mark.rpc
def test_a_busy_server_is_reported_busy_and_still_serves(rpc: None) -> None:
    with rpc_servers(1) as (server,):
        protocol = hello(server.endpoint)
        holder = _hold(server.port)
        try:
            start = time.monotonic()
            with pytest.raises(devices.RpcError) as exc:
                devices.check_rpc_server(server.endpoint)
            elapsed = time.monotonic() - start
            msg = str(exc.value)
            assert "is busy" in msg and "one client at a time" in msg and "version" not in msg
            assert elapsed < 5.0  # the connect timeout (3 s), not a hang
            res = subprocess.run(sdplan_cmd("devices", "--rpc-servers", server.endpoint),
                                 capture_output=True, text=True, timeout=60)
            assert res.returncode == 2 and "is busy" in res.stderr, res.stderr
            assert len(res.stderr.strip().splitlines()) == 1
        finally:
            holder.close()
        # the abandoned connections were reset: the server skips them and serves again
        deadline = time.monotonic() + 10
        while True:
            try:
                assert hello(server.endpoint, timeout=2) == protocol
                break
            except ConnectionError:
                assert time.monotonic() < deadline
        time.sleep(0.5)
        assert server.proc.poll() is None, server.output()
        assert hello(server.endpoint) == protocol


def test_ipv6_host_is_refused_in_one_line() -> None:
    res = subprocess.run(sdplan_cmd("rpc-server", "--host", "::1", "--port", "50999"),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "sdplan rpc-server: --host ::1: ggml's RPC server listens on IPv4 only; use 127.0.0.1 "
        "(or an IPv4 address with --allow-remote)"]


def test_an_abandoned_connection_is_reset() -> None:
    """A listener that never serves: the HELLO times out as busy, and when the server gets
    to the queued connection, writing its reply fails at once (the connection was reset),
    where an orderly close would have let the first write through."""
    from sdplan.core.runtime.rpc_wire import RpcBusy

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(4)
        port = srv.getsockname()[1]
        with pytest.raises(RpcBusy, match="did not answer within 0.5 s"):
            hello(f"127.0.0.1:{port}", timeout=0.5)
        conn, _ = srv.accept()
        with conn:
            assert conn.recv(64)[:1] == b"\x0e"  # the HELLO it had queued
            with pytest.raises(ConnectionResetError):
                conn.sendall(bytes(36))
        plain = socket.create_connection(("127.0.0.1", port))
        plain.sendall(b"\x0e")
        plain.close()
        conn, _ = srv.accept()
        with conn:
            assert conn.recv(64) == b"\x0e"
            conn.sendall(bytes(36))  # an orderly close lets this write through
