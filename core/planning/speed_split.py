"""``--split-ratio auto`` for sdplan's engine: a layer split's blocks placed by the devices'
measured speed (spec section 14.4 describes sd-cli's: each block where compute plus transfer
costs least, from a measurement at start-up; sdplan has the measurement beforehand, in the
devices' profiles, :mod:`sdplan.core.planning.device_profile`).

The blocks of a split run one after another, so a block costs its compute on the device it
is on, and each change of device along the graph costs one copy of the residual stream over
the two devices' links (device to host, host to device; nothing for a CPU side). The graph
starts and ends on the main device (its non-block parts: embeddings, final norm), so a range
off the main device costs two crossings, and ranges on ``k`` devices ``k + 1`` or so. The cost
of a block's compute on device ``d`` (:func:`block_compute_seconds`) is a transformer block of
the module's average block size (``P`` parameters: ``bytes / 2``, f16) on ``T`` =
:data:`TOKENS` tokens, ``2 * P * T`` FLOP at the device's f16 product rate, plus its
:data:`BLOCK_NODES` graph nodes at the device's fixed cost per node (what dominates small
blocks, and an RPC device's round trips); a crossing moves ``T`` tokens of width
``sqrt(P / 12)`` (a transformer block's twelve ``width x width`` products) in f32.
:func:`speed_ranges` tries every order of the devices (each filled to its room in turn, the
last taking the rest) and keeps the cheapest: a device behind a slow link with the same
compute keeps the blocks it already holds as the main device rather than sending the
residual stream out and back (measured: ``bench/bench_predict.py``, split-auto against
split-vram). The room of a device is its free memory less 2 GiB (or its ``--max-vram``
budget), as section 8 sizes a split.

Devices without a measured profile fall back to section 8's ranges with warning
``split_ratio_auto`` naming them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

from sdplan.core.planning.inventory import Device
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.plan_types import PlanWarning, Range
from sdplan.core.planning.profile import ModuleProfile

__all__ = ["TOKENS", "BLOCK_NODES", "block_compute_seconds", "crossing_seconds", "speed_ranges"]

#: Tokens of the reference block the devices are compared on (a 512 px SD latent's 4096
#: attention tokens are more, a text encoder's 77 fewer: only the devices' order matters).
TOKENS = 256
#: Graph nodes of one transformer block as the engine builds it (two norms, the q/k/v and
#: output products with their biases, the attention, the MLP's two products and activation,
#: two residual adds, and the views between them: 35-45 in sdplan's CLIP, T5 and DiT blocks).
BLOCK_NODES = 40


def _residual_bytes(block_bytes: float) -> float:
    width = math.sqrt(max(block_bytes / 2, 1.0) / 12)
    return TOKENS * width * 4


def block_compute_seconds(device: Device, block_bytes: float) -> float | None:
    """Seconds of one block's compute (``block_bytes`` f16 weight bytes) on ``device``: its
    products at the device's f16 rate and its nodes' fixed cost (module docstring); None
    without a measured profile."""
    p = device.profile
    if p is None or p.source != "measured":
        return None
    flops = 2 * (block_bytes / 2) * TOKENS
    return flops / p.rate("mm", "MUL_MAT", "f16", flops / 12) + BLOCK_NODES * p.node_s


def crossing_seconds(src: Device, dst: Device, block_bytes: float) -> float:
    """Seconds of moving the residual stream of blocks of ``block_bytes`` from ``src`` to
    ``dst``: ``src``'s device-to-host and ``dst``'s host-to-device link (a CPU side is free;
    a device without a profile is taken as free too: auto needs every profile anyway)."""
    if src.name == dst.name:
        return 0.0
    res = _residual_bytes(block_bytes)
    out = 0.0 if src.registry.upper() == "CPU" or src.profile is None else src.profile.d2h.seconds(res)
    into = 0.0 if dst.registry.upper() == "CPU" or dst.profile is None else dst.profile.h2d.seconds(res)
    return out + into


def speed_ranges(module: str, runtime: Sequence[str], mp: ModuleProfile, devices: Mapping[str, Device],
                 budgets: Mapping[str, int]) -> tuple[list[Range] | None, list[PlanWarning]]:
    """Contiguous block ranges of ``module`` over ``runtime`` (main device first) by speed
    (module docstring): of every order of the devices, each filled up to its room (the main
    device's non-block bytes count first) and the last taking the rest, the cheapest whose
    last device has room for what it takes (if none has, the cheapest of all); ties take
    fewer devices, then the ``--backend`` order. ``(None, [warning])`` when a device has no
    measured profile (the caller keeps section 8's ranges)."""
    blocks = list(mp.blocks)
    avg = sum(blocks) / len(blocks) if blocks else 0.0
    compute = {d: block_compute_seconds(devices[d], avg) for d in runtime}
    missing = [d for d, c in compute.items() if c is None]
    if missing:
        return None, [PlanWarning("split_ratio_auto", f"{module}: --split-ratio auto needs each device's "
                                  f"measured profile (sdplan devices --calibrate); {', '.join(missing)} has "
                                  "none, so its blocks follow free memory (section 8)")]
    room = {d: (min(devices[d].free, budgets.get(d, 0)) if budgets.get(d, 0) > 0 else max(devices[d].free - 2 * GIB, 0))
            - (mp.other if d == runtime[0] else 0) for d in runtime}
    main = devices[runtime[0]]

    def fill(order: Sequence[str]) -> list[Range]:
        ranges: list[Range] = []
        k = 0
        for n, d in enumerate(order):
            first, used = k, 0
            while k < len(blocks) and (n == len(order) - 1 or used + blocks[k] <= room[d]):
                used += blocks[k]
                k += 1
            if k > first:
                ranges.append(Range(d, first, k - 1, used))
        return ranges

    def cost(ranges: Sequence[Range]) -> float:
        path = [main, *(devices[r.device] for r in ranges), main]
        hops = sum(crossing_seconds(a, b, avg) for a, b in zip(path, path[1:], strict=False))
        return hops + sum((r.last_block - r.first_block + 1) * (compute[r.device] or 0.0) for r in ranges)

    best: tuple[int, float, int, tuple[int, ...], list[Range]] | None = None
    for n in range(1, len(runtime) + 1):
        for order in itertools.permutations(runtime, n):
            ranges = fill(order)
            over = bool(ranges) and ranges[-1].bytes > room[ranges[-1].device]
            key = (int(over), cost(ranges), len(ranges), tuple(runtime.index(r.device) for r in ranges))
            if best is None or key < best[:4]:
                best = (*key, ranges)
    return (best[4] if best is not None else []), []
