"""The generation panel's LoRA list and init-picture area: files of the LoRA folder with
size, family and weight; *Add* writes the tag sd-cli reads into the prompt; a dropped picture
and mask with a strength reach the engine request and the sd-cli command; the board's
estimate counts at-runtime LoRA bytes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("pytestqt")

from PIL import Image  # noqa: E402
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDropEvent  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.generation import GenerationPanel  # noqa: E402
from sdplan.app.inputs import lora_files  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.sdcli import import_sdcli_command  # noqa: E402

GIB = 1 << 30
FIX = Path(__file__).parent / "fixtures"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    d = tmp_path / "loras"
    d.mkdir()
    for name in ("lora_sd1_kohya", "lora_flux_peft"):
        shutil.copy(FIX / f"{name}.safetensors", d / f"{name}.safetensors")
    (d / "notes.txt").write_text("not a LoRA")
    return d


@pytest.fixture
def ctl(qtbot) -> PlanController:
    inv = Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),))
    c = PlanController(inv)
    c.load_model_files({"diffusion_model": [str(FIX / "flux_dev_tiny.safetensors")],
                        "t5xxl": [str(FIX / "t5_tiny.safetensors")], "clip_l": [str(FIX / "clip_l_tiny.safetensors")],
                        "vae": [str(FIX / "flux_ae_tiny.safetensors")]})
    return c


def make_panel(qtbot, ctl, tmp_path) -> GenerationPanel:
    p = GenerationPanel(ctl, tmp_path / "history", client_factory=lambda: None)
    qtbot.addWidget(p)
    p.show()
    return p


def test_lora_files_of_a_folder(folder: Path) -> None:
    files = lora_files(folder)
    assert [(f["name"], f["family"]) for f in files] == [("lora_flux_peft", "flux"), ("lora_sd1_kohya", "unknown")]
    assert files[0]["bytes"] == (folder / "lora_flux_peft.safetensors").stat().st_size
    assert lora_files(folder / "missing") == [] and lora_files(None) == []


def test_add_inserts_the_tag_and_the_command_carries_the_folder(qtbot, ctl, tmp_path, folder) -> None:
    p = make_panel(qtbot, ctl, tmp_path)
    p.prompt.setPlainText("a photo of a cat")
    p.inputs.set_folder(folder)
    assert p.inputs.table.rowCount() == 2
    assert p.inputs.table.item(0, 2).text() == "✓ flux"  # fits the open Flux model
    assert p.inputs.table.item(1, 2).text() == "unknown"
    p.inputs.table.cellWidget(0, 3).setValue(0.7)
    assert p.inputs.add(0) == "<lora:lora_flux_peft:0.7>"
    assert p.prompt.toPlainText() == "a photo of a cat <lora:lora_flux_peft:0.7>"
    p.inputs.mode.setCurrentText("at_runtime")
    req = p.request()
    assert req["lora_model_dir"] == str(folder) and req["lora_apply_mode"] == "at_runtime"
    cmd = import_sdcli_command(ctl.command_line())
    assert cmd.generation["lora_model_dir"] == str(folder)
    assert cmd.generation["prompt"] == "a photo of a cat <lora:lora_flux_peft:0.7>"
    assert cmd.generation["lora_apply_mode"] == "at_runtime"
    # at runtime the LoRA's tensors are counted on the device (the board draws them)
    lora = ctl.fit.devices["CPU"].lora
    assert lora > 0 and any(e.lora.get("CPU") for e in ctl.fit.modules.values())
    p.inputs.mode.setCurrentText("immediately")
    assert ctl.fit.devices["CPU"].lora == 0
    p.prompt.setPlainText("no tags")  # no tag: no LoRA flags in the command
    assert "--lora-model-dir" not in ctl.command_line()


def drop(widget, path: Path) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    ev = QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.NoButton,
                    Qt.KeyboardModifier.NoModifier)
    widget.dropEvent(ev)


def test_dropped_picture_and_mask_reach_the_request_and_command(qtbot, ctl, tmp_path) -> None:
    p = make_panel(qtbot, ctl, tmp_path)
    pic, mask = tmp_path / "start.png", tmp_path / "mask.png"
    Image.fromarray(np.full((16, 16, 3), 90, np.uint8)).save(pic)
    Image.fromarray(np.full((16, 16), 255, np.uint8)).save(mask)
    assert not p.inputs.strength.isEnabled() and p.request()["init_img"] is None
    drop(p.inputs.init_slot, pic)
    drop(p.inputs.mask_slot, mask)
    p.inputs.strength.setValue(0.4)
    req = p.request()
    assert (req["init_img"], req["mask"], req["strength"]) == (str(pic), str(mask), 0.4)
    assert p.inputs.picture_note.text() == "inpainting: white = repaint"
    assert not p.inputs.init_slot.pixmap().isNull()
    cmd = import_sdcli_command(ctl.command_line())
    assert (cmd.generation["init_img"], cmd.generation["mask"], cmd.generation["strength"]) == (
        str(pic), str(mask), 0.4)
    p.inputs.clear_pictures()
    assert p.request()["init_img"] is None and "--init-img" not in ctl.command_line()


def test_a_pasted_command_fills_the_inputs(qtbot, ctl, tmp_path, folder) -> None:
    p = make_panel(qtbot, ctl, tmp_path)
    pic = tmp_path / "p.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(pic)
    ctl.import_command(f"sd-cli -p 'x <lora:lora_flux_peft:1>' --lora-model-dir {folder} -i {pic} --strength 0.3")
    assert p.inputs.folder == str(folder) and p.inputs.init_slot.path == str(pic)
    assert p.inputs.strength.value() == pytest.approx(0.3)


@pytest.mark.slow
def test_demo_in_the_app_with_its_lora_and_a_picture(qtbot, tmp_path) -> None:
    """The demo model in the panel: its LoRA folder is listed, Add puts the tag in the
    prompt, the real engine draws the outlined square; then the same with an init picture and
    mask (image to image and inpainting through the app)."""
    from sdplan.app import main
    from sdplan.app.worker import engine_unavailable_reason
    from sdplan.core.pipelines.demo.model import demo_lora_dir
    from sdplan.core.pipelines.demo.scenes import Scene, is_outlined, render

    if not (demo_lora_dir() / "outline.safetensors").is_file():
        pytest.skip("the demo LoRA is not installed")
    assert engine_unavailable_reason() is None
    inv = Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),))
    c = PlanController(inv)
    assert main.open_demo(c)
    p = GenerationPanel(c, tmp_path / "history")
    qtbot.addWidget(p)
    p.show()
    p.request_extra = {"threads": 2}
    assert p.inputs.folder == str(demo_lora_dir())
    names = [p.inputs.table.item(i, 0).text() for i in range(p.inputs.table.rowCount())]
    assert names == ["outline"] and p.inputs.table.item(0, 2).text() == "✓ sd1"  # every key lands
    p.prompt.setPlainText("a white square on a purple background")
    p.seed.setValue(46)
    p.inputs.add(0)
    assert p.prompt.toPlainText() == "a white square on a purple background <lora:outline:1>"
    assert "--lora-model-dir" in c.command_line()
    assert p.generate()
    qtbot.waitUntil(lambda: not p.is_running(), timeout=600_000)
    assert not p.error_box.isVisible(), p.error_label.text()
    img = p.last_images[0].convertToFormat(p.last_images[0].Format.Format_RGB888)
    arr = np.frombuffer(img.constBits(), np.uint8).reshape(img.height(), img.bytesPerLine())[:, :img.width() * 3]
    assert is_outlined(arr.reshape(img.height(), img.width(), 3), "square")
    pic, mask = tmp_path / "scene.png", tmp_path / "mask.png"
    Image.fromarray(render(Scene("circle", "red", "green", 40, 64, 26), 128)).save(pic)
    mk = np.zeros((128, 128), np.uint8)
    mk[:, 72:] = 255
    Image.fromarray(mk).save(mask)
    p.prompt.setPlainText("a red circle on a green background")
    p.inputs.init_slot.choose(str(pic))
    p.inputs.mask_slot.choose(str(mask))
    p.inputs.strength.setValue(0.8)
    assert p.generate()
    qtbot.waitUntil(lambda: not p.is_running(), timeout=600_000)
    assert not p.error_box.isVisible(), p.error_label.text()
    # the newest settings file (two pictures made within one second are named <stamp>-0.json
    # and <stamp>-0-1.json, which sort the other way round)
    newest = max((tmp_path / "history").glob("*.json"), key=lambda f: f.stat().st_mtime_ns)
    import json

    params = json.loads(newest.read_text())["settings"]  # the gallery's index: full paths
    assert params["init_img"] == str(pic) and params["mask"] == str(mask) and params["strength"] == 0.8
    p.shutdown()


def test_the_board_draws_and_names_lora_bytes(qtbot, ctl, tmp_path, folder) -> None:
    from sdplan.app.board.board import Board

    board = Board(ctl)
    qtbot.addWidget(board)
    ctl.set_generation(prompt="a cat <lora:lora_flux_peft:1>", lora_model_dir=str(folder),
                       lora_apply_mode="at_runtime")
    col = board.columns["CPU"]
    col.refresh()
    segs = col.bar.data.segments
    assert ("diffusion", "lora", ctl.fit.modules["diffusion"].lora["CPU"]) in segs
    assert "LoRA · diffusion: " in col.bar.toolTip()


def test_a_mask_of_another_size_gets_a_note(qtbot, ctl, tmp_path) -> None:
    p = make_panel(qtbot, ctl, tmp_path)
    pic, mask = tmp_path / "start.png", tmp_path / "mask.png"
    Image.fromarray(np.full((16, 16, 3), 90, np.uint8)).save(pic)
    Image.fromarray(np.full((8, 32), 255, np.uint8)).save(mask)
    drop(p.inputs.init_slot, pic)
    drop(p.inputs.mask_slot, mask)
    assert p.inputs.picture_note.text() == (
        "inpainting: white = repaint; --mask is 32x8, the init picture 16x16: the mask is "
        "stretched to 16x16, so it marks the same fractions of the picture, not the same pixels")
