"""The board's predicted time line, driven through the board's item model and the
controller (pytest-qt): it is the session's prediction, and it follows card moves and the
generation settings."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from PySide6.QtCore import QSettings, Qt  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.window import MainWindow  # noqa: E402
from sdplan.core.planning.device_profile import DeviceProfile, Link  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.placement import Placement  # noqa: E402
from sdplan.core.planning.profile import ModuleProfile, Profile  # noqa: E402
from sdplan.core.planning.timing import seconds_text  # noqa: E402

GIB = 1 << 30
FAST = DeviceProfile({"mm:f16": ((1.0, 5e13),)}, mem_bps=8e11, node_s=5e-6, graph_s=1e-4,
                     h2d=Link(2e10, 1e-5), d2h=Link(2e10, 1e-5))
SLOW = DeviceProfile({"mm:f16": ((1.0, 2e11),)}, mem_bps=4e10, node_s=1e-6, graph_s=1e-4,
                     h2d=Link(1e10, 0.0), d2h=Link(1e10, 0.0), threads=4)
SD15 = Profile({"te": ModuleProfile((), 246_000_000), "diffusion": ModuleProfile((), 1_720_000_000),
                "vae": ModuleProfile((), 167_307_726)}, name="sd15", architecture="sd1")


def make(qtbot, tmp_path, gpu: DeviceProfile | None, inv: Inventory | None = None) -> MainWindow:
    inv = inv or Inventory((Device("CUDA0", "RTX", "gpu", "CUDA", 20 * GIB, 24 * GIB, profile=gpu),
                            Device("CPU", "cpu", "cpu", "CPU", 48 * GIB, 64 * GIB, profile=SLOW)))
    ctl = PlanController(inv, SD15, Placement.from_strings("CUDA0", "", ""))
    ctl.session.time_profiles = lambda i: i  # the devices' own profiles, none from this machine
    ctl.set_generation(width=512, height=512, steps=20, cfg_scale=7.0, sampling_method="euler")
    w = MainWindow(ctl, QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat),
                   history_dir=tmp_path / "history")
    qtbot.addWidget(w)
    w.resize(1440, 900)
    w.show()
    return w


def shown(win: MainWindow) -> tuple[float, float]:
    """(s/step, s/picture) as the label writes them, checked against the session's report."""
    rep = win.ctl.session.predicted_time()
    text = win.board.time_label.text()
    assert text == f"Predicted time: {rep.summary()}"
    assert f"~{seconds_text(rep.step_s)} s/step" in text and f"~{seconds_text(rep.image_s)} s/picture" in text
    return rep.step_s, rep.image_s


def test_a_card_moved_to_the_slow_device_shows_a_longer_step(qtbot, tmp_path) -> None:
    win = make(qtbot, tmp_path, FAST)
    assert win.board.time_label.isVisible()
    fast_step, fast_image = shown(win)
    assert "default speeds" not in win.board.time_label.text()
    model = win.board.model
    mime = model.mimeData([model.card_index("CUDA0", "diffusion")])
    assert model.dropMimeData(mime, Qt.DropAction.MoveAction, -1, -1, model.target_index("CPU"))
    assert list(win.ctl.plan.modules["diffusion"].devices) == ["CPU"]
    slow_step, slow_image = shown(win)
    # SD 1.5's UNet by the formula: 2 * 860 M * 4096 * 0.1141 * 2 FLOP at 0.2 TFLOP/s
    assert slow_step == pytest.approx(2 * 860e6 * 4096 * 0.1141 * 2 / 2e11 + 1e-4)
    assert slow_step > 100 * fast_step and slow_image > fast_image
    win.ctl.undo_stack.undo()
    assert shown(win)[0] == pytest.approx(fast_step)


def test_more_steps_show_a_longer_picture_and_the_tooltip_says_why(qtbot, tmp_path) -> None:
    win = make(qtbot, tmp_path, FAST)
    step, image = shown(win)
    win.ctl.set_generation(steps=40)
    step40, image40 = shown(win)
    assert step40 == pytest.approx(step) and image40 - image == pytest.approx(20 * step)
    tip = win.board.time_label.toolTip()
    assert "40 steps of euler with CFG at 512x512" in tip and "CUDA0 measured" in tip


def test_unmeasured_devices_say_default_speeds(qtbot, tmp_path) -> None:
    win = make(qtbot, tmp_path, None)
    assert win.board.time_label.text().endswith("· default speeds")
    assert "sdplan devices --calibrate" in win.board.time_label.toolTip()


def test_no_model_no_time_line(qtbot, tmp_path) -> None:
    win = make(qtbot, tmp_path, FAST)
    win.ctl.set_profile(None)
    assert win.ctl.predicted_time() is None
    assert not win.board.time_label.isVisible() and win.board.time_label.text() == ""


def test_the_auto_plan_dialog_shows_time_and_memory_now_and_proposed(qtbot, tmp_path) -> None:
    from sdplan.app.dialogs import cost_rows

    inv = Inventory((Device("CUDA0", "big slow", "gpu", "CUDA", 20 * GIB, 24 * GIB, profile=SLOW),
                     Device("CUDA1", "small fast", "gpu", "CUDA", 7 * GIB, 8 * GIB, profile=FAST),
                     Device("CPU", "cpu", "cpu", "CPU", 48 * GIB, 64 * GIB, profile=SLOW)))
    win = make(qtbot, tmp_path, None, inv)
    dlg = win.propose()
    review = dlg.review
    # measured speeds: the fast card is proposed, and the notes say why
    assert [list(review.proposal.plan.modules[m].devices) for m in ("diffusion", "te", "vae")] == [["CUDA1"]] * 3
    assert review.proposal.notes[-1].startswith("the fastest of 2 plans that fit")
    costs = [[dlg.costs.item(r, c).text() for c in range(3)] for r in range(dlg.costs.rowCount())]
    assert costs == [list(row) for row in cost_rows(review)]
    now_t, new_t = review.current_time, review.time
    assert costs[:2] == [["per step", f"~{seconds_text(now_t.step_s)} s", f"~{seconds_text(new_t.step_s)} s"],
                         ["per picture", f"~{seconds_text(now_t.image_s)} s (load {seconds_text(now_t.load_s)} s)",
                          f"~{seconds_text(new_t.image_s)} s (load {seconds_text(new_t.load_s)} s)"]]
    assert new_t.image_s < now_t.image_s / 5
    mem = {row[0]: row[1:] for row in costs[2:]}  # measured speeds: no "speeds" row
    now, new = review.current_fit.devices, review.fit.devices
    assert "CUDA1" not in now and "CUDA0" not in new  # the whole model moves to the fast card
    assert mem["CUDA1 memory"] == ["unused", f"{new['CUDA1'].total / GIB:.2f} of 7.00 GiB free"]
    assert mem["CUDA0 memory"] == [f"{now['CUDA0'].total / GIB:.2f} of 20.00 GiB free", "unused"]
    assert new["CUDA1"].total > 2 * 10**9  # its weights (2.1 GB) are there
    assert dlg.accept_btn.isEnabled()
    win.apply_auto_plan(dlg)
    assert win.ctl.plan.modules["diffusion"].devices == review.proposal.plan.modules["diffusion"].devices
    assert win.board.time_label.text() == f"Predicted time: {review.time.summary()}"


def test_the_dialog_says_which_plan_runs_on_default_speeds(qtbot, tmp_path) -> None:
    inv = Inventory((Device("CUDA0", "big", "gpu", "CUDA", 20 * GIB, 24 * GIB),
                     Device("CUDA1", "small fast", "gpu", "CUDA", 7 * GIB, 8 * GIB, profile=FAST),
                     Device("CPU", "cpu", "cpu", "CPU", 48 * GIB, 64 * GIB, profile=SLOW)))
    win = make(qtbot, tmp_path, None, inv)
    dlg = win.propose()
    review = dlg.review
    # CUDA0 has no measured speed: Auto plan keeps its choice by memory and says so
    assert review.proposal.notes[-1] == ("chosen by memory alone: CUDA0 has no measured speed "
                                         "(sdplan devices --calibrate)")
    rows = {dlg.costs.item(r, 0).text(): (dlg.costs.item(r, 1).text(), dlg.costs.item(r, 2).text())
            for r in range(dlg.costs.rowCount())}
    assert rows["speeds"] == ("default speeds (sdplan devices --calibrate)",) * 2
