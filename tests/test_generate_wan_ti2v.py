"""``sdplan generate -M vid_gen --video-frames 5`` with the tiny Wan 2.2 TI2V-5B files
(``--diffusion-model`` the 48-channel DiT, ``--t5xxl`` UMT5, ``--vae`` the Wan 2.2
autoencoder): PNG frames equal diffusers' ``WanPipeline`` TI2V video (its fixed noise, 4 steps,
CFG 3.5, 64x96) within 4/255; the default WebM a player opens holds the same 5 frames; the
recorded architecture is ``wan-ti2v_5b``; a size the 16x autoencoder and the 2x2 patches cannot
take and ``-i`` (TI2V-5B's image-to-video mode, not run) are refused in one line before
anything loads."""

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
    for extra, named in ((["-W", "80"], "multiples of 32"), (["-i", str(pic)], "-i/--init-img")):
        args = parse([*flags(), *extra, "-o", str(tmp_path / "x.webm"), "--in-process"])
        assert args.run(args) != 0
        err = " ".join(capsys.readouterr().err.split())
        assert named in err and err.count("error") <= 1, err
        assert not (tmp_path / "x.webm").exists()


def test_init_image_refused_by_name_from_the_header(tmp_path: Path) -> None:
    """The engine's own refusal (the family's options may come to take ``-i`` for other Wan
    models): a TI2V-5B DiT with ``-i`` is refused from its header; a Wan 2.1 DiT passes it."""
    from types import SimpleNamespace

    from sdplan.core.errors import InvalidArgument
    from sdplan.core.pipelines.wan.generate import refuse_ti2v_image

    def req(dit: Path, init: str | None) -> SimpleNamespace:
        return SimpleNamespace(init_img=init, file=lambda key: str(dit) if key == "diffusion_model" else None)

    with pytest.raises(InvalidArgument, match="-i/--init-img: Wan 2.2 TI2V-5B's image to video"):
        refuse_ti2v_image(req(DIT, "pic.png"))  # type: ignore[arg-type]
    refuse_ti2v_image(req(DIT, None))  # type: ignore[arg-type]
    refuse_ti2v_image(req(FIXTURES / "wan_tiny.safetensors", "pic.png"))  # type: ignore[arg-type]
