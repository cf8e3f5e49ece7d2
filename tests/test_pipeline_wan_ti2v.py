"""Wan 2.2 TI2V-5B text to video against diffusers' ``WanPipeline`` with the TI2V config
(``expand_timesteps``: per-token timesteps; the Wan 2.2 autoencoder, 16x spatial; the fixture's
reference run): the tiny 48-channel DiT, UMT5's masked states of the prompt and the empty
negative prompt padded to 512, CFG 3.5, sd-cli's discrete flow sigmas with shift 5 over four
steps, five frames of 64x96 decoded by the Wan 2.2 decoder; the previews' 48-channel factors;
an autoencoder whose channels are not the DiT's refused by name."""

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
from sdplan.core.pipelines.wan.pipeline import WanModels, WanPipeline  # noqa: E402

R = load_file(str(FIXTURES / "wan22_ref.safetensors"))
MODELS = WanModels(FIXTURES / "wan_ti2v_tiny.safetensors", FIXTURES / "umt5_tiny.safetensors",
                   FIXTURES / "wan22_vae_tiny.safetensors")
PROMPT = "a lovely cat walking on the beach"



def test_ti2v_against_diffusers() -> None:
    previews: list[tuple[int, np.ndarray]] = []
    with WanPipeline(MODELS, n_threads=1) as pipe:
        assert (pipe.ae.name, pipe.ae.z, pipe.ae.factor, pipe.latent_format) == ("Wan 2.2", 48, 16, "wan22_vae")
        out = pipe.txt2vid(PROMPT, 96, 64, 5, steps=4, cfg_scale=3.5, noise=R["pipe.noise"],
                           preview=lambda i, rgb: previews.append((i, rgb)))
    np.testing.assert_allclose(out["sigmas"], R["pipe.sigmas"], atol=1e-6)
    assert out["latent"].shape == (1, 48, 2, 4, 6)
    assert rel_err(out["latent"], R["pipe.latent"]) < 2e-2
    assert out["video"].shape == (1, 3, 5, 64, 96)
    assert np.abs(out["video"] - R["pipe.video"]).max() < 4 / 255
    assert [i for i, _ in previews] == [0, 1, 2, 3]
    assert previews[-1][1].shape == (4, 6, 3) and previews[-1][1].dtype == np.uint8


def test_seeded_noise_has_the_latent_shape() -> None:
    with WanPipeline(MODELS, n_threads=1) as pipe:
        out = pipe.txt2vid(PROMPT, 32, 32, 1, steps=1, cfg_scale=1.0, seed=3)
        assert out["latent"].shape == (1, 48, 1, 2, 2) and out["video"].shape == (1, 3, 1, 32, 32)
        with pytest.raises(SdplanError, match="multiples of 32"):
            pipe.txt2vid(PROMPT, 48, 32, 1)


def test_autoencoder_of_other_channels_refused() -> None:
    with pytest.raises(SdplanError, match="TI2V-5B's 48 channels need the Wan 2.2 autoencoder"):
        WanPipeline(WanModels(MODELS.diffusion_model, MODELS.t5xxl, FIXTURES / "wan_vae_tiny.safetensors"),
                    n_threads=1)
    with pytest.raises(SdplanError, match="the Wan 2.2 autoencoder with 48 latent channels"):
        WanPipeline(WanModels(FIXTURES / "wan_tiny.safetensors", MODELS.t5xxl, MODELS.vae), n_threads=1)
