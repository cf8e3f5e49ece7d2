"""The app on a real desk: a first window that fits the screen and flags that fold with the
height, one paste path (menu, shortcut, button) through a dialog that shows what it brings,
a pasted command that replaces the settings with sd-cli's defaults for its model and whose
undo restores everything, model files not on this machine said on each card (sizes from a
built-in profile, never the previous model's), and typing help in the flag fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")
from PySide6.QtCore import QRect, QSettings, QSize, Qt  # noqa: E402
from PySide6.QtGui import QGuiApplication  # noqa: E402
from sdplan.app.board.cards import ModuleCard  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.screen import FOLD_BELOW, first_geometry, fitted  # noqa: E402
from sdplan.app.window import MainWindow  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.placement import Placement  # noqa: E402
from sdplan.core.planning.profile import ModuleProfile, Profile  # noqa: E402

GIB = 1 << 30
TINY = Path(__file__).parent / "fixtures" / "sd1_tiny.safetensors"


def inventory() -> Inventory:
    return Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB),
                      Device("CUDA1", "RTX 3060", "gpu", "CUDA", 11 * GIB, 12 * GIB),
                      Device("CPU", "Ryzen 9 7950X", "cpu", "CPU", 48 * GIB, 64 * GIB)))


def flux() -> Profile:
    return Profile({"diffusion": ModuleProfile((600 << 20,) * 38, 100 << 20),
                    "te": ModuleProfile((200 << 20,) * 24, 300 << 20, {"t5xxl": 5 * GIB},
                                        "t5xxl"),
                    "vae": ModuleProfile((), 160 << 20)}, "flux1-dev.safetensors", "flux-dev")


def make_window(qtbot, tmp_path, profile=None, **kw) -> MainWindow:
    ctl = PlanController(inventory(), profile or flux(), Placement())
    w = MainWindow(ctl, QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat),
                   history_dir=tmp_path / "history", queue_path=tmp_path / "q.json",
                   library_cache=str(tmp_path / "lib.json"), **kw)
    qtbot.addWidget(w)
    return w


def shown_cards(win: MainWindow) -> list[ModuleCard]:
    """The module cards of the board as drawn now (main cards, every column)."""
    return [c for col in win.board.columns.values() for c in col.cards
            if isinstance(c, ModuleCard) and c.card.kind == "main"]


# ----------------------------------------------------------------------------- 1. small screens

@pytest.mark.parametrize(("w", "h"), [(1024, 700), (1366, 768), (1920, 1080), (800, 600),
                                       (3840, 2160), (1280, 1024)])
def test_first_geometry_never_exceeds_the_available_screen(w: int, h: int) -> None:
    for x0, y0 in ((0, 0), (1920, 0), (0, 32)):  # a second screen, a top panel
        avail = QRect(x0, y0, w, h - y0 if y0 else h)
        geo = first_geometry(avail)
        framed = geo.adjusted(-8, -32, 8, 8)  # the frame's room: a 32 px title, 8 px borders
        assert avail.contains(framed), (avail, geo)
        assert geo.width() == min(1440, avail.width() - 16)
        assert geo.height() == min(900, avail.height() - 40)


def test_a_window_shown_larger_than_the_screen_is_brought_inside() -> None:
    avail = QRect(0, 0, 1024, 700)
    client, frame = QRect(5, 30, 1440, 900), QRect(0, 0, 1450, 935)
    inside = fitted(frame, client, avail)
    assert inside is not None and inside.size() == QSize(1014, 665)
    assert avail.contains(inside.adjusted(-5, -30, 5, 5))
    assert fitted(QRect(10, 10, 500, 400), QRect(15, 40, 490, 365), avail) is None


def test_first_run_window_fits_the_screen_and_folds_the_flags_by_height(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    win.show()
    qtbot.waitExposed(win)
    avail = QGuiApplication.primaryScreen().availableGeometry()
    assert avail.contains(win.frameGeometry())
    assert (win.width(), win.height()) == (1440, 900) and not win.strings.is_collapsed()
    win.resize(1010, 660)  # a short screen, or a window made smaller
    qtbot.waitUntil(lambda: win.strings.is_collapsed(), timeout=2000)
    assert win.settings.value("view/flags_collapsed") is None  # still the user's to choose
    win.resize(1400, FOLD_BELOW + 100)  # taller again: the flags come back
    qtbot.waitUntil(lambda: not win.strings.is_collapsed(), timeout=2000)
    win.flags_act.trigger()  # the user folds them: height no longer decides
    assert win.strings.is_collapsed()
    win.resize(1400, 1000)
    qtbot.wait(20)
    assert win.strings.is_collapsed()


def test_first_run_on_a_1024x700_screen_in_a_subprocess(tmp_path: Path) -> None:
    """A 1024x700 screen (Qt's offscreen platform with that screen): the first window lies
    inside it, the flags fold, and the board keeps its cards."""
    screen = tmp_path / "screen.json"
    screen.write_text(json.dumps({"screens": [{"name": "small", "x": 0, "y": 0, "width": 1024,
                                               "height": 700, "logicalDpi": 96,
                                               "logicalBaseDpi": 96, "dpr": 1}]}))
    code = (
        "import json\n"
        "from PySide6.QtCore import QSettings\n"
        "from PySide6.QtWidgets import QApplication\n"
        "from sdplan.app.board.cards import ModuleCard\n"
        "from sdplan.app.main import build_window\n"
        "from sdplan.core.commands.gui import build_parser\n"
        "app = QApplication([])\n"
        f"s = QSettings({str(tmp_path / 's.ini')!r}, QSettings.Format.IniFormat)\n"
        "_, w = build_window(build_parser().parse_args([]), s)\n"
        "w.show()\n"
        "for _ in range(20): app.processEvents()\n"
        "g = w.frameGeometry()\n"
        "print(json.dumps([g.x(), g.y(), g.width(), g.height(), w.strings.is_collapsed(),\n"
        "      w.board.height(), len([c for c in w.board.findChildren(ModuleCard) if c.isVisible()])]))\n")
    env = dict(os.environ, QT_QPA_PLATFORM=f"offscreen:configfile={screen}",
               XDG_CONFIG_HOME=str(tmp_path / "cfg"), HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    x, y, w, h, folded, board, cards = json.loads(out.stdout.strip().splitlines()[-1])
    assert x >= 0 and y >= 0 and x + w <= 1024 and y + h <= 700
    assert folded and board >= 300 and cards == 3  # the demo model's three modules


# ----------------------------------------------------------------------------- 2. one paste path

def test_menu_shortcut_and_button_open_one_paste_dialog_that_shows_before_it_applies(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    win.show()
    missing = tmp_path / "z_image_turbo-Q8_0.gguf"
    cmd = (f"sd-cli --diffusion-model {missing} --vae {TINY} -p 'a quiet harbour' "
           "--steps 6 --backend CUDA1 --vae-tiling --no-such-flag")
    QGuiApplication.clipboard().setText(cmd)
    before = win.ctl.session.snapshot()
    for trigger in (win.paste_act.trigger, win.strings.buttons["paste"].click):
        win.paste_dialog = None
        trigger()  # Edit -> Paste (what Ctrl+Shift+V triggers) and the flags panel's button
        dlg = win.paste_dialog
        assert dlg is not None and dlg.isVisible() and dlg.text() == cmd
        assert win.ctl.session.snapshot() == before  # nothing applied yet
        shown = dlg.preview_label.text()
        assert "z_image_turbo-Q8_0.gguf</code> — ✕ not on this machine" in shown
        assert "sd1_tiny.safetensors</code> — ✓ found" in shown
        assert "the built-in profile z-image-turbo-q8_0" in shown
        assert "--steps 6" in shown and "-W 512 <i>(default)</i>" in shown
        assert "--vae-tiling" in shown and "--no-such-flag" in shown
        assert dlg.editor.lineWrapMode().name == "WidgetWidth" and dlg.width() >= 560
        dlg.reject()
    assert win.paste_act.shortcut().toString() == "Ctrl+Shift+V"
    win.paste_act.trigger()
    win.paste_dialog.import_btn.click()
    assert win.ctl.generation["prompt"] == "a quiet harbour"
    assert win.ctl.plan.modules["diffusion"].devices == ["CUDA1"]
    assert "imported the sd-cli command" in win.status_label.text()
    assert "z_image_turbo-Q8_0.gguf" in win.status_label.text()  # said, not overwritten


def test_the_paste_dialog_refuses_a_broken_command_and_an_empty_clipboard(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    QGuiApplication.clipboard().setText("")
    win.paste_act.trigger()
    dlg = win.paste_dialog
    assert not dlg.import_btn.isEnabled() and "no command" in dlg.preview_label.text()
    dlg.editor.setPlainText("sd-cli -m x.safetensors --backend 'CUDA0")
    dlg.refresh()
    assert not dlg.import_btn.isEnabled() and "Cannot import" in dlg.preview_label.text()
    dlg.editor.setPlainText("sd-cli -m x.safetensors --backend CUDA0")
    dlg.refresh()
    assert dlg.import_btn.isEnabled()


# ----------------------------------------------------------------------------- 3 and 4. paste

def test_a_command_whose_files_are_elsewhere_never_keeps_the_previous_models_sizes(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    assert win.arch_label.text() == "flux-dev"
    assert win.paste_command("sd-cli --diffusion-model /elsewhere/z_image_turbo-Q8_0.gguf "
                             "--llm /elsewhere/qwen_3_4b.safetensors --vae /elsewhere/ae.safetensors "
                             "-p 'a fox'")
    ctl = win.ctl
    assert ctl.profile is not None and ctl.profile.architecture == "z_image"
    assert win.arch_label.text() == "z_image" and win.model_label.text() == "z_image_turbo-Q8_0.gguf"
    from sdplan.core.planning.builtin_profiles import load_builtin_profile

    z = load_builtin_profile("z-image-turbo-q8_0")
    assert ctl.module_bytes("diffusion") == z.get("diffusion").total != flux().get("diffusion").total
    notes = {c.module: c.missing_label.text() for c in shown_cards(win)
             if c.missing_label is not None}
    assert notes["diffusion"] == ("✕ not on this machine: z_image_turbo-Q8_0.gguf — sizes from "
                                  "the built-in profile z-image-turbo-q8_0")
    assert "qwen_3_4b.safetensors" in notes["te"] and "ae.safetensors" in notes["vae"]
    # a name no built-in profile matches: the placement without sizes
    assert win.paste_command("sd-cli --diffusion-model /elsewhere/my-own-finetune.gguf -p x")
    assert ctl.profile is None and ctl.fit is None and ctl.module_bytes("diffusion") is None
    assert win.verdict.text() == "sizes unknown: model files not on this machine"
    assert not win.arch_label.isVisible() or win.arch_label.text() == ""
    card = next(c for c in shown_cards(win) if c.module == "diffusion")
    assert card.size_label.text() == "-" and "sizes unknown" in card.missing_label.text()


def test_paste_takes_sdclis_defaults_for_its_model_and_no_stale_flags(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    ctl = win.ctl
    assert win.paste_command("sd-cli --diffusion-model /elsewhere/flux1-dev-Q8_0.gguf -W 1024 "
                             "-H 768 --cfg-scale 1 --lora-model-dir /loras -p 'x <lora:a:1>'")
    assert ctl.generation["lora_model_dir"] == "/loras"
    assert win.paste_command("sd-cli -m /elsewhere/v1-5-pruned-emaonly.safetensors -p 'a cat'")
    g = ctl.generation
    assert (g["width"], g["height"], g["cfg_scale"], g["steps"]) == (512, 512, 7.0, 20)
    assert g["sampling_method"] == "euler_a" and "lora_model_dir" not in g
    cmd = ctl.command_line()
    assert "--lora-model-dir" not in cmd and "--cfg-scale 7" in cmd and "--width 512" in cmd
    assert (win.generation.width_box.value(), win.generation.cfg.value()) == (512, 7.0)


def test_undo_after_a_paste_restores_files_prompt_settings_and_placement(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    ctl = win.ctl
    ctl.load_model_files({"model": [str(TINY)]})
    ctl.set_generation(prompt="my own prompt", steps=33, width=640)
    ctl.planChanged.emit("load")  # the panel shows them
    ctl.assign("vae", "CPU")
    before = ctl.session.snapshot()
    steps = ctl.undo_stack.count()
    assert win.paste_command("sd-cli --diffusion-model /elsewhere/z_image_turbo-Q8_0.gguf "
                             "-p 'pasted' --steps 8 --backend CUDA1 --vae-tiling")
    assert ctl.undo_stack.count() == steps + 1 and ctl.undo_stack.undoText() == "paste sd-cli command"
    assert ctl.generation["prompt"] == "pasted" and ctl.plan.backend == "CUDA1"
    win.undo_act.trigger()
    assert ctl.session.snapshot() == before
    assert ctl.model_files == {"model": [str(TINY)]} and ctl.generation["steps"] == 33
    assert ctl.plan.modules["vae"].devices == ["CPU"] and "--vae-tiling" not in ctl.command_line()
    assert win.generation.prompt.toPlainText() == "my own prompt"
    assert win.generation.steps.value() == 33 and win.generation.width_box.value() == 640
    win.redo_act.trigger()
    assert ctl.generation["prompt"] == "pasted" and ctl.plan.backend == "CUDA1"


# ----------------------------------------------------------------------------- 6. typing help

def test_flag_fields_say_what_a_comma_list_and_a_cuda_colon_mean(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    win.show()
    f = win.strings.fields["--backend"]
    f.setFocus()
    f.setText("")
    qtbot.keyClicks(f, "diffusion=CUDA0,CUDA1")
    assert "did you mean diffusion=CUDA0&CUDA1?" in win.strings.hint.text()
    qtbot.keyClick(f, Qt.Key.Key_Return)
    assert "did you mean diffusion=CUDA0&CUDA1?" in win.strings.warnings.text()
    assert win.strings.warnings.isVisible()
    f.setText("")
    qtbot.keyClicks(f, "diffusion=cuda:1")
    assert win.ctl.error is not None and str(win.ctl.error).endswith("did you mean CUDA1?")
    assert "did you mean CUDA1?" in win.strings.error.text()


# ----------------------------------------------------------------------------- 7. output folder

def test_pictures_go_to_an_output_folder_the_user_sees_and_changes(qtbot, tmp_path, monkeypatch):
    import numpy as np
    from replay_client import ReplayEngineClient
    from sdplan.app import outputs
    from sdplan.core.pipelines.stages.results import read_png_text, read_result

    monkeypatch.setattr(outputs.QStandardPaths, "writableLocation",
                        lambda where: str(tmp_path / "Pictures"))
    assert outputs.default_output_folder() == tmp_path / "Pictures" / "sdplan"
    settings = QSettings(str(tmp_path / "cfg" / "s.ini"), QSettings.Format.IniFormat)
    ctl = PlanController(inventory(), flux(), Placement())
    model = tmp_path / "models" / "tiny.safetensors"
    model.parent.mkdir()
    model.write_bytes(TINY.read_bytes())
    ctl.load_model_files({"model": [str(model)]}, strict=False)
    img = np.full((8, 8, 3), 80, np.uint8)
    client = ReplayEngineClient([{"type": "result", "images": [img], "params": {"seed": 3}}] * 2)
    win = MainWindow(ctl, settings, client_factory=lambda: client,
                     queue_path=tmp_path / "q.json", library_cache=str(tmp_path / "lib.json"))
    qtbot.addWidget(win)
    first = tmp_path / "Pictures" / "sdplan"
    assert win.generation.history_dir == first and first in win.gallery.folders
    assert "Pictures/sdplan" in win.generation.output_label.toolTip()
    assert "sdplan-history" not in str(win.generation.history_dir)  # not the settings folder
    chosen = tmp_path / "my pictures"
    assert win.generation.choose_output_folder(str(chosen))
    assert settings.value(outputs.SETTING) == str(chosen) and chosen in win.gallery.folders
    assert win.generation.output_label.toolTip() == f"Saved to {chosen}"
    win.generation.prompt.setPlainText("a lighthouse")
    assert win.generation.generate()
    qtbot.waitUntil(lambda: not win.generation.is_running(), timeout=5000)
    [pic] = sorted(chosen.glob("*.png"))
    assert win.gallery.select_path(str(pic))
    # the picture names its files; the gallery's index beside it keeps where they are
    chunks = "".join(read_png_text(pic).values())
    assert str(tmp_path) not in chunks and "tiny.safetensors" in chunks
    assert read_result(pic).model_files == {"model": [str(model)]}
    # the queue saves where the panel does
    job = win.queue_panel.add_current()  # the queue starts it at once
    assert job is not None
    qtbot.waitUntil(lambda: win.runner.queue.get(job.id).state == "done", timeout=5000)
    assert len(list(chosen.glob("*.png"))) == 2
    # a new window over the same settings saves there too
    again = MainWindow(PlanController(inventory(), flux(), Placement()),
                       QSettings(settings.fileName(), QSettings.Format.IniFormat),
                       queue_path=tmp_path / "q2.json", library_cache=str(tmp_path / "lib.json"))
    qtbot.addWidget(again)
    assert again.generation.history_dir == chosen


# ----------------------------------------------------------------------------- 8. small items

def test_ctrl_z_in_a_flag_field_after_enter_undoes_the_plan(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    win.show()
    with qtbot.waitActive(win):  # shortcuts act in the active window
        win.activateWindow()
    f = win.strings.fields["--backend"]
    f.setFocus()
    f.selectAll()
    f.del_()
    qtbot.keyClicks(f, "CUDA1")
    qtbot.keyClick(f, Qt.Key.Key_Return)
    assert win.ctl.plan.backend == "CUDA1" and f.text() == "CUDA1"
    qtbot.keyClick(f, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert win.ctl.plan.modules["diffusion"].devices == ["CUDA0"]  # the plan, not the text
    assert f.text() == win.ctl.plan.backend
    qtbot.keyClick(f, Qt.Key.Key_Y, Qt.KeyboardModifier.ControlModifier)
    assert win.ctl.plan.backend == "CUDA1"
    # while an edit is typed, Ctrl+Z undoes the typing and leaves the plan alone
    qtbot.keyClicks(f, ",vae=CPU")
    qtbot.keyClick(f, Qt.Key.Key_Z, Qt.KeyboardModifier.ControlModifier)
    assert win.ctl.plan.backend == "CUDA1" and f.text() != "CUDA1,vae=CPU"


def test_a_double_click_on_the_bar_places_the_budget_without_alt(qtbot, tmp_path):
    from PySide6.QtCore import QPointF

    win = make_window(qtbot, tmp_path)
    win.show()
    qtbot.waitExposed(win)
    bar = win.board.columns["CUDA1"].bar
    assert "double-click the bar to place it" in bar.toolTip()
    x = bar.width() * 0.6
    qtbot.mouseDClick(bar, Qt.MouseButton.LeftButton, pos=QPointF(x, bar.height() / 2).toPoint())
    budget = win.ctl.plan.budgets.get("CUDA1")
    assert budget is not None and abs(budget / GIB - round(bar._gib_at(x), 1)) < 0.051
    assert win.ctl.undo_stack.undoText() == "budget CUDA1"


def test_steps_take_what_the_command_line_takes(qtbot, tmp_path):
    from sdplan.app.settings_form import MAX_STEPS
    from sdplan.core.pipelines.limits import MAX_STEPS as CLI_MAX

    win = make_window(qtbot, tmp_path)
    box = win.generation.steps
    assert box.maximum() == MAX_STEPS == CLI_MAX
    box.setFocus()
    box.selectAll()
    qtbot.keyClicks(box, "250")
    qtbot.keyClick(box, Qt.Key.Key_Return)
    assert box.value() == 250 and win.ctl.generation["steps"] == 250


@pytest.mark.parametrize("size", [(1440, 900), (1366, 700)])
def test_a_result_neither_grows_the_panel_nor_moves_it_under_the_cursor(qtbot, tmp_path, size):
    """A run with live previews and a result whose caption takes two lines: the Generate
    button stays where it was, the panel keeps its height and the scroll area its range."""
    import numpy as np
    from PySide6.QtCore import QPoint
    from replay_client import ReplayEngineClient

    prev = np.full((64, 64, 3), 90, np.uint8)
    client = ReplayEngineClient([
        {"type": "progress", "step": 1, "total": 2, "preview": prev},
        {"type": "progress", "step": 2, "total": 2, "preview": prev},
        {"type": "result", "images": [np.full((1024, 1024, 3), 200, np.uint8)],
         "params": {"seed": 1, "prompt": "a lighthouse on a cliff at dusk " * 6}}])
    win = make_window(qtbot, tmp_path, client_factory=lambda: client)
    win.ctl.load_model_files({"model": [str(TINY)]}, strict=False)
    win.resize(*size)
    win.show()
    qtbot.waitExposed(win)
    panel = win.generation
    bar = win.side.widget(0).verticalScrollBar()

    def where() -> tuple[int, int, int, int]:
        return (panel.generate_btn.mapTo(win, QPoint(0, 0)).y(), panel.height(), bar.value(),
                bar.maximum())

    before = where()
    panel.prompt.setPlainText("x")
    assert panel.generate()
    qtbot.waitUntil(lambda: not panel.is_running(), timeout=5000)
    qtbot.wait(50)
    assert not panel.preview.pixmap().isNull() and panel.params_label.text()
    assert where() == before


def test_the_queue_shows_each_jobs_size_and_a_thumbnail_when_done(qtbot, tmp_path):
    import numpy as np
    from PIL import Image
    from sdplan.core.pipelines.job_queue import JobQueue

    win = make_window(qtbot, tmp_path)
    ctl = win.ctl
    ctl.load_model_files({"model": [str(TINY)]}, strict=False)
    win.generation.width_box.setValue(768)
    win.generation.height_box.setValue(512)
    q: JobQueue = win.runner.queue
    job = win.queue_panel.add_current()
    assert job is not None
    item = win.queue_panel.list.item(0)
    assert "768×512 px" in item.text() and item.icon().isNull()
    pic = tmp_path / "done.png"
    Image.fromarray(np.full((32, 32, 3), 120, np.uint8)).save(pic)
    q.finish(job.id, "done", results=[str(pic)])
    win.queue_panel.refresh()
    item = win.queue_panel.list.item(0)
    assert not item.icon().isNull() and "768×512 px" in item.text()


def test_the_demo_says_it_was_trained_at_128_px(qtbot, tmp_path):
    from sdplan.app.main import open_demo

    ctl = PlanController(inventory())
    assert open_demo(ctl)
    w = MainWindow(ctl, QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat),
                   history_dir=tmp_path / "h", queue_path=tmp_path / "q.json")
    qtbot.addWidget(w)
    w.show()
    panel = w.generation
    assert panel.size_note.isHidden()  # 128 x 128: what it was trained for
    panel.width_box.setValue(384)
    panel.height_box.setValue(384)
    assert panel.size_note.isVisible()
    assert panel.size_note.text() == ("sdplan-demo-shapes.safetensors was trained at 128 × 128 px: "
                                      "at 384 × 384 px its pictures may repeat or break their shapes")
    # the wrapped note keeps the height of its lines: a form row gave it one line's, and the
    # second line was drawn over the Steps row
    note = panel.size_note
    qtbot.waitUntil(lambda: note.height() > 0 and note.geometry().bottom() < panel.steps.geometry().top())
    assert note.height() >= note.heightForWidth(note.width()) > note.fontMetrics().height()
