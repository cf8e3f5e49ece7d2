"""Reference pictures (``-r/--ref-image``) in the generation panel.

- The group follows the registry: shown for FLUX.2 klein, FLUX.2 dev and Qwen-Image (the
  families that honour ``ref_images``), hidden for the others; pictures already there when a
  family that takes none is opened stay, with its refusal, and Generate says why.
- Pictures dropped (several at once, through the drop's mime data) or added are checked
  first (an unreadable file is named in one line and not added), shown as thumbnails in
  order, removed one by one or cleared; they reach the engine request (``ref_images``), the
  written sd-cli command (``-r PATH`` each, in order) and the board's estimate (Qwen-Image's
  vision tower in ``te``'s weights, the Edit graphs in the dry run's compute).
- A pasted command's ``-r``/``--ref-image`` fill the group (nothing kept verbatim; the queue's
  summary names the edit); a dropped
  result picture and "Reuse settings" give the run's pictures back (and none for a run that
  had none); a picture's recorded command carries them.
- The tiny Qwen-Image set through the real engine process from the panel with a reference
  picture: the record names it, the picture is ``sdplan generate -r``'s, and not the picture
  without it.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("pytestqt")

from PIL import Image  # noqa: E402
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDropEvent  # noqa: E402
from qwen_image_util import PROMPT, files  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.generation import GenerationPanel  # noqa: E402
from sdplan.app.ref_pictures import RefPicturesGroup  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.sdcli import import_sdcli_command, parse_sdcli_args  # noqa: E402
from sdplan.core.session.modules import lift_module_args, module_flags, module_summary  # noqa: E402
from sparse_writer import FIXTURES  # noqa: E402

GIB = 1 << 30
QWEN = files()
FLUX = {"diffusion_model": [str(FIXTURES / "flux_dev_tiny.safetensors")], "t5xxl": [str(FIXTURES / "t5_tiny.safetensors")],
        "clip_l": [str(FIXTURES / "clip_l_tiny.safetensors")], "vae": [str(FIXTURES / "flux_ae_tiny.safetensors")]}


@pytest.fixture
def pictures(tmp_path: Path) -> list[Path]:
    """Three pictures of different sizes and content (the first is 80 x 48)."""
    out = []
    for i, (w, h) in enumerate(((80, 48), (64, 64), (32, 40))):
        p = tmp_path / f"ref{i}.png"
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (h, w, 3), dtype=np.uint8)).save(p)
        out.append(p)
    return out


def panel_for(qtbot, model: dict[str, list[str]] | None, history: str | Path = "/nonexistent/history",
              **kw) -> GenerationPanel:
    ctl = PlanController(Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),)))
    if model:
        ctl.load_model_files(model)
    p = GenerationPanel(ctl, history, **({"client_factory": lambda: None} | kw))
    qtbot.addWidget(p)
    p.resize(440, 1400)
    p.show()
    return p


def drop(widget, paths: list[Path]) -> None:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    ev = QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.NoButton,
                    Qt.KeyboardModifier.NoModifier)
    widget.dropEvent(ev)


def r_flags(line: str) -> list[str]:
    """The ``-r``/``--ref-image`` values of a command line, in order."""
    import shlex

    return [a.values[0] for a in parse_sdcli_args(shlex.split(line)[1:]) if a.flag == "--ref-image"]


def test_the_group_shows_for_the_families_that_take_reference_pictures(qtbot, pictures) -> None:
    g = RefPicturesGroup()
    qtbot.addWidget(g)
    for arch, shown in (("flux2_klein", True), ("flux2", True), ("qwen_image", True), ("qwen_image-edit", True),
                        ("flux", False), ("sdxl", False), ("wan", False), ("z_image", False), (None, False)):
        g.set_architecture(arch)
        assert g.honoured is shown and g.isVisibleTo(g.parentWidget() or g) is shown, arch
        drop(g, pictures[:1])  # a family without -r takes no drop
        assert g.paths == ([str(pictures[0])] if shown else []), arch
        g.clear()
    p = panel_for(qtbot, QWEN)
    assert p.inputs.refs.isVisible() and p.inputs.refs.add_btn.isEnabled()
    assert not panel_for(qtbot, FLUX).inputs.refs.isVisible()


def test_dropped_pictures_reach_the_request_the_command_and_the_estimate(qtbot, pictures) -> None:
    p = panel_for(qtbot, QWEN)
    ctl = p.ctl
    te0, compute0 = ctl.fit.modules["te"].weights["CPU"], ctl.fit.devices["CPU"].compute
    assert not p.request()["ref_images"] and not r_flags(ctl.command_line())
    drop(p.inputs.refs, pictures[:2])  # two at once, in the drop's order
    drop(p.inputs.refs, pictures[2:])
    want = [str(x) for x in pictures]
    assert p.inputs.refs.paths == want and [t.path for t in p.inputs.refs.thumbs()] == want
    assert all(not t.picture.pixmap().isNull() for t in p.inputs.refs.thumbs())
    assert p.request()["ref_images"] == want
    assert r_flags(ctl.command_line()) == want and f"-r {pictures[0]} -r {pictures[1]}" in ctl.command_line()
    assert import_sdcli_command(ctl.command_line()).kept.count("-r") == 3  # sd-cli reads them back
    # the vision tower (te's llm_vision bytes) and the Edit graphs are counted with pictures only
    te, compute = ctl.fit.modules["te"].weights["CPU"], ctl.fit.devices["CPU"].compute
    assert te > te0 and compute > compute0
    assert p.generate_btn.isEnabled(), p.state.text()
    p.inputs.refs.thumbs()[1].remove_btn.click()  # the second goes, the others keep their order
    assert p.inputs.refs.paths == [want[0], want[2]] and p.request()["ref_images"] == [want[0], want[2]]
    assert r_flags(ctl.command_line()) == [want[0], want[2]]
    p.inputs.refs.clear_btn.click()
    assert p.inputs.refs.paths == [] and not p.inputs.refs.thumbs()
    assert not p.request()["ref_images"] and not r_flags(ctl.command_line())
    assert ctl.fit.modules["te"].weights["CPU"] == te0 and ctl.fit.devices["CPU"].compute == compute0


def test_an_unreadable_file_is_named_and_not_added(qtbot, pictures, tmp_path) -> None:
    p = panel_for(qtbot, QWEN)
    bad = tmp_path / "not-a-picture.png"
    bad.write_text("no picture here")
    drop(p.inputs.refs, [bad])
    g = p.inputs.refs
    assert g.paths == [] and not p.request()["ref_images"]
    assert g.note.text() == g.message and "\n" not in g.message
    assert g.message.startswith("-r/--ref-image") and str(bad) in g.message and "not added" in g.message
    assert g.add([str(pictures[0]), str(tmp_path / "missing.png"), str(pictures[1])]) == [
        str(pictures[0]), str(pictures[1])]  # the readable ones of several, in order
    assert "missing.png" in g.message and p.request()["ref_images"] == [str(pictures[0]), str(pictures[1])]


def test_a_family_without_reference_pictures_keeps_them_with_its_refusal(qtbot, pictures) -> None:
    p = panel_for(qtbot, QWEN)
    p.inputs.refs.add([str(pictures[0])])
    p.ctl.load_model_files(FLUX)  # FLUX.1 takes no -r
    g = p.inputs.refs
    assert g.isVisible() and g.paths == [str(pictures[0])] and not g.add_btn.isEnabled()
    assert g.note.text() == "FLUX.1 takes no -r/--ref-image; clear them to generate"
    assert not p.generate_btn.isEnabled() and "-r/--ref-image" in p.state.text()
    g.clear()
    assert not g.isVisible() and p.generate_btn.isEnabled(), p.state.text()


def test_a_pasted_command_fills_the_group(qtbot, pictures) -> None:
    p = panel_for(qtbot, QWEN)
    a, b = str(pictures[1]), str(pictures[0])
    line = (f"sd-cli --diffusion-model {QWEN['diffusion_model'][0]} --llm {QWEN['llm'][0]} "
            f"--vae {QWEN['vae'][0]} -p 'make it blue' -r {a} --ref-image {b} --steps 4")
    p.ctl.import_command(line)
    assert p.inputs.refs.paths == [a, b] and [t.path for t in p.inputs.refs.thumbs()] == [a, b]
    assert p.ctl.session.kept_args == []  # lifted, not kept verbatim
    assert p.request()["ref_images"] == [a, b] and r_flags(p.ctl.command_line()) == [a, b]
    assert p.ctl.session.preview_command(line).settings["ref_images"] == [a, b]
    # the lift and the writer alone
    lifted, kept = lift_module_args(["-r", a, "--canny", "--ref-image", b], None, None, 8)
    assert lifted == {"ref_images": [a, b]} and kept == ["--canny"]
    assert module_flags({"ref_images": [a, b]}) == ["-r", a, "-r", b]
    assert module_flags({"ref_images": None}) == module_flags({}) == []
    assert "edit of 2 reference pictures" in module_summary(p.request())  # the queue's line
    assert not any("reference" in s for s in module_summary({"ref_images": []}))


def test_a_dropped_result_picture_and_reuse_settings_give_them_back(qtbot, pictures, tmp_path) -> None:
    import json

    from sdplan.app.gallery import result_command
    from sdplan.app.pictures import write_pictures
    from sdplan.core.pipelines.stages.results import read_png_text, read_result

    want = [str(pictures[2]), str(pictures[0])]
    record = {"params": {"prompt": "edit", "seed": 3, "steps": 4, "width": 64, "height": 64, "ref_images": want,
                         "architecture": "qwen_image"}}
    [png] = write_pictures(tmp_path / "out", [np.zeros((64, 64, 3), np.uint8)], record, QWEN)
    recorded = json.loads(read_png_text(png)["sdplan"])["command"]  # the picture's own: names only
    assert r_flags(recorded) == [Path(x).name for x in want]
    assert r_flags(result_command(read_result(png))) == want  # the gallery's: the index's full paths
    plain = tmp_path / "plain"
    [other] = write_pictures(plain, [np.zeros((64, 64, 3), np.uint8)], {"params": {"prompt": "x", "seed": 1}}, QWEN)
    p = panel_for(qtbot, None)
    p.ctl.import_png(png)
    assert p.ctl.model_files == QWEN and p.inputs.refs.paths == want and p.inputs.refs.isVisible()
    assert r_flags(p.ctl.command_line()) == want
    p.ctl.import_png(other)  # a run without pictures leaves none of the earlier run's
    assert p.inputs.refs.paths == [] and not r_flags(p.ctl.command_line())
    info = read_result(png)
    p.ctl.reuse_result(info.settings, info.model_files, info.placement, info.architecture)
    assert p.inputs.refs.paths == want and p.request()["ref_images"] == want


def test_the_engine_edits_the_panels_reference_picture(qtbot, tmp_path: Path, pictures) -> None:
    """The tiny Qwen-Image set on the CPU through the real engine process (threads 1, 64x64,
    4 steps, CFG 1, euler, seed 42) with one reference picture dropped on the panel: the run's
    record names it, the picture equals ``sdplan generate -r`` with the same settings (within
    1/255), and the same run without the reference picture makes another picture."""
    from generate_util import parse, png
    from sdplan.app.worker import engine_unavailable_reason
    from sdplan.core.pipelines.stages.results import read_result

    reason = engine_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    p = panel_for(qtbot, QWEN, tmp_path / "a", client_factory=None)  # the real engine client
    p.request_extra = {"threads": 1}
    p.prompt.setPlainText(PROMPT)
    p.width_box.setValue(64)
    p.height_box.setValue(64)
    p.steps.setValue(4)
    p.cfg.setValue(1.0)
    p.sampler.setCurrentText("euler")
    drop(p.inputs.refs, [pictures[0]])

    def run() -> tuple[dict, np.ndarray]:
        assert p.generate(), p.state.text()
        qtbot.waitUntil(lambda: not p.is_running(), timeout=180_000)
        assert not p.error_box.isVisible(), p.error_label.text()
        [pic] = sorted(p.history_dir.glob("*.png"))
        return read_result(pic).settings, png(pic)

    try:
        got, edited = run()
        assert got["ref_images"] == [str(pictures[0])] and got["seed"] == 42
        p.set_history_dir(tmp_path / "b")
        p.inputs.refs.clear()
        plain_settings, plain = run()
        assert "ref_images" not in plain_settings or not plain_settings["ref_images"]
    finally:
        p.shutdown()
    cli = tmp_path / "cli.png"
    args = parse(["--diffusion-model", QWEN["diffusion_model"][0], "--llm", QWEN["llm"][0], "--vae", QWEN["vae"][0],
                  "-p", PROMPT, "-W", "64", "-H", "64", "--steps", "4", "--cfg-scale", "1", "--sampling-method",
                  "euler", "-s", "42", "-t", "1", "-r", str(pictures[0]), "-o", str(cli), "--in-process"])
    assert args.run(args) == 0
    assert edited.shape == (64, 64, 3) and np.abs(edited - png(cli)).max() <= 1
    assert np.abs(edited - plain).mean() > 1


def test_add_takes_several_pictures_from_the_file_dialog(qtbot, pictures, monkeypatch) -> None:
    from PySide6.QtWidgets import QFileDialog

    p = panel_for(qtbot, QWEN)
    chosen = [str(pictures[1]), str(pictures[2])]
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(lambda *a, **k: (chosen, "")))
    p.inputs.refs.add_btn.click()
    assert p.inputs.refs.paths == chosen and p.request()["ref_images"] == chosen
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", staticmethod(lambda *a, **k: ([], "")))
    p.inputs.refs.add_btn.click()  # cancelled: nothing changes
    assert p.inputs.refs.paths == chosen
