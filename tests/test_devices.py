"""Live inventory and features of the loaded ggml (core/runtime/devices.py, native/devices.cpp)."""

from __future__ import annotations

import json
import os
import types

import pytest
import sdplan._ggml as native
from hypothesis import given
from hypothesis import strategies as st
from sdplan.core.cli import main
from sdplan.core.errors import InventoryError
from sdplan.core.planning.inventory import Inventory
from sdplan.core.runtime import devices


def meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, rest = line.split(":", 1)
            out[key] = int(rest.split()[0]) * 1024
    return out


needs_meminfo = pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="no /proc/meminfo")


@needs_meminfo
def test_cpu_memory_matches_meminfo() -> None:
    cpu = devices.live_inventory().get("CPU")
    mem = meminfo()
    assert cpu.type == "cpu" and cpu.registry == "CPU"
    assert abs(cpu.total - mem["MemTotal"]) <= 0.03 * mem["MemTotal"]
    assert 0 < cpu.free <= cpu.total
    # free is MemAvailable, which moves a little between the two reads
    assert abs(cpu.free - mem["MemAvailable"]) <= 0.05 * mem["MemTotal"]


def test_inventory_mirrors_ggml_device_list() -> None:
    inv = devices.live_inventory()
    raw = native.list_devices()
    assert inv.names() == [d["name"] for d in raw if d["type"] != "meta"]
    assert inv.names() == [n for n in native.device_names() if n in inv.names()]
    for d, r in zip(inv, raw, strict=False):
        assert (d.description, d.type, d.registry, d.device_id) == (
            r["description"], r["type"], r["registry"], r["device_id"])
        assert d.total == r["total"]
        assert set(d.caps) == {"async", "host_buffer", "buffer_from_host_ptr", "events"}


def test_inventory_round_trips_through_json() -> None:
    inv = devices.live_inventory()
    assert Inventory.from_json(json.loads(json.dumps(inv.to_json()))) == inv


def test_device_memory_refresh() -> None:
    free, total = devices.device_memory("CPU")
    cpu = devices.live_inventory().get("CPU")
    assert total == cpu.total
    assert 0 < free <= total
    assert abs(free - cpu.free) <= 0.05 * total  # both MemAvailable, read moments apart
    assert native.device_type("CPU") == "cpu"
    with pytest.raises(InventoryError, match="'NoSuchDevice'"):
        devices.device_memory("NoSuchDevice")


def test_features_come_from_the_cpu_registry() -> None:
    feat = devices.features()
    cpu = dict(native.backend_features("CPU"))
    assert feat["cpu_features"] == cpu and cpu  # the CPU registry reports features
    assert feat["llamafile"] == (cpu.get("LLAMAFILE") == "1")
    assert feat["rpc"] == native.rpc_available() == ("RPC" in native.registry_names())
    assert feat["ggml_version"] == native.ggml_version()
    assert "CPU" in feat["registries"]
    with pytest.raises(ValueError, match="NoSuchRegistry"):
        native.backend_features("NoSuchRegistry")


def test_missing_fast_paths_are_warned(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.SimpleNamespace(
        backend_features=lambda reg: [("SSE3", "1")],
        rpc_available=lambda: False,
        ggml_version=lambda: "0.0.1",
        registry_names=lambda: ["CPU"],
        bf16_kernel=lambda: "avx512", bf16_cpu_kernel=lambda: "avx512", fma_gemm=lambda: True,
        wino_kernel=lambda: "avx512",
    )
    monkeypatch.setattr(devices, "native", lambda: fake)
    monkeypatch.setattr(devices, "_host_cpu_flags", lambda: {"avx2", "fma", "avx512f"})
    monkeypatch.setattr(devices, "_machine", lambda: "x86_64")
    feat = devices.features()
    assert feat["rpc"] is False and feat["llamafile"] is False
    text = "\n".join(feat["warnings"])
    assert "RPC backend" in text and "llamafile" in text
    assert devices.RPC_INSTALL_COMMAND in text
    assert "AVX2, FMA" in text and "F16C" not in text
    assert "-C cmake.define.GGML_AVX2=ON -C cmake.define.GGML_FMA=ON to the install" in text
    # neither AVX-512 nor a native build is suggested: the native build measured slower
    # (bench/bench_ggml_build.py; devices._SUGGESTED_FAST_PATHS)
    assert "AVX512" not in text and "GGML_NATIVE=ON" not in text and feat["bf16_kernel"] == "avx512"


def test_cpu_feature_advice_refuses_features_without_a_switch() -> None:
    """The advice names a CMake switch per feature; it never falls back to GGML_NATIVE=ON."""
    assert devices.missing_cpu_features_advice(["FMA"]) == (
        "ggml's CPU backend was built without FMA, which this CPU has (libggml-python builds with "
        "GGML_NATIVE=OFF); add -C cmake.define.GGML_FMA=ON to the install command's libggml-python "
        "switches and reinstall it")
    with pytest.raises(ValueError, match="AMX_INT8"):
        devices.missing_cpu_features_advice(["AVX2", "AMX_INT8"])
    with pytest.raises(ValueError, match="CPU features"):
        devices.missing_cpu_features_advice([])


def test_complete_build_has_no_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.SimpleNamespace(
        backend_features=lambda reg: [("AVX2", "1"), ("LLAMAFILE", "1")],
        rpc_available=lambda: True, ggml_version=lambda: "0.0.1",
        registry_names=lambda: ["RPC", "CPU", "RPC[127.0.0.1:1]"], bf16_kernel=lambda: "off",
        bf16_cpu_kernel=lambda: "off", fma_gemm=lambda: False, wino_kernel=lambda: "generic",
    )
    monkeypatch.setattr(devices, "native", lambda: fake)
    monkeypatch.setattr(devices, "_host_cpu_flags", lambda: {"avx2"})
    feat = devices.features()
    assert feat["warnings"] == [] and feat["registries"] == ["RPC", "CPU"]


@given(host=st.sampled_from(["127.0.0.1", "localhost", "gpu-box.lan", "::1"]),
       port=st.integers(1, 65535))
def test_parse_endpoint_round_trip(host: str, port: int) -> None:
    text = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    assert devices.parse_endpoint(text) == (host, port)
    assert devices.parse_endpoint(f"  {text} ") == (host, port)


@given(port=st.one_of(st.integers(max_value=0), st.integers(min_value=65536)))
def test_parse_endpoint_rejects_bad_ports(port: int) -> None:
    with pytest.raises(devices.RpcError, match="host:port"):
        devices.parse_endpoint(f"127.0.0.1:{port}")


@pytest.mark.parametrize("text", ["", "127.0.0.1", ":50052", "host:", "host:port", "h:5e3"])
def test_parse_endpoint_rejects_malformed(text: str) -> None:
    with pytest.raises(devices.RpcError, match=repr(text).replace("[", r"\[")):
        devices.parse_endpoint(text)


def test_split_endpoints() -> None:
    assert devices.split_endpoints(["a:1,b:2", " c:3 ,, a:1", ""]) == ["a:1", "b:2", "c:3"]
    assert devices.split_endpoints([]) == []


def test_devices_command_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    inv = Inventory.from_json(data)
    assert inv.names() == devices.live_inventory().names()
    assert inv.get("CPU").total == devices.device_memory("CPU")[1]
    assert set(data["features"]) >= {"ggml_version", "rpc", "llamafile", "cpu_features",
                                     "warnings"}


def test_devices_command_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    cpu = devices.live_inventory().get("CPU")
    assert "Free GiB" in out and "Total GiB" in out
    assert "CPU" in out and f"{cpu.total / 1024**3:.1f}" in out
    assert f"ggml {native.ggml_version()}" in out


def test_bf16_kernel_suggested_only_where_measured_to_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """With AMX and the kernel off, devices suggests SDPLAN_BF16_KERNEL=auto (measured faster);
    with AVX512_BF16 alone (the VAE measured slower) or the kernel on, nothing."""
    for cpu_kernel, used, advised in (("amx", "off", True), ("avx512", "off", False), ("amx", "amx", False)):
        fake = types.SimpleNamespace(
            backend_features=lambda reg: [("AVX2", "1"), ("LLAMAFILE", "1")], rpc_available=lambda: True,
            ggml_version=lambda: "0.0.1", registry_names=lambda: ["CPU"],
            bf16_kernel=lambda used=used: used, bf16_cpu_kernel=lambda c=cpu_kernel: c, fma_gemm=lambda: True,
            wino_kernel=lambda: "avx2")
        monkeypatch.setattr(devices, "native", lambda fake=fake: fake)
        monkeypatch.setattr(devices, "_host_cpu_flags", lambda: {"avx2"})
        assert (devices.BF16_ADVICE in devices.features()["warnings"]) is advised


def test_avx512_line_names_the_winograd_convolutions(monkeypatch: pytest.MonkeyPatch) -> None:
    """With AVX512_BF16 alone and the Winograd convolution's AVX-512 build, conv_2d takes f32
    Winograd for the UNets' 3x3 convolutions from 32 px wide: the feature line says so."""
    from sdplan.core.commands import devices as command
    from sdplan.core.runtime import bf16_rule

    monkeypatch.setattr(bf16_rule, "avx512_bf16_speedup", lambda: 1.8)
    with_wino = command._avx512_line("avx512")
    assert "UNets and CLIP in bf16 (3x3 convolutions from 32 px wide: f32 Winograd)" in with_wino
    assert "measured 1.8x" in with_wino
    for build in ("avx2", None):
        assert "Winograd" not in command._avx512_line(build)


def test_devices_table_shows_the_measured_attention_and_bf16_products(capsys: pytest.CaptureFixture[str]) -> None:
    """The table's speed lines come from the device's profile: the f16 and bf16 product rates at
    their largest size measured (GFLOP/s), and per attention kernel ns per score (4 x width FLOP
    each) at each head width measured, the cross-attention's key counts after it."""
    from sdplan.core.commands import devices as command
    from sdplan.core.planning.device_profile import DeviceProfile, Link, default_profile
    from sdplan.core.planning.inventory import Device

    rates = {
        "mm:f16": ((1e6, 5e10), (3e9, 1e11)), "mm/bf16_gemm:f16": ((3e9, 1.9e11),), "mm:bf16": ((3e9, 2e11),),
        "attn:f16": ((1e6, 9e10),),  # the class's points: no width, not shown
        "attn/FLASH_ATTN_EXT@d64:f16": ((1e8, 6.4e10),),  # 256 / 64 G: 4 ns (listed first: widths are sorted as numbers)
        "attn/FLASH_ATTN_EXT@d8:f16": ((1e6, 1e10), (3e7, 1.6e10)),  # 32 FLOP / 16 GFLOP/s: 2 ns
        "attn/FLASH_ATTN_EXT@d12:f16": ((1e6, 8e8),),  # 48 / 0.8 G: 60 ns
        "attn/FLASH_ATTN_EXT@d40:f16": ((1e8, 5e10),),  # 160 / 50 G: 3.2 ns
        "attn/FLASH_ATTN_EXT@d40k77:f16": ((1e8, 2e10),),  # 160 / 20 G: 8 ns
        "attn/FLASH_ATTN_EXT@d64k77:f16": ((1e8, 2.56e10),),  # 256 / 25.6 G: 10 ns
        "attn/bf16_attention@d40:f32": ((1e8, 3.2e11),),  # 160 / 320 G: 0.5 ns
        "conv/winograd@c128:f16": ((1e9, 3e11),),
    }
    profile = DeviceProfile(rates, 4e10, 1e-6, 1e-5, Link(1e9, 0.0), Link(1e9, 0.0), threads=2,
                            measured="2026-01-02T03:04:05Z")
    cpu = Device("CPU", "test CPU", "cpu", "CPU", 1 << 30, 2 << 30, profile=profile)
    assert command.profile_line(cpu) == ("f16 products 100 GFLOP/s (190 in sdplan's bf16 kernel), bf16 products "
                                         "200 GFLOP/s, memory 40.0 GB/s (measured 2026-01-02T03:04:05Z with 2 threads)")
    lines = ["by FLASH_ATTN_EXT: width 8 2.0 ns/score, 12 60, 40 3.2, 64 4.0; over 77 keys: width 40 8.0, 64 10",
             "by bf16_attention: width 40 0.5 ns/score"]
    assert command.attention_lines(cpu) == lines
    # a kernel measured with two key dtypes names the dtype
    two = Device("CPU", "x", "cpu", "CPU", 1, 2, profile=DeviceProfile(
        {"attn/FLASH_ATTN_EXT@d64:f16": ((1.0, 2.56e11),), "attn/FLASH_ATTN_EXT@d64:f32": ((1.0, 1.28e11),)},
        4e10, 0.0, 0.0, Link(1e9, 0.0), Link(1e9, 0.0)))
    assert command.attention_lines(two) == ["by FLASH_ATTN_EXT (f16): width 64 1.0 ns/score",
                                            "by FLASH_ATTN_EXT (f32): width 64 2.0 ns/score"]
    # no profile, or the stated defaults (no kernel measured): no attention line
    assert command.attention_lines(Device("CPU", "x", "cpu", "CPU", 1, 2)) == []
    assert command.attention_lines(Device("CPU", "x", "cpu", "CPU", 1, 2, profile=default_profile("cpu"))) == []
    feat = {"ggml_version": "0.0.1", "rpc": False, "llamafile": False, "cpu_features": {}, "warnings": []}
    command.render_table(Inventory((cpu,)), feat)
    out = capsys.readouterr().out
    assert "CPU speed: f16 products 100 GFLOP/s" in out
    for line in lines:
        assert f"CPU attention {line}\n" in out
