"""Layer-split ranges as sd-cli runs them (spec sections 14.3 and 14.4), and by
``--split-ratio``.

sd-cli cuts a split module's graph at its graph-cut marks and assigns whole segments to
the listed devices in order, filling the first device before the next receives any
(stable-diffusion.cpp ``src/core/layer_split_partition.cpp``): a segment moves on to the
next device when it would not fit the current one's capacity; the last device takes the
rest. Here the segments are the profile's blocks (DiTs, text encoders) or, for a UNet, its
stages (input blocks, middle block, output blocks: the places sd-cli marks); the non-block
tensors go first, with the main device's first segment.

Capacities:

- ``snapshot``: the device's free memory less 2 GiB of compute headroom, capped by its
  ``--max-vram`` budget (a Qwen3 encoder on two 8192 MiB budgets put 8029 MB on the first).
- ``newest``: the device's budget (``--max-vram``, else free memory less the 512 MiB scratch
  reserve of spec section 14.6) less 2 GiB of compute headroom; when the module is larger
  than the devices' capacities together, the weights beyond them are spread over the
  devices in proportion to their budgets and streamed per segment (reported as each range's
  ``streamed`` bytes).

``--split-ratio r0,r1,...`` gives each device a fixed fraction of the block bytes instead:
block ``k`` goes to the device whose share of the cumulative bytes holds its midpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from sdplan.core.planning.modules import GIB
from sdplan.core.planning.plan_types import Range

__all__ = ["HEADROOM", "SCRATCH", "sdcli_capacities", "fill_first", "ratio_ranges",
           "newest_budget", "spread_capacities"]

#: Compute headroom sd-cli keeps per device of a layer split.
HEADROOM = 2 * GIB
#: Device memory every capacity check of the newest sd-cli leaves for backend scratch
#: (its ``docs/performance.md``; spec section 14.6).
SCRATCH = 512 << 20


def newest_budget(free: int, budget: int) -> int:
    """The newest sd-cli's managed budget of a device in bytes: its ``--max-vram`` budget
    (``budget`` > 0) or its free memory, never more than free memory less :data:`SCRATCH`;
    at least 0."""
    room = free - SCRATCH
    return max(min(budget, room) if budget > 0 else room, 0)


def sdcli_capacities(free: Sequence[int], budgets: Sequence[int], dialect: str) -> list[int]:
    """Bytes of weights each listed device takes before the next one receives segments
    (module docstring), from each device's free bytes and ``--max-vram`` budget in bytes
    (0: none)."""
    out = []
    for f, b in zip(free, budgets, strict=True):
        if dialect == "snapshot":
            cap = max(f - HEADROOM, 0)
            out.append(min(cap, b) if b > 0 else cap)
        else:
            out.append(max(newest_budget(f, b) - HEADROOM, 0))
    return out


def fill_first(devices: Sequence[str], capacities: Sequence[int], units: Sequence[int],
               fixed: int, resident: Sequence[int] | None = None) -> list[Range]:
    """Whole units (segments) in order, each on the current device while it fits its
    capacity (the ``fixed`` non-block bytes count first on the main device), else on the
    next device; the last device takes the rest. One :class:`Range` per device that
    received units; a range's ``streamed`` is its bytes beyond what stays resident on the
    device (``resident``, default the capacities)."""
    keep = list(resident) if resident is not None else list(capacities)
    ranges: list[Range] = []
    dev, first, running, used = 0, 0, 0, fixed
    last = len(devices) - 1
    for i, size in enumerate(units):
        while dev < last and size > 0 and used + size > capacities[dev]:
            if i > first:
                ranges.append(_range(devices[dev], first, i - 1, running, used - keep[dev]))
            dev, first, running, used = dev + 1, i, 0, 0
        running += size
        used += size
    if units:
        ranges.append(_range(devices[dev], first, len(units) - 1, running, used - keep[dev]))
    return ranges


def _range(device: str, first: int, last: int, nbytes: int, over: int) -> Range:
    return Range(device, first, last, nbytes, max(min(over, nbytes), 0))


def spread_capacities(capacities: Sequence[int], budgets: Sequence[int], total: int) -> list[int]:
    """The newest sd-cli's capacities when ``total`` bytes exceed them together: each device
    also takes a share of the excess in proportion to its budget (the last the remainder)."""
    excess = total - sum(capacities)
    if excess <= 0:
        return list(capacities)
    weights = [max(b, 1) for b in budgets]
    shares = [excess * w // sum(weights) for w in weights]
    shares[-1] += excess - sum(shares)
    return [c + s for c, s in zip(capacities, shares, strict=True)]


def ratio_ranges(devices: Sequence[str], fractions: Sequence[Decimal], units: Sequence[int]
                 ) -> list[Range]:
    """``--split-ratio r0,r1,...``: block ``k`` goes to the first device whose cumulative
    fraction of all block bytes reaches the midpoint of ``k``'s bytes (exact Decimal
    arithmetic). One :class:`Range` per device that received blocks.

    Raises:
        ValueError: when the fractions and the devices differ in number.
    """
    if len(fractions) != len(devices):
        raise ValueError(f"{len(fractions)} fractions for {len(devices)} devices")
    total = Decimal(sum(units))
    bounds: list[Decimal] = []
    acc = Decimal(0)
    for f in fractions:
        acc += f
        bounds.append(acc * total)
    owner: list[int] = []
    running = Decimal(0)
    for size in units:
        mid = running + Decimal(size) / 2
        owner.append(next((i for i, b in enumerate(bounds) if mid <= b), len(devices) - 1))
        running += size
    ranges: list[Range] = []
    for i, dev in enumerate(owner):
        if ranges and ranges[-1].device == devices[dev]:
            r = ranges[-1]
            ranges[-1] = Range(r.device, r.first_block, i, r.bytes + units[i])
        else:
            ranges.append(Range(devices[dev], i, i, units[i]))
    return ranges
