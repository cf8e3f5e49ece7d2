"""The RPC servers panel against real loopback ``sdplan rpc-server`` processes: devices are
asked for in a child process (this process never registers a server, so a server that
dies cannot abort it), merged into the board as columns, and errors show inline."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from conftest import require_or_skip  # noqa: E402
from PySide6.QtCore import QSettings  # noqa: E402
from rpc_util import free_port, rpc_servers, stop  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.rpc import parse_rpc_devices, query_error  # noqa: E402
from sdplan.app.window import MainWindow  # noqa: E402
from sdplan.core.errors import InventoryError  # noqa: E402
from sdplan.core.planning.inventory import (  # noqa: E402
    Device,
    Inventory,
    merge_rpc_devices,  # noqa: E402
)
from sdplan.core.planning.placement import Placement  # noqa: E402

GIB = 1 << 30
QUERY_S = 90_000  # ms: a child process imports sdplan and ggml, then asks the servers


def local() -> Inventory:
    return Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB),
                      Device("CPU", "Ryzen", "cpu", "CPU", 48 * GIB, 64 * GIB)))


@pytest.fixture
def rpc() -> None:
    """Skip (or fail under SDPLAN_REQUIRE_RPC=1) when the loaded ggml has no RPC."""
    from sdplan.core.runtime import devices

    if not devices.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")


@pytest.fixture
def win(qtbot, tmp_path):
    ctl = PlanController(local(), None, Placement(), inventory_source=local)
    w = MainWindow(ctl, QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat),
                   history_dir=tmp_path / "history", queue_path=tmp_path / "queue.json")
    qtbot.addWidget(w)
    w.show()
    w.side.setCurrentWidget(w.rpc_page)  # the RPC servers tab, where the user adds them
    return w


def registered_here() -> list:
    """RPC servers registered with ggml in this (the GUI's) process."""
    try:
        import sdplan._ggml as native
    except ImportError:
        return []
    return list(native.rpc_servers()) if native.rpc_available() else []


def add(qtbot, win, endpoint: str) -> None:
    win.rpc.endpoint.setText(endpoint)
    assert win.rpc.add()
    assert win.rpc.busy.isVisible() and not win.rpc.add_btn.isEnabled()
    qtbot.waitUntil(lambda: win.rpc.pending is None, timeout=QUERY_S)


@pytest.mark.rpc
def test_server_devices_become_columns_and_a_dead_server_is_an_inline_error(rpc, qtbot,
                                                                             win):
    with rpc_servers(1) as (s,):
        add(qtbot, win, s.endpoint)
        assert not win.rpc.error.isVisible(), win.rpc.error.text()
        assert list(win.board.columns) == ["CUDA0", "CPU", "RPC0"]
        dev = win.ctl.device("RPC0")
        assert (dev.description, dev.type, dev.registry) == (s.endpoint, "gpu", "RPC")
        assert 0 < dev.free <= dev.total
        assert registered_here() == []  # asked in a child process only
        assert list(win.ctl.placement.rpc_servers) == [s.endpoint]
        assert win.rpc.list.item(0).text() == s.endpoint
        assert win.ctl.assign("vae", "RPC0")
        assert win.strings.fields["--backend"].text() == "CUDA0,vae=RPC0"
        assert f"--rpc-servers {s.endpoint}" in win.ctl.command_line()
        stop(s)
    # the server is gone: this process lives on, a refresh reports it inline, plan kept
    win.refresh_devices()
    qtbot.waitUntil(lambda: win.rpc.pending is None, timeout=QUERY_S)
    assert win.rpc.error.isVisible()
    assert s.endpoint in win.rpc.error.text()
    assert win.strings.fields["--backend"].text() == "CUDA0,vae=RPC0"
    assert "RPC0" in win.board.columns


@pytest.mark.rpc
def test_two_servers_then_remove_the_first_renumbers(rpc, qtbot, win):
    with rpc_servers(2) as (s1, s2):
        add(qtbot, win, s1.endpoint)
        add(qtbot, win, s2.endpoint)
        assert not win.rpc.error.isVisible(), win.rpc.error.text()
        assert [win.ctl.device(n).description for n in ("RPC0", "RPC1")] == [s1.endpoint,
                                                                              s2.endpoint]
        win.rpc.list.setCurrentRow(0)
        assert win.rpc.remove()
        assert list(win.board.columns) == ["CUDA0", "CPU", "RPC0"]
        assert win.ctl.device("RPC0").description == s2.endpoint
        assert list(win.ctl.placement.rpc_servers) == [s2.endpoint]
        assert registered_here() == []


def test_unreachable_endpoint_is_an_inline_error(qtbot, win):
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    add(qtbot, win, endpoint)
    assert win.rpc.error.isVisible()
    assert "RPC" in win.rpc.error.text()
    assert list(win.board.columns) == ["CUDA0", "CPU"]
    assert list(win.ctl.placement.rpc_servers) == []
    assert win.rpc.add_btn.isEnabled() and win.rpc.endpoint.text() == endpoint


def test_malformed_endpoint_is_refused_without_a_query(win):
    win.rpc.endpoint.setText("no-port-here")
    assert not win.rpc.add()
    assert win.rpc.pending is None
    assert win.rpc.error.isVisible() and "no-port-here" in win.rpc.error.text()


def test_parse_rpc_devices_and_merge():
    data = {"devices": [
        {"name": "CPU", "description": "cpu", "type": "cpu", "registry": "CPU",
         "free": 8 * GIB, "total": 16 * GIB},
        {"name": "RPC0", "description": "10.0.0.2:50052", "type": "gpu", "registry": "RPC",
         "free": 5 * GIB, "total": 6 * GIB}], "features": {}}
    devs = parse_rpc_devices(json.dumps(data), ["10.0.0.2:50052"])
    assert [(d.name, d.free) for d in devs] == [("RPC0", 5 * GIB)]
    with pytest.raises(InventoryError, match="10.0.0.3:1"):
        parse_rpc_devices(json.dumps(data), ["10.0.0.2:50052", "10.0.0.3:1"])
    with pytest.raises(InventoryError, match="no JSON"):
        parse_rpc_devices("Traceback...", [])
    merged = merge_rpc_devices(local(), devs)
    assert merged.names() == ["CUDA0", "CPU", "RPC0"]
    assert merge_rpc_devices(local(), []) == local()
    assert query_error("warning: x\nsdplan devices: RPC server a:1 is unreachable\n", 2) == \
        "RPC server a:1 is unreachable"
    assert "exit code 3" in query_error("", 3)


@pytest.mark.rpc
def test_gui_command_with_rpc_servers_asks_a_child_process(rpc, tmp_path):
    import subprocess

    from rpc_util import sdplan_cmd

    devices = tmp_path / "devices.json"
    devices.write_text(json.dumps({"devices": [d.to_json() for d in local()]}))
    plan = tmp_path / "plan.png"
    with rpc_servers(1) as (s,):
        env = dict(os.environ, QT_QPA_PLATFORM="offscreen", HOME=str(tmp_path),
                   XDG_CONFIG_HOME=str(tmp_path / "cfg"))
        r = subprocess.run(sdplan_cmd("gui", "--devices", str(devices), "--rpc-servers",
                                      s.endpoint, "--backend", "vae=RPC0", "--screenshot",
                                      str(plan)), env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        assert plan.stat().st_size > 10_000
    port = free_port()
    r = subprocess.run(sdplan_cmd("gui", "--devices", str(devices), "--rpc-servers",
                                  f"127.0.0.1:{port}", "--screenshot", str(plan)), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"127.0.0.1:{port}" in r.stderr
