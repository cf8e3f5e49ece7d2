"""The board: the Default target above one column per device, redrawn from the plan, with the
memory legend and the plan's predicted time (seconds per step and per picture) above them."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QScrollArea, QVBoxLayout, QWidget
from sdplan.app.board.columns import DefaultTarget, DeviceColumn
from sdplan.app.board.memory_bar import MemoryLegend
from sdplan.app.board.model import BoardModel
from sdplan.app.controller import PlanController

#: Pause (ms) after the last edit before the cards' residency effects are estimated.
EFFECTS_DELAY_MS = 150


class Board(QWidget):
    """Columns for the controller's inventory; rebuilt when devices change, refreshed on
    every plan change."""

    def __init__(self, controller: PlanController, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctl = controller
        self.model = BoardModel(controller)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(10)
        self.default = DefaultTarget(controller, self.model)
        lay.addWidget(self.default)
        legend_row = QHBoxLayout()
        legend_row.setContentsMargins(4, 0, 4, 0)
        self.legend = MemoryLegend()
        legend_row.addWidget(self.legend)
        legend_row.addStretch(1)
        self.time_label = QLabel()
        self.time_label.setObjectName("Muted")
        legend_row.addWidget(self.time_label)
        lay.addLayout(legend_row)
        self.hint = QLabel("Open model files (Ctrl+O or drop them on the window) to see their "
                           "modules, or add one from Plan → Add module.")
        self.hint.setObjectName("Muted")
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay.addWidget(self.hint)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        self.strip = QWidget()
        self.columns_box = QHBoxLayout(self.strip)
        self.columns_box.setContentsMargins(0, 0, 0, 0)
        self.columns_box.setSpacing(10)
        self.scroll.setWidget(self.strip)
        lay.addWidget(self.scroll, 1)
        self.columns: dict[str, DeviceColumn] = {}
        # what each residency would save is estimated once edits pause (not on every move
        # of a drag: two more estimates per card)
        self.effects_timer = QTimer(self)
        self.effects_timer.setSingleShot(True)
        self.effects_timer.setInterval(EFFECTS_DELAY_MS)
        self.effects_timer.timeout.connect(self.update_effects)
        self.rebuild()
        controller.inventoryChanged.connect(self.rebuild)
        controller.planChanged.connect(self.refresh)
        controller.modelChanged.connect(self.refresh)

    def rebuild(self) -> None:
        """New columns for the inventory's devices."""
        for col in self.columns.values():
            self.columns_box.removeWidget(col)
            col.hide()
            col.deleteLater()
        while self.columns_box.count():
            self.columns_box.takeAt(0)
        self.columns = {d.name: DeviceColumn(self.ctl, self.model, d.name)
                        for d in self.ctl.inventory}
        for col in self.columns.values():
            self.columns_box.addWidget(col, 1)
        self.refresh()

    def refresh(self, *_: object) -> None:
        """Redraw every column and the Default target from the plan."""
        if [d.name for d in self.ctl.inventory] != list(self.columns):
            self.rebuild()
            return
        self.default.refresh()
        for col in self.columns.values():
            col.refresh()
        self.hint.setVisible(not self.ctl.modules())
        self.update_time()
        self.effects_timer.start()

    def update_time(self) -> None:
        """The predicted time line (``~0.8 s/step, ~19 s/picture (load 3.0 s)``, ``· default
        speeds`` when a device has no measured profile), its tooltip the phases, the settings
        and the prediction's notes; hidden without a prediction."""
        rep = self.ctl.predicted_time()
        self.time_label.setVisible(rep is not None)
        if rep is None:
            self.time_label.clear()
            return
        s = rep.settings
        self.time_label.setText("Predicted time: " + rep.summary())
        tip = [f"Predicted for {s.steps} steps of {s.sampler}{' with CFG' if s.cfg else ''} at "
               f"{s.width}x{s.height}, batch {s.batch}: load {rep.load_s:.2f} s, text "
               f"{rep.text_s:.2f} s, sampling {rep.sampling_s:.2f} s, decode {rep.decode_s:.2f} s",
               "Speeds: " + ", ".join(f"{d} {v}" for d, v in rep.profiles.items())]
        if not rep.measured:
            tip.append("Measure them with: sdplan devices --calibrate")
        tip += rep.notes
        self.time_label.setToolTip("\n".join(tip))

    def update_effects(self) -> None:
        """Every card's residency-effect line, now."""
        self.effects_timer.stop()
        for col in self.columns.values():
            for card in col.cards:
                card.update_effect()
