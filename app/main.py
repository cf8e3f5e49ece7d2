"""Start the GUI: ``run_gui(argv)`` parses ``sdplan gui`` arguments and runs the window."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from sdplan.core.errors import SdplanError
from sdplan.core.inventory import Inventory

log = logging.getLogger(__name__)


def file_source(path: str):  # noqa: ANN201 - InventorySource
    """Inventory source for a saved inventory: the file's devices plus, when RPC servers
    are given, the RPC devices of a live query (raises SdplanError on failure)."""

    def source(servers: Sequence[str]) -> Inventory:
        base = Inventory.load(path)
        if not servers:
            return base
        from sdplan.core.devices import live_inventory

        rpc = [d for d in live_inventory(servers) if d.registry.upper() == "RPC"]
        return Inventory((*base.devices, *rpc))

    return source


def live_source(servers: Sequence[str]) -> Inventory:
    """The live devices (CPU alone from /proc/meminfo when the native module is missing)."""
    try:
        from sdplan.core.devices import live_inventory

        return live_inventory(servers)
    except ImportError:
        from sdplan.core.commands.plan import fallback_inventory

        return fallback_inventory()


def build_window(args: argparse.Namespace, settings: object = None):  # noqa: ANN201
    """The controller and main window for parsed ``sdplan gui`` arguments."""
    from PySide6.QtCore import QSettings
    from sdplan.app.controller import PlanController
    from sdplan.app.window import MainWindow
    from sdplan.core.plan import placement_from_namespace
    from sdplan.core.profile import Profile

    placement = placement_from_namespace(args)
    source = file_source(args.devices) if args.devices else live_source
    inventory = source(list(placement.rpc_servers))
    profile = Profile.load(args.profile) if args.profile else None
    ctl = PlanController(inventory, profile, placement,
                         inventory_source=source if not args.devices else file_source(
                             args.devices))
    qs = settings or QSettings("sdplan", "sdplan")
    flags_given = any(getattr(args, k, None) for k in ("backend", "params_backend", "max_vram"))
    if args.files:
        ctl.open_files(args.files)
    elif not flags_given and not args.profile and not args.screenshot:
        last = qs.value("plan/last")  # type: ignore[union-attr]
        if last:
            try:
                ctl.load_plan_json(json.loads(str(last)), source="last session")
                ctl.undo_stack.clear()
            except (SdplanError, ValueError) as exc:
                log.info("last plan not restored: %s", exc)
    win = MainWindow(ctl, qs, auto_refresh=not args.devices and not args.screenshot)  # type: ignore[arg-type]
    return ctl, win


def run_gui(argv: Sequence[str] | argparse.Namespace | None = None) -> int:
    """Open the window (or, with ``--screenshot OUT.png``, render it offscreen at
    1440x900, save it and exit). Returns the exit code (2 on a bad argument file)."""
    if isinstance(argv, argparse.Namespace):
        args = argv
    else:
        from sdplan.core.commands.gui import build_parser

        args = build_parser().parse_args(list(argv or []))
    import os

    if args.screenshot and "QT_QPA_PLATFORM" not in os.environ:
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication
    from sdplan.app.icons import app_icon
    from sdplan.app.window import apply_theme

    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "sdplan"])
    app.setApplicationName("sdplan")
    app.setOrganizationName("sdplan")
    app.setWindowIcon(app_icon())
    settings = QSettings("sdplan", "sdplan")
    mode = "light" if args.screenshot and not args.theme else (
        args.theme or str(settings.value("view/theme") or "system"))
    apply_theme(app, mode)  # type: ignore[arg-type]
    try:
        _, win = build_window(args, settings)
    except SdplanError as exc:
        print(f"sdplan gui: {exc}", file=sys.stderr)
        return 2
    if args.screenshot:
        win.resize(1440, 900)
        win.show()
        for _ in range(5):
            app.processEvents()
        out = Path(args.screenshot)
        ok = win.grab().save(str(out))
        win.close()
        if not ok:
            print(f"sdplan gui: cannot write {out}", file=sys.stderr)
            return 2
        return 0
    win.show()
    return int(app.exec())
