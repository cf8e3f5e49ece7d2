"""FLUX.2 klein runs against diffusers' ``Flux2KleinPipeline`` (``make_flux2_fixtures.py``):
the Qwen3 states klein takes (blocks 9, 18, 27 under sd-cli's 512-token padding), a 4-step
distilled run (FLUX.2's empirical shift), classifier-free guidance, a reference-image edit,
the batch-norm decode; the DiT's and the encoder's blocks split over two backends with disk
residency; a Q8_0 GGUF encoder with its own tokenizer; sd-cli's reference-image sizing."""

from __future__ import annotations

import numpy as np
import pytest
from flux2_util import AE, DIT, PROMPT, SIZE, ref, write_llm
from flux_util import rel_err
from sdplan.core.sampling.flow import flux2_mu, flux_sigmas

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.errors import ModelFileError, SdplanError  # noqa: E402
from sdplan.core.models.flux2 import patchify_latent, unpatchify_latent  # noqa: E402
from sdplan.core.pipelines.flux2.pipeline import (  # noqa: E402
    KleinModels,
    KleinPipeline,
    ref_size,
    resize_nearest,
)
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement  # noqa: E402

R = ref()
TOL = 3e-3


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    d = tmp_path_factory.mktemp("llm")
    return {"hf": write_llm(d / "qwen_3_tiny.safetensors"), "q8_0": write_llm(d / "qwen3-tiny-Q8_0.gguf", "gguf", "q8_0")}


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


def pipe_of(pool, llm_path, placements=None) -> KleinPipeline:
    return KleinPipeline(KleinModels(DIT, llm_path, AE), pool=pool, placements=placements, n_threads=1)


def run(pool, llm_path, placements=None, **kw) -> dict:
    with pipe_of(pool, llm_path, placements) as pipe:
        frames: list[np.ndarray] = []
        out = pipe.txt2img(PROMPT, SIZE, SIZE, noise=R["pipe.noise"], vae_scale=2,
                           preview=lambda i, rgb: frames.append(rgb), **kw)
        out["vae_latent"] = pipe.to_vae(out["latent"])
        out["context"] = pipe.encode_prompt(PROMPT)
        out["frames"] = frames
        out["memory"] = pipe.memory()
        return out


@pytest.fixture(scope="module")
def single(pool, llm) -> dict:
    return run(pool, llm["hf"], steps=4)


def test_sigmas_are_flux2s_and_diffusers(single) -> None:
    np.testing.assert_allclose(single["sigmas"], R["pipe.sigmas"], atol=1e-6)
    # the empirical shift: linear in the steps below 4300 tokens, only in the tokens above
    assert flux2_mu(4096, 4) == pytest.approx(2.29118, abs=1e-5)  # 1024x1024, 4 steps (by hand)
    assert flux2_mu(5000, 4) == flux2_mu(5000, 50) == pytest.approx(0.00016927 * 5000 + 0.45666666)
    assert flux_sigmas(4, mu=flux2_mu(16, 4))[0] == 1.0


def test_prompt_states_are_klein_layers_under_the_padding_mask(single) -> None:
    assert single["context"].shape == R["llm.hidden"].shape == (1, 512, 48)
    assert rel_err(single["context"], R["llm.hidden"]) < TOL


def test_distilled_run_matches_diffusers_pipeline(single) -> None:
    assert single["latent"].shape == (1, 128, 4, 4)
    assert rel_err(single["vae_latent"], R["pipe.latent"]) < TOL
    assert rel_err(single["image"], R["pipe.image"]) < TOL
    assert len(single["frames"]) == 4 and single["frames"][0].shape == (8, 8, 3)  # 32-ch projection, 2x2 per cell


def test_classifier_free_guidance_matches_diffusers(pool, llm) -> None:
    out = run(pool, llm["hf"], steps=2, cfg_scale=3.0)
    assert rel_err(out["vae_latent"], R["cfg.latent"]) < TOL


def test_reference_image_edit_matches_diffusers(pool, llm) -> None:
    out = run(pool, llm["hf"], steps=2, ref_images=[R["edit.picture"]])
    err = rel_err(out["vae_latent"], R["edit.latent"])
    assert err < TOL
    assert rel_err(out["image"], R["edit.image"]) < TOL
    # the reference tokens matter (little, in a random model attending to 512 text tokens):
    # without them the run is several times further from diffusers' edit
    plain = run(pool, llm["hf"], steps=2)
    assert rel_err(plain["vae_latent"], R["edit.latent"]) > 3 * err


def test_split_with_disk_residency_matches_one_device(single, pool, llm) -> None:
    split = {"diffusion": (BlockRange("CPU", 0, 1), BlockRange("CPU1", 2, 3)),
             "te": (BlockRange("CPU", 0, 13), BlockRange("CPU1", 14, 27))}
    pl = {m: ModulePlacement(("CPU", "CPU1"), r, "disk") for m, r in split.items()}
    pl["vae"] = ModulePlacement(("CPU",))
    out = run(pool, llm["hf"], pl, steps=4)
    np.testing.assert_allclose(out["latent"], single["latent"], atol=1e-5)
    np.testing.assert_allclose(out["image"], single["image"], atol=1e-5)
    for runner in ("diffusion", "llm"):
        mem = out["memory"][runner]
        assert set(mem) == {"CPU", "CPU1"}
        assert all(m["peak"].weights > 0 for m in mem.values())


def test_q8_0_gguf_encoder_with_its_own_tokenizer(pool, llm) -> None:
    with pipe_of(pool, llm["q8_0"]) as pipe:
        context = pipe.encode_prompt(PROMPT)
    assert 0 < rel_err(context, R["llm.hidden"]) < 5e-2


def test_encode_decode_and_latent_layout(pool, llm) -> None:
    z = np.random.default_rng(0).standard_normal((1, 32, 6, 4)).astype(np.float32)
    x = patchify_latent(z)
    assert x.shape == (1, 128, 3, 2) and x[0, 4 * 5 + 2 * 1 + 0, 2, 1] == z[0, 5, 5, 2]
    np.testing.assert_array_equal(unpatchify_latent(x), z)
    with pipe_of(pool, llm["hf"]) as pipe:
        lat = pipe.encode_image(R["edit.picture"])
        assert lat.shape == (1, 128, 4, 4)
        np.testing.assert_allclose(pipe.to_vae(lat), unpatchify_latent(lat * pipe.bn_std + pipe.bn_mean))
        with pytest.raises(SdplanError, match="multiples of 4"):
            pipe.txt2img(PROMPT, 18, 16, vae_scale=2)
        with pytest.raises(SdplanError, match="reference image 1"):
            pipe.txt2img(PROMPT, 16, 16, vae_scale=2, ref_images=[np.zeros((16, 16), np.uint8)])
        with pytest.raises(SdplanError, match="--taesd"):
            pipe.txt2img(PROMPT, 16, 16, vae_scale=2, tae_decode=True)


def test_reference_image_size_is_sd_clis() -> None:
    assert ref_size(1024, 1024, 1024, 1024) == (1024, 1024)
    assert ref_size(512, 512, 1000, 500) == (720, 368)  # sqrt(262144 * 2) = 724.1 -> 720; 362 -> 368
    assert ref_size(2048, 2048, 3000, 2000) == (1248, 832)  # capped at 1024 * 1024 pixels
    assert ref_size(16, 16, 16, 16, factor=4) == (16, 16)
    img = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    small = resize_nearest(img, 3, 2)
    assert small.shape == (2, 3, 3) and small[1, 2].tolist() == img[2, 4].tolist()


def test_encoder_checks(tmp_path) -> None:
    from zimage_util import write_qwen3

    short = write_qwen3(tmp_path / "qwen3_4_blocks.safetensors")  # Z-Image's 4-block tiny encoder
    with pytest.raises(SdplanError, match=r"blocks \(9, 18, 27\); this encoder has 4 blocks"):
        KleinPipeline(KleinModels(DIT, short, AE))
    from flux_util import AE as FLUX1_AE
    from safetensors.numpy import save_file
    from test_models_tae import tae_weights

    llm = write_llm(tmp_path / "q.safetensors")
    with pytest.raises(ModelFileError, match="bn.running_mean"):
        KleinPipeline(KleinModels(DIT, llm, FLUX1_AE))
    taef1 = tmp_path / "taef1_decoder.safetensors"
    save_file(tae_weights(np.random.default_rng(0), "decoder", 16), str(taef1))
    with pytest.raises(ModelFileError, match="a taef1 decoder .16 latent channels.; FLUX.2 klein previews need TAEF2"):
        KleinPipeline(KleinModels(DIT, llm, AE, taef1))


def test_taef2_previews_and_tae_decode_with_the_real_weights(shared_dir, pool, llm) -> None:
    """The real TAEF2 decoder (``--taesd``) on a diffusion latent: sd-cli unpatchifies the
    128 normalised channels and decodes them; against the PyTorch reference decode."""
    from safetensors.numpy import load_file

    rt = load_file(str(shared_dir / "weights" / "reference" / "taef2_roundtrip.safetensors"))
    taesd = shared_dir / "weights" / "taef2_decoder.safetensors"
    latent = patchify_latent(rt["latent"])  # (1, 128, 16, 16)
    with KleinPipeline(KleinModels(DIT, llm["hf"], AE, taesd), pool=pool, n_threads=1) as pipe:
        rgb = pipe._preview_rgb(latent)
        expected = (np.clip(rt["decoded"][0].transpose(1, 2, 0), 0, 1) * 255).round()
        assert rgb.shape == (256, 256, 3) and rgb.dtype == np.uint8
        assert np.abs(rgb.astype(int) - expected).max() <= 2
        frames: list[np.ndarray] = []
        out = pipe.txt2img(PROMPT, SIZE, SIZE, steps=2, noise=R["pipe.noise"], vae_scale=2, tae_decode=True,
                           preview=lambda i, f: frames.append(f))
        # TAEF2 upsamples 8x per autoencoder cell; the tiny VAE only 2x
        assert out["image"].shape == (1, 3, 4 * SIZE, 4 * SIZE) and len(frames) == 2
        assert frames[-1].shape == (4 * SIZE, 4 * SIZE, 3)
