"""The app starts with a hostile file in each store it reads at start-up (the saved session,
the generation queue, the results folder the gallery and today's strip show, the window
settings), shows every good entry, and sets the bad ones aside with a note."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from PIL import Image, PngImagePlugin  # noqa: E402
from PySide6.QtCore import QSettings  # noqa: E402
from sdplan.app import main  # noqa: E402
from sdplan.app.gallery import InfoRole  # noqa: E402
from sdplan.core.commands.gui import build_parser  # noqa: E402
from sdplan.core.pipelines.stages.results import result_text, save_png  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402

GIB = 1 << 30
TINY = Path(__file__).parent / "fixtures" / "sd1_tiny.safetensors"
DEEP = "[" * 100_000 + "]" * 100_000


def devices_file(tmp_path: Path) -> Path:
    inv = Inventory((Device("CPU", "Ryzen", "cpu", "CPU", 48 * GIB, 64 * GIB),))
    p = tmp_path / "devices.json"
    p.write_text(json.dumps(inv.to_json()))
    return p


def good_result(folder: Path, i: int) -> Path:
    req = {"prompt": f"a good lighthouse {i}", "seed": i, "steps": 20, "width": 64, "height": 64,
           "model_files": {"model": ["/m/sd15.safetensors"]}}
    path = folder / f"good-{i}.png"
    save_png(np.full((64, 64, 3), 40 * i, np.uint8), path, result_text({"seed": i}, req))
    return path


def hostile_png(path: Path, chunks: dict[str, str]) -> Path:
    info = PngImagePlugin.PngInfo()
    for k, v in chunks.items():
        info.add_text(k, v)
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(path, pnginfo=info)
    return path


@pytest.fixture
def stores(tmp_path: Path) -> dict[str, Path]:
    """A settings file whose saved session nests 100,000 levels (and a window geometry of
    the wrong type), a results folder with two good pictures and four hostile ones, and a
    queue file with two good jobs among three that are not jobs."""
    ini = tmp_path / "s.ini"
    qs = QSettings(str(ini), QSettings.Format.IniFormat)
    qs.setValue("plan/last", '{"backend": "CPU", "model_files": ' + DEEP + "}")
    qs.setValue("window/geometry", "not a geometry")
    qs.setValue("files/recent", 12)
    hist = tmp_path / "sdplan-history"
    qs.setValue("output/folder", str(hist))  # the pictures' folder: the gallery and today's strip
    qs.sync()
    hist.mkdir()
    for i in (1, 2):
        good_result(hist, i)
    hostile_png(hist / "deep.png", {"sdplan": '{"settings": ' + DEEP + "}"})
    hostile_png(hist / "shapes.png", {"sdplan": json.dumps({"settings": [1], "model_files": 3}),
                                      "parameters": "x\nSteps: 4, SDCPP: {" + "[" * 5000})
    hostile_png(hist / "typed.png", {"sdplan": json.dumps({"settings": {"width": "wide",
                                                                        "prompt": {"a": 1}}})})
    (hist / "garbage.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(64))
    now = time.time()
    for p in hist.iterdir():
        os.utime(p, (now, now))  # today's: the strip shows them too
    queue = tmp_path / "sdplan-queue.json"
    good = {"id": "a1", "label": "a", "request": {"prompt": "a cat", "steps": 4}, "state": "done"}
    queue.write_text(json.dumps({"sdplan_queue": 1, "jobs": [
        good, {"id": "x", "request": DEEP[:10]}, {**good, "id": "b2", "state": "done"},
        [1, 2], {"id": "c3", "request": {}, "created": "tuesday"}]}))
    return {"ini": ini, "hist": hist, "queue": queue}


def test_the_app_starts_with_a_hostile_file_in_each_store(qtbot, tmp_path, stores) -> None:
    qs = QSettings(str(stores["ini"]), QSettings.Format.IniFormat)
    args = build_parser().parse_args(["--devices", str(devices_file(tmp_path))])
    ctl, win = main.build_window(args, qs)
    qtbot.addWidget(win)
    win.show()
    # the session: set aside with a note, the app opened as without one
    assert "[[[[" not in str(qs.value("plan/last"))  # the app's own plan is saved again
    assert qs.value("plan/last-set-aside").startswith('{"backend": "CPU"')
    notes = "\n".join(win.startup_notes)
    assert "the last session's plan was not restored" in notes and "set aside" in notes
    # the queue: the two good jobs kept, the three others set aside in queue.json.bad
    assert [j.id for j in win.queue.jobs] == ["a1", "b2"]
    assert "3 of 5 entries of the queue" in notes
    assert len(json.loads((tmp_path / "sdplan-queue.json.bad").read_text())) == 3
    assert win.status_label.toolTip() == notes
    # the gallery: both good pictures, the hostile ones by name, the garbage left out
    win.tabs.setCurrentWidget(win.gallery)
    model = win.gallery.model
    shown = {Path(model.index(r).data(InfoRole).path).name: model.index(r).data(InfoRole)
             for r in range(model.rowCount())}
    assert sorted(shown) == ["deep.png", "good-1.png", "good-2.png", "shapes.png", "typed.png"]
    assert shown["good-2.png"].prompt == "a good lighthouse 2"
    assert shown["good-1.png"].settings["seed"] == 1
    assert shown["shapes.png"].settings["steps"] == 4 and shown["typed.png"].settings == {}
    # today's strip lists the folder's pictures, each good one with its record
    strip = win.generation.history
    tips = {Path(strip.path_of(strip.item(i))).name: strip.item(i).toolTip() for i in range(strip.count())}
    assert len(tips) == 6 and "a good lighthouse 1" in tips["good-1.png"]
    assert tips["deep.png"] == "(no prompt)\ndeep.png"  # its record refused, the picture kept
    assert win.recent_files() == []


def test_a_gallery_folder_with_a_hostile_picture_keeps_its_good_ones(qtbot, tmp_path) -> None:
    from sdplan.app.gallery import GalleryPanel

    good = tmp_path / "good"
    good.mkdir()
    good_result(good, 1)
    bad = tmp_path / "added"
    bad.mkdir()
    good_result(bad, 2)
    hostile_png(bad / "deep.png", {"sdplan": '{"settings": ' + DEEP + "}"})
    g = GalleryPanel([good])
    qtbot.addWidget(g)
    assert g.reload() == 1
    g.add_folder(bad)
    assert g.model.rowCount() == 3
    assert {Path(g.model.index(r).data(InfoRole).path).name for r in range(3)} == {
        "good-1.png", "good-2.png", "deep.png"}
