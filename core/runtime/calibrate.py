"""Device profiles measured on the device: a few seconds of products, copies and reads.

:func:`calibrate_device` times, on one device through the engine's own graph code (so the
kernels measured are the ones the engine runs there):

- the fixed cost of computing a graph (one tiny node) and of each further node (a chain of
  64 tiny nodes), and of a graph's first compute after allocating its compute buffers, fixed
  and per byte of them (every graph timed); each
  memory-bound kernel the models run (adds, products by a tensor,
  SiLU, GELUs, copies of transposed views, f32 to f16 casts, softmax, LayerNorm, GroupNorm, GEGLU, upscaling,
  concatenation: :data:`MEM_OPS`) on 128 KiB and on 16 MiB;
- matrix products ``(N, K) x (M, K)^T`` with f16, bf16, q8_0 and f32 weights at four sizes
  from 0.5 MFLOP to 3.4 GFLOP (on a CPU with sdplan's bf16 kernel, f16 also as the kernel
  runs it for the modules that hold f16 weights in bf16), 3x3 convolutions at two or three
  sizes per channel count, self-attention at the models' head widths and cross-attention
  over a 77-token text context (:data:`ATTENTIONS`, :data:`CROSS_ATTENTIONS`): FLOP/s per op
  size, net of the fixed costs and of the graph's memory-bound nodes;
- host-to-device and device-to-host copies of a small and a large tensor (for an RPC device
  that is the network link): bandwidth and latency.

:func:`calibrate_drive` reads a 64 MiB file it writes on a drive: cold (its pages dropped
from the page cache after ``fsync``), cached, and mapped (every page first touched).

:func:`calibrate_inventory` keeps what it measures (:mod:`sdplan.core.runtime.profile_cache`);
``sdplan devices --calibrate`` measures again.

This module imports nothing heavy until a measurement runs.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sdplan.core.planning.device_profile import DeviceProfile, DriveProfile, Link, default_profile
from sdplan.core.planning.inventory import Inventory
from sdplan.core.runtime.profile_cache import cached_drives, store

log = logging.getLogger(__name__)

#: Product shapes (M, K, N rows): 0.5 MFLOP, 13 MFLOP, 0.42 GFLOP, 3.4 GFLOP.
PRODUCTS = ((64, 64, 64), (320, 320, 64), (640, 640, 512), (1280, 1280, 1024))
#: More product shapes for f16 weights, as UNets and text encoders use them: 1x1 convolutions
#: and projections over a few hundred tokens, cross-attention over 77 or 154 text tokens, an
#: MLP's widening (M, K, N rows; 2 to 1700 MFLOP).
F16_PRODUCTS = ((64, 64, 512), (512, 64, 512), (64, 768, 154), (320, 768, 77), (1280, 320, 2048))
#: 3x3 convolutions (batch, channels in = out, height = width): 4.7 MFLOP to 19 GFLOP, two
#: or three sizes for each of the channel counts the models use (the demo's 32 to 128 down to
#: its UNet's 8x8 level: a rate is held flat below the smallest size measured, and a small
#: convolution runs far slower per FLOP; SD's UNet 320 to 1280, its VAE 128 to 512: up to a
#: 256 px decode's last level, whose columns no cache holds), as a UNet and a VAE decoder run
#: them.
CONVS = ((2, 32, 8), (2, 32, 16), (1, 32, 128), (2, 64, 8), (2, 64, 16), (1, 64, 64), (2, 128, 8), (1, 128, 64),
         (1, 128, 128), (1, 128, 256), (2, 320, 16), (1, 320, 32), (1, 512, 16), (1, 512, 32), (2, 640, 8),
         (2, 1280, 4), (2, 1280, 8))
#: Attention (batch, heads, tokens, head width): the widths of the demo (8, at its UNet's
#: 16x16 and 8x8 levels; 12 at its 4x4 level: ggml's CPU kernel runs a width that is not a
#: multiple of 8 some 30x slower per score, so no other width stands in for it), SD 1.x (40), CLIP, SD 2.x, SDXL and the DiTs (64), the VAEs' single
#: head (512).
ATTENTIONS = ((2, 8, 64, 8), (2, 8, 256, 8), (2, 8, 16, 12), (2, 8, 64, 12), (1, 12, 77, 64), (2, 8, 256, 40),
              (1, 8, 1024, 40), (2, 10, 1024, 64), (1, 1, 256, 512), (1, 1, 1024, 512))
#: Cross-attention over a text context (batch, heads, query tokens, head width, key tokens):
#: the UNets' over CLIP's 77 tokens at the demo's (8), SD 1.x's (40) and SDXL's (64) widths.
#: Fewer keys than queries run slower per score than a self-attention of the same size
#: (ggml's CPU kernel: 2x at widths 40 and 64, a cost per query row), so they have rates of
#: their own (``@dNkM`` kernels: :func:`sdplan.core.runtime.work_count.kernel_key`).
CROSS_ATTENTIONS = ((2, 8, 256, 8, 77), (2, 8, 1024, 40, 77), (2, 10, 1024, 64, 77))
#: FLOP a timed chain of products aims at (:func:`_chain`).
CHAIN_FLOP = 5e7
#: Weight dtypes measured.
DTYPES = ("f16", "bf16", "q8_0", "f32")
#: Bytes of the large memory-bound ops' operand (twice the 16 MiB of :data:`MEM_OPS`).
MEM_BYTES = 32 << 20
#: Calls per timing at least (their mean is kept), and seconds at least (:func:`_timed`).
REPEAT = 3
LEAST_S = 0.05


# --------------------------------------------------------------------------- measuring


def _timed(fn: Callable[[], object], repeat: int = REPEAT, least_s: float = LEAST_S, warm: bool = True) -> float:
    """Mean seconds of a call of ``fn``, after one untimed call (allocation, first touch,
    caches; ``warm`` False: the caller made it): calls until at least ``repeat`` calls and
    ``least_s`` seconds. A mean over a stretch of time, not the fastest call: on a machine
    other programs share, a model's steps run at the average speed the device gives, and
    short timings that slip between other programs' time slices would overstate it."""
    if warm:
        fn()
    n = 0
    t0 = time.perf_counter()
    while True:
        fn()
        n += 1
        took = time.perf_counter() - t0
        if n >= repeat and took >= least_s:
            return took / n


def _chain(flops: float, sync_s: float = 0.0) -> int:
    """How many ops of ``flops`` FLOP a timed graph chains: enough for about
    :data:`CHAIN_FLOP` (fixed per-graph costs fade), more where waiting for a compute takes
    a round trip of ``sync_s`` seconds (``sync_s / 0.1 ms`` times as many, so the round
    trip's jitter fades too), 1 to 64."""
    target = CHAIN_FLOP * max(1.0, sync_s / 1e-4)
    return max(1, min(64, round(target / flops)))


def _mem_chain(sync_s: float) -> int:
    """How many memory-bound ops of 128 KiB a timed graph chains: 16 (about 0.1 ms on a
    CPU core), more where waiting for a compute takes a round trip of ``sync_s`` seconds
    (16 per 20 us of it, up to 128): the ops' time must outweigh the trip's jitter, which
    would otherwise be taken for their work (an RPC server's small adds were priced at 3x
    the memory bandwidth, and a step of small tensors came out a third short)."""
    return max(16, min(128, 16 * round(sync_s / 2e-5)))


class _Bench:
    """Graphs on one device, timed."""

    def __init__(self, backend: Any, cpu: Any, threads: int) -> None:
        from sdplan.core.runtime import graph as gr

        self.gr = gr
        self.backend, self.cpu, self.threads = backend, cpu, threads
        self.is_cpu = backend is cpu
        self.graph_s = 0.0
        self.node_s = 0.0
        self.op_s = 0.0
        self.mem_bps = 1e10
        self.sync_s = 0.0  # the read-back that waits for a compute (an RPC round trip)
        self.h2d: Link | None = None  # inputs live in host memory and are copied in per compute
        self.mem_rates: dict[str, list[tuple[float, float]]] = {}
        self.allocs: list[tuple[int, float]] = []  # (buffer bytes, first compute's extra seconds)
        self.alloc_query_s = 0.0

    def graph(self, build: Callable[[Any], dict[str, Any]], f16_as_bf16: bool = False,
              attention_bf16: bool = False) -> tuple[float, Any]:
        """Build with ``build(g) -> {input name: array}`` (its last op's result is read back
        as one value, which waits for the compute where a device computes asynchronously, as
        ggml's RPC client does), compute, return (median seconds less the read-back's
        latency and, off the CPU, less copying the inputs in: the scheduler keeps graph
        inputs in host memory; the graph's work on this device)."""
        from sdplan.core.runtime.work_count import graph_work

        g = self.gr.new_graph([self.backend] if self.is_cpu else [self.backend, self.cpu],
                              n_threads=self.threads)
        g.f16_as_bf16 = f16_as_bf16
        g.bf16_attention = attention_bf16
        with self.gr.on(g, 0):  # every op on the device measured, as the runner pins them
            feed = build(g)
            last = g.output_names[-1]
        g.build()
        t_first = time.perf_counter()
        g.allocate()
        for k, v in feed.items():
            g.set_input(k, v)

        def run() -> None:
            g.compute()
            g.get_output(last)

        run()  # the first compute after allocating: fresh buffers, first touch
        t_first = time.perf_counter() - t_first
        t = max(_timed(run, warm=False) - self.sync_s, 1e-7)
        sizes = g.compute_buffer_sizes()
        work = graph_work(g, ["dev", "cpu"], {"dev": int(sizes[0])})
        g.free_compute()
        self.allocs.append((int(sizes[0]), max(t_first - self.sync_s - t, 0.0)))
        if self.h2d is not None and not self.is_cpu:
            t = max(t - self.h2d.seconds(work.input_bytes, work.inputs), t / 4)
        return t, work.devices.get("dev")

    def mem_s(self, dev: Any, skip: frozenset[str] = frozenset()) -> float:
        """Seconds of a graph's memory-bound ops on this device by the rates measured so far
        (the kernels in ``skip`` left out)."""
        from sdplan.core.planning.device_profile import interpolate

        total = 0.0
        for k, (nbytes, n) in dev.mem_kernels.items():
            if k in skip:
                continue
            pts = tuple(sorted(self.mem_rates[k])) if k in self.mem_rates else ()
            total += nbytes / (interpolate(pts, nbytes / max(n, 1)) if pts else self.mem_bps)
        return total

    def net(self, t: float, dev: Any) -> float:
        """Seconds of a graph's compute ops: ``t`` less the fixed costs and the memory-bound
        nodes (at least a quarter of ``t``)."""
        if dev is None:
            return t
        rest = self.graph_s + dev.nodes * self.node_s + self.mem_s(dev) + dev.mem_ops * self.op_s
        return max(t - rest, t / 4)

    def mem_graph(self, build: Callable[[Any], dict[str, Any]], done: set[str]) -> None:
        """Time a graph of memory-bound ops and give its time, less the fixed costs and the
        kernels in ``done`` (measured at this size already), to its other kernels (one rate
        for their bytes); they join ``done``."""
        t, dev = self.graph(build)
        if dev is None:
            return
        new = frozenset(k for k in dev.mem_kernels if k not in done)
        done.update(new)
        if not new:
            return
        left = max(t - self.graph_s - dev.nodes * self.node_s - self.mem_s(dev, new), t / 4, 1e-7)
        nbytes = sum(dev.mem_kernels[k][0] for k in new)
        ops = sum(dev.mem_kernels[k][1] for k in new)
        for k in new:
            self.mem_rates.setdefault(k, []).append((nbytes / max(ops, 1), nbytes / left))


def _filled(g: Any, shape: tuple[int, ...]) -> Any:
    """An input of ``shape`` made on the device from a small seed input ``x`` (its last axis,
    repeated): what a timing feeds in costs no host-to-device copy of the whole tensor."""
    seed = g.input("x", (1,) * (len(shape) - 1) + (shape[-1],))
    return g.repeat(seed, shape)


def _seed(np: Any, shape: tuple[int, ...]) -> dict[str, Any]:
    """The values of :func:`_filled`'s seed input."""
    return {"x": np.random.default_rng(0).standard_normal((1,) * (len(shape) - 1) + (shape[-1],)).astype(np.float32)}


def _one(g: Any, y: Any) -> Any:
    """A one-value view of ``y``'s first element (what the timing reads back: no copy)."""
    return g.view(y, (1,), None, 0)


def _weights(np: Any, ng: Any, backend: Any, dtype: str, shape: tuple[int, ...], n: int) -> tuple[Any, Any]:
    """A WeightStore with ``n`` weights ``w0``.. of ``dtype`` and ``shape`` on ``backend``,
    small random values; (store, buffer)."""
    names = [f"w{i}" for i in range(n)]
    store = ng.WeightStore([(name, dtype, shape) for name in names] + [("sync", "f32", (1,))])
    buf = store.allocate([*names, "sync"], backend)
    rng = np.random.default_rng(0)
    for name in names:
        vals = rng.standard_normal(math.prod(shape)).astype(np.float32) * 0.05
        if dtype == "f32":
            data = vals
        elif dtype == "f16":
            data = vals.astype(np.float16)
        else:
            data = np.frombuffer(ng.convert_rows(vals.tobytes(), "f32", dtype, shape[-1]), np.uint8)
        store.set_data(name, np.ascontiguousarray(data))
    store.get_bytes("sync")  # waits until a device that takes uploads asynchronously has them all
    return store, buf


#: The parts of a measurement (:func:`calibrate_device`'s ``parts``).
PARTS = ("fixed", "products", "convolutions", "attention", "links")


#: Memory-bound ops timed one kernel at a time, each on a tensor of 128 KiB and of 16 MiB:
#: ``(name, shape-keeping?, build(g, y, x) -> result)`` (adds and products by a tensor alike
#: and by one value per channel, GroupNorm with its SiLU as the models run it: 2 channels per
#: group). The simple ones come first: a
#: composite op's graph (GroupNorm on a device without sdplan's fused op: GROUP_NORM, MUL,
#: ADD) prices the kernels already measured and takes the rest of its time for its own.
MEM_OPS: tuple[tuple[str, bool, Callable[[Any, Any, Any], Any]], ...] = (
    ("add", True, lambda g, y, x: g.add(y, x)),
    ("mul", True, lambda g, y, x: g.mul(y, x)),
    ("add_channels", True, lambda g, y, x: g.add(y, g.cont(g.view(x, (1, 32, 1, 1), None, 0)))),
    ("mul_channels", True, lambda g, y, x: g.mul(y, g.cont(g.view(x, (1, 32, 1, 1), None, 0)))),
    ("scale", True, lambda g, y, x: g.scale(y, 0.5)),
    ("silu", True, lambda g, y, x: g.unary("silu", y)),
    ("gelu", True, lambda g, y, x: g.unary("gelu", y)),
    ("gelu_erf", True, lambda g, y, x: g.unary("gelu_erf", y)),
    ("gelu_quick", True, lambda g, y, x: g.unary("gelu_quick", y)),
    ("transpose", True, lambda g, y, x: g.cont(g.permute(y, (0, 1, 3, 2)))),
    ("cast", False, lambda g, y, x: g.cast(x, "f16")),
    ("soft_max", True, lambda g, y, x: g.soft_max(y)),
    ("layer_norm", True, lambda g, y, x: g.layer_norm(y, 1e-5)),
    ("group_norm_silu", True, lambda g, y, x: g.group_norm(y, 16, 1e-5, silu=True)),
    ("group_norm", True, lambda g, y, x: g.group_norm(y, 16, 1e-5)),
    ("geglu", False, lambda g, y, x: g.geglu(x)),
    ("upscale", False, lambda g, y, x: g.upscale(x, 2)),
    ("concat", False, lambda g, y, x: g.concat(x, x, 1)),
)


def _fixed(b: _Bench, chain: Callable[[int], Callable[[Any], dict[str, Any]]], np: Any, rng: Any,
           say: Callable[[str], None], device: str) -> None:
    """The fixed costs per graph and per node, and the memory-bound ops' rates by kernel
    (:data:`MEM_OPS`; the memory bandwidth is the add's on the large tensor)."""
    say(f"{device}: fixed costs")
    b.graph_s = b.graph(chain(1))[0]
    t64 = b.graph(chain(65))[0]
    b.node_s = max((t64 - b.graph_s) / 64, 0.0)
    say(f"{device}: memory-bound ops")
    for floats, k in ((32 << 10, _mem_chain(b.sync_s)), (MEM_BYTES // 8, 2)):
        shape = (1, 32, floats // 32 // 64, 64)
        done: set[str] = set()

        def fill(g: Any, shape: tuple[int, ...] = shape) -> dict[str, Any]:
            g.output("y", _one(g, _filled(g, shape)))
            return _seed(np, shape)

        b.mem_graph(fill, done)
        for _, keeps, op in MEM_OPS:
            def build(g: Any, op: Any = op, keeps: bool = keeps, k: int = k,
                      shape: tuple[int, ...] = shape) -> dict[str, Any]:
                x = _filled(g, shape)
                y = x
                for i in range(k):
                    y = op(g, y, x) if keeps else g.output(f"y{i}", _one(g, op(g, y, x)))
                if keeps:
                    g.output("y", _one(g, y))
                return _seed(np, shape)

            b.mem_graph(build, done)
    add = b.mem_rates.get("ADD")
    if add:
        b.mem_bps = max(add)[1]
    if not b.is_cpu:
        b.alloc_query_s = _query_cost(b, np)


def _query_cost(b: _Bench, np: Any) -> float:
    """Seconds each attention node adds to allocating a graph's buffers on the device
    (ggml's RPC client asks the server for the size of each, at every allocation): the
    allocation of a graph of 8 small attentions against the same graph with products in
    their place, the fastest of 3 each."""
    def alloc(flash: bool) -> float:
        g = b.gr.new_graph([b.backend, b.cpu], n_threads=b.threads)
        with b.gr.on(g, 0):
            q = g.input("x", (1, 2, 16, 16))
            y = q
            for _ in range(8):
                y = g.flash_attn(y, q, q, None, 0.25) if flash else g.mul_mat(q, y)
                y = g.reshape(y, (1, 2, 16, 16))
            g.output("y", _one(g, y))
        g.build()
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            g.allocate()
            best = min(best, time.perf_counter() - t0)
            g.free_compute()
        return best

    return max(alloc(True) - alloc(False), 0.0) / 8


def _alloc_fit(allocs: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``(fixed seconds, seconds per buffer byte)`` of a graph's first compute after
    allocating its compute buffers, beyond a later compute: the Theil-Sen line through the
    graphs timed (the median of the pairwise slopes, then the median intercept: one stalled
    timing does not tilt it), both at least 0."""
    if not allocs:
        return 0.0, 0.0
    pts = sorted(allocs)
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(pts) for x2, y2 in pts[i + 1:] if x2 > x1]
    slope = max(statistics.median(slopes), 0.0) if slopes else 0.0
    return max(statistics.median(y - slope * x for x, y in pts), 0.0), slope


def calibrate_device(manager: Any, device: str, threads: int = 0,
                     progress: Callable[[str], None] | None = None,
                     parts: Sequence[str] = PARTS) -> DeviceProfile:
    """Measure ``device`` (sdplan name) with backends of ``manager`` (a BackendManager; its
    CPU thread count is set to ``threads`` when > 0). A few seconds (more behind a slow
    link). Returns a measured :class:`DeviceProfile` (with ``parts`` a subset of
    :data:`PARTS`, only those parts are measured: the others keep the stated defaults of a
    device of its type, and such a profile is for tests, not for keeping).

    Each product, convolution and attention is timed as a chain of up to 64 ops with their
    own weights (:func:`_chain`), as a model graph runs them one after another; the rate is
    the chain's FLOP over its time less the fixed per-graph cost.

    Raises:
        InventoryError: unknown device; RuntimeError: ggml fails on the device.
    """
    import numpy as np
    from sdplan.core.runtime.native import native

    ng = native()
    if threads > 0:
        manager.cpu_threads = threads
    backend, cpu = manager.get(device), manager.get("CPU")
    is_cpu = ng.device_type(backend.device_name) == "cpu"
    b = _Bench(backend, cpu, threads if threads > 0 else int(manager.cpu_threads))
    say = progress or (lambda _: None)
    rng = np.random.default_rng(0)

    def chain(n: int) -> Callable[[Any], dict[str, Any]]:
        def build(g: Any) -> dict[str, Any]:
            x = g.input("x", (16,))
            for _ in range(n):
                x = g.scale(x, 1.0001)
            g.output("y", x)
            return {"x": np.ones(16, np.float32)}
        return build

    default = default_profile(str(ng.device_type(backend.device_name)), "RPC" if device.startswith("RPC") else "")
    say(f"{device}: transfers")
    h2d, d2h = _links(np, ng, backend) if "links" in parts else (default.h2d, default.d2h)
    b.sync_s = d2h.latency_s if not is_cpu else 0.0
    b.h2d = h2d

    b.graph_s, b.node_s, b.op_s, b.mem_bps = default.graph_s, default.node_s, default.op_s, default.mem_bps
    rates: dict[str, list[tuple[float, float]]] = {k: list(v) for k, v in default.rates.items()}
    if "fixed" in parts:
        _fixed(b, chain, np, rng, say, device)
    else:
        b.graph_s = b.graph(chain(1))[0]
    if any(p in parts for p in ("products", "convolutions", "attention")):
        rates = {}

    def record(intent: str | None, flops: float, n: int, t: float, dev: Any) -> None:
        """The op class's rate for ``n`` ops of ``flops`` FLOP (``intent``: the device's
        default path, the fixed per-graph cost off) and the rate of each kernel that ran (the
        memory-bound nodes off too)."""
        if intent is not None:
            rates.setdefault(intent, []).append((flops, flops * n / max(t - b.graph_s, t / 4)))
        ops = [o for o in (dev.ops if dev else ()) if o.count]
        total = sum(o.flops * o.count for o in ops)
        if total > 0:
            rate = total / b.net(t, dev)
            for key in {f"{o.cls}/{o.kernel}:{o.dtype}" for o in ops}:
                rates.setdefault(key, []).append((total / sum(o.count for o in ops), rate))

    bf16_cpu = is_cpu and ng.bf16_kernel() != "off"
    for dtype in (DTYPES if "products" in parts else ()):
        if not ng.supports_mul_mat(backend, dtype):
            continue
        say(f"{device}: {dtype} products")
        for as_bf16 in ((False, True) if bf16_cpu and dtype == "f16" else (False,)):
            for m, k, rows in PRODUCTS + (F16_PRODUCTS if dtype == "f16" else ()):
                n = _chain(2.0 * m * k * rows, b.sync_s)
                store, buf = _weights(np, ng, backend, dtype, (m, k), n)

                def mm(g: Any, store: Any = store, m: int = m, k: int = k, rows: int = rows,
                       n: int = n) -> dict[str, Any]:
                    x = _filled(g, (rows, k))
                    y = x
                    for i in range(n):  # a chain where the shape allows it, else each from x
                        y = g.mul_mat(store.tensor(f"w{i}"), y if m == k else x)
                        if m != k:
                            g.output(f"y{i}", _one(g, y))
                    if m == k:
                        g.output("y", _one(g, y))
                    return _seed(np, (rows, k))

                t, dev = b.graph(mm, f16_as_bf16=as_bf16)
                record(None if as_bf16 else f"mm:{dtype}", 2.0 * m * k * rows, n, t, dev)
                buf.free()
    say(f"{device}: convolutions and attention")
    for as_bf16 in ((False, True) if bf16_cpu else (False,)):
        for batch, ch, px in (CONVS if "convolutions" in parts else ()):
            n = _chain(2.0 * batch * ch * px * px * ch * 9, b.sync_s)
            store, buf = _weights(np, ng, backend, "f16", (ch, ch, 3, 3), n)

            def conv(g: Any, store: Any = store, batch: int = batch, ch: int = ch, px: int = px,
                     n: int = n) -> dict[str, Any]:
                y = _filled(g, (batch, ch, px, px))
                for i in range(n):
                    y = b.gr.conv2d(g, y, store.tensor(f"w{i}"), None, 1, 1)  # stride 1, padding 1
                g.output("y", _one(g, y))
                return _seed(np, (batch, ch, px, px))

            t, dev = b.graph(conv, f16_as_bf16=as_bf16)
            record(None if as_bf16 else "conv:f16", 2.0 * batch * ch * px * px * ch * 9, n, t, dev)
            buf.free()
        shapes = [(*a, a[2]) for a in ATTENTIONS] + list(CROSS_ATTENTIONS)
        for bsz, heads, tokens, width, keys in (shapes if "attention" in parts else ()):
            flops = 2.0 * bsz * heads * tokens * keys * 2 * width
            n = _chain(flops, b.sync_s)

            def attn(g: Any, bsz: int = bsz, heads: int = heads, tokens: int = tokens, width: int = width,
                     keys: int = keys, n: int = n) -> dict[str, Any]:
                shape = (bsz, heads, tokens, width)
                q = _filled(g, shape)  # the keys: q's first row repeated (fewer keys: a cross-attention)
                kv = q if keys == tokens else g.repeat(g.view(q, (1, 1, 1, width), None, 0), (bsz, heads, keys, width))
                k, v = g.scale(kv, 0.5), g.scale(kv, -1.0)
                for i in range(n):
                    g.output(f"y{i}", _one(g, b.gr.attention(g, q, k, v, scale=1.0 / (i + 1))))
                return _seed(np, shape)

            t, dev = b.graph(attn, f16_as_bf16=as_bf16, attention_bf16=as_bf16)
            # a cross-attention or a width not a multiple of 8 (far slower on ggml's kernel) gives
            # its kernel's own rate only, not the class's (what a kernel measured nowhere takes)
            record(None if as_bf16 or keys != tokens or width % 8 else "attn:f16", flops, n, t, dev)
    alloc_s, alloc_byte_s = _alloc_fit(b.allocs)
    return DeviceProfile(rates={k: tuple(sorted(v)) for k, v in rates.items()}, mem_bps=b.mem_bps,
                         node_s=b.node_s, graph_s=b.graph_s, h2d=h2d, d2h=d2h,
                         threads=b.threads if is_cpu else 0, source="measured",
                         measured=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), op_s=b.op_s,
                         mem_rates={k: tuple(sorted(v)) for k, v in b.mem_rates.items()},
                         alloc_s=alloc_s, alloc_byte_s=alloc_byte_s, alloc_query_s=b.alloc_query_s)


def _links(np: Any, ng: Any, backend: Any) -> tuple[Link, Link]:
    """Host-to-device and device-to-host links of ``backend``: a 4 KiB copy's time is the
    latency; a copy sized to take about 0.1 s (1 to 32 MiB) gives the bandwidth."""
    small = 1024

    def times(n: int) -> tuple[float, float]:
        store = ng.WeightStore([("t", "f32", (n,))])
        buf = store.allocate(["t"], backend)
        arr = np.ones(n, np.float32)
        try:
            return _timed(lambda: store.set_data("t", arr)), _timed(lambda: store.get_bytes("t"))
        finally:
            buf.free()

    up0, down0 = times(small)
    probe = (1 << 20) // 4
    up1, down1 = times(probe)
    est = probe * 4 / max(min(up1 - up0, down1 - down0), 1e-6)
    big = int(min(max(est * 0.1, 1 << 20), 32 << 20)) // 4
    up, down = times(big) if big > probe else (up1, down1)
    n = max(big, probe) * 4 - small * 4
    return (Link(n / max(up - up0, 1e-9), up0), Link(n / max(down - down0, 1e-9), down0))


def calibrate_drive(folder: str | Path, size: int = 64 << 20) -> DriveProfile:
    """Read speeds of the drive holding ``folder``: a ``size``-byte file written there is
    read cold (its pages dropped after ``fsync``; where the system cannot drop them the
    figure is a cached read), cached, and mapped with every page touched. The file is
    removed afterwards.

    Raises:
        OSError: the folder cannot take the file.
    """
    import mmap

    folder = Path(folder).resolve()
    block = os.urandom(1 << 20)
    fd, name = tempfile.mkstemp(prefix=".sdplan-drive-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            for _ in range(size >> 20):
                fh.write(block)
            fh.flush()
            os.fsync(fh.fileno())

        def read() -> float:
            t0 = time.perf_counter()
            with open(name, "rb", buffering=0) as fh:
                buf = bytearray(8 << 20)
                while fh.readinto(buf):
                    pass
            return time.perf_counter() - t0

        def drop() -> None:
            with open(name, "rb") as fh:
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)

        drop()
        cold = read()
        cached = min(read() for _ in range(3))

        def touch() -> float:
            with open(name, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                t0 = time.perf_counter()
                page = mmap.PAGESIZE
                sum(mm[i] for i in range(0, len(mm), page))
                return time.perf_counter() - t0

        mapped = min(touch() for _ in range(3))
    finally:
        os.unlink(name)
    return DriveProfile(str(folder), size / cold, size / cached, size / mapped)


def calibrate_inventory(manager: Any, inventory: Inventory, threads: int = 0,
                        drives: Sequence[str | Path] = (),
                        progress: Callable[[str], None] | None = None) -> Inventory:
    """Measure every device of ``inventory`` and each drive holding a folder of ``drives``,
    keep the profiles (:func:`store`) and return the inventory with them."""
    devices = []
    for d in inventory:
        prof = calibrate_device(manager, d.name, threads, progress)
        store(d, prof)
        devices.append(replace(d, profile=prof))
    measured = []
    for folder in drives:
        if progress:
            progress(f"drive of {folder}")
        dp = calibrate_drive(folder)
        store(None, dp)
        measured.append(dp)
    kept = [d for d in cached_drives() if d.path not in {m.path for m in measured}]
    return Inventory(tuple(devices), tuple(measured) + tuple(kept))
