"""``sdplan generate -M vid_gen -i picture.png --video-frames 5`` with the tiny Wan 2.2 I2V-A14B
experts (``--diffusion-model`` the low-noise one, ``--high-noise-diffusion-model`` the
high-noise one, UMT5, the Wan 2.1 autoencoder): PNG frames equal diffusers'
``WanImageToVideoPipeline`` video (its fixed noise, 4 steps, CFG 3.5 then 2) and the first frame
is close to the picture's; the default output is a WebM a player opens (five frames); the size
comes from the picture without ``-W``/``-H`` (as sd-cli takes it); the picture's absence on the
image-to-video model, ``-i`` on a text-to-video one and ``--strength`` beside ``-i`` are one-line
refusals naming the flag, before anything loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from safetensors.numpy import load_file
from sparse_writer import FIXTURES

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from generate_util import parse, png, wan_q8_gguf  # noqa: E402
from sdplan.core.pipelines.stages.results import image_to_uint8, read_generation  # noqa: E402
from sdplan.core.pipelines.stages.video import read_video  # noqa: E402
from sdplan.core.sampling.noise import PhiloxNoise  # noqa: E402

R = load_file(str(FIXTURES / "wan_i2v_ref.safetensors"))
LOW, HIGH = FIXTURES / "wan_i2v_tiny.safetensors", FIXTURES / "wan_i2v_high_noise_tiny.safetensors"
TE, VAE = FIXTURES / "umt5_tiny.safetensors", FIXTURES / "wan_vae_tiny.safetensors"
PROMPT = "a lovely cat walking on the beach"


def flags(picture: Path | None, dit: Path = LOW, high: Path | None = HIGH, size: bool = True) -> list[str]:
    return ["-M", "vid_gen", "--video-frames", "5", "--diffusion-model", str(dit),
            *(["--high-noise-diffusion-model", str(high)] if high else []), "--t5xxl", str(TE), "--vae", str(VAE),
            *(["-i", str(picture)] if picture else []), "-p", PROMPT, *(["-W", "48", "-H", "32"] if size else []),
            "--steps", "4", "--cfg-scale", "2", "--high-noise-cfg-scale", "3.5", "--sampling-method", "euler",
            "-t", "1"]


@pytest.fixture
def picture(tmp_path: Path) -> Path:
    path = tmp_path / "picture.png"
    Image.fromarray(R["pipe.picture"]).save(path)
    return path


@pytest.fixture
def fixed_noise(monkeypatch):
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: R["pipe.noise"].copy())


def frames_of(folder: Path) -> list[np.ndarray]:
    return [png(folder / f"f_{i:03d}.png") for i in range(5)]


def test_png_frames_are_the_diffusers_video(tmp_path: Path, picture: Path, fixed_noise) -> None:
    args = parse([*flags(picture, size=False), "-o", str(tmp_path / "f_%03d.png"), "--in-process"])
    assert args.run(args) == 0
    want = R["pipe.video"][0]  # (3, 5, 32, 48)
    frames = frames_of(tmp_path)
    for i, got in enumerate(frames):
        assert got.shape == (32, 48, 3)  # the picture's size
        assert np.abs(got - image_to_uint8(want[:, i]).astype(int)).max() <= 4, i
    rec = read_generation(tmp_path / "f_000.png")
    assert rec.architecture == "wan-i2v_a14b"
    assert rec.settings["init_img"].endswith("picture.png") and rec.settings["video_frames"] == 5


def test_webm_a_player_opens(tmp_path: Path, picture: Path, fixed_noise, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = parse([*flags(picture), "--in-process"])
    assert args.run(args) == 0
    video, rate = read_video(tmp_path / "output.webm")
    assert len(video) == 5 and rate == 16 and video[0].shape == (32, 48, 3)
    y = np.array([0.299, 0.587, 0.114])  # yuv420p keeps luma per pixel, chroma per 2x2 block
    for i in range(5):
        want = image_to_uint8(R["pipe.video"][0][:, i]).astype(float) @ y
        assert np.abs(video[i].astype(float) @ y - want).mean() < 6, i  # VP9 at CRF 15


def test_refusals_are_one_line(tmp_path: Path, picture: Path, capsys) -> None:
    t2v = FIXTURES / "wan_tiny.safetensors"
    cases = ((flags(None), "-i/--init-img missing: a Wan 2.2 I2V-A14B model animates a start picture"),
             (flags(picture, t2v, None), "-i/--init-img: Wan 2.x video does not take it"),
             ([*flags(picture), "--strength", "0.5"], "--strength 0.5: Wan 2.x video's image to video takes the -i "
              "picture as its first frame"))
    for argv, named in cases:
        args = parse([*argv, "-o", str(tmp_path / "x.webm"), "--in-process"])
        assert args.run(args) == 2
        out, err = capsys.readouterr()
        err = " ".join(err.split())
        assert named in err and err.count("error") <= 1, err
        assert out == "", out  # refused from the flags and headers: no plan printed, no engine started
        assert not (tmp_path / "x.webm").exists()


def test_files_that_do_not_fit_together_are_named_before_anything_loads(tmp_path: Path, picture: Path,
                                                                         capsys) -> None:
    """A Wan 2.2 autoencoder beside the I2V experts (16 latent channels), the Wan 2.1 one beside
    TI2V-5B (48), a text-to-video expert beside an image-to-video one: one line naming the flag
    and the file, from the headers, before the plan is printed or the engine started."""
    vae22, ti2v = FIXTURES / "wan22_vae_tiny.safetensors", FIXTURES / "wan_ti2v_tiny.safetensors"
    i2v_flags = flags(picture)
    with_vae22 = [vae22 if a == str(VAE) else a for a in i2v_flags]
    ti2v_flags = [str(ti2v) if a == str(LOW) else a for a in flags(None, high=None)]
    cases = ((with_vae22, f"{vae22}: --vae: the Wan 2.2 autoencoder (48 latent channels) does not fit this DiT's "
              "16 latent channels (Wan 2.1 and Wan 2.2 A14B take the Wan 2.1 autoencoder)"),
             ([*ti2v_flags, "-W", "64", "-H", "64"], f"{VAE}: --vae: the Wan 2.1 autoencoder (16 latent channels) "
              "does not fit this DiT's 48 latent channels (Wan 2.2 TI2V-5B takes the Wan 2.2 autoencoder)"),
             (flags(picture, high=FIXTURES / "wan_high_noise_tiny.safetensors"),
              "--high-noise-diffusion-model: its layout (16 inputs"))
    for argv, named in cases:
        args = parse([*map(str, argv), "-o", str(tmp_path / "x.webm"), "--in-process"])
        assert args.run(args) == 2
        out, err = capsys.readouterr()
        err = " ".join(err.split())
        assert named in err and err.count("error") == 1, err
        assert out == "", out
        assert not (tmp_path / "x.webm").exists()


def test_an_image_mode_run_names_the_picture_as_the_first_frame(tmp_path: Path, picture: Path, capsys) -> None:
    """Without ``-M vid_gen`` the I2V model draws the one frame its picture starts: the CLI says
    image to video, never "image to image ... strength" (the engine takes no strength here)."""
    argv = [a for a in flags(picture) if a not in ("-M", "vid_gen", "--video-frames", "5")]
    args = parse([*argv, "-o", str(tmp_path / "one.png"), "--in-process"])
    assert args.run(args) == 0
    out, err = capsys.readouterr()
    said = out + err
    assert f"image to video from {picture} (the first frame)" in said and "image to image" not in said
    assert (tmp_path / "one.png").exists()


def test_split_over_two_rpc_servers(tmp_path: Path, picture: Path) -> None:
    """Image to video with both experts and UMT5 split over two loopback servers and the
    autoencoder (its encoder for the start picture, then its decoder) on one of them: the
    one-device frames within 1/255."""
    import sdplan._ggml as G
    from conftest import require_or_skip
    from rpc_util import rpc_servers

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    out = {k: tmp_path / k for k in ("one", "split")}
    for folder in out.values():
        folder.mkdir()
    args = parse([*flags(picture), "-s", "5", "-o", str(out["one"] / "f_%03d.png")])
    assert args.run(args) == 0
    with rpc_servers(2) as servers:
        args = parse([*flags(picture), "-s", "5", "-o", str(out["split"] / "f_%03d.png"),
                      "--rpc-servers", ",".join(s.endpoint for s in servers),
                      "--backend", "diffusion=RPC0&RPC1,te=RPC0&RPC1,vae=RPC1"])
        assert args.run(args) == 0
    one, split = ([png(out[k] / f"f_{i:03d}.png") for i in range(5)] for k in ("one", "split"))
    assert max(int(np.abs(a - b).max()) for a, b in zip(one, split, strict=True)) <= 1
    assert np.stack(one).std() > 5
    rec = read_generation(out["split"] / "f_000.png")
    assert "RPC0&RPC1" in rec.placement["backend"] and rec.settings["init_img"].endswith("picture.png")


def test_q8_0_gguf_experts(tmp_path: Path, picture: Path) -> None:
    """Both image-to-video experts as Q8_0 GGUF files give the safetensors run's frames within
    the rounding of a tiny random model."""
    q8 = {p: wan_q8_gguf(p, tmp_path / (p.stem + "-Q8_0.gguf")) for p in (LOW, HIGH)}
    for name, (low, high) in {"a": (LOW, HIGH), "b": (q8[LOW], q8[HIGH])}.items():
        (tmp_path / name).mkdir()
        args = parse([*flags(picture, low, high), "-o", str(tmp_path / name / "f_%03d.png"), "--in-process"])
        assert args.run(args) == 0
    a, b = (np.stack([png(tmp_path / k / f"f_{i:03d}.png") for i in range(5)]) for k in ("a", "b"))
    diff = np.abs(a - b)
    assert 0 < diff.max() <= 24 and diff.mean() < 4
