"""Module cards: a module's name, size, encoders, residency switch and split strip.

Views only: every action calls the controller, which re-plans; the board then redraws
the cards from the new plan.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRectF, Qt, Signal
from PySide6.QtGui import (
    QAction,
    QColor,
    QContextMenuEvent,
    QDrag,
    QIcon,
    QKeyEvent,
    QMouseEvent,
    QPainter,
    QPaintEvent,
    QPen,
)
from PySide6.QtWidgets import (
    QApplication,
    QButtonGroup,
    QFrame,
    QHBoxLayout,
    QLabel,
    QMenu,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from sdplan.app import theme
from sdplan.app.board.model import BoardModel, Card
from sdplan.app.controller import PlanController
from sdplan.app.icons import dot_pixmap
from sdplan.app.warnings import module_warnings
from sdplan.app.wrap_label import WrapLabel
from sdplan.core.planning.modules import GIB, SPLITTABLE


def gib(nbytes: int | None) -> str:
    """Bytes as ``12.34 GiB`` (``-`` when unknown)."""
    return "-" if nbytes is None else f"{nbytes / GIB:.2f} GiB"


def split_label(device: str, first: int, last: int, main: bool, width: float,
                advance: object) -> str:
    """The longest label of a split segment that fits ``width`` pixels whole (never a cut
    one such as ``★CUDA(``): ``★CUDA0 0–18``, ``★CUDA0``, ``0–18``, then nothing (the
    tooltip has it all). ``advance(text)`` measures text in pixels."""
    star = "★" if main else ""
    for text in (f"{star}{device} {first}–{last}", f"{star}{device}", f"{first}–{last}"):
        if advance(text) <= width:  # type: ignore[operator]
            return text
    return ""


class SplitStrip(QWidget):
    """Block ranges of a split module, one segment per device (width by blocks), the main
    device starred."""

    def __init__(self, module: str, ranges: list[tuple[str, int, int]], main: str,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.module, self.ranges, self.main = module, ranges, main
        self.setMinimumHeight(30)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        tips = [f"{'★ ' if d == self.main else ''}{d}: blocks {a}-{b}" for d, a, b in ranges]
        self.setToolTip("Layer split (block ranges per device; ★ main device, which also "
                        "holds the non-block weights, inputs and outputs):\n" + "\n".join(tips))

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        t = theme.current()
        n = sum(b - a + 1 for _, a, b in self.ranges) or 1
        x, w = 0.0, self.width()
        base = theme.module_colour(self.module)
        for i, (dev, a, b) in enumerate(self.ranges):
            seg = w * (b - a + 1) / n
            c = QColor(base)
            c = c.darker(100 + 22 * i) if not t.dark else c.lighter(100 + 18 * i)
            p.setPen(Qt.PenStyle.NoPen)
            p.setBrush(c)
            p.drawRoundedRect(QRectF(x + 1, 0, seg - 2, 10), 3, 3)
            p.setPen(QPen(t.text))
            f = p.font()
            f.setPointSizeF(max(f.pointSizeF() * 0.8, 6.5))
            p.setFont(f)
            label = split_label(dev, a, b, dev == self.main, seg - 4,
                                p.fontMetrics().horizontalAdvance)
            if label:
                p.drawText(QRectF(x + 2, 12, seg - 4, 16), Qt.AlignmentFlag.AlignLeft
                           | Qt.AlignmentFlag.AlignVCenter, label)
            x += seg
        p.end()


class SegmentButton(QToolButton):
    """One button of a segmented row (the residency switch): Left/Right (and Home/End)
    ask for the neighbour (``stepTo``), which the card chooses like a radio group; the
    focus ring shows (``QToolButton#Segment:focus``)."""

    stepTo = Signal(object)  # the SegmentButton to choose

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("Segment")
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.row: list[SegmentButton] = []

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        keys = {Qt.Key.Key_Left: -1, Qt.Key.Key_Right: 1, Qt.Key.Key_Home: -99,
                Qt.Key.Key_End: 99}
        step = keys.get(Qt.Key(event.key()))
        if step is None or self not in self.row or event.modifiers() & \
                Qt.KeyboardModifier.AltModifier:
            super().keyPressEvent(event)
            return
        i = max(0, min(len(self.row) - 1, self.row.index(self) + step))
        if self.row[i] is not self:
            self.stepTo.emit(self.row[i])
        event.accept()


class ModuleCard(QFrame):
    """One module in a device column (see :class:`Card` for the kinds)."""

    changed = Signal()

    def __init__(self, controller: PlanController, model: BoardModel, device: str,
                 card: Card, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctl, self.model, self.device, self.card = controller, model, device, card
        self.module = card.module
        self.setObjectName("ModuleCard")
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setAccessibleName(f"{self.module} card on {device}")
        self._press: QPoint | None = None
        self.signature: tuple = ()
        self.effect_label: QLabel | None = None
        plan = controller.plan
        mp = plan.modules[self.module]
        self.devices = list(mp.devices)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(12, 8, 10, 8)
        lay.setSpacing(4)
        head = QHBoxLayout()
        head.setSpacing(6)
        swatch = QLabel()
        swatch.setPixmap(dot_pixmap(theme.module_colour(self.module), 10))
        head.addWidget(swatch)
        title = QLabel(theme.MODULE_TITLES.get(self.module, self.module))
        title.setStyleSheet("font-weight: 600;")
        head.addWidget(title)
        key = QLabel(self.module)
        key.setObjectName("Caption")
        head.addWidget(key)
        head.addStretch(1)
        size = controller.module_bytes(self.module)
        self.size_label = QLabel(gib(size) if card.kind != "part" else "")
        self.size_label.setObjectName("Muted")
        head.addWidget(self.size_label)
        lay.addLayout(head)
        missing = controller.session.missing_by_module().get(self.module)
        self.missing_label: WrapLabel | None = None
        if missing and card.kind != "part":
            source = controller.session.profile_source
            self.missing_label = WrapLabel(
                f"✕ not on this machine: {', '.join(missing)} — "
                + (f"sizes from {source}" if source and controller.profile is not None
                   else "sizes unknown"))
            self.missing_label.setObjectName("Warning")
            lay.addWidget(self.missing_label)
        if card.kind == "main":
            self._main_body(lay, mp)
        elif card.kind == "part":
            self._part_body(lay, mp)
        else:
            note = WrapLabel(f"weights kept here, staged to {' & '.join(mp.devices)} when it "
                             "runs")
            note.setObjectName("Caption")
            lay.addWidget(note)
        self.warning_label = WrapLabel()
        self.warning_label.setObjectName("Warning")
        lay.addWidget(self.warning_label)
        self.mark_over()

    # ------------------------------------------------------------------ bodies
    def _main_body(self, lay: QVBoxLayout, mp: object) -> None:
        prof = self.ctl.profile.get(self.module) if self.ctl.profile else None
        if self.module == "te" and prof is not None and prof.encoders:
            enc = "  ·  ".join(f"{e} {v / GIB:.2f}" for e, v in prof.encoders.items())
            lab = WrapLabel(enc + " GiB")
            lab.setObjectName("Caption")
            lab.setToolTip("Text encoders in this module; with a layer split only "
                           f"{prof.block_encoder or 'the largest'} is split, the others stay "
                           "on the main device")
            lay.addWidget(lab)
        ranges = [(r.device, r.first_block, r.last_block) for r in mp.ranges]  # type: ignore[attr-defined]
        if len(self.devices) > 1:
            if ranges:
                lay.addWidget(SplitStrip(self.module, ranges, self.devices[0]))
            else:
                lab = WrapLabel("split over " + " & ".join(self.devices) + " (load the model for "
                             "block ranges)")
                lab.setObjectName("Caption")
                lay.addWidget(lab)
        lay.addLayout(self._residency_row(mp))
        self.effect_label = WrapLabel()
        self.effect_label.setObjectName("Caption")
        self.effect_label.hide()
        lay.addWidget(self.effect_label)

    def _part_body(self, lay: QVBoxLayout, mp: object) -> None:
        rng = next((r for r in mp.ranges if r.device == self.device), None)  # type: ignore[attr-defined]
        text = (f"blocks {rng.first_block}–{rng.last_block} · {gib(rng.bytes)}" if rng
                else "no blocks (too little memory)")
        row = QHBoxLayout()
        lab = WrapLabel(f"{text} · main: ★{self.devices[0]}")
        lab.setObjectName("Caption")
        row.addWidget(lab, 1)
        rm = QToolButton()
        rm.setText("✕")
        rm.setAutoRaise(True)
        rm.setToolTip(f"Remove {self.device} from the {self.module} split")
        rm.clicked.connect(lambda: self.ctl.remove_split_device(self.module, self.device))
        row.addWidget(rm)
        lay.addLayout(row)

    def _residency_row(self, mp: object) -> QHBoxLayout:
        row = QHBoxLayout()
        row.setSpacing(0)
        lab = QLabel("Weights")
        lab.setObjectName("Caption")
        row.addWidget(lab)
        row.addSpacing(8)
        params = mp.params  # type: ignore[attr-defined]
        self.residency_buttons: dict[str, QToolButton] = {}
        group = QButtonGroup(self)
        specs = (("runtime", "On device", "Weights live on the device that runs the module "
                  "(--params-backend follows --backend)"),
                 ("device", "In RAM", "Weights live in RAM (or on another device you choose) "
                  "and are copied to the device when the module runs: "
                  f"--params-backend {self.module}=CPU"),
                 ("disk", "Disk", "Nothing stays loaded: weights are read from the model file "
                  f"each time the module runs: --params-backend {self.module}=disk"))
        row_buttons: list[SegmentButton] = []
        for mode, text, tip in specs:
            b = SegmentButton()
            b.setProperty("mode", mode)
            row_buttons.append(b)
            b.row = row_buttons
            b.stepTo.connect(self._step_to)
            b.setCheckable(True)
            b.setText(text)
            b.setToolTip(tip + "\n(Left/Right: the other choices)")
            b.setMinimumWidth(b.sizeHint().width())  # the text is never elided
            b.setChecked(params.mode == mode)
            group.addButton(b)
            self.residency_buttons[mode] = b
            row.addWidget(b)
        if params.mode == "device" and params.device:
            cpu = self._cpu_name()
            if params.device != cpu:
                self.residency_buttons["device"].setText(f"On {params.device}")
        self.residency_buttons["runtime"].clicked.connect(
            lambda: self.ctl.set_residency(self.module, "runtime"))
        self.residency_buttons["disk"].clicked.connect(
            lambda: self.ctl.set_residency(self.module, "disk"))
        self.residency_buttons["device"].clicked.connect(self._to_ram)
        menu = QMenu(self)
        menu.aboutToShow.connect(lambda: self._fill_weights_menu(menu))
        self.residency_buttons["device"].setMenu(menu)
        self.residency_buttons["device"].setPopupMode(
            QToolButton.ToolButtonPopupMode.DelayedPopup)
        row.addStretch(1)
        return row

    def _step_to(self, button: SegmentButton) -> None:
        """Arrow key in the residency row: choose ``button``; the rebuilt card's same
        button gets the focus back."""
        self.model.focus_request = (self.module, self.device, button.property("mode"))
        button.setFocus(Qt.FocusReason.TabFocusReason)
        button.click()

    def _fill_weights_menu(self, menu: QMenu) -> None:
        """Devices to keep the weights on (built when the menu opens: cards are rebuilt often)."""
        menu.clear()
        for d in self.ctl.inventory:
            act = menu.addAction(f"Keep weights on {d.name}")
            act.triggered.connect(lambda _=False, n=d.name: self.ctl.set_residency(
                self.module, "device", n))

    def _cpu_name(self) -> str | None:
        return next((d.name for d in self.ctl.inventory if d.type == "cpu"), None)

    def _to_ram(self) -> None:
        cpu = self._cpu_name()
        if cpu is None:
            self.ctl.status.emit("no CPU device in this inventory to keep weights in RAM")
            return
        self.ctl.set_residency(self.module, "device", cpu)

    def mark_over(self) -> None:
        """Red border, red size and the reason in the tooltip when its device is over."""
        fit = self.ctl.fit
        reasons = [r for r in (fit.reasons if fit else []) if r.startswith(self.device + ":")]
        est = fit.modules.get(self.module) if fit else None
        mine = est is not None and self.device in {*est.weights, *est.staging, *est.compute}
        over = bool(reasons) and mine
        if self.property("over") != over:
            self.setProperty("over", over)
            self.style().unpolish(self)
            self.style().polish(self)
        tip = [f"{theme.MODULE_TITLES.get(self.module, self.module)} on {self.device}"]
        if est is not None:
            for part in ("weights", "staging", "compute"):
                v = getattr(est, part).get(self.device)
                if v:
                    tip.append(f"{part}: {gib(v)}")
        tip.append("Drag to a device to run it there" + (
            "; Ctrl+drag adds the device to its layer split" if self.module in SPLITTABLE
            else ""))
        tip.append("Right-click (or the Menu key) for all placement actions")
        if over:
            tip.insert(1, "Does not fit: " + "; ".join(r.split(": ", 1)[1] for r in reasons))
        self.size_label.setStyleSheet(f"color: {theme.DANGER};" if over else "")
        tip.append("Alt+Left/Right moves it to the previous/next device")
        self.setToolTip("\n".join(tip))
        warns = module_warnings(self.ctl.plan, self.ctl.inventory, self.module) \
            if self.card.kind == "main" else []
        self.warning_label.setText("\n".join("⚠ " + w for w in warns))
        self.warning_label.setVisible(bool(warns))

    def update_effect(self) -> None:
        """Redraw the residency-effect line (the board calls it once a drag pauses: it
        estimates the plan once per other residency)."""
        if self.effect_label is not None:
            text = self.effect_text()
            if text != self.effect_label.text():
                self.effect_label.setText(text)
            self.effect_label.setVisible(bool(text))

    def effect_text(self) -> str:
        """What the other residencies would change on the runtime device (and where the
        weights would go), or why they would change nothing there."""
        effects = self.ctl.residency_effects(self.module)
        if not effects:
            return ""
        dev = self.devices[0]
        titles = {"runtime": "On device", "device": "In RAM", "disk": "Disk"}
        parts = []
        for mode, deltas in effects.items():
            d = deltas.get(dev, 0)
            others = [f"+{gib(-v)} on {n}" for n, v in deltas.items()
                      if n != dev and v < -(GIB // 200)]
            tail = f" ({', '.join(others)})" if others else ""
            if d > GIB // 200:
                parts.append(f"{titles[mode]} saves {gib(d)} on {dev}{tail}")
            elif d < -(GIB // 200):
                parts.append(f"{titles[mode]} needs {gib(-d)} more on {dev}{tail}")
            else:
                parts.append(f"{titles[mode]}: no change on {dev}")
        if all(abs(v.get(dev, 0)) <= GIB // 200 for v in effects.values()):
            peak = self.ctl.peak_module(dev)
            if peak is not None and peak[0] == self.module:
                prof = self.ctl.profile.get(self.module) if self.ctl.profile else None
                why = (f": they are copied back while {self.module} runs, the peak there"
                       + (" (a --max-vram budget runs it in segments)"
                          if prof is not None and prof.blocks else ""))
            else:
                why = f": {peak[0]}'s {peak[1]} sets its peak" if peak else ""
            return f"Moving the weights changes nothing on {dev}{why}"
        return " · ".join(parts)

    # ------------------------------------------------------------------ drag
    def mousePressEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        if event.button() == Qt.MouseButton.LeftButton:
            self._press = event.position().toPoint()
        super().mousePressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:  # noqa: N802
        if self._press is None or self.card.kind == "weights":
            return
        if (event.position().toPoint() - self._press).manhattanLength() < \
                QApplication.startDragDistance():
            return
        self._press = None
        drag = QDrag(self)
        drag.setMimeData(self.model.mimeData([self.model.card_index(
            self.device, self.module, self.card.kind)]))
        drag.setPixmap(self.grab())
        drag.exec(Qt.DropAction.MoveAction | Qt.DropAction.CopyAction, Qt.DropAction.MoveAction)

    # ------------------------------------------------------------------ menu
    def build_menu(self) -> QMenu:
        """The card's context menu: run on, add to split, remove from split, follow the
        default, weights (the keyboard path to every drag action)."""
        menu = QMenu(self)
        run = menu.addMenu("Run on")
        split = menu.addMenu("Add to layer split")
        for d in self.ctl.inventory:
            a = run.addAction(QIcon(), d.name)
            a.triggered.connect(lambda _=False, n=d.name: self.ctl.assign(self.module, n))
            if d.name in self.devices:
                a.setEnabled(len(self.devices) > 1)
            s = split.addAction(d.name)
            s.setEnabled(self.module in SPLITTABLE and d.name not in self.devices)
            s.triggered.connect(lambda _=False, n=d.name: self.ctl.add_split_device(
                self.module, n))
        if self.module not in SPLITTABLE:
            split.setEnabled(False)
            split.setToolTip(self.ctl.split_refusal(self.module))
            split.setTitle("Add to layer split (not possible for this module)")
        if len(self.devices) > 1:
            rm = menu.addMenu("Remove from layer split")
            for d in self.devices:
                a = rm.addAction(d)
                a.triggered.connect(lambda _=False, n=d: self.ctl.remove_split_device(
                    self.module, n))
        fd = QAction("Follow the default device (all=)", menu)
        fd.triggered.connect(lambda: self.ctl.follow_default(self.module))
        menu.addAction(fd)
        menu.addSeparator()
        w = menu.addMenu("Weights")
        for mode, text in (("runtime", "On the runtime device"), ("disk", "On disk")):
            a = w.addAction(text)
            a.triggered.connect(lambda _=False, m=mode: self.ctl.set_residency(self.module, m))
        for d in self.ctl.inventory:
            a = w.addAction(f"On {d.name}")
            a.triggered.connect(lambda _=False, n=d.name: self.ctl.set_residency(
                self.module, "device", n))
        return menu

    def contextMenuEvent(self, event: QContextMenuEvent) -> None:  # noqa: N802
        self.build_menu().exec(event.globalPos())

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        """Alt+Left/Right: run the module on the previous/next device (the new card
        takes the focus); Shift+F10 or the Menu key: the context menu."""
        step = {Qt.Key.Key_Left: -1, Qt.Key.Key_Right: 1}.get(Qt.Key(event.key()))
        if step is not None and event.modifiers() & Qt.KeyboardModifier.AltModifier \
                and self.card.kind != "weights":
            self.move_by(step)
            event.accept()
            return
        super().keyPressEvent(event)

    def move_by(self, step: int) -> bool:
        """Run the module on the device ``step`` columns away from this one (no wrap)."""
        names = [d.name for d in self.ctl.inventory]
        i = names.index(self.device) + step
        if not 0 <= i < len(names):
            return False
        self.model.focus_request = (self.module, names[i], None)
        return self.ctl.assign(self.module, names[i])
