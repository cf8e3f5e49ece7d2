"""Screenshots of the app on a real X server: Xvfb with the openbox window manager at each
screen size, a first run (fresh settings: the demo model) and the same window maximised.

    python tools/desk_screenshots.py OUT_DIR [--sizes 1024x700,1366x768,1920x1080]
        [--prefix NAME] [--gui "ARGS"]

Writes ``OUT_DIR/<prefix><W>x<H>-first.png`` and ``<prefix><W>x<H>-maximised.png`` (the whole
screen, window frame included) and ``OUT_DIR/<prefix>geometry.json``: per size and state, the
screen's available geometry, the window's frame geometry, the board's height, the number of
module cards shown and whether the flags are folded. ``--gui`` passes ``sdplan gui``
arguments (``--devices D.json --model-profile flux1-dev-q8_0 --backend ...``); without them
the window opens as a first run does (the demo model on this machine's devices). Needs ``Xvfb`` and ``openbox`` on PATH (Debian/Ubuntu:
``apt install xvfb openbox libxcb-icccm4 libxcb-keysyms1 libxcb-cursor0``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _child(out: Path, label: str, gui: list[str]) -> dict:
    """In the X session: open the window as a first run, grab the screen, maximise, grab."""
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication
    from sdplan.app.board.cards import ModuleCard
    from sdplan.app.main import build_window
    from sdplan.app.window import apply_theme
    from sdplan.core.commands.gui import build_parser

    app = QApplication([sys.argv[0]])
    apply_theme(app, "light")
    args = build_parser().parse_args(gui)
    settings = QSettings(str(Path(os.environ["XDG_CONFIG_HOME"]) / "sdplan.ini"),
                         QSettings.Format.IniFormat)
    _, win = build_window(args, settings)
    win.show()

    def settle(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.02)

    def state() -> dict:
        cards = [c for c in win.board.findChildren(ModuleCard) if c.isVisible()]
        avail = win.screen().availableGeometry()
        frame = win.frameGeometry()
        return {"available": [avail.x(), avail.y(), avail.width(), avail.height()],
                "frame": [frame.x(), frame.y(), frame.width(), frame.height()],
                "board_height": win.board.height(), "cards": len(cards),
                "flags_folded": win.strings.is_collapsed(),
                "maximised": win.isMaximized()}

    settle(3.0)
    first = state()
    app.primaryScreen().grabWindow(0).save(str(out / f"{label}-first.png"))
    win.showMaximized()
    settle(2.5)
    maxed = state()
    app.primaryScreen().grabWindow(0).save(str(out / f"{label}-maximised.png"))
    win.close()
    return {"first": first, "maximised": maxed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--sizes", default="1024x700,1366x768,1920x1080")
    ap.add_argument("--prefix", default="")
    ap.add_argument("--gui", default="", help="sdplan gui arguments, as one string")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.child:
        print(json.dumps(_child(a.out, a.child, shlex.split(a.gui))))
        return 0
    for tool in ("Xvfb", "openbox"):
        if shutil.which(tool) is None:
            print(f"desk_screenshots: {tool} is not installed", file=sys.stderr)
            return 2
    report = {}
    for n, size in enumerate(a.sizes.split(",")):
        display = f":{91 + n}"
        with tempfile.TemporaryDirectory(prefix="sdplan-desk-") as home:
            env = {**os.environ, "DISPLAY": display, "QT_QPA_PLATFORM": "xcb",
                   "XDG_CONFIG_HOME": home, "SDPLAN_CACHE_DIR": home, "HOME": home}
            env.pop("WAYLAND_DISPLAY", None)
            xvfb = subprocess.Popen(["Xvfb", display, "-screen", "0", f"{size}x24", "-nolisten",
                                     "tcp"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
            wm = subprocess.Popen(["openbox"], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
            time.sleep(1.0)
            try:
                res = subprocess.run([sys.executable, __file__, str(a.out), "--child",
                                      f"{a.prefix}{size}", "--gui", a.gui],
                                     env=env, capture_output=True, text=True, timeout=300)
            finally:
                wm.terminate()
                xvfb.terminate()
                wm.wait(10)
                xvfb.wait(10)
            if res.returncode != 0:
                print(res.stderr, file=sys.stderr)
                return 1
            report[size] = json.loads(res.stdout.strip().splitlines()[-1])
            print(size, json.dumps(report[size]))
    (a.out / f"{a.prefix}geometry.json").write_text(json.dumps(report, indent=1),
                                                    encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
