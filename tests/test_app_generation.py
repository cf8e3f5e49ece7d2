"""The generation panel against a fake engine client that replays recorded messages:
progress and preview, results in the history folder, engine failure with retry, cancel,
and the disabled state."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("pytestqt")

from replay_client import ReplayEngineClient  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.generation import GenerationPanel, to_qimage  # noqa: E402
from sdplan.core.errors import EngineError  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402

GIB = 1 << 30


def recorded(steps: int = 4) -> list[dict]:
    """Messages as the engine sends them: one progress per step with a preview, a result."""
    msgs: list[dict] = []
    for s in range(1, steps + 1):
        prev = np.full((16, 16, 3), s / steps, dtype=np.float32)
        msgs.append({"type": "progress", "step": s, "total": steps, "preview": prev})
    img = np.zeros((32, 48, 3), dtype=np.uint8)
    img[:, :, 0] = 200
    msgs.append({"type": "result", "images": [img], "params": {"seed": 7, "steps": steps}})
    return msgs


@pytest.fixture
def ctl(qtbot):
    inv = Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),))
    c = PlanController(inv)
    c.load_model_files({"diffusion_model": ["/nonexistent/model.safetensors"]}, strict=False)
    return c


def panel(qtbot, ctl, tmp_path, clients):
    it = iter(clients)
    p = GenerationPanel(ctl, tmp_path / "history", client_factory=lambda: next(it))
    qtbot.addWidget(p)
    p.show()
    return p


def test_disabled_without_model_or_engine(qtbot, tmp_path, monkeypatch):
    import sdplan.app.generation as generation

    # a build without the engine (no native module)
    monkeypatch.setattr(generation, "engine_unavailable_reason",
                        lambda: "Engine not available: this build has no engine client")
    inv = Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),))
    c = PlanController(inv)
    p = GenerationPanel(c, tmp_path / "h", client_factory=None)
    qtbot.addWidget(p)
    assert not p.generate_btn.isEnabled()
    assert "Load a model to generate" in p.state.text()
    assert not p.generate()
    c.load_model_files({"diffusion_model": ["/nonexistent/x.safetensors"]}, strict=False)
    # a model but no engine in this build: still disabled, and it says why
    assert not p.generate_btn.isEnabled()
    assert "Engine not available" in p.state.text()


def test_progress_preview_result_and_history(qtbot, ctl, tmp_path):
    client = ReplayEngineClient(recorded(4))
    p = panel(qtbot, ctl, tmp_path, [client])
    p.prompt.setPlainText("a lighthouse")
    assert p.generate()
    assert not p.generate_btn.isEnabled() and p.cancel_btn.isEnabled()
    qtbot.waitUntil(lambda: not p.is_running(), timeout=5000)
    assert p.progress.value() == 4 and p.progress.maximum() == 4
    assert p.progress_label.text().startswith("done")
    assert p.last_images and p.last_images[0].width() == 48
    assert p.last_images[0].pixelColor(0, 0).red() == 200
    saved = sorted((tmp_path / "history").glob("*.png"))
    assert len(saved) == 1 and saved[0].with_suffix(".json").exists()
    assert p.history.count() == 1
    assert "seed 7" in p.params_label.text() and "steps 4" in p.params_label.text()
    req = client.requests[0]
    assert req["prompt"] == "a lighthouse" and req["plan"]["strings"]["backend"] == ctl.plan.backend
    assert req["model_files"] == {"diffusion_model": ["/nonexistent/model.safetensors"]}
    assert not client.closed and p.generate_btn.isEnabled()  # kept for the next run
    p.shutdown()
    assert client.closed


def test_engine_failure_shows_error_keeps_plan_and_retry_works(qtbot, ctl, tmp_path):
    ctl.assign("vae", "CPU")
    plan_before = ctl.plan
    crash = ReplayEngineClient([{"type": "progress", "step": 1, "total": 4, "preview": None},
                                {"type": "error", "message": "engine process exited (code -9)"}])
    dead = ReplayEngineClient([], fail_on_start=EngineError("out of memory", device="CPU",
                                                             module="diffusion"))
    good = ReplayEngineClient(recorded(4))
    p = panel(qtbot, ctl, tmp_path, [crash, dead, good])
    assert p.generate()
    qtbot.waitUntil(lambda: not p.is_running(), timeout=5000)
    assert p.error_box.isVisible()
    assert "engine process exited (code -9)" in p.error_label.text()
    assert ctl.plan is plan_before and p.generate_btn.isEnabled()
    assert p.retry()  # the engine does not even start this time
    qtbot.waitUntil(lambda: not p.is_running(), timeout=5000)
    assert "out of memory (module diffusion, device CPU)" in p.error_label.text()
    assert p.retry()
    qtbot.waitUntil(lambda: not p.is_running(), timeout=5000)
    assert not p.error_box.isVisible()
    assert p.last_images and p.progress.value() == 4
    assert good.requests[0] == crash.requests[0]  # retry sends the same request
    assert ctl.plan is plan_before


def test_cancel_stops_the_run(qtbot, ctl, tmp_path):
    slow = ReplayEngineClient(recorded(50), delay_s=0.05)
    p = panel(qtbot, ctl, tmp_path, [slow])
    assert p.generate()
    qtbot.waitUntil(lambda: p.progress.value() >= 2, timeout=5000)
    p.cancel_btn.click()
    qtbot.waitUntil(lambda: not p.is_running(), timeout=5000)
    assert p.progress_label.text() == "cancelled"
    assert p.progress.value() < 50 and not p.last_images
    assert not list((tmp_path / "history").glob("*.png"))
    assert p.generate_btn.isEnabled() and not p.cancel_btn.isEnabled()


def test_to_qimage_shapes():
    img = to_qimage(np.linspace(0, 1, 12, dtype=np.float32).reshape(2, 2, 3))
    assert (img.width(), img.height()) == (2, 2)
    assert img.pixelColor(1, 1).blue() == 255
    assert to_qimage(np.zeros((3, 5), np.uint8)).width() == 5
    with pytest.raises(ValueError):
        to_qimage(np.zeros((2, 2, 5)))


@pytest.mark.slow
def test_real_engine_generates_with_live_previews_into_history(qtbot, tmp_path):
    """One real generation on the tiny SD 1.x fixture through the engine process: previews
    every step, the picture shown and saved with its parameters."""
    from pathlib import Path

    from sdplan.app.worker import engine_unavailable_reason

    reason = engine_unavailable_reason()
    assert reason is None, reason
    tiny = Path(__file__).parent / "fixtures" / "sd1_tiny.safetensors"
    inv = Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),))
    c = PlanController(inv)
    c.open_files([str(tiny)])
    p = GenerationPanel(c, tmp_path / "history")  # the real engine client
    qtbot.addWidget(p)
    p.show()
    p.request_extra = {"overrides": {"clip_heads": 2}, "threads": 2}  # see fixture_configs
    assert p.generate_btn.isEnabled(), p.state.text()
    p.prompt.setPlainText("a red circle on a blue background")
    p.width_box.setValue(64)
    p.height_box.setValue(64)
    p.steps.setValue(4)
    p.cfg.setValue(5.0)
    p.seed.setValue(7)
    assert p.generate()
    qtbot.waitUntil(lambda: not p.is_running(), timeout=120_000)
    assert not p.error_box.isVisible(), p.error_label.text()
    assert p.preview_steps == [1, 2, 3, 4]
    assert p.progress.value() == 4 and p.progress_label.text().startswith("done")
    assert len(p.last_images) == 1
    img = p.last_images[0]
    assert (img.width(), img.height()) == (64, 64)
    saved = sorted((tmp_path / "history").glob("*.png"))
    assert len(saved) == 1
    from PySide6.QtGui import QImage

    back = QImage(str(saved[0]))
    assert back.convertToFormat(img.format()) == img
    index = json.loads(saved[0].with_suffix(".json").read_text())  # the gallery's index
    params = index["settings"]
    assert params["seed"] == 7 and params["prompt"] == "a red circle on a blue background"
    assert params["width"] == 64 and params["steps"] == 4
    assert "“a red circle on a blue background”" in p.params_label.text()
    engine = p.client
    assert engine is not None  # kept for the next run
    p.shutdown()
    assert p.client is None


def test_family_defaults_follow_the_loaded_model(qtbot, tmp_path):
    """Chroma's files bring its CFG 4 and euler to the panel; a user's change stays until the
    family changes; a built-in FLUX.1 schnell profile brings 4 steps and CFG 1."""
    from flux_util import AE, CHROMA, T5

    inv = Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),))
    c = PlanController(inv)
    p = panel(qtbot, c, tmp_path, [])
    assert p.cfg.value() == 1.0
    c.load_model_files({"diffusion_model": [str(CHROMA)], "t5xxl": [str(T5)], "vae": [str(AE)]})
    assert c.profile.architecture == "chroma"
    assert (p.cfg.value(), p.steps.value(), p.sampler.currentText()) == (4.0, 20, "euler")
    assert "--cfg-scale 4" in c.command_line()
    p.cfg.setValue(5.5)
    c.load_model_files({"diffusion_model": [str(CHROMA)], "t5xxl": [str(T5)], "vae": [str(AE)]})
    assert p.cfg.value() == 5.5  # same family: the user's choice stays
    c.plan_for_builtin("flux1-schnell-q8_0")
    assert (p.cfg.value(), p.steps.value()) == (1.0, 4)


def test_unwritable_history_warns_first_and_keeps_the_picture(qtbot, ctl, tmp_path):
    """A history folder that cannot be created (a file in the way): said before the run
    starts; the picture is still shown and no partial file is left."""
    (tmp_path / "history").write_text("a file where the folder should be")
    messages: list[str] = []
    ctl.status.connect(messages.append)
    p = panel(qtbot, ctl, tmp_path, [ReplayEngineClient(recorded(2))])
    p.prompt.setPlainText("a lighthouse")
    assert p.generate()
    assert any(m.startswith("results will not be saved") for m in messages)
    qtbot.waitUntil(lambda: not p.is_running(), timeout=5000)
    assert p.last_images and p.last_images[0].pixelColor(0, 0).red() == 200
    assert any(m.startswith("not saved: cannot write to") and "stays on screen" in m
               for m in messages)
    assert p.history.count() == 0 and [x.name for x in tmp_path.iterdir()] == ["history"]
    p.shutdown()


def test_a_size_the_model_cannot_draw_disables_generate(qtbot, tmp_path):
    """The demo draws multiples of 32 pixels (from its headers: 8 x 2^2): 100 px wide
    disables Generate with the reason before any engine starts; 96 enables it again."""
    from sdplan.core.pipelines.demo.model import demo_model_path

    inv = Inventory((Device("CPU", "cpu", "cpu", "CPU", 8 * GIB, 16 * GIB),))
    c = PlanController(inv)
    c.load_model_files({"model": [str(demo_model_path())]})
    assert c.size_multiple == 32
    started = []
    p = GenerationPanel(c, tmp_path / "h", client_factory=lambda: started.append(1) or ReplayEngineClient([]))
    qtbot.addWidget(p)
    p.width_box.setValue(100)
    p.height_box.setValue(64)
    assert not p.generate_btn.isEnabled()
    assert p.state.text() == "Size 100 × 64 px: this model draws sizes that are multiples of 32 px"
    assert not p.generate() and not started
    p.width_box.setValue(96)
    assert p.generate_btn.isEnabled() and p.state.isHidden()
    c.load_model_files({"diffusion_model": ["/nonexistent/x.safetensors"]}, strict=False)
    assert c.size_multiple is None  # unread files: the engine checks when it starts
