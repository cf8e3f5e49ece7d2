"""The queue: jobs made from the generation panel's settings (or a batch of seeds or
prompts) run one after another on the engine, each with its own plan.

:class:`QueueRunner` takes the next queued job of a
:class:`~sdplan.core.pipelines.job_queue.JobQueue`, runs it on the generation panel's engine
client (one engine process for the panel and the queue, never two jobs at once) through
a :class:`~sdplan.app.worker.GenerationWorker` in a QThread, saves its images like the
panel does, and goes on: a failed job (an engine that died included) is marked and the
next one runs on a fresh engine; a cancelled job leaves the others alone; pausing lets the
running job finish and starts no other. :class:`QueuePanel` shows the jobs with per-job
and whole-queue progress and ETA, and the buttons to add, batch, reorder, cancel, retry
and pause.
"""

from __future__ import annotations

import logging
import random
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QSize, Qt, QThread, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QButtonGroup,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)
from sdplan.app.generation import GenerationPanel
from sdplan.app.history_strip import thumbnail
from sdplan.app.worker import GenerationWorker
from sdplan.core.pipelines.job_queue import Job, JobQueue

log = logging.getLogger(__name__)

JobRole = Qt.ItemDataRole.UserRole
STATE_MARKS = {"queued": "○", "running": "▶", "done": "✓", "failed": "✕", "cancelled": "⊘"}


def job_size(job: Job) -> str:
    """``W×H px`` (``, batch N`` when more than one) of a job's request."""
    r = job.request
    text = f"{r.get('width') or '?'}×{r.get('height') or '?'} px"
    batch = int(r.get("batch_count") or 1)
    return text + (f", batch {batch}" if batch > 1 else "")


def clock(seconds: float | None) -> str:
    """``1:05`` (``1:02:05`` past an hour); ``–`` when unknown."""
    if seconds is None:
        return "–"
    s = max(int(seconds + 0.5), 0)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class QueueRunner(QObject):
    """Runs a :class:`JobQueue` on ``panel``'s engine (see module docstring).

    Signals:
        changed(): jobs or states changed (views redraw).
        progress(str, int, int): job id, steps done, steps in the job (progress of the
            running job, every step).
        jobFinished(str, str): job id and its end state.
    """

    changed = Signal()
    progress = Signal(str, int, int)
    jobFinished = Signal(str, str)

    def __init__(self, queue: JobQueue, panel: GenerationPanel,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.queue = queue
        self.panel = panel
        self.thread: QThread | None = None
        self.worker: GenerationWorker | None = None
        self.job: Job | None = None
        self._failed = False
        self._results: list[str] = []
        self._t0 = 0.0
        self._base = 0  # steps of the job's earlier images (a batch restarts its count)
        self._last_step = 0
        self._wait = QTimer(self)  # the panel's own run holds the engine: look again
        self._wait.setInterval(300)
        self._wait.timeout.connect(self.start_next)
        self._closing = False
        panel.engine_busy = self.busy_reason

    # ------------------------------------------------------------------ state
    def is_running(self) -> bool:
        return self.thread is not None

    def busy_reason(self) -> str | None:
        """Why the panel's Generate waits (the queue runs a job), or None."""
        if self.job is None:
            return None
        left = self.queue.counts()["queued"]
        return (f"The queue is running {self.job.label}" + (f" ({left} more queued)" if left
                                                               else "")
                + ": add these settings to the queue, or pause it")

    def seconds_per_step(self) -> float | None:
        """The running job's measured rate, else the finished jobs' mean."""
        if self.job is not None and self._done_steps() > 0:
            return (time.monotonic() - self._t0) / self._done_steps()
        return self.queue.seconds_per_step()

    def _done_steps(self) -> int:
        return self.job.steps_done if self.job is not None else 0

    def job_eta(self) -> float | None:
        """Seconds left of the running job (None before its first step)."""
        if self.job is None or self._done_steps() == 0:
            return None
        rate = (time.monotonic() - self._t0) / self._done_steps()
        return max(self.job.steps - self._done_steps(), 0) * rate

    def queue_eta(self) -> float | None:
        """Seconds left of the running job and every queued one."""
        return self.queue.remaining_seconds(self.seconds_per_step())

    # ------------------------------------------------------------------ editing
    def add(self, request: dict[str, Any]) -> Job:
        """Queue ``request`` and start it when the engine is free."""
        job = self.queue.add(request)
        self.changed.emit()
        self.start_next()
        return job

    def add_batch(self, request: dict[str, Any], *, seeds: list[int] = (),  # type: ignore[assignment]
                  prompts: list[str] = ()) -> list[Job]:  # type: ignore[assignment]
        jobs = self.queue.add_batch(request, seeds=seeds, prompts=prompts)
        self.changed.emit()
        self.start_next()
        return jobs

    def cancel(self, job_id: str) -> bool:
        """Cancel a queued job, or ask the running one to stop (it ends ``cancelled``)."""
        if self.job is not None and self.job.id == job_id and self.worker is not None:
            self.worker.cancel()
            return True
        ok = self.queue.cancel(job_id)
        self.changed.emit()
        return ok

    def set_paused(self, paused: bool) -> None:
        self.queue.set_paused(paused)
        self.changed.emit()
        if not paused:
            self.start_next()

    def move(self, job_id: str, delta: int) -> None:
        idx = [j.id for j in self.queue.jobs].index(job_id)
        self.queue.move(job_id, idx + delta)
        self.changed.emit()

    def retry(self, job_id: str) -> None:
        if self.queue.retry(job_id):
            self.changed.emit()
            self.start_next()

    # ------------------------------------------------------------------ running
    @Slot()
    def start_next(self) -> bool:
        """Start the next queued job when none runs, the queue is not paused and the
        panel's engine is free; True when one started."""
        if self.thread is not None or self._closing:
            return False
        job = self.queue.next_queued()
        if job is None:
            self._wait.stop()
            return False
        if self.panel.is_running():
            self._wait.start()
            return False
        self._wait.stop()
        client = self.panel.client
        if client is None:
            from sdplan.app.worker import default_client_factory

            try:
                client = (self.panel.client_factory or default_client_factory)()
            except Exception as exc:  # noqa: BLE001 - the job fails, the queue goes on
                self.queue.start(job.id)
                self.queue.finish(job.id, "failed", error=f"cannot start the engine: {exc}")
                self.jobFinished.emit(job.id, "failed")
                self.changed.emit()
                QTimer.singleShot(0, self.start_next)
                return False
            self.panel.client = client
        self.job = self.queue.start(job.id)
        self._failed, self._results = False, []
        self._t0, self._base, self._last_step = time.monotonic(), 0, 0
        self.thread = QThread(self)
        self.worker = GenerationWorker(client, dict(job.request))
        self.worker.moveToThread(self.thread)
        self.thread.started.connect(self.worker.run)
        self.worker.progress.connect(self.on_progress)
        self.worker.result.connect(self.on_result)
        self.worker.error.connect(self.on_error)
        self.worker.cancelled.connect(self.on_cancelled)
        self.worker.finished.connect(self.on_finished)
        self.thread.start()
        self.panel.update_state()
        self.changed.emit()
        return True

    @Slot(int, int, object)
    def on_progress(self, step: int, total: int, preview: object) -> None:
        if self._closing:
            return
        if self.job is None:
            return
        if step < self._last_step:  # the next image of a batch
            self._base += self._last_step
        self._last_step = step
        self.job.steps_done = min(self._base + step, self.job.steps)
        self.progress.emit(self.job.id, self.job.steps_done, self.job.steps)

    @Slot(object, object)
    def on_result(self, images: list, result: dict) -> None:
        if self._closing:
            return
        if self.job is None:
            return
        paths = self.panel.save_results(images, result, self.job.request)
        self._results = [str(p) for p in paths]
        self.queue.finish(self.job.id, "done", results=self._results)
        self.jobFinished.emit(self.job.id, "done")

    @Slot(str)
    def on_error(self, message: str) -> None:
        if self._closing:
            return
        if self.job is None:
            return
        self._failed = True
        self.queue.finish(self.job.id, "failed", error=message)
        self.jobFinished.emit(self.job.id, "failed")

    @Slot()
    def on_cancelled(self) -> None:
        if self._closing:
            return
        if self.job is None:
            return
        self.queue.finish(self.job.id, "cancelled")
        self.jobFinished.emit(self.job.id, "cancelled")

    @Slot()
    def on_finished(self) -> None:
        if self._closing:
            return
        if self.thread is not None:
            self.thread.quit()
            self.thread.wait(5000)
        if self.job is not None and self.job.state == "running":  # no terminal message
            self.queue.finish(self.job.id, "failed", error="the engine stopped without a result")
            self._failed = True
        if self._failed:
            self.panel.close_engine()  # a fresh engine process for the next job
        self.thread = self.worker = self.job = None
        self.panel.update_state()
        self.changed.emit()
        QTimer.singleShot(0, self.start_next)

    def shutdown(self) -> None:
        """Stop the running job and wait for it (up to 10 s); it is queued again, to run
        at the next start (the window is closing)."""
        self._wait.stop()
        self._closing = True
        job = self.job
        if self.worker is not None:
            self.worker.cancel()
        if self.thread is not None:
            self.thread.quit()
            self.thread.wait(10_000)
        if job is not None:
            job.state, job.started, job.steps_done, job.error = "queued", None, 0, None
            self.queue.save()
        self.thread = self.worker = self.job = None


class BatchDialog(QDialog):
    """Add a batch: N seeds from the current one (or random), or one job per prompt line."""

    def __init__(self, seed: int, prompt: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Add a batch to the queue")
        lay = QVBoxLayout(self)
        self.by_seed = QRadioButton("Seeds")
        self.by_prompt = QRadioButton("Prompts (one per line)")
        group = QButtonGroup(self)
        group.addButton(self.by_seed)
        group.addButton(self.by_prompt)
        self.by_seed.setChecked(True)
        form = QFormLayout()
        self.count = QSpinBox()
        self.count.setRange(1, 1000)
        self.count.setValue(4)
        self.first = QSpinBox()
        self.first.setRange(-1, 2**31 - 1)
        self.first.setSpecialValueText("random")
        self.first.setValue(seed)
        form.addRow(self.by_seed)
        form.addRow("Jobs", self.count)
        form.addRow("First seed", self.first)
        lay.addLayout(form)
        lay.addWidget(self.by_prompt)
        self.prompts = QPlainTextEdit(prompt)
        self.prompts.setPlaceholderText("a lighthouse at dusk\na lighthouse at dawn")
        self.prompts.textChanged.connect(lambda: self.by_prompt.setChecked(True))
        lay.addWidget(self.prompts)
        box = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                               | QDialogButtonBox.StandardButton.Cancel)
        box.accepted.connect(self.accept)
        box.rejected.connect(self.reject)
        lay.addWidget(box)

    def batch(self) -> dict[str, list]:
        """``{"seeds": [...]}`` or ``{"prompts": [...]}`` as chosen."""
        if self.by_prompt.isChecked():
            lines = [ln.strip() for ln in self.prompts.toPlainText().splitlines() if ln.strip()]
            return {"prompts": lines}
        first = self.first.value()
        if first < 0:
            return {"seeds": [random.randrange(2**31 - 1) for _ in range(self.count.value())]}
        return {"seeds": [first + i for i in range(self.count.value())]}


class QueuePanel(QFrame):
    """The queue's view and buttons (see module docstring)."""

    openResult = Signal(str)

    def __init__(self, runner: QueueRunner, parent: QWidget | None = None,
                 server_file: Path | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.setObjectName("Panel")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(14, 12, 14, 12)
        lay.setSpacing(8)
        head = QHBoxLayout()
        t = QLabel("QUEUE")
        t.setObjectName("Section")
        head.addWidget(t)
        head.addStretch(1)
        self.pause_btn = QPushButton("Pause")
        self.pause_btn.setCheckable(True)
        self.pause_btn.setToolTip("Pause: the running job finishes, no other starts")
        self.pause_btn.toggled.connect(self._pause)
        head.addWidget(self.pause_btn)
        lay.addLayout(head)
        adds = QHBoxLayout()
        self.add_btn = QPushButton("Add current settings")
        self.add_btn.setObjectName("Primary")
        self.add_btn.setToolTip("Queue the generation panel's settings with this plan "
                                "(Ctrl+Shift+Enter)")
        self.add_btn.clicked.connect(self.add_current)
        self.batch_btn = QPushButton("Batch…")
        self.batch_btn.setToolTip("Queue one job per seed or per prompt")
        self.batch_btn.clicked.connect(self.add_batch_dialog)
        adds.addWidget(self.add_btn, 1)
        adds.addWidget(self.batch_btn)
        lay.addLayout(adds)
        self.total_bar = QProgressBar()
        self.total_bar.setTextVisible(False)
        self.total_bar.setMaximumHeight(6)
        lay.addWidget(self.total_bar)
        self.total_label = QLabel()
        self.total_label.setObjectName("Caption")
        self.total_label.setWordWrap(True)
        lay.addWidget(self.total_label)
        self.list = QListWidget()
        self.list.setAccessibleName("Queued jobs")
        self.list.setWordWrap(True)
        self.list.setIconSize(QSize(40, 40))
        self.list.itemActivated.connect(self._activated)
        self.list.currentItemChanged.connect(lambda *_: self._buttons())
        lay.addWidget(self.list, 1)
        row = QHBoxLayout()
        row.setSpacing(4)
        self.buttons: dict[str, QToolButton] = {}
        for key, text, tip in (("up", "↑", "Run earlier (Alt+Up)"),
                               ("down", "↓", "Run later (Alt+Down)"),
                               ("cancel", "Cancel", "Cancel this job (Delete)"),
                               ("retry", "Retry", "Queue a failed or cancelled job again"),
                               ("clear", "Clear finished", "Remove done, failed and cancelled "
                                                           "jobs from the list")):
            b = QToolButton()
            b.setText(text)
            b.setToolTip(tip)
            b.clicked.connect(lambda _=False, k=key: self._button(k))
            row.addWidget(b)
            self.buttons[key] = b
        row.addStretch(1)
        lay.addLayout(row)
        self.job_bar = QProgressBar()
        self.job_bar.setTextVisible(False)
        self.job_bar.setMaximumHeight(6)
        lay.addWidget(self.job_bar)
        self.job_label = QLabel()
        self.job_label.setObjectName("Caption")
        self.job_label.setWordWrap(True)
        lay.addWidget(self.job_label)
        from sdplan.app.server_queue import ServerJobs

        self.server_jobs = ServerJobs(server_file)  # sdplan serve's jobs, read-only
        lay.addWidget(self.server_jobs)
        runner.changed.connect(self.refresh)
        runner.progress.connect(self._progress)
        self.refresh()

    # ------------------------------------------------------------------ actions
    def add_current(self) -> Job | None:
        """Queue the generation panel's settings and plan (None without a model)."""
        panel = self.runner.panel
        reason = panel.unavailable_reason()
        if reason is not None and not reason.startswith("The queue is running"):
            self.total_label.setText(reason)
            return None
        req = panel.request()
        if int(req.get("seed") or 0) < 0:
            req["seed"] = random.randrange(2**31 - 1)
        return self.runner.add(req)

    def add_batch_dialog(self) -> list[Job]:
        panel = self.runner.panel
        dlg = BatchDialog(panel.seed.value(), panel.prompt.toPlainText(), self)
        if not dlg.exec():
            return []
        return self.runner.add_batch(panel.request(), **dlg.batch())

    def selected(self) -> Job | None:
        item = self.list.currentItem()
        if item is None:
            return None
        try:
            return self.runner.queue.get(str(item.data(JobRole)))
        except KeyError:
            return None

    def _button(self, key: str) -> None:
        job = self.selected()
        if key == "clear":
            self.runner.queue.clear_finished()
            self.refresh()
        elif job is None:
            return
        elif key in ("up", "down"):
            self.runner.move(job.id, -1 if key == "up" else 1)
            self._select(job.id)
        elif key == "cancel":
            self.runner.cancel(job.id)
        elif key == "retry":
            self.runner.retry(job.id)

    def keyPressEvent(self, event: Any) -> None:  # noqa: N802
        alt = event.modifiers() & Qt.KeyboardModifier.AltModifier
        if alt and event.key() in (Qt.Key.Key_Up, Qt.Key.Key_Down):
            self._button("up" if event.key() == Qt.Key.Key_Up else "down")
        elif event.key() == Qt.Key.Key_Delete:
            self._button("cancel")
        else:
            super().keyPressEvent(event)

    def _pause(self, on: bool) -> None:
        self.runner.set_paused(on)

    def _activated(self, item: QListWidgetItem) -> None:
        job = self.selected()
        if job is not None and job.results:
            self.openResult.emit(job.results[0])

    def _select(self, job_id: str) -> None:
        for i in range(self.list.count()):
            if self.list.item(i).data(JobRole) == job_id:
                self.list.setCurrentRow(i)
                return

    # ------------------------------------------------------------------ view
    def item_text(self, job: Job) -> str:
        """The list line of ``job``: state mark, label, and what happened."""
        extra = ""
        if job.state == "done":
            extra = f" — done in {clock(job.seconds)}, {len(job.results)} image" + (
                "s" if len(job.results) != 1 else "")
        elif job.state == "failed":
            extra = f" — failed: {(job.error or '').splitlines()[0] if job.error else ''}"
        elif job.state == "cancelled":
            extra = " — cancelled"
        elif job.state == "running":
            extra = f" — step {job.steps_done}/{job.steps}"
        return f"{STATE_MARKS[job.state]} {job.label} · {job_size(job)}{extra}"

    def refresh(self) -> None:
        """Redraw the list, the buttons and both progress lines."""
        current = self.selected()
        self.list.clear()
        for job in self.runner.queue.jobs:
            item = QListWidgetItem(self.item_text(job))
            item.setData(JobRole, job.id)
            shown = next((p for p in job.results if Path(p).is_file()), None)
            if shown is not None:  # a finished job shows its first picture
                item.setIcon(thumbnail(shown, 40))
            tip = [job.label, f"state: {job.state}"]
            if job.error:
                tip.append(job.error)
            tip += [f"result: {Path(p).name}" for p in job.results]
            item.setToolTip("\n".join(tip))
            self.list.addItem(item)
        if current is not None:
            self._select(current.id)
        self.pause_btn.blockSignals(True)
        self.pause_btn.setChecked(self.runner.queue.paused)
        self.pause_btn.setText("Resume" if self.runner.queue.paused else "Pause")
        self.pause_btn.blockSignals(False)
        self._buttons()
        self._totals()

    def _buttons(self) -> None:
        job = self.selected()
        self.buttons["up"].setEnabled(job is not None)
        self.buttons["down"].setEnabled(job is not None)
        self.buttons["cancel"].setEnabled(job is not None and job.state in ("queued", "running"))
        self.buttons["retry"].setEnabled(job is not None and job.state in ("failed", "cancelled"))
        self.buttons["clear"].setEnabled(any(j.state in ("done", "failed", "cancelled")
                                             for j in self.runner.queue.jobs))

    def _totals(self) -> None:
        q = self.runner.queue
        counts = q.counts()
        active = [j for j in q.jobs if j.state in ("queued", "running", "done")]
        total = sum(j.steps for j in active)
        done = sum(j.steps if j.state == "done" else j.steps_done for j in active)
        self.total_bar.setRange(0, max(total, 1))
        self.total_bar.setValue(done)
        left = counts["queued"] + counts["running"]
        parts = [f"{counts['done']} of {counts['done'] + left} done"]
        if counts["failed"]:
            parts.append(f"{counts['failed']} failed")
        if left:
            parts.append(f"queue ETA {clock(self.runner.queue_eta())}")
        if q.paused:
            parts.append("paused" + (" after the running job" if counts["running"] else ""))
        self.total_label.setText(" · ".join(parts) if q.jobs else
                                 "No jobs: add the current settings, or a batch")
        run = q.running()
        if run is None:
            self.job_bar.setValue(0)
            self.job_label.setText("")
        else:
            self.job_bar.setRange(0, max(run.steps, 1))
            self.job_bar.setValue(run.steps_done)
            self.job_label.setText(f"{run.label}: step {run.steps_done}/{run.steps} · "
                                   f"ETA {clock(self.runner.job_eta())}")

    def _progress(self, job_id: str, done: int, total: int) -> None:
        for i in range(self.list.count()):
            item = self.list.item(i)
            if item.data(JobRole) == job_id:
                try:
                    item.setText(self.item_text(self.runner.queue.get(job_id)))
                except KeyError:
                    pass
        self._totals()
