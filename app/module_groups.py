"""The generation panel's groups for what a run adds beyond its model set, as sd-cli's flags
mean them: the hires fix (``--hires``: scale or size, steps, denoising strength, upscaler,
ESRGAN models found in a folder), VAE tiling (``--vae-tiling``: tile size WxH in image
pixels, overlap, relative size) and ControlNet (``--control-net``: model file, control
picture, strength, Canny).

Each group is a checkable box; :meth:`ModuleGroups.settings` gives sd-cli's request keys as
``sdplan generate`` builds them from the same flags (``hires``, ``vae_tiling``,
``control_net``, ``control_image``, ``control_strength``, ``canny``). A group the open
family cannot run is disabled, with the family's refusal as its tooltip and one line under
it (:func:`sdplan.core.session.modules.option_refusals`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from sdplan.core.errors import PlanError
from sdplan.core.pipelines.request_parts import HIRES_UPSCALERS, HiresFix
from sdplan.core.planning.vae_tiling import VaeTiling, parse_relative_size
from sdplan.core.session.modules import esrgan_models, option_refusals

#: Largest hires or tile side (pixels), as ``sdplan generate`` takes it.
MAX_SIDE = 16384
#: What the groups' file buttons ask for.
MODEL_FILTER = "Models (*.safetensors *.gguf *.pth *.pt *.ckpt);;All files (*)"
IMAGE_FILTER = "Pictures (*.png *.jpg *.jpeg *.webp *.bmp);;All files (*)"


def _spin(low: int, high: int, step: int, special: str = "") -> QSpinBox:
    box = QSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setKeyboardTracking(False)
    if special:
        box.setSpecialValueText(special)
    return box


def _dspin(low: float, high: float, step: float, decimals: int = 2) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setDecimals(decimals)
    box.setKeyboardTracking(False)
    return box


def _path_row(edit: QLineEdit, button: QToolButton) -> QHBoxLayout:
    row = QHBoxLayout()
    row.setSpacing(6)
    row.addWidget(edit, 1)
    row.addWidget(button)
    return row


class ModuleGroups(QWidget):
    """The hires fix, VAE tiling and ControlNet groups (module docstring). ``changed`` is
    emitted on every edit; ``ask_path(title, filter, folder)`` picks a file (a folder with
    ``folder`` True; tests pass their own), returning "" when none was chosen."""

    changed = Signal()

    def __init__(self, ask_path: Callable[[str, str, bool], str] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ask_path = ask_path or self._dialog
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(6)
        self.groups: dict[str, QGroupBox] = {}
        self.notes: dict[str, QLabel] = {}
        self.refusals: dict[str, str | None] = {}
        self._tips: dict[str, str] = {}
        self._hires(lay)
        self._tiling(lay)
        self._control(lay)
        for box in self.groups.values():
            box.setChecked(False)
            box.toggled.connect(self._emit)

    # ------------------------------------------------------------------ building
    def _group(self, lay: QVBoxLayout, key: str, title: str, tip: str) -> QFormLayout:
        box = QGroupBox(title)
        box.setCheckable(True)
        box.setToolTip(tip)
        self._tips[key] = tip
        body = QWidget()  # shown while the group is on: an unchecked group is its title alone
        body.setVisible(False)
        inner = QVBoxLayout(box)
        inner.setContentsMargins(0, 0, 0, 0)
        inner.addWidget(body)

        def show(on: bool) -> None:
            body.setVisible(on)
            inner.setContentsMargins(*((8, 2, 8, 4) if on else (0, 0, 0, 0)))

        box.toggled.connect(show)
        form = QFormLayout(body)
        form.setContentsMargins(0, 0, 0, 0)
        form.setHorizontalSpacing(8)
        form.setVerticalSpacing(4)
        lay.addWidget(box)
        note = QLabel()  # the family's refusal, under its group
        note.setObjectName("Caption")
        note.setWordWrap(True)
        note.hide()
        lay.addWidget(note)
        self.groups[key] = box
        self.notes[key] = note
        return form

    def _hires(self, lay: QVBoxLayout) -> None:
        form = self._group(lay, "hires", "Hires fix", "A second pass at a larger size (--hires)")
        d = HiresFix()
        self.hires_mode = QComboBox()
        self.hires_mode.addItems(["scale", "size"])
        self.hires_scale = _dspin(0.25, 16.0, 0.25)
        self.hires_scale.setValue(d.scale)
        self.hires_scale.setSuffix(" ×")
        self.hires_width = _spin(0, MAX_SIDE, 64)
        self.hires_height = _spin(0, MAX_SIDE, 64)
        for box in (self.hires_width, self.hires_height):
            box.setSuffix(" px")
            box.setValue(1024)
        target = QHBoxLayout()
        target.setSpacing(6)
        target.addWidget(self.hires_mode)
        target.addWidget(self.hires_scale, 1)
        form.addRow("Target", target)
        size = QHBoxLayout()
        size.setSpacing(6)
        size.addWidget(self.hires_width, 1)
        size.addWidget(QLabel("×"))
        size.addWidget(self.hires_height, 1)
        form.addRow("Size", size)
        self._form = form
        self.hires_steps = _spin(0, 1000, 1, "same")
        self.hires_steps.setToolTip("Second pass steps (--hires-steps; same: the first pass's)")
        self.hires_strength = _dspin(0.01, 1.0, 0.05)
        self.hires_strength.setValue(d.denoising_strength)
        self.hires_strength.setToolTip("How much the second pass changes the upscaled picture "
                                       "(--hires-denoising-strength)")
        steps = QHBoxLayout()
        steps.addWidget(self.hires_steps, 1)
        steps.addWidget(QLabel("Denoise"))
        steps.addWidget(self.hires_strength, 1)
        form.addRow("Steps", steps)
        self.hires_upscaler = QComboBox()
        self.hires_upscaler.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.hires_upscaler.setMinimumContentsLength(12)
        self.hires_upscaler.setToolTip("Latent variants and Lanczos/Nearest are sd-cli's own; "
                                       "an ESRGAN model runs on the upscaler's device")
        self.hires_dir = QLineEdit()
        self.hires_dir.setPlaceholderText("ESRGAN models folder (--hires-upscalers-dir)")
        self.hires_dir_btn = QToolButton()
        self.hires_dir_btn.setText("…")
        self.hires_dir_btn.setToolTip("Choose the folder of ESRGAN models")
        self.hires_dir_btn.clicked.connect(self._choose_folder)
        self.hires_dir.editingFinished.connect(self._fill_upscalers)
        form.addRow("Upscaler", self.hires_upscaler)
        form.addRow("Models", _path_row(self.hires_dir, self.hires_dir_btn))
        self._fill_upscalers()
        self.hires_mode.currentIndexChanged.connect(self._show_mode)
        for w in (self.hires_scale, self.hires_width, self.hires_height, self.hires_steps):
            w.valueChanged.connect(self._emit)
        self.hires_strength.valueChanged.connect(self._emit)
        self.hires_upscaler.currentIndexChanged.connect(self._emit)
        self._show_mode()

    def _tiling(self, lay: QVBoxLayout) -> None:
        form = self._group(lay, "vae_tiling", "VAE tiling",
                           "Decode (and encode) the picture in overlapping tiles (--vae-tiling)")
        self.tile_width = _spin(0, MAX_SIDE, 32, "256")
        self.tile_height = _spin(0, MAX_SIDE, 32, "256")
        size = QHBoxLayout()
        size.setSpacing(6)
        for box in (self.tile_width, self.tile_height):
            box.setSuffix(" px")
            box.setToolTip("Tile side in image pixels (--vae-tile-size WxH; 256 by default)")
            box.valueChanged.connect(self._emit)
        size.addWidget(self.tile_width, 1)
        size.addWidget(QLabel("×"))
        size.addWidget(self.tile_height, 1)
        form.addRow("Tile", size)
        self.tile_overlap = _dspin(0.0, 0.5, 0.05)
        self.tile_overlap.setValue(0.5)
        self.tile_overlap.setToolTip("Overlap, a fraction of a tile (--vae-tile-overlap)")
        self.tile_overlap.valueChanged.connect(self._emit)
        self.tile_relative = QLineEdit()
        self.tile_relative.setPlaceholderText("off (0.5, or 2x2 tiles)")
        self.tile_relative.setToolTip("--vae-relative-tile-size: up to 1 a fraction of the "
                                      "picture, above 1 tiles per side; overrides the tile size")
        self.tile_relative.editingFinished.connect(self._emit)
        form.addRow("Overlap", self.tile_overlap)
        form.addRow("Relative", self.tile_relative)

    def _control(self, lay: QVBoxLayout) -> None:
        form = self._group(lay, "control", "ControlNet",
                           "A ControlNet steers the picture from a control picture (--control-net)")
        self.control_net = QLineEdit()
        self.control_net.setPlaceholderText("ControlNet model file")
        self.control_image = QLineEdit()
        self.control_image.setPlaceholderText("control picture")
        for edit, title, filt in ((self.control_net, "ControlNet model", MODEL_FILTER),
                                  (self.control_image, "Control picture", IMAGE_FILTER)):
            btn = QToolButton()
            btn.setText("…")
            btn.setToolTip(f"Choose the {title.lower()}")
            btn.clicked.connect(lambda _=False, e=edit, t=title, f=filt: self._choose_file(e, t, f))
            edit.editingFinished.connect(self._emit)
            form.addRow("Model" if edit is self.control_net else "Picture", _path_row(edit, btn))
        self.control_strength = _dspin(0.0, 2.0, 0.05)
        self.control_strength.setValue(0.9)
        self.control_strength.valueChanged.connect(self._emit)
        self.canny = QCheckBox("Canny edges")
        self.canny.setToolTip("Apply sd-cli's Canny preprocessor to the control picture (--canny)")
        self.canny.toggled.connect(self._emit)
        row = QHBoxLayout()
        row.addWidget(self.control_strength, 1)
        row.addWidget(self.canny)
        form.addRow("Strength", row)

    # ------------------------------------------------------------------ slots
    _loading = False

    def _emit(self, *_: object) -> None:
        if not self._loading:
            self.changed.emit()

    def _show_mode(self, *_: object) -> None:
        by_size = self.hires_mode.currentText() == "size"
        self.hires_scale.setEnabled(not by_size)
        self._form.setRowVisible(1, by_size)
        self._emit()

    @staticmethod
    def _dialog(title: str, filt: str, folder: bool) -> str:
        if folder:
            return QFileDialog.getExistingDirectory(None, title)
        return QFileDialog.getOpenFileName(None, title, "", filt)[0]

    def _choose_folder(self) -> None:
        folder = self.ask_path("ESRGAN models folder", "", True)
        if folder:
            self.hires_dir.setText(folder)
            self._fill_upscalers()

    def _choose_file(self, edit: QLineEdit, title: str, filt: str) -> None:
        path = self.ask_path(title, filt, False)
        if path:
            edit.setText(path)
            self._emit()

    def _fill_upscalers(self, keep: str | None = None) -> None:
        """sd-cli's upscalers, then the ESRGAN models the folder holds (by name)."""
        current = keep or self.hires_upscaler.currentText() or HiresFix().upscaler
        self.hires_upscaler.blockSignals(True)
        self.hires_upscaler.clear()
        self.hires_upscaler.addItems([n for n in HIRES_UPSCALERS if n != "None"])
        models = esrgan_models(self.hires_dir.text().strip())
        if models:
            self.hires_upscaler.insertSeparator(self.hires_upscaler.count())
            self.hires_upscaler.addItems(models)
        i = self.hires_upscaler.findText(current)
        if i < 0 and current:  # a recorded model name whose folder is not listed here
            self.hires_upscaler.addItem(current)
            i = self.hires_upscaler.count() - 1
        self.hires_upscaler.setCurrentIndex(max(i, 0))
        self.hires_upscaler.blockSignals(False)
        self._emit()

    # ------------------------------------------------------------------ state
    def set_refusals(self, architecture: str | None) -> None:
        """Disable each group the family of ``architecture`` cannot run, its refusal as the
        tooltip and one line under it."""
        self.refusals = option_refusals(architecture)
        for key, box in self.groups.items():
            why = self.refusals.get(key)
            box.setEnabled(why is None)
            box.setToolTip(why or self._tips[key])
            self.notes[key].setText(why or "")
            self.notes[key].setVisible(why is not None)

    def is_on(self, key: str) -> bool:
        """Whether group ``key`` is checked and its family runs it."""
        return self.groups[key].isChecked() and self.refusals.get(key) is None

    def relative(self) -> tuple[float, float] | None:
        """The relative tile size typed, or None (empty or not a size: the note says so)."""
        text = self.tile_relative.text().strip()
        if not text:
            return None
        try:
            return parse_relative_size(text)
        except PlanError:
            return None

    def settings(self) -> dict[str, Any]:
        """sd-cli's request keys of the groups (None for a group that is off or refused)."""
        out: dict[str, Any] = {"hires": None, "vae_tiling": None, "control_net": None,
                               "control_image": None, "control_strength": None, "canny": None}
        if self.is_on("hires"):
            by_size = self.hires_mode.currentText() == "size"
            folder = self.hires_dir.text().strip() or None
            fix = HiresFix(True, self.hires_upscaler.currentText() or "Latent",
                           self.hires_scale.value(),
                           self.hires_width.value() if by_size else 0,
                           self.hires_height.value() if by_size else 0,
                           self.hires_steps.value(), self.hires_strength.value(), folder)
            out["hires"] = fix.to_json()
        if self.is_on("vae_tiling"):
            out["vae_tiling"] = VaeTiling(True, (self.tile_width.value(), self.tile_height.value()),
                                          self.tile_overlap.value(), self.relative()).to_json()
        if self.is_on("control") and self.control_net.text().strip():
            out.update(control_net=self.control_net.text().strip(),
                       control_image=self.control_image.text().strip() or None,
                       control_strength=self.control_strength.value(), canny=self.canny.isChecked())
        return out

    def load(self, g: Mapping[str, Any]) -> None:
        """Show the groups of settings ``g`` (sd-cli's request keys; absent: off)."""
        self._loading = True
        try:
            h = g.get("hires")
            fix = HiresFix.from_request(g) if h else HiresFix()
            self.groups["hires"].setChecked(fix.enabled)
            self.hires_mode.setCurrentIndex(1 if (fix.width or fix.height) else 0)
            self.hires_scale.setValue(fix.scale)
            if fix.width or fix.height:
                self.hires_width.setValue(fix.width or fix.height)
                self.hires_height.setValue(fix.height or fix.width)
            self.hires_steps.setValue(fix.steps)
            self.hires_strength.setValue(fix.denoising_strength)
            self.hires_dir.setText(str(fix.upscalers_dir or ""))
            self._fill_upscalers(fix.upscaler)
            t = g.get("vae_tiling")
            tiling = VaeTiling.from_json(t) if isinstance(t, dict) else VaeTiling()
            self.groups["vae_tiling"].setChecked(tiling.enabled)
            self.tile_width.setValue(tiling.tile_px[0])
            self.tile_height.setValue(tiling.tile_px[1])
            self.tile_overlap.setValue(tiling.clamped_overlap)
            rel = tiling.relative
            self.tile_relative.setText("" if rel is None else "x".join(f"{v:g}" for v in rel))
            c = g.get("control") if isinstance(g.get("control"), Mapping) else g
            self.groups["control"].setChecked(bool(g.get("control_net")))
            self.control_net.setText(str(g.get("control_net") or ""))
            self.control_image.setText(str(c.get("control_image") or ""))
            strength = c.get("control_strength")
            self.control_strength.setValue(float(strength) if strength is not None else 0.9)
            self.canny.setChecked(bool(c.get("canny")))
        except (ValueError, TypeError, PlanError):  # a malformed record: the groups stay off
            for box in self.groups.values():
                box.setChecked(False)
        finally:
            self._loading = False
        self._show_mode()

