"""The estimate for Qwen-Image is the engine's peak: the dry run of the engine's graphs (the
Qwen2.5-VL encoder on the template and 256 prompt tokens, the MMDiT on one latent with those
and with the empty negative prompt's tokens, both graphs held over the sampling loop, the Wan
2.1 decoder on one frame) plus the weights, against the peak the engine allocates over a CFG
generation of the tiny fixture, within 10%; the vision tower, which a run without reference
pictures does not load, is not counted (with ``-r`` it is)."""

from __future__ import annotations

import pytest
from engine_peak import cpu_peak
from qwen_image_util import DIT, LLM, PROMPT, VAE, files
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.plan import resolve

GIB = 1 << 30
CPU_INV = Inventory((Device("CPU", "host", "cpu", "CPU", 64 * GIB, 64 * GIB),))

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph (engine not built)", allow_module_level=True)


@pytest.mark.parametrize("size", [128, 256])
def test_estimate_matches_the_engine_peak(size: int) -> None:
    from sdplan.core.pipelines.compute import measure_compute
    from sdplan.core.pipelines.qwen_image.pipeline import QwenImageModels, QwenImagePipeline
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    prof = profile_from_model_flags(files())
    assert prof.architecture == "qwen_image"
    plan = resolve(["--backend", "CPU"], CPU_INV, prof)
    measured = measure_compute(files(), width=size, height=size)
    assert set(measured) == {"te", "diffusion", "vae"} and min(measured.values()) > 0
    fit = estimate_plan(plan, prof, CPU_INV, width=size, height=size, measured=measured)
    assert set(fit.compute_source.values()) == {"measured"}
    te = prof.modules["te"]
    assert fit.modules["te"].weights["CPU"] == te.total - te.encoders["llm_vision"]  # no reference picture
    with BackendManager(1) as manager:
        pipe = QwenImagePipeline(QwenImageModels(DIT, LLM, VAE), None, BackendPool(manager), n_threads=1)
        try:
            pipe.txt2img(PROMPT, size, size, steps=1, cfg_scale=2.5)
            peak, computes = cpu_peak(pipe, ("llm", "diffusion", "vae"))  # the order they run; weights stay resident
        finally:
            pipe.close()
    assert fit.modules["vae"].compute["CPU"] == computes["vae"]  # the same graph
    assert fit.modules["te"].compute["CPU"] >= computes["llm"]  # 256 prompt tokens measured, 14 run
    # the DiT's graphs of the prompt (measured at 256 tokens, 14 run) and of the empty negative
    # prompt, both held over the loop: where the image's tokens dominate, one graph's reserve
    # alone is below the engine's
    assert computes["diffusion"] <= fit.modules["diffusion"].compute["CPU"]
    if size == 256:
        assert measure_compute(files(), width=size, height=size, cfg=False)["diffusion"] < computes["diffusion"]
    estimate = fit.devices["CPU"].total
    assert 0.9 * peak <= estimate <= 1.1 * peak, (estimate, peak)


def test_reference_pictures_count_the_vision_tower() -> None:
    """With ``-r`` the engine loads the vision tower (runner ``llm_vision``, on the encoder's
    main device): the estimate then counts its bytes, which it leaves out otherwise."""
    prof = profile_from_model_flags(files())
    plan = resolve(["--backend", "CPU"], CPU_INV, prof)
    te = prof.modules["te"]
    assert te.encoders["llm_vision"] > 0
    without = estimate_plan(plan, prof, CPU_INV, width=128, height=128)
    with_refs = estimate_plan(plan, prof, CPU_INV, width=128, height=128, ref_images=1)
    assert with_refs.modules["te"].weights["CPU"] == te.total
    assert with_refs.modules["te"].weights["CPU"] - without.modules["te"].weights["CPU"] == te.encoders["llm_vision"]


def test_plan_command_counts_the_tower_for_reference_pictures(capsys) -> None:
    """``sdplan plan -r PATH`` counts the vision tower's bytes in ``te``'s weights (sdplan's
    engine loads it only for reference pictures); without it they are left out."""
    import json

    from sdplan.core import cli

    te = profile_from_model_flags(files()).modules["te"]
    flags = ["--diffusion-model", str(DIT), "--llm", str(LLM), "--vae", str(VAE), "-W", "64", "-H", "64",
             "--backend", "CPU", "--json"]
    weights = {}
    for key, extra in (("plain", []), ("one", ["-r", "a.png"]), ("two", ["-r", "a.png", "--ref-image", "b.png"])):
        assert cli.main(["plan", *flags, *extra]) == 0
        weights[key] = json.loads(capsys.readouterr().out)["fit"]["modules"]["te"]["weights"]["CPU"]
    assert weights["one"] - weights["plain"] == te.encoders["llm_vision"] > 0
    assert weights["two"] == weights["one"]  # one tower, whatever the number of pictures


def test_dry_run_of_an_edit_measures_its_graphs(tmp_path) -> None:
    """With a reference picture (``ref_count``: of the output's size) the dry run measures the Edit run's graphs: the
    vision tower and the longer Edit prompt (``te``), the DiT with the reference latent's tokens,
    the autoencoder's encoder beside its decoder; each at least what a 64 x 64 edit with a
    64 x 64 reference reserves in the engine."""
    import numpy as np
    from sdplan.core.pipelines.compute import measure_compute
    from sdplan.core.pipelines.qwen_image.pipeline import QwenImageModels, QwenImagePipeline
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    plain = measure_compute(files(), width=64, height=64, cfg=False)
    edit = measure_compute(files(), width=64, height=64, cfg=False, overrides={"ref_count": 1})
    assert all(edit[m] > plain[m] for m in ("te", "diffusion", "vae")), (plain, edit)
    from PIL import Image

    pic, big = tmp_path / "pic.png", tmp_path / "big.png"
    Image.new("RGB", (64, 64)).save(pic)
    Image.new("RGB", (1024, 1024)).save(big)
    # generate gives the pictures' paths: their headers' sizes (a larger picture: the tower
    # sees 560 x 560 instead of 392 x 392, the prompt carries 400 picture tokens instead of 196;
    # the reference latent keeps the output's area)
    assert measure_compute(files(), width=64, height=64, cfg=False, overrides={"ref_images": [str(pic)]}) == edit
    large = measure_compute(files(), width=64, height=64, cfg=False, overrides={"ref_images": [str(big)]})
    assert large["te"] > edit["te"] and large["diffusion"] > edit["diffusion"] and large["vae"] == edit["vae"]
    picture = np.random.default_rng(2).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    with BackendManager(1) as manager:
        pipe = QwenImagePipeline(QwenImageModels(DIT, LLM, VAE), None, BackendPool(manager), n_threads=1)
        try:
            pipe.txt2img("make it red", 64, 64, steps=1, cfg_scale=1.0, ref_images=[picture])
            ran = {m: pipe.runners[m].last_peak["CPU"].compute for m in ("llm_vision", "llm", "diffusion", "vae_encoder")}
        finally:
            pipe.close()
    assert ran["llm_vision"] + ran["llm"] <= edit["te"]  # the prompt: 3 words, measured with 256 tokens
    assert ran["diffusion"] <= edit["diffusion"]  # 256 prompt tokens measured beside the picture's
    assert ran["vae_encoder"] <= edit["vae"] - plain["vae"]
