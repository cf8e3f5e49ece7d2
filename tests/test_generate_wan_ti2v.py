"""``sdplan generate -M vid_gen --video-frames 5`` with the tiny Wan 2.2 TI2V-5B files
(``--diffusion-model`` the 48-channel DiT, ``--t5xxl`` UMT5, ``--vae`` the Wan 2.2
autoencoder): PNG frames equal diffusers' ``WanPipeline`` TI2V video (its fixed noise, 4 steps,
CFG 3.5, 64x96) within 4/255; the default WebM a player opens holds the same 5 frames; the
recorded architecture is ``wan-ti2v_5b``; with ``-i pic.png`` (image to video: the picture's
latent as the first frame) the PNG frames equal diffusers' ``WanImageToVideoPipeline`` TI2V
video (``expand_timesteps``) within 4/255 and the default WebM a player opens holds them, the
picture recorded; a size the 16x autoencoder and the 2x2 patches cannot take and ``--strength``
beside ``-i`` are refused in one line before anything loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from sparse_writer import FIXTURES

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from generate_util import parse, png  # noqa: E402
from sdplan.core.pipelines.stages.results import image_to_uint8, read_generation  # noqa: E402
from sdplan.core.pipelines.stages.video import read_video  # noqa: E402
from sdplan.core.sampling.noise import PhiloxNoise  # noqa: E402

R = load_file(str(FIXTURES / "wan22_ref.safetensors"))
RI = load_file(str(FIXTURES / "wan_ti2v_i2v_ref.safetensors"))
DIT, TE, VAE = (FIXTURES / "wan_ti2v_tiny.safetensors", FIXTURES / "umt5_tiny.safetensors",
                FIXTURES / "wan22_vae_tiny.safetensors")
PROMPT = "a lovely cat walking on the beach"


def flags(width: int = 96, height: int = 64) -> list[str]:
    return ["-M", "vid_gen", "--video-frames", "5", "--diffusion-model", str(DIT), "--t5xxl", str(TE),
            "--vae", str(VAE), "-p", PROMPT, "-W", str(width), "-H", str(height), "--steps", "4",
            "--cfg-scale", "3.5", "--sampling-method", "euler", "-t", "1"]


@pytest.fixture
def fixed_noise(monkeypatch):
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: R["pipe.noise"].copy())


def test_frames_and_webm_are_the_diffusers_video(tmp_path: Path, fixed_noise, monkeypatch) -> None:
    args = parse([*flags(), "-o", str(tmp_path / "f_%03d.png"), "--in-process"])
    assert args.run(args) == 0
    want = R["pipe.video"][0]  # (3, 5, 64, 96)
    pngs = [png(tmp_path / f"f_{i:03d}.png") for i in range(5)]
    for i, got in enumerate(pngs):
        assert got.shape == (64, 96, 3)
        assert np.abs(got - image_to_uint8(want[:, i]).astype(int)).max() <= 4, i
    gen = read_generation(tmp_path / "f_000.png")
    assert gen.architecture == "wan-ti2v_5b" and gen.settings["video_frames"] == 5
    monkeypatch.chdir(tmp_path)
    args = parse([*flags(), "--fps", "8", "--in-process"])
    assert args.run(args) == 0
    video, rate = read_video(tmp_path / "output.webm")
    assert len(video) == 5 and rate == 8 and video[0].shape == (64, 96, 3)
    y = np.array([0.299, 0.587, 0.114])
    assert max(float(np.abs(v.astype(float) @ y - p @ y).mean()) for v, p in zip(video, pngs, strict=True)) < 6


def test_refusals_are_one_line(tmp_path: Path, capsys) -> None:
    pic = tmp_path / "pic.png"
    from PIL import Image

    Image.fromarray(np.zeros((64, 96, 3), np.uint8)).save(pic)
    for extra, named in ((["-W", "80"], "multiples of 32"), (["-i", str(pic), "--strength", "0.5"], "--strength")):
        args = parse([*flags(), *extra, "-o", str(tmp_path / "x.webm"), "--in-process"])
        assert args.run(args) != 0
        err = " ".join(capsys.readouterr().err.split())
        assert named in err and err.count("error") <= 1, err
        assert not (tmp_path / "x.webm").exists()


def test_image_to_video_frames_and_webm_are_the_diffusers_video(tmp_path: Path, monkeypatch) -> None:
    from PIL import Image

    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: RI["pipe.noise"].copy())
    pic = tmp_path / "pic.png"
    Image.fromarray(RI["pipe.picture"]).save(pic)
    args = parse([*flags(), "-i", str(pic), "-o", str(tmp_path / "f_%03d.png"), "--in-process"])
    assert args.run(args) == 0
    want = RI["pipe.video"][0]  # (3, 5, 64, 96)
    pngs = [png(tmp_path / f"f_{i:03d}.png") for i in range(5)]
    for i, got in enumerate(pngs):
        assert np.abs(got - image_to_uint8(want[:, i]).astype(int)).max() <= 4, i
    t2v = image_to_uint8(R["pipe.video"][0][:, 1]).astype(int)  # text to video's frame differs
    assert np.abs(pngs[1] - t2v).mean() > 8
    gen = read_generation(tmp_path / "f_000.png")
    assert gen.architecture == "wan-ti2v_5b" and Path(gen.settings["init_img"]).name == "pic.png"
    monkeypatch.chdir(tmp_path)
    args = parse(["-M", "vid_gen", "--video-frames", "5", *flags()[4:], "-i", str(pic), "--in-process"])
    assert args.run(args) == 0
    video, _ = read_video(tmp_path / "output.webm")
    assert len(video) == 5 and video[0].shape == (64, 96, 3)
    y = np.array([0.299, 0.587, 0.114])
    assert max(float(np.abs(v.astype(float) @ y - p @ y).mean()) for v, p in zip(video, pngs, strict=True)) < 6
