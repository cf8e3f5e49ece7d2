"""Wan video in the app: the tiny Wan files (DiT, UMT5, the Wan 2.1 autoencoder) open onto the
board; the panel offers frames (4k+1) and fps for a family that makes video only and sends
``-M vid_gen``; a run on the real engine writes a WebM carrying its record that the panel plays
(the frame index advances with the timer at the file's rate, play/pause); the gallery lists a
video beside pictures with a badged first frame, opens it playing, and "Reuse settings" restores
its frames and fps."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("pytestqt")
pytest.importorskip("av")

from PySide6.QtCore import QSettings  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.generation import GenerationPanel  # noqa: E402
from sdplan.app.main import demo_model_path  # noqa: E402
from sdplan.app.video import VideoViewer, makes_video, snap_frames, write_video_result  # noqa: E402
from sdplan.app.window import MainWindow  # noqa: E402
from sdplan.app.worker import engine_unavailable_reason  # noqa: E402
from sdplan.core.families.registry import FAMILIES  # noqa: E402
from sdplan.core.pipelines.stages.results import read_result, result_text, save_png  # noqa: E402
from sdplan.core.pipelines.stages.video import read_video, read_video_text, save_video  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sparse_writer import FIXTURES  # noqa: E402

GIB = 1 << 30
WAN = {"diffusion_model": [str(FIXTURES / "wan_tiny.safetensors")],
       "t5xxl": [str(FIXTURES / "umt5_tiny.safetensors")],
       "vae": [str(FIXTURES / "wan_vae_tiny.safetensors")]}
PROMPT = "a lovely cat walking on the beach"


def cpu_controller() -> PlanController:
    return PlanController(Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),)))


def luma(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def test_only_the_video_family_makes_video() -> None:
    """The registry's answer: Wan honours -M vid_gen, no other family does."""
    assert [f.title for f in FAMILIES if makes_video(f.name)] == ["Wan 2.x video"]
    assert makes_video("wan-t2v_a14b") and not makes_video(None) and not makes_video("nothing")


def test_frames_snap_to_4k_plus_1(qtbot) -> None:
    assert [snap_frames(n) for n in (0, 1, 2, 3, 4, 5, 6, 7, 8, 81, 82, 83)] == \
        [1, 1, 1, 5, 5, 5, 5, 9, 9, 81, 81, 85]
    from sdplan.app.video import VideoFields

    f = VideoFields()
    qtbot.addWidget(f)
    f.frames.lineEdit().setText("6")  # typed: the nearest 4k+1
    f.frames.interpretText()
    assert f.frames.value() == 5
    f.frames.stepUp()  # the arrows step by 4
    assert f.frames.value() == 9


def test_video_fields_show_for_wan_only(qtbot) -> None:
    ctl = cpu_controller()
    ctl.open_files([p for v in WAN.values() for p in v])  # opened as files, roles from the tensors
    assert ctl.model_files == WAN and ctl.profile.architecture.startswith("wan")
    p = GenerationPanel(ctl, "/nonexistent/history", client_factory=lambda: None)
    qtbot.addWidget(p)
    p.show()
    assert p.video_fields.isVisible()
    p.video_fields.frames.setValue(9)
    p.video_fields.fps.setValue(12)
    req = p.request()
    assert (req["mode"], req["video_frames"], req["fps"]) == ("vid_gen", 9, 12)
    assert ctl.generation["video_frames"] == 9  # kept with the board's settings
    assert ctl.session.command_line().endswith(" -M vid_gen --video-frames 9 --fps 12")
    demo = demo_model_path()
    if demo is None:
        pytest.skip("no demo model in this installation")
    ctl.load_model_files({"model": [str(demo)]})  # an SD-style model: no video
    assert not p.video_fields.isVisible()
    assert p.video_fields.settings() == {"mode": None, "video_frames": None, "fps": None}
    req = p.request()
    assert req.get("mode") != "vid_gen" and req.get("video_frames") in (None, 1)
    assert "vid_gen" not in ctl.session.command_line()


def test_a_pasted_video_command_fills_the_fields(qtbot) -> None:
    """sd-cli's -M vid_gen, --video-frames and --fps become the panel's video settings (not
    kept arguments) and the board's command writes them back; without -M vid_gen they stay
    kept as written."""
    ctl = cpu_controller()
    p = GenerationPanel(ctl, "/nonexistent/history", client_factory=lambda: None)
    qtbot.addWidget(p)
    files = " ".join(f"--{k.replace('_', '-')} {v[0]}" for k, v in WAN.items())
    ctl.session.import_command(f"sd-cli -M vid_gen --video-frames 13 --fps 10 {files} -p cat")
    ctl.planChanged.emit("load")
    assert ctl.session.kept_args == []
    assert (ctl.generation["mode"], ctl.generation["video_frames"], ctl.generation["fps"]) == ("vid_gen", 13, 10)
    assert (p.video_fields.frames.value(), p.video_fields.fps.value()) == (13, 10)
    assert ctl.session.command_line().endswith("-M vid_gen --video-frames 13 --fps 10")
    ctl.session.import_command(f"sd-cli --video-frames 13 {files} -p cat")
    assert ctl.session.kept_args == ["--video-frames", "13"]


def test_a_video_file_carries_its_record(tmp_path: Path) -> None:
    """WebM and MP4 keep the record in their metadata (read back as a result); AVI keeps none."""
    frames = [np.full((32, 48, 3), 40 * i, np.uint8) for i in range(5)]
    req = {"prompt": PROMPT, "seed": 3, "steps": 4, "width": 48, "height": 32, "mode": "vid_gen",
           "video_frames": 5, "fps": 8, "model_files": WAN}
    text = result_text({"seed": 3}, req)
    for ext in (".webm", ".mp4"):
        path = save_video(frames, tmp_path / f"v{ext}", 8, text)
        got = read_video_text(path)
        assert got["sdplan"] == text["sdplan"] and got["parameters"] == text["parameters"]
        info = read_result(path)
        assert (info.prompt, info.settings["seed"], info.settings["video_frames"], info.settings["fps"]) == \
            (PROMPT, 3, 5, 8)
        assert info.model == "wan_tiny.safetensors"
    avi = save_video(frames, tmp_path / "v.avi", 8, text)
    assert "sdplan" not in read_video_text(avi)
    with pytest.raises(OSError):
        read_result(tmp_path / "missing.webm")


def test_the_panel_makes_a_video_and_plays_it(qtbot, tmp_path: Path) -> None:
    """The tiny Wan set on the CPU through the real engine process (threads 1, 64x64, 5
    frames at 8 fps): a WebM with the run's record, decoded to 5 frames at 8 fps close to the
    engine's frames; the panel plays them in turn at 125 ms, pauses and plays again."""
    reason = engine_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    ctl = cpu_controller()
    ctl.load_model_files(WAN)
    hist = tmp_path / "history"
    p = GenerationPanel(ctl, hist)  # the real engine client
    qtbot.addWidget(p)
    p.resize(420, 900)
    p.show()
    p.request_extra = {"threads": 1}
    p.prompt.setPlainText(PROMPT)
    p.width_box.setValue(64)
    p.height_box.setValue(64)
    p.steps.setValue(3)
    p.cfg.setValue(2.0)
    p.video_fields.frames.setValue(5)
    p.video_fields.fps.setValue(8)
    assert p.generate(), p.state.text()
    qtbot.waitUntil(lambda: not p.is_running(), timeout=120_000)
    assert not p.error_box.isVisible(), p.error_label.text()
    [video] = sorted(hist.glob("*.webm"))
    assert sorted(x.name for x in hist.iterdir()) == [video.name.replace(".webm", ".json"), video.name]
    frames, rate = read_video(video)
    assert len(frames) == 5 and rate == 8.0 and frames[0].shape == (64, 64, 3)
    engine = [np.asarray(img.constBits()).reshape(64, 64 * 3)[:, :].reshape(64, 64, 3)
              for img in p.last_images]
    assert len(engine) == 5
    assert max(float(np.abs(luma(a) - luma(b)).mean()) for a, b in zip(frames, engine, strict=True)) < 6.0
    info = read_result(video)
    assert (info.prompt, info.settings["mode"], info.settings["video_frames"], info.settings["fps"]) == \
        (PROMPT, "vid_gen", 5, 8)
    assert info.model_files == WAN  # the index beside it: the full paths
    assert json.loads(video.with_suffix(".json").read_text())["settings"]["video"] == {"frames": 5, "fps": 8}
    assert "5 frames at 8 fps" in p.params_label.text()  # the caption
    player = p.player
    assert player.isVisible() and len(player.frames) == 5 and player.timer.interval() == 125
    assert player.is_playing()
    seen: list[int] = []
    player.frameChanged.connect(seen.append)
    qtbot.waitUntil(lambda: len(seen) >= 6, timeout=5000)
    start = seen[0]
    assert seen[:6] == [(start + i) % 5 for i in range(6)]  # in turn, looping
    assert p.preview.pixmap() is not None and not p.preview.pixmap().isNull()
    player.play_btn.click()  # pause
    assert not player.is_playing() and player.play_btn.text() == "Play"
    held = player.index
    qtbot.wait(400)
    assert player.index == held
    player.play_btn.click()
    qtbot.waitUntil(lambda: player.index != held, timeout=2000)
    assert p.history.count() == 1 and p.history.item(0).data(0x0100) == str(video)
    if os.environ.get("SDPLAN_SCREENSHOT_DIR"):  # the panel playing, for a person to look at
        p.grab().save(str(Path(os.environ["SDPLAN_SCREENSHOT_DIR"]) / "panel_video.png"))
    p.shutdown()


def test_gallery_lists_opens_and_reuses_a_video(qtbot, tmp_path: Path) -> None:
    hist = tmp_path / "history"
    frames = [np.full((32, 48, 3), (50 * i, 200, 255 - 50 * i), np.uint8) for i in range(9)]
    req = {"prompt": PROMPT, "seed": 5, "steps": 4, "cfg_scale": 2.0, "width": 48, "height": 32,
           "mode": "vid_gen", "video_frames": 9, "fps": 8, "model_files": WAN}
    record = {"params": {k: v for k, v in req.items() if k != "model_files"}}
    video = write_video_result(hist, frames, record, WAN, 8)
    picture = hist / "picture.png"
    save_png(np.zeros((32, 48, 3), np.uint8), picture, result_text({"seed": 1}, {"prompt": "a picture"}))
    win = MainWindow(cpu_controller(), QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat),
                     history_dir=hist, queue_path=tmp_path / "q.json", library_cache=str(tmp_path / "lib.json"))
    qtbot.addWidget(win)
    win.show()
    g = win.gallery
    win.tabs.setCurrentWidget(g)
    assert g.model.rowCount() == 2
    assert {i.path for i in g.model.items} == {str(video), str(picture)}
    assert g.select_path(str(video))
    qtbot.waitUntil(lambda: str(video) in g.model.thumbs, timeout=5000)
    thumb = g.model.thumbs[str(video)].pixmap(128, 128).toImage()
    assert thumb.width() == 128  # the first frame scaled (48x32 -> 128 wide)
    top = thumb.pixelColor(thumb.width() - 2, 2)
    assert (top.red(), top.green(), top.blue()) == pytest.approx((0, 200, 255), abs=12)  # frame 0
    corner = thumb.pixelColor(5, thumb.height() - 5)  # the "video" badge: dark
    assert corner.red() + corner.green() + corner.blue() < 200
    assert "9 frames at 8 fps" in g.details.text()
    viewer = g.open_current()
    assert isinstance(viewer, VideoViewer)
    assert len(viewer.player.frames) == 9 and viewer.player.fps == 8.0 and viewer.player.is_playing()
    qtbot.waitUntil(lambda: viewer.player.index >= 2, timeout=3000)
    viewer.close()
    panel = win.generation
    assert (panel.video_fields.frames.value(), panel.video_fields.fps.value()) == (5, 16)
    g.reuse_current()  # the video's model files, frames and fps back in the panel
    assert win.ctl.model_files == WAN and panel.video_fields.isVisible()
    assert (panel.video_fields.frames.value(), panel.video_fields.fps.value()) == (9, 8)
    assert panel.prompt.toPlainText() == PROMPT and panel.seed.value() == 5
    assert panel.request()["video_frames"] == 9


def test_the_board_estimate_counts_the_frames() -> None:
    """The board's estimate of a video measures the engine's graphs at the settings' frames:
    the autoencoder's compute grows with them and is the dry run's own figure."""
    if engine_unavailable_reason() is not None:
        pytest.skip(engine_unavailable_reason())
    from sdplan.core.pipelines.compute import measure_compute

    ctl = cpu_controller()
    s = ctl.session
    s.load_model_files(WAN)
    s.set_generation(width=64, height=64)
    vae = {}
    for n in (1, 5, 21):
        s.set_generation(mode="vid_gen", video_frames=n)
        vae[n] = s.fit.modules["vae"].compute["CPU"]
    assert vae[1] < vae[5] < vae[21]
    dry = measure_compute(WAN, width=64, height=64, batch=1, overrides={"video_frames": 21})
    assert vae[21] == dry["vae"]
    s.set_generation(mode=None, video_frames=None)  # pictures again: one frame
    assert s.fit.modules["vae"].compute["CPU"] == vae[1]


def test_a_dropped_video_restores_its_run(qtbot, tmp_path: Path) -> None:
    """A video dropped on the window restores as a picture does: its prompt, model files, and
    its frames and frame rate (read from the WebM's tags)."""
    frames = [np.full((32, 48, 3), 30 * i, np.uint8) for i in range(5)]
    record = {"params": {"prompt": PROMPT, "seed": 9, "steps": 4, "width": 48, "height": 32,
                         "mode": "vid_gen", "video_frames": 13, "fps": 10}}
    video = write_video_result(tmp_path / "out", frames, record, WAN, 10)
    win = MainWindow(cpu_controller(), QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat),
                     history_dir=tmp_path / "history", queue_path=tmp_path / "q.json",
                     library_cache=str(tmp_path / "lib.json"))
    qtbot.addWidget(win)
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(video))])
    win.dropEvent(QDropEvent(QPointF(5, 5), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                             Qt.KeyboardModifier.NoModifier))
    assert win.ctl.model_files == WAN
    g = win.ctl.generation
    assert (g["prompt"], g["seed"], g["mode"], g["video_frames"], g["fps"]) == (PROMPT, 9, "vid_gen", 13, 10)
    panel = win.generation
    assert (panel.video_fields.frames.value(), panel.video_fields.fps.value()) == (13, 10)
