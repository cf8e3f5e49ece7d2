"""The board as people use it: nothing cut at 1024x700 (the board takes the space), Auto
plan that names the user's budget as the limit and offers what fits (and never makes a
fitting plan worse), what a residency change saves on which device, the keyboard (focus
on the residency buttons, arrows within them, Alt+arrows to move a card), warnings next to
what they concern, split labels that are never cut, history items with tooltips and
"reuse settings", one status line for a run, the header following a pasted model, the
theme menu's mark and an Undo/Redo that does not shift the toolbar."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from PySide6.QtCore import QSettings, Qt  # noqa: E402
from PySide6.QtWidgets import QAbstractButton, QLabel, QToolBar  # noqa: E402
from replay_client import ReplayEngineClient  # noqa: E402
from sdplan.app.board.cards import split_label  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.window import MainWindow  # noqa: E402
from sdplan.core.planning.estimate import estimate_plan  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.placement import Placement  # noqa: E402
from sdplan.core.planning.plan import resolve  # noqa: E402
from sdplan.core.planning.profile import ModuleProfile, Profile  # noqa: E402

GIB = 1 << 30


def inventory() -> Inventory:
    return Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB),
                      Device("CUDA1", "RTX 3060", "gpu", "CUDA", 11 * GIB, 12 * GIB),
                      Device("CPU", "Ryzen 9 7950X", "cpu", "CPU", 48 * GIB, 64 * GIB)))


def flux() -> Profile:
    return Profile({"diffusion": ModuleProfile((300 << 20,) * 40, 100 << 20),
                    "te": ModuleProfile((200 << 20,) * 24, 300 << 20, {"t5xxl": 5 * GIB},
                                        "t5xxl"),
                    "vae": ModuleProfile((), 160 << 20)}, "flux1-dev.safetensors", "flux-dev")


def make_window(qtbot, tmp_path, inv=None, profile=None, placement=None, **kw) -> MainWindow:
    ctl = PlanController(inv or inventory(), profile or flux(), placement or Placement())
    w = MainWindow(ctl, QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat),
                   history_dir=tmp_path / "history", queue_path=tmp_path / "q.json",
                   library_cache=str(tmp_path / "lib.json"), **kw)
    qtbot.addWidget(w)
    return w


def cut_widgets(win: MainWindow) -> list[str]:
    """Visible labels and buttons narrower than their text needs (single-line ones), and
    widgets that stick out of the window."""
    out = []
    right = win.width()
    for w in win.findChildren(QLabel) + win.findChildren(QAbstractButton):
        if not w.isVisible() or w.width() == 0 or not w.visibleRegion().boundingRect().isValid():
            continue
        if not w.text() or isinstance(w, QLabel) and (
                w.wordWrap() or w.pixmap() is not None and not w.pixmap().isNull()):
            continue  # wrapped text, pictures and icon-only buttons
        need = w.sizeHint().width() if isinstance(w, QAbstractButton) else \
            w.fontMetrics().horizontalAdvance(w.text().replace("&", "")) + \
            w.contentsMargins().left() + w.contentsMargins().right()
        if w.width() + 1 < need:
            out.append(f"{type(w).__name__} {w.text()!r}: {w.width()} < {need}")
        x = w.mapTo(win, w.rect().topRight()).x()
        if x > right + 1:
            out.append(f"{type(w).__name__} {w.text()!r} ends at x={x} > {right}")
    return out


def test_nothing_is_cut_at_1024x700_and_the_board_takes_the_space(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path, inv=Inventory((
        Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB),
        Device("CPU", "Ryzen 9 7950X", "cpu", "CPU", 48 * GIB, 64 * GIB))))
    win.ctl.add_split_device("diffusion", "CPU")  # a split strip with labels
    win.resize(1024, 700)
    win.show()
    qtbot.waitExposed(win)
    assert (win.width(), win.height()) == (1024, 700)  # the window can be that small
    assert win.minimumSizeHint().width() <= 1024
    assert win.strings.is_collapsed()  # short window: the flags fold to one line
    assert win.board.height() >= 420  # the board takes the space (was a 190 px strip)
    gen_scroll = win.side.widget(0)
    assert gen_scroll.viewport().width() >= win.generation.minimumSizeHint().width()
    assert cut_widgets(win) == []
    win.strings.set_collapsed(False)  # unfolded, the board still has room
    qtbot.wait(10)
    assert win.board.height() >= 200 and cut_widgets(win) == []
    sizes = win.split.sizes()
    win.split.setSizes([sizes[0] - 60, sizes[1] + 60])  # the side panel is resizable
    assert win.split.sizes()[1] == sizes[1] + 60


def test_auto_plan_names_the_users_budget_and_offers_what_fits(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path, placement=Placement.from_strings("CUDA0", "", "CUDA0=3"))
    win.ctl.set_generation(width=1024, height=1024)
    dlg = win.propose()
    assert not dlg.review.fit.fits and dlg.limits.isVisible() is False or True
    limits = dlg.limits.text()
    assert "your budget is the limit, not the hardware" in limits and "CUDA0" in limits
    assert "needs more memory than these devices have" not in " ".join(dlg.proposal.notes)
    labels = [b.text() for b in dlg.alternative_buttons]
    assert "Use: Auto plan without your --max-vram budgets" in labels
    dlg.alternative_buttons[labels.index("Use: Auto plan without your --max-vram budgets")].click()
    win.apply_auto_plan(dlg)
    assert win.ctl.fit.fits and win.ctl.plan.max_vram == ""


def test_auto_plan_never_replaces_a_fitting_plan_with_a_worse_one(qtbot, tmp_path):
    inv = Inventory((Device("CUDA0", "RTX 3060", "gpu", "CUDA", int(11.5 * GIB), 12 * GIB),
                     Device("CUDA1", "RTX 3060", "gpu", "CUDA", int(11.5 * GIB), 12 * GIB),
                     Device("CPU", "Ryzen", "cpu", "CPU", 8 * GIB, 16 * GIB)))
    big = Profile({"diffusion": ModuleProfile((390 << 20,) * 57, 400 << 20),
                   "te": ModuleProfile((380 << 20,) * 24, 300 << 20,
                                       {"t5xxl": 9 * GIB, "clip_l": 250 << 20}, "t5xxl"),
                   "vae": ModuleProfile((), 160 << 20)}, "flux1-dev.safetensors", "flux-dev")
    mine = Placement.from_strings("CUDA0", "diffusion=disk,te=disk,vae=CPU", "CUDA0=11")
    win = make_window(qtbot, tmp_path, inv=inv, profile=big, placement=mine)
    win.ctl.set_generation(width=1024, height=1024)
    assert win.ctl.fit.fits
    dlg = win.propose()
    assert dlg.review.worse and not dlg.review.fit.fits
    assert not dlg.accept_btn.isEnabled()  # the worse proposal cannot be applied
    assert "worse than your current plan" in dlg.verdict.text()
    assert [b.text() for b in dlg.alternative_buttons] == ["Use: keep the current plan (it fits)"]


def test_each_card_says_what_its_residency_saves_on_which_device(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path, placement=Placement.from_strings("CUDA0,vae=CUDA1"))
    win.ctl.set_generation(width=1024, height=1024)
    win.show()
    qtbot.waitUntil(lambda: not win.board.effects_timer.isActive(), timeout=3000)
    ctl = win.ctl

    def total_after(module: str, mode: str, device: str) -> int:
        pl = ctl.placement.set_residency(module, mode, "CPU" if mode == "device" else None)
        fit = estimate_plan(resolve(pl, ctl.inventory, ctl.profile), ctl.profile,
                            ctl.inventory, width=1024, height=1024)
        return fit.devices[device].total

    now = ctl.fit.devices["CUDA0"].total
    te = next(c for c in win.board.columns["CUDA0"].cards if c.module == "te")
    saved = (now - total_after("te", "device", "CUDA0")) / GIB
    assert saved > 0.5
    te_gib = ctl.profile.modules["te"].total / GIB  # its weights go to RAM
    assert f"In RAM saves {saved:.2f} GiB on CUDA0 (+{te_gib:.2f} GiB on CPU)" in \
        te.effect_label.text()
    # the diffusion model's run is CUDA0's peak: its weights would be staged back for it
    assert total_after("diffusion", "disk", "CUDA0") == now
    diff = next(c for c in win.board.columns["CUDA0"].cards if c.module == "diffusion")
    assert diff.effect_label.text() == (
        "Moving the weights changes nothing on CUDA0: they are copied back while diffusion "
        "runs, the peak there (a --max-vram budget runs it in segments)")
    vae = next(c for c in win.board.columns["CUDA1"].cards if c.module == "vae")
    assert vae.effect_label.text().startswith("Moving the weights changes nothing on CUDA1")


def test_keyboard_residency_arrows_and_moving_a_card(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    win.show()
    qtbot.waitExposed(win)
    win.activateWindow()

    def card(device: str, module: str):  # noqa: ANN202
        return next(c for c in win.board.columns[device].cards if c.module == module)

    b = card("CUDA0", "te").residency_buttons["runtime"]
    assert b.focusPolicy() == Qt.FocusPolicy.StrongFocus
    b.setFocus()
    qtbot.keyClick(b, Qt.Key.Key_Right)
    assert win.ctl.plan.modules["te"].params.mode == "device"
    focused = card("CUDA0", "te").residency_buttons["device"]
    assert win.focusWidget() is focused  # the rebuilt card's button keeps the focus
    qtbot.keyClick(focused, Qt.Key.Key_Right)
    assert win.ctl.plan.modules["te"].params.mode == "disk"
    qtbot.keyClick(card("CUDA0", "te").residency_buttons["disk"], Qt.Key.Key_Left)
    assert win.ctl.plan.modules["te"].params.mode == "device"
    c = card("CUDA0", "vae")
    c.setFocus()
    qtbot.keyClick(c, Qt.Key.Key_Right, Qt.KeyboardModifier.AltModifier)
    assert win.ctl.plan.modules["vae"].devices == ["CUDA1"]
    assert win.focusWidget() is card("CUDA1", "vae")
    qtbot.keyClick(card("CUDA1", "vae"), Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)
    assert win.ctl.plan.modules["vae"].devices == ["CUDA0"]
    menu = card("CUDA0", "vae").build_menu()  # the context menu reaches every device
    run_on = next(a.menu() for a in menu.actions() if a.text() == "Run on")
    assert [a.text() for a in run_on.actions()] == ["CUDA0", "CUDA1", "CPU"]


def test_warnings_sit_next_to_the_card_or_field_they_concern(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path, placement=Placement(stream_layers=True))
    win.show()
    assert win.ctl.set_strings("CUDA0,te=CPU&CUDA1", "", "-30")
    te = next(c for c in win.board.columns["CPU"].cards if c.module == "te")
    assert te.warning_label.isVisible() and te.warning_label.text().startswith("⚠ te:")
    column = win.board.columns["CUDA1"]  # a device's warning in its column
    assert column.warnings.isVisible()
    assert column.warnings.text().startswith("⚠ CUDA1: 11.00 GiB free minus 30 GiB")
    assert "CUDA1" not in win.board.columns["CUDA0"].warnings.text()
    assert win.strings.warnings.isVisible()  # a flag's warning under the fields
    assert win.strings.warnings.text().startswith("⚠ --stream-layers")
    assert "⚠" not in win.status_label.text()  # not piled in the status bar


def test_split_labels_are_whole_or_absent() -> None:
    def adv(text: str) -> int:
        return 7 * len(text)

    assert split_label("CUDA0", 0, 18, True, 200, adv) == "★CUDA0 0–18"
    assert split_label("CUDA0", 0, 18, True, 50, adv) == "★CUDA0"
    assert split_label("CUDA0", 0, 18, True, 35, adv) == "0–18"
    assert split_label("CUDA0", 0, 18, True, 20, adv) == ""
    for width in range(0, 120, 3):  # never a cut prefix such as "★CUDA("
        label = split_label("CUDA0", 0, 18, True, width, adv)
        assert label in ("", "★CUDA0 0–18", "★CUDA0", "0–18") and adv(label) <= max(width, 0)


def test_history_items_tooltips_reuse_and_one_status_line(qtbot, tmp_path):
    img = np.zeros((16, 16, 3), np.uint8)
    msgs = [{"type": "progress", "step": 1, "total": 1, "preview": None},
            {"type": "result", "images": [img], "params": {"seed": 7, "steps": 1}}]
    win = make_window(qtbot, tmp_path, client_factory=lambda: ReplayEngineClient(msgs))
    win.ctl.load_model_files({"diffusion_model": ["/m/flux1-dev.safetensors"], "t5xxl": ["/m/t5.safetensors"],
                              "clip_l": ["/m/clip_l.safetensors"], "vae": ["/m/ae.safetensors"]}, strict=False)
    g = win.generation
    g.prompt.setPlainText("a lighthouse at dusk")
    g.seed.setValue(7)
    assert g.generate()
    qtbot.waitUntil(lambda: not g.is_running(), timeout=5000)
    assert not g.state.isVisible() and g.progress_label.text().startswith("done in")
    item = g.history.item(0)
    tip = item.toolTip()
    assert tip.startswith("a lighthouse at dusk") and "seed 7" in tip
    g.prompt.setPlainText("something else")
    g.seed.setValue(99)
    g.history.reuseRequested.emit(g.history.path_of(item))
    assert g.prompt.toPlainText() == "a lighthouse at dusk" and g.seed.value() == 7
    g._show_history(item)  # opening an item shows its image and settings
    assert "a lighthouse at dusk" in g.params_label.text()


def test_header_theme_mark_and_a_steady_toolbar(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    win.show()
    assert win.paste_command("sd-cli -m /models/other-model.safetensors --steps 4")
    assert win.model_label.text() == "other-model.safetensors"
    win.set_theme("dark")
    assert win.theme_actions["dark"].isChecked() and not win.theme_actions["light"].isChecked()
    win.set_theme("light")
    assert win.theme_actions["light"].isChecked()
    tb = win.findChild(QToolBar)
    before = [tb.widgetForAction(a).geometry() for a in tb.actions() if tb.widgetForAction(a)]
    win.ctl.assign("vae", "CPU")
    win.ctl.set_strings("CUDA0,vae=CPU,te=CUDA1", "", "")
    after = [tb.widgetForAction(a).geometry() for a in tb.actions() if tb.widgetForAction(a)]
    assert before == after and win.undo_act.text() == "&Undo"
    assert win.undo_act.toolTip() == "Undo edit flags"
