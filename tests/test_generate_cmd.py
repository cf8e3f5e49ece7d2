"""``sdplan generate`` end to end on the tiny SD1 checkpoint: the PNG matches the reference
image (fixed noise and the discrete 4-step schedule, euler, CFG 7) within 2/255, its text
chunks record the run, and a plan that does not fit is refused without --force."""

from __future__ import annotations

import argparse
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from PIL import Image  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from sdplan.core import sampling  # noqa: E402
from sdplan.core.commands import generate  # noqa: E402
from sdplan.core.pipeline import image_to_uint8  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
MODEL = FIX / "sd1_tiny.safetensors"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    generate.add_parser(sub)
    return p.parse_args(["generate", *argv])


def test_generate_matches_reference_png(tmp_path: Path, monkeypatch) -> None:
    ref = load_file(str(FIX / "sd1_ref.safetensors"))
    assert np.allclose(sampling.get_sigmas("discrete", 4), ref["run_sigmas"], rtol=1e-4)
    monkeypatch.setattr(sampling.PhiloxNoise, "randn", lambda self, shape: ref["run_noise"].copy())
    out = tmp_path / "cat.png"
    args = parse(["-m", str(MODEL), "-p", "a photo of a cat", "-W", "16", "-H", "16", "--steps", "4",
                  "--cfg-scale", "7", "-s", "1", "--sampling-method", "euler", "--scheduler",
                  "discrete", "-o", str(out), "--preview-path", str(tmp_path / "prev"),
                  "--clip-heads", "2", "-t", "2", "--params-backend", "vae=disk"])
    assert args.run(args) == 0
    img = Image.open(out)
    got = np.asarray(img.convert("RGB")).astype(int)
    assert np.abs(got - image_to_uint8(ref["run_image"][0]).astype(int)).max() <= 2
    text = img.text
    assert text["prompt"] == "a photo of a cat" and text["seed"] == "1" and text["steps"] == "4"
    assert text["sampler"] == "euler" and text["scheduler"] == "discrete" and text["cfg_scale"] == "7"
    with open(MODEL, "rb") as fh:
        h = hashlib.sha256(fh.read(1 << 20) + str(os.path.getsize(MODEL)).encode()).hexdigest()
    assert text["model_hash"] == h
    assert "vae=disk" in text["params_backend"]
    assert sorted(p.name for p in (tmp_path / "prev").iterdir()) == [f"preview_00{i}.png" for i in range(1, 5)]


def test_generate_refuses_a_plan_that_does_not_fit(tmp_path: Path, capsys, monkeypatch) -> None:
    import dataclasses

    import sdplan.core.estimate as est

    real = est.estimate_plan

    def no_fit(*a, **k):
        return dataclasses.replace(real(*a, **k), fits=False, reasons=["CPU: over budget"])

    monkeypatch.setattr(est, "estimate_plan", no_fit)
    out = tmp_path / "x.png"
    argv = ["-m", str(MODEL), "-p", "cat", "-W", "16", "-H", "16", "--steps", "1",
            "--clip-heads", "2", "-t", "2", "-o", str(out)]
    args = parse(argv)
    assert args.run(args) == 3 and not out.exists()
    assert "--force" in capsys.readouterr().err
    args = parse([*argv, "--force"])
    assert args.run(args) == 0 and out.exists()
