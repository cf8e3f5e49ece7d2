"""The generation panel's inputs beyond the prompt: the LoRAs of a folder and the picture to
start from.

- **LoRA**: the files of the LoRA folder (``--lora-model-dir``; with the demo model, its own
  LoRAs) as rows of name, size, the family each was trained for (a check mark and the open
  model's family when every key of the file lands on the open model's weights) and a weight; *Add* writes ``<lora:NAME:WEIGHT>`` into the prompt, as
  sd-cli reads it. The apply mode (``--lora-apply-mode``) sits beside the folder.
- **Init image**: drop a picture (or click to choose one) to start from it (``-i``), a
  second one as the inpainting mask (``--mask``, white = repaint), and the ``--strength``.
  The open family's registry entry decides the picture's role (:meth:`InputsPanel.set_architecture`):
  a video family's picture is the video's start picture (its first frame; no strength: sd-cli
  ignores ``--strength`` there), a variant that needs one says so before Generate, and a
  family that takes no ``-i`` offers no slot (a picture already there stays, with the
  family's refusal beside it, until cleared).
- **Reference pictures**: an edit model's ``-r/--ref-image`` pictures, in order
  (:class:`~sdplan.app.ref_pictures.RefPicturesGroup`), where the family honours them.

Every change is emitted as :attr:`InputsPanel.changed`; :meth:`InputsPanel.settings` gives
the sd-cli keys (``lora_model_dir``, ``lora_apply_mode``, ``init_img``, ``mask``,
``strength``, ``ref_images``) that the panel writes into the request and the sd-cli command.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QMouseEvent, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from sdplan.app.ref_pictures import RefPicturesGroup
from sdplan.core.errors import SdplanError
from sdplan.core.families import family_of, variant_of
from sdplan.core.families import options as o
from sdplan.core.modelfiles.lora import LORA_EXTENSIONS, guess_lora_family
from sdplan.core.pipelines.stages.img2img import picture_notes
from sdplan.core.planning.adapters import APPLY_MODES
from sdplan.core.session.modules import ref_pictures
from sdplan.core.text.lora_tags import format_lora_tag

log = logging.getLogger(__name__)

PICTURES = "Pictures (*.png *.jpg *.jpeg *.webp *.bmp);;All files (*)"
_PICTURE_EXT = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def lora_files(folder: str | Path | None) -> list[dict[str, Any]]:
    """The LoRA files directly in ``folder`` (sorted by name): ``{"name"`` (without the
    extension, as a tag names it), ``"path"``, ``"bytes"``, ``"family"`` (:func:`guess_lora_family`;
    ``?`` when unreadable)``}``. A missing folder has none."""
    out: list[dict[str, Any]] = []
    if not folder or not Path(folder).is_dir():
        return out
    for p in sorted(Path(folder).iterdir()):
        if p.suffix.lower() not in LORA_EXTENSIONS or not p.is_file():
            continue
        try:
            family = guess_lora_family(p) if p.suffix.lower() in (".safetensors", ".gguf") else "unknown"
        except SdplanError:
            family = "?"
        out.append({"name": p.stem, "path": str(p), "bytes": p.stat().st_size, "family": family})
    return out


def _lands(path: str, table: Any) -> bool:
    """Does every key of the LoRA file land on the model ``table`` describes?"""
    if table is None:
        return False
    from sdplan.core.modelfiles.lora import read_lora

    try:
        return not read_lora(path, table).unknown
    except (SdplanError, OSError, ValueError):
        return False


def _mask_note(init: str, mask: str | None) -> str:
    """``; the mask ... is stretched ...`` when the mask's size is not the picture's
    (:func:`sdplan.core.pipelines.img2img.picture_notes`); empty otherwise."""
    from PySide6.QtGui import QImageReader

    if not mask:
        return ""
    a, b = QImageReader(init).size(), QImageReader(mask).size()
    if not (a.isValid() and b.isValid()) or a.isEmpty() or b.isEmpty():
        return ""
    notes = picture_notes((a.width(), a.height()), (b.width(), b.height()), a.width(), a.height())
    return f"; {notes[0]}" if notes else ""


class PictureSlot(QLabel):
    """A square that takes a dropped picture file (or a click to choose one) and shows it;
    :attr:`path` is the file or None. Emits :attr:`picked` with the new path (None: cleared)."""

    picked = Signal(object)

    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = title
        self.path: str | None = None
        #: Whether a drop or a click takes a picture (the open family takes this input).
        self.accepting = True
        self.setObjectName("PictureSlot")
        self.setAcceptDrops(True)
        self.setFixedSize(76, 76)
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setWordWrap(True)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setToolTip(f"{title}: drop a picture here or click to choose one")
        self.set_path(None)

    def set_path(self, path: str | None) -> None:
        """Show ``path`` (None: the empty slot) without emitting."""
        self.path = path
        pix = QPixmap(path) if path else QPixmap()
        if path and not pix.isNull():
            self.setPixmap(pix.scaled(72, 72, Qt.AspectRatioMode.KeepAspectRatio,
                                      Qt.TransformationMode.SmoothTransformation))
            self.setToolTip(f"{self.title}: {path}")
        else:
            self.setPixmap(QPixmap())
            self.setText(f"{self.title}\ndrop here")

    def choose(self, path: str | None) -> None:
        """Take ``path`` (None: clear) and emit :attr:`picked`."""
        self.set_path(path)
        self.picked.emit(path)

    def set_title(self, title: str) -> None:
        """Name the slot ``title`` (its empty text and tooltip)."""
        self.title = title
        self.setToolTip(f"{title}: drop a picture here or click to choose one")
        self.set_path(self.path)

    def mousePressEvent(self, event: QMouseEvent) -> None:  # noqa: N802 - Qt's name
        if not self.accepting:
            return
        path, _ = QFileDialog.getOpenFileName(self, self.title, "", PICTURES)
        if path:
            self.choose(path)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt's name
        urls = event.mimeData().urls()
        if self.accepting and urls and urls[0].isLocalFile() and \
                urls[0].toLocalFile().lower().endswith(_PICTURE_EXT):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt's name
        urls = event.mimeData().urls()
        if self.accepting and urls and urls[0].isLocalFile():
            self.choose(urls[0].toLocalFile())
            event.acceptProposedAction()


class InputsPanel(QFrame):
    """See the module docstring. ``insert_tag(text)`` puts a LoRA tag into the prompt;
    ``model_family()`` is the open model's family and ``model_table()`` its LoRA alias table
    or None (for the fit marks)."""

    changed = Signal()

    def __init__(self, insert_tag: Callable[[str], None], model_family: Callable[[], str | None],
                 model_table: Callable[[], Any] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.insert_tag, self.model_family = insert_tag, model_family
        self.model_table = model_table or (lambda: None)
        self.folder: str | None = None
        self.files: list[dict[str, Any]] = []
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        head = QHBoxLayout()
        title = QLabel("LORA")
        title.setObjectName("Section")
        head.addWidget(title)
        self.folder_label = QLabel()
        self.folder_label.setObjectName("Caption")
        head.addWidget(self.folder_label, 1)
        self.folder_btn = QToolButton()
        self.folder_btn.setText("Folder…")
        self.folder_btn.setToolTip("The LoRA folder (--lora-model-dir)")
        self.folder_btn.clicked.connect(self._choose_folder)
        head.addWidget(self.folder_btn)
        self.mode = QComboBox()
        self.mode.addItems(APPLY_MODES)
        self.mode.setToolTip("--lora-apply-mode: merge into the weights (immediately) or add in "
                             "the graph (at_runtime); auto as sd-cli")
        self.mode.currentTextChanged.connect(lambda *_: self.changed.emit())
        head.addWidget(self.mode)
        lay.addLayout(head)
        self.table = QTableWidget(0, 5)
        self.table.setHorizontalHeaderLabels(["LoRA", "size", "family", "weight", ""])
        self.table.verticalHeader().hide()
        self.table.setSelectionMode(QTableWidget.SelectionMode.NoSelection)
        self.table.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for c in range(1, 5):
            hh.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        lay.addWidget(self.table)
        self.empty = QLabel()
        self.empty.setObjectName("Muted")
        self.empty.setWordWrap(True)
        lay.addWidget(self.empty)
        #: The picture's role for the open family (:meth:`set_architecture`): whether it
        #: takes ``-i``, ``--mask``, and whether the picture is a video's first frame.
        self.takes_init, self.takes_mask, self.first_frame, self.makes_video = True, True, False, False
        #: Why the open variant cannot run without a picture, or None.
        self.needs_init: str | None = None
        self.family_title = ""
        self.pic_title = QLabel("INIT IMAGE")
        self.pic_title.setObjectName("Section")
        lay.addWidget(self.pic_title)
        row = QHBoxLayout()
        self.init_slot = PictureSlot("Picture")
        self.mask_slot = PictureSlot("Mask")
        self.mask_slot.setToolTip("Inpainting mask: white = repaint (drop a picture or click)")
        for slot in (self.init_slot, self.mask_slot):
            slot.picked.connect(self._picked)
            row.addWidget(slot)
        side = QVBoxLayout()
        self.strength_row = QWidget()
        strength = QHBoxLayout(self.strength_row)
        strength.setContentsMargins(0, 0, 0, 0)
        strength.addWidget(QLabel("Strength"))
        self.strength = QDoubleSpinBox()
        self.strength.setRange(0.0, 1.0)
        self.strength.setSingleStep(0.05)
        self.strength.setValue(0.75)
        self.strength.setToolTip("--strength: 0 keeps the picture, 1 repaints it all")
        self.strength.valueChanged.connect(lambda *_: self.changed.emit())
        strength.addWidget(self.strength, 1)
        side.addWidget(self.strength_row)
        self.clear_btn = QPushButton("Clear")
        self.clear_btn.setToolTip("Text to image again: forget the picture and the mask")
        self.clear_btn.clicked.connect(self.clear_pictures)
        side.addWidget(self.clear_btn)
        self.picture_note = QLabel()
        self.picture_note.setObjectName("Caption")
        self.picture_note.setWordWrap(True)
        side.addWidget(self.picture_note)
        side.addStretch(1)
        row.addLayout(side, 1)
        lay.addLayout(row)
        #: An edit model's reference pictures (``-r``), shown where the family takes them.
        self.refs = RefPicturesGroup()
        self.refs.changed.connect(self.changed)
        lay.addWidget(self.refs)
        self._update_note()

    # ------------------------------------------------------------------ LoRA
    def set_folder(self, folder: str | Path | None) -> None:
        """List the LoRAs of ``folder`` (None: none)."""
        self.folder = str(folder) if folder else None
        self.folder_label.setText(Path(self.folder).name + "/" if self.folder else "no folder")
        self.folder_label.setToolTip(self.folder or "Choose the folder of your LoRA files")
        self.files = lora_files(self.folder)
        self.refresh_fit()
        self.changed.emit()

    def refresh_fit(self) -> None:
        """Rebuild the rows (the fit marks follow the open model's family)."""
        family = self.model_family()
        table = self.model_table()
        self.table.setRowCount(len(self.files))
        for i, f in enumerate(self.files):
            fits = family is not None and (f["family"] == family or _lands(f["path"], table))
            self.table.setItem(i, 0, QTableWidgetItem(f["name"]))
            self.table.setItem(i, 1, QTableWidgetItem(f"{f['bytes'] / 2**20:.1f} MB" if f["bytes"] >= 2**20
                                                      else f"{max(f['bytes'] // 1024, 1)} KB"))
            fam = QTableWidgetItem(f"✓ {family}" if fits else f["family"])
            fam.setToolTip(f"trained for {f['family']}" + (" — fits the open model" if fits else ""))
            self.table.setItem(i, 2, fam)
            weight = QDoubleSpinBox()
            weight.setRange(-4.0, 4.0)
            weight.setSingleStep(0.1)
            weight.setValue(1.0)
            self.table.setCellWidget(i, 3, weight)
            add = QToolButton()
            add.setText("Add")
            add.setToolTip(f"Insert <lora:{f['name']}:WEIGHT> into the prompt")
            add.clicked.connect(lambda _=False, r=i: self.add(r))
            self.table.setCellWidget(i, 4, add)
        rows = min(max(len(self.files), 1), 3)
        self.table.setFixedHeight(self.table.horizontalHeader().height() + rows * self.table.verticalHeader()
                                  .defaultSectionSize() + 4)
        self.table.setVisible(bool(self.files))
        self.empty.setVisible(not self.files)
        self.empty.setText("No LoRA files in this folder (.safetensors, .gguf, .pt, .ckpt)"
                           if self.folder else "Choose the folder of your LoRA files")

    def add(self, row: int) -> str:
        """Insert the tag of LoRA ``row`` at its weight into the prompt; returns the tag."""
        box = self.table.cellWidget(row, 3)
        weight = box.value() if isinstance(box, QDoubleSpinBox) else 1.0
        tag = format_lora_tag(self.files[row]["name"], round(weight, 2))
        self.insert_tag(tag)
        return tag

    def _choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "LoRA folder", self.folder or "")
        if folder:
            self.set_folder(folder)

    # ------------------------------------------------------------------ pictures
    def _picked(self, _: object) -> None:
        self._update_note()
        self.changed.emit()

    def clear_pictures(self) -> None:
        """Forget the init picture and the mask."""
        self.init_slot.set_path(None)
        self.mask_slot.set_path(None)
        self._picked(None)

    def set_architecture(self, architecture: str | None) -> None:
        """Give the picture the role the family of ``architecture`` (and its variant) has for
        it in the registry: an init image with a mask and a strength (an unknown model, and
        every family that honours ``-i`` without making video), a video's start picture (the
        first frame; no mask unless honoured, no strength), or no picture at all (a family
        that does not honour ``-i``: the slots take nothing)."""
        fam = family_of(architecture)
        variant = variant_of(architecture)
        self.family_title = fam.title if fam is not None else ""
        self.takes_init = fam is None or fam.honours(o.INIT_IMG, variant)
        self.takes_mask = fam is None or fam.honours(o.MASK, variant)
        self.makes_video = fam is not None and fam.honours(o.VIDEO, variant)
        self.first_frame = self.makes_video and self.takes_init
        self.needs_init = fam.needs_for(variant).get(o.INIT_IMG) if fam is not None else None
        self.pic_title.setText("START PICTURE (FIRST FRAME)" if self.first_frame else
                               "INIT IMAGE" if self.takes_init else "NO START PICTURE")
        self.init_slot.set_title("First frame" if self.first_frame else "Picture")
        self.init_slot.accepting, self.mask_slot.accepting = self.takes_init, self.takes_mask
        self.refs.set_architecture(architecture)
        self._update_note()

    def _update_note(self) -> None:
        init, mask = self.init_slot.path, self.mask_slot.path
        warn = False
        if not self.takes_init:
            what = "video" if self.makes_video else "image"
            note = f"text to {what}: {self.family_title} takes no start picture (-i)"
            if init:
                note, warn = note + "; clear the picture to generate", True
        elif mask and not init:
            note = "a mask needs a picture"
        elif mask and not self.takes_mask:
            note, warn = f"{self.family_title} takes no --mask; clear it to generate", True
        elif init and self.first_frame:
            note = "image to video: the picture is the first frame (no strength)"
        elif init:
            note = "inpainting: white = repaint" if mask else "image to image"
            note += _mask_note(init, mask)
        elif self.needs_init:
            note, warn = f"needs a start picture: {self.needs_init}; drop one here", True
        else:
            note = "text to video" if self.first_frame else "text to image"
        self.picture_note.setText(note)
        self.picture_note.setObjectName("Warning" if warn else "Caption")
        self.picture_note.style().unpolish(self.picture_note)
        self.picture_note.style().polish(self.picture_note)
        self.init_slot.setVisible(self.takes_init or bool(init))
        self.mask_slot.setVisible(self.takes_mask or bool(mask))
        self.strength_row.setVisible(self.takes_init and not self.first_frame)
        self.strength.setEnabled(bool(init))
        self.clear_btn.setVisible(self.takes_init or bool(init or mask))
        self.clear_btn.setEnabled(bool(init or mask))

    # ------------------------------------------------------------------ settings
    def settings(self) -> dict[str, object]:
        """sd-cli's keys of these inputs (None where unset; ``strength`` None for a video's
        first frame, which takes none; ``ref_images`` the reference pictures in order, None
        without)."""
        init = self.init_slot.path
        return {"lora_model_dir": self.folder, "lora_apply_mode": self.mode.currentText(),
                "init_img": init, "mask": self.mask_slot.path if init else None,
                "strength": round(self.strength.value(), 2) if init and not self.first_frame else None,
                "ref_images": list(self.refs.paths) or None}

    def load(self, values: dict[str, object]) -> None:
        """Show saved or pasted settings (keys of :meth:`settings`) without emitting."""
        self.blockSignals(True)
        try:
            if values.get("lora_model_dir") and values["lora_model_dir"] != self.folder:
                self.set_folder(str(values["lora_model_dir"]))
            i = self.mode.findText(str(values.get("lora_apply_mode") or "auto"))
            self.mode.setCurrentIndex(max(i, 0))
            self.init_slot.set_path(str(values["init_img"]) if values.get("init_img") else None)
            self.mask_slot.set_path(str(values["mask"]) if values.get("mask") else None)
            if values.get("strength") is not None:
                self.strength.setValue(float(values["strength"]))  # type: ignore[arg-type]
            self.refs.set_paths(ref_pictures(values))
            self._update_note()
        finally:
            self.blockSignals(False)
