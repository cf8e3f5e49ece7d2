"""Wan 2.2 TI2V-5B image to video against diffusers' ``WanImageToVideoPipeline`` with
``expand_timesteps`` (the TI2V-5B config; the fixture's reference run): the start picture read
from its PNG, encoded alone by the Wan 2.2 encoder as the normalised first latent frame, the
tiny 48-channel DiT with the first frame's tokens at timestep 0, CFG 3.5, sd-cli's discrete flow
sigmas with shift 5 over four steps, five frames of 64x96 decoded by the Wan 2.2 decoder; the
first frame held at every step (the x0 estimate the previews show); the helpers of
:mod:`sdplan.core.pipelines.wan.ti2v` on small arrays; an autoencoder without its encoder
refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import rel_err
from PIL import Image
from safetensors.numpy import load_file
from sparse_writer import FIXTURES

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.errors import SdplanError  # noqa: E402
from sdplan.core.pipelines.wan import ti2v  # noqa: E402
from sdplan.core.pipelines.wan.i2v import start_picture  # noqa: E402
from sdplan.core.pipelines.wan.pipeline import WanModels, WanPipeline  # noqa: E402

R = load_file(str(FIXTURES / "wan_ti2v_i2v_ref.safetensors"))
MODELS = WanModels(FIXTURES / "wan_ti2v_tiny.safetensors", FIXTURES / "umt5_tiny.safetensors",
                   FIXTURES / "wan22_vae_tiny.safetensors")
PROMPT = "a lovely cat walking on the beach"



@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("wan_ti2v") / "start.png"
    Image.fromarray(R["pipe.picture"]).save(path)
    pic = start_picture(path, 96, 64)
    previews: list[np.ndarray] = []
    with WanPipeline(MODELS, n_threads=1) as pipe:
        assert pipe.ti2v and not pipe.i2v and "vae_encode" in pipe.runners
        first = pipe.encode_first_frame(pic)
        out = pipe.txt2vid(PROMPT, 96, 64, 5, steps=4, cfg_scale=3.5, noise=R["pipe.noise"], picture=pic,
                           preview=lambda i, rgb: previews.append(rgb))
        out.update(picture=pic, first=first, previews=previews, preview_of_first=pipe._preview_rgb(first[:, :, 0]))
    return out


def test_the_picture_and_its_latent_frame_against_diffusers(run) -> None:
    want = R["pipe.picture"].astype(np.float32).transpose(2, 0, 1)[None] / 127.5 - 1.0
    np.testing.assert_allclose(run["picture"], want, atol=1e-6)
    assert run["first"].shape == R["pipe.condition"].shape == (1, 48, 1, 4, 6)
    assert rel_err(run["first"], R["pipe.condition"]) < 5e-3


def test_image_to_video_against_diffusers(run) -> None:
    np.testing.assert_allclose(run["sigmas"], R["pipe.sigmas"], atol=1e-6)
    assert run["latent"].shape == (1, 48, 2, 4, 6)
    assert rel_err(run["latent"], R["pipe.latent"]) < 2e-2
    # the sampled first frame ends on the picture's latent (sd-cli's last x0 estimate, diffusers' put back)
    np.testing.assert_allclose(run["latent"][:, :, :1], run["first"], atol=1e-6)
    assert run["video"].shape == (1, 3, 5, 64, 96)
    assert np.abs(run["video"] - R["pipe.video"]).max() < 4 / 255


def test_every_step_holds_the_first_frame(run) -> None:
    assert len(run["previews"]) == 4
    for rgb in run["previews"]:  # each step's x0 estimate, frame 0
        np.testing.assert_array_equal(rgb, run["preview_of_first"])


def test_helpers() -> None:
    first = np.full((1, 2, 1, 1, 1), 3.0, np.float32)
    noise = np.ones((1, 2, 3, 1, 1), np.float32)
    x = ti2v.start_latent(noise, first, 0.25)
    np.testing.assert_allclose(x[0, :, :, 0, 0], [[0.25 + 2.25, 0.25, 0.25]] * 2)
    z = ti2v.model_input(x, first)
    assert z[0, 0, 0, 0, 0] == 3.0 and z[0, 0, 1, 0, 0] == 0.25 and x[0, 0, 0, 0, 0] == 2.5
    np.testing.assert_array_equal(ti2v.frame_sigmas(3, 0.5), [0.0, 0.5, 0.5])

    def den(a: np.ndarray, s: float) -> np.ndarray:
        return a * 2.0

    den.with_uncond = lambda a, s: (a * 2.0, a * 5.0)  # type: ignore[attr-defined]
    kept = ti2v.keep_first(den, first)
    d = kept(x, 0.5)
    assert d[0, 0, 0, 0, 0] == 3.0 and d[0, 0, 1, 0, 0] == 0.5
    g, u = kept.with_uncond(x, 0.5)
    assert g[0, 0, 0, 0, 0] == 3.0 and u[0, 0, 0, 0, 0] == 12.5  # the unconditional estimate as sd-cli leaves it


def test_an_autoencoder_without_its_encoder_is_refused(tmp_path) -> None:
    from safetensors.numpy import save_file

    t = load_file(str(MODELS.vae))
    save_file({k: v for k, v in t.items() if not k.startswith(("encoder.", "conv1."))},
              str(tmp_path / "decoder_only.safetensors"))
    models = WanModels(MODELS.diffusion_model, MODELS.t5xxl, tmp_path / "decoder_only.safetensors")
    with WanPipeline(models, n_threads=1) as pipe:
        assert "vae_encode" not in pipe.runners
        with pytest.raises(SdplanError, match="without its encoder; Wan 2.2 TI2V-5B image to video"):
            pipe.txt2vid(PROMPT, 32, 32, 1, steps=1, picture=np.zeros((1, 3, 32, 32), np.float32))
