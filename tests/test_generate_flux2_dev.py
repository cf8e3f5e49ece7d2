"""``sdplan generate`` with FLUX.2 dev files (``--diffusion-model --llm --vae``, sd-cli's flags
for the family: ``--cfg-scale 1 --sampling-method euler``, ``--guidance`` into the DiT's
guidance embedder): the PNG is diffusers' decoded latent; a Q8_0 GGUF DiT runs; ``-r`` edits a
reference picture; ``--guidance`` is recorded and changes the picture; a klein encoder is a
one-line error; ``--backend "diffusion=RPC0&RPC1,te=RPC0&RPC1"`` over two RPC servers gives
the one-device image.

The tiny autoencoder halves where FLUX.2's divides by 8, so a 64x64 request samples the
fixture's 4x4 diffusion latent and decodes to 16x16 pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flux2_dev_util import AE, DIT, PROMPT, ref, write_llm
from flux_util import write_gguf

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from generate_util import parse, png  # noqa: E402
from PIL import Image  # noqa: E402
from sdplan.core.pipelines.flux2.pipeline import resize_nearest  # noqa: E402
from sdplan.core.pipelines.flux2_dev.pipeline import DevModels, DevPipeline  # noqa: E402
from sdplan.core.pipelines.stages.results import image_to_uint8, read_generation  # noqa: E402
from sdplan.core.sampling.noise import PhiloxNoise  # noqa: E402

R = ref()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("dev")
    q8 = d / "flux2-dev-tiny-Q8_0.gguf"
    write_gguf(DIT, q8, "q8_0")
    pic = d / "picture.png"
    Image.fromarray(R["edit.picture"]).save(pic)
    return {"llm": write_llm(d / "mistral_tiny.safetensors"), "q8_0": q8, "picture": pic}


def flags(dit: Path, llm: Path, steps: int = 4) -> list[str]:
    return ["--diffusion-model", str(dit), "--llm", str(llm), "--vae", str(AE), "-p", PROMPT,
            "-W", "64", "-H", "64", "--steps", str(steps), "--cfg-scale", "1", "--sampling-method", "euler",
            "-t", "1"]


@pytest.fixture
def fixed_noise(monkeypatch):
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: R["pipe.noise"].copy())


def test_generate_gives_the_diffusers_image(tmp_path: Path, fixed_noise, files) -> None:
    out = tmp_path / "d.png"
    args = parse([*flags(DIT, files["llm"]), "-o", str(out), "--in-process", "--preview-path", str(tmp_path / "prev")])
    assert args.run(args) == 0
    assert np.abs(png(out) - image_to_uint8(R["pipe.image"][0]).astype(int)).max() <= 2
    got = read_generation(out).settings
    assert got["steps"] == 4 and got["cfg_scale"] == 1.0 and got["sampling_method"] == "euler"
    assert read_generation(out).architecture == "flux2-dev" and got["guidance"] == 3.5
    assert len(list((tmp_path / "prev").iterdir())) == 4


def test_guidance_is_recorded_and_read(tmp_path: Path, fixed_noise, files) -> None:
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    for out, extra in ((a, []), (b, ["--guidance", "8"])):
        args = parse([*flags(DIT, files["llm"]), *extra, "-o", str(out), "--in-process"])
        assert args.run(args) == 0
    assert read_generation(b).settings["guidance"] == 8.0
    assert np.abs(png(a) - png(b)).max() >= 3  # the tiny autoencoder damps the latent


def test_q8_0_gguf_dit(tmp_path: Path, fixed_noise, files) -> None:
    a, b = tmp_path / "f16.png", tmp_path / "q8.png"
    for dit, out in ((DIT, a), (files["q8_0"], b)):
        args = parse([*flags(dit, files["llm"]), "-o", str(out), "--in-process"])
        assert args.run(args) == 0
    diff = np.abs(png(a) - png(b))
    assert 0 < diff.max() <= 24 and diff.mean() < 4  # Q8_0 rounding of a tiny random model
    assert read_generation(b).architecture == "flux2-dev"


def test_reference_image_edit(tmp_path: Path, fixed_noise, files) -> None:
    out = tmp_path / "edit.png"
    args = parse([*flags(DIT, files["llm"], 2), "-r", str(files["picture"]), "-o", str(out), "--in-process"])
    assert args.run(args) == 0
    big = resize_nearest(R["edit.picture"], 64, 64)  # sd-cli's sizing: enlarged (nearest) to 64x64
    with DevPipeline(DevModels(DIT, files["llm"], AE), n_threads=1) as pipe:
        want = pipe.txt2img(PROMPT, 64, 64, steps=2, noise=R["pipe.noise"], ref_images=[big])
        plain = pipe.txt2img(PROMPT, 64, 64, steps=2, noise=R["pipe.noise"])
    assert np.abs(png(out) - image_to_uint8(want["image"][0]).astype(int)).max() <= 1
    assert np.abs(png(out) - image_to_uint8(plain["image"][0]).astype(int)).max() >= 3  # the reference matters


def test_a_klein_encoder_and_a_missing_one_are_one_line_errors(tmp_path: Path, files, capsys) -> None:
    from flux2_util import write_llm as write_qwen3

    qwen = write_qwen3(tmp_path / "qwen_3_tiny.safetensors")
    args = parse([*flags(DIT, qwen), "-o", str(tmp_path / "x.png"), "--in-process"])
    assert args.run(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "FLUX.2 dev reads the states of Mistral-Small-3.2" in err and err.count("error") == 1, err
    args = parse(["--diffusion-model", str(DIT), "--vae", str(AE), "-p", "x", "-o", str(tmp_path / "y.png"),
                  "--in-process", "-W", "64", "-H", "64"])
    assert args.run(args) == 2
    assert "--llm" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "y.png").exists()


@pytest.mark.rpc
def test_split_over_two_rpc_servers(tmp_path: Path, files) -> None:
    """--backend diffusion=RPC0&RPC1,te=RPC0&RPC1 over two loopback servers (registered only in
    the engine child) gives the one-device image within 1/255."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    base = [*flags(DIT, files["llm"]), "-s", "5"]
    one = tmp_path / "one.png"
    args = parse([*base, "-o", str(one)])
    assert args.run(args) == 0
    with rpc_servers(2) as servers:
        split = tmp_path / "split.png"
        args = parse([*base, "-o", str(split), "--rpc-servers", ",".join(s.endpoint for s in servers),
                      "--backend", "diffusion=RPC0&RPC1,te=RPC0&RPC1"])
        assert args.run(args) == 0
    assert np.abs(png(split) - png(one)).max() <= 1
    rec = read_generation(split)
    assert "RPC0&RPC1" in rec.placement["backend"] and rec.architecture == "flux2-dev"
