"""Engine benchmark: one block-stack forward on one device vs split over two loopback RPC
servers vs numpy, and weight-load throughput vs a plain sequential read of the same file.

Run: ``python bench/bench_engine.py [--blocks 8 --dim 512 --tokens 256 --repeat 5]``.
Prints times and ratios (no assertions). The RPC part runs in the engine child process
(a registered RPC server that dies aborts its client) and is skipped without RPC.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import _timing
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from sdplan.core.models.blockstack import BlockStack, BlockStackConfig, reference, write_model  # noqa: E402
from sdplan.core.runtime.process import Engine  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile, plain_read_seconds  # noqa: E402

best = _timing.best  # best wall time of ``repeat`` calls, seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    cfg = BlockStackConfig(n_blocks=a.blocks, dim=a.dim, heads=a.dim // 64, ffn=4 * a.dim, d_in=64, d_out=64)
    tmp = Path(tempfile.mkdtemp())
    path = tmp / "stack.safetensors"
    w = write_model(path, cfg)
    x = np.random.default_rng(0).standard_normal((1, a.tokens, cfg.d_in)).astype(np.float32)
    size = path.stat().st_size
    print(f"block stack: {cfg.n_blocks} blocks, dim {cfg.dim}, {a.tokens} tokens, file {size / 2**20:.1f} MiB")

    # weight loading vs a plain read of the same file (page cache warm for both)
    plain_read_seconds(path)
    n, plain = min((plain_read_seconds(path) for _ in range(a.repeat)), key=lambda r: r[1])
    pool = BackendPool()
    wf = WeightFile(path)

    def load() -> None:
        store = wf.new_store()
        store.allocate(list(wf.infos), pool.get("CPU"))
        wf.read(store, list(wf.infos))
        store.free_all()

    t_load = best(load, a.repeat)
    print(f"plain read   {n / plain / 2**30:8.2f} GiB/s")
    print(f"weight load  {wf.nbytes(wf.infos) / t_load / 2**30:8.2f} GiB/s  ({plain / t_load:.2f}x plain read)")

    # forward: numpy vs one device (CPU) vs split over two RPC servers
    t_np = best(lambda: reference(cfg, w, x), a.repeat)
    runner = ModuleRunner(BlockStack(cfg), wf, ModulePlacement(("CPU",)), pool)
    y = runner.run({"x": x})["y"]
    t_cpu = best(lambda: runner.run({"x": x}), a.repeat)
    err = float(np.abs(y - reference(cfg, w, x)).max())
    print(f"numpy (f64)  {t_np * 1e3:8.1f} ms")
    print(f"CPU          {t_cpu * 1e3:8.1f} ms  ({t_np / t_cpu:.2f}x numpy, max error {err:.1e})")

    import sdplan._ggml as native

    if not native.rpc_available():
        print("RPC          skipped (ggml without RPC)")
        return 0
    from rpc_util import rpc_servers

    half = cfg.n_blocks // 2
    job = dict(model="sdplan.core.models.blockstack:_from_args", model_args=cfg.__dict__, path=str(path),
               inputs={"x": x}, runs=a.repeat)
    with rpc_servers(2, threads=max(1, (os.cpu_count() or 2) // 2)) as servers, Engine() as engine:
        eps = [s.endpoint for s in servers]
        for name, pl in [("RPC0", {"devices": ["RPC0"]}),
                         ("RPC0&RPC1", {"devices": ["RPC0", "RPC1"],
                                        "ranges": [("RPC0", 0, half - 1), ("RPC1", half, cfg.n_blocks - 1)]})]:
            engine.call("sdplan.core.runtime.process:run_module_job", dict(job, placement=pl, runs=1, rpc_servers=eps))
            t0 = time.perf_counter()
            res = engine.call("sdplan.core.runtime.process:run_module_job", dict(job, placement=pl, rpc_servers=eps))
            t = (time.perf_counter() - t0) / a.repeat
            d = float(np.abs(res["outputs"]["y"] - y).max())
            print(f"{name:<12} {t * 1e3:8.1f} ms/run incl. load ({t_cpu / t:.2f}x CPU, diff to CPU {d:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
