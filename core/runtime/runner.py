"""The engine's Python side: run a module's graph where its placement says.

A :class:`ModuleRunner` takes one module (a :class:`~sdplan.core.models.ModuleGraph`, its
weight file and a :class:`ModulePlacement`) and

* loads its weights per residency (spec section 5): ``runtime`` (weights on the runtime
  device; for a split, each block range on its own device), ``device`` (weights live on
  ``params_device`` and are staged into runtime-device buffers for a run, staging freed
  after) or ``disk`` (read from the file into the runtime devices for a run, freed after);
* builds the graph once per input shape and runs it whole, split over the placement's
  devices (block nodes pinned to their range's device, everything else on the main
  device; spec section 8), or cut into segments of blocks that fit ``budget`` bytes
  (``--max-vram``, spec section 7; ``--stream-layers`` keeps leading segments resident,
  section 9);
* reports memory truth: per device, bytes of weights, staging and compute buffers actually
  allocated (:meth:`ModuleRunner.memory` now, :attr:`ModuleRunner.last_peak` for the last run).

The GUI and CLI drive runners through :class:`sdplan.core.runtime.process.Engine`, which hosts them
in a child process.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sdplan.core.errors import EngineError
from sdplan.core.runtime import graph as gr
from sdplan.core.runtime.bf16_rule import avx512_bf16_speedup
from sdplan.core.runtime.devices import BackendManager
from sdplan.core.runtime.native import cpu_kernels, native
from sdplan.core.runtime.placement import BlockRange as BlockRange
from sdplan.core.runtime.placement import ModulePlacement, block_weights
from sdplan.core.runtime.weights import WeightFile, bf16_at_load, cpu_bf16

log = logging.getLogger(__name__)

@dataclass
class DeviceMemory:
    """Bytes allocated on one device: resident or transient ``weights``, ``staging`` copies
    of weights from a params device, ``compute`` buffers of graphs, ``lora`` tensors added
    at runtime (:mod:`sdplan.core.runtime.lora`)."""

    weights: int = 0
    staging: int = 0
    compute: int = 0
    lora: int = 0

    def peak(self, other: DeviceMemory) -> None:
        self.weights = max(self.weights, other.weights)
        self.staging = max(self.staging, other.staging)
        self.compute = max(self.compute, other.compute)
        self.lora = max(self.lora, other.lora)


class Cancelled(EngineError):
    """A run was cancelled; the runner stays usable."""

    code = "cancelled"


class CancelToken:
    """Cancels the graph running now (from any thread) and every later step of the run."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._graph: Any = None

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            if self._graph is not None:
                self._graph.cancel()

    def reset(self) -> None:
        self._event.clear()

    def check(self) -> None:
        """Raise :class:`Cancelled` when cancelled."""
        if self._event.is_set():
            raise Cancelled("cancelled")

    def compute(self, g: Any) -> None:
        """``g.compute()`` with cancel wired in; raises :class:`Cancelled`."""
        self.check()
        with self._lock:
            self._graph = g
        try:
            g.compute()
        except native().ComputeCancelled:
            raise Cancelled("cancelled") from None
        finally:
            with self._lock:
                self._graph = None
        self.check()


class BackendPool:
    """Backends by device name: ``extra`` names first (tests: a second CPU instance), then a
    ``core.devices.BackendManager`` (created when not given)."""

    def __init__(self, manager: Any = None, extra: Mapping[str, Any] | None = None) -> None:
        if manager is None:
            manager = BackendManager()
        self.manager = manager
        self.extra = dict(extra or {})

    def get(self, device: str) -> Any:
        return self.extra[device] if device in self.extra else self.manager.get(device)


@dataclass
class _Buf:
    device: str
    kind: str  # weights | staging | lora
    wb: Any
    keep: bool = False  # survives the end of a run


@dataclass
class _Seg:
    blocks: list[int]
    graph: Any = None
    devices: list[str] = field(default_factory=list)
    resident: bool = False
    inputs: dict[str, Any] = field(default_factory=dict)  # input name -> graph tensor
    carry: dict[str, str] = field(default_factory=dict)  # state key -> input it passes on unchanged


def holds_bf16(model: Any, placement: ModulePlacement, pool: BackendPool) -> bool:
    """Whether a module's matrix products and convolutions with 16-bit float weights run in bf16:
    the model measured faster with this CPU's bf16 kernel (it lists it in ``cpu_bf16_kernels``,
    or ``avx512_fast`` where AVX512_BF16 measured fast here:
    :meth:`~sdplan.core.runtime.kernels.CpuKernels.holds_bf16`) and every device of the placement, params device included, runs it
    (:func:`~sdplan.core.runtime.weights.cpu_bf16`): one policy for all of them, so a split
    across CPUs computes what one CPU does. f16 weights become bf16 as they load, or stay f16
    (mapped from the file) and the kernel rounds them as it uses them (``Graph.f16_as_bf16``),
    per :func:`~sdplan.core.runtime.weights.bf16_at_load`."""
    held_on = list(placement.devices) + ([placement.params_device] if placement.params_device else [])
    # the devices first: the kernel choice may time a product on the CPU (once per process)
    return all(cpu_bf16(pool.get(d)) for d in held_on) and \
        cpu_kernels().holds_bf16(getattr(model, "cpu_bf16_kernels", ()), avx512_bf16_speedup)


class ModuleRunner:
    """Runs one module per its placement (see the module docstring).

    ``model``: a ModuleGraph; ``weights``: its :class:`WeightFile`; ``pool``: backends.
    Raises EngineError (naming the module and device) when memory cannot be allocated or a
    compute fails, :class:`Cancelled` when ``cancel`` fires.
    """

    def __init__(self, model: Any, weights: WeightFile, placement: ModulePlacement, pool: BackendPool,
                 cancel: CancelToken | None = None, name: str = "module", n_threads: int = 0) -> None:
        self.model, self.wf, self.pl, self.pool, self.name = model, weights, placement, pool, name
        self.cancel, self.n_threads = cancel or CancelToken(), n_threads
        self.main = placement.devices[0]
        self.block_device = [self.main] * model.n_blocks
        for r in placement.ranges:
            if not 0 <= r.first_block <= r.last_block < model.n_blocks:
                raise EngineError(f"range {r} outside blocks 0..{model.n_blocks - 1}", module=name)
            for i in range(r.first_block, r.last_block + 1):
                self.block_device[i] = r.device
        self.mode = placement.params_mode
        if self.mode == "device" and placement.params_device == self.main and len(placement.devices) == 1:
            self.mode = "runtime"  # params on the only runtime device: follows runtime
        self.segmented = len(placement.devices) == 1 and placement.budget > 0 and model.n_blocks > 0
        #: f16 weights of this module's products run the CPU bf16 kernel (:func:`holds_bf16`).
        self.bf16 = holds_bf16(model, placement, pool)
        if self.bf16:
            weights.hold_for(pool.get(self.main), bf16=True)
        self.rt = weights.new_store()
        self.params: Any = None
        self._bufs: list[_Buf] = []
        self._graphs: dict[tuple, tuple[Any, list[str]]] = {}
        self._segs: dict[tuple, list[_Seg]] = {}
        self._in_session = False
        self.last_peak: dict[str, DeviceMemory] = {}
        #: segments the last run was cut into (0: not segmented).
        self.last_segments = 0
        self._peak: dict[str, DeviceMemory] = {}
        #: LoRA patches of this module (:class:`sdplan.core.runtime.lora.ModuleLora`), see :meth:`set_lora`.
        self.lora: Any = None
        self._lora_store: Any = None
        for dev, names in self._groups().items():
            self.rt.plan(names, self.pool.get(dev))

    def set_lora(self, lora: Any) -> None:
        """Apply ``lora`` (a :class:`~sdplan.core.runtime.lora.ModuleLora`, None: none) from the
        next run on: every buffer is freed (merged weights are read again), graphs are
        rebuilt; at-runtime LoRA tensors go beside their weights, on each block's device."""
        self.release()
        self._graphs.clear()
        self._segs.clear()
        self.lora, self._lora_store = lora, None
        if lora is not None and lora.runtime:
            arrays = lora.arrays()
            wf = WeightFile.from_arrays(arrays, f"LoRA of {self.name}", dtypes=lora.dtypes())
            self._lora_store = (wf, wf.new_store())
            for dev, names in self._lora_groups().items():
                self._lora_store[1].plan(names, self.pool.get(dev))

    def _lora_groups(self) -> dict[str, list[str]]:
        """Runtime device -> at-runtime LoRA tensor names (resident where their weights run)."""
        if self._lora_store is None:
            return {}
        groups = ({self.main: [n for ns in self._groups().values() for n in ns]} if self.segmented
                  else self._groups())
        out = {dev: self.lora.tensor_names(names) for dev, names in groups.items()}
        return {d: n for d, n in out.items() if n}

    def _weight(self, name: str) -> Any:
        """The tensor graphs use for weight ``name`` (with its at-runtime LoRA beside it)."""
        t = self.rt.tensor(name)
        if self._lora_store is None:
            return t
        return self.lora.wrap(name, t, self._lora_store[1].tensor)

    # ------------------------------------------------------------------ weights

    def _groups(self) -> dict[str, list[str]]:
        """Runtime device -> weight names for the whole graph."""
        groups: dict[str, list[str]] = {self.main: list(self.model.other_tensors())}
        for i, dev in enumerate(self.block_device):
            groups.setdefault(dev, []).extend(block_weights(self.model, i))
        return groups

    def _alloc(self, store: Any, names: Sequence[str], device: str, kind: str, keep: bool) -> _Buf:
        try:
            wb = store.allocate(list(names), self.pool.get(device))
        except RuntimeError as exc:
            raise EngineError(f"{self.name}: {exc}", device=device, module=self.name) from None
        buf = _Buf(device, kind, wb, keep)
        self._bufs.append(buf)
        return buf

    def _load(self, store: Any, names: Sequence[str], device: str, keep: bool) -> list[_Buf]:
        """Place ``names`` of ``store`` on ``device`` filled from the file: those
        :meth:`WeightFile.map` can map (a CPU, the file's dtype) mapped, the rest allocated
        and read. Returns the buffers (one or two)."""
        try:
            wb, rest = self.wf.map(store, list(names), self.pool.get(device))
        except RuntimeError as exc:
            raise EngineError(f"{self.name}: {exc}", device=device, module=self.name) from None
        bufs = []
        if wb is not None:
            bufs.append(_Buf(device, "weights", wb, keep))
            self._bufs.append(bufs[-1])
        if rest:
            bufs.append(self._alloc(store, rest, device, "weights", keep))
            try:
                self.wf.read(store, rest, n_threads=self.n_threads)
            except RuntimeError as exc:  # the file changed since its header was read
                raise EngineError(f"{self.name}: {exc}", device=device, module=self.name) from None
            if self.mode == "disk" and not self.segmented:
                # read once per session into their own buffers: the page cache's copy is spare
                self.wf.drop_cache(rest)
        return bufs

    def _fill(self, names: Sequence[str], device: str, keep: bool) -> list[_Buf]:
        """Allocate ``names`` on ``device`` in the runtime store and fill them: staged from
        the params store (mode device) or from the file (:meth:`_load`). Returns the buffers."""
        if self.mode == "device":
            bufs = [self._alloc(self.rt, names, device, "staging", keep)]
            self.rt.copy_from(self.params, list(names))
        else:
            bufs = self._load(self.rt, names, device, keep)
            if self.lora is not None and not self.lora.runtime:
                self.lora.merge(self.rt, names)  # disk residency: merged on every load
        self._snapshot()
        return bufs

    def _free(self, buf: _Buf) -> None:
        buf.wb.free()
        self._bufs.remove(buf)

    def prepare(self) -> None:
        """Load what stays resident between runs: the params store (mode device), or every
        weight (mode runtime; only non-block weights when segmented). Idempotent."""
        if self.mode == "device" and self.params is None:
            self.params = self.wf.new_store()
            names = list(self.wf.infos)
            self._load(self.params, names, self.pl.params_device or self.main, True)
            if self.lora is not None and not self.lora.runtime:
                self.lora.merge(self.params, names)
        if self._lora_store is not None and not any(b.kind == "lora" for b in self._bufs):
            wf, store = self._lora_store
            for dev, names in self._lora_groups().items():
                self._alloc(store, names, dev, "lora", True)
                wf.read(store, names)
        if self.mode == "runtime":
            groups = ({self.main: self.model.other_tensors()} if self.segmented else self._groups())
            for dev, names in groups.items():
                todo = [n for n in names if not self.rt.resident(n)]
                if todo:
                    self._fill(todo, dev, keep=True)

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Keep the run-scoped weights (mode device/disk) loaded across several runs, e.g.
        the steps of one sampling loop; they are released when the block exits."""
        if self._in_session:
            yield
            return
        self.prepare()
        self._in_session = True
        try:
            if self.mode != "runtime":
                groups = ({self.main: self.model.other_tensors()} if self.segmented else self._groups())
                for dev, names in groups.items():
                    self._fill(names, dev, keep=False)
            yield
        finally:
            self._in_session = False
            for buf in [b for b in self._bufs if not b.keep]:
                self._free(buf)
            for g, _ in self._graphs.values():
                g.free_compute()
            if self.mode == "disk":  # nothing of the module stays in RAM, page cache included
                self.wf.drop_cache([n for ns in self._groups().values() for n in ns])

    def release(self) -> None:
        """Free every buffer of this runner (weights, staging, params, compute)."""
        for buf in list(self._bufs):
            self._free(buf)
        for g, _ in self._graphs.values():
            g.free_compute()
        for segs in self._segs.values():
            for s in segs:
                s.resident = False
                if s.graph is not None:
                    s.graph.free_compute()
        self.params = None

    # ------------------------------------------------------------------ memory

    def free_compute(self) -> None:
        """Free the compute buffers of this runner's graphs; the weights stay (a model that
        will not run for a while, as a two-stage model's first expert after its phase)."""
        for g, _ in self._graphs.values():
            g.free_compute()
        for segs in self._segs.values():
            for s in segs:
                if s.graph is not None:
                    s.graph.free_compute()

    def memory(self) -> dict[str, DeviceMemory]:
        """Bytes allocated now per device (from the buffers' sizes)."""
        mem: dict[str, DeviceMemory] = {}
        for b in self._bufs:
            if not b.wb.freed:
                m = mem.setdefault(b.device, DeviceMemory())
                setattr(m, b.kind, getattr(m, b.kind) + b.wb.size)
        graphs = list(self._graphs.values()) + [(s.graph, s.devices) for segs in self._segs.values()
                                                 for s in segs if s.graph is not None]
        for g, devs in graphs:
            if g.allocated:
                for d, n in zip(devs, g.compute_buffer_sizes(), strict=True):
                    if n:
                        mem.setdefault(d, DeviceMemory()).compute += n
        return mem

    def placed_bytes(self) -> dict[str, int]:
        """Bytes of the tensors (in their runtime dtypes) placed on each runtime device by
        the placement, loaded or not: the non-block tensors on the main device, each block
        on its range's device (a plan's ranges), less the blocks it does not read (block_weights)."""
        return {dev: sum(int(self.rt.nbytes(n)) for n in names) for dev, names in self._groups().items()}

    def _snapshot(self) -> None:
        for d, m in self.memory().items():
            self._peak.setdefault(d, DeviceMemory()).peak(m)

    # ------------------------------------------------------------------ graphs

    def _new_graph(self, devices: Sequence[str]) -> tuple[Any, list[str]]:
        names: list[str] = []
        backends: list[Any] = []
        for d in [*devices, "CPU"]:
            b = self.pool.get(d)
            if all(b is not o for o in backends):
                backends.append(b)
                names.append(d)
        g = gr.new_graph(backends, n_threads=self.n_threads)
        # f16 weights through the bf16 kernel where they stay f16 (AVX512_BF16); with AMX they were
        # converted as they loaded, and other f16 operands (LoRA factors) keep their f16 products
        g.f16_as_bf16 = self.bf16 and not bf16_at_load()
        # Q8_0/Q4_K/Q5_K weights dequantised block by block into the same kernel (never at load)
        g.quant_as_bf16 = self.bf16
        return g, names

    @contextlib.contextmanager
    def variant(self, model: Any) -> Iterator[None]:
        """Run ``model`` instead of the runner's graph inside the block, on the same loaded
        weights (no second copy): a graph over the same tensors built differently (SD3's
        skip-layer pass). Its graphs are cached apart from the runner's own.

        Raises:
            EngineError: ``model`` does not own the same tensors in the same blocks.
        """
        same = model.n_blocks == self.model.n_blocks and list(model.other_tensors()) == list(
            self.model.other_tensors()) and all(model.block_tensors(i) == self.model.block_tensors(i)
                                                for i in range(model.n_blocks))
        if not same:
            raise EngineError(f"{self.name}: a variant graph must own the runner's tensors", module=self.name)
        own = self.model
        self.model = model
        try:
            yield
        finally:
            self.model = own

    def _whole_graph(self, shapes: dict[str, tuple[int, ...]]) -> tuple[Any, list[str]]:
        key = (self.model, *sorted(shapes.items()))
        if key in self._graphs:
            return self._graphs[key]
        devs = list(dict.fromkeys([self.main, *self.block_device]))
        g, names = self._new_graph(devs)
        idx = {d: names.index(d) for d in devs}
        w = self._weight
        with gr.on(g, 0):
            ins = {k: g.input(k, s, dt) for k, (s, dt) in self.model.input_specs(shapes).items()}
            state = self.model.build_pre(g, w, ins)
        cps = gr.checkpoint_blocks(self.model.n_blocks)
        for i in range(self.model.n_blocks):
            with gr.on(g, idx[self.block_device[i]]):
                state = self.model.build_block(g, w, i, state)
            for t in state.values() if i in cps else ():
                g.checkpoint(t)
        with gr.on(g, 0):
            outs = self.model.build_post(g, w, state)
            for k, t in outs.items():
                g.output(k, t)
        g.build()
        self._graphs[key] = (g, names)
        return g, names

    def measure(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, int]:
        """Compute-buffer bytes per device of the whole graph for inputs of these shapes,
        measured by the scheduler without computing and without loading weights."""
        g, names = self._whole_graph(shapes)
        sizes = g.reserve()
        g.free_compute()
        out: dict[str, int] = {}
        for d, n in zip(names, sizes, strict=True):
            out[d] = out.get(d, 0) + int(n)
        return out

    def work(self, shapes: dict[str, tuple[int, ...]]) -> Any:
        """The work of the whole graph for inputs of these shapes, per device (a
        :class:`~sdplan.core.planning.work.GraphWork`, counted by
        :func:`~sdplan.core.runtime.work_count.graph_work`, with each device's compute buffer
        from :meth:`measure`), without loading weights or computing."""
        from sdplan.core.runtime.work_count import graph_work

        buffers = self.measure(shapes)
        g, names = self._whole_graph(shapes)
        cps = [self.block_device[i] for i in gr.checkpoint_blocks(self.model.n_blocks)]
        return graph_work(g, names, buffers, {d: cps.count(d) for d in set(cps)})

    # ------------------------------------------------------------------ running

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the module on numpy inputs; returns its outputs as numpy arrays."""
        self.cancel.check()
        shapes = {k: tuple(v.shape) for k, v in inputs.items()}
        self._peak = {}
        try:
            with self.session():
                if self.segmented:
                    out = self._run_segments(inputs, shapes)
                else:
                    g, _ = self._whole_graph(shapes)
                    out = self._compute(g, inputs)
        except RuntimeError as exc:
            raise EngineError(f"{self.name}: {exc}", device=self.main, module=self.name) from None
        finally:
            self._snapshot()
            self.last_peak = self._peak
        return out

    def _compute(self, g: Any, inputs: Mapping[str, np.ndarray],
                 tensors: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Allocate, set ``inputs`` and compute; with ``tensors`` (input name -> graph tensor)
        inputs the graph does not use are skipped."""
        g.allocate()
        for k, v in inputs.items():
            if tensors is not None and not tensors[k].resident:
                continue  # a state entry this segment neither reads nor changes
            g.set_input(k, np.ascontiguousarray(v))
        self._snapshot()
        self.cancel.compute(g)
        return {k: g.get_output(k) for k in g.output_names}

    def _plan_segments(self, shapes: dict[str, tuple[int, ...]]) -> list[_Seg]:
        backend = self.pool.get(self.main)
        compute = self.measure(shapes).get(self.main, 0)
        other = self.rt.alloc_size(self.model.other_tensors(), backend)
        if self._lora_store is not None:  # resident beside the non-block weights
            other += sum(self._lora_store[1].alloc_size(n, backend) for n in self._lora_groups().values())
        sizes = [self.rt.alloc_size(block_weights(self.model, i), backend) for i in range(self.model.n_blocks)]
        avail = self.pl.budget - other - compute
        first = 0
        segs: list[_Seg] = []
        if self.pl.stream_layers and self.mode == "device":
            # the leading blocks stay resident while one streamed block still fits beside them
            while first < len(sizes) and sum(sizes[:first + 1]) + max(sizes[first + 1:], default=0) <= avail:
                first += 1
            if first:
                segs.append(_Seg(list(range(first)), resident=True))
                avail -= sum(sizes[:first])
        cur: list[int] = []
        used = 0
        for i in range(first, len(sizes)):
            if cur and used + sizes[i] > avail:
                segs.append(_Seg(cur))
                cur, used = [], 0
            cur.append(i)
            used += sizes[i]
        if cur:
            segs.append(_Seg(cur))
        if len(segs) == 1 and self.mode == "runtime":
            segs[0].resident = True  # everything fits the budget: load once, as without one
        log.info("%s: %d segments for budget %d bytes (compute %d, non-block %d)",
                 self.name, len(segs), self.pl.budget, compute, other)
        return segs

    def segments(self, shapes: dict[str, tuple[int, ...]]) -> list[list[int]]:
        """The block indices of each segment for inputs of these shapes."""
        return [s.blocks for s in self._segments(shapes)]

    def _segments(self, shapes: dict[str, tuple[int, ...]]) -> list[_Seg]:
        key = (self.model, *sorted(shapes.items()))
        if key not in self._segs:
            self._segs[key] = self._plan_segments(shapes)
        return self._segs[key]

    def _segment_graph(self, seg: _Seg, first: bool, last: bool, feed: dict[str, tuple[tuple[int, ...], str]],
                       shapes: dict[str, tuple[int, ...]]) -> Any:
        if seg.graph is not None:
            return seg.graph
        g, seg.devices = self._new_graph([self.main])
        w = self._weight
        if first:
            ins = {k: g.input(k, s, dt) for k, (s, dt) in self.model.input_specs(shapes).items()}
            state = self.model.build_pre(g, w, ins)
        else:
            ins = {"state." + k: g.input("state." + k, s, dt) for k, (s, dt) in feed.items()}
            state = {k: ins["state." + k] for k in feed}
        cps = gr.checkpoint_blocks(len(seg.blocks))
        for j, i in enumerate(seg.blocks):
            state = self.model.build_block(g, w, i, state)
            for t in state.values() if j in cps else ():
                g.checkpoint(t)
        seg.inputs = ins
        by_id = {id(t): n for n, t in ins.items()}
        # state entries that are this segment's inputs unchanged stay on the host
        seg.carry = {} if last else {k: by_id[id(t)] for k, t in state.items() if id(t) in by_id}
        outs = self.model.build_post(g, w, state) if last else {
            "state." + k: t for k, t in state.items() if k not in seg.carry}
        for k, t in outs.items():
            g.output(k, t)
        g.build()
        seg.graph = g
        return g

    def _run_segments(self, inputs: Mapping[str, np.ndarray], shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
        segs = self._segments(shapes)
        self.last_segments = len(segs)
        feed: dict[str, np.ndarray] = dict(inputs)
        specs: dict[str, tuple[tuple[int, ...], str]] = {}
        for k, seg in enumerate(segs):
            self.cancel.check()
            names = [n for i in seg.blocks for n in block_weights(self.model, i)]
            bufs = []
            if not all(self.rt.resident(n) for n in names):
                bufs = self._fill(names, self.main, keep=seg.resident)
            g = self._segment_graph(seg, k == 0, k == len(segs) - 1, specs, shapes)
            try:
                out = self._compute(g, feed, seg.inputs)
            finally:
                g.free_compute()
                if not seg.resident:
                    for buf in bufs:
                        self._free(buf)
            if k < len(segs) - 1:
                feed = {**out, **{"state." + key: feed[src] for key, src in seg.carry.items()}}
                specs = {n[len("state."):]: (tuple(v.shape), {"float32": "f32", "float16": "f16", "int32": "i32"}[
                    str(v.dtype)]) for n, v in feed.items()}
        return out

