"""The plan's ``te`` is the LLM encoder the engine really loads: on the tiny fixtures of FLUX.2
klein (a Qwen3 of more blocks than the 27 it reads), Z-Image (the state after all blocks but the
last) and FLUX.2 dev (a Mistral of more layers than the 30 it reads), the profile's ``te`` bytes
equal the bytes the engine's LLM runner allocated for its weights over a generation, its blocks
the blocks that ran; for FLUX.2 dev, whose compute figures come from a dry run of the engine's
graphs, the whole estimate is the engine's peak within 10% (klein and Z-Image have no dry run:
their compute is the published models' formula, far above a tiny fixture's, so only their
weights are compared here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_peak import cpu_peak
from sdplan.core.families import family
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags, read_model_files
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.plan import resolve

GIB = 1 << 30
CPU_INV = Inventory((Device("CPU", "host", "cpu", "CPU", 64 * GIB, 64 * GIB),))

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph (engine not built)", allow_module_level=True)


def _klein(tmp: Path):
    import flux2_util as u
    from sdplan.core.pipelines.flux2.pipeline import KleinModels, KleinPipeline

    llm = u.write_llm(tmp / "qwen3_tiny.safetensors")
    return "flux2_klein", {"diffusion_model": [str(u.DIT)], "llm": [str(llm)], "vae": [str(u.AE)]}, \
        lambda pool: KleinPipeline(KleinModels(u.DIT, llm, u.AE), pool=pool, n_threads=1), u.PROMPT


def _z_image(tmp: Path):
    import zimage_util as u
    from sdplan.core.pipelines.z_image.pipeline import ZImageModels, ZImagePipeline

    llm = u.write_qwen3(tmp / "qwen3_tiny.safetensors")
    return "z_image", {"diffusion_model": [str(u.DIT)], "llm": [str(llm)], "vae": [str(u.AE)]}, \
        lambda pool: ZImagePipeline(ZImageModels(u.DIT, llm, u.AE), pool=pool, n_threads=1), u.PROMPT


def _dev(tmp: Path):
    import flux2_dev_util as u
    from sdplan.core.pipelines.flux2_dev.pipeline import DevModels, DevPipeline

    llm = u.write_llm(tmp / "mistral_tiny.safetensors")
    return "flux2", {"diffusion_model": [str(u.DIT)], "llm": [str(llm)], "vae": [str(u.AE)]}, \
        lambda pool: DevPipeline(DevModels(u.DIT, llm, u.AE), None, pool, n_threads=1), u.PROMPT


@pytest.mark.parametrize("case", [_klein, _z_image, _dev], ids=["klein", "z_image", "flux2_dev"])
def test_te_is_what_the_engine_loads(case, tmp_path: Path) -> None:
    from sdplan.core.pipelines.compute import measure_compute
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    name, files, make, prompt = case(tmp_path)
    ms = read_model_files(files)
    assert ms.architecture.family == name
    llm = [t for t in ms.module_tensors("te") if t.encoder == "llm"]
    n = 1 + max(t.block[1] for t in llm if t.block is not None)
    read = family(name).llm_blocks_read(n)
    assert read < n  # the fixture has blocks the family never reads
    prof = profile_from_model_flags(files)
    te = prof.modules["te"]
    # the read blocks and the token embedding: no later block, no final norm, no output head
    used = [t for t in llm if (t.block is not None and t.block[1] < read) or t.info.name.endswith("embed_tokens.weight")]
    assert len(te.blocks) == read and te.total == sum(t.info.nbytes for t in used) < sum(t.info.nbytes for t in llm)
    plan = resolve(["--backend", "CPU"], CPU_INV, prof)
    measured = measure_compute(files, width=128, height=128) if family(name).dry_run else None
    fit = estimate_plan(plan, prof, CPU_INV, width=128, height=128, measured=measured)
    with BackendManager(1) as manager:
        pipe = make(BackendPool(manager))
        try:
            pipe.txt2img(prompt, 128, 128, steps=1)
            loaded = pipe.runners["llm"].memory()["CPU"].weights
            peak, _ = cpu_peak(pipe, ("llm", "diffusion", "vae"))
        finally:
            pipe.close()
    # the engine's weight buffers (f16 as the file) are the plan's te weights, within ggml's
    # alignment of each tensor (512 bytes at most per tensor)
    assert te.total <= loaded <= te.total + 512 * len(used), (te.total, loaded)
    assert fit.modules["te"].weights["CPU"] == te.total
    estimate = fit.devices["CPU"].total
    if measured is not None:  # the compute figures are the engine's own graphs
        assert 0.9 * peak <= estimate <= 1.1 * peak, (estimate, peak)
