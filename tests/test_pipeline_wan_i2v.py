"""The Wan 2.2 I2V-A14B pipeline against diffusers' ``WanImageToVideoPipeline`` (the fixture's
reference run): the start picture read from its PNG, the video ``[picture, grey, grey, grey,
grey]`` encoded as a whole to its mask and normalised latent (the 20 condition channels), the
two tiny 36-input experts switched at 0.875 (the high-noise one for the first two of four
steps, CFG 3.5, then the low-noise one, CFG 2), sd-cli's discrete flow sigmas with shift 5,
five frames decoded; the picture's absence and a text-to-video model's picture refused."""

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
from sdplan.core.pipelines.wan.i2v import crop_box, start_picture  # noqa: E402
from sdplan.core.pipelines.wan.pipeline import HighNoise, WanModels, WanPipeline  # noqa: E402

R = load_file(str(FIXTURES / "wan_i2v_ref.safetensors"))
MODELS = WanModels(FIXTURES / "wan_i2v_tiny.safetensors", FIXTURES / "umt5_tiny.safetensors",
                   FIXTURES / "wan_vae_tiny.safetensors", FIXTURES / "wan_i2v_high_noise_tiny.safetensors")
PROMPT = "a lovely cat walking on the beach"



@pytest.fixture(scope="module")
def picture(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("wan_i2v") / "start.png"
    Image.fromarray(R["pipe.picture"]).save(path)
    return str(path)


@pytest.fixture(scope="module")
def run(picture) -> dict:
    pic = start_picture(picture, 48, 32)
    with WanPipeline(MODELS, n_threads=1, keep_both=False) as pipe:
        assert pipe.i2v and "vae_encode" in pipe.runners
        cond = pipe.encode_condition(pic, 5)
        out = pipe.txt2vid(PROMPT, 48, 32, 5, steps=4, cfg_scale=2.0, high=HighNoise(cfg_scale=3.5),
                           noise=R["pipe.noise"], picture=pic)
        out["condition"] = cond
        out["encoder_after"] = pipe.runners["vae_encode"].memory()
    return out


def test_the_picture_read_as_diffusers_reads_it(picture) -> None:
    pic = start_picture(picture, 48, 32)
    want = R["pipe.picture"].astype(np.float32).transpose(2, 0, 1)[None] / 127.5 - 1.0
    np.testing.assert_allclose(pic, want, atol=1e-6)


def test_the_condition_against_diffusers(run) -> None:
    """Mask channels (1 on the first latent frame) then the normalised latent of the video."""
    assert run["condition"].shape == (1, 20, 2, 4, 6)
    np.testing.assert_array_equal(run["condition"][:, :4], R["pipe.condition"][:, :4])
    assert rel_err(run["condition"][:, 4:], R["pipe.condition"][:, 4:]) < 5e-3


def test_two_experts_image_to_video_against_diffusers(run) -> None:
    np.testing.assert_allclose(run["sigmas"], R["pipe.sigmas"], atol=1e-6)
    assert run["switch"] == 2
    assert run["latent"].shape == (1, 16, 2, 4, 6)
    assert rel_err(run["latent"], R["pipe.latent"]) < 2e-2
    assert run["video"].shape == (1, 3, 5, 32, 48)
    assert np.abs(run["video"] - R["pipe.video"]).max() < 4 / 255


def test_the_encoder_holds_only_its_weights_after_encoding(run) -> None:
    mem = run["encoder_after"]
    assert sum(m.weights for m in mem.values()) > 0
    assert not any(m.compute for m in mem.values())


def test_crop_as_sd_cli() -> None:
    assert crop_box(100, 50, 48, 32) == (12, 0, 75, 50)  # int(50 * 1.5) = 75 wide, centred
    assert crop_box(50, 100, 48, 32) == (0, 33, 50, 33)  # int(50 / 1.5) = 33 high
    assert crop_box(96, 64, 48, 32) == (0, 0, 96, 64)


def test_a_one_pixel_wide_picture_keeps_its_colour(tmp_path) -> None:
    """A 1 x 400 picture for a 48x32 video: sd-cli's truncation crops int(1 / 1.5) = 0 rows;
    one row is kept, so the start picture is the picture's grey, not black."""
    assert crop_box(1, 400, 48, 32) == (0, 199, 1, 1) and crop_box(400, 1, 32, 48) == (199, 0, 1, 1)
    Image.fromarray(np.full((400, 1, 3), 200, np.uint8)).save(tmp_path / "tall.png")
    got = start_picture(tmp_path / "tall.png", 48, 32)
    assert got.shape == (1, 3, 32, 48)
    np.testing.assert_allclose(got, 200 / 127.5 - 1.0, atol=1e-6)


def test_a_wider_picture_is_cropped_then_resized(tmp_path) -> None:
    """A 96x32 picture whose middle 48 columns are the fixture's: cropped to them, no resize."""
    wide = np.zeros((32, 96, 3), np.uint8)
    wide[:, 24:72] = R["pipe.picture"]
    Image.fromarray(wide).save(tmp_path / "wide.png")
    got = start_picture(tmp_path / "wide.png", 48, 32)
    want = R["pipe.picture"].astype(np.float32).transpose(2, 0, 1)[None] / 127.5 - 1.0
    np.testing.assert_allclose(got, want, atol=1e-6)
    big = np.repeat(np.repeat(R["pipe.picture"], 2, 0), 2, 1)  # 2x: the box filter gives it back
    Image.fromarray(big).save(tmp_path / "big.png")
    assert np.abs(start_picture(tmp_path / "big.png", 48, 32) - want).max() <= 2 / 127.5


def test_the_picture_is_needed_and_a_text_model_refuses_one(picture) -> None:
    one = WanModels(MODELS.diffusion_model, MODELS.t5xxl, MODELS.vae)
    with WanPipeline(one, n_threads=1) as pipe, pytest.raises(SdplanError, match="-i/--init-img missing"):
        pipe.txt2vid(PROMPT, 48, 32, 1, steps=1)
    t2v = WanModels(FIXTURES / "wan_tiny.safetensors", MODELS.t5xxl, MODELS.vae)
    with WanPipeline(t2v, n_threads=1) as pipe:
        assert not pipe.i2v and "vae_encode" not in pipe.runners
        with pytest.raises(SdplanError, match="-i/--init-img: a Wan text-to-video model takes no start picture"):
            pipe.txt2vid(PROMPT, 48, 32, 1, steps=1, picture=start_picture(picture, 48, 32))


def test_wan21_image_to_video_is_refused(tmp_path) -> None:
    """A 36-input DiT with CLIP vision embeddings (``img_emb``) is Wan 2.1 I2V, not run."""
    from safetensors.numpy import save_file

    t = load_file(str(MODELS.diffusion_model))
    t["img_emb.proj.1.weight"] = np.zeros((48, 32), np.float16)
    save_file(t, str(tmp_path / "wan21_i2v.safetensors"), metadata={"sdplan.head_dim": "24"})
    with pytest.raises(SdplanError, match="Wan 2.1 I2V/FLF2V"):
        WanPipeline(WanModels(tmp_path / "wan21_i2v.safetensors", MODELS.t5xxl, MODELS.vae), n_threads=1)
