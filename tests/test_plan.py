"""Tests of :mod:`sdplan.core.planning.plan` (resolution), :mod:`sdplan.core.planning.placement` (edits,
canonical strings, flag glue), :mod:`sdplan.core.planning.sdcli` (argv writer, importer) and the
``sdplan plan`` command."""

from __future__ import annotations

import argparse
import json
from decimal import Decimal

import numpy as np
import pytest
from sdplan.core import cli
from sdplan.core.commands import plan as plan_cmd
from sdplan.core.errors import PlanError
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.modules import MODULES, PLACED_MODULES
from sdplan.core.planning.placement import (
    Placement,
    add_placement_arguments,
    placement_from_namespace,
)
from sdplan.core.planning.plan import resolve, split_ranges
from sdplan.core.planning.plan_types import Range
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.sdcli import import_sdcli_command, sdcli_argv, sdcli_command_line
from sdplan.core.runtime.devices import fallback_inventory

GIB = 1 << 30
INV = Inventory((
    Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB),
    Device("CUDA1", "RTX 3060", "gpu", "CUDA", 11 * GIB, 12 * GIB),
    Device("CPU", "CPU", "cpu", "CPU", 48 * GIB, 64 * GIB),
))


def devices(plan, module: str) -> list[str]:
    return plan.modules[module].devices


def test_default_plan_everything_on_default_device() -> None:
    p = resolve([], INV)
    assert all(devices(p, m) == ["CUDA0"] for m in MODULES)
    assert p.budgets == {"CUDA0": 0, "CUDA1": 0, "CPU": 0}
    assert (p.backend, p.params_backend, p.max_vram) == ("CUDA0", "", "")
    assert p.warnings == []


def test_module_entry_beats_default_in_any_order() -> None:
    p = resolve(["--backend", "te=cpu,all=cuda1"], INV)
    assert devices(p, "te") == ["CPU"] and devices(p, "vae") == ["CUDA1"]
    assert p.backend == "CUDA1,te=CPU"


def test_default_token_in_module_value_means_default_device() -> None:
    p = resolve(["--backend", "cuda1,te=auto"], INV)
    assert devices(p, "te") == ["CUDA0"] and devices(p, "vae") == ["CUDA1"]
    assert p.backend == "CUDA1,te=CUDA0"


def test_overridden_entries_are_still_checked_first_in_text_order() -> None:
    with pytest.raises(PlanError) as err:
        resolve(["--backend", "te=cudaX,te=cpu"], INV)
    assert err.value.code == "device_not_found" and err.value.span == (3, 8)
    with pytest.raises(PlanError) as err:
        resolve(["--params-backend", "nope,cpu"], INV)
    assert err.value.flag == "--params-backend" and err.value.span == (0, 4)


def test_default_list_splits_diffusion_and_te_only() -> None:
    p = resolve(["--backend", "cuda0&cuda1"], INV)
    assert devices(p, "diffusion") == ["CUDA0", "CUDA1"] == devices(p, "te")
    assert all(devices(p, m) == ["CUDA0"] for m in MODULES[2:])
    (w,) = p.warnings
    assert w.code == "split_not_supported" and "vae" in w.message


def test_split_not_supported_and_split_with_cpu() -> None:
    p = resolve(["--backend", "vae=cuda1&cuda0,te=cuda0&cpu"], INV)
    assert devices(p, "vae") == ["CUDA1"] and devices(p, "te") == ["CUDA0"]
    assert p.warning_codes() == ["split_with_cpu", "split_not_supported"]  # module order
    assert "--params-backend te=cpu" in p.warnings[0].message


def test_params_residency_modes() -> None:
    p = resolve(["--backend", "diffusion=cuda0&cuda1", "--params-backend", "cuda0,vae=disk"], INV)
    assert p.modules["diffusion"].params.to_json() == {"mode": "device", "device": "CUDA0"}
    assert p.modules["te"].params.to_json() == {"mode": "runtime", "device": None}
    assert p.modules["vae"].params.to_json() == {"mode": "disk", "device": None}
    assert p.params_backend == "CUDA0,vae=disk"


def test_budgets_spare_disabled_and_cpu_silent() -> None:
    p = resolve(["--max-vram", "-1,cuda1=-12,cpu=4"], INV)
    assert p.budgets == {"CUDA0": 21 * GIB, "CUDA1": 0, "CPU": 0}
    assert p.warning_codes() == ["max_vram_disabled"]
    assert p.max_vram == "-1,CUDA1=-12,CPU=4"
    assert resolve(["--max-vram", "auto=4,gpu=5"], INV).budgets["CUDA0"] == 5 * GIB
    assert resolve(["--max-vram", "0"], INV).budgets["CUDA0"] == 0


def test_max_vram_last_flag_wins_and_ambiguous_key() -> None:
    ns = _ns(["--max-vram", "4", "--max-vram", "6"])
    assert resolve(ns, INV).budgets["CUDA0"] == 6 * GIB
    with pytest.raises(PlanError) as err:
        resolve(["--max-vram", "c=4"], INV)
    assert err.value.code == "ambiguous_device"


def test_stream_layers_active_only_with_cpu_params_and_budget() -> None:
    assert resolve(["--offload-to-cpu", "--max-vram", "6", "--stream-layers"], INV).warnings == []
    assert resolve(["--offload-to-cpu", "--stream-layers"], INV).warning_codes() == [
        "stream_layers_inactive"]


def test_compat_flags_and_deprecation() -> None:
    p = resolve(["--clip-on-cpu", "--vae-on-cpu", "--control-net-cpu", "--backend", "cuda1"], INV)
    assert [devices(p, m)[0] for m in ("te", "vae", "controlnet", "diffusion")] == [
        "CPU", "CPU", "CPU", "CUDA1"]
    assert p.warning_codes() == ["deprecated_flag"] * 3
    assert p.backend == "CUDA1,te=CPU,vae=CPU,controlnet=CPU"


def test_compat_entries_have_null_spans_on_error() -> None:
    cpu_less = Inventory((Device("CUDA0", "g", "gpu", "CUDA", GIB, GIB),))
    with pytest.raises(PlanError) as err:
        resolve(["--clip-on-cpu"], cpu_less)
    assert err.value.code == "device_not_found" and err.value.span is None


def reference_ranges(blocks: list[int], other: int, free: list[int]) -> list[tuple[int, int]]:
    """Independent reading of spec section 8 with numpy floats (exact for these sizes)."""
    f = np.array(free, dtype=np.float64)
    w = np.maximum(f - 2 * GIB, f / 8)
    w[w <= 0] = 1
    share = np.floor((sum(blocks) + other) * w / w.sum())
    share[0] = max(share[0] - other, 0)
    owner, dev, run = [], 0, 0.0
    for b in blocks:
        if dev < len(free) - 1 and any(o == dev for o in owner) and run + b > share[dev]:
            dev, run = dev + 1, 0.0
        owner.append(dev)
        run += b
    return [(owner.index(d), len(owner) - 1 - owner[::-1].index(d)) for d in sorted(set(owner))]


@pytest.mark.parametrize("seed", range(20))
def test_split_ranges_match_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    blocks = [int(x) * (1 << 20) for x in rng.integers(0, 2048, rng.integers(1, 40))]
    free = [int(x) * (1 << 20) for x in rng.integers(0, 24 * 1024, rng.integers(2, 6))]
    other = int(rng.integers(0, 2048)) * (1 << 20)
    names = [f"D{i}" for i in range(len(free))]
    got = split_ranges(names, free, ModuleProfile(tuple(blocks), other))
    assert [(r.first_block, r.last_block) for r in got] == reference_ranges(blocks, other, free)
    assert sum(r.bytes for r in got) == sum(blocks)


def test_ranges_in_plan_with_other_bytes_on_main_device() -> None:
    prof = Profile({"diffusion": ModuleProfile((GIB,) * 10, GIB)})
    p = resolve(["--backend", "diffusion=cuda1&cuda0"], INV, prof)
    d = p.modules["diffusion"]
    assert d.ranges == [Range("CUDA1", 0, 1, 2 * GIB), Range("CUDA0", 2, 9, 8 * GIB)]
    assert d.main_other_bytes == GIB
    assert p.to_json()["modules"]["diffusion"]["ranges"][0] == {
        "device": "CUDA1", "first_block": 0, "last_block": 1, "bytes": 2 * GIB}


def test_profile_without_module_keeps_split_without_ranges() -> None:
    p = resolve(["--backend", "te=cuda0&cuda1"], INV, Profile({}))
    assert devices(p, "te") == ["CUDA0", "CUDA1"] and p.modules["te"].ranges == []


def test_json_has_every_module_and_device() -> None:
    out = resolve(["--backend", "te=cpu"], INV).to_json()
    assert out["ok"] is True and list(out["modules"]) == list(PLACED_MODULES)
    assert set(out["budgets"]) == {"CUDA0", "CUDA1", "CPU"}
    assert out["modules"]["te"] == {"devices": ["CPU"], "ranges": [],
                                    "params": {"mode": "runtime", "device": None}}


# ---------------------------------------------------------------- placement edits
def test_edits_are_values_and_write_canonical_strings() -> None:
    base = resolve([], INV).placement
    edited = (base.assign("vae", "CPU").add_split_device("diffusion", "CUDA1")
              .set_residency("te", "disk").set_budget("CUDA1", -2).set_budget(None, 6))
    assert base.to_strings() == {"backend": "CUDA0", "params_backend": "", "max_vram": ""}
    assert edited.to_strings() == {"backend": "CUDA0,diffusion=CUDA0&CUDA1,vae=CPU",
                                   "params_backend": "te=disk", "max_vram": "6,CUDA1=-2"}
    assert edited.remove_split_device("diffusion", "CUDA1").runtime["diffusion"].text() == "CUDA0"
    assert edited.set_budget("CUDA1", None).budgets == ()
    assert edited.set_default("CUDA1").assign("vae", "CUDA1").to_strings()["backend"] == \
        "CUDA1,diffusion=CUDA0&CUDA1"
    p = resolve(edited, INV)
    assert p.budgets == {"CUDA0": 6 * GIB, "CUDA1": 9 * GIB, "CPU": 0}
    assert edited == Placement.from_strings("CUDA0,diffusion=CUDA0&CUDA1,vae=CPU", "te=disk",
                                            "6,CUDA1=-2")
    with pytest.raises(PlanError):
        base.add_split_device("vae", "CUDA1")
    with pytest.raises(PlanError):
        base.set_budget("CUDA0", "6GB")


def test_residency_runtime_under_params_default_is_written_as_runtime_device() -> None:
    pl = resolve(["--offload-to-cpu", "--backend", "vae=cuda1"], INV).placement
    pl = pl.set_residency("vae", "runtime")
    assert pl.to_strings()["params_backend"] == "CPU,vae=CUDA1"
    assert resolve(pl, INV).modules["vae"].params.mode == "runtime"
    split = pl.add_split_device("diffusion", "CUDA1")
    with pytest.raises(PlanError):
        split.set_residency("diffusion", "runtime")


def _ns(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_placement_arguments(parser)
    return parser.parse_args(argv)


def test_namespace_joins_repeated_flags() -> None:
    pl = placement_from_namespace(_ns(["--backend", "te=cpu", "--backend", "vae=cpu",
                                       "--rpc-servers", "a:1", "--rpc-servers", "b:2,c:3"]))
    assert pl.texts["--backend"] == "te=cpu,vae=cpu"
    assert pl.rpc_servers == ("a:1", "b:2", "c:3")
    with pytest.raises(PlanError) as err:
        placement_from_namespace(_ns(["--backend", "te=cpu", "--backend", "vea=cpu"]))
    assert err.value.span == (7, 10)


# ---------------------------------------------------------------- sd-cli
def test_sdcli_argv_pinned() -> None:
    pl = resolve(["--backend", "diffusion=cuda0&cuda1,te=cpu", "--offload-to-cpu",
                  "--max-vram", "-1", "--stream-layers", "--rpc-servers", "h:1,h:2"], INV).placement
    argv = sdcli_argv(pl, {"vae": "ae.safetensors", "diffusion_model": "flux.gguf",
                           "clip_l": "clip_l.safetensors", "t5xxl": ["a.gguf", "b.gguf"]},
                      {"seed": 42, "prompt": "a cat", "width": 1024, "cfg_scale": 1.0,
                       "guidance": 3.5, "height": 768})
    assert argv == [
        "--diffusion-model", "flux.gguf", "--clip_l", "clip_l.safetensors",
        "--t5xxl", "a.gguf", "--t5xxl", "b.gguf", "--vae", "ae.safetensors",
        "--backend", "CUDA0,diffusion=CUDA0&CUDA1,te=CPU", "--params-backend", "CPU",
        "--max-vram", "-1", "--rpc-servers", "h:1,h:2", "--stream-layers",
        "--prompt", "a cat", "--width", "1024", "--height", "768", "--cfg-scale", "1",
        "--seed", "42", "--guidance", "3.5"]


def test_sdcli_argv_minimal_and_every_generation_flag() -> None:
    pl = Placement()
    assert sdcli_argv(pl, {}, {}) == []
    gen = {"prompt": "p", "negative_prompt": "n", "width": 1, "height": 2, "steps": 3,
           "cfg_scale": 4.5, "seed": -1, "sampling_method": "euler", "scheduler": "karras",
           "batch_count": 5, "output": "o.png", "clip_skip": 2, "guidance": 6}
    assert sdcli_argv(pl, {"model": "m.safetensors", "taesd": "t", "control_net": "c",
                           "upscale_model": "u", "photo_maker": "pm", "clip_vision": "cv",
                           "llm": "l", "clip_g": "g"}, gen) == [
        "--model", "m.safetensors", "--clip_g", "g", "--llm", "l", "--taesd", "t",
        "--control-net", "c", "--upscale-model", "u", "--photo-maker", "pm",
        "--clip_vision", "cv",
        "--prompt", "p", "--negative-prompt", "n", "--width", "1", "--height", "2",
        "--steps", "3", "--cfg-scale", "4.5", "--seed", "-1", "--sampling-method", "euler",
        "--scheduler", "karras", "--batch-count", "5", "--output", "o.png", "--clip-skip", "2",
        "--guidance", "6"]
    with pytest.raises(ValueError, match="lora"):
        sdcli_argv(pl, {"lora": "x"}, {})
    with pytest.raises(ValueError, match="control_strength"):
        sdcli_argv(pl, {}, {"control_strength": 0.5})
    assert sdcli_argv(pl, {}, {"init_img": "i.png", "strength": 0.5, "mask": "m.png", "lora_model_dir": "l"}) == [
        "--lora-model-dir", "l", "--init-img", "i.png", "--mask", "m.png", "--strength", "0.5"]


def test_import_sdcli_command() -> None:
    text = ("./build/bin/sd-cli -m 'my model.safetensors' --vae=ae.sft \\\n"
            " --backend te=cpu --backend vae=cuda1 --clip-on-cpu --max-vram -1 -p 'a \"red\" cat'"
            " -W 768 --steps 20 --cfg-scale 7.5 -s -1 --vae-tiling --lora-model-dir loras")
    imp = import_sdcli_command(text)
    assert imp.model_files == {"model": "my model.safetensors", "vae": "ae.sft"}
    assert imp.generation == {"prompt": 'a "red" cat', "width": 768, "steps": 20,
                              "cfg_scale": 7.5, "seed": -1, "lora_model_dir": "loras"}
    assert imp.unknown_args == ["--vae-tiling"]
    p = resolve(imp.placement, INV)
    assert devices(p, "te") == ["CPU"] and devices(p, "vae") == ["CUDA1"]
    assert p.budgets["CUDA0"] == 21 * GIB and p.warning_codes() == ["deprecated_flag"]


def test_import_round_trips_written_command() -> None:
    pl = resolve(["--backend", "cuda1,te=cpu", "--params-backend", "vae=disk"], INV).placement
    line = sdcli_command_line(pl, {"model": "m.gguf"}, {"prompt": "x y", "steps": 4})
    imp = import_sdcli_command(line)
    assert imp.placement == pl and imp.model_files == {"model": "m.gguf"}
    assert imp.generation == {"prompt": "x y", "steps": 4} and imp.unknown_args == []


@pytest.mark.parametrize("text,code", [("sd -W big", "invalid_assignment"),
                                       ("sd --backend", "invalid_assignment"),
                                       ("sd -p 'open", "invalid_assignment"),
                                       ("sd --backend vea=cpu", "unknown_module")])
def test_import_errors(text: str, code: str) -> None:
    with pytest.raises(PlanError) as err:
        import_sdcli_command(text)
    assert err.value.code == code


def test_from_args_rejects_other_flags() -> None:
    with pytest.raises(PlanError):
        Placement.from_args(["--steps", "3"])
    assert Placement.from_args(["--max-vram", "4"]).budget_default == Decimal(4)


# ---------------------------------------------------------------- the command
def test_command_json_and_error(tmp_path, capsys) -> None:
    inv_file = tmp_path / "inv.json"
    inv_file.write_text(json.dumps(INV.to_json()))
    assert cli.main(["plan", "--devices", str(inv_file), "--backend", "te=cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backend"] == "CUDA0,te=CPU" and out["modules"]["te"]["devices"] == ["CPU"]
    assert cli.main(["plan", "--devices", str(inv_file), "--backend", "te=cpu,vea=x",
                     "--json"]) == 2
    err = json.loads(capsys.readouterr().out)
    assert err == {"ok": False, "error": {"code": "unknown_module", "span": [7, 10],
                                          "message": "--backend: unknown module 'vea' "
                                                     "(did you mean vae?)"}}
    assert cli.main(["plan", "--devices", str(tmp_path / "missing.json"), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["code"] == "invalid_inventory"


def test_command_tables(tmp_path, capsys) -> None:
    inv_file = tmp_path / "inv.json"
    inv_file.write_text(json.dumps(INV.to_json()))
    assert cli.main(["plan", "--devices", str(inv_file), "--backend", "cuda0&cuda1",
                     "--max-vram", "6"]) == 0
    out = capsys.readouterr().out
    assert "split_not_supported" in out and "--backend CUDA0&CUDA1" in out
    assert "RTX 3060" in out and "6.00" in out
    assert cli.main(["plan", "--devices", str(inv_file), "--backend", "te=cuda9"]) == 2
    err = capsys.readouterr().err
    # not a terminal: one line that names the span (carets only on a terminal)
    assert err.count("\n") == 1 and err.startswith("error [device_not_found]: ")
    assert "(at --backend characters 4-8)" in err


def _table(text: str, title: str) -> dict[str, dict[str, str]]:
    """The rows of the printed table ``title`` as ``{first cell: {column: cell}}``."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip() == title)
    head = [c.strip() for c in lines[start + 2].strip("┃").split("┃")]
    rows: dict[str, dict[str, str]] = {}
    for ln in lines[start + 4:]:
        if not ln.startswith("│"):
            break
        cells = [c.strip() for c in ln.strip("│").split("│")]
        rows[cells[0]] = dict(zip(head, cells, strict=True))
    return rows


@pytest.mark.parametrize(("max_vram", "cuda0", "cuda1"), [
    ("cuda1=3", "-", "3.00"),  # CUDA0 without a budget
    ("cuda0=0,cuda1=3", "-", "3.00"),  # 0 disables CUDA0's (spec section 7): none, as unset
    ("cuda0=0.001,cuda1=2.5,cpu=4", "0.00", "2.50"),  # set, however small; the CPU has none
])
def test_memory_table_shows_a_budget_only_where_one_is_set(tmp_path, capsys, max_vram: str,
                                                          cuda0: str, cuda1: str) -> None:
    inv_file, prof = tmp_path / "inv.json", tmp_path / "p.json"
    inv_file.write_text(json.dumps(INV.to_json()))
    prof.write_text(json.dumps(Profile({"diffusion": ModuleProfile((GIB // 4,) * 4, 0),
                                        "te": ModuleProfile((), GIB // 8),
                                        "vae": ModuleProfile((), GIB // 16)}).to_json()))
    assert cli.main(["plan", "--devices", str(inv_file), "--profile", str(prof), "--backend",
                     "te=cpu,diffusion=cuda0,vae=cuda1", "--max-vram", max_vram]) == 0
    out = capsys.readouterr().out
    memory = _table(out, "Memory estimate (GiB)")
    assert {d: row["budget"] for d, row in memory.items()} == {"CUDA0": cuda0, "CUDA1": cuda1,
                                                               "CPU": "-"}
    assert memory["CPU"]["weights"] == "0.12" and memory["CUDA1"]["weights"] == "0.06"
    devices = _table(out, "Devices")  # the same budgets as the devices table shows them
    assert {d: row["budget GiB"] for d, row in devices.items()} == {
        "CUDA0": cuda0, "CUDA1": cuda1, "CPU": "-"}


def test_command_without_devices_falls_back_to_cpu(monkeypatch, capsys) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "sdplan._ggml", None)  # a build without the native module
    assert cli.main(["plan", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["budgets"].keys() == {"CPU"}
    assert out["warnings"][0]["code"] == "live_inventory_unavailable"
    assert fallback_inventory().devices[0].total > 0


def test_command_reads_model_flags_and_adds_fit(tmp_path, monkeypatch, capsys) -> None:

    inv_file = tmp_path / "inv.json"
    inv_file.write_text(json.dumps(INV.to_json()))
    seen: dict = {}

    class FakeModels:
        def profile(self) -> Profile:
            return Profile({"diffusion": ModuleProfile((GIB,) * 4, 0)})

    def fake_read(flags, headers=None):
        seen["flags"] = flags
        return FakeModels()

    class Fit:
        def __init__(self, **kw: object) -> None:
            self.kw = kw

        def to_json(self) -> dict:
            return {"fits": True, **self.kw, "devices": {"CUDA0": {"total": GIB}}}

    def fake_estimate(plan, profile, inventory, *, width, height, batch, engine="sdplan", measured=None,
                      frames=1):
        assert inventory == INV and profile.get("diffusion") is not None
        return Fit(width=width, height=height, batch=batch)

    from sdplan.core.commands import options

    monkeypatch.setattr(options, "read_checked", fake_read)
    monkeypatch.setattr(plan_cmd, "estimate_plan", fake_estimate)
    assert cli.main(["plan", "--devices", str(inv_file), "--diffusion-model", "f.gguf",
                     "--clip_l", "c.sft", "--t5xxl", "t.gguf", "--backend",
                     "diffusion=cuda0&cuda1", "-W", "768", "-b", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert seen["flags"] == {"diffusion_model": ["f.gguf"], "clip_l": ["c.sft"],
                             "t5xxl": ["t.gguf"]}
    assert out["fit"] == {"fits": True, "width": 768, "height": 512, "batch": 2,
                          "devices": {"CUDA0": {"total": GIB}}}
    assert [r["device"] for r in out["modules"]["diffusion"]["ranges"]] == ["CUDA0", "CUDA1"]
    assert out["modules"]["diffusion"]["main_other_bytes"] == 0
    assert cli.main(["plan", "--devices", str(inv_file), "--profile", str(tmp_path / "p.json")]
                    ) == 2  # a missing profile file is a model-file error
    (tmp_path / "p.json").write_text(json.dumps(Profile(
        {"diffusion": ModuleProfile((GIB,), 0)}).to_json()))
    capsys.readouterr()
    assert cli.main(["plan", "--devices", str(inv_file), "--profile", str(tmp_path / "p.json")]
                    ) == 0
    text = capsys.readouterr().out
    assert "Memory estimate" in text and "fits" in text
    # a profile and model files together are two model sources: refused, naming the flag
    assert cli.main(["plan", "--devices", str(inv_file), "-m", "m.sft", "--profile",
                     str(tmp_path / "p.json"), "--json"]) == 2
    err = json.loads(capsys.readouterr().out)["error"]
    assert err["code"] == "conflicting_model_sources" and "--profile" in err["message"]


def test_entry_equal_to_default_list_shares_the_default_warning() -> None:
    """A module written with the default's device list warns like the inherited ones, so the
    canonical strings (which drop that entry) resolve to the same warnings."""
    inv = Inventory.from_json({"devices": [
        {"name": "CUDA0", "type": "gpu", "registry": "CUDA", "free": 8 << 30, "total": 8 << 30},
        {"name": "CUDA1", "type": "gpu", "registry": "CUDA", "free": 8 << 30, "total": 8 << 30}]})
    plan = resolve(Placement.from_strings("CUDA1&cuda0,adetailer=CUDA1&cuda0"), inv)
    msgs = [w.message for w in plan.warnings if w.code == "split_not_supported"]
    assert len(msgs) == 1 and "detector" in msgs[0] and "clip_vision" in msgs[0]
    again = resolve(Placement.from_strings(plan.backend), inv)
    assert plan.backend == "CUDA1&CUDA0"
    assert [(w.code, w.message) for w in again.warnings] == [(w.code, w.message) for w in plan.warnings]


@pytest.mark.parametrize("flag", ["-W", "-H", "-b"])
def test_plan_sizes_must_be_positive(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", "--model-profile", "sd15-f16", flag, "0"]) == 2
    err = capsys.readouterr().err
    assert "must be at least 1, got 0" in err and len(err.strip().splitlines()) == 1
