"""SDXL in the app: its files open with the UNet, both text encoders and the VAE on the board
(and the engine's request carries the flags sd-cli needs); the generation panel offers the
SDXL sizes and applies one."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from PySide6.QtCore import QSettings  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.window import MainWindow  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdxl_util import BASE, split_files  # noqa: E402

GIB = 1 << 30


@pytest.fixture
def win(qtbot, tmp_path):
    inv = Inventory((Device("CUDA0", "RTX 3070", "gpu", "CUDA", 7 * GIB, 8 * GIB),
                     Device("CPU", "Ryzen", "cpu", "CPU", 24 * GIB, 32 * GIB)))
    w = MainWindow(PlanController(inv), QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat),
                   history_dir=tmp_path / "history")
    qtbot.addWidget(w)
    w.show()
    return w


def te_text(win) -> str:
    te = next(c for c in win.board.columns["CUDA0"].cards if c.module == "te")
    return " ".join(lbl.text() for lbl in te.findChildren(type(te.size_label)))


def test_sdxl_files_open_with_modules_and_both_encoders(win, tmp_path) -> None:
    assert win.open_files([str(BASE)])
    assert win.ctl.profile.architecture == "sdxl"
    assert [c.module for c in win.board.columns["CUDA0"].cards] == ["diffusion", "te", "vae"]
    assert "clip_l" in te_text(win) and "clip_g" in te_text(win)
    parts = split_files(tmp_path)  # the separate files users download, by their sd-cli flags
    win.ctl.load_model_files(parts)
    assert win.ctl.profile.architecture == "sdxl"
    assert sorted(win.ctl.model_files) == ["clip_g", "clip_l", "diffusion_model", "vae"]
    assert "clip_l" in te_text(win) and "clip_g" in te_text(win)
    assert f"--clip_g {parts['clip_g'][0]}" in win.strings.command.toPlainText()


def test_generation_panel_offers_sdxl_sizes(win) -> None:
    panel = win.generation
    win.ctl.plan_for_builtin("sdxl-base-q8_0")
    items = [panel.size_preset.itemText(i) for i in range(panel.size_preset.count())]
    assert items[:3] == ["custom", "1024 × 1024", "1152 × 896"] and "832 × 1216" in items
    # sd-cli's defaults for UNet models, at the size SDXL was trained at; the preset shows it
    assert (panel.cfg.value(), panel.steps.value(), panel.sampler.currentText()) == (7.0, 20, "euler_a")
    assert panel.size_preset.currentText() == "1024 × 1024"
    i = items.index("1216 × 832")
    panel.size_preset.activated.emit(i)
    assert (panel.width_box.value(), panel.height_box.value()) == (1216, 832)
    assert win.ctl.generation["width"] == 1216 and win.ctl.generation["height"] == 832
    assert panel.size_preset.currentText() == "1216 × 832"
    panel.width_box.setValue(1280)
    assert panel.size_preset.currentText() == "custom"
    win.ctl.plan_for_builtin("sd15-f16")
    assert panel.size_preset.itemText(1) == "512 × 512"
    assert (panel.width_box.value(), panel.height_box.value(), panel.cfg.value()) == (512, 512, 7.0)
    assert panel.size_preset.currentText() == "512 × 512"
