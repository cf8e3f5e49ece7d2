"""Device columns and the Default target: headers, memory bars, budgets, drop handling."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QVBoxLayout,
    QWidget,
)
from sdplan.app import theme
from sdplan.app.board.cards import ModuleCard, gib
from sdplan.app.board.memory_bar import BarData, MemoryBar
from sdplan.app.board.model import DEFAULT, BoardModel
from sdplan.app.controller import PlanController
from sdplan.app.icons import device_pixmap
from sdplan.app.warnings import device_warnings
from sdplan.app.wrap_label import WrapLabel
from sdplan.core.planning.modules import SPLITTABLE

GIB = 1 << 30
#: Reserve of the layer-split weight rule (spec section 8): free - 2 GiB, at most 7/8 free.
SPLIT_RESERVE = 2 * GIB


class _DropFrame(QFrame):
    """A frame that hands module drops to the board model (Ctrl = add to the split)."""

    target = DEFAULT

    def __init__(self, controller: PlanController, model: BoardModel,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctl, self.model = controller, model
        self.setAcceptDrops(True)

    @staticmethod
    def drop_action(event: QDropEvent | QDragMoveEvent) -> Qt.DropAction:
        """Copy (add to the split) when Ctrl is held, else Move."""
        if event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            return Qt.DropAction.CopyAction
        return Qt.DropAction.MoveAction

    def _hover(self, on: bool) -> None:
        self.setProperty("dropHover", on)
        self.style().unpolish(self)
        self.style().polish(self)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802
        mods, _ = self.model.decode(event.mimeData())
        if mods:
            event.setDropAction(self.drop_action(event))
            event.accept()
            self._hover(True)
        else:
            event.ignore()

    def dragMoveEvent(self, event: QDragMoveEvent) -> None:  # noqa: N802
        action = self.drop_action(event)
        ok = self.model.canDropMimeData(event.mimeData(), action, -1, -1,
                                        self.model.target_index(self.target))
        if not ok and action == Qt.DropAction.CopyAction:
            mods, _ = self.model.decode(event.mimeData())
            bad = [m for m in mods if m not in SPLITTABLE]
            if bad:
                self.ctl.status.emit(self.ctl.split_refusal(bad[0]))
        event.setDropAction(action)
        event.setAccepted(ok)

    def dragLeaveEvent(self, event: object) -> None:  # noqa: N802
        self._hover(False)

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802
        self._hover(False)
        action = self.drop_action(event)
        # a refused split still reaches the model, which tells the user why
        self.model.dropMimeData(event.mimeData(), action, -1, -1,
                                self.model.target_index(self.target))
        event.setDropAction(action)
        event.accept()


class DeviceColumn(_DropFrame):
    """One device: header, memory bar, budget, and the cards placed on it."""

    def __init__(self, controller: PlanController, model: BoardModel, device: str,
                 parent: QWidget | None = None) -> None:
        super().__init__(controller, model, parent)
        self.target = device
        self.setObjectName("DeviceColumn")
        # at least 280 px, and never narrower than its cards (their texts are never cut)
        self.setMinimumWidth(0)
        dev = controller.device(device)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(14, 12, 14, 12)
        lay.setSpacing(8)
        head = QHBoxLayout()
        head.setSpacing(8)
        kind = "rpc" if dev.registry.upper() == "RPC" else dev.type
        icon = QLabel()
        icon.setPixmap(device_pixmap(kind, theme.current().muted, 22))
        icon.setToolTip({"gpu": "GPU", "igpu": "integrated GPU", "cpu": "CPU",
                         "accel": "accelerator", "rpc": "RPC device"}.get(kind, kind))
        head.addWidget(icon)
        name = QLabel(dev.name)
        name.setObjectName("Title")
        head.addWidget(name)
        badge = QLabel(dev.registry if dev.registry.upper() != dev.name.upper() else dev.type)
        badge.setObjectName("Badge")
        head.addWidget(badge)
        head.addStretch(1)
        self.verdict = QLabel()
        self.verdict.setObjectName("Verdict")
        head.addWidget(self.verdict)
        lay.addLayout(head)
        desc = WrapLabel(dev.description)
        desc.setObjectName("Muted")
        lay.addWidget(desc)
        if dev.device_id:
            pci = QLabel(f"PCI {dev.device_id}")
            pci.setObjectName("Caption")
            lay.addWidget(pci)
        self.bar = MemoryBar()
        self.bar.budgetDragged.connect(self._budget_dragged)
        lay.addWidget(self.bar)
        self.figures = WrapLabel()
        self.figures.setObjectName("Caption")
        lay.addWidget(self.figures)
        self.warnings = WrapLabel()
        self.warnings.setObjectName("Warning")
        self.warnings.hide()
        lay.addWidget(self.warnings)
        self.budget: QDoubleSpinBox | None = None
        if dev.is_gpu_like:
            row = QHBoxLayout()
            lab = QLabel("Budget")
            lab.setObjectName("Caption")
            row.addWidget(lab)
            self.budget = QDoubleSpinBox()
            self.budget.setRange(0.0, max(dev.total / GIB, 1.0))
            self.budget.setDecimals(1)
            self.budget.setSingleStep(0.5)
            self.budget.setSuffix(" GiB")
            self.budget.setSpecialValueText("none")
            self.budget.setKeyboardTracking(False)
            self.budget.setToolTip(f"--max-vram {dev.name}=GiB: run single-device modules "
                                   "in segments that fit this much memory (none = no budget). "
                                   "You can also drag the marker on the bar.")
            self.budget.valueChanged.connect(self._budget_spin)
            row.addWidget(self.budget)
            row.addStretch(1)
            lay.addLayout(row)
        sep = QFrame()
        sep.setFrameShape(QFrame.Shape.HLine)
        sep.setStyleSheet(f"color: {theme.current().border.name()};")
        lay.addWidget(sep)
        self.cards_box = QVBoxLayout()
        self.cards_box.setSpacing(8)
        lay.addLayout(self.cards_box)
        self.empty = QLabel("Drop a module here")
        self.empty.setObjectName("Caption")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay.addWidget(self.empty)
        lay.addStretch(1)
        self.cards: list[ModuleCard] = []
        self._updating = False

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        hint = super().minimumSizeHint()
        return QSize(max(280, hint.width()), hint.height())

    def _budget_spin(self, value: float) -> None:
        if not self._updating:
            self.ctl.set_budget(self.target, value or None)

    def _budget_dragged(self, value: float) -> None:
        self.ctl.set_budget(self.target, value or None, merge=True)

    def _signature(self, card: object) -> tuple:
        """Everything a card shows, to know when it must be rebuilt."""
        ctl = self.ctl
        m = card.module  # type: ignore[attr-defined]
        mp = ctl.plan.modules[m]
        prof = ctl.profile.get(m) if ctl.profile else None
        return (tuple(mp.devices), mp.params, tuple(mp.ranges), id(prof),
                tuple(d.name for d in ctl.inventory))

    def refresh(self) -> None:
        """Redraw from the controller's plan and fit."""
        ctl, name = self.ctl, self.target
        dev = ctl.device(name)
        fit = ctl.fit
        totals = fit.devices.get(name) if fit else None
        budget = ctl.plan.budgets.get(name, 0)
        segs: list[tuple[str, str, int]] = []
        if fit:
            for m, e in fit.modules.items():
                if e.weights.get(name):
                    segs.append((m, "weights", e.weights[name]))
                if e.lora.get(name):
                    segs.append((m, "lora", e.lora[name]))
            peak = max(fit.modules.values(), key=lambda e: e.staging.get(name, 0)
                       + e.compute.get(name, 0), default=None)
            if peak is not None:
                if peak.staging.get(name):
                    segs.append((peak.module, "staging", peak.staging[name]))
                if peak.compute.get(name):
                    segs.append((peak.module, "compute", peak.compute[name]))
        reasons = [r.split(": ", 1)[1] for r in (fit.reasons if fit else [])
                   if r.startswith(name + ":")]
        over = bool(reasons)
        headroom = min(SPLIT_RESERVE, dev.free * 7 // 8) if dev.is_gpu_like else 0
        self.bar.set_data(BarData(dev.total, dev.free, segs, headroom, budget,
                                  dev.is_gpu_like, over))
        planned = totals.total if totals else 0
        text = f"{gib(planned)} planned · {dev.free / GIB:.1f} free · {dev.total / GIB:.1f} " \
               "GiB total"
        self.figures.setText(text)
        tip = bar_tooltip(dev, segs, headroom, budget, planned, reasons)
        if fit is not None and hasattr(fit, "engine_label"):
            tip += f"\nestimate for {fit.engine_label()}"
        self.bar.setToolTip(tip)
        self.setProperty("over", over)
        self.verdict.setText("over" if over else ("fits" if planned else ""))
        self.verdict.setProperty("fits", not over)
        self.verdict.setToolTip("\n".join(reasons))
        for w in (self, self.verdict):
            w.style().unpolish(w)
            w.style().polish(w)
        if self.budget is not None:
            self._updating = True
            self.budget.setValue(budget / GIB)
            self._updating = False
        # rebuild only the cards whose content changed (a drag re-plans on every drop)
        wanted = [(card, self._signature(card)) for card in self.model.cards(name)]
        keep = {(c.card, c.signature): c for c in self.cards}
        cards: list[ModuleCard] = []
        for card, sig in wanted:
            widget = keep.pop((card, sig), None)
            if widget is None:
                widget = ModuleCard(ctl, self.model, name, card)
                widget.signature = sig
            else:
                widget.mark_over()  # fit figures change without a rebuild
            cards.append(widget)
        for old in keep.values():
            self.cards_box.removeWidget(old)
            old.hide()
            old.deleteLater()
        for i, widget in enumerate(cards):
            if self.cards_box.indexOf(widget) != i:
                self.cards_box.insertWidget(i, widget)
            widget.show()
        self.cards = cards
        self.empty.setVisible(not self.cards)
        self._take_focus()
        warns = device_warnings(ctl.plan, ctl.inventory, name)
        self.warnings.setText("\n".join("⚠ " + w for w in warns))
        self.warnings.setVisible(bool(warns))

    def _take_focus(self) -> None:
        """Give the keyboard focus to the card a keyboard move (or a residency key)
        asked for, once it is in this column."""
        req = self.model.focus_request
        if req is None or req[1] != self.target:
            return
        card = next((c for c in self.cards if c.module == req[0] and c.card.kind == "main"),
                    None)
        if card is not None:
            self.model.focus_request = None
            buttons = getattr(card, "residency_buttons", {})
            target = buttons.get(req[2]) if req[2] else None
            (target or card).setFocus(Qt.FocusReason.OtherFocusReason)


_PART_NAMES = {"weights": "resident weights", "lora": "LoRA", "staging": "staged range",
               "compute": "compute estimate"}


def bar_tooltip(dev: object, segs: list[tuple[str, str, int]], headroom: int, budget: int,
                planned: int, reasons: list[str]) -> str:
    """The memory bar's tooltip: the device's total/free/in-use memory, each bar segment
    (module, part, GiB), the headroom, the budget and what is left, all in GiB."""
    total, free = dev.total, dev.free  # type: ignore[attr-defined]
    lines = []
    if reasons:
        lines.append("✕ Does not fit: " + "; ".join(reasons))
    lines.append(f"{dev.name} — {dev.description}")  # type: ignore[attr-defined]
    lines.append(f"total {gib(total)} · free {gib(free)} · in use by other programs "
                 f"{gib(total - free)}")
    lines.append(f"this plan: {gib(planned)}")
    for m, part, b in segs:
        lines.append(f"    {_PART_NAMES.get(part, part)} · {m}: {gib(b)}")
    if headroom:
        lines.append(f"headroom (hatched end): {gib(headroom)} kept free by the layer-split "
                     "rule (free - 2 GiB, at most 7/8 of free)")
    if budget:
        lines.append(f"--max-vram budget (marker): {gib(budget)}")
    limit = min(free, budget) if budget else free
    lines.append(f"left: {gib(limit - planned)}" if planned <= limit
                 else f"short by {gib(planned - limit)}")
    if dev.is_gpu_like:  # type: ignore[attr-defined]
        lines.append("Drag the marker to set the budget (double-click the bar to place it)")
    return "\n".join(lines)


class DefaultTarget(_DropFrame):
    """The ``all=`` entry: the default device (and list), the default budget, and a drop
    target that makes a module follow the default."""

    def __init__(self, controller: PlanController, model: BoardModel,
                 parent: QWidget | None = None) -> None:
        super().__init__(controller, model, parent)
        self.setObjectName("DefaultTarget")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(14, 8, 14, 8)
        lay.setSpacing(10)
        t = QLabel("Default")
        t.setObjectName("Title")
        lay.addWidget(t)
        key = QLabel("all=")
        key.setObjectName("Badge")
        lay.addWidget(key)
        self.combo = QComboBox()
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.combo.setToolTip("The --backend default: every module without its own entry "
                              "runs here")
        self.combo.activated.connect(self._pick)
        lay.addWidget(self.combo)
        self.follows = QLabel()
        self.follows.setObjectName("Muted")
        self.follows.setWordWrap(True)  # wraps instead of widening the window
        self.follows.setMinimumWidth(90)
        lay.addWidget(self.follows, 1)
        blab = QLabel("Budget")
        blab.setObjectName("Caption")
        lay.addWidget(blab)
        self.budget = QDoubleSpinBox()
        self.budget.setRange(0.0, 1024.0)
        self.budget.setDecimals(1)
        self.budget.setSingleStep(0.5)
        self.budget.setSuffix(" GiB")
        self.budget.setSpecialValueText("none")
        self.budget.setKeyboardTracking(False)
        self.budget.setToolTip("--max-vram default for every GPU in GiB (none = no budget); "
                               "type a negative number in the --max-vram field to keep that "
                               "much free instead")
        self.budget.valueChanged.connect(self._budget)
        lay.addWidget(self.budget)
        self.setToolTip("Drop a module here to remove its own --backend entry so it follows "
                        "the default device")
        self._updating = False

    def _pick(self, i: int) -> None:
        self.ctl.set_default(self.combo.itemData(i))

    def _budget(self, value: float) -> None:
        if not self._updating:
            self.ctl.set_budget(None, value or None)

    def refresh(self) -> None:
        """Redraw from the plan."""
        self._updating = True
        pl = self.ctl.placement
        self.combo.clear()
        current = pl.default.text() if pl.default else ""
        for i, d in enumerate(self.ctl.inventory):
            self.combo.addItem(d.name, d.name)  # the name is never cut; the rest in tips
            self.combo.setItemData(i, f"{d.name} — {d.description}",
                                   Qt.ItemDataRole.ToolTipRole)
        if "&" in current:
            self.combo.addItem(current.replace("&", " & "), current.split("&"))
        idx = next((i for i in range(self.combo.count())
                    if self.combo.itemData(i) in (current, current.split("&"))), 0)
        self.combo.setCurrentIndex(idx)
        following = [m for m in self.ctl.modules() if m not in pl.runtime]
        self.follows.setText(("follows it: " + ", ".join(following)) if following
                             else "drop a module here to make it follow the default")
        self.budget.setValue(max(float(pl.budget_default), 0.0)
                             if pl.budget_default is not None else 0.0)
        self._updating = False
