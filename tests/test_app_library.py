"""The library in the app: the sparse real-layout folder and the fixtures listed by family
with the same kinds and verdicts as ``sdplan library --json`` for the board's devices; a
second scan reads no header; choosing a model fills the board with its files and plan (a
missing companion is asked for); verdicts follow the devices."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from PySide6.QtCore import QSettings  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.library_panel import COLUMNS, VERDICT_SHORT, LibraryPanel, PathRole  # noqa: E402
from sdplan.core import cli  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sparse_writer import make_library_folder  # noqa: E402

GIB = 1 << 30
INV = Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 23 * GIB, 24 * GIB),
                 Device("CPU", "Ryzen 9", "cpu", "CPU", 48 * GIB, 64 * GIB)))


@pytest.fixture(scope="module")
def folder(shared_dir: Path, tmp_path_factory) -> Path:
    layouts = json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())
    root = tmp_path_factory.mktemp("library")
    make_library_folder(root, layouts, shared_dir)
    return root


def panel(qtbot, tmp_path, folder: Path, ctl: PlanController | None = None) -> LibraryPanel:
    settings = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    p = LibraryPanel(ctl or PlanController(INV), settings, str(tmp_path / "cache.json"))
    qtbot.addWidget(p)
    # No garbage collection while the scan's worker thread runs Python: a collection that freed
    # earlier tests' Qt wrappers then crashed the process now and then (reproduced with
    # gc.set_threshold(5, 1, 1): about 1 run in 8 of the app tests, also with the scan on a plain
    # Python thread; PySide6 6.11). Collected before, with no other thread running.
    gc.collect()
    gc.disable()
    try:
        with qtbot.waitSignal(p.scanned, timeout=120_000):
            p.add_folder(folder)
    finally:
        gc.enable()
    return p


def test_the_app_lists_what_sdplan_library_json_lists(qtbot, tmp_path, folder, capsys):
    p = panel(qtbot, tmp_path, folder)
    devices = tmp_path / "d.json"
    devices.write_text(json.dumps(INV.to_json()))
    assert cli.main(["library", str(folder), "--json", "--devices", str(devices),
                     "--cache", str(tmp_path / "cli-cache.json")]) == 0
    listed = json.loads(capsys.readouterr().out)["files"]
    rows = p.rows()
    assert set(rows) == {f["path"] for f in listed}
    items = [p.tree.topLevelItem(i).child(j) for i in range(p.tree.topLevelItemCount())
             for j in range(p.tree.topLevelItem(i).childCount())]
    times = {str(c.data(0, PathRole)): c.text(COLUMNS.index("Time")) for c in items}
    for f in listed:
        group, kind, fits = rows[f["path"]]
        assert group == f["group"], f["name"]
        expect = VERDICT_SHORT[f["fit"]["verdict"]] if f["fit"] else (
            "unreadable" if f["error"] else "")
        assert fits == expect, f["name"]
        if f["fit"]:
            v = p.verdicts[f["path"]]
            assert (v.backend, v.params_backend, v.max_vram) == (
                f["fit"]["backend"], f["fit"]["params_backend"], f["fit"]["max_vram"])
            # the same predicted time, written in the Time column
            assert v.time == f["fit"]["time"], f["name"]
            assert (v.time is None) == (f["fit"]["verdict"] == "none"), f["name"]
            assert times[f["path"]] == v.time_text() and (v.time is None or "s/picture" in times[f["path"]])
    assert rows[str(folder / "models/diffusion_models/flux1-dev.safetensors")][:2] == (
        "flux", "Diffusion model · dev")
    assert p.last_scan.headers_read == len(listed)
    again = panel(qtbot, tmp_path, folder)  # opening it a second time
    assert again.last_scan.headers_read == 0 and again.last_scan.cached == len(listed)
    assert "0 headers read" in again.status.text()


def test_choosing_a_model_fills_the_board(qtbot, tmp_path, folder):
    ctl = PlanController(INV)
    p = panel(qtbot, tmp_path, folder, ctl)
    flux = str(folder / "models/diffusion_models/flux1-dev.safetensors")
    assert p.select(flux)
    v = p.verdicts[flux]
    assert p.use_current()
    assert ctl.model_files == v.files
    assert {Path(x).name for fs in ctl.model_files.values() for x in fs} == {
        "flux1-dev.safetensors", "clip_l.safetensors", "t5xxl_fp16.safetensors",
        "ae.safetensors"}
    assert (ctl.plan.backend, ctl.plan.params_backend, ctl.plan.max_vram) == (
        v.backend, v.params_backend, v.max_vram)
    assert ctl.fit.fits == v.fits and (ctl.generation["width"], ctl.generation["height"]) == (
        1024, 1024)
    ctl.undo_stack.undo()  # the plan is one undoable step
    assert ctl.plan.params_backend == ""
    asked = []
    p.ask_file = lambda what, model: asked.append((what, model)) or ""
    sd3 = str(folder / "models/diffusion_models/sd3_medium.safetensors")
    assert p.select(sd3) and p.use_current()
    assert asked == [("clip_g", "sd3_medium.safetensors")]  # lacking from the library
    assert "clip_g" not in ctl.model_files and "t5xxl" in ctl.model_files


def test_verdicts_follow_the_devices(qtbot, tmp_path, folder):
    ctl = PlanController(INV)
    p = panel(qtbot, tmp_path, folder, ctl)
    xl = str(folder / "models/checkpoints/sd_xl_base_1.0.safetensors")
    assert p.verdicts[xl].verdict == "resident"
    ctl.set_inventory(Inventory((Device("CUDA0", "GTX 1060", "gpu", "CUDA", 5 * GIB, 6 * GIB),
                                 Device("CPU", "i5", "cpu", "CPU", 4 * GIB, 8 * GIB))))
    # the UNet read from disk in --max-vram segments (its stages) fits a 6 GiB card
    v = p.verdicts[xl]
    assert v.verdict == "offload" and "diffusion=disk" in v.params_backend and v.max_vram
    ctl.set_inventory(Inventory((Device("CUDA0", "GT 1030", "gpu", "CUDA", 1 * GIB, 2 * GIB),
                                 Device("CPU", "i5", "cpu", "CPU", 4 * GIB, 8 * GIB))))
    assert p.verdicts[xl].verdict == "none"
    assert p.rows()[xl][2] == "✕ does not fit"
    p.filter.setText("sdxl")
    shown = [p.tree.topLevelItem(i).text(0) for i in range(p.tree.topLevelItemCount())
             if not p.tree.topLevelItem(i).isHidden()]
    assert shown == ["sdxl  (1)"]
