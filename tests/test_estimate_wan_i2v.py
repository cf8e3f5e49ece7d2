"""The estimate for Wan 2.2 I2V-A14B counts the autoencoder's encoder: the dry run's ``vae`` compute
is the larger of the decoder's graph and the encoder's on the whole condition video (they run at
different times; on the tiny autoencoder the decoder's is the larger by about 2%), the ``vae``
weights are the file's (the engine loads both halves), and the estimate (both experts resident)
is within 10% of the peak the engine allocates over a CFG image-to-video generation of five
frames with the tiny expert pair, at sizes where the video's graphs make the peak."""

from __future__ import annotations

import numpy as np
import pytest
from engine_peak import cpu_peak
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.plan import resolve
from sparse_writer import FIXTURES

GIB = 1 << 30
CPU_INV = Inventory((Device("CPU", "host", "cpu", "CPU", 64 * GIB, 64 * GIB),))
FILES = {"diffusion_model": [str(FIXTURES / "wan_i2v_tiny.safetensors")],
         "high_noise_diffusion_model": [str(FIXTURES / "wan_i2v_high_noise_tiny.safetensors")],
         "t5xxl": [str(FIXTURES / "umt5_tiny.safetensors")], "vae": [str(FIXTURES / "wan_vae_tiny.safetensors")]}

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph (engine not built)", allow_module_level=True)


def engine_peak(width: int, height: int, frames: int) -> tuple[int, dict[str, int]]:
    """The CPU peak of an image-to-video generation: the runners in the order they run (the
    encoder, UMT5, both experts' phases, the decoder), each one's peak on top of the weights the
    earlier ones keep."""
    from sdplan.core.pipelines.wan.pipeline import HighNoise, WanModels, WanPipeline
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    models = WanModels(*(FILES[k][0] for k in ("diffusion_model", "t5xxl", "vae", "high_noise_diffusion_model")))
    picture = np.tanh(np.random.default_rng(1).standard_normal((1, 3, height, width))).astype(np.float32)
    with BackendManager(1) as manager:
        pipe = WanPipeline(models, None, BackendPool(manager), n_threads=1, keep_both=True)
        try:
            pipe.txt2vid("a lovely cat", width, height, frames, steps=4, cfg_scale=2.0, high=HighNoise(cfg_scale=3.5),
                         picture=picture)
            peak, computes = cpu_peak(pipe, ("vae_encode", "t5xxl", "diffusion_high", "diffusion", "vae"))
        finally:
            pipe.close()
    return peak, computes


def held_vae(width: int, height: int) -> int:
    """Bytes the engine holds for the autoencoder after an image-to-video run (both halves)."""
    from sdplan.core.pipelines.wan.pipeline import WanModels, WanPipeline

    models = WanModels(*(FILES[k][0] for k in ("diffusion_model", "t5xxl", "vae", "high_noise_diffusion_model")))
    with WanPipeline(models, n_threads=1) as pipe:
        pic = np.zeros((1, 3, height, width), np.float32)
        pipe.encode_condition(pic, 1)
        pipe.decode_video(np.zeros((1, 16, 1, height // 8, width // 8), np.float32))
        return sum(pipe.runners[m].memory()["CPU"].weights for m in ("vae_encode", "vae"))


@pytest.mark.parametrize("width, height", [(192, 128), (256, 160)])
def test_estimate_matches_the_engine_peak(width: int, height: int) -> None:
    from sdplan.core.pipelines.compute import measure_compute

    prof = profile_from_model_flags(FILES)
    assert prof.architecture == "wan-i2v_a14b" and "high_noise" in prof.phases
    plan = resolve(["--backend", "CPU"], CPU_INV, prof)
    measured = measure_compute(FILES, width=width, height=height, overrides={"video_frames": 5})
    fit = estimate_plan(plan, prof, CPU_INV, width=width, height=height, measured=measured)
    d = fit.modules["diffusion"]
    assert d.phase_residency == "both" and set(fit.compute_source.values()) == {"measured"}
    peak, computes = engine_peak(width, height, 5)
    assert fit.modules["vae"].compute["CPU"] == max(computes["vae_encode"], computes["vae"]) == measured["vae"]
    assert 0.9 * computes["vae"] < computes["vae_encode"]  # a graph of the same order, counted
    held = held_vae(width, height)  # the file's bytes plus the buffers' alignment
    assert 0 <= held - fit.modules["vae"].weights["CPU"] <= 0.001 * held
    assert d.compute["CPU"] == computes["diffusion"] == computes["diffusion_high"]
    estimate = fit.devices["CPU"].total
    assert 0.9 * peak <= estimate <= 1.1 * peak, (estimate, peak)
