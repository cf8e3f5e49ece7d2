"""``sdplan generate`` with a pasted sd-cli command's flags: what the engine implements runs,
what it does not is refused in one line naming every such flag, performance-only flags are
accepted with a note, and ``--from-image`` restores a run from a picture."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sdplan.core import cli

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from sdplan.core.pipelines.stages.results import generation_text, read_generation, save_png  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
MODEL = FIX / "sd1_tiny.safetensors"
TINY = ["--clip-heads", "2", "-t", "2", "--in-process"]


def test_unimplemented_flags_are_refused_in_one_line(tmp_path: Path, capsys) -> None:
    code = cli.main(["generate", "-m", str(MODEL), "-p", "x", "--cache-mode", "easycache",
                     "-o", str(tmp_path / "x.png"), "--circular", "--increase-ref-index", "--frobnicate",
                     "3", "--diffusion-fa", *TINY])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err
    assert err.startswith("sdplan generate: generate does not run these sd-cli options: "
                          "--cache-mode, --circular, --increase-ref-index; not sd-cli options: "
                          "--frobnicate 3")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("argv,message", [
    (["--steps", "many"], "argument --steps: invalid int value: 'many'"),
    (["--rng", "mersenne"], "--rng 'mersenne' is unknown"),
    (["--sigmas", "1,x"], "--sigmas: 'x' is not a number"),
])
def test_bad_values_are_one_line(tmp_path: Path, capsys, argv, message) -> None:
    code = cli.main(["generate", "-m", str(MODEL), "-p", "x", "-o", str(tmp_path / "x.png"),
                     *argv, *TINY])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and "usage:" not in err and "Traceback" not in err


def test_sampling_flags_and_from_image(tmp_path: Path, capsys, monkeypatch) -> None:
    from PIL import Image

    first = tmp_path / "first.png"
    code = cli.main(["generate", "-m", str(MODEL), "-p", "a red cat", "-n", "blurry", "-W", "16",
                     "-H", "16", "--steps", "3", "--cfg-scale", "5", "-s", "11",
                     "--sampling-method", "res_multistep", "--scheduler", "kl_optimal",
                     "--rng", "cpu", "--eta", "0", "--diffusion-fa", "-o", str(first),
                     "--params-backend", "vae=disk", *TINY])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "--diffusion-fa: no effect" in captured.err
    got = read_generation(first)
    assert {k: got.settings[k] for k in ("prompt", "negative_prompt", "steps", "seed", "rng",
                                         "sampling_method", "scheduler", "eta")} == {
        "prompt": "a red cat", "negative_prompt": "blurry", "steps": 3, "seed": 11,
        "rng": "cpu", "sampling_method": "res_multistep", "scheduler": "kl_optimal", "eta": 0.0}
    # the picture names its model by file name: not found from here, one line says so
    assert str(MODEL.parent) not in "".join(Image.open(first).text.values())
    again = tmp_path / "again.png"
    assert cli.main(["generate", "--from-image", str(first), "-o", str(again), *TINY]) == 2
    err = capsys.readouterr().err
    assert "the model file sd1_tiny.safetensors is not beside the picture" in err and not again.exists()
    # restore everything from the picture where its model is (the current folder): same
    # image; a flag given wins
    monkeypatch.chdir(MODEL.parent)
    assert cli.main(["generate", "--from-image", str(first), "-o", str(again), *TINY]) == 0
    a = np.asarray(Image.open(first).convert("RGB"))
    assert np.array_equal(a, np.asarray(Image.open(again).convert("RGB")))
    assert "vae=disk" in read_generation(again).placement["params_backend"]
    other = tmp_path / "other.png"
    assert cli.main(["generate", "--from-image", str(first), "-s", "12", "-o", str(other),
                     *TINY]) == 0
    assert read_generation(other).settings["seed"] == 12
    assert not np.array_equal(a, np.asarray(Image.open(other).convert("RGB")))


def test_from_an_sd_cli_picture_takes_its_settings(tmp_path: Path, capsys) -> None:
    # a picture sd-cli wrote names its model by file name only; -m gives the file
    pic = tmp_path / "sdcli.png"
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", "a blue cat\nSteps: 2, CFG scale: 4.000000, Guidance: 3.500000,"
                                " Eta: inf, Seed: 5, Size: 16x16, Model: sd1_tiny.safetensors, "
                                "RNG: cuda, Sampler: euler karras, Version: stable-diffusion.cpp")
    Image.new("RGB", (16, 16)).save(pic, pnginfo=info)
    out = tmp_path / "out.png"
    assert cli.main(["generate", "--from-image", str(pic), "-m", str(MODEL), "-o", str(out),
                     *TINY]) == 0
    got = read_generation(out)
    assert (got.settings["prompt"], got.settings["steps"], got.settings["seed"],
            got.settings["scheduler"]) == ("a blue cat", 2, 5, "karras")
    empty = tmp_path / "empty.png"
    save_png(np.zeros((4, 4, 3), np.uint8), empty)
    assert cli.main(["generate", "--from-image", str(empty), "-m", str(MODEL), "-o",
                     str(out), *TINY]) == 2
    assert "no generation parameters" in capsys.readouterr().err
    assert generation_text  # the writer the app shares
