"""``sdplan generate -M vid_gen --video-frames 5`` with the tiny Wan files (``--diffusion-model``
the low-noise expert, ``--high-noise-diffusion-model`` the high-noise one, ``--t5xxl`` UMT5,
``--vae`` the Wan 2.1 autoencoder): PNG frames on request equal diffusers' two-expert
``WanPipeline`` video (its fixed noise, 4 steps, CFG 3.5 then 2); the default output is a WebM
a player opens (PyAV decodes 5 frames at the asked rate, close to the PNG frames), MP4 too;
``--backend diffusion=RPC0&RPC1,te=RPC0&RPC1`` over two RPC servers gives the one-device frames
within 1/255; a Q8_0 GGUF DiT runs; refused options are one line before anything loads."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from sparse_writer import FIXTURES

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from generate_util import parse, png, wan_q8_gguf  # noqa: E402
from sdplan.core.pipelines.stages.results import image_to_uint8, read_generation  # noqa: E402
from sdplan.core.pipelines.stages.video import read_video  # noqa: E402
from sdplan.core.sampling.noise import PhiloxNoise  # noqa: E402

R = load_file(str(FIXTURES / "wan_ref.safetensors"))
LOW, HIGH = FIXTURES / "wan_tiny.safetensors", FIXTURES / "wan_high_noise_tiny.safetensors"
TE, VAE = FIXTURES / "umt5_tiny.safetensors", FIXTURES / "wan_vae_tiny.safetensors"
PROMPT = "a lovely cat walking on the beach"


def flags(dit: Path = LOW, high: Path | None = HIGH) -> list[str]:
    return ["-M", "vid_gen", "--video-frames", "5", "--diffusion-model", str(dit),
            *(["--high-noise-diffusion-model", str(high)] if high else []), "--t5xxl", str(TE), "--vae", str(VAE),
            "-p", PROMPT, "-W", "48", "-H", "32", "--steps", "4", "--cfg-scale", "2", "--high-noise-cfg-scale",
            "3.5", "--sampling-method", "euler", "-t", "1"]


def luma_error(video: list[np.ndarray], pngs: list[np.ndarray]) -> float:
    """The largest per-frame mean luma difference (yuv420p keeps luma per pixel, chroma per
    2x2 block: a noise-like tiny video's colours blur, its luma does not)."""
    y = np.array([0.299, 0.587, 0.114])
    return max(float(np.abs(v.astype(float) @ y - p @ y).mean()) for v, p in zip(video, pngs, strict=True))


def frames_of(folder: Path) -> list[np.ndarray]:
    return [png(folder / f"f_{i:03d}.png") for i in range(5)]


@pytest.fixture
def fixed_noise(monkeypatch):
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: R["pipe.noise"].copy())


def test_png_frames_are_the_diffusers_video(tmp_path: Path, fixed_noise) -> None:
    args = parse([*flags(), "-o", str(tmp_path / "f_%03d.png"), "--in-process"])
    assert args.run(args) == 0
    want = R["pipe.video"][0]  # (3, 5, 32, 48)
    for i, got in enumerate(frames_of(tmp_path)):
        assert np.abs(got - image_to_uint8(want[:, i]).astype(int)).max() <= 4, i
    rec = read_generation(tmp_path / "f_000.png").settings
    assert rec["mode"] == "vid_gen" and rec["video_frames"] == 5 and rec["high_noise_cfg_scale"] == 3.5
    assert read_generation(tmp_path / "f_000.png").architecture == "wan-t2v_a14b"


def test_webm_by_default_and_mp4(tmp_path: Path, fixed_noise, monkeypatch) -> None:
    args = parse([*flags(), "-o", str(tmp_path / "f_%03d.png"), "--in-process"])
    assert args.run(args) == 0
    pngs = frames_of(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = parse([*flags(), "--fps", "8", "--in-process"])
    assert args.run(args) == 0
    video, rate = read_video(tmp_path / "output.webm")
    assert len(video) == 5 and rate == 8 and video[0].shape == (32, 48, 3)
    assert luma_error(video, pngs) < 6  # VP9 at CRF 15
    args = parse([*flags(), "-o", str(tmp_path / "v.mp4"), "--in-process"])
    assert args.run(args) == 0
    video, rate = read_video(tmp_path / "v.mp4")
    assert len(video) == 5 and rate == 16
    assert luma_error(video, pngs) < 6  # H.264 at CRF 18


def test_q8_0_gguf_dit(tmp_path: Path, fixed_noise) -> None:
    q8 = wan_q8_gguf(LOW, tmp_path / "wan-tiny-Q8_0.gguf")
    for dit, name in ((LOW, "a"), (q8, "b")):
        (tmp_path / name).mkdir()
        args = parse([*flags(dit, None), "-o", str(tmp_path / name / "f_%03d.png"), "--in-process"])
        assert args.run(args) == 0
    a, b = frames_of(tmp_path / "a"), frames_of(tmp_path / "b")
    diff = np.abs(np.stack(a) - np.stack(b))
    assert 0 < diff.max() <= 24 and diff.mean() < 4  # Q8_0 rounding of a tiny random model


def test_refusals_are_one_line(tmp_path: Path, capsys) -> None:
    import argparse

    from sdplan.core.commands import generate

    p = argparse.ArgumentParser()
    generate.add_parser(p.add_subparsers())
    for extra, named in ((["--high-noise-guidance", "2"], "--high-noise-guidance"),
                         (["-b", "2"], "-b/--batch-count")):
        args, unknown = p.parse_known_args(["generate", *flags(), *extra, "-o", str(tmp_path / "x.webm"), "--in-process"])
        args.extra_argv = unknown  # what the dispatcher hands on: sd-cli flags generate does not parse
        assert args.run(args) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert named in err and err.count("error") <= 1, err
        assert not (tmp_path / "x.webm").exists()
    args = parse([*flags(), "-o", str(tmp_path / "x.gif"), "--in-process"])
    assert args.run(args) == 2
    assert ".webm" in " ".join(capsys.readouterr().err.split())


def test_printf_names_are_png_frames_only(tmp_path: Path, capsys) -> None:
    """A printf-style ``-o`` with a video extension is refused before anything loads (its
    frames would be PNG pictures named ``.webm``); another extension's refusal names the path
    as given, not the path with its ``%`` replaced."""
    for name, said in (("v_%03d.webm", "end it in .png"), ("v_%d.mp4", "end it in .png"),
                       ("j_%d.jpg", "a video is written as")):
        args = parse([*flags(), "-o", str(tmp_path / name), "--in-process"])
        assert args.run(args) == 2
        out, err = capsys.readouterr()
        err = " ".join(err.split())
        assert said in err and repr(str(tmp_path / name)) in err and err.count("error") == 1, err
        assert out == "" and list(tmp_path.iterdir()) == [], (out, list(tmp_path.iterdir()))


@pytest.mark.rpc
def test_split_over_two_rpc_servers(tmp_path: Path) -> None:
    """--backend diffusion=RPC0&RPC1,te=RPC0&RPC1 over two loopback servers gives the one-device
    frames within 1/255 (both experts split alike)."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    (tmp_path / "one").mkdir()
    (tmp_path / "split").mkdir()
    args = parse([*flags(), "-s", "5", "-o", str(tmp_path / "one" / "f_%03d.png")])
    assert args.run(args) == 0
    with rpc_servers(2) as servers:
        args = parse([*flags(), "-s", "5", "-o", str(tmp_path / "split" / "f_%03d.png"),
                      "--rpc-servers", ",".join(s.endpoint for s in servers),
                      "--backend", "diffusion=RPC0&RPC1,te=RPC0&RPC1"])
        assert args.run(args) == 0
    one, split = frames_of(tmp_path / "one"), frames_of(tmp_path / "split")
    assert max(np.abs(a - b).max() for a, b in zip(one, split, strict=True)) <= 1
    assert np.stack(one).std() > 20 and not math.isnan(float(np.stack(one).mean()))
    rec = read_generation(tmp_path / "split" / "f_000.png")
    assert "RPC0&RPC1" in rec.placement["backend"]


def test_frame_counts_rounded_with_a_note_and_bounded(tmp_path: Path, capsys) -> None:
    """``--video-frames 10000`` is refused before anything loads (at most 1025); ``--video-frames 4``
    runs with a note that Wan makes 4k+1 frames (one frame here), as sd-cli rounds it."""
    from sdplan.core.commands.video_flags import video_notes

    base = [a for a in flags() if a != "5"]
    i = base.index("--video-frames")
    big = parse([*base[:i + 1], "10000", *base[i + 1:], "-o", str(tmp_path / "big.webm"), "--in-process"])
    assert big.run(big) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--video-frames must be 1..1025, got 10000" in err and err.count("error") == 1, err
    assert not (tmp_path / "big.webm").exists()
    four = parse([*base[:i + 1], "4", *base[i + 1:], "-o", str(tmp_path / "f.png"), "--in-process"])
    assert video_notes(four) == ["--video-frames 4: Wan makes 4k+1 frames; 1 will be made"]
    assert four.run(four) == 0
    out = capsys.readouterr()
    assert "note: --video-frames 4: Wan makes 4k+1 frames; 1 will be made" in " ".join(out.err.split() + out.out.split())
    assert sorted(p.name for p in tmp_path.glob("f*.png")) == ["f_0.png"]


def test_a_frame_rate_the_encoders_cannot_write_is_refused_before_the_run(tmp_path: Path, capsys) -> None:
    """``--fps 100000000000`` ran the whole video, then failed writing it with a traceback
    (PyAV's OverflowError; libvpx-vp9 refuses 2^31 - 1), and the frames were lost: it is one
    line before anything loads (at most 1000); 1000 itself is written."""
    from sdplan.core.pipelines.stages.video import read_video

    for fps in ("100000000000", "2147483647", "1001", "0"):
        args = parse([*flags(), "--fps", fps, "-o", str(tmp_path / "x.webm"), "--in-process"])
        assert args.run(args) == 2
        out, err = capsys.readouterr()
        err = " ".join(err.split())
        assert f"--fps must be 1..1000, got {fps}" in err and err.count("error") == 1 and out == "", err
        assert not (tmp_path / "x.webm").exists()
    args = parse([*flags(), "--fps", "1000", "-o", str(tmp_path / "y.webm"), "--in-process"])
    assert args.run(args) == 0
    video, rate = read_video(tmp_path / "y.webm")
    assert len(video) == 5 and rate == 1000
