"""The gallery: every result with the metadata it carries (sdplan's text chunks, an
A1111/sd-cli ``parameters`` chunk, the older JSON file beside it), search by prompt and
model, thumbnails decoded lazily, full size, the sd-cli command, settings back to the
panel, delete."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtGui import QGuiApplication  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.gallery import GalleryPanel, InfoRole, result_command  # noqa: E402
from sdplan.app.window import MainWindow  # noqa: E402
from sdplan.core.pipelines.stages.parameters import parse_parameters  # noqa: E402
from sdplan.core.pipelines.stages.results import (  # noqa: E402
    index_record,
    read_result,
    result_text,
    save_png,
)
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.sdcli import import_sdcli_command  # noqa: E402

GIB = 1 << 30


def write_results(folder, n: int, model: str = "/m/flux1-dev.safetensors") -> list[str]:
    """``n`` results as the app writes them (text chunks from a request), seeds 0..n-1."""
    paths = []
    for i in range(n):
        req = {"prompt": f"a {'red' if i % 2 else 'blue'} lighthouse number {i}",
               "negative_prompt": "blurry", "seed": i, "steps": 20, "cfg_scale": 3.5,
               "width": 128, "height": 64, "sampling_method": "euler", "scheduler": "simple",
               "backend": "CUDA0,te=CPU", "params_backend": "vae=disk", "max_vram": "",
               "model_files": {"diffusion_model": [model], "t5xxl": ["/m/t5xxl.safetensors"]}}
        img = np.full((64, 128, 3), i * 3 % 256, np.uint8)
        path = folder / f"2026-{i:04d}.png"
        save_png(img, path, result_text({"seed": i}, req))
        # and the gallery's index beside it, as the app writes it: the full paths
        path.with_suffix(".json").write_text(json.dumps(index_record(
            {**req, "seed": i}, req["model_files"])))
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
        paths.append(str(path))
    return paths


def test_read_result_of_each_format(tmp_path):
    [p] = write_results(tmp_path, 1)
    info = read_result(p)
    assert info.prompt == "a blue lighthouse number 0" and info.settings["seed"] == 0
    assert (info.settings["width"], info.settings["height"]) == (128, 64)
    assert info.settings["cfg_scale"] == 3.5 and info.settings["sampling_method"] == "euler"
    assert info.model == "flux1-dev.safetensors"
    assert info.model_files == {"diffusion_model": ["/m/flux1-dev.safetensors"],
                                "t5xxl": ["/m/t5xxl.safetensors"]}  # from the index
    assert "/m/" not in "".join(info.text.values())  # the picture names files, not folders
    Path(p).with_suffix(".json").unlink()
    assert read_result(p).model_files == {"diffusion_model": ["flux1-dev.safetensors"],
                                          "t5xxl": ["t5xxl.safetensors"]}
    assert info.placement == {"backend": "CUDA0,te=CPU", "params_backend": "vae=disk"}
    text = ("a cat in a hat\nNegative prompt: dogs, rain\nSteps: 30, Sampler: euler_a, "
            "CFG scale: 7, Seed: 1234, Size: 512x768, Model: sd15, Version: x")
    save_png(np.zeros((8, 8, 3), np.uint8), tmp_path / "a1111.png", {"parameters": text})
    other = read_result(tmp_path / "a1111.png")
    assert other.settings == {"prompt": "a cat in a hat", "negative_prompt": "dogs, rain",
                              "steps": 30, "sampling_method": "euler_a", "cfg_scale": 7.0,
                              "seed": 1234, "width": 512, "height": 768}
    assert other.model == "sd15" and parse_parameters("just a prompt").settings == {
        "prompt": "just a prompt"}
    save_png(np.zeros((8, 8, 3), np.uint8), tmp_path / "old.png")  # an older app result
    (tmp_path / "old.json").write_text(json.dumps({"prompt": "old one", "seed": 5,
                                                   "timings": {"total": 1.0}}))
    assert read_result(tmp_path / "old.png").settings == {"prompt": "old one", "seed": 5}


@pytest.fixture
def gallery(qtbot, tmp_path):
    paths = write_results(tmp_path, 60)
    g = GalleryPanel([tmp_path])
    qtbot.addWidget(g)
    g.resize(700, 420)
    return g, paths


def test_search_lazy_thumbnails_and_full_size(qtbot, gallery):
    g, paths = gallery
    assert g.model.decoded == []
    assert g.reload() == 60
    assert g.model.index(0).data(InfoRole).path == paths[-1]  # newest first
    g.show()
    qtbot.waitExposed(g)
    qtbot.waitUntil(lambda: len(g.model.decoded) > 0, timeout=5000)
    qtbot.wait(200)
    assert 0 < len(g.model.decoded) < 60  # only the rows in view were decoded
    g.search.setText("red lighthouse")
    assert g.proxy.rowCount() == 30 and g.count_label.text() == "30 of 60"
    g.search.setText("number 42")
    assert g.proxy.rowCount() == 1
    g.search.setText("flux1-dev")  # the model's name
    assert g.proxy.rowCount() == 60
    g.search.setText("t5xxl.safetensors")
    assert g.proxy.rowCount() == 60
    g.search.setText("nothing like this")
    assert g.proxy.rowCount() == 0
    g.search.clear()
    assert g.select_path(paths[5])
    viewer = g.open_current()
    assert (viewer.pixmap.width(), viewer.pixmap.height()) == (128, 64)  # full size
    viewer.close()


def test_command_settings_back_and_delete(qtbot, gallery, monkeypatch):
    g, paths = gallery
    g.reload()
    assert g.select_path(paths[7])
    cmd = g.copy_command()
    assert QGuiApplication.clipboard().text() == cmd
    back = import_sdcli_command(cmd)  # the command reads back to the same settings
    assert back.model_files["diffusion_model"] == "/m/flux1-dev.safetensors"
    assert back.generation["seed"] == 7 and back.generation["prompt"] == \
        "a red lighthouse number 7"
    assert back.generation["steps"] == 20 and back.generation["cfg_scale"] == 3.5
    assert "--backend CUDA0,te=CPU" in cmd and "--params-backend vae=disk" in cmd
    assert result_command(read_result(paths[7])) == cmd
    seen = []
    g.reuseRequested.connect(seen.append)
    g.reuse_current()
    assert seen and seen[0].settings["seed"] == 7
    assert g.delete_current(confirm=False)
    assert not os.path.exists(paths[7]) and g.model.rowCount() == 59
    assert g.current() is None or g.current().path != paths[7]


def test_window_gallery_reuse_puts_settings_in_the_panel(qtbot, tmp_path):
    hist = tmp_path / "history"
    hist.mkdir()
    model = tmp_path / "model.safetensors"  # the recorded model file exists here
    from sparse_writer import write_sparse

    write_sparse(model, {"model.diffusion_model.input_blocks.0.0.weight": [32, 4, 3, 3]},
                 "F16")
    paths = write_results(hist, 3, model=str(model))
    inv = Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB),
                     Device("CPU", "Ryzen", "cpu", "CPU", 48 * GIB, 64 * GIB)))
    win = MainWindow(PlanController(inv), QSettings(str(tmp_path / "s.ini"),
                                                    QSettings.Format.IniFormat),
                     history_dir=hist, queue_path=tmp_path / "q.json",
                     library_cache=str(tmp_path / "lib.json"))
    qtbot.addWidget(win)
    win.show()
    win.tabs.setCurrentWidget(win.gallery)  # read when first shown
    assert win.gallery.model.rowCount() == 3
    win.show_in_gallery(paths[1])
    assert win.gallery.current().path == paths[1]
    win.gallery.reuse_current()
    g = win.generation
    assert g.prompt.toPlainText() == "a red lighthouse number 1" and g.seed.value() == 1
    assert (g.width_box.value(), g.height_box.value(), g.steps.value()) == (128, 64, 20)
    assert win.ctl.plan.backend == "CUDA0,te=CPU" and win.ctl.plan.params_backend == "vae=disk"
    assert "t5xxl.safetensors" in win.status_label.text()  # not found here: said so


def test_copied_command_is_the_recorded_one(qtbot, tmp_path):
    """A picture as ``sdplan generate`` writes it (the files' ``--prediction v`` recorded, the
    default scheduler, sd-cli's own values, a LoRA folder without a tag): the gallery copies
    the very command the picture records, with --prediction v and nothing sd-cli would
    take differently; an older picture without the record still gives its command."""
    from sdplan.core.pipelines.stages.results import generation_text

    settings = {"prompt": "a red circle on a blue background", "negative_prompt": "", "width": 128,
                "height": 128, "steps": 20, "cfg_scale": 5.0, "guidance": 3.5, "seed": 42,
                "sampling_method": "euler", "scheduler": "default", "batch_count": 1, "clip_skip": -1,
                "rng": "cuda", "slg_scale": 0.0, "skip_layers": "[7,8,9]", "strength": 0.75,
                "lora_model_dir": "/demo/loras", "lora_apply_mode": "auto"}
    path = tmp_path / "demo.png"
    save_png(np.zeros((8, 8, 3), np.uint8), path,
             generation_text(settings, {"model": ["/m/demo.safetensors"]}, {"backend": "CPU"},
                             file_flags=["--prediction", "v"]))
    recorded = json.loads(read_result(path).text["sdplan"])["command"]
    assert recorded == ("sd-cli --model demo.safetensors --backend CPU --prompt 'a red circle on a blue "
                        "background' --width 128 --height 128 --steps 20 --cfg-scale 5 --seed 42 "
                        "--sampling-method euler --prediction v")
    g = GalleryPanel([tmp_path])
    qtbot.addWidget(g)
    g.reload()
    assert g.select_path(str(path))
    assert g.copy_command() == recorded
    (tmp_path / "old").mkdir()
    [old] = write_results(tmp_path / "old", 1)
    assert "--prediction" not in result_command(read_result(old))  # nothing recorded: nothing guessed
