"""Flux DiT step time: one device against the same model split over two loopback RPC servers.

A random-weight DiT in the BFL layout with the ``model.diffusion_model.`` prefix (default
width 512, 4 double + 8 single blocks, dev-style guidance embedder, f16 matrices) runs one
sampling step (one DiT call) on the local CPU, on one RPC server (RPC0) and split over two
(RPC0&RPC1, blocks divided so each server holds about half the weight bytes). Every device
gets the same CPU threads. Reports the best step time of each and the ratios; outputs are
compared with the local CPU's.

Run: ``python bench/bench_flux.py [--width 512 --double 4 --single 8 --latent 32 --txt 64
--repeat 3 --threads 1]``. Prints figures, asserts nothing. RPC clients run in a child
process (ggml aborts a client whose server disappears); the RPC part is skipped without RPC.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

PREFIX = "model.diffusion_model."


def write_model(path: Path, width: int, n_double: int, n_single: int, context: int, pooled: int,
                seed: int = 0) -> None:
    """A random Flux DiT (dev layout: with guidance_in) as safetensors: matrices f16 with
    std 1/sqrt(fan_in), vectors f32 (biases 0, norm scales 1)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    mlp, hd = 4 * width, 128
    t: dict[str, np.ndarray] = {}

    def lin(name: str, out_f: int, in_f: int) -> None:
        t[PREFIX + name + ".weight"] = (rng.standard_normal((out_f, in_f)) / np.sqrt(in_f)).astype(np.float16)
        t[PREFIX + name + ".bias"] = np.zeros(out_f, np.float32)

    lin("img_in", width, 64)
    lin("txt_in", width, context)
    for emb, fan_in in (("time_in", 256), ("guidance_in", 256), ("vector_in", pooled)):
        lin(emb + ".in_layer", width, fan_in)
        lin(emb + ".out_layer", width, width)
    for i in range(n_double):
        for s in ("img", "txt"):
            p = f"double_blocks.{i}.{s}_"
            lin(p + "mod.lin", 6 * width, width)
            lin(p + "attn.qkv", 3 * width, width)
            lin(p + "attn.proj", width, width)
            lin(p + "mlp.0", mlp, width)
            lin(p + "mlp.2", width, mlp)
            for n in ("query_norm", "key_norm"):
                t[PREFIX + p + f"attn.norm.{n}.scale"] = np.ones(hd, np.float32)
    for i in range(n_single):
        p = f"single_blocks.{i}."
        lin(p + "modulation.lin", 3 * width, width)
        lin(p + "linear1", 3 * width + mlp, width)
        lin(p + "linear2", width, width + mlp)
        for n in ("query_norm", "key_norm"):
            t[PREFIX + p + f"norm.{n}.scale"] = np.ones(hd, np.float32)
    lin("final_layer.adaLN_modulation.1", 2 * width, width)
    lin("final_layer.linear", 64, width)
    save_file(t, str(path))


def inputs(dit, latent: int, txt: int, seed: int = 1) -> dict[str, np.ndarray]:
    """DiT inputs for a ``(1, 16, latent, latent)`` latent and ``txt`` text tokens."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 16, latent, latent)).astype(np.float32)
    ctx = rng.standard_normal((1, txt, dit.cfg.context)).astype(np.float32)
    y = rng.standard_normal((1, dit.cfg.pooled)).astype(np.float32)
    return dit.inputs(x, ctx, y, 0.7, 3.5)


def time_steps(path: str, devices: list[str], ranges: list[tuple[str, int, int]], latent: int, txt: int,
               repeat: int, threads: int, pool=None) -> tuple[float, np.ndarray, int]:
    """(best step seconds, output, bytes of weights) of ``repeat`` DiT calls after a warm-up."""
    from sdplan.core.modelfiles.readers import read_tensor_file
    from sdplan.core.models.flux import FluxDiT
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement, ModuleRunner
    from sdplan.core.runtime.weights import WeightFile

    shapes = {ti.name: tuple(ti.shape) for ti in read_tensor_file(path).tensors}
    dit = FluxDiT.from_weights(shapes)
    pool = pool or BackendPool(BackendManager(cpu_threads=threads))
    pl = ModulePlacement(tuple(devices), tuple(BlockRange(*r) for r in ranges))
    wf = WeightFile(path, backend=pool.get(devices[0]))
    runner = ModuleRunner(dit, wf, pl, pool, name="diffusion", n_threads=threads)
    ins = inputs(dit, latent, txt)
    out = runner.run(ins)["out"]  # loads the weights, builds and allocates the graph
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        runner.run(ins)
        times.append(time.perf_counter() - t0)
    nbytes = sum(m.weights for m in runner.memory().values())
    runner.release()
    return min(times), out, nbytes


def client(argv: list[str]) -> int:
    """Child mode: ``--client SPEC_JSON``; prints the timing as JSON, saves the output."""
    spec = json.loads(argv[0])
    from sdplan.core.runtime import devices

    devices.add_rpc_servers(spec["endpoints"])
    t, out, nbytes = time_steps(spec["path"], spec["devices"], [tuple(r) for r in spec["ranges"]],
                                spec["latent"], spec["txt"], spec["repeat"], spec["threads"])
    np.save(spec["out"], out)
    print(json.dumps({"seconds": t, "weights": nbytes}))
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--client"]:
        return client(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--double", type=int, default=4)
    ap.add_argument("--single", type=int, default=8)
    ap.add_argument("--context", type=int, default=1024, help="T5 width of the text input")
    ap.add_argument("--latent", type=int, default=32, help="latent side (image side / 8)")
    ap.add_argument("--txt", type=int, default=64, help="text tokens")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sdplan-bench-flux-"))
    path = tmp / "flux.safetensors"
    write_model(path, a.width, a.double, a.single, a.context, 768)
    n_blocks = a.double + a.single
    tokens = (a.latent // 2) ** 2 + a.txt
    print(f"Flux DiT: width {a.width}, {a.double}+{a.single} blocks, {tokens} tokens, "
          f"file {path.stat().st_size / 2**20:.0f} MiB, {a.threads} thread(s) per device")

    t_cpu, ref, nbytes = time_steps(str(path), ["CPU"], [], a.latent, a.txt, a.repeat, a.threads)
    print(f"CPU            {t_cpu * 1e3:9.1f} ms/step  (weights {nbytes / 2**20:.0f} MiB)")

    import sdplan._ggml as native

    if not native.rpc_available():
        print("RPC            skipped (ggml without RPC)")
        return 0
    from rpc_util import rpc_servers

    # divide the blocks where the cumulative weight bytes pass half
    from sdplan.core.modelfiles.readers import read_tensor_file
    from sdplan.core.models.flux import FluxDiT

    infos = {ti.name: ti for ti in read_tensor_file(path).tensors}
    dit = FluxDiT.from_weights({n: tuple(i.shape) for n, i in infos.items()})
    sizes = [sum(infos[n].nbytes for n in dit.block_tensors(i)) for i in range(n_blocks)]
    cut = next(i for i in range(1, n_blocks) if sum(sizes[:i]) >= sum(sizes) / 2)
    results = {}
    with rpc_servers(2, threads=a.threads) as servers:
        eps = [s.endpoint for s in servers]
        for name, devs, ranges in [("RPC0", ["RPC0"], []),
                                   ("RPC0&RPC1", ["RPC0", "RPC1"], [("RPC0", 0, cut - 1), ("RPC1", cut, n_blocks - 1)])]:
            spec = dict(path=str(path), devices=devs, ranges=ranges, latent=a.latent, txt=a.txt, repeat=a.repeat,
                        threads=a.threads, endpoints=eps, out=str(tmp / f"{name}.npy"))
            res = subprocess.run([sys.executable, __file__, "--client", json.dumps(spec)], capture_output=True,
                                 text=True, timeout=1800)
            if res.returncode != 0:
                print(f"{name:<14} failed:\n{res.stderr[-2000:]}")
                return 1
            r = json.loads(res.stdout.strip().splitlines()[-1])
            diff = float(np.abs(np.load(tmp / f"{name}.npy") - ref).max())
            results[name] = r["seconds"]
            print(f"{name:<14} {r['seconds'] * 1e3:9.1f} ms/step  ({t_cpu / r['seconds']:.2f}x CPU, "
                  f"max diff to CPU {diff:.1e})")
    print(f"split over two RPC servers / one RPC server: {results['RPC0&RPC1'] / results['RPC0']:.2f}x step time "
          f"(blocks 0..{cut - 1} on RPC0, {cut}..{n_blocks - 1} on RPC1)")
    print(f"split over two RPC servers / local CPU:      {results['RPC0&RPC1'] / t_cpu:.2f}x step time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
