"""The app and sd-cli's front door: pictures the app saves carry sd-cli's "parameters" text
and restore the run when dropped on the window; sd-cli's --auto-fit shows on the board and
pins to explicit strings; the sampler and scheduler lists are the engine's."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("pytestqt")

from replay_client import ReplayEngineClient  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.generation import SAMPLERS, SCHEDULES, GenerationPanel  # noqa: E402
from sdplan.core.pipelines.stages.parameters import parse_parameters  # noqa: E402
from sdplan.core.pipelines.stages.results import (  # noqa: E402
    read_generation,
    read_png_text,
    read_result,
)
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.profile import ModuleProfile, Profile  # noqa: E402
from sdplan.core.sampling import samplers, schedules  # noqa: E402

GIB = 1 << 30


def inventory() -> Inventory:
    return Inventory((Device("CUDA0", "A", "gpu", "CUDA", 24 * GIB, 24 * GIB),
                      Device("CUDA1", "B", "gpu", "CUDA", 12 * GIB, 12 * GIB),
                      Device("CPU", "cpu", "cpu", "CPU", 64 * GIB, 64 * GIB)))


def test_the_app_offers_the_engines_lists() -> None:
    assert SAMPLERS == samplers.SAMPLERS and len(SAMPLERS) == 21
    assert SCHEDULES == schedules.SCHEDULES and len(SCHEDULES) == 16


def test_app_pictures_round_trip_through_the_reader_and_the_window(qtbot, tmp_path) -> None:
    model = tmp_path / "tiny.safetensors"
    model.write_bytes(b"\0" * 64)  # unreadable as a model: kept as a path
    ctl = PlanController(inventory())
    ctl.load_model_files({"model": [str(model)]}, strict=False)
    ctl.set_strings("CUDA1,vae=CPU", "vae=disk", "")
    img = np.zeros((8, 8, 3), np.uint8)
    img[..., 1] = 99
    client = ReplayEngineClient([{"type": "result", "images": [img],
                                  "params": {"seed": 1234, "steps": 6}}])
    p = GenerationPanel(ctl, tmp_path / "history", client_factory=lambda: client)
    qtbot.addWidget(p)
    p.prompt.setPlainText("a lighthouse at dusk")
    p.negative.setPlainText("fog")
    p.steps.setValue(6)
    p.sampler.setCurrentText("dpm++2m_sde")
    p.schedule.setCurrentText("beta")
    assert p.generate()
    qtbot.waitUntil(lambda: not p.is_running(), timeout=5000)
    saved = sorted((tmp_path / "history").glob("*.png"))
    assert len(saved) == 1
    # other tools read the parameters text; sdplan reads its own record too
    text = read_png_text(saved[0])["parameters"]
    seen = parse_parameters(text).settings
    assert seen["prompt"] == "a lighthouse at dusk" and seen["negative_prompt"] == "fog"
    assert seen["sampling_method"] == "dpm++2m_sde" and seen["scheduler"] == "beta"
    assert seen["seed"] == 1234 and seen["steps"] == 6
    got = read_generation(saved[0])
    assert got.model_files == {"model": ["tiny.safetensors"]}  # a name: safe to share
    assert str(tmp_path) not in read_png_text(saved[0])["sdplan"]
    assert read_result(saved[0]).model_files == {"model": [str(model)]}  # the app's index
    assert got.placement["backend"] == ctl.plan.backend and "vae=disk" in \
        got.placement["params_backend"]
    p.shutdown()
    # a fresh window restores it all from the picture
    other = PlanController(inventory())
    taken = other.import_png(saved[0])
    assert taken == ["settings", "model files", "placement"]
    g = other.generation
    assert (g["prompt"], g["negative_prompt"], g["steps"], g["seed"], g["sampling_method"],
            g["scheduler"]) == ("a lighthouse at dusk", "fog", 6, 1234, "dpm++2m_sde", "beta")
    assert other.model_files == {"model": [str(model)]}
    assert other.plan.modules["diffusion"].devices == ["CUDA1"]
    assert other.plan.modules["vae"].params.mode == "disk"


def test_window_drop_of_an_sd_cli_picture(qtbot, tmp_path) -> None:
    from PIL import Image, PngImagePlugin
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent
    from sdplan.app.window import MainWindow

    pic = tmp_path / "sdcli.png"
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", "a lovely cat\nSteps: 4, CFG scale: 1.000000, Guidance: "
                                "3.500000, Eta: 0.000000, Seed: 42, Size: 512x512, Model: , "
                                "RNG: cuda, Sampler: euler discrete, TE: qwen_3_4b.safetensors, "
                                "Unet: flux-2-klein-4b.safetensors, VAE: flux2_ae.safetensors, "
                                "Version: stable-diffusion.cpp")
    Image.new("RGB", (4, 4)).save(pic, pnginfo=info)
    ctl = PlanController(inventory())
    w = MainWindow(ctl, history_dir=tmp_path / "h")
    qtbot.addWidget(w)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(pic))])
    ev = QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.NoButton,
                    Qt.KeyboardModifier.NoModifier)
    w.dropEvent(ev)
    assert ctl.generation["prompt"] == "a lovely cat" and ctl.generation["steps"] == 4
    assert ctl.generation["sampling_method"] == "euler" and ctl.generation["width"] == 512
    assert "flux-2-klein-4b.safetensors" in w.status_label.text()  # names it cannot open
    assert "--steps 4" in ctl.command_line()


def test_auto_fit_on_the_board_and_pinned() -> None:
    prof = Profile({"diffusion": ModuleProfile((GIB,) * 10, GIB), "te": ModuleProfile((), 5 * GIB),
                    "vae": ModuleProfile((), GIB // 4)}, autofit={"diffusion": 11 * GIB,
                                                                  "te": 5 * GIB,
                                                                  "vae": GIB // 4})
    ctl = PlanController(inventory(), prof)
    assert ctl.set_auto_fit(True)
    fitted = ctl.plan.auto_fit
    # resident: diffusion 11 -> CUDA0 (most room), te 5: CUDA0 has 23.5-11 = 12.5 against
    # CUDA1's 11.5 -> CUDA0 (11 + 5 + 2 fits 23.5); vae -> CUDA1
    assert fitted is not None and fitted.backend == "diffusion=CUDA0,te=CUDA0,vae=CUDA1"
    assert ctl.plan.modules["vae"].devices == ["CUDA1"]  # what the board draws
    assert "--auto-fit" in ctl.command_line() and "--backend" not in ctl.command_line()
    # a budget is an input of auto-fit: it stays on
    ctl.set_budget("CUDA0", 12)
    assert ctl.plan.auto_fit is not None and ctl.plan.auto_fit.time_share
    # moving a card pins the choice and changes it
    before = ctl.plan.modules["diffusion"].devices
    assert ctl.assign("vae", "CPU")
    assert ctl.plan.auto_fit is None and not ctl.placement.auto_fit
    assert ctl.plan.modules["vae"].devices == ["CPU"]
    assert ctl.plan.modules["diffusion"].devices == before
    ctl.undo_stack.undo()
    assert ctl.plan.auto_fit is not None
    assert ctl.pin_auto_fit() and not ctl.placement.auto_fit
    assert ctl.plan.modules["diffusion"].devices == before
