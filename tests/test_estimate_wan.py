"""The estimate for Wan is the engine's peak: the dry run of the engine's graphs (UMT5 on 512
masked tokens, the DiT on the latent video with 512 text tokens, the Wan 2.1 decoder on the
whole video) plus the weights of both experts (they stay: both fit the CPU), against the peak
the engine allocates over a CFG generation of five frames with the tiny expert pair, within
10%, at sizes where the video's graphs, not UMT5's 512 tokens, make the peak (the engine loads
each module's weights when it first runs, so a peak made by the encoder, which runs first, sits
below the estimate by the weights loaded after it); and with the switch (one expert at a time)
the estimate drops by the high-noise expert's weights as the engine's peak does."""

from __future__ import annotations

import pytest
from engine_peak import cpu_peak
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.plan import resolve
from sparse_writer import FIXTURES

GIB = 1 << 30
CPU_INV = Inventory((Device("CPU", "host", "cpu", "CPU", 64 * GIB, 64 * GIB),))
FILES = {"diffusion_model": [str(FIXTURES / "wan_tiny.safetensors")],
         "high_noise_diffusion_model": [str(FIXTURES / "wan_high_noise_tiny.safetensors")],
         "t5xxl": [str(FIXTURES / "umt5_tiny.safetensors")], "vae": [str(FIXTURES / "wan_vae_tiny.safetensors")]}

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph (engine not built)", allow_module_level=True)


def engine_peak(keep_both: bool, width: int, height: int, frames: int) -> tuple[int, dict[str, int]]:
    """The CPU peak of a generation: the modules in the order they run, each one's peak on top of
    the weights the earlier ones keep (UMT5, then both experts' phases, then the decoder)."""
    from sdplan.core.pipelines.wan.pipeline import HighNoise, WanModels, WanPipeline
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    models = WanModels(*(FILES[k][0] for k in ("diffusion_model", "t5xxl", "vae", "high_noise_diffusion_model")))
    with BackendManager(1) as manager:
        pipe = WanPipeline(models, None, BackendPool(manager), n_threads=1, keep_both=keep_both)
        try:
            pipe.txt2vid("a lovely cat", width, height, frames, steps=4, cfg_scale=2.0, high=HighNoise(cfg_scale=3.5))
            peak, computes = cpu_peak(pipe, ("t5xxl", "diffusion_high", "diffusion", "vae"), None if keep_both else ("t5xxl", "vae"))
        finally:
            pipe.close()
    return peak, computes


@pytest.mark.parametrize("width, height", [(192, 128), (256, 160)])
def test_estimate_matches_the_engine_peak(width: int, height: int) -> None:
    from sdplan.core.pipelines.compute import measure_compute

    prof = profile_from_model_flags(FILES)
    assert prof.architecture == "wan-t2v_a14b" and "high_noise" in prof.phases
    plan = resolve(["--backend", "CPU"], CPU_INV, prof)
    measured = measure_compute(FILES, width=width, height=height, overrides={"video_frames": 5})
    assert set(measured) == {"te", "diffusion", "vae"} and min(measured.values()) > 0
    fit = estimate_plan(plan, prof, CPU_INV, width=width, height=height, measured=measured)
    d = fit.modules["diffusion"]
    assert d.phase_residency == "both" and set(fit.compute_source.values()) == {"measured"}
    assert d.weights["CPU"] == prof.modules["diffusion"].total + prof.phases["high_noise"].total
    peak, computes = engine_peak(True, width, height, 5)
    assert fit.modules["vae"].compute["CPU"] == computes["vae"]  # the same graph
    assert d.compute["CPU"] == computes["diffusion"] == computes["diffusion_high"]
    estimate = fit.devices["CPU"].total
    assert 0.9 * peak <= estimate <= 1.1 * peak, (estimate, peak)


def test_the_switch_drops_one_expert() -> None:
    """An inventory too small for both experts beside the rest: the estimate switches, and the
    engine loading each expert for its phase only peaks by about as much less."""
    from sdplan.core.pipelines.compute import measure_compute

    prof = profile_from_model_flags(FILES)
    measured = measure_compute(FILES, width=192, height=128, overrides={"video_frames": 5})
    full = estimate_plan(resolve(["--backend", "CPU"], CPU_INV, prof), prof, CPU_INV, width=192, height=128,
                         measured=measured)
    tight = Inventory((Device("CPU", "host", "cpu", "CPU", full.devices["CPU"].total - 1, 64 * GIB),))
    fit = estimate_plan(resolve(["--backend", "CPU"], tight, prof), prof, tight, width=192, height=128,
                        measured=measured)
    assert fit.modules["diffusion"].phase_residency == "switch" and fit.modules["diffusion"].weights == {}
    # each expert loaded for its phase only: at the decoder's peak neither is there
    experts = prof.phases["high_noise"].total + prof.modules["diffusion"].total
    assert full.devices["CPU"].total - fit.devices["CPU"].total == experts
    both, _ = engine_peak(True, 192, 128, 5)
    one, _ = engine_peak(False, 192, 128, 5)
    assert abs((both - one) - experts) <= 0.1 * experts
    assert 0.9 * one <= fit.devices["CPU"].total <= 1.1 * one
