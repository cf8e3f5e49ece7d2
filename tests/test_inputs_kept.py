"""Inputs are never overwritten: an output that is an input (the same path, a link to it, a
hard link, a LoRA the prompt names, a picture input, a preview file) is a one-line refusal
before any work, and the input keeps its bytes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sdplan.core.cli import main
from sdplan.core.commands.same_file import refuse_overwriting, same_file
from sdplan.core.errors import OutputError

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"
LORA = REPO / "resources" / "demo" / "loras" / "outline.safetensors"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], *kept: Path) -> str:
    """Run ``sdplan ARGV`` in this process: exit 2, one error line on stderr (returned), and
    every file of ``kept`` unchanged."""
    before = {p: digest(p) for p in kept}
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert {p: digest(p) for p in kept} == before
    return lines[0]


@pytest.fixture()
def model_png(tmp_path: Path) -> Path:
    """The demo model under a ``.png`` name (a model file's name is the user's choice)."""
    path = tmp_path / "model.png"
    path.write_bytes(DEMO.read_bytes())
    return path


@pytest.fixture()
def picture(tmp_path: Path) -> Path:
    path = tmp_path / "pic.png"
    Image.fromarray(np.full((64, 64, 3), 90, np.uint8)).save(path)
    return path


def gen(*extra: str) -> list[str]:
    return ["generate", "-p", "a red circle on a blue background", "-W", "64", "-H", "64",
            "--steps", "2", "--in-process", *extra]


def test_generate_output_equal_to_the_model_is_refused(model_png: Path, capsys) -> None:
    line = refused(gen("-m", str(model_png), "-o", str(model_png)), capsys, model_png)
    assert line == (f"error [output_unwritable]: -o/--output {str(model_png)!r} is the same file "
                    f"as -m/--model {str(model_png)!r}: sdplan never writes over an input; choose "
                    "another output")


def test_a_link_or_a_hard_link_is_the_same_file(model_png: Path, tmp_path: Path, capsys) -> None:
    link = tmp_path / "link.png"
    link.symlink_to(model_png)
    hard = tmp_path / "hard.png"
    os.link(model_png, hard)
    for model, out in ((link, model_png), (model_png, link), (hard, model_png),
                       (model_png, tmp_path / "sub" / ".." / "model.png")):
        (tmp_path / "sub").mkdir(exist_ok=True)
        line = refused(gen("-m", str(model), "-o", str(out)), capsys, model_png)
        assert "is the same file as -m/--model" in line
    assert link.is_symlink()


def test_each_model_flag_is_an_input(tmp_path: Path, capsys) -> None:
    for flag in ("--vae", "--taesd", "--upscale-model", "--clip_l"):
        f = tmp_path / f"{flag.strip('-')}.png"
        f.write_bytes(b"not a picture: a file the run reads")
        line = refused(gen("-m", str(DEMO), flag, str(f), "-o", str(f)), capsys, f, DEMO)
        assert f"is the same file as {flag} " in line


def test_a_lora_the_prompt_names_is_an_input(tmp_path: Path, capsys) -> None:
    lora = tmp_path / "style.png"
    lora.write_bytes(LORA.read_bytes())
    argv = ["generate", "-m", str(DEMO), "-p", "a red circle <lora:style.png:0.8>", "-W", "64",
            "-H", "64", "--steps", "2", "--in-process", "--lora-model-dir", str(tmp_path),
            "-o", str(lora)]
    line = refused(argv, capsys, lora)
    assert "is the same file as <lora:style.png:...>" in line
    # without the extension, as sd-cli finds it
    lora2 = tmp_path / "outline.safetensors"
    lora2.write_bytes(LORA.read_bytes())
    argv[4] = "a red circle <lora:outline:1>"
    argv[-1] = str(lora2)
    assert "output_unwritable" in refused(argv, capsys, lora2)


def test_picture_inputs_and_previews(picture: Path, tmp_path: Path, capsys) -> None:
    line = refused(gen("-m", str(DEMO), "-i", str(picture), "-o", str(picture)), capsys, picture)
    assert "is the same file as -i/--init-img" in line
    mask = tmp_path / "mask.png"
    Image.fromarray(np.full((64, 64), 255, np.uint8)).save(mask)
    line = refused(gen("-m", str(DEMO), "-i", str(picture), "--mask", str(mask), "-o", str(mask)),
                   capsys, mask)
    assert "is the same file as --mask" in line
    prev = tmp_path / "prev"
    prev.mkdir()
    old = prev / "preview_002.png"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(old)
    line = refused(gen("-m", str(DEMO), "-i", str(old), "-o", str(tmp_path / "o.png"),
                       "--preview-path", str(prev)), capsys, old)
    assert "--preview-path" in line and "would write previews over -i/--init-img" in line


def test_a_batch_writes_numbered_files(model_png: Path, tmp_path: Path, capsys) -> None:
    """``-o m.png -b 2`` writes m_0.png and m_1.png: a model named m_1.png is refused."""
    named = tmp_path / "m_1.png"
    named.write_bytes(model_png.read_bytes())
    line = refused(gen("-m", str(named), "-b", "2", "-o", str(tmp_path / "m.png")), capsys, named)
    assert f"-o/--output {str(named)!r} is the same file as -m/--model" in line


def test_upscale_output_equal_to_the_upscaler_or_the_picture(picture: Path, tmp_path: Path,
                                                             capsys) -> None:
    up = tmp_path / "up.png"
    up.write_bytes(b"PK\x03\x04 an upscaler")
    line = refused(["upscale", "-i", str(picture), "--upscale-model", str(up), "-o", str(up)],
                   capsys, up, picture)
    assert f"is the same file as --upscale-model {str(up)!r}" in line
    line = refused(["upscale", "-i", str(picture), "--upscale-model", str(up), "-o", str(picture)],
                   capsys, up, picture)
    assert "is the same file as -i/--init-img" in line


def test_inspect_write_profile_over_the_model(tmp_path: Path, capsys) -> None:
    model = tmp_path / "m.safetensors"
    model.write_bytes(DEMO.read_bytes())
    line = refused(["inspect", str(model), "--write-profile", str(model)], capsys, model)
    assert "--write-profile" in line and "is the same file" in line


def test_gui_screenshot_over_a_model_file(tmp_path: Path, capsys) -> None:
    model = tmp_path / "m.png"
    model.write_bytes(DEMO.read_bytes())
    line = refused(["gui", str(model), "--screenshot", str(model)], capsys, model)
    assert "--screenshot" in line and "is the same file as FILE" in line


def test_same_file_rules(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.write_text("x")
    (tmp_path / "l").symlink_to(a)
    os.link(a, tmp_path / "h")
    (tmp_path / "b").write_text("x")
    assert same_file(a, tmp_path / "l") and same_file(a, tmp_path / "h")
    assert same_file(a, tmp_path / "." / "a") and not same_file(a, tmp_path / "b")
    assert not same_file(tmp_path / "new1", tmp_path / "new2")
    assert same_file(tmp_path / "new1", tmp_path / "new1")
    with pytest.raises(OutputError, match="'-o' '.*/l' is the same file as -m '.*/a'"):
        refuse_overwriting([("'-o'", str(tmp_path / "l"))], [("-m", str(a))])
    refuse_overwriting([("-o", tmp_path / "b")], [("-m", a), ("--vae", "")])


def test_controlnet_inputs_are_inputs(picture: Path, tmp_path: Path, capsys) -> None:
    """``--control-image`` and ``--control-net`` are inputs, whether or not the run uses them
    (a control picture without ``--control-net`` was written over)."""
    line = refused(gen("-m", str(DEMO), "--control-image", str(picture), "-o", str(picture)), capsys, picture)
    assert "is the same file as --control-image" in line
    net = tmp_path / "net.png"
    net.write_bytes(b"a ControlNet under a picture's name")
    line = refused(gen("-m", str(DEMO), "--control-net", str(net), "--control-image", str(picture),
                       "-o", str(net)), capsys, net, picture)
    assert "is the same file as --control-net" in line


def test_video_frames_and_the_high_noise_expert(tmp_path: Path, capsys) -> None:
    """``-M vid_gen`` writes ``NAME_N.png`` frames for a ``.png`` ``-o`` (or a printf
    pattern's names, or the video file): a model file of such a name is refused."""
    fix = REPO / "tests" / "fixtures"
    wan = ["-M", "vid_gen", "--diffusion-model", str(fix / "wan_tiny.safetensors"),
           "--t5xxl", str(fix / "umt5_tiny.safetensors"), "--vae", str(fix / "wan_vae_tiny.safetensors"),
           "-p", "a cat", "-W", "48", "-H", "32", "--steps", "2", "-t", "1", "--in-process"]
    high = tmp_path / "v_0.png"
    high.write_bytes((fix / "wan_high_noise_tiny.safetensors").read_bytes())
    line = refused(["generate", *wan, "--video-frames", "1", "--high-noise-diffusion-model", str(high),
                    "-o", str(tmp_path / "v.png")], capsys, high)
    assert f"-o/--output {str(high)!r} is the same file as --high-noise-diffusion-model" in line
    te = tmp_path / "f_004.png"
    te.write_bytes((fix / "umt5_tiny.safetensors").read_bytes())
    argv = ["generate", *wan, "--video-frames", "5", "-o", str(tmp_path / "f_%03d.png")]
    argv[argv.index("--t5xxl") + 1] = str(te)
    line = refused(argv, capsys, te)
    assert f"-o/--output {str(te)!r} is the same file as --t5xxl" in line
    vae = tmp_path / "vae.webm"
    vae.write_bytes((fix / "wan_vae_tiny.safetensors").read_bytes())
    argv = ["generate", *wan, "-o", str(vae)]
    argv[argv.index("--vae") + 1] = str(vae)
    assert "is the same file as --vae" in refused(argv, capsys, vae)
