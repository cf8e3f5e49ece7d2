"""The block stack through ModuleRunner: one device, split over two CPU backend instances,
CPU params, disk residency, budget segments and stream layers give the numpy output;
memory truth after each; cancel; the plan adapter."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
from sdplan.core.errors import EngineError  # noqa: E402
from sdplan.core.models.blockstack import BlockStack, BlockStackConfig, reference, write_model  # noqa: E402
from sdplan.core.runtime.runner import (  # noqa: E402
    BackendPool,
    BlockRange,
    Cancelled,
    DeviceMemory,
    ModulePlacement,
    ModuleRunner,
)
from sdplan.core.runtime.weights import WeightFile  # noqa: E402

CFG = BlockStackConfig(n_blocks=6, dim=64, heads=4, ffn=256, d_in=16, d_out=16)
SPLIT = (BlockRange("CPU", 0, 2), BlockRange("CPU1", 3, 5))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path_factory.mktemp("bs") / "stack.safetensors"
    return path, write_model(path, CFG, seed=3)


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


@pytest.fixture(scope="module")
def x() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((2, 12, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def one_device(model, pool, x) -> np.ndarray:
    r = ModuleRunner(BlockStack(CFG), WeightFile(model[0]), ModulePlacement(("CPU",)), pool)
    return r.run({"x": x})["y"]


def total(mem: dict[str, DeviceMemory], field: str) -> int:
    return sum(getattr(m, field) for m in mem.values())


def test_one_device_matches_numpy(model, one_device, x) -> None:
    np.testing.assert_allclose(one_device, reference(CFG, model[1], x), atol=3e-3, rtol=3e-3)


PLACEMENTS = {
    "split": ModulePlacement(("CPU", "CPU1"), SPLIT),
    "split_cpu_params": ModulePlacement(("CPU", "CPU1"), SPLIT, "device", "CPU"),
    "disk": ModulePlacement(("CPU",), params_mode="disk"),
    "split_disk": ModulePlacement(("CPU", "CPU1"), SPLIT, "disk"),
    "budget": ModulePlacement(("CPU",), budget=500_000),
    "budget_params": ModulePlacement(("CPU1",), params_mode="device", params_device="CPU", budget=500_000),
    "stream": ModulePlacement(("CPU1",), params_mode="device", params_device="CPU", budget=900_000,
                              stream_layers=True),
}


@pytest.mark.parametrize("name", sorted(PLACEMENTS))
def test_every_placement_gives_the_one_device_output(model, pool, x, one_device, name) -> None:
    pl = PLACEMENTS[name]
    r = ModuleRunner(BlockStack(CFG), WeightFile(model[0]), pl, pool, name=name)
    for _ in range(2):  # graphs are reused across runs
        np.testing.assert_allclose(r.run({"x": x})["y"], one_device, atol=1e-5, rtol=1e-5)
    peak, now = r.last_peak, r.memory()
    wf = WeightFile(model[0])
    weight_bytes = wf.nbytes(wf.infos)
    if pl.params_mode == "disk":
        assert total(now, "weights") == 0 and total(now, "staging") == 0
        assert total(peak, "weights") >= weight_bytes
    if pl.params_mode == "device" and not pl.stream_layers:
        assert total(now, "staging") == 0
        assert now[pl.params_device].weights >= weight_bytes
        assert total(peak, "staging") > 0
    if pl.budget:
        segs = r.segments({"x": x.shape})
        assert len(segs) > 1 and [i for s in segs for i in s] == list(range(CFG.n_blocks))
        main = pl.devices[0]
        assert peak[main].weights + peak[main].staging + peak[main].compute <= pl.budget
    if len(pl.devices) == 2 and pl.params_mode == "runtime":
        assert now["CPU"].weights > 0 and now["CPU1"].weights > 0
    assert total(now, "compute") == 0  # compute buffers are released after a run
    assert total(peak, "compute") > 0
    r.release()
    assert r.memory() == {}


def test_stream_layers_keep_leading_segments_resident(model, pool, x) -> None:
    r = ModuleRunner(BlockStack(CFG), WeightFile(model[0]), PLACEMENTS["stream"], pool)
    r.run({"x": x})
    segs = r._segments({"x": x.shape})
    resident = [s.resident for s in segs]
    assert resident == [True] + [False] * (len(segs) - 1) and len(segs) > 1
    kept = r.memory()["CPU1"].staging
    assert kept > 0  # resident segments stay staged between runs
    r.run({"x": x})
    assert r.memory()["CPU1"].staging == kept


def test_measure_reports_compute_bytes_before_loading(model, pool, x) -> None:
    r = ModuleRunner(BlockStack(CFG), WeightFile(model[0]), PLACEMENTS["split"], pool)
    sizes = r.measure({"x": x.shape})
    assert sizes["CPU"] > 0
    assert r.memory() == {}  # nothing loaded, nothing kept
    r.run({"x": x})
    assert r.last_peak["CPU"].compute == sizes["CPU"]


def test_session_keeps_disk_weights_for_several_runs(model, pool, x, one_device) -> None:
    r = ModuleRunner(BlockStack(CFG), WeightFile(model[0]), PLACEMENTS["disk"], pool)
    with r.session():
        a = r.run({"x": x})["y"]
        loaded = total(r.memory(), "weights")
        b = r.run({"x": x})["y"]
        assert total(r.memory(), "weights") == loaded > 0
    assert total(r.memory(), "weights") == 0
    np.testing.assert_array_equal(a, b)


def test_out_of_memory_is_an_engine_error_and_the_runner_recovers(model, pool, x, one_device) -> None:
    big = BlockStackConfig(n_blocks=2, dim=64, heads=4, ffn=256, d_in=16, d_out=16)
    r = ModuleRunner(BlockStack(big), WeightFile(model[0], names=_names(big)), ModulePlacement(("CPU",)), pool)
    with pytest.raises(EngineError, match="could not allocate"):
        r.run({"x": np.zeros((1, 2**22, 16), np.float32)})  # attention scores of 2^44 floats
    assert np.isfinite(r.run({"x": x})["y"]).all()


def _names(cfg: BlockStackConfig) -> list[str]:
    m = BlockStack(cfg)
    return m.other_tensors() + [n for i in range(cfg.n_blocks) for n in m.block_tensors(i)]


def test_cancel_stops_a_run_within_a_second_and_the_runner_stays_usable(model, pool) -> None:
    r = ModuleRunner(BlockStack(CFG), WeightFile(model[0]), ModulePlacement(("CPU",)), pool)
    long_x = np.random.default_rng(0).standard_normal((1, 1500, 16)).astype(np.float32)
    t0 = time.perf_counter()
    r.run({"x": long_x})
    full = time.perf_counter() - t0
    threading.Timer(full / 4, r.cancel.cancel).start()
    t0 = time.perf_counter()
    with pytest.raises(Cancelled):
        r.run({"x": long_x})
    assert time.perf_counter() - t0 < full / 4 + 1.0
    r.cancel.reset()
    assert np.isfinite(r.run({"x": long_x[:, :8]})["y"]).all()


def test_placement_from_plan_adapter() -> None:
    plan = SimpleNamespace(
        modules={"diffusion": SimpleNamespace(devices=["RPC0", "RPC1"], params=SimpleNamespace(mode="device", device="CPU"),
                                              ranges=[SimpleNamespace(device="RPC0", first_block=0, last_block=3, bytes=1),
                                                      SimpleNamespace(device="RPC1", first_block=4, last_block=9, bytes=1)]),
                 "vae": SimpleNamespace(devices=["RPC0"], params=SimpleNamespace(mode="disk", device=None), ranges=[])},
        budgets={"RPC0": 2**30, "RPC1": 0, "CPU": 0}, stream_layers=True)
    d = ModulePlacement.from_plan(plan, "diffusion")
    assert d.devices == ("RPC0", "RPC1") and d.budget == 0 and d.stream_layers
    assert d.ranges[1] == BlockRange("RPC1", 4, 9) and d.params_device == "CPU"
    v = ModulePlacement.from_plan(plan, "vae")
    assert v.budget == 2**30 and v.params_mode == "disk" and not v.stream_layers


def test_bad_placements_are_rejected() -> None:
    with pytest.raises(ValueError, match="params_device"):
        ModulePlacement(("CPU",), params_mode="device")
    with pytest.raises(ValueError, match="params_mode"):
        ModulePlacement(("CPU",), params_mode="ram")


RPC_GRAPH_SCRIPT = r'''
import sys
import numpy as np
import sdplan._ggml as G
from sdplan.core.runtime import devices
from sdplan.core.runtime import graph as gr

devices.add_rpc_servers(sys.argv[1:3])
m = devices.BackendManager(1)
r0, r1, cpu = m.get("RPC0"), m.get("RPC1"), m.get("CPU")
rng = np.random.default_rng(0)
x = rng.standard_normal((4, 8)).astype(np.float32)

# 1. a view of a tensor made on RPC0 whose first user comes after RPC1's nodes: the view
#    must stay in RPC0's split (RPC1's server cannot address RPC0's buffers)
g = gr.new_graph([r0, r1, cpu], n_threads=1)
xi = g.input("x", (4, 8))
with gr.on(g, 0):
    a = g.scale(xi, 2.0)
with gr.on(g, 1):
    b = g.scale(a, 3.0)
with gr.on(g, 0):
    c = g.cont(g.view(a, (4, 4), (32, 4), 16))
    g.output("y", g.add(g.view(b, (4, 4), (32, 4), 0), c))
for _ in range(2):
    g.set_input("x", x)
    g.compute()
    np.testing.assert_allclose(g.get_output("y"), 6 * x[:, :4] + 2 * x[:, 4:], rtol=1e-6)
print("views ok", flush=True)

# 2. reserve/allocate in every order with weights (and views of weights) on RPC0, weights
#    freed and loaded again between runs (same or other addresses)
W = rng.standard_normal((16, 8)).astype(np.float32)
K = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
KB = rng.standard_normal((6,)).astype(np.float32)
IMG = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
SPECS = [("w", "f32", (16, 8)), ("k", "f32", (6, 3, 3, 3)), ("kb", "f32", (6,))]
store = G.WeightStore(SPECS)
store.plan(["w", "k", "kb"], r0)

def conv_ref():
    pad = np.pad(IMG[0], ((0, 0), (1, 1), (1, 1)))
    out = np.zeros((6, 8, 8), np.float32)
    for i in range(8):
        for j in range(8):
            out[:, i, j] = np.tensordot(K, pad[:, i:i + 3, j:j + 3], axes=3)
    return out[None] + KB[:, None, None]

def new():
    g = gr.new_graph([r0, cpu], n_threads=1)
    xi, im = g.input("x", (4, 8)), g.input("img", (1, 3, 8, 8))
    with gr.on(g, 0):
        g.output("y", gr.linear(g, xi, store.tensor("w")))
        g.output("c", gr.conv2d(g, im, store.tensor("k"), store.tensor("kb"), padding=1))
    g.build()
    return g

def load():
    buf = store.allocate(["w", "k", "kb"], r0)
    for n, v in (("w", W), ("k", K), ("kb", KB)):
        store.set_data(n, v)
    return buf

def run(g):
    g.set_input("x", x)
    g.set_input("img", IMG)
    g.compute()
    np.testing.assert_allclose(g.get_output("y"), x @ W.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g.get_output("c"), conv_ref(), rtol=1e-4, atol=1e-4)

ORDERS = ["reserve load alloc run", "reserve free load run", "load run reserve run run",
          "load reserve run", "reserve load reserve alloc run", "load run unload load run run",
          "reserve load run unload other load unother run reserve run"]
for order in ORDERS:
    g, buf, other = new(), None, None
    for step in order.split():
        if step == "reserve":
            assert g.reserve()[0] > 0
        elif step == "free":
            g.free_compute()
        elif step == "load":
            buf = load()
        elif step == "unload":
            buf.free()
        elif step == "other":  # another buffer takes the freed slot
            other = G.WeightStore([("o", "f32", (4,))])
            obuf = other.allocate(["o"], r0)
        elif step == "unother":
            obuf.free()
        elif step == "alloc":
            g.allocate()
        elif step == "run":
            run(g)
    g.free_compute()
    store.free_all()
    print("order ok:", order, flush=True)
print("OK")
'''


@pytest.mark.rpc
def test_rpc_graphs_views_and_reserve_orders(tmp_path) -> None:
    """Views stay in their source's split on RPC devices; reserve/allocate/compute in any
    order with weights on an RPC device, freed and reloaded, give numpy's results."""
    import subprocess
    import sys

    from conftest import require_or_skip
    from rpc_util import rpc_servers

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    with rpc_servers(2) as (s0, s1):
        res = subprocess.run([sys.executable, "-c", RPC_GRAPH_SCRIPT, s0.endpoint, s1.endpoint],
                             capture_output=True, text=True, timeout=240)
        logs = s0.output() + s1.output()
    assert res.returncode == 0 and res.stdout.strip().endswith("OK"), (
        res.stdout[-2000:] + res.stderr[-3000:] + logs[-2000:])
