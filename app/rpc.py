"""The RPC servers list: add/remove ``host:port`` endpoints; their devices become columns.
Errors (bad endpoint, unreachable server, ggml without RPC) show inline.

The GUI process never registers an RPC server with ggml: a registered server that later
dies aborts the process it is registered in (and the user's unsaved plan with it). The
servers' devices are asked for by ``sdplan devices --rpc-servers ... --json`` in a child
process (:class:`RpcQuery`, a QProcess, so the GUI thread never waits) and merged into
the controller's inventory; the engine process registers them itself when it runs.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Sequence

from PySide6.QtCore import QObject, QProcess, Signal, Slot
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QVBoxLayout,
    QWidget,
)
from sdplan.app.controller import PlanController
from sdplan.core.errors import InventoryError, SdplanError
from sdplan.core.planning.inventory import Device, Inventory

#: Seconds a device query may take (TCP connect, ggml handshake, device list).
QUERY_TIMEOUT_S = 60.0


def devices_command(servers: Sequence[str]) -> list[str]:
    """The argv that lists the devices of ``servers`` (``host:port``) as JSON in a child
    process: ``python -m sdplan.core.cli devices --rpc-servers A,B --json``."""
    return [sys.executable, "-m", "sdplan.core.cli", "devices", "--rpc-servers",
            ",".join(servers), "--json"]


def parse_rpc_devices(stdout: str, servers: Sequence[str]) -> list[Device]:
    """The RPC devices (registry ``RPC``) in ``sdplan devices --json`` output.

    Raises:
        InventoryError: the output is not an inventory, or it lacks a device for one of
            ``servers`` (named in the message).
    """
    from sdplan.core.planning.bounded_json import loads  # the one bounded reader

    try:
        data = loads(stdout, "sdplan devices --json")
    except ValueError as exc:
        raise InventoryError(f"sdplan devices printed no JSON inventory ({exc})") from None
    inv = Inventory.from_json(data, source="sdplan devices --json")
    devices = [d for d in inv if d.registry.upper() == "RPC"]
    missing = [s for s in servers if not any(d.description == s for d in devices)]
    if missing:
        raise InventoryError(f"RPC server {missing[0]} exposes no device")
    return devices


def query_error(stderr: str, code: int) -> str:
    """The one-line reason a device query failed, from the child's stderr."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if not lines:
        return f"the device query failed (exit code {code})"
    last = lines[-1]
    return last.removeprefix("sdplan devices: ")


def query_rpc_devices(servers: Sequence[str], timeout: float = QUERY_TIMEOUT_S) -> list[Device]:
    """Blocking form of :class:`RpcQuery` (startup, before the window shows): the devices
    of ``servers`` asked for in a child process.

    Raises:
        InventoryError: the query failed (unreachable server, no RPC in this ggml...),
            timed out, or printed no inventory.
    """
    if not servers:
        return []
    try:
        res = subprocess.run(devices_command(servers), capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise InventoryError(f"RPC servers {', '.join(servers)} did not answer within "
                             f"{timeout:.0f} s") from None
    if res.returncode != 0:
        raise InventoryError(query_error(res.stderr, res.returncode))
    return parse_rpc_devices(res.stdout, servers)


class RpcQuery(QObject):
    """One asynchronous device query for a list of servers (a QProcess).

    Signals:
        succeeded(object servers, object devices): ``list[str]``, ``list[Device]``.
        failed(object servers, str message).
    """

    succeeded = Signal(object, object)
    failed = Signal(object, str)

    def __init__(self, servers: Sequence[str], parent: QObject | None = None,
                 timeout: float = QUERY_TIMEOUT_S) -> None:
        super().__init__(parent)
        self.servers = list(servers)
        self.proc = QProcess(self)
        self.proc.finished.connect(self._finished)
        self.proc.errorOccurred.connect(self._error)
        self._timeout_ms = int(timeout * 1000)
        self._done = False

    def start(self) -> None:
        """Start the child process (returns at once)."""
        argv = devices_command(self.servers)
        self.proc.start(argv[0], argv[1:])
        from PySide6.QtCore import QTimer

        QTimer.singleShot(self._timeout_ms, self.proc, self._timed_out)

    def is_running(self) -> bool:
        return not self._done

    @Slot()
    def _timed_out(self) -> None:
        if not self._done:
            self.proc.kill()
            self._fail(f"RPC servers {', '.join(self.servers)} did not answer within "
                       f"{self._timeout_ms / 1000:.0f} s")

    def _fail(self, message: str) -> None:
        if not self._done:
            self._done = True
            self.failed.emit(self.servers, message)

    @Slot(QProcess.ProcessError)
    def _error(self, err: QProcess.ProcessError) -> None:
        if err == QProcess.ProcessError.FailedToStart:
            self._fail(f"cannot run {sys.executable} for the device query")

    @Slot(int, QProcess.ExitStatus)
    def _finished(self, code: int, status: QProcess.ExitStatus) -> None:
        if self._done:
            return
        out = bytes(self.proc.readAllStandardOutput().data()).decode(errors="replace")
        err = bytes(self.proc.readAllStandardError().data()).decode(errors="replace")
        if status != QProcess.ExitStatus.NormalExit or code != 0:
            self._fail(query_error(err, code))
            return
        try:
            devices = parse_rpc_devices(out, self.servers)
        except SdplanError as exc:
            self._fail(str(exc))
            return
        self._done = True
        self.succeeded.emit(self.servers, devices)


class RpcPanel(QFrame):
    """Endpoint list bound to the placement's ``--rpc-servers``."""

    def __init__(self, controller: PlanController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctl = controller
        self.setObjectName("Panel")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(14, 10, 14, 10)
        lay.setSpacing(6)
        head = QHBoxLayout()
        t = QLabel("RPC SERVERS")
        t.setObjectName("Section")
        head.addWidget(t)
        head.addStretch(1)
        self.refresh_btn = QPushButton("Refresh memory")
        self.refresh_btn.setToolTip("Ask every device for its free memory now (F5)")
        head.addWidget(self.refresh_btn)
        lay.addLayout(head)
        self.list = QListWidget()
        self.list.setMaximumHeight(56)
        self.list.setToolTip("--rpc-servers: each server's devices appear as RPC0, RPC1, … "
                             "after the local devices")
        lay.addWidget(self.list)
        self.none = QLabel("No servers. Start `sdplan rpc-server` on another machine and "
                           "add its host:port; its devices appear as columns.")
        self.none.setObjectName("Caption")
        self.none.setWordWrap(True)
        lay.addWidget(self.none)
        row = QHBoxLayout()
        self.endpoint = QLineEdit()
        self.endpoint.setPlaceholderText("host:port")
        self.endpoint.setToolTip("The host:port an `sdplan rpc-server` (or ggml's rpc-server) "
                                 "listens on, e.g. 192.168.1.20:50052")
        self.endpoint.returnPressed.connect(self.add)
        row.addWidget(self.endpoint, 1)
        self.add_btn = QPushButton("Add")
        self.add_btn.clicked.connect(self.add)
        row.addWidget(self.add_btn)
        self.remove_btn = QPushButton("Remove")
        self.remove_btn.clicked.connect(self.remove)
        row.addWidget(self.remove_btn)
        lay.addLayout(row)
        self.error = QLabel()
        self.error.setObjectName("Error")
        self.error.setWordWrap(True)
        self.error.hide()
        lay.addWidget(self.error)
        self.busy = QLabel()
        self.busy.setObjectName("Caption")
        self.busy.setWordWrap(True)
        self.busy.hide()
        lay.addWidget(self.busy)
        self.pending: RpcQuery | None = None
        controller.planChanged.connect(self.refresh)
        self.refresh()

    def refresh(self, *_: object) -> None:
        servers = list(self.ctl.placement.rpc_servers)
        if [self.list.item(i).text() for i in range(self.list.count())] != servers:
            self.list.clear()
            self.list.addItems(servers)
        self.remove_btn.setEnabled(bool(servers))
        self.list.setVisible(bool(servers))
        self.none.setVisible(not servers)

    def show_error(self, message: str | None) -> None:
        """Show ``message`` inline under the list (None hides it)."""
        if message:
            self.error.setText(f"✕  {message}")
            self.error.show()
        else:
            self.error.hide()

    def query(self, servers: Sequence[str]) -> bool:
        """Ask a child process for the devices of ``servers``; the columns change when it
        answers (:meth:`_answered`), an error shows inline. False while one is running."""
        if self.pending is not None:
            return False
        self.pending = RpcQuery(servers, self)
        self.pending.succeeded.connect(self._answered)
        self.pending.failed.connect(self._failed)
        self.busy.setText(f"asking {', '.join(servers)} for its devices…")
        self.busy.show()
        self.add_btn.setEnabled(False)
        self.pending.start()
        return True

    @Slot(object, object)
    def _answered(self, servers: list[str], devices: list[Device]) -> None:
        self._done()
        try:
            self.ctl.set_rpc_servers(servers, devices)
        except SdplanError as exc:
            self.show_error(str(exc))
            return
        self.show_error(None)
        if self.endpoint.text().strip() in servers:
            self.endpoint.clear()
        self.ctl.status.emit(f"RPC devices: {', '.join(d.name for d in devices)}")

    @Slot(object, str)
    def _failed(self, servers: list[str], message: str) -> None:
        self._done()
        self.show_error(message)

    def _done(self) -> None:
        if self.pending is not None:
            self.pending.deleteLater()
        self.pending = None
        self.busy.hide()
        self.add_btn.setEnabled(True)

    def add(self) -> bool:
        """Add the endpoint typed in the field (its devices arrive asynchronously)."""
        text = self.endpoint.text().strip()
        if not text:
            return False
        from sdplan.core.runtime.devices import parse_endpoint

        try:
            parse_endpoint(text)
        except SdplanError as exc:
            self.show_error(str(exc))
            return False
        servers = list(self.ctl.placement.rpc_servers)
        if text in servers:
            self.show_error(f"{text} is already in the list")
            return False
        return self.query([*servers, text])

    def requery(self) -> bool:
        """Ask the current servers again (fresh free memory); False without servers."""
        servers = list(self.ctl.placement.rpc_servers)
        return bool(servers) and self.query(servers)

    def remove(self) -> bool:
        """Remove the selected endpoint (the last one when none is selected); the other
        servers' devices are renumbered ``RPC0``... in list order, without a query."""
        servers = list(self.ctl.placement.rpc_servers)
        if not servers:
            return False
        row = self.list.currentRow()
        gone = servers.pop(row if 0 <= row < len(servers) else -1)
        kept = [d for d in self.ctl.rpc_devices if d.description != gone]
        renamed = [dataclasses.replace(d, name=f"RPC{i}") for i, d in enumerate(kept)]
        try:
            self.ctl.set_rpc_servers(servers, renamed)
        except SdplanError as exc:
            self.show_error(str(exc))
            return False
        self.show_error(None)
        return True
