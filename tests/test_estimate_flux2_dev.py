"""The estimate for FLUX.2 dev is the engine's peak: the dry run of the engine's graphs (the
Mistral on the template and 256 prompt tokens, the DiT on one latent with the 512 zero-padded
text rows, the FLUX.2 decoder on one latent) plus the weights, against the peak the engine
allocates over a generation of the tiny fixture, within 10%."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_peak import cpu_peak
from flux2_dev_util import AE, DIT, PROMPT, write_llm
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.plan import resolve

GIB = 1 << 30
CPU_INV = Inventory((Device("CPU", "host", "cpu", "CPU", 64 * GIB, 64 * GIB),))

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph (engine not built)", allow_module_level=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> Path:
    return write_llm(tmp_path_factory.mktemp("mistral") / "mistral_tiny.safetensors")


@pytest.mark.parametrize("size", [128, 256])
def test_estimate_matches_the_engine_peak(size: int, llm: Path) -> None:
    from sdplan.core.pipelines.compute import measure_compute
    from sdplan.core.pipelines.flux2_dev.pipeline import DevModels, DevPipeline
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    files = {"diffusion_model": [str(DIT)], "llm": [str(llm)], "vae": [str(AE)]}
    prof = profile_from_model_flags(files)
    assert prof.architecture == "flux2-dev"
    plan = resolve(["--backend", "CPU"], CPU_INV, prof)
    measured = measure_compute(files, width=size, height=size)
    assert set(measured) == {"te", "diffusion", "vae"} and min(measured.values()) > 0
    fit = estimate_plan(plan, prof, CPU_INV, width=size, height=size, measured=measured)
    assert set(fit.compute_source.values()) == {"measured"}
    with BackendManager(1) as manager:
        pipe = DevPipeline(DevModels(DIT, llm, AE), None, BackendPool(manager), n_threads=1)
        try:
            pipe.txt2img(PROMPT, size, size, steps=1)
            peak, computes = cpu_peak(pipe, ("llm", "diffusion", "vae"))  # the order they run; weights stay resident
        finally:
            pipe.close()
    assert fit.modules["vae"].compute["CPU"] == computes["vae"]  # the same graph
    assert fit.modules["diffusion"].compute["CPU"] == computes["diffusion"]  # 512 text rows either way
    assert fit.modules["te"].compute["CPU"] >= computes["llm"]  # 256 prompt tokens measured, 9 run
    estimate = fit.devices["CPU"].total
    assert 0.9 * peak <= estimate <= 1.1 * peak, (estimate, peak)
