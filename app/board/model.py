"""The board's item model: drop targets (the default and each device) with the module cards
shown on them, and the drag-and-drop contract in mime data.

Tree: top-level row 0 is the *Default* target (the ``all=`` entry), rows 1.. are the
inventory's devices in order; each target's children are the cards shown in its column.
A card is ``(module, kind)`` with kind ``main`` (the module runs here; for a split, the main
device), ``part`` (a further device of a split, with its block range) or ``weights`` (the
module's weights live here and are staged to its runtime device).

Drops: :meth:`BoardModel.dropMimeData` with ``MoveAction`` runs the module on the target
device alone (on the Default target: removes its entry so it follows ``all=``);
``CopyAction`` (Ctrl held while dropping) adds the device to a layer split. The view passes
the drop action through; tests call ``mimeData``/``dropMimeData`` directly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from PySide6.QtCore import QAbstractItemModel, QMimeData, QModelIndex, QPersistentModelIndex, Qt
from sdplan.app.controller import PlanController
from sdplan.core.planning.bounded_json import loads

MIME = "application/x-sdplan-module"
ModuleRole = Qt.ItemDataRole.UserRole + 1
KindRole = Qt.ItemDataRole.UserRole + 2
DeviceRole = Qt.ItemDataRole.UserRole + 3
DEFAULT = "__default__"

Index = QModelIndex | QPersistentModelIndex
_ROOT = QModelIndex()


@dataclass(frozen=True)
class Card:
    """One card in a column."""

    module: str
    kind: str  # main | part | weights


class BoardModel(QAbstractItemModel):
    """Targets and cards of the current plan (rebuilt on every ``planChanged``)."""

    def __init__(self, controller: PlanController) -> None:
        super().__init__(controller)
        self.ctl = controller
        self._targets: list[str] = []
        self._cards: dict[str, list[Card]] = {}
        #: ``(module, device, residency mode or None)``: the card (or its residency button)
        #: that takes the keyboard focus once rebuilt (a keyboard move or choice).
        self.focus_request: tuple[str, str, str | None] | None = None
        self._build()
        controller.planChanged.connect(self.refresh)
        controller.inventoryChanged.connect(self.refresh)
        controller.modelChanged.connect(self.refresh)

    # ------------------------------------------------------------------ contents
    def _build(self) -> None:
        ctl = self.ctl
        self._targets = [DEFAULT, *(d.name for d in ctl.inventory)]
        cards: dict[str, list[Card]] = {t: [] for t in self._targets}
        plan = ctl.plan
        for m in ctl.modules():
            mp = plan.modules[m]
            cards[mp.devices[0]].append(Card(m, "main"))
            for d in mp.devices[1:]:
                cards[d].append(Card(m, "part"))
            if mp.params.mode == "device" and mp.params.device:
                cards[mp.params.device].append(Card(m, "weights"))
        self._cards = cards

    def refresh(self, *_: object) -> None:
        """Rebuild from the controller's plan."""
        self.beginResetModel()
        self._build()
        self.endResetModel()

    def targets(self) -> list[str]:
        """Drop-target names: ``DEFAULT`` then device names."""
        return list(self._targets)

    def cards(self, target: str) -> list[Card]:
        """Cards shown in ``target``'s column."""
        return list(self._cards.get(target, []))

    def target_index(self, target: str) -> QModelIndex:
        """The top-level index of ``target`` (``DEFAULT`` or a device name)."""
        return self.index(self._targets.index(target), 0)

    def card_index(self, target: str, module: str, kind: str = "main") -> QModelIndex:
        """The index of ``module``'s card of ``kind`` in ``target``'s column."""
        row = self._cards[target].index(Card(module, kind))
        return self.index(row, 0, self.target_index(target))

    # ------------------------------------------------------------------ Qt model API
    def index(self, row: int, column: int, parent: Index = _ROOT) -> QModelIndex:
        if column != 0 or row < 0:
            return QModelIndex()
        if not parent.isValid():
            return self.createIndex(row, 0, 0) if row < len(self._targets) else QModelIndex()
        if self._is_target(parent):
            t = parent.row()
            if row < len(self._cards[self._targets[t]]):
                return self.createIndex(row, 0, t + 1)
        return QModelIndex()

    def parent(self, index: Index = _ROOT) -> QModelIndex:  # type: ignore[override]
        if not index.isValid():
            return QModelIndex()
        if self._is_target(index):
            return QModelIndex()
        return self.createIndex(index.internalId() - 1, 0, 0)

    def _is_target(self, index: Index) -> bool:
        return index.isValid() and index.internalId() == 0

    def rowCount(self, parent: Index = _ROOT) -> int:  # noqa: N802
        if not parent.isValid():
            return len(self._targets)
        if self._is_target(parent):
            return len(self._cards[self._targets[parent.row()]])
        return 0

    def columnCount(self, parent: Index = _ROOT) -> int:  # noqa: N802
        return 1

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid():
            return None
        if self._is_target(index):
            name = self._targets[index.row()]
            if role in (Qt.ItemDataRole.DisplayRole, DeviceRole):
                return "Default" if name == DEFAULT and role == Qt.ItemDataRole.DisplayRole \
                    else name
            return None
        target = self._targets[index.internalId() - 1]
        card = self._cards[target][index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, ModuleRole):
            return card.module
        if role == KindRole:
            return card.kind
        if role == DeviceRole:
            return target
        return None

    def flags(self, index: Index) -> Qt.ItemFlag:
        base = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
        if not index.isValid():
            return Qt.ItemFlag.NoItemFlags
        if self._is_target(index):
            return base | Qt.ItemFlag.ItemIsDropEnabled
        return base | Qt.ItemFlag.ItemIsDragEnabled

    def supportedDropActions(self) -> Qt.DropAction:  # noqa: N802
        return Qt.DropAction.MoveAction | Qt.DropAction.CopyAction

    def supportedDragActions(self) -> Qt.DropAction:  # noqa: N802
        return Qt.DropAction.MoveAction | Qt.DropAction.CopyAction

    def mimeTypes(self) -> list[str]:  # noqa: N802
        return [MIME]

    def mimeData(self, indexes: list[QModelIndex]) -> QMimeData:  # noqa: N802
        """``{"modules": [...], "from": device}`` as JSON under :data:`MIME`."""
        mods = [str(self.data(i, ModuleRole)) for i in indexes
                if i.isValid() and not self._is_target(i)]
        src = str(self.data(indexes[0], DeviceRole)) if indexes else ""
        md = QMimeData()
        md.setData(MIME, json.dumps({"modules": mods, "from": src}).encode())
        md.setText(", ".join(mods))
        return md

    @staticmethod
    def decode(data: QMimeData) -> tuple[list[str], str]:
        """Modules and source device of mime data made by :meth:`mimeData` (read with the
        bounded JSON reader: a drop may come from another program); ``([], "")`` for
        anything else."""
        if not data.hasFormat(MIME):
            return [], ""
        try:
            raw = loads(bytes(data.data(MIME).data()), "dropped modules")
        except ValueError:
            return [], ""
        mods = raw.get("modules", []) if isinstance(raw, dict) else None
        if not isinstance(mods, list):
            return [], ""
        return [str(m) for m in mods], str(raw.get("from", ""))

    def canDropMimeData(self, data: QMimeData, action: Qt.DropAction, row: int,  # noqa: N802
                        column: int, parent: Index) -> bool:
        """True for module mime data on a target; a split (Copy) only for splittable
        modules on a device."""
        mods, _ = self.decode(data)
        if not mods or not self._is_target(parent):
            return False
        target = self._targets[parent.row()]
        if action == Qt.DropAction.CopyAction:
            return target != DEFAULT and all(m in ("diffusion", "te") for m in mods)
        return True

    def dropMimeData(self, data: QMimeData, action: Qt.DropAction, row: int,  # noqa: N802
                     column: int, parent: Index) -> bool:
        """Apply a drop (see module docstring); returns True when the plan changed."""
        mods, _ = self.decode(data)
        if not mods or not self._is_target(parent):
            return False
        target = self._targets[parent.row()]
        changed = False
        for m in mods:
            if target == DEFAULT:
                changed |= self.ctl.follow_default(m)
            elif action == Qt.DropAction.CopyAction:
                changed |= self.ctl.add_split_device(m, target)
            else:
                changed |= self.ctl.assign(m, target)
        return changed
