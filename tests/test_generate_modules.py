"""``sdplan generate`` with the modules and passes a plan places beyond the model set: the hires
fix, VAE tiles and ControlNet from the command line to the picture, whose record says what ran
and where; the plan's table counts the ControlNet; a ControlNet file for a family that does not
take it is refused in one line before anything loads."""

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


def _demo() -> str:
    from sdplan.core.pipelines.demo.model import demo_model_path

    return str(demo_model_path())


def test_hires_tiles_and_controlnet_from_the_command_line(tmp_path: Path, capsys) -> None:
    from controlnet_util import controlnet_from_unet

    net = controlnet_from_unet(_demo(), tmp_path / "demo_cn.safetensors")
    ctl = tmp_path / "control.png"
    Image.fromarray(np.tile(np.arange(64, dtype=np.uint8)[None, :, None] * 4, (64, 1, 3))).save(ctl)
    out = tmp_path / "out.png"
    args = parse(["--demo", "-p", "a red circle on a blue background", "-W", "64", "-H", "64", "--steps", "2",
                  "-s", "3", "-t", "1", "--in-process", "-o", str(out), "--hires", "--hires-steps", "2",
                  "--hires-upscaler", "Lanczos", "--vae-tiling", "--vae-tile-size", "64",
                  "--control-net", net, "--control-image", str(ctl), "--control-strength", "0.7", "--canny"])
    assert args.run(args) == 0
    printed = capsys.readouterr()
    assert "controlnet" in printed.out + printed.err  # the plan's table has its row
    pic = Image.open(out)
    assert pic.size == (128, 128)
    doc = json.loads(pic.text["sdplan"])
    settings = doc["settings"]
    assert settings["hires"]["upscaler"] == "Lanczos" and settings["hires"]["steps"] == 2
    assert settings["vae_tiling"] == {"enabled": True, "tile_px": [64, 64], "overlap": 0.5, "relative": None}
    assert settings["control"] == {"control_image": str(ctl), "control_strength": 0.7, "canny": True}
    assert set(doc["ran"]) == {"te", "diffusion", "vae", "controlnet"}
    assert doc["ran"]["controlnet"]["devices"] == ["CPU"]


def test_controlnet_for_a_family_that_does_not_take_it(tmp_path: Path, capsys) -> None:
    import flux_util

    out, control = tmp_path / "x.png", tmp_path / "control.png"
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(control)  # a picture: the family is what is refused
    args = parse(["--diffusion-model", str(flux_util.DEV), "--t5xxl", str(flux_util.T5), "--clip_l",
                  str(flux_util.CLIP), "--vae", str(flux_util.AE), "-p", "x", "--control-net", _demo(),
                  "--control-image", str(control), "-o", str(out), "--in-process"])
    assert args.run(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--control-net" in err[0] and "FLUX.1" in err[0], err
    assert not out.exists()


def test_a_negative_control_strength_is_refused_before_loading(tmp_path: Path, capsys) -> None:
    """``--control-strength -5`` (it was accepted and inverted the residuals) is one line naming
    the flag, before anything loads; the request from the server's keys says the same."""
    from sdplan.core.errors import InvalidArgument
    from sdplan.core.pipelines.request_parts import ControlInput

    ctl = tmp_path / "control.png"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(ctl)
    out = tmp_path / "x.png"
    args = parse(["--demo", "-p", "x", "-o", str(out), "--in-process", "--control-net", _demo(),
                  "--control-image", str(ctl), "--control-strength", "-5"])
    assert args.run(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--control-strength -5: must be a finite number >= 0" in err and err.count("error") == 1, err
    assert not out.exists()
    with pytest.raises(InvalidArgument, match="--control-strength -0.5: must be a finite number >= 0"):
        ControlInput.from_request({"control_image": str(ctl), "control_strength": -0.5})
