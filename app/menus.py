"""The main window's actions, menus and toolbar (:func:`install_menus`), and the "Plan
for…" menu of built-in model profiles. Every action calls a window or controller method; no
action is connected to a lambda that takes Qt's ``checked`` argument as a value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QIcon, QKeySequence
from PySide6.QtWidgets import QMenu
from sdplan.app import theme
from sdplan.app.dialogs import about, syntax_help
from sdplan.app.icons import dot_pixmap
from sdplan.core.errors import SdplanError
from sdplan.core.planning.modules import MODULES

#: The main window (:class:`sdplan.app.window.MainWindow`, which imports this module).
MainWindow = Any


def make_action(win: MainWindow, text: str, slot: Callable[[], Any],
                shortcut: QKeySequence | QKeySequence.StandardKey | str | None = None,
                tip: str = "") -> QAction:
    """An action of ``win`` that calls ``slot()`` without arguments (Qt's ``triggered``
    passes ``checked``, which a slot with an optional first argument would take)."""
    a = QAction(text, win)
    if shortcut is not None:
        a.setShortcut(QKeySequence(shortcut))
    if tip:
        a.setToolTip(tip)
        a.setStatusTip(tip)
    a.triggered.connect(lambda _checked=False: slot())
    return a


def install_menus(win: MainWindow) -> None:
    """Create ``win``'s actions (``open_act``, ``undo_act``, ``redo_act``, ``auto_act``,
    ``refresh_act``, ``copy_act``, ``paste_act``, ``auto_fit_act``, ``pin_act``,
    ``auto_refresh_act``, ``flags_act``, ``queue_act``, ``theme_actions``), its menus
    (``recent_menu``, ``plan_for_menu``, ``add_module_menu``) and the toolbar."""
    K = QKeySequence.StandardKey
    act = make_action
    win.open_act = act(win, "&Open model files…", win.open_dialog, K.Open,
                       "Open model files (safetensors, GGUF)")
    # fixed texts (the step's name goes to the tooltip) so the toolbar never shifts
    stack = win.ctl.undo_stack
    win.undo_act = act(win, "&Undo", stack.undo, K.Undo)
    win.redo_act = act(win, "&Redo", stack.redo)
    # the platform's Redo keys and both common ones, each once (a key given twice to one
    # action is ambiguous to Qt: neither fires)
    redo_keys: list[QKeySequence] = []
    for key in [*QKeySequence.keyBindings(K.Redo), QKeySequence("Ctrl+Y"),
                QKeySequence("Ctrl+Shift+Z")]:
        if key.toString() and all(key != k for k in redo_keys):
            redo_keys.append(key)
    win.redo_act.setShortcuts(redo_keys)
    # connected to the actions themselves (never to a lambda that outlives them)
    stack.canUndoChanged.connect(win.undo_act.setEnabled)
    stack.canRedoChanged.connect(win.redo_act.setEnabled)
    stack.undoTextChanged.connect(win.undo_tip)
    stack.redoTextChanged.connect(win.redo_tip)
    win.undo_act.setEnabled(stack.canUndo())
    win.redo_act.setEnabled(stack.canRedo())
    win.auto_act = act(win, "&Auto plan…", win.auto_plan, "Ctrl+Shift+A",
                       "Propose a placement that fits (largest modules on the most free "
                       "memory, split, then weights to RAM or disk)")
    win.refresh_act = act(win, "&Refresh devices", win.refresh_devices, "F5",
                          "Re-read free memory of every device")
    win.copy_act = act(win, "&Copy sd-cli command", win.copy_command, "Ctrl+Shift+C")
    win.paste_act = act(win, "&Paste sd-cli command", win.paste_command, "Ctrl+Shift+V")
    file_menu = win.menuBar().addMenu("&File")
    file_menu.addAction(win.open_act)
    win.recent_menu = file_menu.addMenu("Open &recent")
    file_menu.addSeparator()
    file_menu.addAction(act(win, "&Import plan…", win.import_plan, "Ctrl+I"))
    file_menu.addAction(act(win, "&Export plan…", win.export_plan, "Ctrl+E"))
    file_menu.addSeparator()
    file_menu.addAction(act(win, "Load &hardware profile…", win.load_hardware,
                            tip="Plan for the devices of another machine"))
    file_menu.addAction(act(win, "&Save hardware profile…", win.save_hardware,
                            tip="Save these devices as an inventory JSON"))
    file_menu.addAction(act(win, "Load model &profile…", win.load_profile))
    file_menu.addSeparator()
    win.output_act = act(win, "O&utput folder…", win.choose_output_folder,
                         tip="Where generated pictures are saved (the gallery shows them)")
    file_menu.addAction(win.output_act)
    file_menu.addSeparator()
    file_menu.addAction(act(win, "&Quit", win.close, K.Quit))
    edit = win.menuBar().addMenu("&Edit")
    edit.addActions([win.undo_act, win.redo_act])
    edit.addSeparator()
    edit.addActions([win.copy_act, win.paste_act])
    plan = win.menuBar().addMenu("&Plan")
    plan.addAction(win.auto_act)
    win.auto_fit_act = QAction("sd-cli &auto-fit", win, checkable=True)
    win.auto_fit_act.setToolTip("Show the placement sd-cli's --auto-fit chooses for these "
                                "devices and budgets")
    win.auto_fit_act.toggled.connect(win.ctl.set_auto_fit)
    plan.addAction(win.auto_fit_act)
    win.pin_act = act(win, "&Pin auto-fit's placement", win.pin_auto_fit,
                      tip="Write sd-cli's auto-fit choice as explicit --backend / "
                          "--params-backend strings")
    plan.addAction(win.pin_act)
    win.plan_for_menu = plan.addMenu("Plan &for…")
    win.plan_for_menu.setToolTipsVisible(True)
    builtin_menu(win.plan_for_menu, win.plan_for)
    win.add_module_menu = plan.addMenu("Add &module")
    for m in MODULES:
        a = win.add_module_menu.addAction(QIcon(dot_pixmap(theme.module_colour(m))),
                                          f"{theme.MODULE_TITLES[m]} ({m})")
        a.triggered.connect(lambda _=False, mod=m: win.ctl.add_module(mod))
    plan.addAction(win.refresh_act)
    win.auto_refresh_act = QAction("Refresh free memory every 5 s", win, checkable=True)
    win.auto_refresh_act.toggled.connect(win.set_auto_refresh)
    plan.addAction(win.auto_refresh_act)
    view = win.menuBar().addMenu("&View")
    themes = view.addMenu("&Theme")
    win.theme_group = QActionGroup(win)
    win.theme_actions = {}
    current = str(win.settings.value("view/theme") or "system")
    for mode in ("system", "light", "dark"):
        a = themes.addAction(mode.capitalize())
        a.setCheckable(True)
        a.setChecked(mode == current)
        win.theme_group.addAction(a)
        win.theme_actions[mode] = a
        a.triggered.connect(lambda _=False, md=mode: win.set_theme(md))
    view.addSeparator()
    win.flags_act = QAction("&Flags and sd-cli command", win, checkable=True)
    win.flags_act.setShortcut("Ctrl+Shift+F")
    win.flags_act.setChecked(True)
    win.flags_act.toggled.connect(win.show_flags)
    view.addAction(win.flags_act)
    for i, name in enumerate(("&Board", "&Library", "&Gallery")):
        a = view.addAction(f"{name} tab")
        a.setShortcut(f"Alt+{i + 1}")
        a.triggered.connect(lambda _=False, idx=i: win.tabs.setCurrentIndex(idx))
    win.queue_act = act(win, "Add to &queue", win.queue_panel.add_current, "Ctrl+Shift+Return",
                        "Queue the generation settings with this plan")
    plan.addSeparator()
    plan.addAction(win.queue_act)
    help_menu = win.menuBar().addMenu("&Help")
    help_menu.addAction(act(win, "Placement &strings…", lambda: syntax_help(win), "F1"))
    help_menu.addAction(act(win, "&About sdplan", lambda: about(win)))
    tb = win.addToolBar("Main")
    tb.setMovable(False)
    tb.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
    tb.addActions([win.open_act, win.undo_act, win.redo_act])
    tb.addSeparator()
    tb.addAction(win.auto_act)
    tb.addAction(win.refresh_act)


def builtin_menu(menu: QMenu, choose: Callable[[str], object]) -> None:
    """Fill "Plan for…" with the built-in model profiles, one submenu per model; choosing
    one calls ``choose(name)``. A malformed shipped index disables the menu (tooltip says
    why)."""
    from sdplan.core.planning.builtin_profiles import list_profiles

    try:
        infos = list_profiles()
    except SdplanError as exc:
        menu.setEnabled(False)
        menu.setToolTip(str(exc))
        return
    groups: dict[str, QMenu] = {}
    for info in infos:
        model = info.title.removesuffix(" " + info.quant)
        sub = groups.get(model)
        if sub is None:
            sub = groups[model] = menu.addMenu(model)
            sub.setToolTipsVisible(True)
        a = sub.addAction(f"{info.quant}  ·  {info.total_bytes / (1 << 30):.1f} GiB")
        a.setData(info.name)
        a.setToolTip("\n".join([info.name, *(f"{f}: {b / (1 << 30):.2f} GiB"
                                              for f, b in info.files.items()),
                                 *([info.note] if info.note else [])]))
    menu.triggered.connect(lambda action: action.data() and choose(str(action.data())))
