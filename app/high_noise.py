"""The generation panel's high-noise phase group: a two-stage diffusion model's first expert
(``--high-noise-diffusion-model``, the ``diffusion`` module's ``high_noise`` phase on the board)
and the options of its phase, as sd-cli's ``examples/common`` reads them: ``--high-noise-steps``
(-1: the boundary decides), ``--high-noise-cfg-scale`` (7), ``--high-noise-sampling-method``
and ``--high-noise-eta`` (the low-noise phase's when not given) and ``--moe-boundary`` (0.875).

Shown only while the open family (and variant) honours them, as its registry entry says
(:func:`sdplan.core.session.modules.takes_high_noise`: Wan 2.x). :meth:`HighNoiseGroup.settings`
gives sd-cli's request keys (:class:`~sdplan.core.pipelines.request_parts.VideoSettings`), all
None for other families; the expert file joins the board's model files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QSpinBox,
    QToolButton,
)
from sdplan.app.wrap_label import ElidedLabel
from sdplan.core.errors import SdplanError
from sdplan.core.pipelines.limits import MAX_STEPS
from sdplan.core.pipelines.request_parts import VideoSettings
from sdplan.core.sampling.names import SAMPLERS
from sdplan.core.session.modules import HIGH_NOISE_FLAGS, takes_high_noise

__all__ = ["HighNoiseGroup", "EXPERT_KEY", "SAME_SAMPLER"]

#: The model-file key of the high-noise expert (sd-cli's ``--high-noise-diffusion-model``).
EXPERT_KEY = "high_noise_diffusion_model"
#: The sampler entry that leaves ``--high-noise-sampling-method`` out (the low-noise one's).
SAME_SAMPLER = "same as low noise"
MODEL_FILTER = "Models (*.safetensors *.gguf);;All files (*)"
#: sd-cli's defaults of the phase (steps -1, CFG 7, eta and sampler unset, boundary 0.875).
_D = VideoSettings()
#: The eta box's lowest value, shown as "same": ``--high-noise-eta`` left out.
_ETA_UNSET = -0.05


class HighNoiseGroup(QGroupBox):
    """See the module docstring. ``controller`` is the board's
    :class:`~sdplan.app.controller.PlanController` (the expert file is one of its model files).
    Emits :attr:`changed` when a phase option changes."""

    changed = Signal()

    def __init__(self, controller: Any) -> None:
        super().__init__("High-noise phase")
        self.ctl = controller
        self.active = False
        self.setToolTip("A two-stage model (Wan 2.2 A14B): its high-noise expert runs the first "
                        "steps, the --diffusion-model the rest")
        form = QFormLayout(self)
        form.setHorizontalSpacing(10)
        form.setVerticalSpacing(4)
        row = QHBoxLayout()
        self.expert = ElidedLabel()
        self.expert.setObjectName("Caption")
        self.choose_btn = QToolButton()
        self.choose_btn.setText("Choose…")
        self.choose_btn.setToolTip("--high-noise-diffusion-model: the high-noise expert's file")
        self.choose_btn.clicked.connect(lambda: self.set_expert(None, ask=True))
        self.remove_btn = QToolButton()
        self.remove_btn.setText("Remove")
        self.remove_btn.setToolTip("Run every step on the --diffusion-model")
        self.remove_btn.clicked.connect(lambda: self.set_expert(None))
        row.addWidget(self.expert, 1)
        row.addWidget(self.choose_btn)
        row.addWidget(self.remove_btn)
        form.addRow("Expert", row)
        self.steps = QSpinBox()
        self.steps.setRange(-1, MAX_STEPS)
        self.steps.setSpecialValueText("by boundary")
        self.steps.setKeyboardTracking(False)
        self.steps.setToolTip("--high-noise-steps: steps of the high-noise phase (-1: the boundary decides)")
        self.cfg = QDoubleSpinBox()
        self.cfg.setRange(0.0, 30.0)
        self.cfg.setSingleStep(0.5)
        self.cfg.setToolTip("--high-noise-cfg-scale: the high-noise phase's CFG (sd-cli's 7)")
        sc = QHBoxLayout()
        sc.addWidget(self.steps, 1)
        cfg_label = QLabel("CFG")
        cfg_label.setContentsMargins(8, 0, 0, 0)
        sc.addWidget(cfg_label)
        sc.addWidget(self.cfg, 1)
        form.addRow("Steps", sc)
        self.sampler = QComboBox()
        self.sampler.addItems([SAME_SAMPLER, *SAMPLERS])
        self.sampler.setToolTip("--high-noise-sampling-method (left out: the low-noise phase's)")
        self.eta = QDoubleSpinBox()
        self.eta.setRange(_ETA_UNSET, 10.0)
        self.eta.setSingleStep(0.05)
        self.eta.setSpecialValueText("same eta")
        self.eta.setToolTip("--high-noise-eta (left out: the low-noise phase's)")
        se = QHBoxLayout()
        se.addWidget(self.sampler, 1)
        se.addWidget(self.eta, 1)
        form.addRow("Sampler", se)
        self.boundary = QDoubleSpinBox()
        self.boundary.setRange(0.0, 1.0)
        self.boundary.setDecimals(3)
        self.boundary.setSingleStep(0.025)
        self.boundary.setToolTip("--moe-boundary: the timestep fraction where the low-noise expert takes "
                                 "over (sd-cli's 0.875)")
        form.addRow("Boundary", self.boundary)
        self.note = QLabel()
        self.note.setObjectName("Error")
        self.note.setWordWrap(True)
        self.note.hide()
        form.addRow(self.note)
        self._reset()
        for box in (self.steps, self.cfg, self.eta, self.boundary):
            box.valueChanged.connect(lambda *_: self.changed.emit())
        self.sampler.currentIndexChanged.connect(lambda *_: self.changed.emit())
        self.hide()

    def _reset(self) -> None:
        self.steps.setValue(_D.high_steps)
        self.cfg.setValue(_D.high_cfg_scale)
        self.sampler.setCurrentIndex(0)
        self.eta.setValue(_ETA_UNSET)
        self.boundary.setValue(_D.moe_boundary)

    def set_model(self, architecture: str | None, model_files: Mapping[str, Any]) -> None:
        """Show the group when the family of ``architecture`` takes the high-noise options,
        hide it otherwise; name the expert file among ``model_files``."""
        self.active = takes_high_noise(architecture)
        self.setVisible(self.active)
        files = model_files.get(EXPERT_KEY) or []
        self.expert.setText(Path(files[0]).name if files else "none")
        self.expert.setToolTip(str(files[0]) if files else "No high-noise expert: every step runs on the "
                               "--diffusion-model; choose the expert's file")
        self.remove_btn.setEnabled(bool(files))

    def set_expert(self, path: str | None, *, ask: bool = False) -> bool:
        """Load ``path`` as the high-noise expert (None: remove it; ``ask``: choose the file
        in a dialog) beside the open model files, as one board change. A file that cannot be
        read is said in one line under the group (the open files stay). Returns whether the
        files changed."""
        if ask:
            path, _ = QFileDialog.getOpenFileName(self, "High-noise expert", "", MODEL_FILTER)
            if not path:
                return False
        files = {k: list(v) for k, v in self.ctl.model_files.items() if k != EXPERT_KEY}
        if path:
            files[EXPERT_KEY] = [str(path)]
        try:
            self.ctl.load_model_files(files)
        except (SdplanError, OSError, ValueError) as exc:
            self.note.setText(f"--high-noise-diffusion-model {Path(str(path)).name}: {exc}")
            self.note.show()
            return False
        self.note.hide()
        return True

    def settings(self) -> dict[str, Any]:
        """sd-cli's request keys of the phase (:data:`~sdplan.core.session.modules.HIGH_NOISE_FLAGS`'
        keys; None each while the family takes none)."""
        if not self.active:
            return dict.fromkeys(HIGH_NOISE_FLAGS.values())
        eta = self.eta.value()
        return {"high_noise_steps": self.steps.value(), "high_noise_cfg_scale": round(self.cfg.value(), 2),
                "high_noise_sampling_method": self.sampler.currentText() if self.sampler.currentIndex() else None,
                "high_noise_eta": None if eta <= _ETA_UNSET + 1e-9 else round(eta, 2),
                "moe_boundary": round(self.boundary.value(), 3)}

    def load(self, g: Mapping[str, Any]) -> None:
        """Show the phase options of settings ``g`` (absent or None: sd-cli's defaults),
        without emitting."""
        self.blockSignals(True)
        try:
            self._reset()
            if g.get("high_noise_steps") is not None:
                self.steps.setValue(int(g["high_noise_steps"]))
            if g.get("high_noise_cfg_scale") is not None:
                self.cfg.setValue(float(g["high_noise_cfg_scale"]))
            i = self.sampler.findText(str(g.get("high_noise_sampling_method") or ""))
            self.sampler.setCurrentIndex(max(i, 0))
            if g.get("high_noise_eta") is not None:
                self.eta.setValue(float(g["high_noise_eta"]))
            if g.get("moe_boundary") is not None:
                self.boundary.setValue(float(g["moe_boundary"]))
        finally:
            self.blockSignals(False)
