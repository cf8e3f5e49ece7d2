"""``sdplan generate`` with Qwen-Image files (``--diffusion-model --llm --vae``, sd-cli's
documented ``--cfg-scale 2.5 --sampling-method euler`` and its flow shift 3 by default): the PNG
is diffusers' decoded picture (CFG 1, 4 steps); a Q8_0 GGUF DiT runs; ``-r`` edits a reference
picture (the pipeline's edit); a missing encoder, LoRAs and ``--taesd`` are
one-line errors before anything loads, an unreadable ``-r`` picture too;
``--backend "diffusion=RPC0&RPC1,te=RPC0&RPC1"`` over two RPC servers gives the one-device
picture within 1/255."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flux_util import write_gguf
from qwen_image_util import DIT, LLM, PROMPT, VAE, ref

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from generate_util import parse, png  # noqa: E402
from PIL import Image  # noqa: E402
from sdplan.core.pipelines.stages.results import image_to_uint8, read_generation  # noqa: E402
from sdplan.core.sampling.noise import PhiloxNoise  # noqa: E402

R = ref()


@pytest.fixture(scope="module")
def q8(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("qwen") / "qwen-image-tiny-Q8_0.gguf"
    write_gguf(DIT, path, "q8_0")
    return path


def flags(dit: Path = DIT, steps: int = 4, cfg: str = "1") -> list[str]:
    return ["--diffusion-model", str(dit), "--llm", str(LLM), "--vae", str(VAE), "-p", PROMPT,
            "-W", "64", "-H", "64", "--steps", str(steps), "--cfg-scale", cfg, "--sampling-method", "euler", "-t", "1"]


@pytest.fixture
def fixed_noise(monkeypatch):
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: R["pipe.noise"].copy())


def test_generate_gives_the_diffusers_picture(tmp_path: Path, fixed_noise) -> None:
    out = tmp_path / "q.png"
    args = parse([*flags(), "-o", str(out), "--in-process", "--preview-path", str(tmp_path / "prev")])
    assert args.run(args) == 0
    want = image_to_uint8(np.clip(R["pipe.image"][0], -1, 1)).astype(int)
    assert np.abs(png(out) - want).max() <= 1
    got = read_generation(out).settings
    assert got["steps"] == 4 and got["cfg_scale"] == 1.0 and got["sampling_method"] == "euler"
    assert len(list((tmp_path / "prev").iterdir())) == 4


def test_sd_cli_defaults_and_a_q8_0_gguf_dit(tmp_path: Path, fixed_noise, q8) -> None:
    a, b = tmp_path / "f16.png", tmp_path / "q8.png"
    for dit, out in ((DIT, a), (q8, b)):
        args = parse(["--diffusion-model", str(dit), "--llm", str(LLM), "--vae", str(VAE), "-p", PROMPT,
                      "-W", "64", "-H", "64", "--steps", "3", "-t", "1", "-o", str(out), "--in-process"])
        assert args.run(args) == 0
    got = read_generation(a).settings
    assert got["cfg_scale"] == 2.5 and got["sampling_method"] == "euler"  # sd-cli's docs/qwen_image.md
    diff = np.abs(png(a) - png(b))
    assert 0 < diff.max() <= 24 and diff.mean() < 4  # Q8_0 rounding of a tiny random model


def test_missing_encoder_and_refused_options_are_one_line(tmp_path: Path, capsys) -> None:
    args = parse(["--diffusion-model", str(DIT), "--vae", str(VAE), "-p", "x", "-o", str(tmp_path / "x.png"),
                  "--in-process", "-W", "64", "-H", "64"])
    assert args.run(args) == 2
    assert "--llm" in capsys.readouterr().err
    pic = tmp_path / "ref.png"
    Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(pic)
    lora = tmp_path / "style.safetensors"
    from safetensors.numpy import save_file

    save_file({"lora_unet_transformer_blocks_0_attn_to_q.lora_down.weight": np.zeros((1, 8), np.float32)}, str(lora))
    out = tmp_path / "x.png"
    args = parse([*flags(), "-p", "x <lora:style:1>", "--lora-model-dir", str(tmp_path), "-o", str(out), "--in-process"])
    assert args.run(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "<lora:...> prompt tags: Qwen-Image does not take" in err and err.count("error") == 1, err
    assert not out.exists()
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a picture")
    args = parse([*flags(), "-r", str(bad), "-o", str(out), "--in-process"])
    assert args.run(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "-r/--ref-image" in err and str(bad) in err and err.count("error") == 1, err
    assert not out.exists()


def test_reference_picture_edits(tmp_path: Path, fixed_noise) -> None:
    """``-r pic.png``: the pipeline's edit of the picture (vision tower, Edit prompt, reference
    latent; an 80 x 48 picture: 504 x 308 for the tower, 96 x 64 for the latent); without ``-r``
    another picture."""
    from sdplan.core.pipelines.qwen_image.edit import vae_size, vl_size

    assert vl_size(80, 48) == (504, 308) and vae_size(64, 64, 80, 48) == (96, 64)
    from sdplan.core.pipelines.qwen_image.pipeline import QwenImageModels, QwenImagePipeline

    pic = tmp_path / "ref.png"
    rgb = np.random.default_rng(5).integers(0, 256, (48, 80, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(pic)
    edited, plain = tmp_path / "edit.png", tmp_path / "plain.png"
    for extra, out in ((["-r", str(pic)], edited), ([], plain)):
        args = parse([*flags(), *extra, "-o", str(out), "--in-process"])
        assert args.run(args) == 0
    with QwenImagePipeline(QwenImageModels(DIT, LLM, VAE), n_threads=1) as pipe:
        want = pipe.txt2img(PROMPT, 64, 64, steps=4, cfg_scale=1.0, noise=R["pipe.noise"], ref_images=[rgb])["image"]
    assert np.abs(png(edited) - image_to_uint8(np.clip(want[0], -1, 1)).astype(int)).max() <= 1
    assert np.abs(png(edited) - png(plain)).mean() > 1


@pytest.mark.rpc
def test_split_over_two_rpc_servers(tmp_path: Path) -> None:
    """--backend diffusion=RPC0&RPC1,te=RPC0&RPC1 over two loopback servers (registered only in
    the engine child) gives the one-device picture within 1/255."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    base = [*flags(cfg="2.5"), "-s", "5"]
    one = tmp_path / "one.png"
    args = parse([*base, "-o", str(one)])
    assert args.run(args) == 0
    with rpc_servers(2) as servers:
        split = tmp_path / "split.png"
        args = parse([*base, "-o", str(split), "--rpc-servers", ",".join(s.endpoint for s in servers),
                      "--backend", "diffusion=RPC0&RPC1,te=RPC0&RPC1"])
        assert args.run(args) == 0
    assert np.abs(png(split) - png(one)).max() <= 1
    assert png(one).std() > 40  # a picture with contrast: the bound says something
    rec = read_generation(split)
    assert "RPC0&RPC1" in rec.placement["backend"]
