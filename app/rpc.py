"""The RPC servers list: add/remove ``host:port`` endpoints; their devices become columns.
Errors (bad endpoint, unreachable server, ggml without RPC) show inline."""

from __future__ import annotations

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
from sdplan.core.errors import SdplanError


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
        row = QHBoxLayout()
        self.endpoint = QLineEdit()
        self.endpoint.setPlaceholderText("host:port (sdplan rpc-server)")
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
        controller.planChanged.connect(self.refresh)
        self.refresh()

    def refresh(self, *_: object) -> None:
        servers = list(self.ctl.placement.rpc_servers)
        if [self.list.item(i).text() for i in range(self.list.count())] != servers:
            self.list.clear()
            self.list.addItems(servers)
        self.remove_btn.setEnabled(bool(servers))

    def _set(self, servers: list[str]) -> bool:
        try:
            self.ctl.set_rpc_servers(servers)
        except SdplanError as exc:
            self.error.setText(f"✕  {exc}")
            self.error.show()
            return False
        self.error.hide()
        return True

    def add(self) -> bool:
        """Add the endpoint typed in the field."""
        text = self.endpoint.text().strip()
        if not text:
            return False
        from sdplan.core.devices import parse_endpoint

        try:
            parse_endpoint(text)
        except SdplanError as exc:
            self.error.setText(f"✕  {exc}")
            self.error.show()
            return False
        servers = list(self.ctl.placement.rpc_servers)
        if text in servers:
            return False
        if self._set([*servers, text]):
            self.endpoint.clear()
            return True
        return False

    def remove(self) -> bool:
        """Remove the selected endpoint (the last one when none is selected)."""
        servers = list(self.ctl.placement.rpc_servers)
        if not servers:
            return False
        row = self.list.currentRow()
        servers.pop(row if 0 <= row < len(servers) else -1)
        return self._set(servers)
