"""The Wan pipeline against diffusers' ``WanPipeline`` (the fixture's reference run): UMT5's
masked states of the prompt and the empty negative prompt padded to 512, the two tiny experts
switched at the 0.875 boundary (the high-noise one for the first two of four steps, CFG 3.5,
then the low-noise one, CFG 2), sd-cli's discrete flow sigmas with shift 5, the Wan 2.1
autoencoder decoding five frames; each expert released after its phase when both do not stay."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import rel_err
from safetensors.numpy import load_file
from sparse_writer import FIXTURES

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.errors import SdplanError  # noqa: E402
from sdplan.core.pipelines.wan.pipeline import HighNoise, WanModels, WanPipeline  # noqa: E402

R = load_file(str(FIXTURES / "wan_ref.safetensors"))
MODELS = WanModels(FIXTURES / "wan_tiny.safetensors", FIXTURES / "umt5_tiny.safetensors",
                   FIXTURES / "wan_vae_tiny.safetensors", FIXTURES / "wan_high_noise_tiny.safetensors")
PROMPT = "a lovely cat walking on the beach"



@pytest.fixture(scope="module")
def run() -> dict:
    with WanPipeline(MODELS, n_threads=1, keep_both=False) as pipe:
        out = pipe.txt2vid(PROMPT, 48, 32, 5, steps=4, cfg_scale=2.0, high=HighNoise(cfg_scale=3.5),
                           noise=R["pipe.noise"])
        out["high_after"] = pipe.runners["diffusion_high"].memory()
        out["low_after"] = pipe.runners["diffusion"].memory()
    return out


def test_two_experts_against_diffusers(run) -> None:
    np.testing.assert_allclose(run["sigmas"], R["pipe.sigmas"], atol=1e-6)
    assert run["switch"] == 2  # sigmas 1, 0.909 at or above 0.875; 0.715 below
    assert run["latent"].shape == (1, 16, 2, 4, 6)
    assert rel_err(run["latent"], R["pipe.latent"]) < 2e-2
    assert run["video"].shape == (1, 3, 5, 32, 48)
    assert np.abs(run["video"] - R["pipe.video"]).max() < 4 / 255


def test_each_expert_released_after_its_phase(run) -> None:
    """One expert at a time: neither holds weights once the video is decoded."""
    assert not any(m.weights for m in run["high_after"].values())
    assert not any(m.weights for m in run["low_after"].values())


def test_one_expert_alone_and_the_switch_rule() -> None:
    one = WanModels(MODELS.diffusion_model, MODELS.t5xxl, MODELS.vae)
    with WanPipeline(one, n_threads=1) as pipe:
        assert "diffusion_high" not in pipe.runners
        out = pipe.txt2vid(PROMPT, 48, 32, 1, steps=2, cfg_scale=1.0, seed=7)
        assert out["switch"] == 0 and out["video"].shape == (1, 3, 1, 32, 48)
        with pytest.raises(SdplanError, match="multiples of 16"):
            pipe.txt2vid(PROMPT, 40, 32, 5)
    with WanPipeline(MODELS, n_threads=1) as pipe:
        sig = np.array([1.0, 0.95, 0.9, 0.875, 0.5, 0.0])
        assert pipe.switch_step(sig, HighNoise(), 0) == 4  # 0.875 is not below the boundary
        assert pipe.switch_step(sig, HighNoise(boundary=0.9), 0) == 3
        assert pipe.switch_step(sig, HighNoise(steps=2), 2) == 2
        assert pipe.switch_step(sig, HighNoise(steps=0), 0) == 0


def test_wrong_files_are_refused(tmp_path) -> None:
    from safetensors.numpy import save_file

    for inputs, named in ((48, "TI2V-5B"),):  # 36 inputs: image to video (test_pipeline_wan_i2v)
        t = load_file(str(MODELS.diffusion_model))
        t["patch_embedding.weight"] = np.zeros((48, inputs, 1, 2, 2), np.float16)
        path = tmp_path / f"wan_{inputs}.safetensors"
        save_file(t, str(path), metadata={"sdplan.head_dim": "24"})
        with pytest.raises(SdplanError, match=named):
            WanPipeline(WanModels(path, MODELS.t5xxl, MODELS.vae), n_threads=1)
    with pytest.raises(SdplanError, match="not UMT5"):
        WanPipeline(WanModels(MODELS.diffusion_model, FIXTURES / "t5_tiny.safetensors", MODELS.vae), n_threads=1)
