"""The desktop session without Qt (``sdplan.core.session``): the board's edits return
placements the session resolves and estimates, residency effects and the peak module, the
sd-cli command, a pasted command and a picture imported, a saved plan restored, a result
reused, snapshots restored whole, the engine request of the board's plan and the family's
refusal before loading. Qt is poisoned in the child that imports the session."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from sdplan.core.errors import PlanError, SdplanError
from sdplan.core.pipelines.stages.results import generation_text, save_png
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.session.runs import describe_params, run_record
from sdplan.core.session.session import Session
from sdplan.core.session.state import DEFAULT_GENERATION, sdcli_defaults

GIB = 1 << 30


def inventory() -> Inventory:
    return Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB),
                      Device("CUDA1", "RTX 3060", "gpu", "CUDA", 11 * GIB, 12 * GIB),
                      Device("CPU", "Ryzen 9 7950X", "cpu", "CPU", 48 * GIB, 64 * GIB)))


def flux() -> Profile:
    return Profile({"diffusion": ModuleProfile((300 << 20,) * 40, 100 << 20),
                    "te": ModuleProfile((200 << 20,) * 24, 300 << 20, {"t5xxl": 5 * GIB},
                                        "t5xxl"),
                    "vae": ModuleProfile((), 160 << 20)}, "flux1-dev.safetensors", "flux-dev")


def session(**kw) -> Session:
    notes: list[str] = []
    s = Session(inventory(), kw.pop("profile", flux()), kw.pop("placement", None),
                notify=notes.append, **kw)
    s.notes = notes  # type: ignore[attr-defined]
    return s


def test_the_session_imports_without_qt() -> None:
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split('.')[0] in ('PySide6', 'shiboken6'):
                    raise ImportError('blocked: ' + name)
        sys.meta_path.insert(0, Block())
        from sdplan.core.planning.inventory import Device, Inventory
        from sdplan.core.session.session import Session
        s = Session(Inventory((Device('CUDA0', 'g', 'gpu', 'CUDA', 8 << 30, 8 << 30),
                               Device('CPU', 'cpu', 'cpu', 'CPU', 8 << 30, 8 << 30))))
        s.apply(s.assign('vae', 'CPU'))
        print(s.plan.backend, s.command_line().split()[0])
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["CUDA0,vae=CPU", "sd-cli"]


def test_edits_return_placements_and_apply_resolves_and_estimates() -> None:
    s = session()
    before = s.placement
    new = s.assign("vae", "CPU")
    assert s.placement == before  # an edit is a proposal until applied
    s.apply(new)
    assert s.plan.modules["vae"].devices == ["CPU"] and s.plan.backend == "CUDA0,vae=CPU"
    want = estimate_plan(resolve(new, inventory(), flux()), flux(), inventory(),
                         width=1024, height=1024, batch=1, engine="sdplan")
    assert s.fit.devices["CPU"].total == want.devices["CPU"].total
    s.apply(s.add_split_device("diffusion", "CUDA1"))
    assert s.plan.modules["diffusion"].devices == ["CUDA0", "CUDA1"]
    with pytest.raises(PlanError, match="vae cannot run on several devices"):
        s.add_split_device("vae", "CUDA1")
    s.apply(s.remove_split_device("diffusion", "CUDA1"))
    assert s.plan.modules["diffusion"].devices == ["CUDA0"]
    s.apply(s.set_residency("te", "disk"))
    assert s.plan.modules["te"].params.mode == "disk" and s.plan.params_backend == "te=disk"
    s.apply(s.set_budget("CUDA0", 8.004))
    assert s.plan.max_vram == "CUDA0=8"
    s.apply(s.set_budget("CUDA0", 0))
    assert s.plan.max_vram == ""
    s.apply(s.follow_default("vae"))
    assert "vae" not in s.plan.backend
    with pytest.raises(PlanError):
        s.resolve(Placement.from_strings("NOPE9"))


def test_residency_effects_and_the_peak_module_from_the_estimate() -> None:
    s = session()
    effects = s.residency_effects("te")
    assert set(effects) == {"device", "disk"}  # runtime is where it is now
    for mode, dev in (("device", "CPU"), ("disk", None)):
        alt = estimate_plan(resolve(s.placement.set_residency("te", mode, dev), inventory(), flux()),
                            flux(), inventory(), width=1024, height=1024, batch=1)
        assert effects[mode]["CUDA0"] == s.fit.devices["CUDA0"].total - alt.devices["CUDA0"].total
    assert effects["disk"]["CUDA0"] > 2 * GIB  # te's weights leave the GPU between uses
    module, part = s.peak_module("CUDA0")
    assert module in ("diffusion", "te", "vae") and part in ("compute", "staging")
    assert s.peak_module("CUDA1") is None  # nothing runs there
    assert session(profile=None).residency_effects("te") == {}


def test_strings_parse_check_and_the_command_line() -> None:
    s = session()
    placement, plan = s.parse_strings("CUDA1,vae=CPU", "te=disk", "CUDA1=6")
    assert plan.modules["diffusion"].devices == ["CUDA1"] and placement.to_strings()["max_vram"] == "CUDA1=6"
    fit = s.estimate_of(plan)
    want = estimate_plan(plan, flux(), inventory(), width=1024, height=1024, batch=1)
    assert fit is not None and fit.devices["CUDA1"].total == want.devices["CUDA1"].total
    with pytest.raises(PlanError) as err:
        s.parse_strings("diffusion=CUDA7", "", "")
    assert err.value.flag == "--backend"
    s.apply(placement)
    s.model_files = {"diffusion_model": ["/m/flux1-dev.safetensors"]}
    s.set_generation(prompt="a cat", steps=8)
    cmd = s.command_line()
    assert cmd.startswith("sd-cli ") and "--diffusion-model /m/flux1-dev.safetensors" in cmd
    assert cmd == ("sd-cli --diffusion-model /m/flux1-dev.safetensors --backend CUDA1,vae=CPU "
                   "--params-backend te=disk --max-vram CUDA1=6 --prompt 'a cat' --width 1024 "
                   "--height 1024 --steps 8 --cfg-scale 1 --seed 42 --batch-count 1")


def test_generation_size_changes_the_estimate_and_unchanged_settings_do_nothing() -> None:
    s = session()
    small = s.fit.devices["CUDA0"].total
    assert s.set_generation(width=1536, height=1536)
    assert s.fit.devices["CUDA0"].total > small
    assert not s.set_generation(width=1536)
    assert s.size() == (1536, 1536, 1)


def test_an_imported_command_and_its_snapshot_restored_whole(tmp_path: Path) -> None:
    s = session()
    s.set_generation(prompt="before")
    before = s.snapshot()
    unknown = s.import_command(
        f"sd-cli --diffusion-model {tmp_path}/z.gguf -p 'a fox' --steps 6 -W 768 "
        "--backend CUDA1 --vae-tiling --weird")
    assert unknown.unknown == ["--vae-tiling", "--weird"]
    assert s.model_files == {"diffusion_model": [f"{tmp_path}/z.gguf"]}
    assert s.generation["prompt"] == "a fox" and s.generation["steps"] == 6
    assert s.plan.backend == "CUDA1" and "--vae-tiling --weird" in s.command_line()
    assert unknown.notes == ["model files not on this machine: z.gguf; sizes unknown: no "
                             "built-in profile matches z.gguf"]
    assert s.profile is None and s.fit is None  # never the previous model's sizes
    assert s.missing_by_module() == {"diffusion": ["z.gguf"]} and s.modules() == ["diffusion"]
    s.restore(before)
    assert s.snapshot() == before
    assert s.model_files == {} and s.generation["prompt"] == "before"
    assert s.placement == before.placement
    assert s.profile == flux() and "--weird" not in s.command_line()


def test_a_bad_command_changes_nothing() -> None:
    s = session()
    before = s.snapshot()
    with pytest.raises(PlanError):
        s.import_command("sd-cli -m x.safetensors --backend 'CUDA0")  # unbalanced quote
    with pytest.raises(PlanError):
        s.import_command("sd-cli -m x.safetensors --backend CUDA9")
    assert s.snapshot() == before


def test_a_picture_restores_settings_and_placement(tmp_path: Path) -> None:
    pic = tmp_path / "p.png"
    text = generation_text({"prompt": "a red boat", "steps": 7, "seed": 99, "width": 512,
                            "height": 768, "sampling_method": "euler", "cfg_scale": 3.0},
                           {"model": [str(tmp_path / "gone.safetensors")]},
                           {"backend": "CUDA1", "params_backend": "te=disk"})
    save_png(np.zeros((4, 4, 3), np.uint8), pic, text)
    s = session()
    taken = s.import_png(pic)
    assert taken == ["settings", "model names only (gone.safetensors: open those files)",
                     "placement"]
    assert (s.generation["prompt"], s.generation["steps"], s.generation["seed"]) == ("a red boat", 7, 99)
    assert (s.generation["width"], s.generation["height"]) == (512, 768)
    assert s.plan.backend == "CUDA1" and s.plan.params_backend == "te=disk"
    blank = tmp_path / "blank.png"
    save_png(np.zeros((4, 4, 3), np.uint8), blank, {})
    with pytest.raises(SdplanError, match="no generation parameters"):
        s.import_png(blank)


def test_plan_json_round_trip_and_reuse_of_a_result(tmp_path: Path) -> None:
    s = session()
    s.apply(s.assign("vae", "CPU"))
    s.set_generation(prompt="saved", steps=12)
    s.add_module("upscaler")
    doc = json.loads(json.dumps(s.plan_json()))
    t = session()
    t.load_plan_json(doc)
    assert t.plan.backend == "CUDA0,vae=CPU" and t.generation["steps"] == 12
    assert "upscaler" in t.modules()
    with pytest.raises(PlanError, match="not an sdplan plan"):
        t.load_plan_json({"x": 1})
    notes = t.reuse_result({"prompt": "again", "seed": 5, "guidance": 3.5, "batch_count": 4},
                           {"model": [str(tmp_path / "gone.safetensors")]},
                           {"backend": "CUDA1"}, "flux-dev")
    assert notes == [f"model files not found here: {tmp_path / 'gone.safetensors'}"]
    assert t.generation["prompt"] == "again" and t.generation["seed"] == 5
    assert t.generation["guidance"] == 3.5  # FLUX.1 dev honours the distilled guidance
    assert t.generation["batch_count"] == DEFAULT_GENERATION["batch_count"]  # never reused
    assert t.plan.backend == "CUDA1"
    notes = t.reuse_result({"prompt": "x"}, None, {"backend": "CUDA9"})
    assert len(notes) == 1 and notes[0].startswith("placement not restored")


def test_devices_change_and_a_placement_that_no_longer_resolves_is_reset() -> None:
    s = session(placement=Placement.from_strings("CUDA1"))
    only = Inventory((Device("CUDA0", "A", "gpu", "CUDA", 22 * GIB, 24 * GIB),
                      Device("CPU", "c", "cpu", "CPU", 48 * GIB, 64 * GIB)))
    note = s.set_inventory(only)
    assert note == "placement reset: --backend: no device 'CUDA1' (available: CUDA0, CPU)"
    assert s.plan.modules["diffusion"].devices == ["CUDA0"]
    src = [only]
    s.inventory_source = lambda: src[0]
    assert s.refresh_inventory() == "same"
    src[0] = Inventory((Device("CUDA0", "A", "gpu", "CUDA", 10 * GIB, 24 * GIB),
                        Device("CPU", "c", "cpu", "CPU", 48 * GIB, 64 * GIB)))
    assert s.refresh_inventory() == "memory" and s.device("CUDA0").free == 10 * GIB
    assert s.hardware_json()["devices"][0]["name"] == "CUDA0"


def test_the_engine_request_carries_the_board_plan_and_refusals_come_first(tmp_path: Path) -> None:
    s = session()
    assert s.unavailable_reason({"width": 1024, "height": 1024}).startswith(
        "Planning for flux1-dev.safetensors without its files")
    s.model_files = {"diffusion_model": [str(tmp_path / "f.safetensors")],
                     "vae": [str(tmp_path / "ae.safetensors")],
                     "clip_l": [str(tmp_path / "c.safetensors")],
                     "t5xxl": [str(tmp_path / "t.safetensors")]}
    s.size_multiple = 16
    assert s.unavailable_reason({"width": 1000, "height": 1024}) == (
        "Size 1000 × 1024 px: this model draws sizes that are multiples of 16 px")
    assert "karras" not in (s.refusal({"sampling_method": "euler", "scheduler": "karras"}) or "")
    refusal = s.refusal({"sampling_method": "euler", "slg_scale": 2.5})
    assert refusal is not None and "slg" in refusal.lower() and "FLUX.1" in refusal
    assert s.unavailable_reason({"width": 512, "height": 512, "slg_scale": 2.5}) == refusal
    s.apply(s.assign("vae", "CPU"))
    req = s.request({"prompt": "a cat", "width": 512, "height": 512, "steps": 4, "seed": 1})
    assert req["plan"]["strings"]["backend"] == "CUDA0,vae=CPU"
    assert req["model_files"]["diffusion_model"] == [str(tmp_path / "f.safetensors")]
    assert req["prompt"] == "a cat" and req["steps"] == 4


def test_a_run_record_and_its_caption() -> None:
    s = session()
    s.model_files = {"model": ["/m/x.safetensors"]}
    s.apply(s.assign("vae", "CPU"))
    req = s.request({"prompt": "p", "steps": 5, "width": 64, "height": 64, "seed": 3})
    rec = run_record({"seed": 4}, req)  # an engine that gave its seed alone
    assert rec["params"]["seed"] == 4 and rec["params"]["steps"] == 5
    assert rec["params"]["prompt"] == "p" and rec["plan"]["backend"] == "CUDA0,vae=CPU"
    engine = run_record({"params": {"seed": 4}, "plan": {"backend": "CPU"}}, req)
    assert engine["plan"] == {"backend": "CPU"}  # the engine's word wins
    assert describe_params({"prompt": "p", "width": 64, "height": 64, "steps": 5,
                            "cfg_scale": 7.0, "seed": 4, "sampling_method": "euler",
                            "timings": {"total": 2.04}}) == \
        "“p”  ·  64×64  ·  steps 5  ·  CFG 7.0  ·  seed 4  ·  euler  ·  2.0 s"


def test_sdcli_defaults_per_family() -> None:
    assert sdcli_defaults("sd1")["width"] == 512 and sdcli_defaults("sd1")["cfg_scale"] == 7.0
    assert sdcli_defaults("sdxl")["width"] == 1024
    assert sdcli_defaults("flux-schnell")["steps"] == 4 and sdcli_defaults("flux-schnell")["cfg_scale"] == 1.0
    assert sdcli_defaults(None)["sampling_method"] == "euler_a"


def test_title_names_the_pasted_model_even_unread() -> None:
    s = session()
    assert s.title() == ("flux1-dev.safetensors", "flux-dev")
    s.model_files = {"diffusion_model": ["/x/z_image_turbo.gguf"], "vae": ["/x/ae.safetensors"]}
    assert s.title()[0] == "z_image_turbo.gguf"
    assert session(profile=None).title() == ("No model loaded", None)


def test_unreadable_files_leave_the_sizes_unknown_never_the_previous_models(tmp_path: Path) -> None:
    s = session()
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\0" * 64)
    note = s.load_model_files({"model": [str(junk)]}, strict=False)
    assert note is not None and note.startswith("model files not read")
    assert s.profile is None and s.fit is None and s.module_bytes("diffusion") is None
    assert s.model_files == {"model": [str(junk)]} and s.modules() == ["diffusion", "te", "vae"]
    with pytest.raises(SdplanError):
        session().load_model_files({"model": [str(junk)]})
