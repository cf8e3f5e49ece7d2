"""Quantised linear layers (Q8_0, Q4_K, Q5_K weights from a GGUF file) on the CPU: sdplan's
default path against ggml's quantised product, in one script, as ratios.

sdplan runs a quantised matrix product in its bf16 kernel wherever a module's products run in
bf16 (AMX, or AVX512_BF16 measured fast: ``Graph.quant_as_bf16``), each block dequantised and
rounded to bf16 as it is used; ggml's own product (``quant_as_bf16`` off: what sd-cli and sdplan
without a bf16 kernel run, with the activations quantised to 8 bits per block) is the reference.
Shapes are a DiT's (FLUX.2 klein 4B: width 3072, MLP 9216; Z-Image 3840) and SD 1.5's UNet
(its 1280-wide attention projection) at a 512 px image's token counts. Weights are random
blocks (f16 scales about 0.02/16); the same file is mapped for both paths. Each figure is the
best of ``--repeat`` calls after a warm-up; the output difference to the float64 product of the
dequantised weights (gguf-py's numpy dequantisation) is printed as a check.

``bench_real_size.py --quant q8_0,q4_k,q5_k`` runs whole generations on sd-cli's own GGUF
files through both engines.

Usage: ``python bench/bench_quant.py [--threads 2] [--repeat 3] [--types q8_0,q4_k,q5_k]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import _timing
import numpy as np

#: (name, tokens, in, out)
CASES = [("klein qkv 1024x3072->9216", 1024, 3072, 9216), ("klein mlp out 1024x9216->3072", 1024, 9216, 3072),
         ("z-image qkv 1024x3840->11520", 1024, 3840, 11520), ("unet attn 256x1280->1280", 256, 1280, 1280)]


def main() -> int:
    import gguf

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.native import native
    from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner
    from sdplan.core.runtime.weights import WeightFile
    from test_quant_bf16 import QT, Linear, random_blocks, write_gguf

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--types", default="q8_0,q4_k,q5_k")
    a = ap.parse_args()
    import os

    print(f"sdplan bf16 kernel {native().bf16_kernel()}; {a.threads} thread(s); load average {os.getloadavg()}")
    pool = BackendPool(BackendManager(cpu_threads=a.threads))
    rng = np.random.default_rng(0)
    print(f"{'case':32} {'type':5} {'sdplan s':>9} {'ggml s':>9} {'ratio':>6} {'err':>8} {'ggml err':>8}")
    with tempfile.TemporaryDirectory(prefix="sdplan-bench-quant-") as d:
        for name, m, k, n in CASES:
            x = rng.standard_normal((1, m, k), dtype=np.float32)
            for q in a.types.split(","):
                raw = random_blocks(q, n, k, rng)
                deq = gguf.quants.dequantize(raw, QT[q]).reshape(n, k)
                exact = x[0].astype(np.float64) @ deq.T.astype(np.float64)
                path = Path(d) / f"{q}.gguf"
                write_gguf(path, q, raw)
                out: dict[str, Any] = {}
                for label, on in (("sdplan", True), ("ggml", False)):
                    r = ModuleRunner(Linear(), WeightFile(path), ModulePlacement(("CPU",)), pool, n_threads=a.threads)
                    make = r._new_graph

                    def new_graph(devices: Any, make: Any = make, on: bool = on) -> Any:
                        g, names = make(devices)
                        g.quant_as_bf16 = on and g.quant_as_bf16
                        return g, names

                    r._new_graph = new_graph  # type: ignore[method-assign]
                    y = r.run({"x": x})["y"]
                    out[label] = _timing.best(lambda r=r, x=x: r.run({"x": x}), a.repeat, warmup=0)
                    out[label + "_err"] = float(np.abs(y[0] - exact).max() / np.abs(exact).max())
                    r.release()
                print(f"{name:32} {q:5} {out['sdplan']:9.4f} {out['ggml']:9.4f} {out['sdplan'] / out['ggml']:6.2f} "
                      f"{out['sdplan_err']:8.1e} {out['ggml_err']:8.1e}", flush=True)
                path.unlink()
    pool.manager.close()
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
