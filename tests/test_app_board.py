"""The placement board driven through its real widgets and item model (pytest-qt)."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from PySide6.QtCore import QPointF, QSettings, Qt  # noqa: E402
from PySide6.QtGui import QDragEnterEvent, QDragMoveEvent, QDropEvent  # noqa: E402
from sdplan.app.board.model import DEFAULT  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.window import MainWindow  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.placement import Placement  # noqa: E402
from sdplan.core.planning.profile import ModuleProfile, Profile  # noqa: E402

GIB = 1 << 30


def d1() -> Inventory:
    return Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB, "0000:01:00.0"),
                      Device("CUDA1", "RTX 3060", "gpu", "CUDA", 11 * GIB, 12 * GIB),
                      Device("CPU", "Ryzen", "cpu", "CPU", 48 * GIB, 64 * GIB)))


def flux() -> Profile:
    return Profile({"diffusion": ModuleProfile((400 << 20,) * 57, 120 << 20),
                    "te": ModuleProfile((360 << 20,) * 24, 700 << 20,
                                        {"clip_l": 240 << 20, "t5xxl": 9 * GIB}, "t5xxl"),
                    "vae": ModuleProfile((), 160 << 20)}, "flux1-dev.safetensors", "flux-dev")


@pytest.fixture
def win(qtbot, tmp_path):
    ctl = PlanController(d1(), flux(), Placement())
    w = MainWindow(ctl, QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat),
                   history_dir=tmp_path / "history")
    qtbot.addWidget(w)
    w.resize(1440, 900)
    w.show()
    return w


def field(win, flag):
    return win.strings.fields[flag].text()


def drop_on(win, target, module, source, ctrl=False):
    """A constructed drag enter/move/drop on a column (QDrag.exec delivers nothing offscreen)."""
    col = win.board.default if target == DEFAULT else win.board.columns[target]
    model = win.board.model
    mime = model.mimeData([model.card_index(source, module)])
    mods = Qt.KeyboardModifier.ControlModifier if ctrl else Qt.KeyboardModifier.NoModifier
    action = Qt.DropAction.CopyAction if ctrl else Qt.DropAction.MoveAction
    actions = Qt.DropAction.MoveAction | Qt.DropAction.CopyAction
    pos = QPointF(40, 40)
    enter = QDragEnterEvent(pos.toPoint(), actions, mime, Qt.MouseButton.LeftButton, mods)
    col.dragEnterEvent(enter)
    assert enter.isAccepted()
    move = QDragMoveEvent(pos.toPoint(), actions, mime, Qt.MouseButton.LeftButton, mods)
    col.dragMoveEvent(move)
    drop = QDropEvent(pos, actions, mime, Qt.MouseButton.LeftButton, mods)
    col.dropEvent(drop)
    assert drop.dropAction() == action
    return move.isAccepted()


def test_columns_show_devices_and_cards(win):
    assert list(win.board.columns) == ["CUDA0", "CUDA1", "CPU"]
    cards = [c.module for c in win.board.columns["CUDA0"].cards]
    assert cards == ["diffusion", "te", "vae"]
    te = win.board.columns["CUDA0"].cards[1]
    assert "t5xxl" in " ".join(lbl.text() for lbl in te.findChildren(type(te.size_label)))
    # all of Flux on a 22 GiB card does not fit: bar, column and cards turn red with reasons
    col = win.board.columns["CUDA0"]
    assert col.bar.data.over and col.property("over")
    assert all(c.property("over") for c in col.cards)
    assert "Does not fit" in col.cards[0].toolTip()
    assert not win.board.columns["CUDA1"].property("over")


def test_model_drop_moves_module(win):
    model = win.board.model
    mime = model.mimeData([model.card_index("CUDA0", "te")])
    assert model.dropMimeData(mime, Qt.DropAction.MoveAction, -1, -1,
                              model.target_index("CUDA1"))
    assert field(win, "--backend") == "CUDA0,te=CUDA1"
    assert [c.module for c in win.board.columns["CUDA1"].cards] == ["te"]
    assert "--backend CUDA0,te=CUDA1" in win.strings.command.toPlainText()


def test_ctrl_drop_splits_with_ranges_and_main_device(win):
    drop_on(win, "CUDA1", "diffusion", "CUDA0", ctrl=True)
    assert field(win, "--backend") == "CUDA0,diffusion=CUDA0&CUDA1"
    part = [c for c in win.board.columns["CUDA1"].cards if c.module == "diffusion"]
    assert part and part[0].card.kind == "part"
    plan = win.ctl.plan.modules["diffusion"]
    assert [r.device for r in plan.ranges] == ["CUDA0", "CUDA1"]
    from sdplan.app.board.cards import SplitStrip

    strip = win.board.columns["CUDA0"].cards[0].findChild(SplitStrip)
    assert strip.main == "CUDA0"
    assert strip.ranges == [(r.device, r.first_block, r.last_block) for r in plan.ranges]


def test_split_refused_for_vae_with_reason(win, qtbot):
    before = win.ctl.plan.backend
    with qtbot.waitSignal(win.ctl.status) as sig:
        accepted = drop_on(win, "CUDA1", "vae", "CUDA0", ctrl=True)
    assert not accepted
    assert "vae cannot run on several devices" in sig.args[0]
    assert win.ctl.plan.backend == before
    assert win.board.model.canDropMimeData(
        win.board.model.mimeData([win.board.model.card_index("CUDA0", "vae")]),
        Qt.DropAction.MoveAction, -1, -1, win.board.model.target_index("CUDA1"))


def test_plain_drop_and_default_target(win):
    drop_on(win, "CPU", "vae", "CUDA0")
    assert field(win, "--backend") == "CUDA0,vae=CPU"
    drop_on(win, DEFAULT, "vae", "CPU")
    assert field(win, "--backend") == "CUDA0"
    assert "vae" in win.board.default.follows.text()


def test_residency_switch(win):
    te = next(c for c in win.board.columns["CUDA0"].cards if c.module == "te")
    te.residency_buttons["disk"].click()
    assert field(win, "--params-backend") == "te=disk"
    te = next(c for c in win.board.columns["CUDA0"].cards if c.module == "te")
    assert te.residency_buttons["disk"].isChecked()
    te.residency_buttons["device"].click()
    assert field(win, "--params-backend") == "te=CPU"
    # the weights now show in the CPU column and its memory bar
    assert [(c.module, c.card.kind) for c in win.board.columns["CPU"].cards] == [("te", "weights")]
    assert ("te", "weights", flux().modules["te"].total) in win.board.columns["CPU"].bar.data.segments
    te = next(c for c in win.board.columns["CUDA0"].cards if c.module == "te")
    te.residency_buttons["runtime"].click()
    assert field(win, "--params-backend") == ""


def test_budget_spin_and_marker_drag_with_undo(win):
    col = win.board.columns["CUDA1"]
    col.budget.setValue(6.0)
    assert field(win, "--max-vram") == "CUDA1=6"
    assert win.ctl.plan.budgets["CUDA1"] == 6 * GIB
    col.bar.budgetDragged.emit(7.5)
    col.bar.budgetDragged.emit(8.0)
    assert field(win, "--max-vram") == "CUDA1=8"
    assert win.board.columns["CUDA1"].budget.value() == 8.0
    win.ctl.undo_stack.undo()  # the whole drag is one step
    assert field(win, "--max-vram") == "CUDA1=6"
    win.ctl.undo_stack.undo()
    assert field(win, "--max-vram") == ""


def test_undo_redo_board_changes(win):
    drop_on(win, "CUDA1", "te", "CUDA0")
    drop_on(win, "CPU", "vae", "CUDA0")
    assert field(win, "--backend") == "CUDA0,te=CUDA1,vae=CPU"
    win.undo_act.trigger()
    assert field(win, "--backend") == "CUDA0,te=CUDA1"
    assert [c.module for c in win.board.columns["CUDA0"].cards] == ["diffusion", "vae"]
    win.undo_act.trigger()
    assert field(win, "--backend") == "CUDA0"
    win.redo_act.trigger()
    win.redo_act.trigger()
    assert field(win, "--backend") == "CUDA0,te=CUDA1,vae=CPU"


def test_context_menu_is_the_keyboard_path_to_a_split(win):
    card = win.board.columns["CUDA0"].cards[0]
    menu = card.build_menu()
    split = next(a.menu() for a in menu.actions() if a.text() == "Add to layer split")
    act = next(a for a in split.actions() if a.text() == "CUDA1")
    act.trigger()
    assert field(win, "--backend") == "CUDA0,diffusion=CUDA0&CUDA1"
    vae = next(c for c in win.board.columns["CUDA0"].cards if c.module == "vae")
    vmenu = vae.build_menu()
    assert not next(a for a in vmenu.actions() if a.text().startswith("Add to layer")).isEnabled()


def test_auto_plan_proposal_fits_and_applies(win):
    dlg = win.propose()
    assert dlg.proposal.fits
    assert dlg.table.rowCount() > 0
    win.ctl.edit(dlg.proposal.placement, "auto plan")
    assert win.ctl.fit.fits
    assert "&" in win.ctl.plan.backend  # Flux does not fit one card: it is split
    win.ctl.undo_stack.undo()
    assert win.ctl.plan.backend == "CUDA0"


def test_add_module_menu_adds_a_card(win):
    act = next(a for a in win.add_module_menu.actions() if "(upscaler)" in a.text())
    act.trigger()
    assert "upscaler" in [c.module for c in win.board.columns["CUDA0"].cards]
    assert len(win.add_module_menu.actions()) == 8


def test_bar_tooltip_and_legend_name_every_part_in_gib(win):
    from sdplan.app.board.memory_bar import LEGEND

    col = win.board.columns["CUDA0"]
    tip = col.bar.toolTip()
    fit = win.ctl.fit
    w = fit.modules["te"].weights["CUDA0"]
    assert f"resident weights · te: {w / GIB:.2f} GiB" in tip
    comp = max(e.compute.get("CUDA0", 0) for e in fit.modules.values())
    assert "compute estimate · " in tip and f"{comp / GIB:.2f} GiB" in tip
    assert "total 24.00 GiB · free 22.00 GiB · in use by other programs 2.00 GiB" in tip
    assert "headroom (hatched end): 2.00 GiB" in tip
    assert tip.startswith("✕ Does not fit")  # all of Flux on CUDA0
    win.ctl.set_budget("CUDA0", 8)
    assert "--max-vram budget (marker): 8.00 GiB" in col.bar.toolTip()
    labels = [label for _, label, _ in LEGEND]
    assert labels == ["in use", "resident weights", "LoRA", "staged range", "compute estimate",
                      "headroom", "--max-vram"]
    legend = win.board.legend
    assert legend.isVisible() and 0 < legend.sizeHint().width() < win.board.width()
    assert all(label in legend.toolTip() for label in labels)


def test_plan_for_builtin_profile_menu(win):
    from sdplan.core.planning.builtin_profiles import list_profiles

    acts = [a for m in win.plan_for_menu.actions() if m.menu() for a in m.menu().actions()]
    assert sorted(a.data() for a in acts) == sorted(p.name for p in list_profiles())
    q8 = next(a for a in acts if a.data() == "flux1-dev-q8_0")
    q8.trigger()
    assert win.ctl.profile.name == "flux1-dev-q8_0"
    assert win.model_label.text() == "flux1-dev-q8_0"
    assert [c.module for c in win.board.columns["CUDA0"].cards] == ["diffusion", "te", "vae"]
    total = sum(win.ctl.profile.modules[m].total for m in ("diffusion", "te", "vae"))
    info = next(p for p in list_profiles() if p.name == "flux1-dev-q8_0")
    assert total == info.total_bytes


def test_command_has_model_file_flags_when_files_are_open(win):
    from pathlib import Path

    tiny = Path(__file__).parent / "fixtures" / "sd1_tiny.safetensors"
    assert win.open_files([str(tiny)])
    cmd = win.strings.command.toPlainText()
    assert cmd.startswith(f"sd-cli --model {tiny} ")
    assert "--backend" in cmd
