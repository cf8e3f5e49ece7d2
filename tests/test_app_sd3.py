"""SD3 / SD3.5 in the app: a single file with the MMDiT, CLIP-L, CLIP-G, T5-XXL and the
16-channel autoencoder (the tiny SD3.5-medium-like fixture as ``sd3_medium_incl_clips_t5xxlfp16``
names them) opens onto the board as ``diffusion``, ``te`` (its three encoders) and ``vae``; the
panel takes sd-cli's SD3 settings (``docs/sd3.md``: CFG 4.5, euler; 20 steps) and generates through the real engine with live previews."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")

from sd3_util import PROMPT, write_single_file  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.generation import GenerationPanel  # noqa: E402
from sdplan.app.worker import engine_unavailable_reason  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from test_app_zimage import win  # noqa: E402,F401  (the two-GPU window fixture)

GIB = 1 << 30


def test_single_file_opens_on_the_board(win, tmp_path: Path) -> None:  # noqa: F811
    model = write_single_file(tmp_path / "sd3_tiny_incl_clips_t5xxl.safetensors")
    assert win.open_files([str(model)])
    ctl = win.ctl
    assert ctl.model_files == {"model": [str(model)]}
    assert ctl.profile.architecture == "sd3-3.5-medium"
    assert set(ctl.profile.modules) == {"diffusion", "te", "vae"}
    assert set(ctl.profile.modules["te"].encoders) == {"clip_l", "clip_g", "t5xxl"}
    assert len(ctl.profile.modules["diffusion"].blocks) == 3
    cards = [c.module for col in win.board.columns.values() for c in col.cards]
    assert sorted(cards) == ["diffusion", "te", "vae"]
    panel = win.generation  # sd-cli's docs/sd3.md settings
    assert (panel.steps.value(), panel.cfg.value(), panel.sampler.currentText()) == (20, 4.5, "euler")
    cmd = win.strings.command.toPlainText()
    assert f"--model {model}" in cmd and "--cfg-scale 4.5" in cmd and "--sampling-method euler" in cmd



def test_the_panel_generates_with_live_previews(qtbot, tmp_path: Path) -> None:
    """The tiny single file on the CPU through the real engine process: a preview every step,
    the picture shown and saved with its parameters."""
    reason = engine_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    model = write_single_file(tmp_path / "sd3_tiny_incl_clips_t5xxl.safetensors")
    ctl = PlanController(Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),)))
    ctl.open_files([str(model)])
    assert ctl.profile.architecture == "sd3-3.5-medium"
    p = GenerationPanel(ctl, tmp_path / "history")  # the real engine client
    qtbot.addWidget(p)
    p.show()
    p.request_extra = {"overrides": {"clip_heads": 2}, "threads": 1}  # the tiny CLIPs' heads
    assert p.generate_btn.isEnabled(), p.state.text()
    p.prompt.setPlainText(PROMPT)
    p.width_box.setValue(64)
    p.height_box.setValue(64)
    p.steps.setValue(3)
    p.cfg.setValue(4.5)
    p.seed.setValue(11)
    assert p.generate()
    qtbot.waitUntil(lambda: not p.is_running(), timeout=120_000)
    assert not p.error_box.isVisible(), p.error_label.text()
    assert p.preview_steps == [1, 2, 3]
    assert len(p.last_images) == 1 and (p.last_images[0].width(), p.last_images[0].height()) == (64, 64)
    saved = sorted((tmp_path / "history").glob("*.png"))
    assert len(saved) == 1
    index = json.loads(saved[0].with_suffix(".json").read_text())  # the gallery's index
    params = index["settings"]
    assert params["prompt"] == PROMPT and params["steps"] == 3 and params["seed"] == 11
    p.shutdown()
