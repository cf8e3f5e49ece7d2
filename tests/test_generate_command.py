"""The sd-cli command ``sdplan generate`` records in a picture: the one the gallery copies,
the one that reads back into the board with the same settings, with the flags the model
files call for (the demo model's ``--prediction v``) and the LoRA / picture flags only when
used; and skip-layer guidance on a non-SD3 model refused before any plan output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from generate_util import parse  # noqa: E402
from PIL import Image  # noqa: E402
from sdplan.core.pipelines.demo.model import demo_lora_dir, demo_model_path  # noqa: E402
from sdplan.core.pipelines.stages.results import read_result  # noqa: E402
from sdplan.core.planning.sdcli import GENERATION_FLAGS, SDCLI_DEFAULTS, import_sdcli_command  # noqa: E402


def run(argv: list[str]) -> int:
    args = parse(argv)
    return args.run(args)


def record(path: Path) -> dict:
    return json.loads(Image.open(path).text["sdplan"])


def gallery_command(path: Path) -> str:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    pytest.importorskip("PySide6")
    from sdplan.app.gallery import result_command

    return result_command(read_result(path))


def same_settings(cmd: str, settings: dict) -> None:
    """The command read back (the board's reader) gives the picture's generation settings:
    each one the command leaves out is sd-cli's own value."""
    back = import_sdcli_command(cmd)
    for key in GENERATION_FLAGS:
        if key in ("output", "lora_model_dir", "lora_apply_mode", "init_img", "mask", "strength"):
            continue
        if key in back.generation:
            assert back.generation[key] == settings[key], key
        elif key in settings:
            assert settings[key] in (SDCLI_DEFAULTS.get(key), "[7,8,9]") or key == "clip_skip" and settings[key] <= 0, key


def test_demo_picture_command_is_the_gallerys_and_reads_back(tmp_path: Path) -> None:
    out = tmp_path / "x.png"
    assert run(["--demo", "-p", "a red circle on a blue background", "--steps", "2", "-t", "1",
                "-o", str(out), "--in-process"]) == 0
    doc = record(out)
    cmd = doc["command"]
    assert cmd == (f"sd-cli --model {demo_model_path().name} --backend CPU --prompt 'a red circle on a blue background' "
                   "--width 128 --height 128 --steps 2 --cfg-scale 5 --seed 42 --sampling-method euler "
                   "--prediction v")
    assert "--lora-model-dir" not in cmd and "--strength" not in cmd and "--scheduler" not in cmd
    assert doc["model_flags"] == ["--prediction", "v"]
    assert gallery_command(out) == cmd
    back = import_sdcli_command(cmd)
    assert back.model_files == {"model": demo_model_path().name} and back.kept == ["--prediction", "v"]
    assert back.placement.to_strings()["backend"] == doc["placement"]["backend"]
    same_settings(cmd, doc["settings"])


def test_lora_tag_and_init_picture_are_in_the_command(tmp_path: Path) -> None:
    if not (demo_lora_dir() / "outline.safetensors").is_file():
        pytest.skip("the demo LoRA is not installed")
    pic = tmp_path / "start.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (128, 128, 3), dtype=np.uint8)).save(pic)
    out = tmp_path / "y.png"
    assert run(["--demo", "-p", "a red circle on a blue background<lora:outline:1>", "-i", str(pic),
                "--strength", "0.6", "--steps", "2", "-t", "1", "-o", str(out), "--in-process"]) == 0
    doc = record(out)
    cmd = doc["command"]
    # a shared picture names files and folders, never where they are
    assert ("--lora-model-dir loras --lora-apply-mode immediately --init-img start.png --strength 0.6 "
            "--prediction v") in cmd
    assert str(tmp_path) not in json.dumps(doc) and str(demo_lora_dir()) not in json.dumps(doc)
    assert gallery_command(out) == cmd
    back = import_sdcli_command(cmd)
    assert (back.generation["strength"], back.generation["init_img"]) == (0.6, "start.png")
    same_settings(cmd, doc["settings"])


def test_skip_layer_guidance_on_sd1_is_refused_before_the_plan(tmp_path: Path, capsys, monkeypatch) -> None:
    """The demo (SD 1.x layout) with --slg-scale: one line on stderr, exit 2, nothing on
    stdout, no engine started, no picture."""
    from sdplan.core.runtime import process

    def no_engine(*a, **k):
        raise AssertionError("the engine started")

    monkeypatch.setattr(process, "Engine", no_engine)
    out = tmp_path / "z.png"
    assert run(["--demo", "-p", "a red circle on a blue background", "--slg-scale", "2", "-o", str(out)]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    lines = cap.err.splitlines()
    assert len(lines) == 1 and lines[0].endswith(
        "--slg-scale 2: SD 1.x does not take it in sdplan; remove it"), lines
    assert not out.exists()
