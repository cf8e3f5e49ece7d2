"""Today's strip: the results of today (pictures and videos), newest first, under the
generation panel.

Each thumbnail's tooltip gives its prompt, seed and size (read back from the image with
:func:`sdplan.core.pipelines.stages.results.read_result`); clicking shows it in the panel,
the context menu (or Enter) offers "Reuse settings" and "Show in gallery". Older results
live in the gallery.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
from pathlib import Path

from PySide6.QtCore import QPoint, QSize, Qt, Signal
from PySide6.QtGui import QIcon, QImageReader, QKeyEvent, QPixmap
from PySide6.QtWidgets import QListWidget, QListWidgetItem, QMenu, QWidget
from sdplan.app.video import VIDEO_SUFFIXES, is_video_file, video_thumbnail
from sdplan.core.pipelines.stages.results import ResultInfo, read_result
from sdplan.core.planning import paths

log = logging.getLogger(__name__)

#: Thumbnails kept in the strip.
MAX_ITEMS = 30
PathRole = Qt.ItemDataRole.UserRole


def result_tooltip(info: ResultInfo) -> str:
    """``prompt`` / ``seed 42 · 512×512 · 20 steps`` / ``model`` lines for a result."""
    s = info.settings
    lines = [info.prompt or "(no prompt)"]
    parts = []
    if s.get("seed") is not None:
        parts.append(f"seed {s['seed']}")
    if s.get("width") and s.get("height"):
        parts.append(f"{s['width']}×{s['height']}")
    if s.get("steps"):
        parts.append(f"{s['steps']} steps")
    if parts:
        lines.append(" · ".join(parts))
    if info.model:
        lines.append(info.model)
    lines.append(Path(info.path).name)
    return "\n".join(lines)


def thumbnail(path: str | Path, side: int = 48) -> QIcon:
    """A small icon of the image, decoded at thumbnail size (not the full picture); of a
    video, its first frame with a "video" badge."""
    if is_video_file(path):
        return QIcon(QPixmap.fromImage(video_thumbnail(path, side)))
    reader = QImageReader(str(path))
    size = reader.size()
    if size.isValid() and max(size.width(), size.height()) > side:
        reader.setScaledSize(size.scaled(side, side, Qt.AspectRatioMode.KeepAspectRatio))
    return QIcon(QPixmap.fromImage(reader.read()))


class HistoryStrip(QListWidget):
    """Today's results (see module docstring).

    Signals:
        reuseRequested(str): "Reuse settings" on the image at this path.
        galleryRequested(str): "Show in gallery" on it.
    """

    reuseRequested = Signal(str)
    galleryRequested = Signal(str)

    def __init__(self, folder: str | Path, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.folder = Path(folder)
        self.setViewMode(QListWidget.ViewMode.IconMode)
        self.setIconSize(QSize(48, 48))
        self.setFixedHeight(70)
        self.setFlow(QListWidget.Flow.LeftToRight)
        self.setWrapping(False)
        self.setAccessibleName("Today's results")
        self.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.customContextMenuRequested.connect(self._menu_at)

    def add(self, path: str | Path) -> QListWidgetItem:
        """Put a result first (the oldest falls off past :data:`MAX_ITEMS`)."""
        item = QListWidgetItem(thumbnail(path), "")
        item.setData(PathRole, str(path))
        try:
            item.setToolTip(result_tooltip(read_result(path)))
        except OSError as exc:
            log.debug("no metadata for %s: %s", path, exc)
            item.setToolTip(Path(path).name)
        except Exception as exc:  # noqa: BLE001 - a picture's record never stops the strip
            log.warning("%s: its record is not read (%s: %s)", path, type(exc).__name__, exc)
            item.setToolTip(Path(path).name)
        self.insertItem(0, item)
        while self.count() > MAX_ITEMS:
            self.takeItem(self.count() - 1)
        return item

    def load_today(self, today: _dt.date | None = None) -> int:
        """Show the folder's results written today (by modification time); returns how many."""
        day = today or _dt.date.today()
        stamps: dict[Path, float] = {}
        try:
            if not paths.is_dir(self.folder):
                return 0
            for p in (q for pattern in ("*.png", *(f"*{x}" for x in VIDEO_SUFFIXES))
                      for q in self.folder.glob(pattern)):
                with contextlib.suppress(OSError):
                    stamps[p] = p.stat().st_mtime
        except OSError as exc:  # a folder that cannot be listed: nothing to show
            log.warning("results folder %s not read: %s", self.folder, exc)
            return 0
        todays = [p for p, t in stamps.items() if _dt.date.fromtimestamp(t) == day]
        todays.sort(key=lambda p: (stamps[p], p.name))
        for p in todays[-MAX_ITEMS:]:
            self.add(p)
        return len(todays[-MAX_ITEMS:])

    def path_of(self, item: QListWidgetItem) -> str:
        return str(item.data(PathRole))

    def build_menu(self, item: QListWidgetItem) -> QMenu:
        """Reuse settings / Show in gallery for ``item``."""
        menu = QMenu(self)
        path = self.path_of(item)
        menu.addAction("Reuse settings", lambda: self.reuseRequested.emit(path))
        menu.addAction("Show in gallery", lambda: self.galleryRequested.emit(path))
        return menu

    def _menu_at(self, pos: QPoint) -> None:
        item = self.itemAt(pos)
        if item is not None:
            self.build_menu(item).exec(self.viewport().mapToGlobal(pos))

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802
        item = self.currentItem()
        if item is not None and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and \
                event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.reuseRequested.emit(self.path_of(item))
            return
        super().keyPressEvent(event)
