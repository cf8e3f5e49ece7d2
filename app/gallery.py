"""The gallery: every result image and video in the results folder (and folders the user
adds), with its metadata, searchable by prompt and model.

Metadata comes from the image itself (:func:`sdplan.core.pipelines.stages.results.read_result`:
sdplan's text chunks, an sd-cli/A1111 ``parameters`` chunk, or the older JSON file beside
it). Thumbnails load lazily: the view asks only for the rows it shows, and each thumbnail
is decoded at thumbnail size on a thread pool, then kept (a video's: its first frame with a
"video" badge, :mod:`sdplan.app.video`). A result opens full size (a video plays), gives
its sd-cli command, sends its settings back to the generation panel, or is deleted (with
its JSON file).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from PySide6.QtCore import (
    QAbstractListModel,
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QRunnable,
    QSize,
    QSortFilterProxyModel,
    Qt,
    QThreadPool,
    Signal,
    Slot,
)
from PySide6.QtGui import QGuiApplication, QIcon, QImage, QImageReader, QKeySequence, QPixmap
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)
from sdplan.app.history_strip import result_tooltip
from sdplan.app.video import VIDEO_SUFFIXES, VideoViewer, is_video_file, video_thumbnail
from sdplan.core.errors import SdplanError
from sdplan.core.pipelines.stages.results import ResultInfo, read_result
from sdplan.core.planning import paths
from sdplan.core.planning.sdcli import picture_command

log = logging.getLogger(__name__)

THUMB = 128
InfoRole = Qt.ItemDataRole.UserRole + 1
Index = QModelIndex | QPersistentModelIndex
_ROOT = QModelIndex()


def _read_or_note(path: Path, notes: list[str]) -> ResultInfo | None:
    """:func:`read_result` of one picture; when its record cannot be read, the picture with
    its file name alone; None (and a line in ``notes``) when it is no readable picture."""
    try:
        return read_result(path)
    except OSError as exc:  # not a picture (or gone): not a result
        log.debug("not a result %s: %s", path, exc)
        return None
    except Exception as exc:  # noqa: BLE001 - one picture never hides the others
        notes.append(f"{path.name}: its record is not read ({type(exc).__name__}: "
                     f"{str(exc)[:120]}); shown by its file name")
        log.warning("%s", notes[-1])
        return ResultInfo(str(path))


def result_command(info: ResultInfo) -> str:
    """The sd-cli command that makes ``info``'s image again, written from what the picture
    records (:func:`sdplan.core.planning.sdcli.picture_command`, the writer of the command
    ``sdplan generate`` records): its model files (or the model name the image records),
    placement, settings and the flags its model files call for. Placement strings that no
    longer parse are left out."""
    files: dict[str, list[str]] = dict(info.model_files) or (
        {"model": [info.model]} if info.model else {})
    try:
        return picture_command(files, info.placement, info.settings, info.model_flags)
    except SdplanError:  # an old image's strings: the command without them
        return picture_command(files, {}, info.settings, info.model_flags)


def describe_result(info: ResultInfo) -> str:
    """The details pane's text (rich text): prompt, negative prompt, settings, model,
    placement, file."""
    from html import escape

    s = info.settings
    rows = [f"<b>{escape(info.prompt) or '(no prompt)'}</b>"]
    if s.get("negative_prompt"):
        rows.append(f"<i>not:</i> {escape(str(s['negative_prompt']))}")
    bits = []
    if s.get("width") and s.get("height"):
        bits.append(f"{s['width']}×{s['height']}")
    for key, label in (("steps", "steps"), ("cfg_scale", "CFG"), ("seed", "seed"),
                       ("sampling_method", ""), ("scheduler", "")):
        if s.get(key) not in (None, ""):
            bits.append(f"{label} {s[key]}".strip())
    if s.get("mode") == "vid_gen":
        bits.append(f"{s.get('video_frames') or 1} frames at {s.get('fps') or 16} fps")
    if bits:
        rows.append(" · ".join(escape(b) for b in bits))
    if info.model:
        rows.append(f"model: {escape(info.model)}")
    for k, v in info.placement.items():
        rows.append(f"<code>--{k.replace('_', '-')} {escape(v)}</code>")
    rows.append(f"<span style='color:gray'>{escape(info.path)}</span>")
    return "<br>".join(rows)


class _ThumbSignals(QObject):
    done = Signal(str, QImage)


class _ThumbJob(QRunnable):
    """Decode one image at thumbnail size (QImage is safe off the GUI thread)."""

    def __init__(self, path: str, signals: _ThumbSignals) -> None:
        super().__init__()
        self.path, self.signals = path, signals

    def run(self) -> None:
        if is_video_file(self.path):
            self.signals.done.emit(self.path, video_thumbnail(self.path, THUMB))
            return
        reader = QImageReader(self.path)
        size = reader.size()
        if size.isValid():
            reader.setScaledSize(size.scaled(THUMB, THUMB, Qt.AspectRatioMode.KeepAspectRatio))
        self.signals.done.emit(self.path, reader.read())


class GalleryModel(QAbstractListModel):
    """Results newest first; thumbnails decoded on first request (see module docstring).

    Attributes:
        decoded: paths whose thumbnails were decoded (lazy loading is measurable).
    """

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.items: list[ResultInfo] = []
        self.notes: list[str] = []
        self.thumbs: dict[str, QIcon] = {}
        self.decoded: list[str] = []
        self._pending: set[str] = set()
        self.pool = QThreadPool(self)
        self.pool.setMaxThreadCount(2)
        self._signals = _ThumbSignals(self)
        self._signals.done.connect(self._thumb_done)
        blank = QPixmap(THUMB, THUMB)
        blank.fill(Qt.GlobalColor.transparent)
        self.placeholder = QIcon(blank)

    def load(self, folders: list[Path]) -> int:
        """Read the metadata of every PNG and video in ``folders`` (not the pixels); returns the
        number of results. A picture whose record cannot be read is shown without it, one
        that cannot be read at all is left out; either is a line of :attr:`notes` and never
        hides the others; a folder that cannot be listed is a note too."""
        found: list[tuple[float, Path]] = []
        self.notes = []
        for folder in folders:
            try:
                if not paths.is_dir(folder):
                    continue
                listed = [p for pattern in ("*.png", *(f"*{x}" for x in VIDEO_SUFFIXES))
                          for p in folder.glob(pattern)]
            except OSError as exc:
                self.notes.append(f"gallery folder {folder} not read: {paths.reason(exc)}")
                continue
            for p in listed:
                try:
                    found.append((p.stat().st_mtime, p))
                except OSError:
                    continue
        found.sort(key=lambda t: (t[0], t[1].name), reverse=True)
        items = []
        for _, p in found:
            info = _read_or_note(p, self.notes)
            if info is not None:
                items.append(info)
        self.beginResetModel()
        self.items = items
        self.thumbs = {k: v for k, v in self.thumbs.items() if any(i.path == k for i in items)}
        self.endResetModel()
        return len(items)

    def add(self, path: str | Path) -> None:
        """Put a new result first (a picture that cannot be read is a note, not a row)."""
        info = _read_or_note(Path(path), self.notes)
        if info is None:
            return
        self.beginInsertRows(_ROOT, 0, 0)
        self.items.insert(0, info)
        self.endInsertRows()

    def remove(self, path: str) -> None:
        for row, info in enumerate(self.items):
            if info.path == path:
                self.beginRemoveRows(_ROOT, row, row)
                del self.items[row]
                self.endRemoveRows()
                self.thumbs.pop(path, None)
                return

    def rowCount(self, parent: Index = _ROOT) -> int:  # noqa: N802
        return 0 if parent.isValid() else len(self.items)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or index.row() >= len(self.items):
            return None
        info = self.items[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            text = info.prompt or Path(info.path).name
            return text if len(text) <= 28 else text[:27] + "…"
        if role == Qt.ItemDataRole.ToolTipRole:
            return result_tooltip(info)
        if role == Qt.ItemDataRole.DecorationRole:
            icon = self.thumbs.get(info.path)
            if icon is None:
                self._request(info.path)
                return self.placeholder
            return icon
        if role == InfoRole:
            return info
        return None

    def _request(self, path: str) -> None:
        if path in self._pending:
            return
        self._pending.add(path)
        self.pool.start(_ThumbJob(path, self._signals))

    @Slot(str, QImage)
    def _thumb_done(self, path: str, image: QImage) -> None:
        self._pending.discard(path)
        self.decoded.append(path)
        self.thumbs[path] = QIcon(QPixmap.fromImage(image))
        for row, info in enumerate(self.items):
            if info.path == path:
                idx = self.index(row)
                self.dataChanged.emit(idx, idx, [Qt.ItemDataRole.DecorationRole])
                break


class GalleryFilter(QSortFilterProxyModel):
    """Rows whose prompt, negative prompt or model contain every word of :attr:`query`."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.query = ""

    def set_query(self, text: str) -> None:
        if hasattr(self, "beginFilterChange"):  # Qt 6.9+: invalidateFilter is deprecated
            self.beginFilterChange()
            self.query = text
            self.endFilterChange(QSortFilterProxyModel.Direction.Rows)
        else:
            self.query = text
            self.invalidateFilter()

    def filterAcceptsRow(self, row: int, parent: Index) -> bool:  # noqa: N802
        if not self.query.strip():
            return True
        info = self.sourceModel().index(row, 0, parent).data(InfoRole)
        return info is not None and info.matches(self.query)


class ImageViewer(QDialog):
    """One result full size (scrolls when larger than the screen), with its details."""

    def __init__(self, info: ResultInfo, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(Path(info.path).name)
        lay = QVBoxLayout(self)
        self.image = QLabel()
        self.image.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.pixmap = QPixmap(info.path)
        self.image.setPixmap(self.pixmap)
        scroll = QScrollArea()
        scroll.setWidget(self.image)
        scroll.setWidgetResizable(True)
        lay.addWidget(scroll, 1)
        details = QLabel(describe_result(info))
        details.setWordWrap(True)
        details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(details)
        self.resize(min(self.pixmap.width() + 60, 1400), min(self.pixmap.height() + 160, 1000))


class GalleryPanel(QWidget):
    """Search field, the thumbnail grid and the selected result's details and actions.

    Signals:
        reuseRequested(object): "Use settings" on a :class:`ResultInfo`.
        status(str): a short message for the status line.
    """

    reuseRequested = Signal(object)
    status = Signal(str)

    def __init__(self, folders: list[Path], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.folders = [Path(f) for f in folders]
        self.model = GalleryModel(self)
        self.proxy = GalleryFilter(self)
        self.proxy.setSourceModel(self.model)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(8)
        top = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search prompts and models")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._search)
        top.addWidget(self.search, 1)
        self.count_label = QLabel()
        self.count_label.setObjectName("Caption")
        top.addWidget(self.count_label)
        self.folder_btn = QPushButton("Add folder…")
        self.folder_btn.setToolTip("Also show the images in another folder (sdplan generate's "
                                   "output, sd-cli's)")
        self.folder_btn.clicked.connect(self.add_folder_dialog)
        top.addWidget(self.folder_btn)
        self.reload_btn = QPushButton("Reload")
        self.reload_btn.clicked.connect(self.reload)
        top.addWidget(self.reload_btn)
        lay.addLayout(top)
        split = QSplitter(Qt.Orientation.Horizontal)
        self.view = QListView()
        self.view.setViewMode(QListView.ViewMode.IconMode)
        self.view.setIconSize(QSize(THUMB, THUMB))
        self.view.setGridSize(QSize(THUMB + 24, THUMB + 34))
        self.view.setUniformItemSizes(True)
        self.view.setResizeMode(QListView.ResizeMode.Adjust)
        self.view.setMovement(QListView.Movement.Static)
        self.view.setWordWrap(True)
        self.view.setModel(self.proxy)
        self.view.setAccessibleName("Results")
        self.view.selectionModel().currentChanged.connect(lambda *_: self._selected())
        self.view.activated.connect(lambda _: self.open_current())
        split.addWidget(self.view)
        side = QWidget()
        sl = QVBoxLayout(side)
        sl.setContentsMargins(8, 0, 0, 0)
        self.details = QLabel("Select a result")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details.setAlignment(Qt.AlignmentFlag.AlignTop)
        sl.addWidget(self.details, 1)
        self.actions_btns: dict[str, QPushButton] = {}
        for key, text, tip, slot in (
                ("open", "Open full size", "Show the image at full size (Enter)", self.open_current),
                ("copy", "Copy sd-cli command", "The command that makes this image again",
                 self.copy_command),
                ("reuse", "Use settings", "Put its prompt, settings, model and placement in "
                 "the generation panel", self.reuse_current),
                ("delete", "Delete", "Delete the image file (Delete)", self.delete_current)):
            b = QPushButton(text)
            b.setToolTip(tip)
            b.clicked.connect(slot)
            sl.addWidget(b)
            self.actions_btns[key] = b
        self.actions_btns["delete"].setShortcut(QKeySequence.StandardKey.Delete)
        split.addWidget(side)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)
        lay.addWidget(split, 1)
        self._selected()

    # ------------------------------------------------------------------ contents
    def reload(self) -> int:
        n = self.model.load(self.folders)
        self._count()
        if self.model.notes:  # pictures set aside: say so, the good ones are shown
            more = f" (and {len(self.model.notes) - 1} more)" if len(self.model.notes) > 1 else ""
            self.status.emit(f"gallery: {self.model.notes[0]}{more}")
        return n

    def add_folder(self, folder: str | Path) -> None:
        p = Path(folder)
        if p not in self.folders:
            self.folders.append(p)
        self.reload()

    def add_folder_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Show images from a folder")
        if path:
            self.add_folder(path)

    def add_result(self, path: str | Path) -> None:
        """A new result (from the panel or the queue) goes first."""
        self.model.add(path)
        self._count()

    def _search(self, text: str) -> None:
        self.proxy.set_query(text)
        self._count()

    def _count(self) -> None:
        shown, total = self.proxy.rowCount(), self.model.rowCount()
        self.count_label.setText(f"{shown} of {total}" if shown != total else f"{total} images")

    def select_path(self, path: str) -> bool:
        """Select the result at ``path`` (clearing a search that hides it)."""
        for attempt in range(2):
            for row in range(self.proxy.rowCount()):
                idx = self.proxy.index(row, 0)
                if idx.data(InfoRole).path == str(path):
                    self.view.setCurrentIndex(idx)
                    self.view.scrollTo(idx)
                    return True
            if attempt == 0 and self.search.text():
                self.search.clear()
        return False

    # ------------------------------------------------------------------ selection
    def current(self) -> ResultInfo | None:
        idx = self.view.currentIndex()
        return idx.data(InfoRole) if idx.isValid() else None

    def _selected(self) -> None:
        info = self.current()
        for b in self.actions_btns.values():
            b.setEnabled(info is not None)
        self.details.setText(describe_result(info) if info else "Select a result")

    def open_current(self) -> QDialog | None:
        """Open the selected result: a picture full size, a video playing."""
        info = self.current()
        if info is None:
            return None
        viewer: QDialog = VideoViewer(info.path, describe_result(info), self) \
            if is_video_file(info.path) else ImageViewer(info, self)
        viewer.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        viewer.show()
        return viewer

    def copy_command(self) -> str:
        info = self.current()
        if info is None:
            return ""
        cmd = result_command(info)
        QGuiApplication.clipboard().setText(cmd)
        self.status.emit("sd-cli command of the image copied")
        return cmd

    def reuse_current(self) -> None:
        info = self.current()
        if info is not None:
            self.reuseRequested.emit(info)

    def delete_current(self, confirm: bool = True) -> bool:
        """Delete the selected image (and its JSON file) after asking; True when done."""
        info = self.current()
        if info is None:
            return False
        if confirm and QMessageBox.question(
                self, "Delete image", f"Delete {Path(info.path).name}?") != \
                QMessageBox.StandardButton.Yes:
            return False
        try:
            os.remove(info.path)
            side = Path(info.path).with_suffix(".json")
            if side.exists():
                side.unlink()
        except OSError as exc:
            self.status.emit(f"cannot delete {info.path}: {exc}")
            return False
        self.model.remove(info.path)
        self._count()
        self._selected()
        self.status.emit(f"deleted {Path(info.path).name}")
        return True

