"""The generation panel: prompt and settings, Generate/Cancel, progress with steps/s and
ETA, the live preview, results saved to a history folder (a video family's run as a WebM
that plays in the panel: :mod:`sdplan.app.video`), and engine failures shown with
one-click retry. The engine runs behind :class:`~sdplan.app.worker.GenerationWorker` in a
QThread; the UI never blocks.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QThread, Signal, Slot
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QListWidgetItem,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from sdplan.app.controller import PlanController
from sdplan.app.history_strip import HistoryStrip
from sdplan.app.inputs import InputsPanel
from sdplan.app.module_groups import ModuleGroups
from sdplan.app.pictures import to_qimage, write_pictures
from sdplan.app.settings_form import settings_form
from sdplan.app.video import VideoPlayer, is_video_file, write_video_result
from sdplan.app.worker import ClientFactory, GenerationWorker, engine_unavailable_reason
from sdplan.app.wrap_label import ElidedLabel
from sdplan.core.errors import OutputError
from sdplan.core.families import recommended_sizes
from sdplan.core.pipelines.stages.results import read_result
from sdplan.core.sampling.samplers import SAMPLERS as CORE_SAMPLERS
from sdplan.core.sampling.schedules import SCHEDULES as CORE_SCHEDULES
from sdplan.core.session.runs import describe_params, run_record

log = logging.getLogger(__name__)

#: The samplers and schedulers offered: the engine's own lists (sd-cli's names and order).
SAMPLERS = CORE_SAMPLERS
SCHEDULES = CORE_SCHEDULES

__all__ = ["SAMPLERS", "SCHEDULES", "GenerationPanel", "describe_params", "to_qimage"]


class GenerationPanel(QFrame):
    """See module docstring. ``client_factory`` makes the engine client (tests pass a
    replaying fake); ``history_dir`` is where results are saved; ``resultSaved(str)``
    names each image file written."""

    resultSaved = Signal(str)
    outputFolderChanged = Signal(str)

    def __init__(self, controller: PlanController, history_dir: str | Path,
                 client_factory: ClientFactory | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctl = controller
        self.history_dir = Path(history_dir)
        self.client_factory = client_factory
        self.thread: QThread | None = None
        self.client: Any = None
        self._failed = False
        self.worker: GenerationWorker | None = None
        self._t0 = 0.0
        self._last_request: dict[str, Any] | None = None
        self.last_images: list[QImage] = []
        #: Extra request keys for the engine (``overrides`` for models whose files do not
        #: name their head counts, ``threads``...); see sdplan.core.pipelines.jobs.generate_job.
        self.request_extra: dict[str, Any] = {}
        #: Steps of the current run whose live preview was shown (in order).
        self.preview_steps: list[int] = []
        #: Why the engine is busy elsewhere (the queue runs), or None: Generate waits.
        self.engine_busy: Any = lambda: None
        self.setObjectName("Panel")
        self.setMinimumWidth(280)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(14, 12, 14, 12)
        lay.setSpacing(8)
        t = QLabel("GENERATE")
        t.setObjectName("Section")
        lay.addWidget(t)
        self.state = QLabel()
        self.state.setObjectName("Muted")
        self.state.setWordWrap(True)
        lay.addWidget(self.state)
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Prompt")
        self.prompt.setMaximumHeight(64)
        lay.addWidget(self.prompt)
        self.negative = QPlainTextEdit()
        self.negative.setPlaceholderText("Negative prompt")
        self.negative.setMaximumHeight(40)
        lay.addWidget(self.negative)
        lay.addLayout(settings_form(self))
        #: LoRAs and the picture to start from (sdplan.app.inputs).
        self.inputs = InputsPanel(self._insert_tag, self._model_family, self._lora_table)
        lay.addWidget(self.inputs)
        #: The hires fix, VAE tiling and ControlNet groups (sdplan.app.module_groups).
        self.module_groups = ModuleGroups()
        lay.addWidget(self.module_groups)
        buttons = QHBoxLayout()
        self.generate_btn = QPushButton("Generate")
        self.generate_btn.setObjectName("Primary")
        self.generate_btn.setShortcut("Ctrl+Return")
        self.generate_btn.setToolTip("Generate with this plan (Ctrl+Enter)")
        self.generate_btn.clicked.connect(self.generate)
        self.cancel_btn = QPushButton("Cancel")
        self.cancel_btn.setEnabled(False)
        self.cancel_btn.clicked.connect(self.cancel)
        buttons.addWidget(self.generate_btn, 1)
        buttons.addWidget(self.cancel_btn)
        lay.addLayout(buttons)
        out_row = QHBoxLayout()
        self.output_label = ElidedLabel()
        self.output_label.setObjectName("Caption")
        out_row.addWidget(self.output_label, 1)
        self.output_btn = QToolButton()
        self.output_btn.setText("Change…")
        self.output_btn.setToolTip("Choose the folder pictures are saved in")
        self.output_btn.clicked.connect(self.choose_output_folder)
        out_row.addWidget(self.output_btn)
        lay.addLayout(out_row)
        self._show_output_folder()
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setMaximumHeight(6)
        lay.addWidget(self.progress)
        self.progress_label = QLabel()
        self.progress_label.setObjectName("Caption")
        lay.addWidget(self.progress_label)
        self.error_box = QFrame()
        eb = QHBoxLayout(self.error_box)
        eb.setContentsMargins(0, 0, 0, 0)
        self.error_label = QLabel()
        self.error_label.setObjectName("Error")
        self.error_label.setWordWrap(True)
        eb.addWidget(self.error_label, 1)
        self.retry_btn = QPushButton("Retry")
        self.retry_btn.clicked.connect(self.retry)
        eb.addWidget(self.retry_btn)
        self.error_box.hide()
        lay.addWidget(self.error_box)
        self.preview = QLabel()
        self.preview.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.preview.setMinimumHeight(72)
        # a shown picture never asks for more room: the panel keeps its height and the
        # scroll area does not move under the cursor
        self.preview.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Ignored)
        self.preview.setObjectName("Muted")
        self.preview.setText("The live preview appears here")
        lay.addWidget(self.preview, 1)
        self.player = VideoPlayer(self._show)  # a video result plays in the preview area
        lay.addWidget(self.player)
        self.params_label = QLabel()
        self.params_label.setObjectName("Caption")
        self.params_label.setWordWrap(True)
        # two lines, always: a result's caption never moves what is above or below it
        self.params_label.setFixedHeight(self.params_label.fontMetrics().lineSpacing() * 2 + 4)
        self.params_label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        lay.addWidget(self.params_label)
        hl = QLabel("TODAY")
        hl.setObjectName("Section")
        lay.addWidget(hl)
        self.history = HistoryStrip(self.history_dir)
        self.history.itemActivated.connect(self._show_history)
        self.history.itemClicked.connect(self._show_history)
        lay.addWidget(self.history)
        self._load_settings()
        for w in (self.width_box, self.height_box, self.steps, self.batch, self.seed):
            w.valueChanged.connect(self._sync)
        self.cfg.valueChanged.connect(self._sync)
        self.sampler.currentTextChanged.connect(self._sync)
        self.schedule.currentTextChanged.connect(self._sync)
        self.prompt.textChanged.connect(self._sync)
        self.negative.textChanged.connect(self._sync)
        self.inputs.changed.connect(self._sync)
        self.video_fields.changed.connect(self._sync)
        self.high_noise.changed.connect(self._sync)
        self.module_groups.changed.connect(self._sync)
        for group in (self.module_groups, self.inputs, self.high_noise):  # a refusal may come or go
            group.changed.connect(self.update_state)
        controller.modelChanged.connect(self.update_state)
        controller.modelChanged.connect(self._fill_presets)
        controller.modelChanged.connect(self._model_changed)
        self._fill_presets()
        controller.planChanged.connect(self._from_controller)
        self._load_history()
        self._model_changed()
        self.update_state()

    # ------------------------------------------------------------------ settings
    def _load_settings(self) -> None:
        g = self.ctl.generation
        self.width_box.setValue(int(g.get("width") or 1024))
        self.height_box.setValue(int(g.get("height") or 1024))
        self.steps.setValue(int(g.get("steps") or 20))
        self.cfg.setValue(float(g.get("cfg_scale") or 1.0))
        self.seed.setValue(int(g.get("seed") if g.get("seed") is not None else 42))
        self.batch.setValue(int(g.get("batch_count") or 1))
        for combo, key in ((self.sampler, "sampling_method"), (self.schedule, "scheduler")):
            if g.get(key):
                i = combo.findText(str(g[key]))
                if i >= 0:
                    combo.setCurrentIndex(i)
        if self.prompt.toPlainText() != str(g.get("prompt") or ""):
            self.prompt.setPlainText(str(g.get("prompt") or ""))
        if self.negative.toPlainText() != str(g.get("negative_prompt") or ""):
            self.negative.setPlainText(str(g.get("negative_prompt") or ""))
        self.inputs.load(g)
        self.module_groups.load(g)
        self.video_fields.load(g)
        self.high_noise.load(g)

    def _fill_presets(self) -> None:
        """The size presets of the loaded model's family (SDXL's buckets for SDXL)."""
        prof = self.ctl.profile
        sizes = recommended_sizes(prof.architecture if prof is not None else None)
        self.size_preset.clear()
        self.size_preset.addItem("custom" if sizes else "no presets for this model", None)
        for w, h in sizes:
            self.size_preset.addItem(f"{w} × {h}", (w, h))
        self.size_preset.setEnabled(bool(sizes))
        self._show_preset()

    def _show_preset(self) -> None:
        """Select the preset the size boxes hold, or "custom"."""
        size = (self.width_box.value(), self.height_box.value())
        found = [i for i in range(self.size_preset.count()) if self.size_preset.itemData(i) == size]
        self.size_preset.setCurrentIndex(found[0] if found else 0)

    def _apply_preset(self, index: int) -> None:
        size = self.size_preset.itemData(index)
        if size:
            self.width_box.setValue(size[0])
            self.height_box.setValue(size[1])

    def _from_controller(self, source: str) -> None:
        if source == "load":  # a pasted command or imported plan brings settings
            self._syncing = True
            self._load_settings()
            self._syncing = False

    _syncing = False

    def settings(self) -> dict[str, Any]:
        """The generation settings in sd-cli's keys."""
        return {"prompt": self.prompt.toPlainText() or None,
                "negative_prompt": self.negative.toPlainText() or None,
                "width": self.width_box.value(), "height": self.height_box.value(),
                "steps": self.steps.value(), "cfg_scale": self.cfg.value(),
                "seed": self.seed.value(), "sampling_method": self.sampler.currentText(),
                "scheduler": self.schedule.currentText(), "batch_count": self.batch.value(),
                **self._inputs(), **self.module_groups.settings(), **self.video_fields.settings(),
                **self.high_noise.settings()}

    def _inputs(self) -> dict[str, Any]:
        """The inputs' keys, the LoRA ones only with a tag in the prompt (and the apply mode
        only when not sd-cli's default ``auto``)."""
        out = self.inputs.settings()
        if "<lora:" not in self.prompt.toPlainText():
            out["lora_model_dir"] = out["lora_apply_mode"] = None
        elif out["lora_apply_mode"] == "auto":
            out["lora_apply_mode"] = None
        return out

    def _insert_tag(self, tag: str) -> None:
        """Append a LoRA tag to the prompt (sd-cli removes it from the encoded text)."""
        text = self.prompt.toPlainText()
        self.prompt.setPlainText(text + tag if not text or text.endswith((" ", ">")) else f"{text} {tag}")

    def _model_family(self) -> str | None:
        arch = self.ctl.profile.architecture if self.ctl.profile is not None else None
        return arch.split("-")[0] if arch else None

    def _lora_table(self) -> Any:
        """The open model's LoRA alias table (headers only), or None."""
        return self.ctl.session.lora_table()

    def _model_changed(self) -> None:
        """New model: its family's fit marks and groups; the demo model brings its own LoRA
        folder (listed without pushing the panel's fields over what an import just brought)."""
        arch = self.ctl.profile.architecture if self.ctl.profile else None
        self.module_groups.set_refusals(arch)
        self.video_fields.set_family(arch)
        self.high_noise.set_model(arch, self.ctl.model_files)
        self.inputs.set_architecture(arch)  # the picture's role: init image, first frame or none
        if not self._syncing:  # the frames a reused video brought; -M vid_gen on the board
            self._syncing = True
            try:
                self.video_fields.load(self.ctl.generation)
            finally:
                self._syncing = False
            self.ctl.set_generation(**self.video_fields.settings())
        if self.inputs.folder is None and not self.ctl.generation.get("lora_model_dir"):
            own = self.ctl.session.own_lora_folder()
            if own is not None:
                self._syncing, was = True, self._syncing
                try:
                    self.inputs.set_folder(own)
                finally:
                    self._syncing = was
                return
        self.inputs.refresh_fit()

    def _sync(self, *_: object) -> None:
        if not self._syncing:
            self.ctl.set_generation(**self.settings())

    # ------------------------------------------------------------------ state
    def unavailable_reason(self) -> str | None:
        """Why Generate is disabled now, or None."""
        reason = self.ctl.session.unavailable_reason({**self.settings(), **self.request_extra})
        if reason:
            return reason
        if self.client_factory is None and engine_unavailable_reason():
            return engine_unavailable_reason()
        return self.engine_busy()

    def refusal(self) -> str | None:
        """Why the open family would refuse these settings, or None (the engine's check,
        before anything loads)."""
        return self.ctl.session.refusal({**self.settings(), **self.request_extra})

    def update_state(self) -> None:
        """Enable Generate only with a model and an engine, and say why otherwise; say when
        the size is far from what the model was trained for."""
        note = self.ctl.session.size_note(self.width_box.value(), self.height_box.value()) \
            if self.ctl.model_files else None
        self.size_note.setText(note or "")
        self.size_note.setVisible(note is not None)
        reason = self.unavailable_reason()
        running = self.thread is not None
        self.generate_btn.setEnabled(reason is None and not running)
        self.cancel_btn.setEnabled(running)
        self.state.setText(reason or "")
        self.state.setVisible(reason is not None)  # one status line: the run's, below
        if not running and not self.progress_label.text():
            self.progress_label.setText("Ready")

    def request(self) -> dict[str, Any]:
        """The request sent to the engine (:class:`~sdplan.core.pipelines.request.GenerationRequest`
        in its JSON form, as a queued job keeps it): the panel's settings, the model files and
        the board's resolved plan, whose devices the engine checks against its own before it
        loads anything (:class:`~sdplan.core.runtime.run_plan.RunPlan`).

        Raises:
            SdplanError: a malformed setting (the panel's fields keep them well-formed).
        """
        return self.ctl.session.request({**self.settings(), **self.request_extra})

    # ------------------------------------------------------------------ running
    def generate(self) -> bool:
        """Start a generation on a worker thread; False when disabled or running."""
        if self.thread is not None or self.unavailable_reason() is not None:
            return False
        if self.seed.value() < 0:
            self.seed.setValue(random.randrange(2**31 - 1))
        return self._start(self.request())

    def retry(self) -> bool:
        """Run the last request again (after an engine failure)."""
        if self.thread is not None:
            return False
        return self._start(self._last_request or self.request())

    def _start(self, req: dict[str, Any]) -> bool:
        from sdplan.app.worker import default_client_factory

        self._last_request = req
        self.preview_steps = []
        self.player.clear()
        from sdplan.core.pipelines.stages.outputs import check_output_folder

        try:  # before the engine loads anything: say now that results cannot be kept
            check_output_folder("history", self.history_dir)
        except OutputError as exc:
            self.ctl.status.emit(f"results will not be saved: {exc}")
        self.error_box.hide()
        client = self.client
        if client is None:  # one engine process serves every run until it fails
            try:
                client = (self.client_factory or default_client_factory)()
            except Exception as exc:  # noqa: BLE001 - shown to the user, plan untouched
                self.on_error(f"cannot start the engine: {exc}")
                return False
        self.client = client
        self._failed = False
        self.thread = QThread(self)
        self.worker = GenerationWorker(client, req)
        self.worker.moveToThread(self.thread)
        self.thread.started.connect(self.worker.run)
        self.worker.progress.connect(self.on_progress)
        self.worker.result.connect(self.on_result)
        self.worker.error.connect(self.on_error)
        self.worker.cancelled.connect(self.on_cancelled)
        self.worker.finished.connect(self.on_finished)
        self.progress.setRange(0, int(req.get("steps") or 1))
        self.progress.setValue(0)
        self.progress_label.setText("starting the engine…")
        self._t0 = time.monotonic()
        self.thread.start()
        self.update_state()
        return True

    def cancel(self) -> None:
        """Ask the running generation to stop."""
        if self.worker is not None:
            self.progress_label.setText("cancelling…")
            self.worker.cancel()

    def is_running(self) -> bool:
        return self.thread is not None

    @Slot(int, int, object)
    def on_progress(self, step: int, total: int, preview: object) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(step)
        dt = max(time.monotonic() - self._t0, 1e-6)
        rate = step / dt
        eta = (total - step) / rate if rate > 0 else 0
        self.progress_label.setText(f"step {step}/{total} · {rate:.2f} steps/s · "
                                    f"ETA {int(eta) // 60}:{int(eta) % 60:02d}")
        if preview is not None:
            try:
                self._show(to_qimage(preview))
                self.preview_steps.append(step)
            except ValueError as exc:
                log.debug("bad preview: %s", exc)

    @Slot(object, object)
    def on_result(self, images: list, result: dict) -> None:
        """Show and save a finished run's pictures; ``result`` is the engine's record
        (``params``, ``plan``, ``model_flags``, ``placements``, ``timings``) or its params alone."""
        record = result if "params" in result else {"params": result}
        self.last_images = [to_qimage(a) for a in images]
        if self.last_images and self._video_fps(record) is not None:  # a video: played
            self.player.set_frames(self.last_images, float(self._video_fps(record) or 0))
        elif self.last_images:
            self._show(self.last_images[0])
        self._caption(describe_params({**record["params"], "timings": record.get("timings")
                                                   or record["params"].get("timings")}))
        self.progress.setValue(self.progress.maximum())
        self.progress_label.setText(f"done in {time.monotonic() - self._t0:.1f} s")
        self.save_results(images, record, self._last_request)

    @Slot(str)
    def on_error(self, message: str) -> None:
        self._failed = True  # a fresh engine client for the next run
        self.error_label.setText(f"The engine failed: {message}. The plan is unchanged.")
        self.error_box.show()
        self.progress_label.setText("failed")

    @Slot()
    def on_cancelled(self) -> None:
        self.progress_label.setText("cancelled")

    @Slot()
    def on_finished(self) -> None:
        if self.thread is not None:
            self.thread.quit()
            self.thread.wait(5000)
        if self._failed:
            self.close_engine()
        self.thread = None
        self.worker = None
        self.update_state()

    def close_engine(self) -> None:
        """Release the engine client (its process); the next run starts a new one."""
        client, self.client = self.client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - a dead engine needs no closing
                log.debug("engine close failed", exc_info=True)

    def shutdown(self) -> None:
        """Cancel a running generation, wait for its thread (up to 10 s) and release the
        engine (the window is closing)."""
        if self.worker is not None:
            self.worker.cancel()
        if self.thread is not None:
            self.thread.quit()
            self.thread.wait(10_000)
        self.close_engine()

    def _caption(self, text: str) -> None:
        """The result's caption (two lines; the tooltip has all of it)."""
        self.params_label.setText(text)
        self.params_label.setToolTip(text)

    def _show(self, img: QImage) -> None:
        """Show ``img`` scaled to fit the preview area (aspect kept)."""
        w, h = max(self.preview.width(), 64), max(self.preview.height(), 64)
        self.preview.setPixmap(QPixmap.fromImage(img).scaled(
            w, h, Qt.AspectRatioMode.KeepAspectRatio,
            Qt.TransformationMode.SmoothTransformation))

    # ------------------------------------------------------------------ output folder
    def _show_output_folder(self) -> None:
        folder = str(self.history_dir)
        home = str(Path.home())
        shown = "~" + folder[len(home):] if folder.startswith(home) else folder
        self.output_label.setText(f"Saved to {shown}")

    def set_history_dir(self, folder: str | Path) -> None:
        """Save pictures in ``folder`` from now on (today's strip follows it)."""
        self.history_dir = Path(folder)
        self.history.folder = self.history_dir
        self._show_output_folder()

    def choose_output_folder(self, folder: str | None = None) -> bool:
        """Ask for the output folder (or take ``folder``), use it and emit
        ``outputFolderChanged``; False when none was chosen."""
        if not folder:
            from PySide6.QtWidgets import QFileDialog

            folder = QFileDialog.getExistingDirectory(self, "Save pictures in",
                                                      str(self.history_dir))
        if not folder:
            return False
        self.set_history_dir(folder)
        self.outputFolderChanged.emit(str(folder))
        return True

    # ------------------------------------------------------------------ history
    def save_results(self, images: list[Any], result: dict,
                     request: dict[str, Any] | None = None) -> list[Path]:
        """Save a run's pictures (uint8 ``(H, W, 3)`` arrays, or QImages) in the history
        folder as PNGs carrying the record ``sdplan generate`` writes
        (:func:`sdplan.app.pictures.write_pictures`), so a picture restores its run when
        dropped on the window. ``result`` is the engine's record (or its params alone);
        ``request`` the request it came from (default: the last one). Returns the paths; a
        folder that cannot be written is said on the status bar (the picture stays on
        screen)."""
        req = request or self._last_request or self.request()
        record = run_record(result, req)
        paths: list[Path] = []

        def saved(path: Path) -> None:
            paths.append(path)
            self.history.add(path)
            self.resultSaved.emit(str(path))

        fps = self._video_fps(record)
        try:
            if fps is not None and images:
                write_video_result(self.history_dir, images, record, req.get("model_files") or {},
                                   fps, saved)
            else:
                write_pictures(self.history_dir, images, record, req.get("model_files") or {}, saved)
        except (OSError, OutputError) as exc:
            self.ctl.status.emit(f"not saved: cannot write to {self.history_dir} "
                                 f"({getattr(exc, 'strerror', None) or exc}); the picture stays on screen")
        return paths

    @staticmethod
    def _video_fps(record: dict[str, Any]) -> int | None:
        """The frame rate of a run that made a video (the engine's ``params["video"]``, else
        the request's ``-M vid_gen`` ``fps``), or None for pictures."""
        params = record.get("params") or {}
        video = params.get("video")
        if isinstance(video, dict):
            return int(video.get("fps") or 16)
        return int(params.get("fps") or 16) if params.get("mode") == "vid_gen" else None

    def _load_history(self) -> None:
        self.history.load_today()

    def _show_history(self, item: QListWidgetItem) -> None:
        """Show a strip item's image and the settings it records."""
        path = Path(item.data(Qt.ItemDataRole.UserRole))
        self.player.clear()
        if is_video_file(path):
            try:
                self.player.load(path)
            except OSError as exc:
                self.ctl.status.emit(str(exc))
        else:
            self._show(QImage(str(path)))
        try:
            self._caption(describe_params(read_result(path).settings))
        except OSError:
            self._caption(path.name)

