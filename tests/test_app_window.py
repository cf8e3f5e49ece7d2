"""The main window's housekeeping through its real widgets: the free-memory refresh timer
(with a fake device-memory source), hardware profiles saved and loaded, recent files, and
theme switching."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from PySide6.QtCore import QSettings  # noqa: E402
from PySide6.QtGui import QPalette  # noqa: E402
from PySide6.QtWidgets import QApplication, QMessageBox  # noqa: E402
from sdplan.app import theme  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.window import MAX_RECENT, MainWindow, apply_theme  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.placement import Placement  # noqa: E402
from sdplan.core.planning.profile import ModuleProfile, Profile  # noqa: E402

GIB = 1 << 30
TINY = Path(__file__).parent / "fixtures" / "sd1_tiny.safetensors"


class FakeMemory:
    """A device-memory source: CUDA0's free memory is taken from ``free_gib`` on each
    call (the last value repeats); counts calls."""

    def __init__(self, free_gib: list[float]) -> None:
        self.free_gib = list(free_gib)
        self.calls = 0

    def __call__(self) -> Inventory:
        free = self.free_gib[min(self.calls, len(self.free_gib) - 1)]
        self.calls += 1
        return Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", int(free * GIB),
                                 24 * GIB),
                          Device("CPU", "Ryzen", "cpu", "CPU", 48 * GIB, 64 * GIB)))


def profile() -> Profile:
    return Profile({"diffusion": ModuleProfile((400 << 20,) * 30, 120 << 20),
                    "vae": ModuleProfile((), 160 << 20)}, "m", "flux-dev")


@pytest.fixture
def settings(tmp_path) -> QSettings:
    return QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def warnings(monkeypatch) -> list[str]:
    """Message boxes recorded instead of shown (a modal box would block the test)."""
    seen: list[str] = []

    def warn(parent, title, text, *a, **k):  # noqa: ANN001, ANN202
        seen.append(f"{title}: {text}")
        return QMessageBox.StandardButton.Ok

    monkeypatch.setattr(QMessageBox, "warning", staticmethod(warn))
    return seen


def make(qtbot, tmp_path, settings, source=None, **kw) -> MainWindow:
    src = source or FakeMemory([22])
    ctl = PlanController(src(), profile(), Placement(), inventory_source=src)
    w = MainWindow(ctl, settings, history_dir=tmp_path / "history", **kw)
    qtbot.addWidget(w)
    w.show()
    return w


def test_refresh_timer_rereads_free_memory_and_replans(qtbot, tmp_path, settings):
    mem = FakeMemory([22, 22, 12.5, 6])
    win = make(qtbot, tmp_path, settings, mem, auto_refresh=True)
    assert win.auto_refresh_act.isChecked() and win.timer.isActive()
    win.ctl.set_budget("CUDA0", 20)
    col = win.board.columns["CUDA0"]
    assert win.ctl.fit.fits and "22.0 free" in col.figures.text()
    win.timer.setInterval(20)
    qtbot.waitUntil(lambda: mem.calls >= 4, timeout=5000)
    qtbot.waitUntil(lambda: "6.0 free" in win.board.columns["CUDA0"].figures.text(),
                    timeout=5000)
    # 6 GiB free no longer holds the 12 GiB diffusion model: the verdict turns, the
    # placement (and its budget) stay as they were
    assert win.ctl.device("CUDA0").free == 6 * GIB
    assert not win.ctl.fit.fits and win.verdict.text().startswith("✕")
    assert win.ctl.plan.max_vram == "CUDA0=20"
    win.auto_refresh_act.setChecked(False)
    assert not win.timer.isActive()
    calls = mem.calls
    qtbot.wait(100)
    assert mem.calls == calls


def test_timer_is_off_unless_asked(qtbot, tmp_path, settings):
    win = make(qtbot, tmp_path, settings)
    assert not win.timer.isActive() and not win.auto_refresh_act.isChecked()


def test_hardware_profile_save_and_load(qtbot, tmp_path, settings, warnings):
    win = make(qtbot, tmp_path, settings, auto_refresh=True)
    saved = tmp_path / "this-machine.json"
    assert win.save_hardware(str(saved))
    data = json.loads(saved.read_text())
    assert [d["name"] for d in data["devices"]] == ["CUDA0", "CPU"]
    assert data["devices"][0]["free"] == 22 * GIB
    assert Inventory.load(saved) == win.ctl.inventory  # sdplan reads it back as is
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"devices": [
        {"name": "Vulkan0", "description": "Radeon", "type": "gpu", "registry": "Vulkan",
         "free": 15 * GIB, "total": 16 * GIB},
        {"name": "CPU", "description": "Xeon", "type": "cpu", "registry": "CPU",
         "free": 100 * GIB, "total": 128 * GIB}]}))
    assert win.load_hardware(str(other))
    assert list(win.board.columns) == ["Vulkan0", "CPU"]
    assert win.ctl.plan.modules["diffusion"].devices == ["Vulkan0"]
    assert win.ctl.inventory_source is None and not win.timer.isActive()
    win.refresh_devices()  # no source now: the loaded devices stay
    assert list(win.board.columns) == ["Vulkan0", "CPU"]
    bad = tmp_path / "bad.json"
    bad.write_text("{\"devices\": [{\"name\": 3}]}")
    assert not win.load_hardware(str(bad))
    assert warnings and str(bad) in warnings[-1]
    assert list(win.board.columns) == ["Vulkan0", "CPU"]
    assert not win.save_hardware(str(tmp_path / "no-such-dir" / "x.json"))


def test_recent_files(qtbot, tmp_path, settings, warnings):
    win = make(qtbot, tmp_path, settings)
    assert win.recent_files() == [] and not win.recent_menu.isEnabled()
    copies = []
    for i in range(MAX_RECENT + 2):
        p = tmp_path / f"m{i}.safetensors"
        p.write_bytes(TINY.read_bytes())
        copies.append(str(p))
    for p in copies:
        assert win.open_files([p])
    recent = win.recent_files()
    assert recent == list(reversed(copies))[:MAX_RECENT]  # newest first, at most 8
    assert win.recent_menu.isEnabled()
    assert [a.toolTip() for a in win.recent_menu.actions()] == recent
    # reopening moves a file to the front without duplicates
    win.recent_menu.actions()[3].trigger()
    assert win.recent_files()[0] == recent[3] and len(win.recent_files()) == MAX_RECENT
    assert recent[3] in win.ctl.model_files["model"]
    # persisted: a new window over the same settings lists them
    again = MainWindow(win.ctl, QSettings(settings.fileName(), QSettings.Format.IniFormat),
                       history_dir=tmp_path / "history")
    qtbot.addWidget(again)
    assert again.recent_files() == win.recent_files()
    # a file that is not a model is refused, not remembered
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a model")
    assert not win.open_files([str(junk)])
    assert warnings and str(junk) not in win.recent_files()


@pytest.fixture
def light_again():
    yield
    app = QApplication.instance()
    if isinstance(app, QApplication):
        apply_theme(app, "light")


def test_theme_switching(qtbot, tmp_path, settings, light_again):
    app = QApplication.instance()
    apply_theme(app, "light")
    win = make(qtbot, tmp_path, settings)
    col = win.board.columns["CUDA0"]
    assert not theme.is_dark(app.palette())
    win.set_theme("dark")
    assert theme.is_dark(app.palette())
    assert app.palette().color(QPalette.ColorRole.Window).name() == "#16181c"
    assert "#1e2126" in app.styleSheet().lower()  # dark surfaces in the style sheet
    assert settings.value("view/theme") == "dark"
    assert win.board.columns["CUDA0"] is not col  # columns redrawn with dark colours
    assert win.board.columns["CUDA0"].bar.theme.dark
    win.board.legend.grab()  # paints with the theme of the moment
    assert win.board.legend.theme.dark
    # the menu offers the three modes and switches back
    themes = next(a.menu() for a in win.menuBar().actions() if a.text() == "&View")
    light = next(a for m in themes.actions() if m.menu() for a in m.menu().actions()
                 if a.text() == "Light")
    light.trigger()
    assert not theme.is_dark(app.palette()) and settings.value("view/theme") == "light"
