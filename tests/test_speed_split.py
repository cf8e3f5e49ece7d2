"""``--split-ratio auto`` for sdplan's engine (:mod:`sdplan.core.planning.speed_split`): the
cheapest order of the devices, each filled to its room, where a block costs its compute and
each change of device (from the main device and back to it) one copy of the residual stream
over the two links; a device behind a slow link with the same compute keeps its blocks as the
main device; without measured profiles, section 8 and a warning."""

from __future__ import annotations

import math

import pytest
from sdplan.core.planning.device_profile import DeviceProfile, Link
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.speed_split import (
    BLOCK_NODES,
    TOKENS,
    block_compute_seconds,
    crossing_seconds,
)

GIB = 1 << 30
MB = 10**6


def _prof(rate: float, bps: float, latency: float) -> DeviceProfile:
    return DeviceProfile({"mm:f16": ((1.0, rate),)}, mem_bps=1e10, node_s=1e-6, graph_s=1e-4,
                         h2d=Link(bps, latency), d2h=Link(bps, latency))


FAST = _prof(5e11, 2e9, 1e-4)
THROTTLED = _prof(5e10, 1e8, 1e-3)  # ten times slower compute behind a 100 MB/s, 1 ms link
SAME_BEHIND_LINK = _prof(5e11, 1e8, 1e-3)  # FAST's compute behind the slow link
#: twelve 100 MB blocks and 50 MB of embeddings: a text encoder of 1.25 GB
TE = Profile({"te": ModuleProfile((100 * MB,) * 12, 50 * MB), "diffusion": ModuleProfile((), GIB),
              "vae": ModuleProfile((), GIB // 8)}, architecture="sd3")


def _inv(a: DeviceProfile | None, b: DeviceProfile | None, free_b: int = 16 * GIB) -> Inventory:
    return Inventory((Device("CPU", "cpu", "cpu", "CPU", 32 * GIB, 32 * GIB),
                      Device("RPC0", "127.0.0.1:1", "gpu", "RPC", 16 * GIB, 16 * GIB, profile=a),
                      Device("RPC1", "127.0.0.1:2", "gpu", "RPC", free_b, free_b, profile=b)))


def test_a_block_costs_its_products_and_the_residual_over_the_links() -> None:
    params = 100 * MB / 2
    width = math.sqrt(params / 12)
    residual = TOKENS * width * 4
    want = 2 * params * TOKENS / 5e10 + BLOCK_NODES * 1e-6 + 2 * (1e-3 + residual / 1e8)  # THROTTLED
    cpu, _, dev = _inv(FAST, THROTTLED).devices
    # a block alone on the device: its compute, and the residual stream in from the host and back
    alone = (block_compute_seconds(dev, 100 * MB) + crossing_seconds(cpu, dev, 100 * MB)
             + crossing_seconds(dev, cpu, 100 * MB))
    assert alone == pytest.approx(want)
    assert crossing_seconds(dev, dev, 100 * MB) == 0.0
    assert block_compute_seconds(_inv(None, None).devices[1], 100 * MB) is None


def test_auto_puts_the_blocks_on_the_faster_device_first_and_vram_fills_in_order() -> None:
    inv = _inv(FAST, THROTTLED)
    # the throttled device listed first: vram fills it first, auto the fast one
    auto = resolve(Placement.from_strings("te=RPC1&RPC0,diffusion=CPU,vae=CPU", split_ratio="auto"), inv, TE)
    assert [(r.device, r.first_block, r.last_block) for r in auto.modules["te"].ranges] == [("RPC0", 0, 11)]
    vram = resolve(Placement.from_strings("te=RPC1&RPC0,diffusion=CPU,vae=CPU", split_ratio="vram"), inv, TE)
    assert vram.modules["te"].ranges[0].device == "RPC1"
    # a fast device with room for five blocks (its budget): five there, the rest on the other
    capped = resolve(Placement.from_strings("te=RPC1&RPC0,diffusion=CPU,vae=CPU", "", "RPC0=0.5",
                                            split_ratio="auto"), inv, TE)
    assert [(r.device, r.first_block, r.last_block) for r in capped.modules["te"].ranges] == [
        ("RPC0", 0, 4), ("RPC1", 5, 11)]
    # the same compute behind a slow link: the main device keeps its blocks (sending the residual
    # stream to the other device and back costs two crossings and saves nothing), as measured
    # by bench/bench_predict.py's split-auto against split-vram
    kept = resolve(Placement.from_strings("te=RPC1&RPC0,diffusion=CPU,vae=CPU", split_ratio="auto"),
                   _inv(FAST, SAME_BEHIND_LINK), TE)
    assert [(r.device, r.first_block, r.last_block) for r in kept.modules["te"].ranges] == [("RPC1", 0, 11)]
    # a main device without room for every block: the rest goes where it costs least
    small = resolve(Placement.from_strings("te=RPC1&RPC0,diffusion=CPU,vae=CPU", "", "RPC1=0.5",
                                           split_ratio="auto"), _inv(FAST, SAME_BEHIND_LINK), TE)
    assert [r.device for r in small.modules["te"].ranges] in (["RPC1", "RPC0"], ["RPC0"])
    assert all(r.bytes <= GIB // 2 for r in small.modules["te"].ranges if r.device == "RPC1")
    # equal devices keep the --backend order
    even = resolve(Placement.from_strings("te=RPC1&RPC0,diffusion=CPU,vae=CPU", split_ratio="auto"),
                   _inv(FAST, FAST), TE)
    assert even.modules["te"].ranges[0].device == "RPC1"


def test_auto_without_measured_profiles_follows_free_memory_and_says_so() -> None:
    inv = _inv(FAST, None)
    plan = resolve(Placement.from_strings("te=RPC0&RPC1,diffusion=CPU,vae=CPU", split_ratio="auto"), inv, TE)
    section8 = resolve(Placement.from_strings("te=RPC0&RPC1,diffusion=CPU,vae=CPU"), inv, TE)
    assert plan.modules["te"].ranges == section8.modules["te"].ranges
    msg = next(w.message for w in plan.warnings if w.code == "split_ratio_auto")
    assert "RPC1 has none" in msg
