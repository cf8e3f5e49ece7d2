"""The main window: board, flag strings, RPC servers and the generation panel, with menus,
toolbar, shortcuts, file drops, recent files and QSettings persistence."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from PySide6.QtCore import QByteArray, QRect, QSettings, Qt, QTimer
from PySide6.QtGui import (
    QCloseEvent,
    QDragEnterEvent,
    QDropEvent,
    QGuiApplication,
    QResizeEvent,
)
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)
from sdplan.app import theme
from sdplan.app.board.board import Board
from sdplan.app.controller import PlanController
from sdplan.app.dialogs import AutoPlanDialog
from sdplan.app.gallery import GalleryPanel
from sdplan.app.generation import GenerationPanel
from sdplan.app.icons import app_icon
from sdplan.app.library_panel import LibraryPanel
from sdplan.app.menus import install_menus
from sdplan.app.outputs import SETTING as OUTPUT_SETTING
from sdplan.app.outputs import older_results, output_folder
from sdplan.app.queue_panel import QueuePanel, QueueRunner
from sdplan.app.rpc import RpcPanel
from sdplan.app.screen import FOLD_BELOW, first_geometry, fitted
from sdplan.app.server_queue import SERVER_QUEUE_NAME
from sdplan.app.strings import StringsPanel
from sdplan.app.worker import ClientFactory
from sdplan.core.errors import SdplanError
from sdplan.core.pipelines.job_queue import JobQueue
from sdplan.core.planning.autoplan import plan_diff

log = logging.getLogger(__name__)
MAX_RECENT = 8
REFRESH_MS = 5000
MODEL_FILTER = "Model files (*.safetensors *.gguf *.ckpt *.pt *.pth *.bin);;All files (*)"


def apply_theme(app: QApplication, mode: str = "system") -> theme.Theme:
    """Fusion style with sdplan's palette and style sheet for ``mode``."""
    app.setStyle("Fusion")
    t = theme.current(mode)
    app.setPalette(theme.palette(t))
    app.setStyleSheet(theme.style_sheet(t))
    return t


class MainWindow(QMainWindow):
    """See module docstring. ``settings`` is where recent files, the last plan and the
    theme persist; ``client_factory`` makes engine clients for the generation panel."""

    def __init__(self, controller: PlanController, settings: QSettings | None = None, *,
                 client_factory: ClientFactory | None = None, auto_refresh: bool = False,
                 history_dir: str | Path | None = None, queue_path: str | Path | None = None,
                 library_cache: str | None = None) -> None:
        super().__init__()
        self.ctl = controller
        self.settings = settings or QSettings("sdplan", "sdplan")
        self.setWindowTitle("sdplan")
        self.setWindowIcon(app_icon())
        self.setAcceptDrops(True)
        central = QWidget()
        outer = QHBoxLayout(central)
        outer.setContentsMargins(8, 6, 8, 6)
        # left: the board (with the flags under it), the library and the gallery as tabs;
        # right: the generation panel, the queue and RPC servers, in a resizable splitter
        self.split = QSplitter(Qt.Orientation.Horizontal)
        self.split.setChildrenCollapsible(False)
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        board_page = QWidget()
        ll = QVBoxLayout(board_page)
        ll.setContentsMargins(0, 6, 0, 0)
        ll.setSpacing(8)
        head = QHBoxLayout()
        self.model_label = QLabel()
        self.model_label.setObjectName("Title")
        self.model_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        head.addWidget(self.model_label, 1)
        self.arch_label = QLabel()
        self.arch_label.setObjectName("Badge")
        head.addWidget(self.arch_label)
        self.auto_fit_label = QLabel()
        self.auto_fit_label.setObjectName("Badge")
        self.auto_fit_label.hide()
        head.addWidget(self.auto_fit_label)
        self.verdict = QLabel()
        self.verdict.setObjectName("Verdict")
        head.addWidget(self.verdict)
        ll.addLayout(head)
        self.board = Board(controller)
        ll.addWidget(self.board, 1)  # the board takes the space the folded flags leave
        self.strings = StringsPanel(controller)
        ll.addWidget(self.strings)
        self.tabs.addTab(board_page, "Board")
        self.library = LibraryPanel(controller, self.settings, library_cache)
        self.tabs.addTab(self.library, "Library")
        # pictures go to the output folder (``history_dir`` when given: tests, scripts)
        hist = Path(history_dir) if history_dir else output_folder(self.settings)
        older = None if history_dir else older_results(self.settings)
        self.gallery = GalleryPanel([hist, *([older] if older and older != hist else [])])
        self.tabs.addTab(self.gallery, "Gallery")
        self.tabs.currentChanged.connect(self._tab_changed)
        self.split.addWidget(self.tabs)
        self.side = QTabWidget()
        self.side.setDocumentMode(True)
        self.generation = GenerationPanel(controller, hist, client_factory)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(self.generation)
        # the panel scrolls vertically; it is never narrower than its contents
        scroll.setMinimumWidth(self.generation.minimumSizeHint().width()
                               + scroll.verticalScrollBar().sizeHint().width() + 2)
        self.side.addTab(scroll, "Generate")
        qpath = queue_path or Path(self.settings.fileName()).parent / "sdplan-queue.json"
        self.queue = JobQueue(qpath)
        self.startup_notes: list[str] = list(self.queue.notes)  # files set aside at start
        if self.queue.counts()["queued"]:  # jobs left from the last session wait for Resume
            self.queue.set_paused(True)
        self.runner = QueueRunner(self.queue, self.generation, self)
        self.queue_panel = QueuePanel(self.runner, server_file=qpath.parent / SERVER_QUEUE_NAME)
        self.side.addTab(self.queue_panel, "Queue")
        self.rpc = RpcPanel(controller)
        self.rpc_page = QWidget()
        rl = QVBoxLayout(self.rpc_page)
        rl.setContentsMargins(0, 6, 0, 0)
        rl.addWidget(self.rpc)
        rl.addStretch(1)
        self.side.addTab(self.rpc_page, "RPC servers")
        self.split.addWidget(self.side)
        self.split.setStretchFactor(0, 3)
        self.split.setStretchFactor(1, 1)
        self.split.setSizes([1040, 380])
        outer.addWidget(self.split)
        self.setCentralWidget(central)
        install_menus(self)
        self._recent_menu()
        self.status_label = QLabel()
        self.statusBar().addWidget(self.status_label, 1)
        controller.status.connect(self.show_status)
        controller.planChanged.connect(self._plan_changed)
        controller.modelChanged.connect(self._model_changed)
        self.rpc.refresh_btn.clicked.connect(self.refresh_devices)
        self.strings.copyRequested.connect(self.copy_command)
        self.strings.pasteRequested.connect(self.paste_command)
        self.strings.exportRequested.connect(self.export_plan)
        self.strings.importRequested.connect(self.import_plan)
        self.strings.collapsedChanged.connect(self._flags_folded)
        self.generation.resultSaved.connect(self.gallery.add_result)
        self.generation.outputFolderChanged.connect(self._output_folder_changed)
        self.generation.history.reuseRequested.connect(self.reuse_result_file)
        self.generation.history.galleryRequested.connect(self.show_in_gallery)
        self.gallery.reuseRequested.connect(self.reuse_result)
        self.gallery.status.connect(self.show_status)
        self.queue_panel.openResult.connect(self.show_in_gallery)
        self.library.scanned.connect(self._library_scanned)
        self.timer = QTimer(self)
        self.timer.setInterval(REFRESH_MS)
        self.timer.timeout.connect(self._timer_refresh)
        self.auto_refresh_act.setChecked(auto_refresh)
        self._model_changed()
        self._plan_changed("load")
        geo = self.settings.value("window/geometry")
        if not isinstance(geo, (QByteArray, bytes)) or not self.restoreGeometry(geo):
            self.setGeometry(first_geometry(self._available()))  # none, or a damaged settings file
        if self.startup_notes:
            self.show_status(self.startup_notes[-1])
            self.status_label.setToolTip("\n".join(self.startup_notes))

    # ------------------------------------------------------------------ actions
    def undo_tip(self, text: str) -> None:
        self.undo_act.setToolTip(f"Undo {text}".strip())

    def redo_tip(self, text: str) -> None:
        self.redo_act.setToolTip(f"Redo {text}".strip())

    def show_flags(self, on: bool) -> None:
        """Unfold (``on``) or fold the flags panel."""
        self.strings.set_collapsed(not on)

    def plan_for(self, name: str) -> bool:
        """Plan for the built-in profile ``name`` (errors in a message box)."""
        try:
            self.ctl.plan_for_builtin(name)
        except SdplanError as exc:
            QMessageBox.warning(self, "Cannot plan for this model", str(exc))
            return False
        return True

    # ------------------------------------------------------------------ plan/status
    def show_status(self, text: str) -> None:
        self.status_label.setText(text)

    def add_startup_note(self, text: str) -> None:
        """Keep and show a note on a store read at start-up (a file set aside); the
        status line's tooltip lists them all."""
        self.startup_notes.append(text)
        self.show_status(text)
        self.status_label.setToolTip("\n".join(self.startup_notes))

    def _plan_changed(self, source: str) -> None:
        fit = self.ctl.fit
        if fit is None:
            self.verdict.setText("sizes unknown: model files not on this machine"
                                 if self.ctl.session.missing_files else "no model: sizes unknown")
            self.verdict.setProperty("fits", True)
        else:
            self.verdict.setText("✓ Fits" if fit.fits else f"✕ Does not fit "
                                 f"({len(fit.reasons)} device{'s' if len(fit.reasons) > 1 else ''})")
            self.verdict.setProperty("fits", fit.fits)
            self.verdict.setToolTip("\n".join(fit.reasons) or
                                    f"Estimated at {fit.width}x{fit.height}, batch {fit.batch}")
        self.verdict.style().unpolish(self.verdict)
        self.verdict.style().polish(self.verdict)
        # plan warnings show next to the card, column or field they concern
        fitted = self.ctl.plan.auto_fit
        self.auto_fit_act.blockSignals(True)
        self.auto_fit_act.setChecked(self.ctl.placement.auto_fit)
        self.auto_fit_act.blockSignals(False)
        self.pin_act.setEnabled(fitted is not None)
        self.auto_fit_label.setVisible(fitted is not None)
        if fitted is not None:
            self.auto_fit_label.setText("sd-cli auto-fit" + (" · time-share" if
                                                             fitted.time_share else ""))
            self.auto_fit_label.setToolTip(
                f"sd-cli --auto-fit chooses --backend \"{fitted.backend}\""
                + (f" --params-backend \"{fitted.params_backend}\"" if fitted.params_backend
                   else "") + "\nMove a card or use Plan → Pin to make it explicit")
        self.settings.setValue("plan/last", json.dumps(self.ctl.plan_json(), default=str))

    def _model_changed(self) -> None:
        name, arch = self.ctl.session.title()
        self.model_label.setText(name)
        self.arch_label.setText(arch or "")
        self.arch_label.setVisible(bool(arch))
        self.arch_label.setToolTip(f"sizes from {self.ctl.session.profile_source}"
                                   if self.ctl.session.profile_source else "")
        if self.ctl.model_files:
            self.model_label.setToolTip("\n".join(
                f"--{k.replace('_', '-')} {p}" for k, v in self.ctl.model_files.items()
                for p in v))

    # ------------------------------------------------------------------ files
    def open_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Open model files", "", MODEL_FILTER)
        if paths:
            self.open_files(paths)

    def open_files(self, paths: list[str]) -> bool:
        """Open model files (errors in a message box, the plan unchanged)."""
        try:
            self.ctl.open_files(paths)
        except (SdplanError, OSError, ValueError) as exc:
            QMessageBox.warning(self, "Cannot open model files", str(exc))
            return False
        recent = [p for p in self.recent_files() if p not in paths]
        self.settings.setValue("files/recent", (list(paths) + recent)[:MAX_RECENT])
        self._recent_menu()
        self.show_status(f"opened {', '.join(Path(p).name for p in paths)}")
        return True

    def recent_files(self) -> list[str]:
        value = self.settings.value("files/recent") or []
        return [str(v) for v in ([value] if isinstance(value, str) else
                                 value if isinstance(value, (list, tuple)) else [])]

    def _recent_menu(self) -> None:
        self.recent_menu.clear()
        for p in self.recent_files():
            a = self.recent_menu.addAction(Path(p).name)
            a.setToolTip(p)
            a.triggered.connect(lambda _=False, path=p: self.open_files([path]))
        self.recent_menu.setEnabled(bool(self.recent_files()))

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802
        if event.mimeData().hasUrls():
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if paths:
            event.acceptProposedAction()
            if len(paths) == 1 and paths[0].endswith(".json"):
                self._import_plan_file(paths[0])
            elif len(paths) == 1 and paths[0].lower().endswith((".png", ".webm", ".mp4")):
                self.import_png(paths[0])
            else:
                self.open_files(paths)

    def import_png(self, path: str) -> bool:
        """Restore prompt, settings, model files and placement from a picture (sd-cli's or
        sdplan's metadata); a message box says why not."""
        try:
            taken = self.ctl.import_png(path)
        except SdplanError as exc:
            QMessageBox.warning(self, "Cannot restore from the picture", str(exc))
            return False
        self.show_status(f"from {Path(path).name}: {', '.join(taken)}")
        return True

    # ------------------------------------------------------------------ auto-fit
    def pin_auto_fit(self) -> None:
        if self.ctl.pin_auto_fit():
            self.show_status("pinned auto-fit's placement as explicit strings")

    # ------------------------------------------------------------------ commands
    def copy_command(self) -> None:
        QGuiApplication.clipboard().setText(self.ctl.command_line())
        self.show_status("sd-cli command copied")

    def paste_command(self, text: str | None = None) -> bool:
        """The one paste path (Edit menu, Ctrl+Shift+V, the flags panel's button): with
        ``text`` the command is imported at once; without, the paste dialog opens with the
        clipboard's text and shows what it will bring before Import applies it
        (:class:`~sdplan.app.paste_dialog.PasteDialog`, kept as :attr:`paste_dialog`)."""
        if text is not None:
            return self.apply_paste(text)
        from sdplan.app.paste_dialog import PasteDialog

        dlg = PasteDialog(self.ctl.session, QGuiApplication.clipboard().text(), self)
        self.paste_dialog = dlg
        dlg.accepted.connect(lambda: self.apply_paste(dlg.text()))
        dlg.open()
        return True

    paste_dialog = None

    def apply_paste(self, text: str) -> bool:
        """Import an sd-cli command as one undo step; the status bar says what it brought
        (files not on this machine, where the sizes come from, ignored arguments)."""
        try:
            pasted = self.ctl.import_command(text)
        except SdplanError as exc:
            self.show_status(f"✕ cannot import the command: {exc}")
            self.strings.show_error(exc if hasattr(exc, "span") else None)  # type: ignore[arg-type]
            return False
        extra = [*pasted.notes, *([f"ignored: {' '.join(pasted.unknown)}"] if pasted.unknown else [])]
        self.show_status("imported the sd-cli command" + (f" ({'; '.join(extra)})" if extra else ""))
        return True

    def export_plan(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export plan", "plan.json", "JSON (*.json)")
        if path:
            try:
                self.ctl.save_plan(path)
            except OSError as exc:
                QMessageBox.warning(self, "Cannot export the plan", str(exc))

    def import_plan(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import plan", "", "JSON (*.json)")
        if path:
            self._import_plan_file(path)

    def _import_plan_file(self, path: str) -> bool:
        from sdplan.core.planning.bounded_json import read_json  # one bounded reader

        try:
            self.ctl.load_plan_json(read_json(path, what="plan file"), source=path)
        except (OSError, ValueError, TypeError, SdplanError) as exc:
            QMessageBox.warning(self, "Cannot import the plan", f"{path}: {exc}")
            return False
        return True

    def load_hardware(self, path: str | None = None) -> bool:
        """Plan for the devices of a saved inventory (a hardware profile); asks for the file
        when ``path`` is None. Refreshes stop (the devices are not this machine's)."""
        if path is None:
            path, _ = QFileDialog.getOpenFileName(self, "Load hardware profile", "",
                                                  "Device inventory (*.json)")
            if not path:
                return False
        try:
            self.ctl.load_hardware(path)
        except SdplanError as exc:
            QMessageBox.warning(self, "Cannot load the hardware profile", str(exc))
            return False
        self.auto_refresh_act.setChecked(False)
        self.show_status(f"planning for the devices in {Path(path).name}")
        return True

    def save_hardware(self, path: str | None = None) -> bool:
        """Save the devices (with their free memory now) as an inventory JSON file that
        ``sdplan plan --devices`` and Load hardware profile read back."""
        if path is None:
            path, _ = QFileDialog.getSaveFileName(self, "Save hardware profile",
                                                  "devices.json", "Device inventory (*.json)")
            if not path:
                return False
        data = self.ctl.session.hardware_json()
        try:
            Path(path).write_text(json.dumps(data, indent=1), encoding="utf-8")
        except OSError as exc:
            QMessageBox.warning(self, "Cannot save the hardware profile", f"{path}: {exc}")
            return False
        self.show_status(f"saved {len(data['devices'])} devices to {Path(path).name}")
        return True

    def load_profile(self) -> None:
        from sdplan.core.planning.profile import Profile

        path, _ = QFileDialog.getOpenFileName(self, "Load model profile", "", "JSON (*.json)")
        if path:
            try:
                self.ctl.set_profile(Profile.load(path))
            except SdplanError as exc:
                QMessageBox.warning(self, "Cannot load the profile", str(exc))

    def refresh_devices(self, quiet: bool = False) -> None:
        """Re-read free memory: local devices at once; RPC devices (unless ``quiet``, as on
        the timer) by a device query in a child process, answered asynchronously."""
        try:
            self.ctl.refresh_inventory()
        except SdplanError as exc:
            self.rpc.show_error(str(exc))
            self.side.setCurrentWidget(self.rpc_page)  # the error shows where it belongs
            return
        if not quiet:
            self.rpc.requery()
            self.show_status("free memory refreshed")

    def set_auto_refresh(self, on: bool) -> None:
        """Refresh free memory every :data:`REFRESH_MS` ms (local devices only)."""
        if on:
            self.timer.start()
        else:
            self.timer.stop()

    def _timer_refresh(self) -> None:
        self.refresh_devices(quiet=True)

    # ------------------------------------------------------------------ auto plan
    def propose(self) -> AutoPlanDialog | None:
        """The Auto plan dialog for the current model (None without a profile)."""
        try:
            review = self.ctl.session.auto_plan_review()
        except SdplanError as exc:
            self.show_status(str(exc))
            return None
        rows = plan_diff(self.ctl.plan, review.proposal.plan, self.ctl.modules())
        return AutoPlanDialog(review, rows, self)

    def auto_plan(self) -> None:
        dlg = self.propose()
        if dlg is not None and dlg.exec():
            self.apply_auto_plan(dlg)

    def apply_auto_plan(self, dlg: AutoPlanDialog) -> None:
        """Apply the dialog's choice: an alternative (with its image size and batch), or
        the proposal."""
        alt = dlg.choice
        if alt is None:
            self.ctl.edit(dlg.proposal.placement, "auto plan")
            return
        g = self.ctl.generation
        if (alt.width, alt.height, alt.batch) != (g.get("width"), g.get("height"),
                                                  g.get("batch_count")):
            self.ctl.set_generation(width=alt.width, height=alt.height, batch_count=alt.batch)
            self.ctl.planChanged.emit("load")  # the generation panel shows the new size
        self.ctl.edit(alt.placement, f"auto plan: {alt.label}")
        self.show_status(f"applied: {alt.label}")

    def _flags_folded(self, collapsed: bool) -> None:
        self.settings.setValue("view/flags_collapsed", collapsed)
        if self.flags_act.isChecked() == collapsed:
            self.flags_act.setChecked(not collapsed)

    def fit_to_height(self, height: int) -> None:
        """Fold the flags when the window is short (under :data:`~sdplan.app.screen.FOLD_BELOW`
        px) and the user has not chosen: the board takes the space. Called whenever the
        window's height changes (first show, resize, maximise)."""
        saved = self.settings.value("view/flags_collapsed")
        if saved is None:
            fold = height < FOLD_BELOW
            if fold != self.strings.is_collapsed():
                self.strings.set_collapsed(fold)
            self.settings.remove("view/flags_collapsed")  # still the user's to choose
        else:
            self.strings.set_collapsed(str(saved).lower() in ("true", "1"))

    def _available(self) -> QRect:
        screen = self.screen() or QGuiApplication.primaryScreen()
        return screen.availableGeometry()

    def showEvent(self, event: object) -> None:  # noqa: N802
        super().showEvent(event)  # type: ignore[arg-type]
        if not self._shown:
            self._shown = True
            self.fit_to_height(self.height())
            QTimer.singleShot(0, self._onto_screen)

    def _onto_screen(self) -> None:
        """Once shown with its real frame: bring a window larger than the screen back
        inside it (a saved geometry from a larger screen, a tall frame); not a window sized
        on purpose (:attr:`keep_size`: ``--screenshot --size``)."""
        if self.keep_size or self.isMaximized() or self.isFullScreen():
            return
        inside = fitted(self.frameGeometry(), self.geometry(), self._available())
        if inside is not None:
            self.setGeometry(inside)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802
        super().resizeEvent(event)
        if self._shown and event.size().height() != event.oldSize().height():
            self.fit_to_height(event.size().height())

    _shown = False
    #: The window keeps the size it was given, screen or not (``sdplan gui --screenshot``).
    keep_size = False

    # ------------------------------------------------------------------ tabs, results
    def _tab_changed(self, index: int) -> None:
        """The library scans and the gallery reads its folder the first time they show."""
        page = self.tabs.widget(index)
        if page is self.library and self.library.last_scan is None \
                and not self.library.is_scanning():
            self.library.scan()
        elif page is self.gallery and not self._gallery_loaded:
            self._gallery_loaded = True
            self.gallery.reload()

    _gallery_loaded = False

    def _library_scanned(self) -> None:
        if self.library.last_scan is not None:
            self.show_status(self.library.status.text())

    def show_in_gallery(self, path: str) -> None:
        """Open the Gallery tab with ``path`` selected."""
        self.tabs.setCurrentWidget(self.gallery)
        if not self.gallery.select_path(path):
            self.gallery.reload()
            self.gallery.select_path(path)

    def reuse_result_file(self, path: str) -> None:
        from sdplan.core.pipelines.stages.results import read_result

        try:
            self.reuse_result(read_result(path))
        except OSError as exc:
            self.show_status(f"cannot read {path}: {exc}")

    def reuse_result(self, info: object) -> None:
        """Put a result's settings (and its model files and placement, when they exist
        here) back into the generation panel and the board."""
        notes = self.ctl.reuse_result(info.settings, info.model_files,  # type: ignore[attr-defined]
                                      info.placement,  # type: ignore[attr-defined]
                                      getattr(info, "architecture", None))
        self.side.setCurrentIndex(0)
        name = Path(info.path).name  # type: ignore[attr-defined]
        self.show_status(f"settings of {name} in the panel" + (
            " (" + "; ".join(notes) + ")" if notes else ""))

    def choose_output_folder(self) -> None:
        """File → Output folder…: where pictures are saved from now on."""
        self.generation.choose_output_folder()

    def _output_folder_changed(self, folder: str) -> None:
        """Keep the chosen folder (settings), show its pictures in the gallery, say so."""
        self.settings.setValue(OUTPUT_SETTING, folder)
        self.gallery.add_folder(folder)
        self.show_status(f"pictures are saved in {folder}")

    # ------------------------------------------------------------------ theme, close
    def set_theme(self, mode: str) -> None:
        app = QApplication.instance()
        if isinstance(app, QApplication):
            apply_theme(app, mode)
            self.settings.setValue("view/theme", mode)
            self.board.rebuild()
        if mode in self.theme_actions:
            self.theme_actions[mode].setChecked(True)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802
        self.runner.shutdown()
        self.library.shutdown()
        self.generation.shutdown()
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("plan/last", json.dumps(self.ctl.plan_json(), default=str))
        super().closeEvent(event)
