"""Tests of :mod:`sdplan.core.planning.assignment`: module names, entry splitting with spans, device
lists, GiB numbers and device-name resolution (spec sections 1-4, 7)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from sdplan.core.errors import PlanError
from sdplan.core.planning.assignment import (
    DeviceIndex,
    Ref,
    format_gib,
    gib_to_bytes,
    module_hint,
    normalize_module,
    parse_gib,
    parse_params_value,
    parse_runtime_value,
    split_entries,
)
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.modules import MODULES, SPLITTABLE

GIB = 1 << 30


def inv(*specs: tuple[str, str, str]) -> Inventory:
    return Inventory(tuple(Device(n, n, t, r, 8 * GIB, 16 * GIB) for n, t, r in specs))


D1 = inv(("CUDA0", "gpu", "CUDA"), ("CUDA1", "gpu", "CUDA"), ("CPU", "cpu", "CPU"))


def test_module_order_and_splittable() -> None:
    assert MODULES == ("diffusion", "te", "clip_vision", "vae", "controlnet", "photomaker",
                       "upscaler", "detector")
    assert SPLITTABLE == ("diffusion", "te")


@pytest.mark.parametrize("key,module", [
    ("Clip-Vision", "clip_vision"), ("clip_vision", "clip_vision"), ("CLIPVISION", "clip_vision"),
    (" T5_XXL ", "te"), ("llm", "te"), ("first_stage", "vae"), ("TAE", "vae"),
    ("hires", "upscaler"), ("pm-id", "photomaker"), ("yolo", "detector"), ("DiT", "diffusion"),
    ("control", "controlnet"),
])
def test_normalize_module_aliases(key: str, module: str) -> None:
    assert normalize_module(key) == module


@pytest.mark.parametrize("key", ["clip_l", "clip_g", "taesd", "auto", "cpu", "gpu", "all",
                                 "default", "*", "a_ll", ""])
def test_not_modules(key: str) -> None:
    assert normalize_module(key) is None


def test_unknown_module_has_hint_and_span_of_key() -> None:
    text = "te=cpu,vea=cuda0"
    with pytest.raises(PlanError) as err:
        split_entries(text, "--backend")
    assert err.value.code == "unknown_module"
    assert "did you mean vae?" in str(err.value)
    assert err.value.span == (7, 10) and text[7:10] == "vea"
    assert module_hint("zzzzzz") == ""


def test_split_entries_spans_skip_empty_parts_and_trim() -> None:
    text = " ,, cpu , te = cuda0 ,"
    e = split_entries(text, "--backend")
    assert [(x.module, x.value) for x in e] == [(None, "cpu"), ("te", "cuda0")]
    assert text[slice(*e[0].span)] == "cpu"
    assert text[slice(*e[1].key.span)] == "te"
    assert text[slice(*e[1].value_span)] == "cuda0"
    assert text[slice(*e[1].span)] == "te = cuda0"


def test_default_keys_compared_before_deleting_dashes() -> None:
    e = split_entries("ALL=cuda1,*=cpu,Default=cuda0", "--backend")
    assert [x.module for x in e] == [None, None, None]
    with pytest.raises(PlanError) as err:
        split_entries("a_ll=cpu", "--backend")
    assert err.value.code == "unknown_module"


@pytest.mark.parametrize("text,span", [("te=", (0, 3)), ("cpu, =cuda0", (5, 11))])
def test_empty_key_or_value(text: str, span: tuple[int, int]) -> None:
    with pytest.raises(PlanError) as err:
        split_entries(text, "--backend")
    assert err.value.code == "invalid_assignment" and err.value.span == span


def test_prefix_entries_have_null_spans() -> None:
    e = split_entries("te=cuda0", "--backend", prefix=["vae=cpu", "te=cpu"])
    assert [x.span for x in e] == [None, None, (0, 8)]


def test_first_equals_splits_key_and_value() -> None:
    (e,) = split_entries("te=cpu=1", "--backend")
    assert (e.module, e.value) == ("te", "cpu=1")


def _entry(text: str):
    return split_entries(text, "--backend")[0]


def test_device_lists() -> None:
    text = "diffusion= cuda0 & &CUDA1&"
    v = parse_runtime_value(_entry(text), "--backend", text)
    assert [r.text for r in v.refs] == ["cuda0", "CUDA1"] and v.is_list
    assert [text[slice(*r.span)] for r in v.refs] == ["cuda0", "CUDA1"]


@pytest.mark.parametrize("text,code,piece", [
    ("diffusion= & ", "invalid_device_list", "&"),
    ("diffusion=cuda0&auto", "default_in_device_list", "auto"),
    ("diffusion=cuda0& Disk", "disk_not_runtime", "Disk"),
    ("disk", "disk_not_runtime", "disk"),
])
def test_device_list_errors(text: str, code: str, piece: str) -> None:
    with pytest.raises(PlanError) as err:
        parse_runtime_value(_entry(text), "--backend", text)
    assert err.value.code == code
    assert text[slice(*err.value.span)] == piece


def test_params_values() -> None:
    assert parse_params_value(_entry(" DISK "), "--params-backend", " DISK ").kind == "disk"
    v = parse_params_value(_entry("te=cpu"), "--params-backend", "te=cpu")
    assert (v.kind, v.ref.text) == ("device", "cpu")
    with pytest.raises(PlanError) as err:
        parse_params_value(_entry("cuda0&"), "--params-backend", "cuda0&")
    assert err.value.code == "params_device_list"


@pytest.mark.parametrize("text,gib", [("6.5", "6.5"), (".5", "0.5"), ("5.", "5"), ("+4", "4"),
                                      ("1e1", "10"), ("-1", "-1"), ("0", "0")])
def test_gib_numbers(text: str, gib: str) -> None:
    value = parse_gib(text, "--max-vram", text, (0, len(text)))
    assert value == Decimal(gib) and format_gib(value) == gib


@pytest.mark.parametrize("text", ["6G", "6GB", "6 GiB", "inf", "nan", "0x10", "1_0", "-", ".",
                                  "e5", "Infinity", "1e", "--1"])
def test_gib_rejects_units_and_non_numbers(text: str) -> None:
    with pytest.raises(PlanError) as err:
        parse_gib(text, "--max-vram", text, (0, len(text)))
    assert err.value.code == "invalid_max_vram" and "plain number" in str(err.value)


def test_gib_to_bytes_exact_and_clamped() -> None:
    assert gib_to_bytes(Decimal("6.5")) == 6 * GIB + GIB // 2
    assert gib_to_bytes(Decimal("-1")) == -GIB
    assert gib_to_bytes(Decimal("1e999999999")) == 1 << 62


@pytest.mark.parametrize("text", ["1e400", "-1e400", "1e999999999", "4294967297"])
def test_gib_rejects_overflow(text: str) -> None:
    """An overflowing budget is an error naming the value, not a silent 2^32 GiB."""
    with pytest.raises(PlanError) as err:
        parse_gib(text, "--max-vram", text, (0, len(text)))
    assert err.value.code == "invalid_max_vram" and "out of range" in str(err.value)
    assert parse_gib("4294967296", "--max-vram", "", None) == Decimal(4294967296)


@pytest.mark.parametrize("value,name", [
    ("", "CUDA0"), ("AUTO", "CUDA0"), ("default", "CUDA0"), ("gpu", "CUDA0"), ("cuda", "CUDA0"),
    ("cpu", "CPU"), ("cuda1", "CUDA1"), (" Cuda1 ", "CUDA1"), ("cp", "CPU"),
])
def test_device_resolution(value: str, name: str) -> None:
    assert DeviceIndex(D1).resolve(Ref(value), "--backend", value) == name


@pytest.mark.parametrize("value,code", [("c", "ambiguous_device"), ("cu", "ambiguous_device"),
                                        ("cuda2", "device_not_found"), ("cpu0", "device_not_found"),
                                        ("RPC[192.0.2.1:50052]", "device_not_found")])
def test_device_resolution_errors(value: str, code: str) -> None:
    with pytest.raises(PlanError) as err:
        DeviceIndex(D1).resolve(Ref(value, (0, len(value))), "--backend", value)
    assert err.value.code == code and err.value.span == (0, len(value))
    if code == "ambiguous_device":
        assert "CUDA0" in str(err.value) and "CUDA1" in str(err.value)
    else:
        assert "available: CUDA0, CUDA1, CPU" in str(err.value)


def test_default_device_rules() -> None:
    assert DeviceIndex(inv(("Vulkan0", "igpu", "Vulkan"), ("Vulkan1", "gpu", "Vulkan"),
                           ("CPU", "cpu", "CPU"))).default == "Vulkan1"
    assert DeviceIndex(inv(("Vulkan0", "igpu", "Vulkan"), ("CPU", "cpu", "CPU"))).default \
        == "Vulkan0"
    assert DeviceIndex(inv(("BLAS", "accel", "BLAS"), ("CPU", "cpu", "CPU"))).default == "CPU"
    assert DeviceIndex(inv(("CPU", "cpu", "CPU"), ("RPC0", "gpu", "RPC"))).default == "RPC0"
    cpu_only = DeviceIndex(inv(("CPU", "cpu", "CPU")))
    with pytest.raises(PlanError) as err:
        cpu_only.resolve(Ref("gpu"), "--backend", "gpu")
    assert err.value.code == "device_not_found" and "no GPU" in str(err.value)


def test_metal_means_mtl_and_registry_beats_prefix() -> None:
    idx = DeviceIndex(inv(("MTL0", "gpu", "MTL"), ("BLAS", "accel", "BLAS"), ("CPU", "cpu", "CPU")))
    assert idx.resolve(Ref("metal"), "--backend", "metal") == "MTL0"
    assert idx.resolve(Ref("blas"), "--backend", "blas") == "BLAS"
    with pytest.raises(PlanError):
        idx.resolve(Ref("metal0"), "--backend", "metal0")
    many = DeviceIndex(inv(*[(f"CUDA{i}", "gpu", "CUDA") for i in range(12)]))
    assert many.resolve(Ref("cuda1"), "--backend", "cuda1") == "CUDA1"
    with pytest.raises(PlanError) as err:
        many.resolve(Ref("cuda1x"), "--max-vram", "cuda1x=3", not_found="unknown_max_vram_device")
    assert err.value.code == "unknown_max_vram_device"
