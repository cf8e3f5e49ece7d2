"""The estimate for Wan 2.2 TI2V-5B image to video counts the autoencoder's encoder: the dry run's
``vae`` compute is the larger of the Wan 2.2 decoder's graph on the whole video and the encoder's
on the picture alone (they run at different times; the encoder's is counted, the decoder's is
the larger on the tiny autoencoder), the DiT's is its graph with a timestep per latent frame,
the ``vae`` weights are the file's (the engine loads both halves), and the estimate is within
10% of the peak the engine allocates over a CFG image-to-video generation of five frames, at
sizes where the video's graphs make the peak."""

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
FILES = {"diffusion_model": [str(FIXTURES / "wan_ti2v_tiny.safetensors")],
         "t5xxl": [str(FIXTURES / "umt5_tiny.safetensors")], "vae": [str(FIXTURES / "wan22_vae_tiny.safetensors")]}

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph (engine not built)", allow_module_level=True)


def engine_run(width: int, height: int, frames: int) -> tuple[int, dict[str, int], int]:
    """The CPU peak of an image-to-video generation (the runners in the order they run: the
    encoder, UMT5, the DiT, the decoder, each one's peak on top of the weights the earlier ones
    keep), each runner's compute bytes and the autoencoder's weight bytes held after it."""
    from sdplan.core.pipelines.wan.pipeline import WanModels, WanPipeline
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    models = WanModels(*(FILES[k][0] for k in ("diffusion_model", "t5xxl", "vae")))
    picture = np.tanh(np.random.default_rng(1).standard_normal((1, 3, height, width))).astype(np.float32)
    with BackendManager(1) as manager:
        pipe = WanPipeline(models, None, BackendPool(manager), n_threads=1)
        try:
            pipe.txt2vid("a lovely cat", width, height, frames, steps=2, cfg_scale=2.0, picture=picture)
            peak, computes = cpu_peak(pipe, ("vae_encode", "t5xxl", "diffusion", "vae"))
            held = sum(pipe.runners[m].memory()["CPU"].weights for m in ("vae_encode", "vae"))
        finally:
            pipe.close()
    return peak, computes, held


@pytest.mark.parametrize("width, height", [(384, 256), (256, 192)])
def test_estimate_matches_the_engine_peak(width: int, height: int) -> None:
    from sdplan.core.pipelines.compute import measure_compute

    prof = profile_from_model_flags(FILES)
    assert prof.architecture == "wan-ti2v_5b"
    plan = resolve(["--backend", "CPU"], CPU_INV, prof)
    measured = measure_compute(FILES, width=width, height=height, overrides={"video_frames": 5})
    fit = estimate_plan(plan, prof, CPU_INV, width=width, height=height, measured=measured)
    assert set(fit.compute_source.values()) == {"measured"}
    peak, computes, held = engine_run(width, height, 5)
    assert computes["vae_encode"] > 0  # the encoder ran and its graph is counted below
    assert fit.modules["vae"].compute["CPU"] == max(computes["vae_encode"], computes["vae"]) == measured["vae"]
    assert fit.modules["diffusion"].compute["CPU"] == computes["diffusion"]  # the per-frame graph
    assert 0 <= held - fit.modules["vae"].weights["CPU"] <= 0.001 * held  # the file's bytes, both halves
    estimate = fit.devices["CPU"].total
    assert 0.9 * peak <= estimate <= 1.1 * peak, (estimate, peak)
