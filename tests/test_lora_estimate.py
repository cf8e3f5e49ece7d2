"""The plan's LoRA memory against what the engine allocates: Flux dev with two LoRAs, the DiT
split over two devices (``CPU1``/``CPU2``, extra CPU backends planned as GPUs).

- ``at_runtime``: the estimate's LoRA bytes per device, and its resident weights + LoRA bytes
  per device, each within 10% of the engine's buffers after a run (measured: LoRA within 1%,
  the alignment of each tensor in its buffer; weights + LoRA within 1%).
- ``immediately``: no LoRA bytes estimated nor allocated, weights unchanged.
- ``auto`` picks ``at_runtime`` for the split (sd-cli's rule).

Compute buffers are not compared: the estimate's compute formula uses the published sizes of
real models (Flux: width 3072, 24 heads), not the toy fixture's.
"""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import AE, AXES, CLIP, DEV, FIX, T5

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from safetensors.numpy import load_file  # noqa: E402
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags  # noqa: E402
from sdplan.core.pipelines.flux import FluxModels, FluxPipeline  # noqa: E402
from sdplan.core.pipelines.inputs import plan_loras  # noqa: E402
from sdplan.core.planning.estimate import estimate_plan  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.plan import resolve  # noqa: E402
from sdplan.core.runtime.runner import BackendPool  # noqa: E402

GIB = 1 << 30
FILES = {"diffusion_model": [str(DEV)], "t5xxl": [str(T5)], "clip_l": [str(CLIP)], "vae": [str(AE)]}
INVENTORY = Inventory((Device("CPU1", "second CPU backend", "gpu", "TEST", 8 * GIB, 8 * GIB),
                       Device("CPU2", "third CPU backend", "gpu", "TEST", 8 * GIB, 8 * GIB),
                       Device("CPU", "host", "cpu", "CPU", 16 * GIB, 16 * GIB)))
PROMPT = "a photo of a cat<lora:lora_flux_peft:1><lora:lora_flux_kohya:0.5>"
FREF = load_file(str(FIX / "flux_ref.safetensors"))


@pytest.fixture(scope="module")
def pool():
    extra = {n: G.init_backend("CPU") for n in ("CPU1", "CPU2")}
    for b in extra.values():
        b.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra=extra)
    yield p
    p.manager.close()


def measured(pool, plan, mode: str) -> dict[str, dict[str, int]]:
    """Per device: resident weight and LoRA bytes of every runner after running each once."""
    with FluxPipeline(FluxModels(DEV, T5, CLIP, AE, axes=AXES, clip_heads=2), plan=plan, pool=pool,
                      n_threads=1) as pipe:
        from sdplan.core.pipelines.lora import prompt_loras

        _, loras = prompt_loras(PROMPT, FIX, pipe.lora_aliases())
        assert pipe.set_loras(loras, mode) == mode
        pipe.encode_prompt("a photo of a cat", 16)
        v = pipe.velocity(FREF["dit_latent"], 0.7, FREF["dit_txt"], FREF["dit_y"], 3.5)
        pipe.decode(v)
        out: dict[str, dict[str, int]] = {}
        for r in pipe.runners.values():
            for d, m in r.memory().items():
                acc = out.setdefault(d, {"weights": 0, "lora": 0})
                acc["weights"] += m.weights
                acc["lora"] += m.lora
        return out


@pytest.mark.parametrize("mode", ["at_runtime", "immediately"])
def test_estimated_lora_memory_matches_the_engine(pool, mode: str) -> None:
    plan = resolve(["--backend", "CPU1,diffusion=CPU1&CPU2,te=CPU1"], INVENTORY, profile_from_model_flags(FILES))
    assert [r.device for r in plan.modules["diffusion"].ranges] == ["CPU1", "CPU2"]
    loras = plan_loras(PROMPT, FIX, mode, FILES, plan)
    assert loras.prompt == "a photo of a cat" and loras.mode == mode and loras.unknown() == []
    fit = estimate_plan(plan, profile_from_model_flags(FILES), INVENTORY, width=64, height=64,
                        loras=loras.profiles)
    got = measured(pool, plan, mode)
    for dev in ("CPU1", "CPU2"):
        est_lora = sum(e.lora.get(dev, 0) for e in fit.modules.values())
        est_weights = sum(e.weights.get(dev, 0) for e in fit.modules.values())
        assert fit.devices[dev].lora == est_lora
        if mode == "immediately":
            assert est_lora == 0 and got[dev]["lora"] == 0
        else:
            assert est_lora > 0 and abs(est_lora - got[dev]["lora"]) <= 0.1 * got[dev]["lora"], (dev, est_lora, got)
        total_est, total_got = est_weights + est_lora, got[dev]["weights"] + got[dev]["lora"]
        assert abs(total_est - total_got) <= 0.1 * total_got, (dev, total_est, total_got)


def test_auto_picks_at_runtime_for_a_split_and_immediately_on_one_device() -> None:
    profile = profile_from_model_flags(FILES)
    split = resolve(["--backend", "CPU1,diffusion=CPU1&CPU2"], INVENTORY, profile)
    one = resolve(["--backend", "CPU1"], INVENTORY, profile)
    offloaded = resolve(["--backend", "CPU1", "--params-backend", "diffusion=CPU"], INVENTORY, profile)
    assert plan_loras(PROMPT, FIX, "auto", FILES, split).mode == "at_runtime"
    assert plan_loras(PROMPT, FIX, "auto", FILES, one).mode == "immediately"
    assert plan_loras(PROMPT, FIX, "auto", FILES, offloaded).mode == "at_runtime"
    planned = plan_loras(PROMPT, FIX, "at_runtime", FILES, one)
    fit = estimate_plan(one, profile, INVENTORY, width=64, height=64, loras=planned.profiles)
    assert fit.devices["CPU1"].lora == sum(p.total for p in planned.profiles.values()) > 0
    assert fit.to_json()["devices"]["CPU1"]["lora"] == fit.devices["CPU1"].lora
    assert np.isclose(fit.devices["CPU1"].total, fit.devices["CPU1"].weights + fit.devices["CPU1"].lora
                      + fit.devices["CPU1"].staging + fit.devices["CPU1"].compute)
