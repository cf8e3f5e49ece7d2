"""The estimate for Wan 2.2 TI2V-5B is the engine's peak: the dry run measures the 48-channel DiT
on the latent video at 1/16 of the size and the Wan 2.2 decoder on the whole video (the
autoencoder's own scale and channels, not Wan 2.1's 8x and 16), the same graphs the engine then
allocates, and the total is within 10% of the engine's peak over a CFG generation of five
frames, at sizes where the video's graphs, not UMT5's 512 tokens, make the peak. The formula
(sd-cli's estimate, and sdplan's without a dry run) counts the 5B's latent cells at 1/16 of
the size and tiles its autoencoder at 16 pixels per latent pixel."""

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
FILES = {"diffusion_model": [str(FIXTURES / "wan_ti2v_tiny.safetensors")],
         "t5xxl": [str(FIXTURES / "umt5_tiny.safetensors")], "vae": [str(FIXTURES / "wan22_vae_tiny.safetensors")]}

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph (engine not built)", allow_module_level=True)


def engine_peak(width: int, height: int, frames: int) -> tuple[int, dict[str, int], tuple[int, ...]]:
    """The CPU peak of a generation: each module's peak on top of the weights the earlier ones
    keep (UMT5, the DiT, the decoder), each module's compute bytes and the latent's shape."""
    from sdplan.core.pipelines.wan.pipeline import WanModels, WanPipeline
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    models = WanModels(*(FILES[k][0] for k in ("diffusion_model", "t5xxl", "vae")))
    with BackendManager(1) as manager:
        pipe = WanPipeline(models, None, BackendPool(manager), n_threads=1)
        try:
            out = pipe.txt2vid("a lovely cat", width, height, frames, steps=2, cfg_scale=2.0)
            peak, computes = cpu_peak(pipe, ("t5xxl", "diffusion", "vae"))
        finally:
            pipe.close()
    return peak, computes, out["latent"].shape


def test_estimate_matches_the_engine_peak() -> None:
    from sdplan.core.pipelines.compute import measure_compute

    width, height = 384, 256
    prof = profile_from_model_flags(FILES)
    assert prof.architecture == "wan-ti2v_5b"
    plan = resolve(["--backend", "CPU"], CPU_INV, prof)
    measured = measure_compute(FILES, width=width, height=height, overrides={"video_frames": 5})
    assert set(measured) == {"te", "diffusion", "vae"} and min(measured.values()) > 0
    fit = estimate_plan(plan, prof, CPU_INV, width=width, height=height, measured=measured)
    assert set(fit.compute_source.values()) == {"measured"}
    peak, computes, latent = engine_peak(width, height, 5)
    assert latent == (1, 48, 2, 16, 24)
    assert fit.modules["vae"].compute["CPU"] == computes["vae"]  # the same graph
    assert fit.modules["diffusion"].compute["CPU"] == computes["diffusion"]
    estimate = fit.devices["CPU"].total
    assert 0.9 * peak <= estimate <= 1.1 * peak, (estimate, peak)


def test_formula_counts_the_5b_latent_at_one_sixteenth() -> None:
    """1280x704 and 121 frames (the 5B's published size): 44x80 latent cells in 2x2 patches over
    31 latent frames, 27280 video tokens beside 512 text tokens (Wan 2.2 ``vae_stride`` (4, 16,
    16), ``patch_size`` (1, 2, 2)); a Wan 2.1 model at the same size has 4x the cells."""
    from sdplan.core.planning.estimate import _F32, _K, compute_bytes
    from sdplan.core.planning.profile import ModuleProfile
    from sdplan.core.planning.vae_tiling import vae_scale_factor

    mp = ModuleProfile(other=1)
    tokens = 44 * 80 // 4 * 31 + 512
    want = _F32 * (24 * tokens * tokens + _K * tokens * 4 * 3072)
    assert compute_bytes("diffusion", mp, "wan-ti2v_5b", width=1280, height=704, batch=1, frames=121) == want
    t2v = 88 * 160 // 4 * 31 + 512
    assert compute_bytes("diffusion", mp, "wan-t2v_a14b", width=1280, height=704, batch=1, frames=121) == \
        _F32 * (40 * t2v * t2v + _K * t2v * 4 * 5120)
    assert (vae_scale_factor("wan-ti2v_5b"), vae_scale_factor("wan-t2v_a14b")) == (16, 8)
