"""The model library in the app: the user's model folders, every model file in them grouped
by family, and for each diffusion model whether it fits on the board's devices.

The scan (:func:`sdplan.core.modelfiles.library.scan_library`: header reads only, cached by
size and modification time) runs on a worker thread; the verdicts
(:func:`sdplan.core.modelfiles.library_fit.fit_verdict`) are computed here from the cached
profiles for the controller's devices and ``--max-vram`` budgets, again whenever they
change. Choosing a diffusion model fills the board with the files it needs (its text
encoders and VAE from the library; those it lacks are asked for) and the plan of its
verdict, as one undoable step.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QSettings, Qt, QThread, Signal, Slot
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QProgressBar,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)
from sdplan.app import theme
from sdplan.app.controller import PlanController
from sdplan.app.wrap_label import WrapLabel
from sdplan.core.errors import SdplanError
from sdplan.core.modelfiles.library import (
    DIFFUSION_KINDS,
    KIND_TITLES,
    LibraryCache,
    LibraryEntry,
    ScanResult,
    grouped,
    scan_library,
)
from sdplan.core.modelfiles.library_fit import FitVerdict, describe_devices, fit_verdict
from sdplan.core.planning.modules import GIB, MODEL_FLAGS
from sdplan.core.planning.placement import Placement

log = logging.getLogger(__name__)

PathRole = Qt.ItemDataRole.UserRole
COLUMNS = ("Name", "Kind", "Size", "Quant", "Fits here", "Time", "Plan")
VERDICT_COLOURS = {"resident": theme.OK, "split": theme.ACCENT, "offload": theme.WARNING,
                   "none": theme.DANGER}
VERDICT_SHORT = {"resident": "✓ resident", "split": "✓ split", "offload": "◐ offload",
                 "none": "✕ does not fit"}


class LibraryScanner(QObject):
    """Scans folders on a worker thread (its signals reach the panel's slots queued)."""

    progress = Signal(int, int)
    done = Signal(object, float)  # ScanResult, seconds

    def __init__(self, folders: list[str], cache_path: str | None) -> None:
        super().__init__()
        self.folders, self.cache_path = folders, cache_path
        self._stop = False

    def stop(self) -> None:
        self._stop = True

    @Slot()
    def run(self) -> None:
        t0 = time.perf_counter()
        try:
            result = scan_library(self.folders, LibraryCache(self.cache_path),
                                  progress=self.progress.emit, should_stop=lambda: self._stop)
        except Exception as exc:  # noqa: BLE001 - shown in the panel, the app goes on
            log.warning("library scan failed: %s", exc, exc_info=True)
            result = ScanResult([], missing_folders=[f"scan failed: {exc}"])
        self.done.emit(result, time.perf_counter() - t0)


class LibraryPanel(QWidget):
    """Folders, the grouped model list with fit verdicts, and "Use on the board".

    ``settings`` keeps the folders (``library/folders``); ``cache_path`` is the header
    cache (None: the user's cache folder).

    Signals:
        scanned(): a scan finished and the list was redrawn.
    """

    scanned = Signal()

    def __init__(self, controller: PlanController, settings: QSettings,
                 cache_path: str | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctl = controller
        self.settings = settings
        self.cache_path = cache_path
        self.entries: list[LibraryEntry] = []
        self.verdicts: dict[str, FitVerdict] = {}
        self.last_scan: ScanResult | None = None
        self.thread: QThread | None = None
        self.scanner: LibraryScanner | None = None
        #: Asks for a missing companion (``what``, model name) -> a path or "" (tests
        #: replace it).
        self.ask_file: Any = self._ask_file
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(8)
        top = QHBoxLayout()
        self.folders = QListWidget()
        self.folders.setMaximumHeight(64)
        self.folders.setAccessibleName("Model folders")
        self.folders.setToolTip("Folders whose model files the library lists")
        top.addWidget(self.folders, 1)
        col = QVBoxLayout()
        self.add_btn = QPushButton("Add folder…")
        self.add_btn.clicked.connect(self.add_folder_dialog)
        self.remove_btn = QPushButton("Remove folder")
        self.remove_btn.clicked.connect(self.remove_folder)
        col.addWidget(self.add_btn)
        col.addWidget(self.remove_btn)
        top.addLayout(col)
        lay.addLayout(top)
        bar = QHBoxLayout()
        self.filter = QLineEdit()
        self.filter.setPlaceholderText("Filter by name, kind or family")
        self.filter.setClearButtonEnabled(True)
        self.filter.textChanged.connect(self._apply_filter)
        bar.addWidget(self.filter, 1)
        self.rescan_btn = QPushButton("Rescan")
        self.rescan_btn.setToolTip("Read the folders again (changed files only: the others "
                                   "come from the cache)")
        self.rescan_btn.clicked.connect(self.scan)
        bar.addWidget(self.rescan_btn)
        self.use_btn = QPushButton("Use on the board")
        self.use_btn.setObjectName("Primary")
        self.use_btn.setToolTip("Open the model with its text encoders and VAE and the plan "
                                "its verdict names (Enter)")
        self.use_btn.clicked.connect(self.use_current)
        bar.addWidget(self.use_btn)
        lay.addLayout(bar)
        self.progress = QProgressBar()
        self.progress.setMaximumHeight(6)
        self.progress.setTextVisible(False)
        self.progress.hide()
        lay.addWidget(self.progress)
        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(list(COLUMNS))
        self.tree.setRootIsDecorated(True)
        self.tree.setUniformRowHeights(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setAccessibleName("Model files")
        head = self.tree.header()
        head.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        head.setStretchLastSection(True)
        self.tree.setColumnWidth(0, 240)
        self.tree.itemActivated.connect(lambda *_: self.use_current())
        self.tree.currentItemChanged.connect(lambda *_: self._current_changed())
        lay.addWidget(self.tree, 1)
        self.details = WrapLabel()
        self.details.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.details)
        self.status = QLabel()
        self.status.setObjectName("Caption")
        self.status.setWordWrap(True)
        lay.addWidget(self.status)
        for f in self.folder_list():
            self.folders.addItem(f)
        controller.inventoryChanged.connect(self.judge)
        controller.planChanged.connect(self._budgets_changed)
        self._budget_key: object = self._budgets()
        self._current_changed()
        self.status.setText("Add the folders where your models are" if not self.folder_list()
                            else "")

    # ------------------------------------------------------------------ folders
    def folder_list(self) -> list[str]:
        value = self.settings.value("library/folders") or []
        return [str(v) for v in ([value] if isinstance(value, str) else
                                 value if isinstance(value, (list, tuple)) else [])]

    def add_folder(self, folder: str | Path) -> None:
        """Add ``folder`` (kept in the settings) and scan."""
        folders = self.folder_list()
        if str(folder) not in folders:
            folders.append(str(folder))
            self.settings.setValue("library/folders", folders)
            self.folders.addItem(str(folder))
        self.scan()

    def add_folder_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Add a model folder")
        if path:
            self.add_folder(path)

    def remove_folder(self) -> None:
        item = self.folders.currentItem()
        if item is None:
            return
        folders = [f for f in self.folder_list() if f != item.text()]
        self.settings.setValue("library/folders", folders)
        self.folders.takeItem(self.folders.row(item))
        self.scan()

    # ------------------------------------------------------------------ scanning
    def scan(self) -> bool:
        """Scan the folders on a worker thread (False while one runs)."""
        if self.thread is not None:
            return False
        folders = self.folder_list()
        if not folders:
            self.entries, self.verdicts = [], {}
            self._fill()
            return False
        self.progress.setRange(0, 0)
        self.progress.show()
        self.status.setText(f"reading {', '.join(folders)}…")
        self.thread = QThread(self)
        self.scanner = LibraryScanner(folders, self.cache_path)
        self.scanner.moveToThread(self.thread)
        self.thread.started.connect(self.scanner.run)
        self.scanner.progress.connect(self._scan_progress)
        self.scanner.done.connect(self._scan_done)
        self.thread.start()
        return True

    def is_scanning(self) -> bool:
        return self.thread is not None

    @Slot(int, int)
    def _scan_progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(done)

    @Slot(object, float)
    def _scan_done(self, result: ScanResult, seconds: float) -> None:
        if self.thread is not None:
            self.thread.quit()
            self.thread.wait(5000)
        self.thread = self.scanner = None
        self.progress.hide()
        self.last_scan = result
        self.entries = result.entries
        self.judge()
        missing = "".join(f" · not found: {f}" for f in result.missing_folders)
        self.status.setText(f"{len(result.entries)} files · {result.headers_read} headers read, "
                            f"{result.cached} from the cache · {seconds:.2f} s{missing}")
        self.scanned.emit()

    def shutdown(self) -> None:
        if self.scanner is not None:
            self.scanner.stop()
        if self.thread is not None:
            self.thread.quit()
            self.thread.wait(10_000)

    # ------------------------------------------------------------------ verdicts
    def _budgets(self) -> tuple:
        pl = self.ctl.placement
        return (pl.budget_default, pl.budgets, pl.rpc_servers)

    def base(self) -> Placement:
        """The board's ``--max-vram`` budgets and RPC servers (module entries are the
        verdict's to choose)."""
        pl = self.ctl.placement
        return Placement(budget_default=pl.budget_default, budgets=pl.budgets,
                         rpc_servers=pl.rpc_servers)

    def _budgets_changed(self, source: str) -> None:
        key = self._budgets()
        if key != self._budget_key:
            self._budget_key = key
            self.judge()

    def judge(self) -> None:
        """Verdicts of every diffusion model for the controller's devices, then redraw."""
        self.verdicts = {}
        base = self.base()
        inventory = self.ctl.session.profiled_inventory()  # measured profiles price the time
        for e in self.entries:
            if e.kind in DIFFUSION_KINDS and e.error is None and e.profile:
                try:
                    self.verdicts[e.path] = fit_verdict(e, self.entries, inventory, base)
                except (SdplanError, ValueError) as exc:
                    log.info("no verdict for %s: %s", e.path, exc)
        self._fill()

    # ------------------------------------------------------------------ view
    def _fill(self) -> None:
        current = self.current()
        self.tree.clear()
        for group, items in grouped(self.entries).items():
            top = QTreeWidgetItem([f"{group}  ({len(items)})"])
            f = top.font(0)
            f.setBold(True)
            top.setFont(0, f)
            top.setFirstColumnSpanned(False)
            self.tree.addTopLevelItem(top)
            for e in items:
                top.addChild(self._row(e))
            top.setExpanded(True)
        for c in range(len(COLUMNS) - 1):
            self.tree.resizeColumnToContents(c)
        self.tree.setColumnWidth(0, min(self.tree.columnWidth(0), 360))
        if current is not None:
            self.select(current.path)
        self._apply_filter(self.filter.text())

    def _row(self, e: LibraryEntry) -> QTreeWidgetItem:
        v = self.verdicts.get(e.path)
        kind = KIND_TITLES.get(e.kind, e.kind)
        if e.kind == "encoder" and e.encoders:
            kind += f" · {', '.join(e.encoders)}"
        elif e.kind == "vae" and e.latent_channels:
            kind += f" · {e.latent_channels} ch"
        elif e.variant:
            kind += f" · {e.variant}"
        fits = VERDICT_SHORT[v.verdict] if v else ("" if e.error is None else "unreadable")
        plan = (" ".join(v.flags()) or "default placement") if v else (e.error or "")
        if v and v.missing:
            plan += f"  (without {', '.join(v.missing)})"
        item = QTreeWidgetItem([e.name, kind, f"{e.size / GIB:.2f} GiB", e.quant or "", fits,
                                v.time_text() if v else "", plan])
        item.setData(0, PathRole, e.path)
        for col in (2, 5):
            item.setTextAlignment(col, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        tip = [e.path]
        if v is not None:
            tip += [v.summary(), describe_devices(v), *v.reasons, *v.notes]
        elif e.error:
            tip.append(e.error)
        item.setToolTip(0, "\n".join(tip))
        item.setToolTip(4, "\n".join(tip[1:]) if v else "")
        item.setToolTip(5, (f"{v.time_text(long=True)} at {v.width}x{v.height}"
                            + ("\n* default speeds: sdplan devices --calibrate measures this "
                               "machine's" if v.time and not v.time["measured"] else ""))
                        if v and v.time else "")
        item.setToolTip(6, plan)
        if v is not None:
            item.setForeground(4, QBrush(QColor(VERDICT_COLOURS[v.verdict])))
        return item

    def _apply_filter(self, text: str) -> None:
        words = text.lower().split()
        for i in range(self.tree.topLevelItemCount()):
            top = self.tree.topLevelItem(i)
            shown = 0
            for j in range(top.childCount()):
                child = top.child(j)
                hay = " ".join([top.text(0), *(child.text(c) for c in range(4))]).lower()
                hide = not all(w in hay for w in words)
                child.setHidden(hide)
                shown += not hide
            top.setHidden(shown == 0)

    def rows(self) -> dict[str, tuple[str, str, str]]:
        """Name -> (group, kind text, fits text) as listed (for checks and tests)."""
        out = {}
        for i in range(self.tree.topLevelItemCount()):
            top = self.tree.topLevelItem(i)
            group = top.text(0).rsplit("  (", 1)[0]
            for j in range(top.childCount()):
                c = top.child(j)
                out[str(c.data(0, PathRole))] = (group, c.text(1), c.text(4))
        return out

    def select(self, path: str) -> bool:
        for i in range(self.tree.topLevelItemCount()):
            top = self.tree.topLevelItem(i)
            for j in range(top.childCount()):
                if top.child(j).data(0, PathRole) == path:
                    self.tree.setCurrentItem(top.child(j))
                    return True
        return False

    def current(self) -> LibraryEntry | None:
        item = self.tree.currentItem()
        path = item.data(0, PathRole) if item is not None else None
        return next((e for e in self.entries if e.path == path), None) if path else None

    def _current_changed(self) -> None:
        e = self.current()
        self.use_btn.setEnabled(e is not None and e.error is None and e.kind != "lora")
        self.details.setText(self.describe(e) if e is not None else "")

    def describe(self, e: LibraryEntry) -> str:
        """The selected file in full: path, then the verdict with its plan, devices and
        companions (or why it could not be read)."""
        lines = [e.path]
        v = self.verdicts.get(e.path)
        if v is not None:
            lines.append(v.summary())
            lines.append("planned: " + describe_devices(v))
            others = [Path(p).name for k, ps in v.files.items()
                      if k not in ("model", "diffusion_model") for p in ps]
            if others:
                lines.append("with " + ", ".join(others))
            lines += list(v.reasons)
        elif e.error:
            lines.append(e.error)
        return "\n".join(lines)

    # ------------------------------------------------------------------ use
    def _ask_file(self, what: str, model: str) -> str:
        path, _ = QFileDialog.getOpenFileName(
            self, f"{model} needs a {what} file (Cancel: plan without it)", "",
            "Model files (*.safetensors *.gguf *.sft);;All files (*)")
        return path

    def use_current(self) -> bool:
        """Put the selected file on the board (see module docstring); True when it changed."""
        e = self.current()
        if e is None or e.error is not None or e.kind == "lora":
            return False
        v = self.verdicts.get(e.path)
        if v is None:  # an encoder, a VAE, an upscaler: joins the open files
            try:
                self.ctl.open_files([e.path])
            except (SdplanError, OSError, ValueError) as exc:
                self.ctl.status.emit(f"cannot open {e.name}: {exc}")
                return False
            return True
        files = {k: list(p) for k, p in v.files.items()}
        for what in v.missing:
            path = self.ask_file(what, e.name)
            if path:
                files[what if what in MODEL_FLAGS else "model"] = [path]
        try:
            self.ctl.load_model_files(files)
        except (SdplanError, OSError, ValueError) as exc:
            self.ctl.status.emit(f"cannot open {e.name}: {exc}")
            return False
        self.ctl.set_generation(width=v.width, height=v.height)  # the size it was judged at
        self.ctl.planChanged.emit("load")  # the generation panel shows that size
        try:
            placement = Placement.from_strings(v.backend, v.params_backend, v.max_vram,
                                               rpc_servers=self.ctl.placement.rpc_servers)
            self.ctl.edit(placement, f"plan for {e.name}")
        except SdplanError as exc:
            self.ctl.status.emit(f"plan not applied: {exc}")
        self.ctl.status.emit(f"{e.name}: {v.summary()}")
        return True
