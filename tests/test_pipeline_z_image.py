"""One 4-step Z-Image Turbo run (Qwen3 hidden_states[-2], sd-cli's discrete flow sigmas with
shift 3, euler) against diffusers' ZImagePipeline with the same sigmas and noise; the DiT's
and the encoder's blocks split over two backends with disk residency; a Q8_0 GGUF encoder
with its own tokenizer; classifier-free guidance."""

from __future__ import annotations

import numpy as np
import pytest
from sdplan.core.sampling.flow import discrete_flow_sigmas
from zimage_util import AE, DIT, PROMPT, ref, rel_err, write_qwen3

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.errors import SdplanError  # noqa: E402
from sdplan.core.pipelines.z_image.pipeline import ZImageModels, ZImagePipeline  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement  # noqa: E402

R = ref()
TOL = 3e-3


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    d = tmp_path_factory.mktemp("llm")
    return {"hf": write_qwen3(d / "qwen_3_tiny.safetensors"), "q8_0": write_qwen3(d / "qwen3-tiny-Q8_0.gguf", "gguf", "q8_0")}


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


def run(pool, llm_path, placements=None, **kw) -> dict:
    pipe = ZImagePipeline(ZImageModels(DIT, llm_path, AE), pool=pool, placements=placements, n_threads=1)
    try:
        frames: list[np.ndarray] = []
        out = pipe.txt2img(PROMPT, 16, 16, steps=4, noise=R["pipe.noise"], vae_scale=2,
                           preview=lambda i, rgb: frames.append(rgb), **kw)
        out["context"] = pipe.encode_prompt(PROMPT)
        out["frames"] = frames
        out["memory"] = pipe.memory()
        return out
    finally:
        pipe.close()


@pytest.fixture(scope="module")
def single(pool, llm) -> dict:
    return run(pool, llm["hf"])


def test_sigmas_are_sd_clis_and_diffusers(single) -> None:
    np.testing.assert_allclose(discrete_flow_sigmas(4), R["pipe.sigmas"], atol=1e-6)
    np.testing.assert_allclose(single["sigmas"], R["pipe.sigmas"], atol=1e-6)
    assert discrete_flow_sigmas(4)[0] == 1.0 and discrete_flow_sigmas(1).tolist() == [1.0, 0.0]


def test_turbo_run_matches_diffusers_pipeline(single) -> None:
    assert rel_err(single["context"], R["llm.hidden_m2"]) < TOL
    assert rel_err(single["latent"], R["pipe.latent"]) < TOL
    assert single["image"].shape == (1, 3, 16, 16) and np.isfinite(single["image"]).all()
    assert len(single["frames"]) == 4 and single["frames"][0].dtype == np.uint8


def test_split_with_disk_residency_matches_one_device(single, pool, llm) -> None:
    split = {"diffusion": (BlockRange("CPU", 0, 1), BlockRange("CPU1", 2, 3)),
             # Z-Image reads the state after block 3 of 4: block index 3 is not loaded, so CPU1 holds 2
             "te": (BlockRange("CPU", 0, 1), BlockRange("CPU1", 2, 3))}
    pl = {m: ModulePlacement(("CPU", "CPU1"), r, "disk") for m, r in split.items()}
    out = run(pool, llm["hf"], pl)
    np.testing.assert_allclose(out["latent"], single["latent"], atol=1e-5)
    np.testing.assert_allclose(out["image"], single["image"], atol=1e-5)
    for runner in ("diffusion", "llm"):
        mem = out["memory"][runner]
        assert set(mem) == {"CPU", "CPU1"}
        assert all(m["peak"].weights > 0 for m in mem.values())


def test_q8_0_gguf_encoder_with_its_own_tokenizer(single, pool, llm) -> None:
    out = run(pool, llm["q8_0"])
    assert 0 < rel_err(out["context"], R["llm.hidden_m2"]) < 5e-2
    assert rel_err(out["latent"], R["pipe.latent"]) < 5e-2


def test_classifier_free_guidance(pool, llm) -> None:
    with ZImagePipeline(ZImageModels(DIT, llm["hf"], AE), pool=pool, n_threads=1) as pipe:
        noise = R["pipe.noise"]
        out = pipe.txt2img(PROMPT, 16, 16, steps=1, noise=noise, vae_scale=2, cfg_scale=3.0,
                           negative_prompt="blurry")
        v = pipe.velocity(noise, 1.0, pipe.encode_prompt(PROMPT))
        v0 = pipe.velocity(noise, 1.0, pipe.encode_prompt("blurry"))
        # one euler step from sigma 1 to 0: x0 = x - v with v = v0 + 3 (v - v0)
        np.testing.assert_allclose(out["latent"], noise - (v0 + 3.0 * (v - v0)), atol=1e-5)
        with pytest.raises(SdplanError, match="multiples of 4"):
            pipe.txt2img(PROMPT, 18, 16, vae_scale=2)
