"""The generation panel's settings form: size (with the model's presets and a note for a
size far from its training), steps and CFG, seed with a dice, sampler and scheduler, batch,
and a video family's frames and frame rate. The widgets become attributes of the panel
(``width_box``, ``height_box``, ``size_preset``, ``size_note``, ``steps``, ``cfg``, ``seed``,
``dice``, ``sampler``, ``schedule``, ``batch``, ``video_fields``, ``high_noise``: the
high-noise phase of a two-stage model, :mod:`sdplan.app.high_noise`)."""

from __future__ import annotations

import random
from typing import Any

from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QToolButton,
)
from sdplan.app.high_noise import HighNoiseGroup
from sdplan.app.video import VideoFields
from sdplan.core.sampling.samplers import SAMPLERS
from sdplan.core.sampling.schedules import SCHEDULES

#: The most steps the panel takes: the command line's limit
#: (``sdplan.core.pipelines.limits.MAX_STEPS``; discrete schedules have 1000 timesteps).
MAX_STEPS = 1000


class WrappedLabel(QLabel):
    """A word-wrapped label that keeps the height its text needs at its width: a form row
    gives a wrapped label one line's height, so a second line was drawn over the next row."""

    def __init__(self, text: str = "") -> None:
        super().__init__(text)
        self.setWordWrap(True)

    def _fit(self) -> None:
        width = self.width() if self.width() > 50 else max(self.sizeHint().width(), 200)
        self.setMinimumHeight(self.heightForWidth(width) if self.text() else 0)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        super().setText(text)
        self._fit()

    def resizeEvent(self, event: object) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)  # type: ignore[arg-type]
        if self.minimumHeight() != (self.heightForWidth(self.width()) if self.text() else 0):
            self._fit()


def settings_form(panel: Any) -> QFormLayout:
    """The form of the settings widgets, made attributes of ``panel`` (a
    :class:`~sdplan.app.generation.GenerationPanel`, whose preset and state slots they call)."""
    form = QFormLayout()
    form.setHorizontalSpacing(10)
    form.setVerticalSpacing(6)
    size = QHBoxLayout()
    panel.width_box, panel.height_box = QSpinBox(), QSpinBox()
    for box in (panel.width_box, panel.height_box):
        box.setRange(64, 4096)
        box.setSingleStep(64)
        box.setSuffix(" px")
        box.setKeyboardTracking(False)
    size.setSpacing(8)
    size.addWidget(panel.width_box, 1)
    size.addWidget(QLabel("×"))
    size.addWidget(panel.height_box, 1)
    form.addRow("Size", size)
    panel.size_preset = QComboBox()
    panel.size_preset.setToolTip("Sizes the loaded model was trained for")
    panel.size_preset.activated.connect(panel._apply_preset)
    for box in (panel.width_box, panel.height_box):
        box.valueChanged.connect(panel._show_preset)
        box.valueChanged.connect(panel.update_state)
    form.addRow("Preset", panel.size_preset)
    panel.size_note = WrappedLabel()
    panel.size_note.setObjectName("Warning")
    panel.size_note.hide()
    form.addRow(panel.size_note)
    panel.steps = QSpinBox()
    panel.steps.setRange(1, MAX_STEPS)  # typing 250 gives 250
    panel.steps.setKeyboardTracking(False)
    panel.cfg = QDoubleSpinBox()
    panel.cfg.setRange(0.0, 30.0)
    panel.cfg.setSingleStep(0.5)
    sc = QHBoxLayout()
    sc.setSpacing(8)
    sc.addWidget(panel.steps, 1)
    cfg_label = QLabel("CFG")
    cfg_label.setContentsMargins(8, 0, 0, 0)
    cfg_label.setToolTip("Classifier-free guidance scale (--cfg-scale)")
    sc.addWidget(cfg_label)
    sc.addWidget(panel.cfg, 1)
    form.addRow("Steps", sc)
    seed_row = QHBoxLayout()
    panel.seed = QSpinBox()
    panel.seed.setRange(-1, 2**31 - 1)
    panel.seed.setSpecialValueText("random")
    panel.dice = QToolButton()
    panel.dice.setText("⚄")
    panel.dice.setToolTip("New random seed")
    panel.dice.clicked.connect(lambda: panel.seed.setValue(random.randrange(2**31 - 1)))
    seed_row.addWidget(panel.seed, 1)
    seed_row.addWidget(panel.dice)
    form.addRow("Seed", seed_row)
    panel.sampler, panel.schedule = QComboBox(), QComboBox()
    panel.sampler.addItems(SAMPLERS)
    panel.schedule.addItems(SCHEDULES)
    ss = QHBoxLayout()
    ss.addWidget(panel.sampler, 1)
    ss.addWidget(panel.schedule, 1)
    form.addRow("Sampler", ss)
    panel.batch = QSpinBox()
    panel.batch.setRange(1, 64)
    form.addRow("Batch", panel.batch)
    panel.video_fields = VideoFields()  # shown for a family that makes video
    form.addRow(panel.video_fields)
    panel.high_noise = HighNoiseGroup(panel.ctl)  # shown for a family with a high-noise phase
    form.addRow(panel.high_noise)
    return form
