"""``sdplan generate`` with Z-Image files (``--diffusion-model --llm --vae``, Turbo's flags as
sd-cli's docs give them: ``--cfg-scale 1 --sampling-method euler``): the PNG is the decoded
diffusers latent, a Q8_0 GGUF encoder runs, a missing encoder is a one-line error, and
``--backend "diffusion=RPC0&RPC1,te=RPC0&RPC1"`` over two RPC servers gives the one-device
image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from zimage_util import AE, DIT, PROMPT, ref, write_qwen3

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from generate_util import parse, png  # noqa: E402
from sdplan.core.pipelines.stages.results import image_to_uint8, read_generation  # noqa: E402
from sdplan.core.pipelines.z_image.pipeline import ZImageModels, ZImagePipeline  # noqa: E402
from sdplan.core.sampling.noise import PhiloxNoise  # noqa: E402

R = ref()


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    d = tmp_path_factory.mktemp("llm")
    return {"hf": write_qwen3(d / "qwen_3_tiny.safetensors"), "q8_0": write_qwen3(d / "qwen3-tiny-Q8_0.gguf", "gguf", "q8_0")}


def flags(llm_path: Path) -> list[str]:
    return ["--diffusion-model", str(DIT), "--llm", str(llm_path), "--vae", str(AE), "-p", PROMPT,
            "-W", "64", "-H", "64", "--steps", "4", "--cfg-scale", "1", "--sampling-method", "euler", "-t", "1"]


def test_generate_gives_the_diffusers_latent_decoded(tmp_path: Path, monkeypatch, llm) -> None:
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: R["pipe.noise"].copy())
    out = tmp_path / "z.png"
    args = parse([*flags(llm["hf"]), "-o", str(out), "--in-process", "--preview-path", str(tmp_path / "prev")])
    assert args.run(args) == 0
    with ZImagePipeline(ZImageModels(DIT, llm["hf"], AE), n_threads=1) as pipe:
        expected = image_to_uint8(pipe.decode(R["pipe.latent"])[0]).astype(int)
    assert np.abs(png(out) - expected).max() <= 2
    s = read_generation(out).settings
    assert s["steps"] == 4 and s["cfg_scale"] == 1.0 and s["sampling_method"] == "euler"
    assert len(list((tmp_path / "prev").iterdir())) == 4


def test_q8_0_gguf_encoder_runs(tmp_path: Path, monkeypatch, llm) -> None:
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: R["pipe.noise"].copy())
    a, b = tmp_path / "hf.png", tmp_path / "q8.png"
    for path, out in ((llm["hf"], a), (llm["q8_0"], b)):
        args = parse([*flags(path), "-o", str(out), "--in-process"])
        assert args.run(args) == 0
    diff = np.abs(png(a) - png(b))
    assert diff.max() <= 24 and diff.mean() < 4  # Q8_0 rounding of a tiny random model


def test_missing_encoder_is_a_clear_error(tmp_path: Path, capsys) -> None:
    args = parse(["--diffusion-model", str(DIT), "--vae", str(AE), "-p", "x", "-o", str(tmp_path / "x.png"),
                  "--in-process", "-W", "64", "-H", "64"])
    assert args.run(args) == 2
    assert "--llm" in capsys.readouterr().err


@pytest.mark.rpc
def test_split_over_two_rpc_servers(tmp_path: Path, llm) -> None:
    """--backend diffusion=RPC0&RPC1,te=RPC0&RPC1 over two loopback servers (registered only in
    the engine child) gives the one-device image."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    base = [*flags(llm["hf"]), "-s", "5"]
    one = tmp_path / "one.png"
    args = parse([*base, "-o", str(one)])
    assert args.run(args) == 0
    with rpc_servers(2) as servers:
        split = tmp_path / "split.png"
        args = parse([*base, "-o", str(split), "--rpc-servers", ",".join(s.endpoint for s in servers),
                      "--backend", "diffusion=RPC0&RPC1,te=RPC0&RPC1"])
        assert args.run(args) == 0
    assert np.abs(png(split) - png(one)).max() <= 1
    assert "RPC0&RPC1" in read_generation(split).placement["backend"]
