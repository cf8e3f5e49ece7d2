"""The queue in the app: jobs run in order on the generation panel's engine; cancelling
one (queued or running) leaves the others; a failed job (an engine killed, with the real
engine process) is marked and the next runs on a fresh engine; pause; batches; progress
with ETA; the queue file read back after a restart."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("pytestqt")

from replay_client import ReplayEngineClient  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.generation import GenerationPanel  # noqa: E402
from sdplan.app.queue_panel import QueuePanel, QueueRunner, clock  # noqa: E402
from sdplan.core.pipelines.job_queue import JobQueue  # noqa: E402
from sdplan.core.pipelines.stages.results import read_result  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402

GIB = 1 << 30
STEPS = 4


def messages(seed_value: int = 100) -> list[dict]:
    msgs: list[dict] = [{"type": "progress", "step": s, "total": STEPS, "preview": None}
                        for s in range(1, STEPS + 1)]
    img = np.full((16, 16, 3), seed_value, np.uint8)
    msgs.append({"type": "result", "images": [img], "params": {"steps": STEPS}})
    return msgs


class SeedClient(ReplayEngineClient):
    """Replays a run whose image is filled with the request's seed; a request with
    ``fail`` ends in the message a killed engine process gives."""

    def start(self, request: dict) -> None:
        super().start(request)
        if request.get("fail"):
            self.messages = [{"type": "progress", "step": 1, "total": STEPS, "preview": None},
                             {"type": "error", "message": "the engine process died "
                              "(signal SIGKILL)"}]
        else:
            self.messages = messages(int(request["seed"]))


@pytest.fixture
def ctl(qtbot):
    inv = Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),))
    c = PlanController(inv)
    c.load_model_files({"diffusion_model": ["/nonexistent/model.safetensors"]}, strict=False)
    return c


class Factory:
    def __init__(self, make) -> None:  # noqa: ANN001
        self.make, self.clients = make, []

    def __call__(self):  # noqa: ANN204
        self.clients.append(self.make())
        return self.clients[-1]


def setup(qtbot, ctl, tmp_path, factory, queue_file: Path | None = None):
    panel = GenerationPanel(ctl, tmp_path / "history", client_factory=factory)
    qtbot.addWidget(panel)
    runner = QueueRunner(JobQueue(queue_file or tmp_path / "queue.json"), panel)
    view = QueuePanel(runner)
    qtbot.addWidget(view)
    return panel, runner, view


def request(panel, seed: int, **extra) -> dict:
    return {**panel.request(), "seed": seed, "steps": STEPS, **extra}


def wait_idle(qtbot, runner, timeout: int = 10000) -> None:
    qtbot.waitUntil(lambda: not runner.is_running() and runner.queue.next_queued() is None,
                    timeout=timeout)


def pixel(path: str) -> int:
    from PySide6.QtGui import QImage

    return QImage(path).pixelColor(0, 0).red()


def test_three_jobs_in_order_and_cancelling_the_queued_second(qtbot, ctl, tmp_path):
    factory = Factory(lambda: SeedClient([], delay_s=0.02))
    panel, runner, view = setup(qtbot, ctl, tmp_path, factory)
    jobs = [runner.add(request(panel, s)) for s in (11, 22, 33)]
    assert runner.is_running() and runner.job.id == jobs[0].id
    assert runner.cancel(jobs[1].id)  # still queued
    wait_idle(qtbot, runner)
    states = [runner.queue.get(j.id).state for j in jobs]
    assert states == ["done", "cancelled", "done"]
    assert [r["seed"] for r in factory.clients[0].requests] == [11, 33]  # in order, 2 skipped
    first, third = runner.queue.get(jobs[0].id), runner.queue.get(jobs[2].id)
    assert pixel(first.results[0]) == 11 and pixel(third.results[0]) == 33
    assert runner.queue.get(jobs[1].id).results == []
    assert read_result(first.results[0]).settings["seed"] == 11  # the image records it
    assert len(factory.clients) == 1  # one engine for all
    assert view.list.item(1).text().startswith("⊘") and "done in" in view.list.item(0).text()
    assert "2 of 2 done" in view.total_label.text()


def test_cancelling_the_running_second_keeps_the_first_and_runs_the_third(qtbot, ctl, tmp_path):
    factory = Factory(lambda: SeedClient([], delay_s=0.05))
    panel, runner, view = setup(qtbot, ctl, tmp_path, factory)
    jobs = [runner.add(request(panel, s)) for s in (11, 22, 33)]
    qtbot.waitUntil(lambda: runner.job is not None and runner.job.id == jobs[1].id,
                    timeout=5000)
    qtbot.waitUntil(lambda: runner.job.steps_done >= 1, timeout=5000)
    assert runner.cancel(jobs[1].id)
    wait_idle(qtbot, runner)
    q = runner.queue
    assert [q.get(j.id).state for j in jobs] == ["done", "cancelled", "done"]
    assert Path(q.get(jobs[0].id).results[0]).is_file() and q.get(jobs[1].id).results == []
    assert pixel(q.get(jobs[2].id).results[0]) == 33
    assert len(list((tmp_path / "history").glob("*.png"))) == 2


def test_a_failed_job_is_marked_and_the_next_runs_on_a_fresh_engine(qtbot, ctl, tmp_path):
    factory = Factory(lambda: SeedClient([], delay_s=0.01))
    panel, runner, view = setup(qtbot, ctl, tmp_path, factory)
    jobs = [runner.add(request(panel, 1)), runner.add(request(panel, 2, fail=True)),
            runner.add(request(panel, 3))]
    wait_idle(qtbot, runner)
    q = runner.queue
    assert [q.get(j.id).state for j in jobs] == ["done", "failed", "done"]
    assert "engine process died" in q.get(jobs[1].id).error
    assert len(factory.clients) == 2 and factory.clients[0].closed
    assert [r["seed"] for r in factory.clients[1].requests] == [3]
    assert view.list.item(1).text().startswith("✕") and "1 failed" in view.total_label.text()
    view.list.setCurrentRow(1)
    view._button("retry")  # queued again at the end; it fails again here
    wait_idle(qtbot, runner)
    assert q.jobs[-1].id == jobs[1].id and q.get(jobs[1].id).state == "failed"


def test_a_killed_engine_process_fails_one_job_and_the_next_runs(qtbot, ctl, tmp_path):
    pytest.importorskip("sdplan._ggml")
    from sdplan.core.runtime.client import EngineClient
    from sdplan.core.runtime.process import Engine

    here = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, *sys.path])}
    factory = Factory(lambda: EngineClient("queue_jobs:fake_generate", engine=Engine(env=env)))
    panel, runner, view = setup(qtbot, ctl, tmp_path, factory)
    jobs = [runner.add(request(panel, 7)), runner.add(request(panel, 8, die_at=2)),
            runner.add(request(panel, 9))]
    wait_idle(qtbot, runner, timeout=60000)
    q = runner.queue
    assert [q.get(j.id).state for j in jobs] == ["done", "failed", "done"]
    assert "engine process died (signal SIGKILL)" in q.get(jobs[1].id).error
    assert len(factory.clients) == 2  # a new engine process served the third job
    assert pixel(q.get(jobs[0].id).results[0]) == 7 and pixel(q.get(jobs[2].id).results[0]) == 9
    panel.shutdown()


def test_pause_lets_the_running_job_finish_and_starts_no_other(qtbot, ctl, tmp_path):
    factory = Factory(lambda: SeedClient([], delay_s=0.03))
    panel, runner, view = setup(qtbot, ctl, tmp_path, factory)
    a, b = runner.add(request(panel, 1)), runner.add(request(panel, 2))
    view.pause_btn.click()
    assert runner.queue.paused and view.pause_btn.text() == "Resume"
    qtbot.waitUntil(lambda: not runner.is_running(), timeout=5000)
    assert runner.queue.get(a.id).state == "done" and runner.queue.get(b.id).state == "queued"
    assert "paused" in view.total_label.text()
    view.pause_btn.click()
    wait_idle(qtbot, runner)
    assert runner.queue.get(b.id).state == "done"


def test_progress_and_eta_per_job_and_for_the_queue(qtbot, ctl, tmp_path):
    factory = Factory(lambda: SeedClient([], delay_s=0.05))
    panel, runner, view = setup(qtbot, ctl, tmp_path, factory)
    runner.add(request(panel, 1))
    second = runner.add(request(panel, 2))
    qtbot.waitUntil(lambda: runner.job is not None and runner.job.id == second.id
                    and runner.job.steps_done >= 2, timeout=5000)
    assert view.job_bar.value() == runner.job.steps_done and view.job_bar.maximum() == STEPS
    assert "step" in view.job_label.text() and "ETA 0:0" in view.job_label.text()
    assert "1 of 2 done" in view.total_label.text() and "queue ETA 0:0" in view.total_label.text()
    assert 0 < runner.queue_eta() < 5
    wait_idle(qtbot, runner)
    assert clock(3725) == "1:02:05" and clock(None) == "–"


def test_generate_waits_for_the_queue_and_batches(qtbot, ctl, tmp_path):
    factory = Factory(lambda: SeedClient([], delay_s=0.03))
    panel, runner, view = setup(qtbot, ctl, tmp_path, factory)
    panel.seed.setValue(40)
    panel.steps.setValue(STEPS)
    jobs = runner.add_batch(panel.request(), seeds=[40, 41, 42])
    assert not panel.generate_btn.isEnabled() and not panel.generate()
    assert panel.state.text().startswith("The queue is running")
    wait_idle(qtbot, runner)
    assert panel.generate_btn.isEnabled()
    assert [runner.queue.get(j.id).state for j in jobs] == ["done"] * 3
    prompts = runner.add_batch(panel.request(), prompts=["one", "two"])
    wait_idle(qtbot, runner)
    assert [runner.queue.get(j.id).request["prompt"] for j in prompts] == ["one", "two"]
    assert panel.history.count() == 5  # today's strip has every result


def test_the_queue_is_read_back_after_a_restart(qtbot, ctl, tmp_path):
    path = tmp_path / "queue.json"
    factory = Factory(lambda: SeedClient([], delay_s=0.2))
    panel, runner, view = setup(qtbot, ctl, tmp_path, factory, path)
    a, b = runner.add(request(panel, 1)), runner.add(request(panel, 2))
    runner.shutdown()  # the window closes while a runs
    qtbot.waitUntil(lambda: not runner.is_running() or runner.thread is None, timeout=5000)
    again = JobQueue(path)
    assert [j.id for j in again.jobs] == [a.id, b.id]
    assert all(j.state == "queued" for j in again.jobs)


def test_jobs_left_from_the_last_session_wait_for_resume(qtbot, tmp_path):
    from PySide6.QtCore import QSettings
    from sdplan.app.window import MainWindow

    path = tmp_path / "queue.json"
    left = JobQueue(path)
    left.add({"prompt": "left over", "seed": 3, "steps": STEPS})
    inv = Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),))
    factory = Factory(lambda: SeedClient([], delay_s=0.01))
    win = MainWindow(PlanController(inv), QSettings(str(tmp_path / "s.ini"),
                                                    QSettings.Format.IniFormat),
                     client_factory=factory, history_dir=tmp_path / "history",
                     queue_path=path, library_cache=str(tmp_path / "lib.json"))
    qtbot.addWidget(win)
    assert win.queue.paused and not win.runner.is_running()  # nothing runs by surprise
    assert win.queue_panel.pause_btn.text() == "Resume"
    assert "paused" in win.queue_panel.total_label.text()
    win.queue_panel.pause_btn.click()
    wait_idle(qtbot, win.runner)
    assert win.queue.jobs[0].state == "done" and factory.clients[0].requests[0]["seed"] == 3
    win.close()


def test_queue_view_shows_server_jobs(qtbot, tmp_path):
    """The queue view lists the jobs ``sdplan serve --queue-file`` records, with their device
    group and predicted time, read again when the file changes; hidden without such jobs."""
    from sdplan.app.server_queue import ServerJobs

    path = tmp_path / "sdplan-server-queue.json"
    view = ServerJobs(path)
    qtbot.addWidget(view)
    assert view.isHidden() and view.list.count() == 0
    q = JobQueue(path)
    q.add({"prompt": "an app job", "steps": 2})
    job = q.add({"prompt": "a red circle", "seed": 3, "steps": 2}, origin="server", job_id="job_a")
    job.predicted = 1.25
    q.start("job_a").group = "g1"
    q.save()
    assert view.reload()
    assert [view.list.item(i).text() for i in range(view.list.count())] == [
        "▶ “a red circle” · seed 3 · 2 steps · group g1 · step 0/2 · predicted 1.2 s"]
    assert not view.isHidden()
    assert not view.reload()  # unchanged file: not read again
