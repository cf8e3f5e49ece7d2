"""Start the GUI: :func:`run_gui` opens the window for parsed ``sdplan gui`` options (the
``gui`` command parses them and calls it; the app never imports the command line)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from sdplan.core.errors import SdplanError
from sdplan.core.pipelines.demo import model as demo
from sdplan.core.planning.autoplan import auto_plan
from sdplan.core.planning.builtin_profiles import load_profile_option
from sdplan.core.planning.inventory import Inventory, merge_rpc_devices
from sdplan.core.planning.placement import placement_from_namespace
from sdplan.core.runtime.devices import local_inventory

log = logging.getLogger(__name__)


def file_source(path: str):  # noqa: ANN201 - InventorySource
    """Inventory source for a saved inventory (a hardware profile): the file's devices,
    read again on each refresh (raises SdplanError on a bad file)."""

    def source() -> Inventory:
        return Inventory.load(path)

    return source


def live_source() -> Inventory:
    """This machine's devices, without RPC servers (CPU alone from /proc/meminfo when the
    native module is missing)."""
    return local_inventory(())[0]


#: What the window offers with the demo model: a caption it was trained on and the same
#: size and sampling as ``sdplan generate --demo``.
DEMO_GENERATION: dict[str, object] = demo.demo_generation()


def demo_model_path() -> Path | None:
    """The bundled demo model's file, or None when this installation has none."""
    try:
        return demo.demo_model_path()
    except SdplanError:
        return None


def open_demo(ctl: object, path: Path | None = None, auto: bool = True) -> bool:
    """Load the demo model into the controller ``ctl`` with :data:`DEMO_GENERATION` and
    the Auto plan proposal for its devices at 128x128 (``auto`` False: the placement the
    controller has, as given by ``--backend``/``--params-backend``/``--max-vram``), an undo
    history without steps. Returns False when there is no demo model or it cannot be read
    (logged)."""
    path = path or demo_model_path()
    if path is None:
        return False
    try:
        ctl.load_model_files({"model": [str(path)]})  # type: ignore[attr-defined]
    except (SdplanError, OSError, ValueError) as exc:
        log.warning("demo model not loaded: %s", exc)
        return False
    ctl.set_generation(**DEMO_GENERATION)  # type: ignore[attr-defined]
    try:
        if auto:
            proposal = auto_plan(ctl.inventory, ctl.profile, ctl.placement,  # type: ignore[attr-defined]
                                 width=int(demo.DEMO_DEFAULTS["width"]),
                                 height=int(demo.DEMO_DEFAULTS["height"]))
            ctl.edit(proposal.placement, "plan for the demo")  # type: ignore[attr-defined]
    except SdplanError as exc:
        log.info("no auto plan for the demo: %s", exc)
    ctl.undo_stack.clear()  # type: ignore[attr-defined]
    return True


def build_window(args: argparse.Namespace, settings: object = None):  # noqa: ANN201
    """The controller and main window for parsed ``sdplan gui`` arguments."""
    from PySide6.QtCore import QSettings
    from sdplan.app.controller import PlanController
    from sdplan.app.window import MainWindow

    placement = placement_from_namespace(args)
    source = file_source(args.devices) if args.devices else live_source
    inventory = source()
    if placement.rpc_servers:  # asked for in a child process, never registered here
        from sdplan.app.rpc import query_rpc_devices

        inventory = merge_rpc_devices(inventory, query_rpc_devices(placement.rpc_servers))
    profile = load_profile_option(args.profile, getattr(args, "model_profile", None))
    ctl = PlanController(inventory, profile, placement, inventory_source=source)
    qs = settings or QSettings("sdplan", "sdplan")
    notes: list[str] = []
    args.profile = args.profile or getattr(args, "model_profile", None)
    flags_given = any(getattr(args, k, None) for k in ("backend", "params_backend", "max_vram"))
    if args.files:
        ctl.open_files(args.files)
    elif getattr(args, "demo", False):
        if not open_demo(ctl, auto=not flags_given):  # placement flags given: that placement
            raise SdplanError("the demo model is not installed (resources/demo)")
    elif not args.profile:
        # a screenshot shows what a new user sees (the demo), never the last session; placement
        # flags open the demo on that placement rather than restore another plan
        restored, note = (False, None) if args.screenshot or flags_given else restore_last_plan(ctl, qs)
        if note:
            notes.append(note)
        if not restored:
            open_demo(ctl, auto=not flags_given)
    given = {k: getattr(args, k, None) for k in ("prompt", "lora_model_dir", "init_img", "mask", "strength")}
    ctl.set_generation(**{k: v for k, v in given.items() if v is not None})
    win = MainWindow(ctl, qs, auto_refresh=not args.devices and not args.screenshot)  # type: ignore[arg-type]
    for note in notes:
        win.add_startup_note(note)
    return ctl, win


def restore_last_plan(ctl: object, qs: object) -> tuple[bool, str | None]:
    """Restore the last session's plan (QSettings ``plan/last``, read with the bounded JSON
    reader) when all its model files are still here: ``(restored, note)``. A saved plan that
    cannot be read is set aside (moved to ``plan/last-set-aside``) with a note, and the app
    starts as without one; files that are gone leave it in place, without a note."""
    from sdplan.core.planning import paths
    from sdplan.core.planning.bounded_json import loads

    last = qs.value("plan/last")  # type: ignore[attr-defined]
    if not last:
        return False, None
    try:
        data = loads(str(last), "the last session's plan")
        files = [p for v in (data.get("model_files") or {}).values() for p in v]
        if not (files and all(isinstance(p, str) and paths.is_file(p) for p in files)):
            return False, None
        ctl.load_plan_json(data, source="last session")  # type: ignore[attr-defined]
        ctl.undo_stack.clear()  # type: ignore[attr-defined]
        return True, None
    except (SdplanError, OSError, ValueError, AttributeError, TypeError, KeyError) as exc:
        qs.setValue("plan/last-set-aside", str(last))  # type: ignore[attr-defined]
        qs.remove("plan/last")  # type: ignore[attr-defined]
        note = (f"the last session's plan was not restored ({type(exc).__name__}: "
                f"{str(exc)[:160]}); it was set aside")
        log.warning("%s", note)
        return False, note


def _generate_and_wait(win: object, app: object, timeout_s: float = 600.0) -> bool:
    """Run one generation in ``win``'s panel and process events until it ends; False (with
    the reason on stderr) when it cannot start, fails or takes longer than ``timeout_s``."""
    import time

    panel = win.generation  # type: ignore[attr-defined]
    if not panel.generate():
        print(f"sdplan gui: cannot generate: {panel.state.text()}", file=sys.stderr)
        return False
    deadline = time.monotonic() + timeout_s
    while panel.is_running() and time.monotonic() < deadline:
        app.processEvents()  # type: ignore[attr-defined]
        time.sleep(0.02)
    for _ in range(5):
        app.processEvents()  # type: ignore[attr-defined]
    ok = not panel.is_running() and bool(panel.last_images)
    if not ok:
        print(f"sdplan gui: generation did not finish: {panel.error_label.text() or 'timeout'}",
              file=sys.stderr)
    panel.shutdown()
    return ok


def run_gui(args: argparse.Namespace) -> int:
    """Open the window for parsed ``sdplan gui`` options (or, with ``--screenshot OUT.png``,
    render it offscreen at ``--size`` (1440x900), save it and exit). Returns the exit code (2 on a bad
    argument file)."""
    import os

    if args.screenshot and "QT_QPA_PLATFORM" not in os.environ:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication
    from sdplan.app.icons import app_icon

    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "sdplan"])
    app.setApplicationName("sdplan")
    app.setOrganizationName("sdplan")
    app.setWindowIcon(app_icon())
    if args.screenshot:  # render without reading or overwriting the user's saved session
        import gc
        import tempfile

        scratch = tempfile.TemporaryDirectory(prefix="sdplan-screenshot-")
        try:
            return _open_window(args, app, QSettings(str(Path(scratch.name) / "sdplan.ini"),
                                                     QSettings.Format.IniFormat))
        finally:  # the window and its settings are gone (their last write done), then the folder
            gc.collect()
            scratch.cleanup()
    return _open_window(args, app, QSettings("sdplan", "sdplan"))


def _open_window(args: argparse.Namespace, app: Any, settings: Any) -> int:
    """Build the window with ``settings`` and show it (the event loop's exit code), or with
    ``--screenshot`` render it, save the picture and close it (0, or 2 when it cannot)."""
    from PySide6.QtCore import QEvent
    from sdplan.app.window import apply_theme

    mode = "light" if args.screenshot and not args.theme else (
        args.theme or str(settings.value("view/theme") or "system"))
    apply_theme(app, mode)  # type: ignore[arg-type]
    try:
        _, win = build_window(args, settings)
    except SdplanError as exc:
        print(f"sdplan gui: {exc}", file=sys.stderr)
        return 2
    if mode in win.theme_actions:
        win.theme_actions[mode].setChecked(True)
    if args.screenshot:
        win.keep_size = True  # the picture's size, whatever the (offscreen) screen
        win.resize(*getattr(args, "size", (1440, 900)))
        win.show()
        tab = getattr(args, "tab", None)
        if tab == "queue":
            win.side.setCurrentWidget(win.queue_panel)
        elif tab:
            win.tabs.setCurrentIndex(("board", "library", "gallery").index(tab))
        if tab == "library" and win.library.is_scanning():
            import time

            deadline = time.monotonic() + 120
            while win.library.is_scanning() and time.monotonic() < deadline:
                app.processEvents()
                time.sleep(0.02)
        for _ in range(5):
            app.processEvents()
        if getattr(args, "generate", False) and not _generate_and_wait(win, app):
            win.close()
            return 2
        out = Path(args.screenshot)
        ok = win.grab().save(str(out))
        win.close()
        win.deleteLater()
        app.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # its settings written now
        if not ok:
            print(f"sdplan gui: cannot write {out}", file=sys.stderr)
            return 2
        return 0
    win.show()
    return int(app.exec())
