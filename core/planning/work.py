"""The work of a module's graphs: operations and bytes per device, as plain data.

The engine counts it from the graphs it builds, without weights and without computing
(:mod:`sdplan.core.runtime.work_count`, the ``work`` engine job of
:mod:`sdplan.core.pipelines.work`); :mod:`sdplan.core.planning.timing` turns it into
seconds with each device's profile. JSON form of a :class:`GraphWork`::

    {"main": "RPC0",
     "devices": {"RPC0": {"ops": [["mm", "MUL_MAT", "f16", 1.3e8, 12], ...],
                          "mem_bytes": 4.1e7, "mem_ops": 240,
                          "mem_kernels": {"ADD": [1.2e7, 40], "SILU": [8e6, 22], ...}, "nodes": 812,
                          "weights": 196, "weight_bytes": 1.7e9}},
     "input_bytes": 49152, "inputs": 3, "output_bytes": 32768, "outputs": 1,
     "copies": {"RPC0>RPC1": 655360}}

An op group ``[class, kernel, dtype, work of one op, count]``: the class (``mm``,
``conv``, ``attn``; :data:`~sdplan.core.planning.device_profile.OP_CLASSES`), the kernel
that runs it on that device (ggml's op name or sdplan's CPU kernel; attention with its head
width, ``bf16_attention@d40``), the weight dtype and
the FLOP of one op (a multiply-add is 2 FLOP; convolutions as direct products, whatever
method runs them; attention as its two products).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sdplan.core.errors import SdplanError


@dataclass(frozen=True)
class OpGroup:
    """``count`` ops of class ``cls`` run by ``kernel`` with ``dtype`` weights, each of
    ``flops`` FLOP."""

    cls: str
    kernel: str
    dtype: str
    flops: float
    count: int

    def to_json(self) -> list[object]:
        return [self.cls, self.kernel, self.dtype, self.flops, self.count]


@dataclass(frozen=True)
class DeviceWork:
    """One device's share of a graph: its compute ops, the bytes its memory-bound ops read
    and write and how many they are, its node count (views included: each passes the
    device's per-node cost), and the weights its ops use (tensor count and bytes)."""

    ops: tuple[OpGroup, ...] = ()
    mem_bytes: float = 0.0
    nodes: int = 0
    weights: int = 0
    weight_bytes: int = 0
    mem_ops: int = 0
    #: the memory-bound ops by kernel (ggml's op, ``SILU``, ``GROUP_NORM``..., or sdplan's CPU
    #: kernel): ``(bytes, ops)``, the bytes summing to ``mem_bytes``; empty: not broken down.
    mem_kernels: Mapping[str, tuple[float, int]] = field(default_factory=dict)
    #: bytes of the device's compute buffer for this graph (0: not measured)
    buffer_bytes: int = 0
    #: nodes whose buffer size the device's backend is asked for when the graph's buffers are
    #: allocated (ggml's RPC client asks the server for each attention node)
    alloc_queries: int = 0

    @property
    def flops(self) -> float:
        """All FLOP of the device's ops."""
        return sum(o.flops * o.count for o in self.ops)

    def to_json(self) -> dict[str, object]:
        return {"ops": [o.to_json() for o in self.ops], "mem_bytes": self.mem_bytes,
                "mem_ops": self.mem_ops, "mem_kernels": {k: list(v) for k, v in self.mem_kernels.items()},
                "nodes": self.nodes, "buffer_bytes": self.buffer_bytes, "alloc_queries": self.alloc_queries,
                "weights": self.weights, "weight_bytes": self.weight_bytes}


@dataclass(frozen=True)
class GraphWork:
    """One graph's work per device (see the module docstring): ``main`` holds its inputs
    and outputs; ``copies`` are activation bytes the scheduler copies between devices per
    compute (``"A>B"``: from A to B)."""

    main: str
    devices: Mapping[str, DeviceWork]
    input_bytes: int = 0
    inputs: int = 0
    output_bytes: int = 0
    outputs: int = 0
    copies: Mapping[str, int] = field(default_factory=dict)
    #: device -> checkpoints among its nodes: each ends a chunk of the compute, one more
    #: graph-compute round trip on an RPC device (``sdplan.core.runtime.graph.checkpoint_blocks``)
    checkpoints: Mapping[str, int] = field(default_factory=dict)

    @property
    def flops(self) -> float:
        return sum(d.flops for d in self.devices.values())

    def to_json(self) -> dict[str, object]:
        return {"main": self.main, "devices": {k: v.to_json() for k, v in self.devices.items()},
                "input_bytes": self.input_bytes, "inputs": self.inputs,
                "output_bytes": self.output_bytes, "outputs": self.outputs,
                "copies": dict(self.copies), "checkpoints": dict(self.checkpoints)}

    @classmethod
    def from_json(cls, data: object, *, source: str = "work") -> GraphWork:
        """Parse the JSON form; raises :class:`SdplanError` naming ``source``."""
        try:
            assert isinstance(data, dict)
            devs = {}
            for name, d in data["devices"].items():
                ops = tuple(OpGroup(str(c), str(k), str(t), float(f), int(n)) for c, k, t, f, n in d["ops"])
                devs[str(name)] = DeviceWork(ops, float(d["mem_bytes"]), int(d["nodes"]),
                                             int(d.get("weights", 0)), int(d.get("weight_bytes", 0)),
                                             int(d.get("mem_ops", 0)),
                                             {str(k): (float(b), int(n))
                                              for k, (b, n) in (d.get("mem_kernels") or {}).items()},
                                             int(d.get("buffer_bytes", 0)), int(d.get("alloc_queries", 0)))
            return cls(str(data["main"]), devs, int(data.get("input_bytes", 0)), int(data.get("inputs", 0)),
                       int(data.get("output_bytes", 0)), int(data.get("outputs", 0)),
                       {str(k): int(v) for k, v in (data.get("copies") or {}).items()},
                       {str(k): int(v) for k, v in (data.get("checkpoints") or {}).items()})
        except (AssertionError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SdplanError(f"{source}: not a graph work record ({exc})") from None


#: When a module's graph runs in a picture: per prompt encoded, per sampling step, per
#: picture (decode).
PHASES = ("text", "step", "decode")


@dataclass(frozen=True)
class ModuleWork:
    """A module's graph and how often it runs: ``calls`` times per ``phase`` use (the text
    encoder: once per prompt, twice with CFG's negative prompt; the diffusion model: per
    step, twice where CFG runs as two passes; the VAE: once per picture batch). ``source``:
    ``counted`` (from the engine's graph) or ``formula``. ``group``: graphs of one group run
    at the same time on their own devices (parallel CFG's conditional and unconditional
    passes: ``cfg``); "" for one after another."""

    module: str
    phase: str
    graph: GraphWork
    calls: int = 1
    source: str = "counted"
    group: str = ""

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"module": self.module, "phase": self.phase, "calls": self.calls,
                                  "source": self.source, "graph": self.graph.to_json()}
        if self.group:
            out["group"] = self.group
        return out

    @classmethod
    def from_json(cls, data: object, *, source: str = "work") -> ModuleWork:
        """Parse the JSON form; raises :class:`SdplanError` naming ``source``."""
        if not isinstance(data, dict) or data.get("phase") not in PHASES:
            raise SdplanError(f"{source}: not a module work record")
        return cls(str(data["module"]), str(data["phase"]), GraphWork.from_json(data["graph"], source=source),
                   int(data.get("calls", 1)), str(data.get("source", "counted")), str(data.get("group") or ""))


def works_from_json(data: Mapping[str, object], *, source: str = "work") -> dict[str, list[ModuleWork]]:
    """``{module: [ModuleWork, ...]}`` from the engine job's JSON answer (module -> list of
    records: a module of several graphs, SD3's three text encoders, has one each).

    Raises:
        SdplanError: a record that does not parse, naming ``source`` and the module.
    """
    out: dict[str, list[ModuleWork]] = {}
    for m, v in data.items():
        if not isinstance(v, list):
            raise SdplanError(f"{source}: {m}: expected a list of module work records")
        out[str(m)] = [ModuleWork.from_json(x, source=f"{source}: {m}") for x in v]
    return out
