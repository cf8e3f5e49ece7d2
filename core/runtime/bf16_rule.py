"""Whether AVX512_BF16 alone (no AMX) pays on this CPU: a measured rule.

How fast sdplan's AVX512_BF16 product runs against its f16 FMA product depends on the core, not
on the instruction set: on an AMD EPYC (Zen 4) the bf16 dot products did twice the FMA
product's work per cycle, and every DiT and text encoder ran in 0.49-0.67x its f16 time
(bench/bench_cpu_bf16_families.py, medians of 3 interleaved processes: FLUX.1 0.53x, FLUX.2
klein 0.51x, Z-Image 0.51x, SD3 0.67x, Qwen3-4B 0.49x, T5-XXL 0.57x); on an Intel Xeon with the AVX512_BF16 kernel forced the same
modules ran in 0.73-1.03x, within that host's spread, so they keep f16's precision there. The
UNets and CLIP gained on both (0.70x on the Xeon) and list ``avx512`` outright.

Model classes that list ``avx512_fast`` in ``cpu_bf16_kernels`` run their products in bf16 with
AVX512_BF16 where :func:`avx512_bf16_speedup` is at least :data:`FAST_SPEEDUP`: one product at a
DiT's shape timed both ways, once per process.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
from sdplan.core.runtime.native import native

#: Smallest measured speed-up (f16 product time / bf16 product time) at which the modules
#: listing ``avx512_fast`` take AVX512_BF16: the Zen 4 EPYC measured 1.7-1.9x, the Xeon's
#: modules 0.97-1.37x (see the module docstring); 1.5 lies between them.
FAST_SPEEDUP = 1.5

#: The timed product: x (rows, depth) f32 by an f16 weight (cols, depth), one thread (a DiT's
#: 256 image tokens at width 1024: 0.54 GFLOP, about 3 ms with AVX512_BF16 on a Zen 4 core).
SHAPE = (256, 1024, 1024)


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


def _seconds(g: Any) -> float:
    t0 = time.perf_counter()
    g.compute()
    return time.perf_counter() - t0


def avx512_bf16_speedup() -> float:
    """f16 FMA product time / AVX512_BF16 product time on this CPU (above 1: bf16 is faster),
    best of 3 interleaved timings each at :data:`SHAPE` on one thread; measured once per
    process (about 30 ms). 0.0 where there is nothing to compare: the bf16 kernel in use is not
    ``avx512`` (AMX, or none) or the CPU has no FMA product.
    """
    ng = native()
    if str(ng.bf16_kernel()) != "avx512" or not ng.fma_gemm():
        return 0.0
    return _measured_speedup()


@functools.lru_cache(maxsize=1)
def _measured_speedup() -> float:
    graphs = _product_graph(True), _product_graph(False)
    bf16, f16 = [], []
    for _ in range(3):
        bf16.append(_seconds(graphs[0]))
        f16.append(_seconds(graphs[1]))
    return min(f16) / min(bf16)


def bf16_fits(kernels: Any) -> bool:
    """Whether a model class whose ``cpu_bf16_kernels`` are ``kernels`` runs its products in bf16
    with the CPU bf16 kernel in use now: the kernel is listed, or it is ``avx512``, the class
    lists ``avx512_fast`` and :func:`avx512_bf16_speedup` reaches :data:`FAST_SPEEDUP`."""
    kernel = str(native().bf16_kernel())
    kernels = tuple(kernels or ())
    if kernel in kernels:
        return True
    return kernel == "avx512" and "avx512_fast" in kernels and avx512_bf16_speedup() >= FAST_SPEEDUP
