"""Device and drive profiles: their JSON form inside an inventory, rates by op size and
kernel, the stated defaults, and drives by path (pure planning code)."""

from __future__ import annotations

import json
import math

import pytest
from sdplan.core.errors import InventoryError
from sdplan.core.planning.device_profile import (
    DEFAULT_DRIVE,
    DEFAULTS,
    DeviceProfile,
    DriveProfile,
    Link,
    default_profile,
    drive_for,
    interpolate,
)
from sdplan.core.planning.inventory import Inventory


def _profile(**rates: tuple[tuple[float, float], ...]) -> DeviceProfile:
    return DeviceProfile(rates=rates or {"mm:f16": ((1e6, 1e10), (1e9, 1e11))}, mem_bps=2e10, node_s=1e-6,
                         graph_s=3e-5, h2d=Link(1e9, 1e-5), d2h=Link(2e9, 2e-5), threads=2,
                         measured="2026-01-02T03:04:05Z", op_s=4e-6)


def test_interpolation_is_linear_in_log_log_and_flat_beyond_the_points() -> None:
    pts = ((1e6, 1e10), (1e8, 1e11))
    assert interpolate(pts, 1e3) == 1e10 and interpolate(pts, 1e12) == 1e11
    # halfway in log(work) is halfway in log(rate): the geometric mean
    assert interpolate(pts, 1e7) == pytest.approx(math.sqrt(1e10 * 1e11))
    assert interpolate(((5.0, 7.0),), 1e9) == 7.0


def test_rate_prefers_the_kernel_then_the_class_then_any_product() -> None:
    p = _profile(**{"mm/bf16_gemm:f16": ((1.0, 3e11),), "mm:f16": ((1.0, 1e11),), "conv:f16": ((1.0, 5e10),)})
    assert p.rate("mm", "bf16_gemm", "f16", 1e6) == 3e11  # the kernel that ran
    assert p.rate("mm", "MUL_MAT", "f16", 1e6) == 1e11  # another kernel: the class
    assert p.rate("mm", "MUL_MAT", "q8_0", 1e6) == 1e11  # another dtype: the class in f16
    assert p.rate("attn", "FLASH_ATTN_EXT@d64", "f16", 1e6) == 1e11  # no attention at all: products


def test_attention_takes_the_nearest_measured_head_width() -> None:
    p = _profile(**{"attn/bf16_attention@d8:f32": ((1.0, 2e10),), "attn/bf16_attention@d64:f32": ((1.0, 9e10),),
                    "mm:f16": ((1.0, 1e11),)})
    assert p.rate("attn", "bf16_attention@d64", "f32", 1e6) == 9e10
    assert p.rate("attn", "bf16_attention@d40", "f32", 1e6) == 9e10  # 40 is nearer 64 than 8 (in ratio)
    assert p.rate("attn", "bf16_attention@d16", "f32", 1e6) == 2e10
    assert p.rate("attn", "fma_attention@d40", "f32", 1e6) == 1e11  # another kernel: no width match


def test_cross_attention_takes_the_rates_measured_over_as_many_keys() -> None:
    """An attention over fewer keys than queries (``@dNkM``) takes the points measured at its
    width over the nearest key count within 2x, else its width's self-attention; a
    self-attention never takes cross points; the nearest width still comes first."""
    p = _profile(**{"attn/FLASH_ATTN_EXT@d40:f16": ((1.0, 8e10),), "attn/FLASH_ATTN_EXT@d40k77:f16": ((1.0, 4e10),),
                    "attn/FLASH_ATTN_EXT@d8:f16": ((1.0, 2e10),), "attn/FLASH_ATTN_EXT@d12:f16": ((1.0, 1e9),),
                    "mm:f16": ((1.0, 1e11),)})
    assert p.rate("attn", "FLASH_ATTN_EXT@d40k77", "f16", 1e6) == 4e10
    assert p.rate("attn", "FLASH_ATTN_EXT@d40k120", "f16", 1e6) == 4e10  # 120 keys: within 2x of 77
    assert p.rate("attn", "FLASH_ATTN_EXT@d40k512", "f16", 1e6) == 8e10  # far from 77: the self-attention's
    assert p.rate("attn", "FLASH_ATTN_EXT@d40", "f16", 1e6) == 8e10
    assert p.rate("attn", "FLASH_ATTN_EXT@d64k77", "f16", 1e6) == 4e10  # nearest width 40, its cross points
    assert p.rate("attn", "FLASH_ATTN_EXT@d12k77", "f16", 1e6) == 1e9  # width 12 measured: it wins over 8's
    assert p.rate("attn", "FLASH_ATTN_EXT@d8k77", "f16", 1e6) == 2e10  # no cross points at 8: self


def test_hand_written_kernel_names_never_break_the_lookup() -> None:
    """A profile written by hand may have kernel names no model counts (a 400-digit key count,
    no digits, a zero width) and no products at all: such names are ignored and a rate is
    still found (any points, as a last resort), where a 400-digit count overflowed a float."""
    p = _profile(**{"attn/FLASH_ATTN_EXT@d8k" + "9" * 400 + ":f16": ((1.0, 3e10),),
                    "attn/FLASH_ATTN_EXT@d" + "9" * 400 + ":f16": ((1.0, 4e10),),
                    "attn/FLASH_ATTN_EXT@dXk:f16": ((1.0, 5e10),), "attn/x@d0k0:f16": ((1.0, 6e10),)})
    assert p.rate("attn", "FLASH_ATTN_EXT@d8k77", "f16", 1e6) > 0
    assert p.rate("attn", "FLASH_ATTN_EXT@d" + "9" * 400, "f16", 1e6) == 4e10  # its own exact key
    only = _profile(**{"attn/FLASH_ATTN_EXT@d8k77:f16": ((1.0, 7e9),)})
    assert only.rate("mm", "MUL_MAT", "f16", 1e6) == 7e9  # nothing else measured: those points


def test_memory_bound_kernels_have_their_own_rates_by_size() -> None:
    p = DeviceProfile({"mm:f16": ((1.0, 1e11),)}, mem_bps=2e10, node_s=0.0, graph_s=0.0, h2d=Link(1.0, 0.0),
                      d2h=Link(1.0, 0.0), mem_rates={"SILU": ((1e5, 4e9), (1e7, 6e9))})
    assert p.mem_rate("SILU", 1e3) == 4e9 and p.mem_rate("SILU", 1e9) == 6e9
    assert p.mem_rate("SILU", 1e6) == pytest.approx(math.sqrt(4e9 * 6e9))
    assert p.mem_rate("ADD", 1e6) == 2e10  # not measured: the memory bandwidth
    assert DeviceProfile.from_json(p.to_json()) == p


def test_a_profile_round_trips_through_an_inventory_file(tmp_path) -> None:
    inv = Inventory.from_json({"devices": [
        {"name": "CPU", "type": "cpu", "registry": "CPU", "free": 10, "total": 20,
         "profile": _profile().to_json()},
        {"name": "CUDA0", "type": "gpu", "registry": "CUDA", "free": 5, "total": 8}],
        "drives": [DriveProfile("/models", 5e8, 6e9, 2e10).to_json()]})
    path = tmp_path / "box.json"
    path.write_text(json.dumps(inv.to_json()))
    back = Inventory.load(path)
    assert back.get("CPU").profile == _profile()
    assert back.get("CUDA0").profile is None and "profile" not in back.to_json()["devices"][1]
    assert back.drives == (DriveProfile("/models", 5e8, 6e9, 2e10),)
    assert back == inv  # profiles do not change what an inventory is


def test_an_inventory_without_profiles_reads_and_writes_as_before() -> None:
    old = {"devices": [{"name": "CPU", "description": "x", "type": "cpu", "registry": "CPU", "free": 1,
                        "total": 2}]}
    inv = Inventory.from_json(old)
    assert inv.get("CPU").profile is None and inv.drives == ()
    assert inv.to_json() == {"devices": [{"name": "CPU", "description": "x", "type": "cpu",
                                          "registry": "CPU", "free": 1, "total": 2}]}


@pytest.mark.parametrize("field, value, message", [
    ("mem_bps", 0, "'mem_bps' must be a positive number"),
    ("rates", {"mm:f16": [[1, -2]]}, "rates['mm:f16'] must be a list of [work, rate]"),
    ("rates", {}, "'rates' must be a non-empty object"),
    ("h2d", {"bps": 1.0}, "h2d.'latency_s' must be a non-negative number"),
    ("threads", -1, "'threads' must be an int >= 0"),
])
def test_a_bad_profile_is_an_error_naming_the_device_and_field(field, value, message) -> None:
    raw = _profile().to_json()
    raw[field] = value
    with pytest.raises(InventoryError) as err:
        Inventory.from_json({"devices": [{"name": "CPU", "type": "cpu", "free": 1, "total": 2, "profile": raw}]},
                            source="box.json")
    assert "box.json: devices[0] (CPU): profile" in str(err.value) and message in str(err.value)


def test_defaults_are_stated_per_type_and_rpc_gets_a_network_link() -> None:
    gpu = default_profile("gpu", "CUDA")
    rpc = default_profile("gpu", "RPC")
    assert gpu.source == "default" and gpu.rate("mm", "MUL_MAT", "f16", 1e9) == DEFAULTS["gpu"][0]
    assert rpc.h2d == Link(DEFAULTS["rpc"][4], DEFAULTS["rpc"][5])
    assert default_profile("cpu").mem_bps == DEFAULTS["cpu"][1]


def test_a_file_uses_the_drive_of_the_longest_matching_folder() -> None:
    drives = (DriveProfile("/", 1.0, 1.0, 1.0), DriveProfile("/mnt/fast", 2.0, 2.0, 2.0),
              DriveProfile("/mnt/fast/models", 3.0, 3.0, 3.0))
    assert drive_for("/mnt/fast/models/sd.safetensors", drives).read_bps == 3.0
    assert drive_for("/mnt/fast/other.gguf", drives).read_bps == 2.0
    assert drive_for("/mnt/fastest/x", drives).read_bps == 1.0  # a prefix of a name is not a folder
    assert drive_for("/home/x", ()) is DEFAULT_DRIVE
