"""Wan 2.2 image to video and the A14B high-noise phase in the generation panel.

- The picture's role follows the registry: with the Wan 2.2 I2V-A14B experts open it is the
  video's start picture (its first frame) with no strength box, the panel says before Generate
  that the model needs one, and a dropped picture enables Generate with ``-i`` in the request
  and the command and no ``--strength``; a text-to-video Wan model (T2V, TI2V-5B) offers no
  start picture and says why, a picture already there is refused by name until cleared; an
  image family keeps its init picture and strength.
- The high-noise group (``--high-noise-diffusion-model``, ``--high-noise-steps``,
  ``--high-noise-cfg-scale``, ``--high-noise-sampling-method``, ``--high-noise-eta``,
  ``--moe-boundary``) shows for a family that honours them only, its values reach the engine
  request and the written sd-cli command, a pasted command fills them (nothing kept verbatim),
  and the expert file chosen in the group joins the board's model files.
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
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.generation import GenerationPanel  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.session.modules import lift_module_args, module_flags  # noqa: E402
from sparse_writer import FIXTURES  # noqa: E402

GIB = 1 << 30
TE, VAE = str(FIXTURES / "umt5_tiny.safetensors"), str(FIXTURES / "wan_vae_tiny.safetensors")
LOW, HIGH = str(FIXTURES / "wan_i2v_tiny.safetensors"), str(FIXTURES / "wan_i2v_high_noise_tiny.safetensors")
I2V = {"diffusion_model": [LOW], "high_noise_diffusion_model": [HIGH], "t5xxl": [TE], "vae": [VAE]}
T2V = {"diffusion_model": [str(FIXTURES / "wan_tiny.safetensors")], "t5xxl": [TE], "vae": [VAE]}
TI2V = {"diffusion_model": [str(FIXTURES / "wan_ti2v_tiny.safetensors")], "t5xxl": [TE],
        "vae": [str(FIXTURES / "wan22_vae_tiny.safetensors")]}
FLUX = {"diffusion_model": [str(FIXTURES / "flux_dev_tiny.safetensors")], "t5xxl": [str(FIXTURES / "t5_tiny.safetensors")],
        "clip_l": [str(FIXTURES / "clip_l_tiny.safetensors")], "vae": [str(FIXTURES / "flux_ae_tiny.safetensors")]}
HIGH_KEYS = ("high_noise_steps", "high_noise_cfg_scale", "high_noise_sampling_method", "high_noise_eta",
             "moe_boundary")


def panel_for(qtbot, files: dict[str, list[str]] | None) -> GenerationPanel:
    ctl = PlanController(Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),)))
    if files:
        ctl.load_model_files(files)
    p = GenerationPanel(ctl, "/nonexistent/history", client_factory=lambda: None)
    qtbot.addWidget(p)
    p.resize(440, 1400)
    p.show()
    return p


def drop(widget, path: Path) -> None:
    """A file dropped on ``widget`` through the mime data a drag carries."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    widget.dropEvent(QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.NoButton,
                                Qt.KeyboardModifier.NoModifier))


@pytest.fixture
def picture(tmp_path: Path) -> Path:
    path = tmp_path / "start.png"
    Image.fromarray(np.full((32, 48, 3), 90, np.uint8)).save(path)
    return path


def test_an_i2v_model_takes_a_first_frame_without_strength(qtbot, picture: Path) -> None:
    """Wan 2.2 I2V-A14B: the picture reads as the start picture, no strength box; without one
    the panel says the model needs it and Generate is off; a dropped picture turns Generate on,
    reaches the request as -i (strength at the default sd-cli ignores) and the command has -i
    and no --strength."""
    p = panel_for(qtbot, I2V)
    inp = p.inputs
    assert p.ctl.profile.architecture == "wan-i2v_a14b"
    assert not inp.strength.isVisible() and not inp.mask_slot.isVisible()  # Wan honours no --mask
    assert inp.init_slot.isVisible() and inp.init_slot.text() == "First frame\ndrop here"
    assert inp.pic_title.text() == "START PICTURE (FIRST FRAME)"
    assert inp.picture_note.text() == ("needs a start picture: a Wan 2.2 I2V-A14B model animates a start "
                                       "picture; drop one here")
    assert not p.generate_btn.isEnabled() and p.state.text().startswith("-i/--init-img missing")
    inp.strength.setValue(0.4)  # a value left from an image model: no strength for a first frame
    drop(inp.init_slot, picture)
    assert inp.init_slot.path == str(picture)
    assert inp.picture_note.text() == "image to video: the picture is the first frame (no strength)"
    assert p.generate_btn.isEnabled() and not p.state.isVisible() and p.refusal() is None
    req = p.request()
    assert (req["init_img"], req["strength"], req["mode"]) == (str(picture), 0.75, "vid_gen")
    line = p.ctl.session.command_line()
    assert f"--init-img {picture}" in line and "--strength" not in line
    inp.clear_pictures()  # needed again: said before Generate
    assert not p.generate_btn.isEnabled() and inp.picture_note.text().startswith("needs a start picture")
    if os.environ.get("SDPLAN_SCREENSHOT_DIR"):  # the panel with a Wan I2V model, for a person to look at
        p.grab().save(str(Path(os.environ["SDPLAN_SCREENSHOT_DIR"]) / "panel_wan_i2v.png"))


def test_ti2v_takes_a_start_picture_it_does_not_need(qtbot, picture: Path) -> None:
    """Wan 2.2 TI2V-5B runs text to video, or image to video with -i: the first-frame slot
    without a strength, Generate on with or without a picture."""
    p = panel_for(qtbot, TI2V)
    inp = p.inputs
    assert inp.init_slot.isVisible() and not inp.strength.isVisible()
    assert inp.pic_title.text() == "START PICTURE (FIRST FRAME)"
    assert inp.picture_note.text() == "text to video" and p.generate_btn.isEnabled()
    drop(inp.init_slot, picture)
    assert inp.init_slot.path == str(picture) and p.generate_btn.isEnabled()
    assert inp.picture_note.text() == "image to video: the picture is the first frame (no strength)"
    line = p.ctl.session.command_line()
    assert f"--init-img {picture}" in line and "--strength" not in line


def test_a_text_to_video_model_offers_no_start_picture(qtbot, picture: Path) -> None:
    """Wan T2V refuses -i: no slot, a note saying why, a drop taken by nothing; a picture a
    paste or a reused run brought stays shown with the refusal until cleared."""
    p = panel_for(qtbot, T2V)
    inp = p.inputs
    assert not inp.init_slot.isVisible() and not inp.strength.isVisible()
    assert inp.pic_title.text() == "NO START PICTURE"
    assert inp.picture_note.text() == "text to video: Wan 2.x video takes no start picture (-i)"
    drop(inp.init_slot, picture)
    assert inp.init_slot.path is None and p.request()["init_img"] is None
    assert p.generate_btn.isEnabled()
    p.ctl.set_generation(init_img=str(picture))  # as a pasted command or a reused run brings it
    p.ctl.planChanged.emit("load")
    p.update_state()
    assert inp.init_slot.isVisible() and inp.init_slot.path == str(picture)
    assert inp.picture_note.text().endswith("takes no start picture (-i); clear the picture to generate")
    assert not p.generate_btn.isEnabled() and "-i/--init-img" in p.state.text()
    inp.clear_btn.click()
    assert p.generate_btn.isEnabled() and "--init-img" not in p.ctl.session.command_line()


def test_an_image_family_keeps_its_init_picture_and_strength(qtbot, picture: Path) -> None:
    p = panel_for(qtbot, FLUX)
    inp = p.inputs
    assert inp.strength.isVisible() and inp.mask_slot.isVisible() and inp.pic_title.text() == "INIT IMAGE"
    drop(inp.init_slot, picture)
    inp.strength.setValue(0.4)
    assert inp.picture_note.text() == "image to image" and p.request()["strength"] == 0.4
    assert "--strength 0.4" in p.ctl.session.command_line()


def test_the_high_noise_group_shows_for_wan_only(qtbot) -> None:
    """The registry's HIGH_NOISE option: Wan honours it (every variant), Flux does not (the
    group is hidden and adds no key or flag)."""
    p = panel_for(qtbot, I2V)
    g = p.high_noise
    assert g.isVisible() and g.expert.full == "wan_i2v_high_noise_tiny.safetensors"
    assert {k: p.settings()[k] for k in HIGH_KEYS} == {
        "high_noise_steps": -1, "high_noise_cfg_scale": 7.0, "high_noise_sampling_method": None,
        "high_noise_eta": None, "moe_boundary": 0.875}  # sd-cli's defaults: no flag written
    assert "--high-noise-steps" not in p.ctl.session.command_line()
    p.ctl.load_model_files(FLUX)
    assert not g.isVisible() and all(p.settings()[k] is None for k in HIGH_KEYS)
    assert "--high-noise" not in p.ctl.session.command_line() and "--moe-boundary" not in p.ctl.session.command_line()


def test_high_noise_fields_reach_the_request_and_round_trip_a_pasted_command(qtbot, picture: Path) -> None:
    p = panel_for(qtbot, I2V)
    g = p.high_noise
    drop(p.inputs.init_slot, picture)
    g.steps.setValue(2)
    g.cfg.setValue(3.5)
    g.sampler.setCurrentText("euler_a")
    g.eta.setValue(0.5)
    g.boundary.setValue(0.9)
    want = {"high_noise_steps": 2, "high_noise_cfg_scale": 3.5, "high_noise_sampling_method": "euler_a",
            "high_noise_eta": 0.5, "moe_boundary": 0.9}
    req = p.request()
    assert {k: req[k] for k in HIGH_KEYS} == want
    assert req["model_files"]["high_noise_diffusion_model"] == [HIGH]
    line = p.ctl.session.command_line()
    assert line.endswith("-M vid_gen --video-frames 5 --high-noise-steps 2 --high-noise-cfg-scale 3.5 "
                         "--high-noise-sampling-method euler_a --high-noise-eta 0.5 --moe-boundary 0.9")
    assert f"--high-noise-diffusion-model {HIGH}" in line
    q = panel_for(qtbot, None)  # the command pasted into another window: fields, not kept arguments
    q.ctl.import_command(line)
    assert q.ctl.session.kept_args == [] and q.ctl.model_files == I2V
    g2 = q.high_noise
    assert g2.isVisible() and g2.expert.full == "wan_i2v_high_noise_tiny.safetensors"
    assert (g2.steps.value(), g2.cfg.value(), g2.sampler.currentText(), g2.eta.value(), g2.boundary.value()) == \
        (2, 3.5, "euler_a", 0.5, 0.9)
    assert {k: q.request()[k] for k in HIGH_KEYS} == want
    assert q.ctl.session.command_line() == line
    g2.sampler.setCurrentIndex(0)  # back to the low-noise phase's sampler and eta: flags left out
    g2.eta.setValue(g2.eta.minimum())
    assert q.request()["high_noise_sampling_method"] is None and q.request().get("high_noise_eta") is None
    assert "--high-noise-sampling-method" not in q.ctl.session.command_line()
    assert "--high-noise-eta" not in q.ctl.session.command_line()


def test_pasted_high_noise_values_sd_cli_would_refuse_stay_kept() -> None:
    """A sampler sd-cli does not have or a boundary outside 0..1 stays a kept argument (the
    written command carries it; the request names it), and an image family's paste keeps them."""
    args = ["--high-noise-sampling-method", "nope", "--high-noise-steps", "3"]
    assert lift_module_args(args, None, None, 8, high_noise=True) == ({}, args)
    assert lift_module_args(["--moe-boundary", "1.5"], None, None, 8, high_noise=True) == ({}, ["--moe-boundary", "1.5"])
    assert lift_module_args(["--high-noise-steps", "3"], None, None, 8) == ({}, ["--high-noise-steps", "3"])
    assert lift_module_args(["--high-noise-steps", "3", "--high-noise-steps", "4"], None, None, 8, high_noise=True) == \
        ({"high_noise_steps": 4}, [])
    assert module_flags({"high_noise_steps": -1, "high_noise_cfg_scale": 7.0, "moe_boundary": 0.875}) == []
    assert module_flags({"high_noise_cfg_scale": 3.5, "high_noise_eta": 0.0}) == \
        ["--high-noise-cfg-scale", "3.5", "--high-noise-eta", "0"]


def test_the_expert_file_is_chosen_in_the_group(qtbot, tmp_path: Path) -> None:
    """Only the low-noise expert open: the group says none; choosing the high-noise file adds
    it to the board's files (the diffusion module's high-noise phase, the command's flag);
    Remove takes it out; a file that is not a model is said under the group, files unchanged."""
    low_only = {k: v for k, v in I2V.items() if k != "high_noise_diffusion_model"}
    p = panel_for(qtbot, low_only)
    g = p.high_noise
    assert g.expert.full.startswith("none") and not g.remove_btn.isEnabled()
    assert g.set_expert(HIGH)
    assert p.ctl.model_files == I2V and "high_noise" in p.ctl.profile.phases
    assert g.expert.full == "wan_i2v_high_noise_tiny.safetensors" and g.remove_btn.isEnabled()
    assert f"--high-noise-diffusion-model {HIGH}" in p.ctl.session.command_line()
    g.remove_btn.click()
    assert p.ctl.model_files == low_only and "--high-noise-diffusion-model" not in p.ctl.session.command_line()
    bad = tmp_path / "notes.safetensors"
    bad.write_bytes(b"not a model")
    assert not g.set_expert(str(bad))
    assert p.ctl.model_files == low_only
    assert not g.note.isHidden() and g.note.text().startswith("--high-noise-diffusion-model notes.safetensors: ")
    assert "\n" not in g.note.text()


def test_the_engine_runs_the_panels_image_to_video_with_its_high_noise_phase(qtbot, tmp_path: Path, picture) -> None:
    """The tiny I2V-A14B experts on the CPU through the real engine process (threads 1, 64x64,
    5 frames, 4 steps, seed 42): the dropped start picture and the high-noise group's values
    are in the run's record and the WebM the panel writes, and they change the video (the same
    run with sd-cli's high-noise defaults makes other frames)."""
    from sdplan.app.worker import engine_unavailable_reason
    from sdplan.core.pipelines.stages.results import read_result
    from sdplan.core.pipelines.stages.video import read_video

    reason = engine_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    ctl = PlanController(Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),)))
    ctl.load_model_files(I2V)
    p = GenerationPanel(ctl, tmp_path / "a")  # the real engine client
    qtbot.addWidget(p)
    p.show()
    p.request_extra = {"threads": 1}
    p.prompt.setPlainText("a lovely cat walking on the beach")
    p.width_box.setValue(64)
    p.height_box.setValue(64)
    p.steps.setValue(4)
    p.cfg.setValue(2.0)
    p.sampler.setCurrentText("euler")
    drop(p.inputs.init_slot, picture)

    def run() -> tuple[dict, list[np.ndarray]]:
        assert p.generate(), p.state.text()
        qtbot.waitUntil(lambda: not p.is_running(), timeout=180_000)
        assert not p.error_box.isVisible(), p.error_label.text()
        [video] = sorted(p.history_dir.glob("*.webm"))
        return read_result(video).settings, read_video(video)[0]

    plain, plain_frames = run()
    assert plain["init_img"] == str(picture)
    assert (plain["high_noise_cfg_scale"], plain.get("high_noise_sampling_method"), plain["moe_boundary"]) == \
        (7.0, None, 0.875)  # sd-cli's defaults; the record's steps are the ones the boundary gave
    assert plain["high_noise_steps"] == 2
    p.set_history_dir(tmp_path / "b")
    p.high_noise.steps.setValue(3)
    p.high_noise.cfg.setValue(3.5)
    p.high_noise.sampler.setCurrentText("euler_a")
    got, frames = run()
    assert (got["init_img"], got["high_noise_steps"], got["high_noise_cfg_scale"], got["high_noise_sampling_method"],
            got["seed"]) == (str(picture), 3, 3.5, "euler_a", plain["seed"])
    assert got.get("strength") in (None, 0.75)
    assert len(frames) == len(plain_frames) == 5 and frames[0].shape == (64, 64, 3)
    assert max(float(np.abs(a.astype(float) - b).mean()) for a, b in zip(frames, plain_frames, strict=True)) > 1.0
    p.shutdown()


def test_a_dropped_video_restores_its_high_noise_phase(qtbot, tmp_path: Path, picture: Path) -> None:
    """A video's record gives its high-noise values back to the group (as its frames and fps),
    and the board's command writes them."""
    from sdplan.app.video import write_video_result

    frames = [np.full((32, 48, 3), 30 * i, np.uint8) for i in range(5)]
    record = {"params": {"prompt": "a cat", "seed": 9, "steps": 4, "width": 48, "height": 32, "mode": "vid_gen",
                         "video_frames": 5, "fps": 16, "init_img": str(picture), "high_noise_steps": 3,
                         "high_noise_cfg_scale": 3.5, "high_noise_sampling_method": "euler_a", "moe_boundary": 0.9}}
    video = write_video_result(tmp_path / "out", frames, record, I2V, 16)
    p = panel_for(qtbot, None)
    p.ctl.import_png(video)
    assert p.ctl.model_files == I2V
    g = p.high_noise
    assert (g.steps.value(), g.cfg.value(), g.sampler.currentText(), g.boundary.value()) == (3, 3.5, "euler_a", 0.9)
    assert p.inputs.init_slot.path == str(picture)
    assert "--high-noise-steps 3 --high-noise-cfg-scale 3.5 --high-noise-sampling-method euler_a --moe-boundary 0.9" \
        in p.ctl.session.command_line()
