"""The jobs of an ``sdplan serve`` beside the app's queue: read from the queue file the server
records (``sdplan serve --queue-file``, the app's queue format with ``origin`` ``server``),
shown read-only with their device group, state and predicted time, and read again when the
file changes (every second at most)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QLabel, QListWidget, QVBoxLayout, QWidget
from sdplan.core.pipelines.job_queue import Job, JobQueue

#: The server queue file the app looks for beside its own queue file.
SERVER_QUEUE_NAME = "sdplan-server-queue.json"
MARKS = {"queued": "○", "running": "▶", "done": "✓", "failed": "✕", "cancelled": "⊘"}


def server_job_text(job: Job) -> str:
    """The list line of a server job: state, label, device group, predicted or taken time."""
    parts = [f"{MARKS.get(job.state, '?')} {job.label}"]
    if job.group:
        parts.append(f"group {job.group}")
    if job.state == "running":
        parts.append(f"step {job.steps_done}/{job.steps}")
    if job.seconds is not None:
        parts.append(f"{job.seconds:.1f} s")
    elif job.predicted is not None:
        parts.append(f"predicted {job.predicted:.1f} s")
    if job.error:
        parts.append(job.error.splitlines()[0][:80])
    return " · ".join(parts)


class ServerJobs(QWidget):
    """The server's jobs (module docstring); hidden while there is no such file."""

    def __init__(self, path: Path | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path = path
        self._stamp: tuple[int, int] | None = None
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.title = QLabel("SERVER JOBS")
        self.title.setObjectName("Section")
        self.list = QListWidget()
        self.list.setAccessibleName("Jobs of sdplan serve")
        self.list.setMaximumHeight(140)
        lay.addWidget(self.title)
        lay.addWidget(self.list)
        self.timer = QTimer(self)
        self.timer.setInterval(1000)
        self.timer.timeout.connect(self.reload)
        self.timer.start()
        self.reload()

    def reload(self) -> bool:
        """Read the file again when it changed; True when the list was redrawn."""
        try:
            st = self.path.stat() if self.path is not None else None
        except OSError:
            st = None
        stamp = (st.st_mtime_ns, st.st_size) if st is not None else None
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        jobs = [j for j in JobQueue.read(self.path) if j.origin == "server"] if stamp and self.path else []
        self.list.clear()
        for job in jobs[-50:]:
            self.list.addItem(server_job_text(job))
        self.setVisible(bool(jobs))
        return True
