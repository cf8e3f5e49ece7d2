"""The generation panel's hires fix, VAE tiling and ControlNet groups, the board's ControlNet
and upscaler cards, the queue's options per job.

- The request the groups build is the command line's for the same flags, and running it gives
  the same picture and record as ``sdplan generate`` (the demo model with a demo-size
  ControlNet from its UNet, an ESRGAN hires upscaler found in a folder, VAE tiles).
- A group the open family cannot run is disabled with the registry's refusal as its tooltip
  and one line; a refused combination (hires with a mask, ControlNet without a control
  picture) is the one line that disables Generate, before anything loads.
- The ControlNet and the upscaler get cards when their files are set, move between devices by
  a drop through the model's mime data, and their weights sit in the estimate on the device
  they were dropped on, equal to what ``sdplan generate`` counts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

pytest.importorskip("pytestqt")
G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)

from generate_util import parse, png  # noqa: E402
from PIL import Image  # noqa: E402
from PySide6.QtCore import QSettings, Qt  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.app.generation import GenerationPanel  # noqa: E402
from sdplan.app.window import MainWindow  # noqa: E402
from sdplan.core.pipelines.demo.model import DEMO_PROMPT, demo_model_path  # noqa: E402
from sdplan.core.pipelines.job_queue import Job  # noqa: E402
from sdplan.core.pipelines.request import GenerationRequest  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.runtime.devices import live_inventory  # noqa: E402

GIB = 1 << 30
#: The ``sdplan`` chunk's fields both routes must write alike (as tests/test_app_request_route.py).
FIELDS = ("settings", "placement", "model_flags", "command", "architecture", "ran", "model_files",
          "model_hash", "model_hash_method", "version")
BASE = {"prompt": DEMO_PROMPT, "negative_prompt": None, "width": 64, "height": 64, "steps": 3,
        "cfg_scale": 5.0, "seed": 46, "sampling_method": "euler", "scheduler": "discrete", "batch_count": 1}
BASE_ARGV = ["--demo", "-p", DEMO_PROMPT, "-W", "64", "-H", "64", "--steps", "3", "--cfg-scale", "5", "-s", "46",
             "--sampling-method", "euler", "--scheduler", "discrete", "-t", "1"]


@pytest.fixture(scope="module")
def demo_net(tmp_path_factory) -> str:
    from controlnet_util import controlnet_from_unet

    return controlnet_from_unet(demo_model_path(), tmp_path_factory.mktemp("cn") / "demo_controlnet.safetensors")


@pytest.fixture(scope="module")
def upscalers(tmp_path_factory) -> Path:
    from pth_writer import compact_weights
    from safetensors.numpy import save_file

    d = tmp_path_factory.mktemp("upscalers")
    save_file(compact_weights(feat=8, n_conv=2), str(d / "compact_x2.safetensors"))
    (d / "notes.txt").write_text("not a model")
    return d


def control_png(path: Path) -> str:
    a = np.zeros((64, 64, 3), np.uint8)
    a[:, 32:] = 255
    a[16:48, 4:28] = 255
    Image.fromarray(a).save(path)
    return str(path)


def d1() -> Inventory:
    return Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB),
                      Device("CUDA1", "RTX 3060", "gpu", "CUDA", 11 * GIB, 12 * GIB),
                      Device("CPU", "Ryzen", "cpu", "CPU", 48 * GIB, 64 * GIB)))


def fill_groups(panel: GenerationPanel, net: str, picture: str, folder: Path) -> None:
    """Every group on, through its widgets: hires 2x with the folder's ESRGAN, 2 steps,
    denoise 0.5; tiles 32x48 px, overlap 0.25; the ControlNet at 0.8 with Canny."""
    g = panel.module_groups
    g.ask_path = lambda title, filt, folder_wanted: str(folder) if folder_wanted else ""
    g.groups["hires"].setChecked(True)
    g.hires_dir_btn.click()  # the folder "chosen": its models join the upscaler list
    names = [g.hires_upscaler.itemText(i) for i in range(g.hires_upscaler.count())]
    assert "compact_x2" in names and "notes" not in names and "Lanczos" in names
    g.hires_upscaler.setCurrentText("compact_x2")
    g.hires_scale.setValue(2.0)
    g.hires_steps.setValue(2)
    g.hires_strength.setValue(0.5)
    g.groups["vae_tiling"].setChecked(True)
    g.tile_width.setValue(32)
    g.tile_height.setValue(48)
    g.tile_overlap.setValue(0.25)
    g.groups["control"].setChecked(True)
    g.control_net.setText(net)
    g.control_image.setText(picture)
    g.control_strength.setValue(0.8)
    g.canny.setChecked(True)


def flags(net: str, picture: str, folder: Path) -> list[str]:
    return ["--hires", "--hires-upscaler", "compact_x2", "--hires-upscalers-dir", str(folder), "--hires-scale", "2",
            "--hires-steps", "2", "--hires-denoising-strength", "0.5", "--vae-tiling", "--vae-tile-size", "32x48",
            "--vae-tile-overlap", "0.25", "--control-net", net, "--control-image", picture,
            "--control-strength", "0.8", "--canny"]


def record(path: Path) -> tuple[dict[str, Any], str]:
    text = Image.open(path).text
    return json.loads(text["sdplan"]), text["parameters"]


def test_the_groups_build_the_command_lines_request_and_picture(qtbot, tmp_path: Path, demo_net: str,
                                                                upscalers: Path) -> None:
    from sdplan.core.commands.generate import (
        apply_demo,
        checked_request,
        model_files,
        read_models,
        request_settings,
    )
    from sdplan.core.pipelines.jobs import generate_job
    from sdplan.core.pipelines.request import family_for
    from sdplan.core.runtime.process import JobContext
    from sdplan.core.runtime.runner import CancelToken

    ctl = PlanController(live_inventory())
    ctl.load_model_files({"model": [str(demo_model_path())]})
    panel = GenerationPanel(ctl, tmp_path / "history", client_factory=lambda: None)
    qtbot.addWidget(panel)
    picture = control_png(tmp_path / "control.png")
    fill_groups(panel, demo_net, picture, upscalers)
    groups = panel.module_groups.settings()
    assert ctl.generation["hires"] == groups["hires"] and ctl.generation["control_net"] == demo_net  # synced
    req = ctl.session.request({**BASE, **groups, "threads": 1})

    argv = [*BASE_ARGV, *flags(demo_net, picture, upscalers)]
    args = parse(argv)
    apply_demo(args)
    files = model_files(args)
    cli_req = checked_request(args, files, read_models(files))
    app_req = GenerationRequest.from_dict(req)
    fam, variant = family_for(read_models(files).architecture)
    app_checked = app_req.check(fam, variant)
    for name in ("hires", "control", "control_net", "vae_tiling", "width", "height", "steps"):
        assert getattr(app_checked, name) == getattr(cli_req, name), name
    assert app_req.modules() == cli_req.modules() == ("te", "controlnet", "diffusion", "vae", "upscaler")
    assert {k: v for k, v in request_settings(args).items() if k in groups} == \
        {k: v for k, v in groups.items()}
    # the plan the app sends carries the ControlNet and the upscaler, on the board's devices
    assert set(req["plan"]["placements"]) >= {"controlnet", "upscaler"}

    result = generate_job(JobContext(lambda *a: None, CancelToken()), req)
    [app_png] = panel.save_results(result["images"], result, req)
    cli_png = tmp_path / "cli.png"
    cli_args = parse([*argv, "-o", str(cli_png), "--in-process"])
    assert cli_args.run(cli_args) == 0
    assert png(app_png).shape == (128, 128, 3)  # the hires pass doubled the picture
    assert np.array_equal(png(app_png), png(cli_png))
    app, app_params = record(app_png)
    cli, cli_params = record(cli_png)
    for key in FIELDS:
        assert app.get(key) == cli.get(key), (key, app.get(key), cli.get(key))
    assert app_params == cli_params
    assert app["ran"]["controlnet"]["devices"] == app["ran"]["upscaler"]["devices"] == ["CPU"]
    assert app["settings"]["hires"]["upscaler"] == "compact_x2"


def test_refused_groups_and_combinations_are_one_line(qtbot, tmp_path: Path, demo_net: str) -> None:
    ctl = PlanController(d1())
    panel = GenerationPanel(ctl, tmp_path / "history", client_factory=lambda: None)
    qtbot.addWidget(panel)
    g = panel.module_groups
    ctl.plan_for_builtin("flux2-klein-4b-q8_0")  # FLUX.2 klein: VAE tiles only
    assert not g.groups["hires"].isEnabled() and not g.groups["control"].isEnabled()
    assert g.groups["vae_tiling"].isEnabled()
    assert g.groups["hires"].toolTip() == "--hires: FLUX.2 klein does not take it in sdplan"
    assert g.notes["control"].text() == "--control-net: FLUX.2 klein does not take it in sdplan"
    assert not g.notes["control"].isHidden() and g.notes["vae_tiling"].isHidden()
    g.groups["hires"].setChecked(True)  # checked but refused: nothing reaches the request
    assert g.settings()["hires"] is None
    ctl.plan_for_builtin("chroma1-hd-q8_0")  # Chroma: hires and tiles, no ControlNet
    assert g.groups["hires"].isEnabled() and not g.groups["control"].isEnabled()
    assert g.groups["control"].toolTip() == "--control-net: Chroma does not take it in sdplan"
    ctl.plan_for_builtin("sdxl-base-q8_0")  # SDXL takes all three
    assert all(box.isEnabled() for box in g.groups.values())
    assert all(note.isHidden() for note in g.notes.values())
    assert g.groups["hires"].toolTip().startswith("A second pass")

    # a refused combination: one line before anything loads, Generate disabled
    ctl.load_model_files({"model": [str(demo_model_path())]})
    g.groups["hires"].setChecked(True)
    assert panel.refusal() is None and panel.generate_btn.isEnabled()
    panel.inputs.init_slot.set_path(control_png(tmp_path / "init.png"))
    panel.inputs.mask_slot.set_path(control_png(tmp_path / "mask.png"))
    panel.update_state()
    hires_mask = "--hires with --mask: sdplan does not run the hires fix of an inpainting; remove one of them"
    assert panel.unavailable_reason() == hires_mask and panel.state.text() == hires_mask
    assert not panel.generate_btn.isEnabled()
    panel.inputs.init_slot.set_path(None)
    panel.inputs.mask_slot.set_path(None)
    g.groups["hires"].setChecked(False)
    g.groups["control"].setChecked(True)
    g.control_net.setText(demo_net)
    g.control_net.editingFinished.emit()
    assert panel.unavailable_reason() == "--control-net needs --control-image (the picture that steers it)"
    assert not panel.generate_btn.isEnabled()
    assert panel.state.text() == panel.unavailable_reason() and "\n" not in panel.state.text()


def test_controlnet_and_upscaler_cards_are_placed_and_estimated(qtbot, tmp_path: Path, demo_net: str,
                                                                upscalers: Path) -> None:
    from safetensors.numpy import load_file
    from sdplan.core.commands.generate_modules import with_late_modules as cli_late
    from sdplan.core.session.modules import with_late_modules

    ctl = PlanController(d1())
    ctl.load_model_files({"model": [str(demo_model_path())]})
    win = MainWindow(ctl, QSettings(str(tmp_path / "s.ini"), QSettings.Format.IniFormat),
                     history_dir=tmp_path / "history")
    qtbot.addWidget(win)
    assert "controlnet" not in ctl.modules() and "upscaler" not in ctl.modules()
    fill_groups(win.generation, demo_net, control_png(tmp_path / "c.png"), upscalers)
    assert ctl.modules() == ["diffusion", "te", "vae", "controlnet", "upscaler"]
    # the same weights generate counts for these files
    esrgan = str(upscalers / "compact_x2.safetensors")
    files = {"model": [str(demo_model_path())], "control_net": [demo_net]}
    base = ctl.session._profile
    want = cli_late(base, files, esrgan)
    got = with_late_modules(base, {"controlnet": demo_net, "upscaler": esrgan})
    assert got is not None and got.modules["controlnet"] == want.modules["controlnet"]
    assert ctl.profile.modules["upscaler"] == want.modules["upscaler"]
    assert ctl.profile.modules["upscaler"].total == 4 * sum(v.size for v in load_file(esrgan).values())

    model = win.board.model
    for module, device in (("controlnet", "CUDA1"), ("upscaler", "CPU")):
        source = ctl.plan.modules[module].devices[0]
        mime = model.mimeData([model.card_index(source, module)])
        assert model.dropMimeData(mime, Qt.DropAction.MoveAction, -1, -1, model.target_index(device))
        assert ctl.plan.modules[module].devices == [device]
        assert [c.module for c in win.board.columns[device].cards].count(module) == 1
        assert ctl.fit.modules[module].weights == {device: ctl.profile.modules[module].total}
    assert "controlnet=CUDA1" in ctl.plan.backend
    # the estimate is at the hires pass's size: 128 px for a 64 px picture at scale 2
    ctl.set_generation(width=64, height=64)
    assert ctl.session.peak_size()[:2] == (128, 128)
    req = win.generation.request()
    assert req["plan"]["placements"]["controlnet"]["devices"] == ["CUDA1"]
    assert req["plan"]["placements"]["upscaler"]["devices"] == ["CPU"]
    # the controlnet card goes when its group is turned off; the placement keeps naming it
    win.generation.module_groups.groups["control"].setChecked(False)
    assert "controlnet" not in ctl.profile.modules


def test_the_queue_shows_each_jobs_options(tmp_path: Path) -> None:
    from sdplan.app.queue_panel import job_size

    req = {"width": 512, "height": 512, "batch_count": 2,
           "hires": {"enabled": True, "upscaler": "Latent", "scale": 1.5, "steps": 10,
                     "denoising_strength": 0.5},
           "control_net": "/m/canny_cn.safetensors", "control": {"control_image": "c.png",
                                                                 "control_strength": 0.8, "canny": True},
           "vae_tiling": {"enabled": True, "tile_px": [256, 128], "overlap": 0.5, "relative": None},
           "model_files": {"model": ["/m/sd.safetensors"], "upscale_model": ["/m/x4.pth"]}}
    job = Job(id="1", label="a cat", request=req)
    assert job_size(job) == ("512×512 px, batch 2 · hires 1.5× Latent, 10 steps, denoise 0.5"
                             " · ControlNet canny_cn.safetensors × 0.8 (Canny) · VAE tiles 256×128 px"
                             " · upscaler x4.pth")
    plain = Job(id="2", label="a dog", request={"width": 64, "height": 64, "hires": {"enabled": False}})
    assert job_size(plain) == "64×64 px"


def test_a_pasted_command_fills_the_groups_and_runs_them(qtbot, tmp_path: Path, demo_net: str,
                                                         upscalers: Path) -> None:
    """The hires fix, ControlNet and tiling flags of a pasted command become the groups'
    settings (the ControlNet's file a setting, no longer a model file): the panel shows them,
    the request carries them as the groups build them, the command writes each flag once."""
    import shlex

    picture = control_png(tmp_path / "control.png")
    ctl = PlanController(live_inventory())
    panel = GenerationPanel(ctl, tmp_path / "history", client_factory=lambda: None)
    qtbot.addWidget(panel)
    pasted = shlex.join(["sd-cli", "-m", str(demo_model_path()), "-p", "a cat", "--weird",
                         *flags(demo_net, picture, upscalers)])
    assert ctl.import_command(pasted).unknown[-1] == "--weird"
    assert ctl.model_files == {"model": [str(demo_model_path())]} and ctl.kept_args == ["--weird"]
    assert ctl.generation["prompt"] == panel.prompt.toPlainText() == "a cat"  # the demo's LoRA folder
    # listed as the model opened did not push the panel's fields over the paste
    g = panel.module_groups
    assert all(box.isChecked() for box in g.groups.values())
    assert g.hires_upscaler.currentText() == "compact_x2" and g.hires_dir.text() == str(upscalers)
    assert (g.tile_width.value(), g.tile_height.value(), g.tile_overlap.value()) == (32, 48, 0.25)
    assert g.control_net.text() == demo_net and g.canny.isChecked() and g.control_strength.value() == 0.8
    assert ctl.modules() == ["diffusion", "te", "vae", "controlnet", "upscaler"]
    req = GenerationRequest.from_dict(panel.request())
    assert req.control_net == demo_net and req.control.image == picture and req.control.canny
    assert req.hires.upscaler == "compact_x2" and req.hires.steps == 2 and req.vae_tiling.tile_px == (32, 48)
    argv = shlex.split(ctl.command_line())
    for flag in ("--control-net", "--hires", "--vae-tiling", "--canny", "--weird"):
        assert argv.count(flag) == 1, flag
    # the same flags read back give the same settings (nothing kept twice, nothing lost)
    again = PlanController(live_inventory())
    again.import_command(ctl.command_line())
    assert {k: again.generation.get(k) for k in g.settings()} == {k: ctl.generation.get(k) for k in g.settings()}
    # undo puts the board back as it was before the paste
    ctl.undo_stack.undo()
    assert not any(box.isChecked() for box in g.groups.values()) and "controlnet" not in ctl.modules()
