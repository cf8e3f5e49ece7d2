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
