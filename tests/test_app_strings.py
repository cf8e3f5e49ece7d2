"""Flag strings both ways, pasted sd-cli commands and plan JSON, through the real widgets."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from PySide6.QtCore import QSettings, Qt  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.window import MainWindow  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.placement import Placement  # noqa: E402
from sdplan.core.planning.profile import ModuleProfile, Profile  # noqa: E402

GIB = 1 << 30


@pytest.fixture
def win(qtbot, tmp_path):
    inv = Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB),
                     Device("CUDA1", "RTX 3060", "gpu", "CUDA", 11 * GIB, 12 * GIB),
                     Device("CPU", "Ryzen", "cpu", "CPU", 48 * GIB, 64 * GIB)))
    prof = Profile({"diffusion": ModuleProfile((300 << 20,) * 40, 100 << 20),
                    "te": ModuleProfile((200 << 20,) * 24, 300 << 20, {"t5xxl": 5 * GIB},
                                        "t5xxl"),
                    "vae": ModuleProfile((), 160 << 20)}, "m.safetensors", "flux-dev")
    w = MainWindow(PlanController(inv, prof, Placement()),
                   QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat),
                   history_dir=tmp_path / "history")
    qtbot.addWidget(w)
    w.show()
    return w


def cards(win, device):
    return [c.module for c in win.board.columns[device].cards]


def type_into(qtbot, field, text):
    field.setFocus()
    field.selectAll()
    field.del_()
    qtbot.keyClicks(field, text)


def enter(qtbot, field):
    qtbot.keyClick(field, Qt.Key.Key_Return)


def test_typing_checks_and_enter_applies(win, qtbot):
    f = win.strings.fields["--backend"]
    type_into(qtbot, f, "CUDA0,vae=CUDA1")
    assert cards(win, "CUDA1") == []  # typed, not applied
    assert win.strings.hint.isVisible() and "it fits" in win.strings.hint.text()
    enter(qtbot, f)
    assert cards(win, "CUDA1") == ["vae"] and not win.strings.hint.isVisible()
    assert f.text() == "CUDA0,vae=CUDA1"  # the field keeps what was typed
    assert "--backend CUDA0,vae=CUDA1" in win.strings.command.toPlainText()
    qtbot.keyClicks(f, ",te=cpu")  # lower-case prefix resolves; board follows on Enter
    enter(qtbot, f)
    assert cards(win, "CPU") == ["te"]
    assert win.ctl.plan.backend == "CUDA0,te=CPU,vae=CUDA1"
    # each applied edit is one undo step
    win.undo_act.trigger()
    assert win.ctl.plan.backend == "CUDA0,vae=CUDA1"
    win.undo_act.trigger()
    assert win.ctl.plan.backend == "CUDA0"
    assert f.text() == "CUDA0"
    assert cards(win, "CUDA0") == ["diffusion", "te", "vae"]


def test_half_typed_values_never_reach_the_plan_and_escape_restores_it(win, qtbot):
    before = win.ctl.plan
    steps = win.ctl.undo_stack.count()
    changes: list[str] = []
    win.ctl.planChanged.connect(changes.append)
    v = win.strings.fields["--max-vram"]
    v.setFocus()
    qtbot.keyClicks(v, "CUDA0=2")  # half of CUDA0=20: 2 GiB would not fit
    assert "would not fit" in win.strings.hint.text()
    assert win.verdict.text() == "✓ Fits" and changes == []  # no flash, no re-plan
    qtbot.keyClick(v, Qt.Key.Key_Escape)
    assert v.text() == "" and win.ctl.plan is before and not win.strings.hint.isVisible()
    assert win.ctl.undo_stack.count() == steps
    qtbot.keyClicks(v, "CUDA0=20")
    v.clearFocus()  # leaving the field applies
    assert win.ctl.plan.max_vram == "CUDA0=20" and win.ctl.undo_stack.count() == steps + 1
    assert win.verdict.text() == "✓ Fits"


def test_invalid_string_underlines_span_and_keeps_board(win, qtbot):
    f = win.strings.fields["--backend"]
    type_into(qtbot, f, "CUDA0,vae=CUDA1")
    enter(qtbot, f)
    before = cards(win, "CUDA1")
    qtbot.keyClicks(f, ",te=CUDA7")
    text = f.text()
    assert f.error_span == (text.index("CUDA7"), text.index("CUDA7") + 5)
    assert f.property("error") is True
    assert win.strings.error.isVisible()
    assert "CUDA7" in win.strings.error.text() and "device_not_found" in win.strings.error.text()
    enter(qtbot, f)  # Enter cannot apply an error
    assert cards(win, "CUDA1") == before
    assert win.ctl.plan.backend == "CUDA0,vae=CUDA1"
    # fixing the text clears the error; Enter re-plans
    f.backspace()
    qtbot.keyClicks(f, "1")
    assert f.error_span is None and not win.strings.error.isVisible()
    enter(qtbot, f)
    assert cards(win, "CUDA1") == ["te", "vae"]


def test_module_typo_and_max_vram_errors(win, qtbot):
    f = win.strings.fields["--backend"]
    type_into(qtbot, f, "vea=CPU")
    assert f.error_span == (0, 3)
    assert "did you mean vae" in win.strings.error.text()
    qtbot.keyClick(f, Qt.Key.Key_Escape)
    assert f.text() == "CUDA0" and f.error_span is None and not win.strings.error.isVisible()
    v = win.strings.fields["--max-vram"]
    type_into(qtbot, v, "CUDA0=6G")
    assert v.error_span == (6, 8)
    assert win.ctl.plan.max_vram == ""  # nothing applied
    v.backspace()
    qtbot.keyClicks(v, ".5")
    assert v.error_span is None
    enter(qtbot, v)
    assert win.ctl.plan.budgets["CUDA0"] == int(6.5 * GIB)
    assert win.board.columns["CUDA0"].budget.value() == 6.5


def test_board_edit_rewrites_fields_canonically(win, qtbot):
    f = win.strings.fields["--params-backend"]
    type_into(qtbot, f, "TE=disk")
    enter(qtbot, f)
    assert win.ctl.plan.params_backend == "te=disk"
    win.ctl.assign("vae", "CPU")  # a board edit: every field shows canonical strings
    assert f.text() == "te=disk"
    assert win.strings.fields["--backend"].text() == "CUDA0,vae=CPU"


def test_flags_fold_to_one_line(win, qtbot):
    s = win.strings
    s.set_collapsed(True)
    assert not s.body.isVisible() and s.summary.isVisible()
    assert s.summary.text() == "--backend CUDA0"
    assert win.settings.value("view/flags_collapsed") in (True, "true")
    assert not win.flags_act.isChecked()
    win.flags_act.trigger()
    assert s.body.isVisible() and not s.summary.isVisible()


def test_paste_sd_cli_command_imports_everything(win, tmp_path):
    cmd = ("sd-cli --diffusion-model /m/flux1-dev.safetensors --t5xxl /m/t5xxl.safetensors "
           "--backend 'diffusion=cuda0&cuda1,te=cpu' --params-backend vae=disk "
           "--max-vram cuda1=9 --steps 28 --cfg-scale 3.5 -p 'a red fox' -W 768 -H 512 "
           "--seed 7 --sampling-method euler_a --frobnicate")
    assert win.paste_command(cmd)
    ctl = win.ctl
    assert ctl.plan.backend == "CUDA0,diffusion=CUDA0&CUDA1,te=CPU"
    assert ctl.plan.params_backend == "vae=disk"
    assert ctl.plan.max_vram == "CUDA1=9"
    assert ctl.model_files == {"diffusion_model": ["/m/flux1-dev.safetensors"],
                               "t5xxl": ["/m/t5xxl.safetensors"]}
    g = win.generation
    assert (g.steps.value(), g.cfg.value(), g.width_box.value(), g.height_box.value()) == \
        (28, 3.5, 768, 512)
    assert g.prompt.toPlainText() == "a red fox" and g.sampler.currentText() == "euler_a"
    assert "--frobnicate" in win.status_label.text()
    line = win.strings.command.toPlainText()
    assert line.startswith("sd-cli --diffusion-model /m/flux1-dev.safetensors --t5xxl")
    assert "--steps 28" in line and "--max-vram CUDA1=9" in line
    assert win.strings.fields["--backend"].text() == "CUDA0,diffusion=CUDA0&CUDA1,te=CPU"
    win.undo_act.trigger()
    assert ctl.plan.backend == "CUDA0"


def test_bad_pasted_command_keeps_plan(win):
    assert not win.paste_command("sd-cli --backend te=nowhere")
    assert win.ctl.plan.backend == "CUDA0"
    assert "nowhere" in win.status_label.text()


def test_plan_json_round_trip(win, tmp_path):
    win.ctl.assign("te", "CUDA1")
    win.ctl.set_budget("CUDA0", 10)
    path = tmp_path / "plan.json"
    win.ctl.save_plan(path)
    data = json.loads(path.read_text())
    assert data["backend"] == "CUDA0,te=CUDA1" and data["max_vram"] == "CUDA0=10"
    assert "fit" in data
    win.ctl.assign("te", "CPU")
    assert win._import_plan_file(str(path))
    assert win.ctl.plan.backend == "CUDA0,te=CUDA1"
    assert win.strings.fields["--max-vram"].text() == "CUDA0=10"
    bad = tmp_path / "bad.json"
    bad.write_text('{"nope": 1}')
    from PySide6.QtWidgets import QMessageBox

    QMessageBox.warning = staticmethod(lambda *a, **k: None)  # no modal box in tests
    assert not win._import_plan_file(str(bad))
    assert win.ctl.plan.backend == "CUDA0,te=CUDA1"


def test_last_plan_persists_in_settings(win):
    win.ctl.assign("vae", "CPU")
    saved = json.loads(win.settings.value("plan/last"))
    assert saved["backend"] == "CUDA0,vae=CPU"
