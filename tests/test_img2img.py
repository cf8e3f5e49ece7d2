"""Image-to-image and inpainting as sd-cli does them (:mod:`sdplan.core.pipelines.stages.img2img`).

- the helpers: sigma truncation (sd-cli's ``t_enc = int(steps * strength)`` rule), the latent
  mask (largest value per cell), 3x3 dilation, picture loading;
- the demo model (a trained VAE, so its round trip means something): ``--strength 0`` returns
  the init picture up to the VAE round trip; inpainting keeps the unmasked pixels within the
  round-trip error of the input and changes the masked ones;
- strength 1: Flux equals text-to-image bit for bit (its flow start ``(1 - 1) init + noise``);
  SD equals text-to-image started from ``noise + init / sigma_0`` (sd-cli's
  ``init + sigma_0 noise``), to rounding;
- FLUX.1, Chroma, Z-Image and SD3 through the FLUX.1-family base: the first velocity call sees
  ``(1 - s0) init + s0 noise``, strength 1 is text-to-image, masks keep the init latent; SD3's
  init latent is at its autoencoder's scaling ``(z - 0.0609) * 1.5305``;
- a 9-channel inpainting UNet against diffusers (``make_lora_fixtures.py``), and the pipeline
  feeding it ``[latent, mask, masked latent]`` while keeping the unmasked latents.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sdplan.core.errors import SdplanError
from sdplan.core.pipelines.stages.img2img import (
    ImageInput,
    dilate,
    latent_mask,
    load_image,
    load_mask,
    request_image_input,
    truncate_sigmas,
)

FIX = Path(__file__).parent / "fixtures"


# ----------------------------------------------------------------------------- helpers

def test_truncation_follows_sd_cli() -> None:
    s = np.linspace(10, 0, 21)  # 20 steps
    assert len(truncate_sigmas(s, 0.0)) == 2 and truncate_sigmas(s, 0.0)[0] == s[-2]  # one step
    assert list(truncate_sigmas(s, 0.5)) == list(s[9:])  # t_enc 10: 11 steps
    assert list(truncate_sigmas(s, 0.25)) == list(s[14:])  # t_enc 5: 6 steps
    assert list(truncate_sigmas(s, 0.99)) == list(s)  # t_enc 19: all 20 steps
    assert list(truncate_sigmas(s, 1.0)) == list(s)
    assert list(truncate_sigmas(np.linspace(1, 0, 5), 0.5)) == list(np.linspace(1, 0, 5)[1:])  # 3 of 4


def test_latent_mask_takes_the_largest_pixel_and_dilates() -> None:
    m = np.zeros((1, 1, 16, 16), np.float32)
    m[0, 0, 9, 3] = 1  # one pixel in latent cell (1, 0)
    lm = latent_mask(m, 8)
    assert lm.shape == (1, 1, 2, 2) and lm[0, 0].tolist() == [[0, 0], [1, 0]]
    big = np.zeros((1, 1, 5, 5), np.float32)
    big[0, 0, 2, 2] = 1
    assert dilate(big)[0, 0].sum() == 9 and dilate(big)[0, 0, 1:4, 1:4].min() == 1


def test_pictures_load_resized_and_masks_round(tmp_path: Path) -> None:
    rgb = np.zeros((20, 30, 3), np.uint8)
    rgb[:, :15] = 255
    Image.fromarray(rgb).save(tmp_path / "i.png")
    grey = np.full((20, 30), 100, np.uint8)
    grey[:, 20:] = 200
    Image.fromarray(grey).save(tmp_path / "m.png")
    img = load_image(tmp_path / "i.png", 32, 16)
    assert img.shape == (1, 3, 16, 32) and img.max() == 1.0 and img.min() == -1.0
    mask = load_mask(tmp_path / "m.png", 32, 16)
    assert set(np.unique(mask)) == {0.0, 1.0} and mask[0, 0, :, 0].max() == 0 and mask[0, 0, :, -1].min() == 1
    with pytest.raises(SdplanError, match="--mask needs -i"):
        request_image_input({"mask": str(tmp_path / "m.png")}, 32, 16)
    with pytest.raises(SdplanError, match=r"-i/--init-img .*not a readable picture"):
        request_image_input({"init_img": str(tmp_path / "m.txt")}, 32, 16)
    with pytest.raises(SdplanError, match=r"--strength must be in \[0, 1\]"):
        ImageInput(strength=1.5)
    got = request_image_input({"init_img": str(tmp_path / "i.png"), "strength": 0.3}, 32, 16)
    assert got is not None and got.strength == 0.3 and got.mask is None


# ----------------------------------------------------------------------------- engine

G = pytest.importorskip("sdplan._ggml")
needs_graph = pytest.mark.skipif(not hasattr(G, "Graph"), reason="the native module has no Graph")


@pytest.fixture(scope="module")
def demo():
    from sdplan.core.pipelines.demo.model import demo_model_path
    from sdplan.core.pipelines.sd.pipeline import StableDiffusion

    sd = StableDiffusion(demo_model_path(), n_threads=2)
    yield sd
    sd.close()


def demo_picture() -> np.ndarray:
    from sdplan.core.pipelines.demo.scenes import Scene, render

    rgb = render(Scene("square", "yellow", "blue", 64, 64, 22), 128)
    return (rgb.astype(np.float32) / 127.5 - 1.0).transpose(2, 0, 1)[None]


def roundtrip(sd, img: np.ndarray, seed: int) -> np.ndarray:
    from sdplan.core.pipelines.stages.results import image_to_uint8
    from sdplan.core.sampling.noise import PhiloxNoise

    lat = sd.encode_sample(img, PhiloxNoise(seed).randn((1, 4, 16, 16)))
    return image_to_uint8(sd.decode(lat)[0])


def params(prompt: str = "a yellow square on a blue background", seed: int = 5):
    from sdplan.core.pipelines.sd.pipeline import GenerateParams

    return GenerateParams(prompt, "", 128, 128, 20, 5.0, seed, "euler", "discrete")


def as_uint8(img: np.ndarray) -> np.ndarray:
    from sdplan.core.pipelines.stages.results import image_to_uint8

    return image_to_uint8(img[0])


@needs_graph
def test_strength_0_returns_the_init_picture_up_to_the_vae_round_trip(demo) -> None:
    img = demo_picture()
    out = demo.txt2img(params("a red circle on a green background"), init=ImageInput(img, None, 0.0))[0]
    rt = roundtrip(demo, img, 5)
    src = as_uint8(img)
    d_out = np.abs(out.astype(int) - rt.astype(int)).mean()
    d_rt = np.abs(rt.astype(int) - src.astype(int)).mean()
    # one Euler step from the smallest sigma (0.03) barely moves the round trip, whatever the prompt
    assert d_out < 1.0 and np.abs(out.astype(int) - src.astype(int)).mean() < d_rt + 1.0


@needs_graph
def test_inpainting_keeps_unmasked_pixels_and_repaints_masked_ones(demo) -> None:
    """Repaint the yellow square (mask 36..92) as a red circle. Unmasked latents end as the
    init's exactly; their pixels 12 pixels or more from the mask stay within 1.5x the VAE
    round trip's own error (measured 9.4 against 7.6 of 255 on average: the decoder's
    GroupNorm statistics span the picture); the masked pixels change by more than 4x it
    (measured 59)."""
    from sdplan.core.sampling.noise import PhiloxNoise

    img = demo_picture()
    mask = np.zeros((1, 1, 128, 128), np.float32)
    mask[..., 36:92, 36:92] = 1
    lat: list[np.ndarray] = []
    out = demo.txt2img(params("a red circle on a blue background"), on_step=lambda i, n, x: lat.append(x),
                       init=ImageInput(img, mask, 1.0))[0].astype(int)
    init = demo.encode_sample(img, PhiloxNoise(5).randn((1, 4, 16, 16)))
    keep = np.ones((16, 16), bool)
    keep[4:12, 4:12] = False  # latent cells touching the mask
    np.testing.assert_allclose(lat[-1][0][:, keep], init[0][:, keep], atol=1e-6)
    src, rt = as_uint8(img).astype(int), roundtrip(demo, img, 5).astype(int)
    far = np.ones((128, 128), bool)
    far[24:104, 24:104] = False
    inner = np.zeros((128, 128), bool)
    inner[44:84, 44:84] = True
    err_rt = np.abs(rt - src)[far].mean()
    assert np.abs(out - src)[far].mean() <= 1.5 * err_rt
    assert np.abs(out - src)[inner].mean() > 4 * err_rt


@needs_graph
def test_sd_strength_1_is_txt2img_from_the_init_offset_noise() -> None:
    from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion
    from sdplan.core.sampling.noise import PhiloxNoise
    from sdplan.core.sampling.schedules import get_sigmas

    p = GenerateParams("a photo of a cat", "", 16, 16, 4, 7.0, 3, "euler", "discrete")
    img = np.random.default_rng(0).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
    with StableDiffusion(FIX / "sd1_tiny.safetensors", clip_heads=2, n_threads=2) as sd:
        lat: list[np.ndarray] = []
        a = sd.txt2img(p, on_step=lambda i, n, x: lat.append(x), init=ImageInput(img, None, 1.0))[0]
        init = sd.encode_sample(img, PhiloxNoise(3).randn((1, 4, 8, 8)))  # toy VAE: f = 2
        sigma0 = get_sigmas("discrete", 4, sd.schedule, "sd1")[0]
        noise = PhiloxNoise(3).randn((1, 4, 8, 8)) + init / np.float32(sigma0)
        lat2: list[np.ndarray] = []
        b = sd.txt2img(p, on_step=lambda i, n, x: lat2.append(x), noise=noise)[0]
        plain = sd.txt2img(p)[0]
    # the two starts, init + sigma_0 noise and sigma_0 (noise + init / sigma_0), differ by f32
    # rounding (an ulp); layers small enough for ggml's products round activations to f16, where
    # such a difference can flip one f16 rounding (2^-11 relative) that four steps then carry
    np.testing.assert_allclose(lat[-1], lat2[-1], rtol=0, atol=5e-3 * np.abs(lat2[-1]).max())
    assert np.abs(a.astype(int) - b.astype(int)).max() <= 1
    assert not np.array_equal(a, plain)  # sd-cli's start keeps the init latent at sigma_max


@needs_graph
def test_flux_strength_1_equals_txt2img_and_masks_keep_the_init_latent() -> None:
    from flux_util import AE, AXES, CLIP, DEV, T5
    from sdplan.core.pipelines.flux.pipeline import FluxModels, FluxPipeline
    from sdplan.core.sampling.noise import PhiloxNoise

    img = np.random.default_rng(1).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)  # the toy AE: f = 2
    kw = dict(steps=4, t5_length=16, seed=7)
    with FluxPipeline(FluxModels(DEV, T5, CLIP, AE, axes=AXES, clip_heads=2), n_threads=2) as pipe:
        txt = pipe.txt2img("a photo of a cat", 64, 64, **kw)
        one = pipe.txt2img("a photo of a cat", 64, 64, init=ImageInput(img, None, 1.0), **kw)
        mask = np.zeros((1, 1, 16, 16), np.float32)
        mask[..., 8:, :] = 1  # repaint the bottom half
        half = pipe.txt2img("a photo of a cat", 64, 64, init=ImageInput(img, mask, 0.75), **kw)
        zero = pipe.txt2img("a photo of a cat", 64, 64, init=ImageInput(img, None, 0.0), **kw)
        ref = pipe.encode_sample(img, PhiloxNoise(7).randn((1, 16, 8, 8)))
    np.testing.assert_array_equal(one["image"], txt["image"])
    assert len(half["sigmas"]) == 5 and len(zero["sigmas"]) == 2  # t_enc 3 (all 4 steps) and 0 (1 step)
    np.testing.assert_allclose(half["latent"][:, :, :4], ref[:, :, :4], atol=1e-5)  # unmasked: the init
    assert np.abs(half["latent"][:, :, 4:] - ref[:, :, 4:]).mean() > 0.1
    # strength 0: one Euler step from the smallest sigma
    s = float(zero["sigmas"][0])
    assert np.abs(zero["latent"] - ref).max() < 3 * s * (np.abs(ref).max() + 4)


def joined_inpaint_model(tmp_path: Path) -> Path:
    from safetensors.numpy import load_file, save_file

    base = load_file(str(FIX / "sd1_tiny.safetensors"))
    unet = load_file(str(FIX / "sd1_inpaint_unet.safetensors"))
    out = {k: v for k, v in base.items() if not k.startswith("model.diffusion_model.")}
    out.update(unet)
    path = tmp_path / "sd1_inpaint.safetensors"
    save_file(out, str(path), metadata={"sdplan.clip_heads": "2", "sdplan.family": "sd1"})
    return path


@needs_graph
def test_inpainting_checkpoint_takes_mask_and_masked_latent(tmp_path: Path) -> None:
    from flux_util import rel_err
    from safetensors.numpy import load_file
    from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion

    ref = load_file(str(FIX / "lora_ref.safetensors"))
    sref = load_file(str(FIX / "sd1_ref.safetensors"))
    with StableDiffusion(joined_inpaint_model(tmp_path), n_threads=2) as sd:
        assert sd.inpaint and sd.unet_cfg.in_channels == 9
        with sd.unet_session() as unet:
            out = unet(ref["inpaint_unet_x"], sref["unet_t"], sref["clip_last_hidden_state"])
        assert rel_err(out, ref["inpaint_unet_out"]) < 1e-2
        img = np.random.default_rng(2).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)
        mask = np.zeros((1, 1, 16, 16), np.float32)
        mask[..., :, :4] = 1  # the left quarter (latent columns 0, 1 of 8)
        seen: list[np.ndarray] = []
        plain_unet = sd.unet_session

        def spy():  # record the UNet inputs
            import contextlib

            @contextlib.contextmanager
            def cm():
                with plain_unet() as run:
                    yield lambda x, t, c: (seen.append(x.copy()), run(x, t, c))[1]
            return cm()

        sd.unet_session = spy  # type: ignore[method-assign]
        lat: list[np.ndarray] = []
        sd.txt2img(GenerateParams("a photo of a cat", "", 16, 16, 4, 7.0, 3, "euler", "discrete"),
                   on_step=lambda i, n, x: lat.append(x), init=ImageInput(img, mask, 1.0))
        from sdplan.core.sampling.noise import PhiloxNoise

        init = sd.encode_sample(img, PhiloxNoise(3).randn((1, 4, 8, 8)))
    x = seen[0]
    assert x.shape == (2, 9, 8, 8)  # CFG halves, [latent, mask, masked image latent] (toy VAE: f = 2)
    want = np.zeros((8, 8), np.float32)
    want[:, :2] = 1
    np.testing.assert_array_equal(x[:, 4], np.stack([want, want]))
    assert np.abs(x[0, 5:]).max() > 0 and np.array_equal(x[0, 4:], x[1, 4:])
    # the blend uses the 3x3-dilated mask (columns 0..2): columns 3.. end as the init latent
    np.testing.assert_allclose(lat[-1][..., 3:], init[..., 3:], atol=1e-5)
    assert np.abs(lat[-1][..., :2] - init[..., :2]).mean() > 0.05


@needs_graph
@pytest.mark.parametrize("family", ["flux", "chroma", "z_image", "sd3"])
def test_flux_family_image_start(tmp_path: Path, family: str) -> None:
    """FLUX.1, Chroma, Z-Image and SD3 share the FLUX.1-family base's image start: the first
    velocity call sees ``(1 - s0) init + s0 noise`` at the truncated schedule's first sigma;
    strength 1 is text-to-image bit for bit; a mask keeps the init latent where it is 0;
    strength 0 runs the one step from the smallest sigma, ending next to the init latent."""
    from sdplan.core.sampling.noise import PhiloxNoise

    img = np.random.default_rng(4).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float32)  # the toy AE: f = 2
    mask = np.zeros((1, 1, 16, 16), np.float32)
    mask[..., 8:, :] = 1  # repaint the bottom half
    kw: dict = dict(steps=4, seed=7)
    size = 64
    if family == "flux":
        from flux_util import AE, AXES, CLIP, DEV, T5
        from sdplan.core.pipelines.flux.pipeline import FluxModels, FluxPipeline

        pipe = FluxPipeline(FluxModels(DEV, T5, CLIP, AE, axes=AXES, clip_heads=2), n_threads=2)
        kw["t5_length"] = 16
    elif family == "chroma":
        from flux_util import AE, AXES, CHROMA, T5
        from sdplan.core.pipelines.chroma.pipeline import ChromaModels, ChromaPipeline

        pipe = ChromaPipeline(ChromaModels(CHROMA, T5, AE, axes=AXES), n_threads=2)
        kw.update(t5_length=16, cfg_scale=1.0)
    elif family == "sd3":
        from sd3_util import CLIP_G, CLIP_HEADS, CLIP_L, SD3, T5
        from sdplan.core.pipelines.sd3.pipeline import Sd3Pipeline

        pipe = Sd3Pipeline({"diffusion_model": [SD3], "clip_l": [CLIP_L], "clip_g": [CLIP_G], "t5xxl": [T5],
                            "vae": [SD3]}, n_threads=2, clip_heads=CLIP_HEADS)
        kw["cfg_scale"] = 1.0
        size = 16  # its toy autoencoder: f = 2
    else:
        from sdplan.core.pipelines.z_image.pipeline import ZImageModels, ZImagePipeline
        from zimage_util import AE as ZAE
        from zimage_util import DIT, write_qwen3

        pipe = ZImagePipeline(ZImageModels(DIT, write_qwen3(tmp_path / "qwen3.safetensors"), ZAE), n_threads=2)
    seen: list[np.ndarray] = []
    with pipe:
        txt = pipe.txt2img("a photo of a cat", size, size, **kw)
        one = pipe.txt2img("a photo of a cat", size, size, init=ImageInput(img, None, 1.0), **kw)
        half = pipe.txt2img("a photo of a cat", size, size, init=ImageInput(img, mask, 0.75), **kw)
        zero = pipe.txt2img("a photo of a cat", size, size, init=ImageInput(img, None, 0.0), **kw)
        plain = pipe.velocity
        pipe.velocity = lambda x, *a, **k: (seen.append(x.copy()), plain(x, *a, **k))[1]  # type: ignore[method-assign]
        mid = pipe.txt2img("a photo of a cat", size, size, init=ImageInput(img, None, 0.5), **kw)
        ref = pipe.encode_sample(img, PhiloxNoise(7).randn((1, 16, 8, 8)))
        if family == "sd3":  # the autoencoder's mean at SD3's scaling and shift, not FLUX.1's
            mean = pipe.runners["vae_encoder"].run({"image": img})["mean"]
            np.testing.assert_allclose(pipe.encode_sample(img, np.zeros((1, 16, 8, 8), np.float32)),
                                       (mean - np.float32(0.0609)) * np.float32(1.5305), rtol=1e-5, atol=1e-6)
    s0 = np.float32(mid["sigmas"][0])
    assert len(mid["sigmas"]) == 4 and 0 < s0 < 1  # t_enc 2: three steps (sd-cli runs t_enc + 1)
    want = ref * (np.float32(1) - s0) + PhiloxNoise(7).randn((1, 16, 8, 8)) * s0
    np.testing.assert_allclose(seen[0], want, atol=1e-5)
    np.testing.assert_array_equal(one["image"], txt["image"])
    assert len(half["sigmas"]) == 5 and len(zero["sigmas"]) == 2
    np.testing.assert_allclose(half["latent"][:, :, :4], ref[:, :, :4], atol=1e-5)
    assert np.abs(half["latent"][:, :, 4:] - ref[:, :, 4:]).mean() > 0.1
    s = float(zero["sigmas"][0])
    assert np.abs(zero["latent"] - ref).max() < 3 * s * (np.abs(ref).max() + 4)
