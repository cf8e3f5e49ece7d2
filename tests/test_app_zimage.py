"""Z-Image in the app: the full-size Z-Image Turbo and Qwen3-4B files (sparse, from
../shared/models) opened together land on the board as ``diffusion`` and ``te`` with their
flags, both split over two GPUs; the generation panel takes Turbo's settings (8 steps,
CFG 1, euler) when the family is opened, and keeps the user's settings while it stays."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")

from PySide6.QtCore import QSettings  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.window import MainWindow  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.placement import Placement  # noqa: E402
from test_real_layouts import write_sparse  # noqa: E402

GIB = 1 << 30


@pytest.fixture(scope="module")
def files(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path]:
    layouts = json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())
    d = tmp_path_factory.mktemp("zimage_app")
    dit, llm = d / "z_image_turbo_bf16.safetensors", d / "qwen_3_4b.safetensors"
    write_sparse(dit, layouts["z_image_turbo"])
    write_sparse(llm, layouts["qwen3_4b_hf"])
    return dit, llm


@pytest.fixture
def win(qtbot, tmp_path):
    inv = Inventory((Device("CUDA0", "RTX 3060", "gpu", "CUDA", 12 * GIB, 12 * GIB),
                     Device("CUDA1", "RTX 3060", "gpu", "CUDA", 12 * GIB, 12 * GIB),
                     Device("CPU", "CPU", "cpu", "CPU", 48 * GIB, 64 * GIB)))
    w = MainWindow(PlanController(inv, None, Placement()), QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat),
                   history_dir=tmp_path / "history")
    qtbot.addWidget(w)
    w.show()
    return w


def test_both_files_open_onto_the_board(win, files) -> None:
    dit, llm = files
    assert win.open_files([str(dit), str(llm)])
    ctl = win.ctl
    assert ctl.model_files == {"diffusion_model": [str(dit)], "llm": [str(llm)]}
    assert ctl.profile.architecture == "z_image"
    assert [c.module for c in win.board.columns["CUDA0"].cards] == ["diffusion", "te"]
    cmd = win.strings.command.toPlainText()
    assert f"--diffusion-model {dit}" in cmd and f"--llm {llm}" in cmd
    assert ctl.edit(Placement.from_strings("diffusion=CUDA0&CUDA1,te=CUDA0&CUDA1", "", ""), "split both")
    for module, n in (("diffusion", 30), ("te", 35)):  # Z-Image reads 35 of the 36 encoder blocks
        ranges = ctl.plan.modules[module].ranges
        assert [r.device for r in ranges] == ["CUDA0", "CUDA1"] and ranges[-1].last_block == n - 1


def test_turbo_settings_are_the_family_defaults(win, files) -> None:
    panel = win.generation
    panel.steps.setValue(30)
    panel.cfg.setValue(6.0)
    assert win.open_files([str(files[0]), str(files[1])])
    assert (panel.steps.value(), panel.cfg.value(), panel.sampler.currentText()) == (8, 1.0, "euler")
    assert win.ctl.generation["steps"] == 8
    panel.steps.setValue(12)  # the user's choice stays while the family does
    win.ctl.load_model_files(win.ctl.model_files)
    assert panel.steps.value() == 12
