"""``sdplan gui``: open the desktop app (PySide6 is imported only when it runs)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import Any

from sdplan.core.commands.options import add_source_arguments
from sdplan.core.planning.placement import add_placement_arguments


def _size(text: str) -> tuple[int, int]:
    """argparse type: ``WxH`` in pixels, each at least 320."""
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WxH such as 1024x700, got {text!r}") from None
    if w < 320 or h < 320:
        raise argparse.ArgumentTypeError(f"{text}: each side must be at least 320 px")
    return w, h


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", metavar="FILE", help="model files to open")
    add_source_arguments(p)
    p.add_argument("--demo", action="store_true", help="open the bundled demo model "
                   "(the default when no files, profile or saved plan are given)")
    p.add_argument("--theme", choices=("system", "light", "dark"), help="colour theme")
    p.add_argument("--screenshot", metavar="OUT.png", help="render the main window offscreen "
                   "(at --size) to this PNG and exit")
    p.add_argument("--generate", action="store_true", help="with --screenshot: run one "
                   "generation with the window's settings and capture the finished result")
    p.add_argument("--size", metavar="WxH", default="1440x900", type=_size,
                   help="with --screenshot: the window size (default 1440x900)")
    p.add_argument("--tab", choices=("board", "library", "gallery", "queue"),
                   help="with --screenshot: the tab to show")
    g = p.add_argument_group("generation settings to start with (sd-cli's flags)")
    g.add_argument("-p", "--prompt", help="the prompt (<lora:NAME:WEIGHT> tags included)")
    g.add_argument("--lora-model-dir", metavar="DIR", help="the LoRA folder")
    g.add_argument("-i", "--init-img", metavar="PATH", help="the picture to start from")
    g.add_argument("--mask", metavar="PATH", help="its inpainting mask (white = repaint)")
    g.add_argument("--strength", type=float, help="how much of the picture to repaint, 0..1")
    add_placement_arguments(p)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sdplan gui`` on the dispatcher's subparsers."""
    p = subparsers.add_parser("gui", help="open the desktop app",
                              description="Open sdplan's placement board and generation panel.")
    _add_arguments(p)
    p.set_defaults(run=run)
    return p


def build_parser() -> argparse.ArgumentParser:
    """A standalone parser with ``sdplan gui``'s arguments (for ``run_gui(argv)``)."""
    p = argparse.ArgumentParser(prog="sdplan gui")
    _add_arguments(p)
    return p


def no_display_reason(environ: Mapping[str, str] | None = None,
                      platform: str | None = None) -> str | None:
    """Why a window cannot open here (Linux without ``DISPLAY``/``WAYLAND_DISPLAY`` and no
    ``QT_QPA_PLATFORM``), or None. Qt itself would abort the process instead of saying so."""
    env = os.environ if environ is None else environ
    plat = sys.platform if platform is None else platform
    if not plat.startswith("linux") or env.get("QT_QPA_PLATFORM"):
        return None
    if env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return None
    return ("no display to open a window on (DISPLAY and WAYLAND_DISPLAY are unset); run it in a "
            "desktop session, or render with `sdplan gui --screenshot OUT.png`")


def run(args: argparse.Namespace) -> int:
    """Run the GUI; 2 when PySide6 is missing, no display exists, or an argument file is bad."""
    reason = None if getattr(args, "screenshot", None) else no_display_reason()
    if reason:
        print(f"sdplan gui: {reason}", file=sys.stderr)
        return 2
    if getattr(args, "screenshot", None):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    try:
        from sdplan.app.main import run_gui
    except ImportError as exc:
        print(f"sdplan gui: the desktop app needs PySide6 ({exc})", file=sys.stderr)
        return 2
    return run_gui(args)
