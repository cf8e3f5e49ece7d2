"""Whether AVX512_BF16 alone (no AMX) pays on this CPU: a measured rule.

How fast sdplan's AVX512_BF16 product runs against its f16 FMA product depends on the core, not
on the instruction set: on an AMD EPYC (Zen 4) the bf16 dot products did twice the FMA
product's work per cycle, and every DiT and text encoder ran in 0.49-0.67x its f16 time
(bench/bench_cpu_bf16_families.py, medians of 3 interleaved processes: FLUX.1 0.53x, FLUX.2
klein 0.51x, Z-Image 0.51x, SD3 0.67x, Qwen3-4B 0.49x, T5-XXL 0.57x); on an Intel Xeon with the AVX512_BF16 kernel forced the same
modules ran in 0.73-1.03x, within that host's spread, so they keep f16's precision there. The
UNets and CLIP gained on both (0.70x on the Xeon) and list ``avx512`` outright.

Model classes that list ``avx512_fast`` in ``cpu_bf16_kernels`` run their products in bf16 with
AVX512_BF16 where :func:`avx512_bf16_speedup` is at least
:data:`sdplan.core.runtime.kernels.FAST_SPEEDUP`: one product at a DiT's shape timed both ways,
once per process. This module measures; :mod:`sdplan.core.runtime.kernels` decides.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np

#: How the threshold (:data:`sdplan.core.runtime.kernels.FAST_SPEEDUP`, 1.5) was set: the Zen 4
#: EPYC's timed product (1.6-2.1x over many processes, 1.9-2.0x typically) and the Xeon's whole
#: modules (0.97-1.37x; its timed product was not measured, and as products are most of a
#: module's time it should lie near those); 1.5 lies between them.
from sdplan.core.runtime.kernels import FAST_SPEEDUP as FAST_SPEEDUP  # noqa: E402
from sdplan.core.runtime.native import native

#: The timed product: x (rows, depth) f32 by an f16 weight (cols, depth), one thread (a DiT's
#: 256 image tokens at width 1024: 0.54 GFLOP, about 4 ms with AVX512_BF16 on a Zen 4 core).
SHAPE = (256, 1024, 1024)

#: Timings of each product (interleaved; the smallest counts).
REPEAT = 5


def _product_graph(f16_as_bf16: bool) -> Any:
    """A one-thread graph of the timed product (:data:`SHAPE`), inputs set and computed once."""
    from sdplan.core.runtime import graph as gr

    rows, depth, cols = SHAPE
    g = gr.new_graph([native().init_backend("CPU")], n_threads=1)
    g.f16_as_bf16 = f16_as_bf16
    g.output("y", g.mul_mat(g.input("w", (cols, depth), "f16"), g.input("x", (rows, depth))))
    rng = np.random.default_rng(0)
    g.set_input("w", (rng.random((cols, depth), np.float32) - 0.5).astype(np.float16))
    g.set_input("x", rng.random((rows, depth), np.float32) - 0.5)
    g.compute()  # warm-up: buffers, pages
    return g


def _cpu_seconds(g: Any) -> float:
    """CPU time of one compute: a one-thread graph computes on the calling thread, so the
    thread's CPU time leaves out the time other programs held the core."""
    t0 = time.thread_time()
    g.compute()
    return time.thread_time() - t0


def avx512_bf16_speedup() -> float:
    """The f16 product's time / the AVX512_BF16 product's on this CPU (above 1: bf16 is faster):
    the smallest of :data:`REPEAT` interleaved timings each at :data:`SHAPE` on one thread, as
    CPU time of the computing thread; measured once per process and f16 product path (sdplan's
    FMA product, or ggml's where it is turned off), about 0.1-0.2 s. 0.0 where the bf16 kernel
    in use is not ``avx512`` (AMX, or none): nothing to choose.
    """
    ng = native()
    if str(ng.bf16_kernel()) != "avx512":
        return 0.0
    return _measured_speedup(bool(ng.fma_gemm()))


@functools.lru_cache(maxsize=2)
def _measured_speedup(fma: bool) -> float:
    graphs = _product_graph(True), _product_graph(False)
    bf16, f16 = [], []
    for _ in range(REPEAT):
        bf16.append(_cpu_seconds(graphs[0]))
        f16.append(_cpu_seconds(graphs[1]))
    return min(f16) / max(min(bf16), 1e-9)
