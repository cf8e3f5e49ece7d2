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


#: Shared libraries Qt's Linux platform plugins need, by soname prefix -> (Debian/Ubuntu
#: package, Fedora package). The README lists the same packages.
QT_SYSTEM_PACKAGES: dict[str, tuple[str, str]] = {
    "libxcb-cursor.so": ("libxcb-cursor0", "xcb-util-cursor"),
    "libxcb-icccm.so": ("libxcb-icccm4", "xcb-util-wm"),
    "libxcb-image.so": ("libxcb-image0", "xcb-util-image"),
    "libxcb-keysyms.so": ("libxcb-keysyms1", "xcb-util-keysyms"),
    "libxcb-render-util.so": ("libxcb-render-util0", "xcb-util-renderutil"),
    "libxcb-randr.so": ("libxcb-randr0", "libxcb"),
    "libxcb-shape.so": ("libxcb-shape0", "libxcb"),
    "libxcb-xinerama.so": ("libxcb-xinerama0", "libxcb"),
    "libxcb-xinput.so": ("libxcb-xinput0", "libxcb"),
    "libxcb-xkb.so": ("libxcb-xkb1", "libxcb"),
    "libxcb-sync.so": ("libxcb-sync1", "libxcb"),
    "libxcb-xfixes.so": ("libxcb-xfixes0", "libxcb"),
    "libxcb-shm.so": ("libxcb-shm0", "libxcb"),
    "libxcb-render.so": ("libxcb-render0", "libxcb"),
    "libxcb.so": ("libxcb1", "libxcb"),
    "libX11-xcb.so": ("libx11-xcb1", "libX11-xcb"),
    "libX11.so": ("libx11-6", "libX11"),
    "libxkbcommon-x11.so": ("libxkbcommon-x11-0", "libxkbcommon-x11"),
    "libxkbcommon.so": ("libxkbcommon0", "libxkbcommon"),
    "libEGL.so": ("libegl1", "libglvnd-egl"),
    "libOpenGL.so": ("libopengl0", "libglvnd-opengl"),
    "libGL.so": ("libgl1", "libglvnd-glx"),
    "libfontconfig.so": ("libfontconfig1", "fontconfig"),
    "libfreetype.so": ("libfreetype6", "freetype"),
    "libdbus-1.so": ("libdbus-1-3", "dbus-libs"),
    "libglib-2.0.so": ("libglib2.0-0", "glib2"),
    "libwayland-client.so": ("libwayland-client0", "libwayland-client"),
    "libwayland-cursor.so": ("libwayland-cursor0", "libwayland-cursor"),
}

_PLATFORM_PLUGINS = {"xcb": "libqxcb.so", "wayland": "libqwayland.so",
                     "offscreen": "libqoffscreen.so"}


def qt_platform(environ: Mapping[str, str] | None = None) -> str:
    """The Qt platform plugin a window would use on Linux: ``QT_QPA_PLATFORM``'s first
    entry, else ``wayland`` in a Wayland session without ``DISPLAY`` and ``xcb`` otherwise
    (Qt 6's own order on Linux)."""
    env = os.environ if environ is None else environ
    given = (env.get("QT_QPA_PLATFORM") or "").split(";")[0].split(":")[0].strip()
    if given:
        return given
    if env.get("WAYLAND_DISPLAY") and not env.get("DISPLAY"):
        return "wayland"
    return "xcb"


def missing_library_reason(error: str, platform: str) -> str:
    """One line from a dynamic loader's message (``libX.so.N: cannot open shared object
    file``): the library, and the package that has it on Debian/Ubuntu and Fedora when
    :data:`QT_SYSTEM_PACKAGES` knows it."""
    import re

    m = re.search(r"(lib[\w.+-]+\.so(?:\.[\d.]+)?)", error)
    lib = m.group(1) if m else None
    if lib is None:
        return f"Qt's {platform} platform plugin cannot load ({error.strip()})"
    pkg = next((v for k, v in QT_SYSTEM_PACKAGES.items() if lib.startswith(k)), None)
    hint = (f"; install {pkg[0]} (Debian/Ubuntu: apt install {pkg[0]}) or {pkg[1]} "
            f"(Fedora: dnf install {pkg[1]})" if pkg else "; install the package that has it")
    return f"Qt's {platform} platform plugin needs the system library {lib}, which is missing{hint}"


def qt_platform_reason(platform: str | None = None, plugin: str | os.PathLike[str] | None = None,
                       timeout: float = 30.0) -> str | None:
    """Why Qt's platform plugin cannot load here (Linux), or None: the plugin is loaded in a
    throwaway child process (so a failure cannot abort this one) and the dynamic loader's
    message is turned into :func:`missing_library_reason`. Qt itself would abort with a
    message that names the plugin, not the missing library.

    Args:
        platform: ``xcb``, ``wayland``, ``offscreen`` (default :func:`qt_platform`).
        plugin: the plugin file (default: PySide6's, found without importing Qt).
    """
    import importlib.util
    import subprocess
    from pathlib import Path

    if not sys.platform.startswith("linux"):
        return None
    plat = platform or qt_platform()
    path: Path | None = Path(plugin) if plugin is not None else None
    if path is None:
        spec = importlib.util.find_spec("PySide6")
        name = _PLATFORM_PLUGINS.get(plat)
        if spec is None or not spec.submodule_search_locations or name is None:
            return None  # no PySide6 (reported on import) or a plugin Qt checks itself
        path = Path(list(spec.submodule_search_locations)[0]) / "Qt" / "plugins" / "platforms" / name
        if not path.exists():
            return None
    try:
        res = subprocess.run([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(sys.argv[1])",
                              str(path)], capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode == 0:
        return None
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    return missing_library_reason(lines[-1] if lines else f"exit code {res.returncode}", plat)


def _inputs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(flag, path)`` of the files ``sdplan gui`` reads from its command line."""
    out = [("FILE", str(p)) for p in getattr(args, "files", None) or ()]
    for attr, flag in (("devices", "--devices"), ("profile", "--profile"),
                       ("init_img", "-i/--init-img"), ("mask", "--mask")):
        if getattr(args, attr, None):
            out.append((flag, str(getattr(args, attr))))
    return out


def run(args: argparse.Namespace) -> int:
    """Run the GUI; 2 when PySide6 is missing, no display exists, or an argument file is bad."""
    reason = None if getattr(args, "screenshot", None) else no_display_reason()
    if reason:
        print(f"sdplan gui: {reason}", file=sys.stderr)
        return 2
    if getattr(args, "screenshot", None):
        from sdplan.core.commands.messages import print_error
        from sdplan.core.commands.same_file import check_files
        from sdplan.core.errors import SdplanError

        try:  # the picture is never written over a file the window reads
            check_files([("--screenshot", args.screenshot)], _inputs(args))
        except SdplanError as exc:
            print_error(exc)
            return 2
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    reason = qt_platform_reason()
    if reason:
        print(f"sdplan gui: {reason}", file=sys.stderr)
        return 2
    try:
        from sdplan.app.main import run_gui
    except ImportError as exc:
        print(f"sdplan gui: the desktop app needs PySide6 ({exc})", file=sys.stderr)
        return 2
    return run_gui(args)
