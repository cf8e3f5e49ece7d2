"""Device profiles: how fast a device computes and moves data, for predicting a plan's time.

A :class:`DeviceProfile` is measured on the device itself (``sdplan devices --calibrate``,
:mod:`sdplan.core.runtime.calibrate`) and travels in the inventory JSON as the device's
optional ``"profile"`` object, so an inventory written on one machine plans that machine's
time anywhere. A :class:`DriveProfile` is the same for the drive a model file is on (the
inventory's optional ``"drives"`` list). Both are plain data (pure Python).

JSON form of a device profile (seconds, bytes, FLOP)::

    {"source": "measured", "measured": "2026-01-02T03:04:05Z", "threads": 2,
     "graph_s": 4e-05, "node_s": 3e-06, "op_s": 5e-06, "mem_bps": 9.1e9,
     "alloc_s": 2e-4, "alloc_byte_s": 2.5e-10,
     "mem_rates": {"ADD": [[3e5, 2e10], [5e7, 1.1e10]], "SILU": [...], ...},
     "h2d": {"bps": 2.1e9, "latency_s": 6e-05}, "d2h": {"bps": 2.3e9, "latency_s": 5e-05},
     "rates": {"mm:f16": [[1.3e7, 4.1e10], [4.2e8, 9.8e10]], "bf16_gemm:f16": [...], ...}}

``rates`` maps a work key to points ``[work of one op, rate]`` (FLOP and FLOP/s), sorted by
work: a product of 13 MFLOP runs slower per FLOP than one of 3 GFLOP, and a prediction reads
the rate at its own op's size. Keys are the op *class* and weight dtype (``mm:f16``,
``conv:f16``, ``attn:f16``: what the device's own path gives for that operation, its fixed
costs taken off) and, for each kernel that ran, the class, kernel and dtype
(``mm/bf16_gemm:f16``, ``mm/MUL_MAT:q8_0``; attention kernels with their head width,
``attn/bf16_attention@d40:f32``, convolutions with their output channels,
``conv/winograd@c128:f16``; its memory-bound nodes taken off too): :meth:`DeviceProfile.rate`
takes the kernel's figure when the profile has it (the engine built the graph on this
device; for a tagged kernel the nearest width measured), else the class's (a graph built
elsewhere).

Devices without a profile get :func:`default_profile` for their type, stated in
:data:`DEFAULTS` (order-of-magnitude figures, not measurements: the output says so).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from sdplan.core.errors import InventoryError

#: Op classes of the work counts: products (``mm``), convolutions counted as direct
#: products (``conv``), attention (``attn``, score and value products), and everything else,
#: counted in bytes read and written (``mem``).
OP_CLASSES = ("mm", "conv", "attn", "mem")


_TAG = re.compile(r"^(?P<base>[^@]+)@(?P<letter>[a-z])(?P<value>[0-9]{1,7})(?:k(?P<keys>[0-9]{1,7}))?$")


def _tag(kernel: str) -> tuple[str, str, int, int] | None:
    """``(kernel, tag letter, tag value, key tokens or 0)`` of a tagged kernel name
    (``FLASH_ATTN_EXT@d40k77`` -> ``("FLASH_ATTN_EXT", "d", 40, 77)``), else None (also for
    values of more than 7 ASCII digits: no model has such a width, and a hand-written profile's
    could not be compared)."""
    m = _TAG.match(kernel)
    if m is None:
        return None
    return m["base"], m["letter"], int(m["value"]), int(m["keys"] or 0)

@dataclass(frozen=True)
class Link:
    """One direction of host <-> device transfer: ``bps`` bytes per second and a fixed
    ``latency_s`` seconds per transfer (for an RPC device: the network link and a round
    trip)."""

    bps: float
    latency_s: float

    def seconds(self, nbytes: float, transfers: int = 1) -> float:
        """Seconds to move ``nbytes`` in ``transfers`` transfers."""
        return transfers * self.latency_s + nbytes / self.bps

    def to_json(self) -> dict[str, float]:
        return {"bps": self.bps, "latency_s": self.latency_s}


@dataclass(frozen=True)
class DeviceProfile:
    """Measured (or default) speeds of one device.

    Attributes:
        rates: work key -> ``((work, rate), ...)`` sorted by work (FLOP, FLOP/s); see the
            module docstring for the keys.
        mem_bps: bytes per second of memory-bound ops (read plus written).
        node_s: seconds of fixed cost per graph node (thread synchronisation, dispatch;
            for an RPC device also the node's share of sending the graph).
        op_s: seconds of fixed cost per memory-bound op beyond ``node_s`` (small ops do
            not reach the bandwidth).
        alloc_s, alloc_byte_s: seconds a graph's first compute after allocating its compute
            buffers takes beyond a later one (the scheduler's reserve and allocation, round
            trips to an RPC device, the first touch of fresh memory), fixed and per byte of
            the buffers: paid once per use, as the engine frees them after each use.
        alloc_query_s: seconds each node whose size the backend is asked for (attention,
            on an RPC device: round trips) adds to an allocation.
        mem_rates: memory-bound ops by kernel (``ADD``, ``SILU``, ``GROUP_NORM``,
            ``group_norm``...): ``((bytes of one op, bytes per second), ...)`` sorted by
            size (a small op's data sits in cache); a kernel not listed moves at ``mem_bps``.
        graph_s: seconds of fixed cost per graph computed on the device (a round trip for
            an RPC device).
        h2d, d2h: host-to-device and device-to-host :class:`Link`.
        threads: CPU threads the measurement used (CPU devices; 0 elsewhere).
        source: ``measured`` or ``default``.
        measured: when it was measured (ISO 8601, UTC), empty for a default.
    """

    rates: Mapping[str, tuple[tuple[float, float], ...]]
    mem_bps: float
    node_s: float
    graph_s: float
    h2d: Link
    d2h: Link
    threads: int = 0
    source: str = "measured"
    measured: str = ""
    op_s: float = 0.0
    mem_rates: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    alloc_s: float = 0.0
    alloc_byte_s: float = 0.0
    alloc_query_s: float = 0.0

    def mem_rate(self, kernel: str, nbytes: float) -> float:
        """Bytes per second of a memory-bound op of ``nbytes`` run by ``kernel``
        (interpolated like :meth:`rate`; ``mem_bps`` for a kernel not measured)."""
        pts = self.mem_rates.get(kernel)
        return interpolate(pts, nbytes) if pts else self.mem_bps

    def rate(self, cls: str, kernel: str, dtype: str, work: float) -> float:
        """FLOP/s for one op of ``work`` FLOP: the points of ``cls/kernel:dtype`` when the
        profile has them, else ``cls:dtype``, else ``cls:f16``, else any dtype of ``cls``,
        else ``mm:f16``, else any products, else any points at all (a hand-written profile);
        interpolated in log-log between points and held flat beyond them."""
        pts = (self.rates.get(f"{cls}/{kernel}:{dtype}") or self._nearest_width(cls, kernel, dtype)
               or self.rates.get(f"{cls}:{dtype}") or self.rates.get(f"{cls}:f16") or self._any(cls)
               or self.rates.get("mm:f16") or self._any("mm") or next(iter(self.rates.values()), ()))
        if not pts:
            raise ValueError(f"device profile has no rate for {cls}")
        return interpolate(pts, work)

    def _nearest_width(self, cls: str, kernel: str, dtype: str) -> tuple[tuple[float, float], ...]:
        """For a kernel with a shape tag (``name@dN``: head width, ``name@cN``: output
        channels): the points of the same kernel at the measured tag value nearest to N (in
        ratio). An attention over fewer keys than queries (``name@dNkM``, M keys) takes, at
        that width, the points measured with the nearest key count within 2x of M, else the
        self-attention's (``name@dN``)."""
        want = _tag(kernel)
        if want is None:
            return ()
        base, letter, value, keys = want
        found: list[tuple[float, float, str]] = []  # (width distance, key-count distance, key)
        for key in self.rates:
            head, _, dt = key.rpartition(":")
            k_cls, _, k_kernel = head.partition("/")
            got = _tag(k_kernel)
            if k_cls != cls or dt != dtype or got is None or got[0] != base or got[1] != letter or got[2] <= 0:
                continue
            if got[3] and not (keys and abs(math.log(got[3] / keys)) <= math.log(2.0)):
                continue  # measured over other key counts: not this op's
            k_dist = abs(math.log(got[3] / keys)) if got[3] else math.inf
            found.append((abs(math.log(got[2] / max(value, 1))), k_dist, key))
        if not found:
            return ()
        return self.rates[min(found)[2]]

    def _any(self, cls: str) -> tuple[tuple[float, float], ...]:
        keys = sorted(k for k in self.rates if k.split(":")[0] == cls)
        return self.rates[keys[0]] if keys else ()

    def to_json(self) -> dict[str, object]:
        return {"source": self.source, "measured": self.measured, "threads": self.threads,
                "graph_s": self.graph_s, "node_s": self.node_s, "op_s": self.op_s, "mem_bps": self.mem_bps,
                "alloc_s": self.alloc_s, "alloc_byte_s": self.alloc_byte_s,
                "alloc_query_s": self.alloc_query_s,
                "h2d": self.h2d.to_json(), "d2h": self.d2h.to_json(),
                "mem_rates": {k: [list(p) for p in v] for k, v in sorted(self.mem_rates.items())},
                "rates": {k: [list(p) for p in v] for k, v in sorted(self.rates.items())}}

    @classmethod
    def from_json(cls, data: object, *, source: str = "profile") -> DeviceProfile:
        """Parse the JSON form; raises :class:`InventoryError` naming ``source`` and the
        field at fault."""
        if not isinstance(data, dict):
            raise InventoryError(f"{source}: a device profile must be an object")

        def num(obj: Mapping[str, object], key: str, where: str, positive: bool = True) -> float:
            v = obj.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or \
                    v < 0 or (positive and v == 0):
                raise InventoryError(f"{source}: {where}'{key}' must be a "
                                     f"{'positive' if positive else 'non-negative'} number")
            return float(v)

        links = {}
        for key in ("h2d", "d2h"):
            raw = data.get(key)
            if not isinstance(raw, dict):
                raise InventoryError(f"{source}: '{key}' must be an object with 'bps' and 'latency_s'")
            links[key] = Link(num(raw, "bps", f"{key}."), num(raw, "latency_s", f"{key}.", False))
        raw_rates = data.get("rates")
        if not isinstance(raw_rates, dict) or not raw_rates:
            raise InventoryError(f"{source}: 'rates' must be a non-empty object")
        rates: dict[str, tuple[tuple[float, float], ...]] = {}
        for key, pts in raw_rates.items():
            if not _points(pts):
                raise InventoryError(f"{source}: rates[{key!r}] must be a list of [work, rate] "
                                     "pairs of positive numbers")
            rates[str(key)] = tuple(sorted((float(a), float(b)) for a, b in pts))
        mem_rates = data.get("mem_rates") or {}
        if not isinstance(mem_rates, dict) or not all(_points(v) for v in mem_rates.values()):
            raise InventoryError(f"{source}: 'mem_rates' must map kernels to lists of [bytes, bytes per "
                                 "second] pairs of positive numbers")
        threads = data.get("threads", 0)
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
            raise InventoryError(f"{source}: 'threads' must be an int >= 0")
        return cls(rates=rates, mem_bps=num(data, "mem_bps", ""), node_s=num(data, "node_s", "", False),
                   graph_s=num(data, "graph_s", "", False), h2d=links["h2d"], d2h=links["d2h"],
                   threads=threads, source=str(data.get("source") or "measured"),
                   measured=str(data.get("measured") or ""),
                   op_s=num(data, "op_s", "", False) if "op_s" in data else 0.0,
                   mem_rates={str(k): tuple(sorted((float(a), float(b)) for a, b in v))
                              for k, v in mem_rates.items()},
                   alloc_s=num(data, "alloc_s", "", False) if "alloc_s" in data else 0.0,
                   alloc_byte_s=num(data, "alloc_byte_s", "", False) if "alloc_byte_s" in data else 0.0,
                   alloc_query_s=num(data, "alloc_query_s", "", False) if "alloc_query_s" in data else 0.0)


def _points(pts: object) -> bool:
    """Whether ``pts`` is a non-empty list of ``[positive, positive]`` number pairs."""
    return isinstance(pts, list) and bool(pts) and all(
        isinstance(p, list) and len(p) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0 for x in p)
        for p in pts)


def interpolate(points: tuple[tuple[float, float], ...], work: float) -> float:
    """The rate at ``work`` from ``(work, rate)`` points sorted by work: linear in
    log(work) -> log(rate) between neighbours, the end point's rate beyond the ends."""
    if work <= points[0][0] or len(points) == 1:
        return points[0][1]
    if work >= points[-1][0]:
        return points[-1][1]
    i = bisect.bisect_left([p[0] for p in points], work)
    (w0, r0), (w1, r1) = points[i - 1], points[i]
    f = (math.log(work) - math.log(w0)) / (math.log(w1) - math.log(w0))
    return math.exp(math.log(r0) + f * (math.log(r1) - math.log(r0)))


@dataclass(frozen=True)
class DriveProfile:
    """Read speeds of the drive holding ``path`` (a folder; model files under it use it).

    Attributes:
        path: the folder measured (its drive: the longest matching prefix wins).
        read_bps: bytes per second reading a file not in the page cache.
        cached_bps: bytes per second reading a file the page cache holds.
        map_bps: bytes per second first touching a mapped, cached file's pages (what a
            CPU running mapped weights pays once per mapping).
    """

    path: str
    read_bps: float
    cached_bps: float
    map_bps: float
    source: str = "measured"

    def to_json(self) -> dict[str, object]:
        return {"path": self.path, "read_bps": self.read_bps, "cached_bps": self.cached_bps,
                "map_bps": self.map_bps, "source": self.source}

    @classmethod
    def from_json(cls, data: object, *, source: str = "drives") -> DriveProfile:
        """Parse one ``drives`` entry; raises :class:`InventoryError` naming ``source``."""
        if not isinstance(data, dict) or not isinstance(data.get("path"), str):
            raise InventoryError(f"{source}: a drive must be an object with a 'path'")
        vals = {}
        for key in ("read_bps", "cached_bps", "map_bps"):
            v = data.get(key)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise InventoryError(f"{source} ({data['path']}): '{key}' must be a positive number")
            vals[key] = float(v)
        return cls(data["path"], vals["read_bps"], vals["cached_bps"], vals["map_bps"],
                   str(data.get("source") or "measured"))


def drive_for(path: str, drives: tuple[DriveProfile, ...]) -> DriveProfile:
    """The drive profile of the longest ``drives`` path that contains ``path`` (both
    absolute), else :data:`DEFAULT_DRIVE`."""
    best: DriveProfile | None = None
    for d in drives:
        root = d.path.rstrip("/") or "/"
        if (path == root or path.startswith(root if root.endswith("/") else root + "/")) and (
                best is None or len(root) > len(best.path)):
            best = d
    return best or DEFAULT_DRIVE


#: Stated defaults for a device without a measured profile, by device type (and ``rpc`` for
#: a device behind ggml RPC, whose link dominates): (FLOP/s of products, memory bytes/s, node
#: seconds, graph seconds, host link bytes/s, link latency s). Orders of magnitude only: a
#: desktop CPU's f16 products on its cores, a mid-range discrete GPU over PCIe 4.0 x8, an
#: integrated GPU sharing system memory, a gigabit network link (117 MB/s, 0.5 ms).
DEFAULTS: dict[str, tuple[float, float, float, float, float, float]] = {
    "cpu": (1e11, 2e10, 5e-6, 5e-5, 2e10, 1e-6),
    "gpu": (2e13, 3e11, 5e-6, 1e-4, 1.2e10, 1e-5),
    "igpu": (2e12, 5e10, 5e-6, 1e-4, 2e10, 1e-5),
    "accel": (2e13, 3e11, 5e-6, 1e-4, 1.2e10, 1e-5),
    "rpc": (2e13, 3e11, 2e-5, 1e-3, 1.17e8, 5e-4),
}

#: A drive without a measurement: a SATA SSD (500 MB/s), the page cache at 5 GB/s, mapped
#: pages first touched at 2 GB/s.
DEFAULT_DRIVE = DriveProfile("/", 5e8, 5e9, 2e9, source="default")


def default_profile(device_type: str, registry: str = "") -> DeviceProfile:
    """The stated default (:data:`DEFAULTS`) for a device of ``device_type`` (``cpu``,
    ``gpu``, ``igpu``, ``accel``) in ``registry`` (``RPC`` takes the ``rpc`` row)."""
    key = "rpc" if registry.upper() == "RPC" else device_type
    flops, mem, node, graph, link, lat = DEFAULTS.get(key, DEFAULTS["gpu"])
    rates = {f"{cls}:f16": ((1.0, flops),) for cls in ("mm", "conv", "attn")}
    return DeviceProfile(rates=rates, mem_bps=mem, node_s=node, graph_s=graph,
                         h2d=Link(link, lat), d2h=Link(link, lat), source="default")


@dataclass(frozen=True)
class Profiles:
    """The profiles a prediction uses: device name -> profile (measured ones), the drives,
    and which devices fall back to a default."""

    devices: Mapping[str, DeviceProfile] = field(default_factory=dict)
    drives: tuple[DriveProfile, ...] = ()
