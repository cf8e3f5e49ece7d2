"""The sd-cli dialect of the written command, chosen beside it (spec section 14): the newest
sd-cli gets ``--auto-fit off`` where its own auto-fit would move weights the board keeps on
their runtime devices, the snapshot gets ``--vae-tile-size`` in latent pixels and no
``--auto-fit off``; the line under the command says what changes against the other dialect;
the choice is kept in the saved session and restored with it."""

from __future__ import annotations

import json
import os
import shlex

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from PySide6.QtCore import QSettings  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.main import restore_last_plan  # noqa: E402
from sdplan.app.strings import StringsPanel  # noqa: E402
from sdplan.core.errors import PlanError  # noqa: E402
from sdplan.core.planning.inventory import Inventory  # noqa: E402
from sdplan.core.planning.modules import GIB  # noqa: E402
from sdplan.core.planning.placement import Placement  # noqa: E402
from sdplan.core.planning.profile import ModuleProfile, Profile  # noqa: E402
from sdplan.core.session.modules import command_changes, module_flags  # noqa: E402

D = Inventory.from_json({"devices": [
    {"name": "CUDA0", "type": "gpu", "registry": "CUDA", "free": 12 << 30, "total": 12 << 30},
    {"name": "CUDA1", "type": "gpu", "registry": "CUDA", "free": 12 << 30, "total": 12 << 30},
    {"name": "CPU", "type": "cpu", "registry": "CPU", "free": 64 << 30, "total": 64 << 30}]})
# a 16 GiB DiT in 16 blocks (tests/test_sdcli_newest.py): split over both GPUs, the newest
# sd-cli's auto-fit would move its weights to RAM
PROF = Profile({"diffusion": ModuleProfile((GIB,) * 16, 0), "te": ModuleProfile((), 5 * GIB),
                "vae": ModuleProfile((), GIB // 4)}, architecture="flux-dev")
TILES = {"enabled": True, "tile_px": [128, 128], "overlap": 0.5, "relative": None}


def choose(panel: StringsPanel, dialect: str | None) -> None:
    i = panel.dialect.findData(dialect)
    panel.dialect.setCurrentIndex(i)
    panel.dialect.activated.emit(i)


def test_the_dialect_choice_rewrites_the_command_and_says_what_changes(qtbot) -> None:
    ctl = PlanController(D, PROF, Placement.from_strings("CUDA0,diffusion=CUDA0&CUDA1"))
    panel = StringsPanel(ctl)
    qtbot.addWidget(panel)
    ctl.set_generation(vae_tiling=TILES)
    held = panel.command.toPlainText()
    assert panel.dialect.currentData() is None and panel.changes.isHidden()
    assert "--auto-fit" not in held and "--vae-tiling --vae-tile-size 128x128" in held

    choose(panel, "newest")
    newest = panel.command.toPlainText()
    assert ctl.sdcli_dialect == "newest"
    assert shlex.split(newest) == [*shlex.split(held)[:3], "--auto-fit", "off", *shlex.split(held)[3:]]
    assert "--vae-tile-size 128x128" in newest  # image pixels
    assert not panel.changes.isHidden()
    assert panel.changes.text().startswith("For sd-cli newest, against the snapshot: + --auto-fit off · "
                                           "--vae-tile-size 16x16 → 128x128 · --auto-fit off (the newest")

    choose(panel, "snapshot")
    snapshot = panel.command.toPlainText()
    assert "--auto-fit" not in snapshot and "--vae-tile-size 16x16" in snapshot  # latent pixels: 128 / 8
    assert panel.changes.text() == ("For sd-cli snapshot, against the newest: - --auto-fit off · "
                                    "--vae-tile-size 128x128 → 16x16")
    assert ctl.command_line() == snapshot  # what Copy puts on the clipboard

    choose(panel, None)
    assert panel.command.toPlainText() == held and panel.changes.isHidden()
    with pytest.raises(PlanError, match="sd-cli dialect 'latest'"):
        ctl.set_sdcli_dialect("latest")


def test_the_choice_is_kept_in_the_saved_session(qtbot, tmp_path) -> None:
    from sdplan.core.pipelines.demo.model import demo_model_path

    ctl = PlanController(D)
    ctl.load_model_files({"model": [str(demo_model_path())]})
    ctl.set_sdcli_dialect("snapshot")
    hires = {"enabled": True, "upscaler": "Lanczos", "scale": 1.5, "width": 0, "height": 0, "steps": 4,
             "denoising_strength": 0.5, "upscalers_dir": None}
    ctl.set_generation(vae_tiling=TILES, hires=hires)
    doc = json.loads(json.dumps(ctl.plan_json()))
    assert doc["sdcli_dialect"] == "snapshot"
    qs = QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)
    qs.setValue("plan/last", json.dumps(doc))
    again = PlanController(D)
    assert again.sdcli_dialect is None
    assert restore_last_plan(again, qs) == (True, None)
    assert again.sdcli_dialect == "snapshot"
    assert again.generation["vae_tiling"] == TILES and again.generation["hires"] == hires
    assert again.command_line() == ctl.command_line()
    assert "--vae-tile-size 16x16" in again.command_line() and "--hires-scale 1.5" in again.command_line()
    # a saved plan without the key (or with another value) writes as held
    again.load_plan_json({**doc, "sdcli_dialect": "1.0"})
    assert again.sdcli_dialect is None
    assert "sdcli_dialect" not in again.plan_json()


def test_module_flags_per_dialect() -> None:
    g = {"hires": {"enabled": True, "upscaler": "Lanczos", "scale": 1.5, "width": 0, "height": 0, "steps": 0,
                   "denoising_strength": 0.7, "upscalers_dir": None},
         "control_net": "cn.safetensors", "control_image": "c.png", "control_strength": 0.9, "canny": False,
         "vae_tiling": {"enabled": True, "tile_px": [96, 64], "overlap": 0.25, "relative": [2, 2]}}
    assert module_flags(g, "newest", 8) == [
        "--hires", "--hires-upscaler", "Lanczos", "--hires-scale", "1.5", "--control-net", "cn.safetensors",
        "--control-image", "c.png", "--vae-tiling", "--vae-tile-size", "96x64", "--vae-tile-overlap", "0.25",
        "--vae-relative-tile-size", "2x2"]
    assert module_flags(g, "snapshot", 16)[10:12] == ["--vae-tile-size", "6x4"]  # FLUX.2's 16 pixels
    assert module_flags({"hires": None, "vae_tiling": None, "control_net": None}) == []
    assert command_changes("a --x 1", "a --x 1") == []
    assert command_changes("a --stream-layers -p b", "a -p b") == ["- --stream-layers"]
