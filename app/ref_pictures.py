"""The generation panel's reference pictures (sd-cli's ``-r/--ref-image``, repeated): the
pictures an edit model (FLUX.2 klein, FLUX.2 dev, Qwen-Image Edit) edits from, in order.

The group shows where the open family's registry entry honours ``ref_images``
(:meth:`~sdplan.core.families.declaration.Family.honours`, :data:`sdplan.core.families.options.REF_IMAGES`),
and also while it holds pictures a newly opened family does not take (with that family's
refusal, until cleared: nothing the user chose is dropped silently). Pictures come from
*Add…* (a file dialog taking several at once) or a drop of one or more files; each is read
as the engine reads it before it is added (:func:`~sdplan.core.pipelines.stages.img2img.image_size`),
and a file that is no readable picture is named in one line and not added. Each thumbnail
has its own remove button; *Clear* forgets them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QPixmap
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from sdplan.core.errors import SdplanError
from sdplan.core.families import family_of, variant_of
from sdplan.core.families import options as o

PICTURES = "Pictures (*.png *.jpg *.jpeg *.webp *.bmp);;All files (*)"
#: The flag the one-line errors name (the engine's and ``sdplan generate``'s words).
FLAG = o.OPTIONS[o.REF_IMAGES]
#: Thumbnail side in pixels.
THUMB = 64


def check_picture(path: str) -> str | None:
    """None when ``path`` is a picture the engine reads, else the one line saying why not
    (``-r/--ref-image 'x.png': not a readable picture (...)``)."""
    from sdplan.core.pipelines.stages.img2img import image_size

    try:
        image_size(path, FLAG)
    except SdplanError as exc:
        return str(exc).splitlines()[0]
    return None


class RefThumb(QFrame):
    """One reference picture: its thumbnail, its place (1-based) and a remove button."""

    def __init__(self, path: str, index: int, remove: Callable[[int], None],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path = path
        self.setObjectName("RefThumb")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        self.picture = QLabel()
        self.picture.setFixedSize(THUMB, THUMB)
        self.picture.setAlignment(Qt.AlignmentFlag.AlignCenter)
        pix = QPixmap(path)
        if not pix.isNull():
            self.picture.setPixmap(pix.scaled(THUMB, THUMB, Qt.AspectRatioMode.KeepAspectRatio,
                                              Qt.TransformationMode.SmoothTransformation))
        self.picture.setToolTip(f"reference picture {index + 1}: {path}")
        lay.addWidget(self.picture)
        foot = QHBoxLayout()
        foot.setContentsMargins(0, 0, 0, 0)
        self.place = QLabel(f"#{index + 1}")
        self.place.setObjectName("Caption")
        foot.addWidget(self.place, 1)
        self.remove_btn = QToolButton()
        self.remove_btn.setText("×")
        self.remove_btn.setToolTip(f"Remove {Path(path).name}")
        self.remove_btn.clicked.connect(lambda _=False, i=index: remove(i))
        foot.addWidget(self.remove_btn)
        lay.addLayout(foot)
        lay.addStretch(1)  # room the strip has beyond the thumbnail (its scroll bar) goes below


class RefPicturesGroup(QFrame):
    """See the module docstring. :attr:`paths` are the pictures in order; every change is
    emitted as :attr:`changed`; :attr:`message` is the last refusal of an added file (empty
    when the last add took every file)."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.paths: list[str] = []
        self.message = ""
        #: Whether the open family takes ``-r`` (:meth:`set_architecture`), its title.
        self.honoured, self.family_title = False, ""
        self.setAcceptDrops(True)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(4)
        head = QHBoxLayout()
        title = QLabel("REFERENCE PICTURES")
        title.setObjectName("Section")
        head.addWidget(title)
        self.count = QLabel()
        self.count.setObjectName("Caption")
        head.addWidget(self.count, 1)
        self.add_btn = QToolButton()
        self.add_btn.setText("Add…")
        self.add_btn.setToolTip(f"Add reference pictures ({FLAG}, one each, in order); or drop them here")
        self.add_btn.clicked.connect(self.choose)
        head.addWidget(self.add_btn)
        self.clear_btn = QToolButton()
        self.clear_btn.setText("Clear")
        self.clear_btn.setToolTip("Forget every reference picture")
        self.clear_btn.clicked.connect(self.clear)
        head.addWidget(self.clear_btn)
        lay.addLayout(head)
        self.strip = QWidget()
        self.row = QHBoxLayout(self.strip)
        self.row.setContentsMargins(0, 0, 0, 0)
        self.row.setSpacing(6)
        self.row.addStretch(1)
        self.scroll = QScrollArea()
        self.scroll.setWidget(self.strip)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setFixedHeight(THUMB + 44)
        lay.addWidget(self.scroll)
        self.note = QLabel()
        self.note.setObjectName("Caption")
        self.note.setWordWrap(True)
        lay.addWidget(self.note)
        self._show()

    # ------------------------------------------------------------------ pictures
    def add(self, paths: Sequence[str]) -> list[str]:
        """Check ``paths`` in order (:func:`check_picture`) and append the readable ones after
        the pictures already here; a file that is not a readable picture is not added and
        :attr:`message` names it (the first such file, in one line). Emits :attr:`changed`
        when any was added. Returns the paths added."""
        added, refused = [], []
        for p in paths:
            why = check_picture(str(p))
            if why is None:
                added.append(str(p))
            else:
                refused.append(why)
        self.message = refused[0] + (f" (and {len(refused) - 1} more not added)" if len(refused) > 1 else
                                     "; not added") if refused else ""
        self.paths += added
        self._show()
        if added:
            self.changed.emit()
        return added

    def remove(self, index: int) -> None:
        """Forget the picture at ``index`` (0-based; the others keep their order)."""
        if 0 <= index < len(self.paths):
            del self.paths[index]
            self.message = ""
            self._show()
            self.changed.emit()

    def clear(self) -> None:
        """Forget every picture."""
        had = bool(self.paths)
        self.paths, self.message = [], ""
        self._show()
        if had:
            self.changed.emit()

    def choose(self) -> list[str]:
        """Ask for pictures (several at once) and :meth:`add` them; returns those added."""
        paths, _ = QFileDialog.getOpenFileNames(self, "Reference pictures", "", PICTURES)
        return self.add(paths) if paths else []

    def set_paths(self, paths: Sequence[str]) -> None:
        """Show ``paths`` as they are (saved or pasted settings: not read again, the run
        names a missing one) without emitting."""
        self.paths, self.message = [str(p) for p in paths], ""
        self._show()

    def set_architecture(self, architecture: str | None) -> None:
        """Follow the open model: shown where the family of ``architecture`` (its variant)
        honours ``ref_images``; hidden for others unless pictures are here (then the note
        says the family takes none)."""
        fam = family_of(architecture)
        self.family_title = fam.title if fam is not None else "this model"
        self.honoured = fam is not None and fam.honours(o.REF_IMAGES, variant_of(architecture))
        self._show()

    # ------------------------------------------------------------------ drops
    @staticmethod
    def _files(event: QDragEnterEvent | QDropEvent) -> list[str]:
        return [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt's name
        if self.honoured and self._files(event):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt's name
        files = self._files(event)
        if self.honoured and files:
            self.add(files)
            event.acceptProposedAction()

    # ------------------------------------------------------------------ view
    def _show(self) -> None:
        while self.row.count() > 1:  # the thumbnails before the stretch
            item = self.row.takeAt(0)
            if item is not None and item.widget() is not None:
                item.widget().deleteLater()
        for i, p in enumerate(self.paths):
            self.row.insertWidget(i, RefThumb(p, i, self.remove))
        n = len(self.paths)
        self.count.setText(f"{n} picture{'s' if n != 1 else ''}" if n else "")
        warn = bool(self.paths) and not self.honoured
        if warn:
            note = f"{self.family_title} takes no {FLAG}; clear them to generate"
        elif self.message:
            note = self.message
        elif n:
            note = f"edit from these pictures ({FLAG} each, in this order)"
        else:
            note = "drop pictures here or Add… to edit them (none: text to image)"
        self.note.setText(note)
        self.note.setObjectName("Warning" if warn or self.message else "Caption")
        self.note.style().unpolish(self.note)
        self.note.style().polish(self.note)
        self.scroll.setVisible(bool(self.paths))
        self.clear_btn.setEnabled(bool(self.paths))
        self.add_btn.setEnabled(self.honoured)
        self.setVisible(self.honoured or bool(self.paths))

    def thumbs(self) -> list[RefThumb]:
        """The thumbnails shown, in order."""
        return [w for w in (self.row.itemAt(i).widget() for i in range(self.row.count() - 1))
                if isinstance(w, RefThumb)]
