"""The generation queue's core: order, batches, moves, cancel and retry, the time left,
and the file that keeps it across app restarts (a running job is queued again)."""

from __future__ import annotations

import json

import pytest
from sdplan.core.pipelines.job_queue import JobQueue, job_label

REQ = {"prompt": "a lighthouse", "seed": 1, "steps": 10, "batch_count": 1,
       "backend": "CPU", "model_files": {"model": ["/m/model.safetensors"]}}


def test_add_batch_move_cancel_retry(tmp_path) -> None:
    q = JobQueue(tmp_path / "q.json")
    a = q.add(REQ)
    seeds = q.add_batch(REQ, seeds=[5, 6])
    prompts = q.add_batch(REQ, prompts=["dawn", "dusk"])
    assert [j.request["seed"] for j in seeds] == [5, 6]
    assert [j.request["prompt"] for j in prompts] == ["dawn", "dusk"]
    assert [j.request["seed"] for j in prompts] == [1, 1]
    with pytest.raises(ValueError, match="seeds or prompts"):
        q.add_batch(REQ)
    q.move(prompts[1].id, 0)
    assert [j.id for j in q.jobs] == [prompts[1].id, a.id, seeds[0].id, seeds[1].id,
                                      prompts[0].id]
    assert q.cancel(seeds[0].id) and q.get(seeds[0].id).state == "cancelled"
    assert not q.cancel(seeds[0].id)  # already finished
    assert q.next_queued().id == prompts[1].id
    q.start(prompts[1].id)
    assert not q.cancel(prompts[1].id)  # the runner stops a running job
    q.finish(prompts[1].id, "failed", error="the engine process died (signal SIGKILL)")
    assert q.retry(prompts[1].id) and q.jobs[-1].id == prompts[1].id
    assert q.get(prompts[1].id).state == "queued" and q.get(prompts[1].id).error is None
    with pytest.raises(ValueError):
        q.finish(a.id, "running")
    q.set_paused(True)
    assert q.next_queued() is None
    assert job_label(REQ) == "“a lighthouse” · seed 1 · 10 steps"


def test_time_left_from_measured_steps(tmp_path) -> None:
    q = JobQueue()
    a, b = q.add(REQ), q.add({**REQ, "steps": 30, "batch_count": 2})
    assert q.remaining_seconds() is None  # no rate yet
    q.start(a.id)
    q.get(a.id).started -= 5.0  # took 5 s for 10 steps
    q.finish(a.id, "done", results=["/r/a.png"])
    assert q.seconds_per_step() == pytest.approx(0.5, rel=0.05)
    assert q.remaining_seconds() == pytest.approx(60 * 0.5, rel=0.05)  # b: 30 steps x 2
    q.start(b.id)
    q.get(b.id).steps_done = 20
    assert q.remaining_seconds(1.0) == pytest.approx(40.0)


def test_the_queue_survives_a_restart(tmp_path) -> None:
    path = tmp_path / "q.json"
    q = JobQueue(path)
    a, b, c = q.add(REQ), q.add({**REQ, "seed": 2}), q.add({**REQ, "seed": 3})
    q.start(a.id)
    q.finish(a.id, "done", results=["/r/a.png"])
    q.start(b.id)  # the app closes while b runs
    q.set_paused(True)
    again = JobQueue(path)
    assert [(j.id, j.state) for j in again.jobs] == [(a.id, "done"), (b.id, "queued"),
                                                    (c.id, "queued")]
    assert again.get(a.id).results == ["/r/a.png"] and again.paused
    assert again.get(b.id).request == {**REQ, "seed": 2}


def test_a_corrupt_file_is_set_aside(tmp_path) -> None:
    path = tmp_path / "q.json"
    path.write_text(json.dumps({"sdplan_queue": 1, "jobs": [{"id": "x", "state": "odd",
                                                             "request": {}}]}))
    q = JobQueue(path)
    assert q.jobs == [] and (tmp_path / "q.json.bad").exists()
    q.add(REQ)
    assert len(JobQueue(path).jobs) == 1
