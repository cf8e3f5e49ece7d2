"""One SD3.5-medium-like run (CLIP-L + CLIP-G + T5 conditioning, CFG with the empty negative
prompt, 4 euler steps over sd-cli's discrete flow sigmas with shift 3, the 16-channel
autoencoder) against diffusers' ``StableDiffusion3Pipeline``: separate files and the single
file with its encoders, one device and a layer split with disk residency."""

from __future__ import annotations

import numpy as np
import pytest
from sd3_util import CLIP_G, CLIP_HEADS, CLIP_L, PROMPT, SD3, T5, ref, rel_err, write_single_file

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.pipelines.sd3.pipeline import Sd3Pipeline  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement  # noqa: E402
from sdplan.core.sampling.flow import discrete_flow_sigmas  # noqa: E402
from sdplan.core.sampling.options import SamplingOptions  # noqa: E402

R = ref()
FILES = {"diffusion_model": [SD3], "clip_l": [CLIP_L], "clip_g": [CLIP_G], "t5xxl": [T5], "vae": [SD3]}
TOL = 5e-3


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


def run(pool, files=FILES, placements=None) -> dict[str, np.ndarray]:
    with Sd3Pipeline(files, pool=pool, placements=placements, n_threads=1, clip_heads=CLIP_HEADS) as pipe:
        ctx, pooled = pipe.encode_prompt(PROMPT)
        assert rel_err(ctx, R["context_cond"]) < TOL
        assert rel_err(pooled, R["pooled_cond"]) < TOL
        nctx, npooled = pipe.encode_prompt("")
        assert rel_err(nctx, R["context_uncond"]) < TOL and rel_err(npooled, R["pooled_uncond"]) < TOL
        frames: list[np.ndarray] = []
        # diffusers' own sigmas (--sigmas): its scheduler shifts sigma_min twice (see below)
        out = pipe.txt2img(PROMPT, 16, 16, steps=4, cfg_scale=4.5, noise=R["run_noise"],
                           preview=lambda i, rgb: frames.append(rgb),
                           sampling=SamplingOptions(sigmas=tuple(float(s) for s in R["run_sigmas"][:-1])))
        assert len(frames) == 4 and frames[0].dtype == np.uint8
        out["memory"] = pipe.memory()  # type: ignore[assignment]
        return out


@pytest.fixture(scope="module")
def single(pool) -> dict[str, np.ndarray]:
    return run(pool)


def test_default_sigmas_are_sd_clis_and_differ_from_diffusers_at_the_end(pool) -> None:
    """sd-cli: ``shift((t + 1) / 1000)`` for t = 999..0; diffusers' FlowMatchEulerDiscreteScheduler
    spaces shift(1)..shift(0.001) linearly and shifts again, so only its first sigmas agree."""
    s = discrete_flow_sigmas(4, 3.0)
    t = (np.array([999, 666, 333, 0]) + 1) / 1000
    np.testing.assert_allclose(s[:-1], 3 * t / (1 + 2 * t), rtol=1e-6)
    np.testing.assert_allclose(s[:3], R["run_sigmas"][:3], atol=2e-3)
    with Sd3Pipeline(FILES, pool=pool, n_threads=1, clip_heads=CLIP_HEADS) as pipe:
        out = pipe.txt2img(PROMPT, 16, 16, steps=4, cfg_scale=1.0, noise=R["run_noise"])
    np.testing.assert_array_equal(out["sigmas"], s)


def test_separate_files_match_diffusers(single) -> None:
    np.testing.assert_allclose(single["sigmas"], R["run_sigmas"], atol=1e-6)
    assert rel_err(single["latent"], R["run_latent"]) < TOL
    assert rel_err(single["image"], R["run_image"]) < TOL


def test_single_file_with_encoders_matches(single, pool, tmp_path) -> None:
    out = run(pool, {"model": [write_single_file(tmp_path / "sd3_all.safetensors")]})
    np.testing.assert_allclose(out["latent"], single["latent"], atol=1e-6)


def test_split_with_disk_residency_matches_one_device(single, pool) -> None:
    split = {"diffusion": (BlockRange("CPU", 0, 0), BlockRange("CPU1", 1, 2)),
             "te": (BlockRange("CPU", 0, 0), BlockRange("CPU1", 1, 1))}
    out = run(pool, placements={m: ModulePlacement(("CPU", "CPU1"), r, "disk") for m, r in split.items()})
    np.testing.assert_allclose(out["latent"], single["latent"], atol=1e-5)
    for runner in ("diffusion", "t5xxl"):
        assert set(out["memory"][runner]) == {"CPU", "CPU1"}


def test_missing_clip_g_is_a_clear_error(pool) -> None:
    from sdplan.core.errors import ModelFileError

    with pytest.raises(ModelFileError, match="--clip_g"):
        Sd3Pipeline({k: v for k, v in FILES.items() if k != "clip_g"}, pool=pool)


def test_skip_layer_guidance_matches_diffusers(pool, single) -> None:
    """sd-cli's SLG (--slg-scale 2.5 --skip-layers [1] --skip-layer-start 0.2 --skip-layer-end 0.8:
    steps 1 and 2 of 4 run a third pass with block 1 skipped) against diffusers'
    ``skip_guidance_layers=[1]`` over the same steps; the skip pass runs on the loaded weights."""
    import json

    from sd3_util import FIX
    from sdplan.core.errors import InvalidArgument
    from sdplan.core.sampling.slg import SkipLayerGuidance

    cfg = json.loads((FIX / "sd3_fixture_config.json").read_text())["slg"]
    slg = SkipLayerGuidance(cfg["scale"], tuple(cfg["layers"]), cfg["start"], cfg["end"])
    assert [i for i in range(4) if slg.active(i, 4)] == [1, 2]
    sigmas = SamplingOptions(sigmas=tuple(float(s) for s in R["run_sigmas"][:-1]))
    with Sd3Pipeline(FILES, pool=pool, n_threads=1, clip_heads=CLIP_HEADS) as pipe:
        out = pipe.txt2img(PROMPT, 16, 16, steps=4, cfg_scale=4.5, noise=R["run_noise"], sampling=sigmas, slg=slg)
        weights = pipe.runners["diffusion"].memory()["CPU"].weights
        assert rel_err(out["latent"], R["run_slg_latent"]) < TOL
        assert rel_err(single["latent"], R["run_slg_latent"]) > 5 * TOL  # SLG changes the picture (2.9%)
        # off (scale 0) is the plain run; the skip pass added no weights
        off = pipe.txt2img(PROMPT, 16, 16, steps=4, cfg_scale=4.5, noise=R["run_noise"], sampling=sigmas,
                           slg=SkipLayerGuidance(0.0, (1,)))
        np.testing.assert_allclose(off["latent"], single["latent"], atol=1e-6)
        assert weights == single["memory"]["diffusion"]["CPU"]["now"].weights
        with pytest.raises(InvalidArgument, match="skip-layers.*outside the MMDiT's blocks 0..2"):
            pipe.txt2img(PROMPT, 16, 16, steps=4, slg=SkipLayerGuidance(2.5))  # sd-cli's default [7,8,9]
