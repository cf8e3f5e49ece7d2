"""``sdplan`` with no files opens the demo model with a plan for this machine and a prompt
ready (128x128, 20 steps); the last session's plan wins when its files still exist."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from PySide6.QtCore import QSettings  # noqa: E402
from sdplan.app import main  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.core.commands.gui import build_parser  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402

GIB = 1 << 30
TINY = Path(__file__).parent / "fixtures" / "sd1_tiny.safetensors"


def devices_file(tmp_path: Path) -> Path:
    inv = Inventory((Device("CUDA0", "RTX 3060", "gpu", "CUDA", 11 * GIB, 12 * GIB),
                     Device("CPU", "Ryzen", "cpu", "CPU", 48 * GIB, 64 * GIB)))
    p = tmp_path / "devices.json"
    p.write_text(json.dumps(inv.to_json()))
    return p


@pytest.fixture
def settings(tmp_path) -> QSettings:
    return QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)


def window(qtbot, argv, settings):
    ctl, win = main.build_window(build_parser().parse_args(argv), settings)
    qtbot.addWidget(win)
    return ctl, win


def test_no_files_opens_the_demo_with_a_prompt_and_a_plan(qtbot, tmp_path, settings,
                                                          monkeypatch):
    # the demo model's stand-in: any SD 1.x single file exercises the same path
    monkeypatch.setattr(main, "demo_model_path", lambda: TINY)
    ctl, win = window(qtbot, ["--devices", str(devices_file(tmp_path))], settings)
    assert ctl.model_files == {"model": [str(TINY)]}
    gen = win.generation
    assert gen.prompt.toPlainText() == "a yellow triangle on a green background"
    assert (gen.width_box.value(), gen.height_box.value()) == (128, 128)
    assert gen.steps.value() == 20 and gen.cfg.value() == 5.0
    assert gen.sampler.currentText() == "euler"
    # the plan is the Auto plan proposal for these devices, and it fits
    assert ctl.fit is not None and ctl.fit.fits
    assert ctl.plan.modules["diffusion"].devices == ["CUDA0"]
    assert ctl.undo_stack.count() == 0
    assert win.model_label.text() == TINY.name
    assert "--prompt 'a yellow triangle on a green background'" in ctl.command_line()
    assert "--width 128 --height 128" in ctl.command_line()


def test_last_plan_wins_when_its_files_exist(qtbot, tmp_path, settings, monkeypatch):
    monkeypatch.setattr(main, "demo_model_path", lambda: TINY)
    other = tmp_path / "mine.safetensors"
    other.write_bytes(TINY.read_bytes())
    inv = str(devices_file(tmp_path))
    ctl, win = window(qtbot, ["--devices", inv, str(other), "--backend", "CPU"], settings)
    win.generation.prompt.setPlainText("a blue square on a red background")
    win.close()  # saves the last plan
    ctl2, win2 = window(qtbot, ["--devices", inv], settings)
    assert ctl2.model_files == {"model": [str(other)]}
    assert ctl2.plan.backend == "CPU"
    assert win2.generation.prompt.toPlainText() == "a blue square on a red background"
    win2.close()
    other.unlink()  # gone: the demo opens instead
    ctl3, _ = window(qtbot, ["--devices", inv], settings)
    assert ctl3.model_files == {"model": [str(TINY)]}


def test_without_a_demo_the_window_says_how_to_start(qtbot, tmp_path, settings, monkeypatch):
    monkeypatch.setattr(main, "demo_model_path", lambda: None)
    ctl, win = window(qtbot, ["--devices", str(devices_file(tmp_path))], settings)
    assert ctl.model_files == {} and win.model_label.text() == "No model loaded"
    assert "Load a model" in win.generation.state.text()
    with pytest.raises(main.SdplanError, match="demo model"):
        window(qtbot, ["--devices", str(devices_file(tmp_path)), "--demo"], settings)


def test_open_demo_on_a_controller_estimates_at_128_and_refuses_a_bad_file(tmp_path):
    inv = Inventory((Device("CPU", "Ryzen", "cpu", "CPU", 48 * GIB, 64 * GIB),))
    ctl = PlanController(inv)
    bad = tmp_path / "x.safetensors"
    bad.write_bytes(b"junk")
    assert not main.open_demo(ctl, bad)
    assert ctl.model_files == {}
    assert main.open_demo(ctl, TINY)
    assert ctl.generation["prompt"] == main.DEMO_GENERATION["prompt"]
    assert ctl.fit.fits and ctl.fit.width == 128


def test_bundled_demo_model_when_installed():
    path = main.demo_model_path()
    if path is None:
        pytest.skip("resources/demo/sdplan-demo-shapes.safetensors is not in this checkout")
    inv = Inventory((Device("CPU", "Ryzen", "cpu", "CPU", 8 * GIB, 16 * GIB),))
    ctl = PlanController(inv)
    assert main.open_demo(ctl)
    assert ctl.profile is not None and ctl.profile.architecture.startswith("sd1")
    assert path.stat().st_size <= 20 * 1000 * 1000
    # an SD 1.x-layout v-prediction model: sd-cli must be told so
    assert ctl.command_line().endswith("--prediction v")
    ctl.load_model_files({"model": [str(TINY)]})
    assert "--prediction" not in ctl.command_line()


def test_placement_flags_open_the_demo_on_that_placement(qtbot, tmp_path, settings, monkeypatch):
    """``gui --demo --backend CPU`` (and the same without ``--demo``) shows the demo on the CPU
    as asked, with the flags in the command; the Auto plan (the GPU) is not applied over them,
    and no saved plan is restored instead."""
    monkeypatch.setattr(main, "demo_model_path", lambda: TINY)
    inv = str(devices_file(tmp_path))
    for argv in (["--devices", inv, "--demo", "--backend", "CPU", "--params-backend", "vae=disk"],
                 ["--devices", inv, "--backend", "CPU", "--params-backend", "vae=disk"]):
        ctl, win = window(qtbot, argv, settings)
        assert ctl.model_files == {"model": [str(TINY)]}, argv
        assert ctl.plan.modules["diffusion"].devices == ["CPU"], argv
        assert "--backend CPU" in ctl.command_line() and "--params-backend vae=disk" in ctl.command_line()
        assert ctl.undo_stack.count() == 0
        win.close()
    ctl, _ = window(qtbot, ["--devices", inv, "--demo"], settings)
    assert ctl.plan.modules["diffusion"].devices == ["CUDA0"]  # no flags: the Auto plan
