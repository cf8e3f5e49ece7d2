"""RPC devices: loopback ``sdplan rpc-server`` processes seen by ``sdplan devices``.

Every client that registers an RPC server runs in a subprocess: ggml aborts a client
process whose server goes away, and the pytest process must outlive the servers.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import require_or_skip
from rpc_util import PYTHON, RpcServer, accepts, free_port, rpc_servers, sdplan_cmd, stop
from sdplan.core.cli import main
from sdplan.core.runtime import devices


@pytest.fixture
def rpc() -> None:
    """Skip (or fail under SDPLAN_REQUIRE_RPC=1) when the loaded ggml has no RPC."""
    if not devices.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")


def sdplan(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sdplan_cmd(*args), capture_output=True, text=True, timeout=timeout)


@pytest.mark.rpc
def test_two_servers_appear_as_rpc0_rpc1(rpc: None) -> None:
    with rpc_servers(2) as (s1, s2):
        res = sdplan("devices", "--rpc-servers", f"{s1.endpoint},{s2.endpoint}", "--json")
        assert res.returncode == 0, res.stderr
        data = json.loads(res.stdout)
        rpc_devs = [d for d in data["devices"] if d["registry"] == "RPC"]
        assert [(d["name"], d["description"], d["type"]) for d in rpc_devs] == [
            ("RPC0", s1.endpoint, "gpu"), ("RPC1", s2.endpoint, "gpu")]
        cpu = next(d for d in data["devices"] if d["name"] == "CPU")
        for d in rpc_devs:  # both servers serve this machine's CPU
            assert d["total"] == cpu["total"]
            assert 0 < d["free"] <= d["total"]
        assert data["devices"][-2:] == rpc_devs  # RPC devices come after local ones
        assert data["features"]["rpc"] is True


@pytest.mark.rpc
def test_same_endpoint_twice_adds_one_device(rpc: None) -> None:
    with rpc_servers(1) as (s,):
        res = sdplan("devices", "--json", "--rpc-servers", f"{s.endpoint},{s.endpoint}",
                     "--rpc-servers", s.endpoint)
        assert res.returncode == 0, res.stderr
        names = [d["name"] for d in json.loads(res.stdout)["devices"]]
        assert names.count("RPC0") == 1 and "RPC1" not in names


@pytest.mark.rpc
def test_backends_and_memory_of_rpc_devices(rpc: None) -> None:
    """In a client subprocess: the manager shares one backend per RPC device, the backend
    talks to the right endpoint, and a memory refresh of an RPC device works."""
    with rpc_servers(2) as (s1, s2):
        script = textwrap.dedent(f"""
            import json
            from sdplan.core.runtime import devices
            names = devices.add_rpc_servers(["{s1.endpoint}", "{s2.endpoint}"])
            again = devices.add_rpc_servers(["{s2.endpoint}"])
            with devices.BackendManager(cpu_threads=1) as m:
                b0, b1 = m.get("RPC0"), m.get("RPC1")
                out = dict(names=names, again=again, same=m.get("RPC0") is b0,
                           b0=b0.name, b1=b1.name, open=m.open_devices(),
                           mem=devices.device_memory("RPC1"))
            out["closed"] = b0.closed and b1.closed
            print(json.dumps(out))
        """)
        res = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout.strip().splitlines()[-1])
        assert out["names"] == ["RPC0", "RPC1"] and out["again"] == ["RPC1"]
        assert out["same"] and out["closed"]
        assert s1.endpoint in out["b0"] and s2.endpoint in out["b1"]
        assert out["open"] == ["RPC0", "RPC1"]
        free, total = out["mem"]
        assert 0 < free <= total


@pytest.mark.rpc
def test_unreachable_endpoint_is_a_clear_error(rpc: None) -> None:
    port = free_port()  # nothing listens there
    endpoint = f"127.0.0.1:{port}"
    res = sdplan("devices", "--rpc-servers", endpoint)
    assert res.returncode == 2
    assert endpoint in res.stderr and "unreachable" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.rpc
def test_non_rpc_peer_is_an_error_not_an_abort(rpc: None) -> None:
    """A port that accepts TCP but does not speak ggml RPC (here: a fake HTTP reply). The peer
    is a process of its own: a thread of this process could wait for the interpreter lock
    while earlier tests' native threads hold it, and then look like a busy server."""
    peer = subprocess.Popen([sys.executable, "-c", (
        "import socket, sys\n"
        "s = socket.create_server(('127.0.0.1', 0))\n"
        "print(s.getsockname()[1], flush=True)\n"
        "while True:\n"
        "    c, _ = s.accept()\n"
        "    c.sendall(b'HTTP/1.0 400 Bad Request\\r\\n\\r\\n')\n"
        "    c.close()\n")], stdout=subprocess.PIPE, text=True)
    try:
        port = int(peer.stdout.readline())  # type: ignore[union-attr]
        res = sdplan("devices", "--rpc-servers", f"127.0.0.1:{port}")
    finally:
        peer.kill()
        peer.wait()
    assert res.returncode == 2
    assert f"127.0.0.1:{port} does not answer as a ggml RPC server" in res.stderr
    assert "Traceback" not in res.stderr


def test_malformed_endpoint_names_the_input() -> None:
    with pytest.raises(devices.RpcError, match="'nohost'"):
        devices.add_rpc_servers(["nohost"])


@pytest.mark.rpc
def test_sigint_stops_server_and_frees_the_port(rpc: None) -> None:
    with rpc_servers(1) as (s,):
        assert stop(s, signal.SIGINT) == 0
        assert not accepts(s.port)
        out = s.output()
        assert f"serving device CPU at {s.endpoint}" in out and "stopped" in out


@pytest.mark.rpc
def test_server_processes_are_gone_afterwards(rpc: None) -> None:
    with rpc_servers(2) as servers:
        procs = [s.proc for s in servers]
        assert all(p.poll() is None for p in procs)
    assert all(p.returncode is not None for p in procs)
    assert not any(accepts(s.port) for s in servers)


@pytest.mark.rpc
def test_port_in_use_is_reported(rpc: None) -> None:
    with rpc_servers(1) as (s,):
        res = sdplan("rpc-server", "--port", str(s.port), "--threads", "1", timeout=30)
        assert res.returncode == 1
        assert "already in use" in res.stderr


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "::"])
def test_non_loopback_host_is_refused(host: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rpc-server", "--host", host, "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "non-loopback" in err and "authentication" in err and "--allow-remote" in err


def test_without_rpc_commands_say_how_to_get_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(devices, "rpc_available", lambda: False)
    assert main(["rpc-server", "--port", str(free_port())]) == 2
    assert devices.RPC_INSTALL_COMMAND in capsys.readouterr().err
    assert main(["devices", "--rpc-servers", "127.0.0.1:9"]) == 2
    assert devices.RPC_INSTALL_COMMAND in capsys.readouterr().err


def test_loopback_detection() -> None:
    for host in ("127.0.0.1", "127.3.4.5", "::1", "[::1]", "localhost"):
        assert devices.is_loopback_host(host), host
    for host in ("0.0.0.0", "::", "192.168.1.10", "8.8.8.8", "no-such-host.invalid"):
        assert not devices.is_loopback_host(host), host


@pytest.mark.rpc
def test_rpc_server_unknown_device_lists_choices(
        rpc: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rpc-server", "--port", str(free_port()), "--device", "NoSuchDevice"]) == 2
    err = capsys.readouterr().err
    assert "'NoSuchDevice'" in err and "CPU" in err


@pytest.mark.parametrize("args", [["--port", "0"], ["--port", "70000"], ["--threads", "0"]])
def test_rpc_server_bad_numbers(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rpc-server", *args]) == 2
    assert args[0] in capsys.readouterr().err


GRAPH_SCRIPT = """
import json, sys
import numpy as np
from sdplan.core.runtime import devices
from sdplan.core.runtime import graph as gr

devices.add_rpc_servers([sys.argv[1]])
rng = np.random.default_rng(0)
x = rng.standard_normal((3, 8, 32)).astype(np.float32)
w = rng.standard_normal((16, 32)).astype(np.float32)
b = rng.standard_normal(16).astype(np.float32)


def run(backend):
    g = gr.new_graph([backend])
    with gr.on(g, 0):  # every op on the device under test
        xi, wi, bi = g.input("x", x.shape), g.input("w", w.shape), g.input("b", b.shape)
        y = g.soft_max(g.unary("silu", gr.linear(g, xi, wi, bi)))
    g.output("y", y)
    for name, value in (("x", x), ("w", w), ("b", b)):
        g.set_input(name, value)
    g.compute()
    return np.asarray(g.get_output("y"))


with devices.BackendManager(cpu_threads=1) as m:
    on_cpu, on_rpc = run(m.get("CPU")), run(m.get("RPC0"))
z = x @ w.T + b
z = z / (1 + np.exp(-z))
ref = np.exp(z - z.max(-1, keepdims=True))
ref /= ref.sum(-1, keepdims=True)
print(json.dumps({"shape": list(on_rpc.shape), "cpu_rpc": float(np.abs(on_cpu - on_rpc).max()),
                  "rpc_ref": float(np.abs(on_rpc - ref).max()), "sum": float(on_rpc.sum())}))
"""


@pytest.mark.rpc
def test_small_graph_same_numbers_on_cpu_and_rpc(rpc: None) -> None:
    """linear -> silu -> softmax on the local CPU and on RPC0 (a loopback server), both
    against numpy; the client runs in a subprocess."""
    pytest.importorskip("numpy")
    with rpc_servers(1) as (s,):
        res = subprocess.run([PYTHON, "-c", GRAPH_SCRIPT, s.endpoint], capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["shape"] == [3, 8, 16]
    assert abs(out["sum"] - 24.0) < 1e-3  # 24 softmax rows, each sums to 1
    assert out["rpc_ref"] < 1e-4
    assert out["cpu_rpc"] < 1e-6


@pytest.mark.rpc
def test_host_name_localhost_is_served_on_loopback(rpc: None, tmp_path: Path) -> None:
    """ggml's server takes numeric addresses only; ``--host localhost`` is resolved first."""
    import time

    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(sdplan_cmd("rpc-server", "--host", "localhost", "--port", str(port),
                                           "--threads", "1"), stdout=out, stderr=subprocess.STDOUT)
    server = RpcServer(proc, port, log)
    try:
        deadline = time.monotonic() + 20
        while not accepts(port) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert accepts(port), server.output()
    finally:
        assert stop(server) == 0
    assert "serving device CPU at 127.0.0.1:" in server.output()
