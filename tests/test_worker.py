"""The engine child process: results as arrays, progress messages, cancel across the process
boundary, out-of-memory and a killed child (or RPC server) leave the caller alive."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sdplan._ggml")
from sdplan.core.errors import EngineError  # noqa: E402
from sdplan.core.models.blockstack import BlockStackConfig, reference, write_model  # noqa: E402
from sdplan.core.runtime.process import Engine  # noqa: E402

CFG = dict(n_blocks=4, dim=64, heads=4, ffn=256, d_in=16, d_out=16)
JOB = "sdplan.core.runtime.process:run_module_job"
MODEL = "sdplan.core.models.blockstack:_from_args"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("w") / "stack.safetensors"
    return path, write_model(path, BlockStackConfig(**CFG), seed=5)


@pytest.fixture(scope="module")
def engine():
    e = Engine()
    yield e
    e.close()


def job(path: Path, x: np.ndarray, placement: dict | None = None, runs: int = 1, **kw) -> dict:
    return dict(model=MODEL, model_args=CFG, path=str(path), inputs={"x": x},
                placement=placement or {"devices": ["CPU"]}, runs=runs, **kw)


X = np.random.default_rng(2).standard_normal((1, 8, 16)).astype(np.float32)


def test_child_runs_a_module_and_returns_arrays_and_progress(engine, model) -> None:
    steps: list[dict] = []
    res = engine.call(JOB, job(model[0], X, runs=2), on_progress=steps.append)
    ref = reference(BlockStackConfig(**CFG), model[1], X)
    np.testing.assert_allclose(res["outputs"]["y"], ref, atol=3e-3, rtol=3e-3)
    assert steps == [{"step": 1, "steps": 2}, {"step": 2, "steps": 2}]
    assert res["after"]["CPU"]["weights"] == res["peak"]["CPU"]["weights"] > 0  # resident
    assert engine.pid is not None and engine.pid != os.getpid()


def test_disk_residency_in_the_child_releases_everything(engine, model) -> None:
    res = engine.call(JOB, job(model[0], X, {"devices": ["CPU"], "params_mode": "disk"}))
    assert res["after"] == {} and res["peak"]["CPU"]["weights"] > 0


def test_out_of_memory_is_a_clear_error_and_the_next_run_works(engine, model) -> None:
    huge = np.zeros((1, 2**21, 16), np.float32)  # attention scores far beyond this machine
    with pytest.raises(EngineError, match="could not allocate"):
        engine.call(JOB, job(model[0], huge))
    assert engine.call(JOB, job(model[0], X))["outputs"]["y"].shape == (1, 8, 16)


def test_killed_child_names_the_signal_and_a_new_child_serves_the_next_run(engine, model) -> None:
    long_x = np.random.default_rng(0).standard_normal((1, 1024, 16)).astype(np.float32)
    engine.start()
    pid = engine.pid
    threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    with pytest.raises(EngineError, match="engine process died \\(signal SIGKILL\\)") as info:
        engine.call(JOB, job(model[0], long_x, runs=50))
    assert info.value.code == "engine_died"
    res = engine.call(JOB, job(model[0], X))
    assert engine.pid != pid and np.isfinite(res["outputs"]["y"]).all()


def test_cancel_across_the_process_boundary(engine, model) -> None:
    long_x = np.random.default_rng(0).standard_normal((1, 1024, 16)).astype(np.float32)
    engine.call(JOB, job(model[0], X))  # child warm
    threading.Timer(0.5, engine.cancel).start()
    t0 = time.perf_counter()
    with pytest.raises(EngineError) as info:
        engine.call(JOB, job(model[0], long_x, runs=200))
    assert info.value.code == "cancelled" and time.perf_counter() - t0 < 1.5
    assert engine.call(JOB, job(model[0], X))["outputs"]["y"].shape == (1, 8, 16)


def test_in_process_engine_runs_the_same_job(model) -> None:
    res = Engine(isolated=False).call(JOB, job(model[0], X))
    np.testing.assert_allclose(res["outputs"]["y"], reference(BlockStackConfig(**CFG), model[1], X),
                               atol=3e-3, rtol=3e-3)


@pytest.mark.parametrize("isolated", [True, False])
def test_submitted_job_runs_while_the_caller_works_and_one_waits_at_a_time(model, isolated) -> None:
    """submit() sends a job and returns at once; result() gives its outputs and progress;
    a second submit before the result, or a result for another job, is refused."""
    ref = reference(BlockStackConfig(**CFG), model[1], X)
    with Engine(isolated=isolated) as e:
        job_no = e.submit(JOB, job(model[0], X, runs=2))
        with pytest.raises(ValueError, match="still waiting"):
            e.submit(JOB, job(model[0], X))
        with pytest.raises(ValueError, match="not waiting"):
            e.result(job_no + 1)
        steps: list[dict] = []
        res = e.result(job_no, on_progress=steps.append)
        np.testing.assert_allclose(res["outputs"]["y"], ref, atol=3e-3, rtol=3e-3)
        assert steps == [{"step": 1, "steps": 2}, {"step": 2, "steps": 2}]
        with pytest.raises(ValueError, match="not waiting"):
            e.result(job_no)
        assert e.call(JOB, job(model[0], X))["outputs"]["y"].shape == (1, 8, 16)


def test_closing_with_a_submitted_job_cancels_it(model) -> None:
    """An engine closed while a submitted job runs (the caller failed before waiting for it)
    cancels the job and ends the child at once, not after the job or a time-out."""
    long_x = np.random.default_rng(0).standard_normal((1, 1024, 16)).astype(np.float32)
    e = Engine()
    e.call(JOB, job(model[0], X))  # child warm
    e.submit(JOB, job(model[0], long_x, runs=400))
    time.sleep(0.3)
    t0 = time.perf_counter()
    e.close()
    assert time.perf_counter() - t0 < 1.5 and e.pid is None


@pytest.mark.rpc
def test_split_over_two_rpc_servers_and_a_lost_server(engine, model) -> None:
    import sdplan._ggml as native
    from conftest import require_or_skip
    from rpc_util import GGML_PRODUCTS_ENV, rpc_servers, stop

    if not native.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    local = engine.call(JOB, job(model[0], X))["outputs"]["y"]
    with Engine(env=GGML_PRODUCTS_ENV) as one:  # one device with the ops RPC devices run
        ref = one.call(JOB, job(model[0], X))["outputs"]["y"]
    with rpc_servers(2) as servers:
        eps = [s.endpoint for s in servers]
        split = {"devices": ["RPC0", "RPC1"], "ranges": [("RPC0", 0, 1), ("RPC1", 2, 3)]}
        for pl in (split, {**split, "params_mode": "device", "params_device": "CPU"},
                   {**split, "params_mode": "disk"}, {"devices": ["RPC0"], "budget": 300_000}):
            res = engine.call(JOB, job(model[0], X, pl, runs=2, rpc_servers=eps))
            np.testing.assert_allclose(res["outputs"]["y"], ref, atol=1e-4, rtol=1e-4)
        long_x = np.random.default_rng(0).standard_normal((1, 512, 16)).astype(np.float32)
        threading.Timer(1.0, stop, (servers[1], signal.SIGKILL)).start()
        with pytest.raises(EngineError, match="(?s)engine process died.*RPC server") as info:
            engine.call(JOB, job(model[0], long_x, split, runs=100, rpc_servers=eps))
        assert info.value.code == "engine_died"
    res = engine.call(JOB, job(model[0], X))  # a good plan works again
    np.testing.assert_allclose(res["outputs"]["y"], local, atol=1e-6)
