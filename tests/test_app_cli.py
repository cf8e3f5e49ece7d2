"""``sdplan gui``: the command imports without Qt, and --screenshot renders the window at
1440x900 (also at 125 % and 200 % scaling) in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("PySide6")


def test_gui_command_does_not_import_qt():
    code = ("import sys, sdplan.core.cli as c; c.build_parser(); "
            "print('PySide6' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("scale", ["1", "1.25", "2"])
def test_screenshot_at_scale(tmp_path: Path, shared_dir: Path, scale: str):
    from PySide6.QtGui import QImage

    out = tmp_path / "shot.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", QT_SCALE_FACTOR=scale,
               XDG_CONFIG_HOME=str(tmp_path / "cfg"), HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "sdplan.core.cli", "gui", "--devices",
                        str(shared_dir / "cases/devices/D1.json"), "--backend",
                        "diffusion=CUDA0&CUDA1", "--screenshot", str(out)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    img = QImage(str(out))
    assert (img.width(), img.height()) == (round(1440 * float(scale)), round(900 * float(scale)))


def test_bad_devices_file_is_exit_code_2(tmp_path: Path):
    bad = tmp_path / "d.json"
    bad.write_text("{}")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "c"))
    r = subprocess.run([sys.executable, "-m", "sdplan.core.cli", "gui", "--devices", str(bad),
                        "--screenshot", str(tmp_path / "x.png")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and str(bad) in r.stderr


def test_dark_screenshot_of_a_builtin_profile(tmp_path: Path, shared_dir: Path):
    from PySide6.QtGui import QImage

    out = tmp_path / "dark.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "cfg"),
               HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "sdplan.core.cli", "gui", "--devices",
                        str(shared_dir / "cases/devices/D1.json"), "--model-profile",
                        "flux1-dev-q8_0", "--theme", "dark", "--screenshot", str(out)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    img = QImage(str(out))
    assert img.pixelColor(img.width() // 2, img.height() - 4).lightness() < 60  # dark window


def test_unknown_builtin_profile_is_exit_code_2(tmp_path: Path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "c"))
    r = subprocess.run([sys.executable, "-m", "sdplan.core.cli", "gui", "--model-profile",
                        "flux9-nope", "--screenshot", str(tmp_path / "x.png")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "flux9-nope" in r.stderr


def test_no_display_is_a_clear_error_not_an_abort() -> None:
    from sdplan.core.commands.gui import no_display_reason

    assert "DISPLAY" in (no_display_reason({}, "linux") or "")
    assert no_display_reason({"DISPLAY": ":0"}, "linux") is None
    assert no_display_reason({"WAYLAND_DISPLAY": "wayland-0"}, "linux") is None
    assert no_display_reason({"QT_QPA_PLATFORM": "offscreen"}, "linux") is None
    assert no_display_reason({}, "darwin") is None


def test_sdplan_without_display_exits_2(tmp_path) -> None:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    proc = subprocess.run([sys.executable, "-m", "sdplan.core.cli"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "no display" in proc.stderr and "Traceback" not in proc.stderr


def test_plain_screenshot_shows_the_demo_and_keeps_the_saved_session(tmp_path: Path):
    """``sdplan gui --screenshot`` with nothing else renders what a new user sees (the demo
    model with a picture from ``--generate``) and neither reads nor overwrites the session
    the user's settings hold."""
    from PySide6.QtGui import QImage

    demo = Path(__file__).resolve().parent.parent / "resources/demo/sdplan-demo-shapes.safetensors"
    if not demo.is_file():
        pytest.skip(f"{demo} is absent")
    cfg = tmp_path / "cfg"
    conf = cfg / "sdplan" / "sdplan.conf"
    conf.parent.mkdir(parents=True)
    saved = '[plan]\nlast="{\\"model_files\\": {\\"model\\": [\\"/nowhere/x.safetensors\\"]}}"\n'
    conf.write_text(saved)
    out = tmp_path / "shot.png"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(cfg),
               HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "sdplan.core.cli", "gui", "--screenshot", str(out),
                        "--generate"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert QImage(str(out)).width() == 1440
    assert conf.read_text() == saved
