"""``sdplan generate`` with LoRAs and pictures: prompt tags with ``--lora-model-dir`` and
``--lora-apply-mode``, ``-i`` (its size when ``-W``/``-H`` are not given), ``--strength``,
``--mask``; the prompt keeps its tags in sd-cli's parameters text and sdplan's record holds
the rest; bad inputs are one-line errors before work; the
demo model with its own LoRA, an init picture and a mask."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from generate_util import parse  # noqa: E402
from PIL import Image  # noqa: E402
from sdplan.core.pipelines.stages.results import read_generation  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
MODEL = FIX / "sd1_tiny.safetensors"
BASE = ["-m", str(MODEL), "--steps", "2", "--cfg-scale", "7", "-s", "1", "--sampling-method", "euler",
        "--clip-heads", "2", "-t", "2", "--in-process"]


def run(argv: list[str]) -> int:
    args = parse(argv)
    return args.run(args)


def recorded(path: Path) -> tuple[dict[str, str], dict]:
    """A picture's text chunks and its ``sdplan`` record."""
    text = Image.open(path).text
    return text, json.loads(text["sdplan"])


def pictures(tmp_path: Path) -> tuple[Path, Path]:
    pic, mask = tmp_path / "start.png", tmp_path / "mask.png"
    rng = np.random.default_rng(3)
    Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(pic)
    m = np.zeros((16, 16), np.uint8)
    m[:, 8:] = 255
    Image.fromarray(m).save(mask)
    return pic, mask


def test_lora_tags_and_pictures_reach_the_png(tmp_path: Path) -> None:
    plain, tagged, img2img = tmp_path / "plain.png", tmp_path / "lora.png", tmp_path / "img.png"
    assert run([*BASE, "-p", "a photo of a cat", "-W", "16", "-H", "16", "-o", str(plain)]) == 0
    assert run([*BASE, "-p", "a photo of a cat<lora:lora_sd1_kohya:0.8>", "-W", "16", "-H", "16",
                "--lora-model-dir", str(FIX), "--lora-apply-mode", "at_runtime", "-o", str(tagged)]) == 0
    text, doc = recorded(tagged)
    assert text["parameters"].startswith("a photo of a cat<lora:lora_sd1_kohya:0.8>\n")  # as sd-cli writes it
    assert doc["loras"] == [["lora_sd1_kohya", 0.8]] and doc["settings"]["lora_apply_mode"] == "at_runtime"
    assert doc["settings"]["lora_model_dir"] == FIX.name  # the folder's name, not where it is
    a, b = (np.asarray(Image.open(p).convert("RGB")).astype(int) for p in (plain, tagged))
    assert np.abs(a - b).mean() > 1  # the LoRA changed the picture
    assert "lora_model_dir" not in recorded(plain)[1]["settings"]
    pic, mask = pictures(tmp_path)
    assert run([*BASE, "-p", "a photo of a cat", "-i", str(pic), "--mask", str(mask), "--strength", "0.5",
                "-o", str(img2img)]) == 0
    assert Image.open(img2img).size == (16, 16)  # -W/-H from the picture
    _, doc = recorded(img2img)
    assert (doc["settings"]["init_img"], doc["settings"]["mask"], doc["settings"]["strength"]) == (
        pic.name, mask.name, 0.5)
    assert "loras" not in doc
    got = read_generation(img2img)  # --from-image finds the picture inputs beside it
    from sdplan.core.pipelines.stages.results import locate_inputs

    found = locate_inputs(got.settings, img2img)
    assert (found["init_img"], found["mask"], got.settings["strength"]) == (str(pic), str(mask), 0.5)


@pytest.mark.parametrize(("extra", "message"), [
    (["--mask", "MASK"], "--mask needs -i/--init-img"),
    (["-i", "PIC", "--strength", "1.5"], "--strength must be in [0, 1]"),
    (["-i", "NOPE"], "-i/--init-img"),
    (["-p", "cat <lora:nope:1>", "--lora-model-dir", "FIX"], "<lora:nope:...>: no LoRA file 'nope'"),
    (["-p", "cat <lora:lora_sd1_kohya:strong>", "--lora-model-dir", "FIX"], "is not a number"),
    (["-p", "cat <lora:lora_flux_peft:1>", "--lora-model-dir", "FIX"], "not one key patches this model"),
])
def test_bad_inputs_are_one_line_errors(tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    pic, mask = pictures(tmp_path)
    subst = {"MASK": str(mask), "PIC": str(pic), "NOPE": str(tmp_path / "none.png"), "FIX": str(FIX)}
    argv = [*BASE, "-W", "16", "-H", "16", "-o", str(tmp_path / "x.png")]
    if "-p" not in extra:
        argv += ["-p", "cat"]
    assert run(argv + [subst.get(a, a) for a in extra]) == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split()) and not (tmp_path / "x.png").exists()


def test_demo_with_its_lora_an_init_picture_and_a_mask(tmp_path: Path, capsys) -> None:
    """The demo's ``outline`` LoRA (found without --lora-model-dir) draws the shape as an
    outline where the plain model fills it (this caption and seed); with ``-i``/``--mask``
    the PNG records the picture inputs."""
    from sdplan.core.pipelines.demo.model import demo_lora_dir
    from sdplan.core.pipelines.demo.scenes import Scene, is_outlined, render

    if not (demo_lora_dir() / "outline.safetensors").is_file():
        pytest.skip("the demo LoRA is not installed")
    caption = "a white square on a purple background"
    plain, lora = tmp_path / "plain.png", tmp_path / "outline.png"
    assert run(["--demo", "-p", caption, "-s", "46", "-t", "2", "-o", str(plain), "--in-process"]) == 0
    assert run(["--demo", "-p", f"{caption}<lora:outline:1>", "-s", "46", "-t", "2", "-o", str(lora),
                "--in-process"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "LoRA outline x 1 (immediately)" in err and "note" not in err  # a known caption, tag aside
    images = [np.asarray(Image.open(p).convert("RGB")) for p in (plain, lora)]
    assert not is_outlined(images[0], "square") and is_outlined(images[1], "square")
    assert recorded(lora)[1]["loras"] == [["outline", 1.0]]
    pic = tmp_path / "scene.png"
    Image.fromarray(render(Scene("circle", "red", "green", 40, 64, 26), 128)).save(pic)
    mask = tmp_path / "mask.png"
    mk = np.zeros((128, 128), np.uint8)
    mk[:, 72:] = 255
    Image.fromarray(mk).save(mask)
    out = tmp_path / "inpaint.png"
    assert run(["--demo", "-p", "a red circle on a green background", "-i", str(pic), "--mask", str(mask),
                "--strength", "0.8", "-t", "2", "-o", str(out), "--in-process"]) == 0
    settings = recorded(out)[1]["settings"]
    assert (settings["init_img"], settings["mask"], settings["strength"]) == (pic.name, mask.name, 0.8)
