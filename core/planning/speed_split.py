"""``--split-ratio auto`` for sdplan's engine: a layer split's blocks placed by the devices'
measured speed (spec section 14.4 describes sd-cli's: each block where compute plus transfer
costs least, from a measurement at start-up; sdplan has the measurement beforehand, in the
devices' profiles, :mod:`sdplan.core.planning.device_profile`).

The blocks of a split run one after another, so a block costs its compute on the device it
is on, and each change of device between consecutive blocks costs one copy of the residual
stream over the two devices' links. With every device's weights resident (the engine keeps
a split's weights on their devices), the cheapest contiguous placement fills the device
with the lowest cost per block first, up to its room, then the next cheapest, and so on:
every other order adds compute on a slower device or a crossing. The cost of a block on
device ``d`` (:func:`block_seconds`) is a transformer block of the module's average block
size (``P`` parameters: ``bytes / 2``, f16) on ``T`` = :data:`TOKENS` tokens, ``2 * P * T``
FLOP at the device's f16 product rate, its :data:`BLOCK_NODES` graph nodes at the device's
fixed cost per node (what dominates small blocks, and an RPC device's round trips), plus the
crossing of the residual stream into and out of the device (``T`` tokens of width
``sqrt(P / 12)``, a transformer block's twelve ``width x width`` products, in f32) over its
links. The room of a device is its free memory
less 2 GiB (or its ``--max-vram`` budget), as section 8 sizes a split.

Devices without a measured profile fall back to section 8's ranges with warning
``split_ratio_auto`` naming them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from sdplan.core.planning.inventory import Device
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.plan_types import PlanWarning, Range
from sdplan.core.planning.profile import ModuleProfile

__all__ = ["TOKENS", "BLOCK_NODES", "block_seconds", "speed_ranges"]

#: Tokens of the reference block the devices are compared on (a 512 px SD latent's 4096
#: attention tokens are more, a text encoder's 77 fewer: only the devices' order matters).
TOKENS = 256
#: Graph nodes of one transformer block as the engine builds it (two norms, the q/k/v and
#: output products with their biases, the attention, the MLP's two products and activation,
#: two residual adds, and the views between them: 35-45 in sdplan's CLIP, T5 and DiT blocks).
BLOCK_NODES = 40


def block_seconds(device: Device, block_bytes: float) -> float | None:
    """Seconds of one block of ``block_bytes`` f16 weight bytes on ``device`` (module
    docstring), or None without a measured profile."""
    p = device.profile
    if p is None or p.source != "measured":
        return None
    params = block_bytes / 2
    flops = 2 * params * TOKENS
    width = math.sqrt(max(params, 1.0) / 12)
    residual = TOKENS * width * 4
    return (flops / p.rate("mm", "MUL_MAT", "f16", flops / 12) + BLOCK_NODES * p.node_s
            + p.h2d.seconds(residual) + p.d2h.seconds(residual))


def speed_ranges(module: str, runtime: Sequence[str], mp: ModuleProfile, devices: Mapping[str, Device],
                 budgets: Mapping[str, int]) -> tuple[list[Range] | None, list[PlanWarning]]:
    """Contiguous block ranges of ``module`` over ``runtime`` (main device first) by speed
    (module docstring): the devices in order of :func:`block_seconds`, each filled up to
    its room (the main device's non-block bytes count first), the slowest taking the rest;
    ties keep the ``--backend`` order. ``(None, [warning])`` when a device has no measured
    profile (the caller keeps section 8's ranges)."""
    blocks = list(mp.blocks)
    avg = sum(blocks) / len(blocks) if blocks else 0.0
    cost = {d: block_seconds(devices[d], avg) for d in runtime}
    missing = [d for d, c in cost.items() if c is None]
    if missing:
        return None, [PlanWarning("split_ratio_auto", f"{module}: --split-ratio auto needs each device's "
                                  f"measured profile (sdplan devices --calibrate); {', '.join(missing)} has "
                                  "none, so its blocks follow free memory (section 8)")]
    order = sorted(runtime, key=lambda d: (cost[d], runtime.index(d)))
    room = {d: (min(devices[d].free, budgets.get(d, 0)) if budgets.get(d, 0) > 0 else max(devices[d].free - 2 * GIB, 0))
            - (mp.other if d == runtime[0] else 0) for d in runtime}
    ranges: list[Range] = []
    k = 0
    for n, d in enumerate(order):
        first, used = k, 0
        while k < len(blocks) and (n == len(order) - 1 or used + blocks[k] <= room[d]):
            used += blocks[k]
            k += 1
        if k > first:
            ranges.append(Range(d, first, k - 1, used))
    return ranges, []
