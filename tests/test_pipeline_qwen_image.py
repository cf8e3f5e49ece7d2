"""Qwen-Image runs against diffusers' ``QwenImagePipeline`` (``make_qwen_image_fixtures.py``):
sd-cli's discrete flow sigmas (shift 3), the prompt's states, a 4-step run's latent and decoded
picture; Wan 2.1 previews; sd-cli's classifier-free guidance; image to image through the
autoencoder's mean; the DiT's and the encoder's blocks split over two backends with disk
residency; files that do not belong together refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import rel_err
from qwen_image_util import DIT, LLM, PROMPT, SIZE, VAE, ref

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.errors import SdplanError  # noqa: E402
from sdplan.core.models.qwen_image_vae import LATENT_MEAN, LATENT_STD  # noqa: E402
from sdplan.core.pipelines.qwen_image.pipeline import QwenImageModels, QwenImagePipeline  # noqa: E402
from sdplan.core.pipelines.stages.img2img import ImageInput  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement  # noqa: E402
from sdplan.core.sampling.flow import discrete_flow_sigmas  # noqa: E402
from sdplan.core.sampling.preview import latent_to_rgb  # noqa: E402

R = ref()
TOL = 5e-3
MODELS = QwenImageModels(DIT, LLM, VAE)
MEAN = np.asarray(LATENT_MEAN, np.float32).reshape(1, -1, 1, 1)
STD = np.asarray(LATENT_STD, np.float32).reshape(1, -1, 1, 1)


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


def run(pool, placements=None, **kw) -> dict:
    with QwenImagePipeline(MODELS, pool=pool, placements=placements, n_threads=1) as pipe:
        frames: list[np.ndarray] = []
        out = pipe.txt2img(PROMPT, SIZE, SIZE, noise=R["pipe.noise"], preview=lambda i, rgb: frames.append(rgb), **kw)
        out["context"] = pipe.encode_prompt(PROMPT)
        out["frames"] = frames
        out["memory"] = pipe.memory()
        return out


@pytest.fixture(scope="module")
def single(pool) -> dict:
    return run(pool, steps=4, cfg_scale=1.0)


def test_sigmas_are_sd_clis_discrete_flow_and_diffusers(single) -> None:
    np.testing.assert_allclose(single["sigmas"], R["pipe.sigmas"], atol=1e-6)
    np.testing.assert_allclose(single["sigmas"], discrete_flow_sigmas(4, 3.0))


def test_prompt_states_drop_the_template(single) -> None:
    assert single["context"].shape == R["llm.hidden"].shape == (1, 14, 16)
    assert rel_err(single["context"], R["llm.hidden"]) < 1e-3


def test_run_matches_diffusers_pipeline(single) -> None:
    assert single["latent"].shape == (1, 16, 8, 8) and single["image"].shape == (1, 3, SIZE, SIZE)
    assert rel_err(single["latent"], R["pipe.latent"]) < TOL
    assert rel_err(np.clip(single["image"], -1, 1), R["pipe.image"]) < TOL  # diffusers clamps its decode


def test_previews_are_the_wan_projection_of_each_step(single) -> None:
    frames = single["frames"]
    assert len(frames) == 4 and frames[0].shape == (8, 8, 3) and frames[0].dtype == np.uint8
    # euler's last step lands on the denoised latent: the last preview is the result's projection
    np.testing.assert_array_equal(frames[-1], latent_to_rgb(single["latent"], "wan21_vae"))
    assert not np.array_equal(frames[0], frames[-1])


def test_classifier_free_guidance_is_sd_clis(pool) -> None:
    """One euler step from sigma 1 lands on ``noise - v``, ``v = uncond + cfg (cond - uncond)``
    with the empty negative prompt (sd-cli's, without diffusers' norm rescale)."""
    with QwenImagePipeline(MODELS, pool=pool, n_threads=1) as pipe:
        out = pipe.txt2img(PROMPT, SIZE, SIZE, steps=1, cfg_scale=2.5, noise=R["pipe.noise"])
        x = R["pipe.noise"]
        cond = pipe.velocity(x, 1.0, pipe.encode_prompt(PROMPT))
        uncond = pipe.velocity(x, 1.0, pipe.encode_prompt(""))
    assert rel_err(out["latent"], x - (uncond + 2.5 * (cond - uncond))) < 1e-5
    assert rel_err(out["latent"], x - cond) > 0.05


def test_image_to_image_starts_from_the_autoencoders_mean(pool) -> None:
    with QwenImagePipeline(MODELS, pool=pool, n_threads=1) as pipe:
        z = pipe.encode_sample(R["vae.picture"], np.zeros((1, 16, 4, 6), np.float32))
        assert rel_err(z, (R["vae.mean"] - MEAN) / STD) < 1e-3  # the mean, normalised; no sample drawn
        picture = np.clip(R["pipe.image"], -1, 1)
        plain = pipe.txt2img(PROMPT, SIZE, SIZE, steps=4, cfg_scale=1.0, noise=R["pipe.noise"])
        a = pipe.txt2img(PROMPT, SIZE, SIZE, steps=4, cfg_scale=1.0, noise=R["pipe.noise"],
                         init=ImageInput(picture, None, 0.5))
        b = pipe.txt2img(PROMPT, SIZE, SIZE, steps=4, cfg_scale=1.0, noise=R["pipe.noise"],
                         init=ImageInput(picture, None, 0.9))
    assert len(a["sigmas"]) < len(b["sigmas"]) <= len(plain["sigmas"])
    assert rel_err(a["latent"], plain["latent"]) > 0.05 and rel_err(a["latent"], b["latent"]) > 0.01


def test_split_with_disk_residency_matches_one_device(single, pool) -> None:
    split = {"diffusion": (BlockRange("CPU", 0, 0), BlockRange("CPU1", 1, 1)),
             "te": (BlockRange("CPU", 0, 1), BlockRange("CPU1", 2, 2))}
    pl = {m: ModulePlacement(("CPU", "CPU1"), r, "disk") for m, r in split.items()}
    pl["vae"] = ModulePlacement(("CPU",))
    out = run(pool, pl, steps=4, cfg_scale=1.0)
    np.testing.assert_allclose(out["latent"], single["latent"], atol=1e-5)
    np.testing.assert_allclose(out["image"], single["image"], atol=1e-5)
    for runner in ("diffusion", "llm"):
        mem = out["memory"][runner]
        assert set(mem) == {"CPU", "CPU1"}
        assert all(m["peak"].weights > 0 for m in mem.values())


def test_files_that_do_not_belong_together(tmp_path) -> None:
    from flux_util import AE as FLUX_AE
    from zimage_util import write_qwen3

    qwen3 = write_qwen3(tmp_path / "qwen3_tiny.safetensors")  # Z-Image's width-32 encoder
    with pytest.raises(SdplanError, match="width 32 is not the Qwen-Image DiT's text width 16"):
        QwenImagePipeline(QwenImageModels(DIT, qwen3, VAE))
    with pytest.raises(SdplanError, match="no Wan autoencoder"):
        QwenImagePipeline(QwenImageModels(DIT, LLM, FLUX_AE))
    with QwenImagePipeline(MODELS, n_threads=1) as pipe:
        with pytest.raises(SdplanError, match="multiples of 16"):
            pipe.txt2img(PROMPT, 72, 64)
