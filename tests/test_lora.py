"""LoRA on the engine against diffusers with the same LoRA loaded by its own loaders
(``tests/fixtures/make_lora_fixtures.py``): SD 1.x (kohya with LoCon, PEFT, both at weights
0.8/0.5, LoHa, LoKr) and Flux dev (kohya on BFL names with CLIP-L, PEFT on diffusers names
joined into the fused ``qkv``/``linear1`` rows), each merged (``immediately``) and added in
the graph (``at_runtime``); on a Q8_0 DiT at runtime against the F16 merge; over a layer
split, disk residency and changing LoRAs.

Tolerances (largest difference relative to the reference's largest magnitude): 1e-2.
Measured: SD1 text encoder <= 1.1e-3, UNet <= 1.5e-3 (LoKr 4.8e-3); Flux velocity <= 6e-4,
CLIP pooled <= 2.3e-3 (f16 weights merged and rounded back to f16, or f16 LoRA factors at
runtime; diffusers computes in f32). Q8_0 at runtime against the F16 merge: within 1.5x the
Q8_0 model's own difference from F16 without LoRA (measured 1.1e-2 both), and 2e-2.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flux_util import AE, AXES, CLIP, DEV, FIX, T5, rel_err, write_gguf
from safetensors.numpy import load_file

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.pipelines.flux.pipeline import FluxModels, FluxPipeline  # noqa: E402
from sdplan.core.pipelines.sd.pipeline import StableDiffusion  # noqa: E402
from sdplan.core.pipelines.stages.lora import prompt_loras  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement  # noqa: E402

LREF = load_file(str(FIX / "lora_ref.safetensors"))
SREF = load_file(str(FIX / "sd1_ref.safetensors"))
FREF = load_file(str(FIX / "flux_ref.safetensors"))
SD1 = FIX / "sd1_tiny.safetensors"
TOL = 1e-2
CASES = {"kohya": "<lora:lora_sd1_kohya:1>", "peft": "<lora:lora_sd1_peft:1>",
         "both": "<lora:lora_sd1_kohya:0.8><lora:lora_sd1_peft.safetensors:0.5>",
         "loha": "<lora:lora_sd1_loha:1>", "lokr": "<lora:lora_sd1_lokr:1>"}
MODES = ("immediately", "at_runtime")


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


def sd_outputs(sd: StableDiffusion) -> tuple[np.ndarray, np.ndarray]:
    te = sd.encode_ids(SREF["clip_input_ids"])
    with sd.unet_session() as unet:
        out = unet(SREF["unet_x"], SREF["unet_t"], te)
    return te, out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(CASES))
def test_sd1_lora_matches_diffusers(pool, case: str, mode: str) -> None:
    with StableDiffusion(SD1, pool=pool, clip_heads=2, n_threads=1) as sd:
        text, loras = prompt_loras("a photo of a cat" + CASES[case], FIX, sd.lora_aliases())
        assert text == "a photo of a cat" and all(not lo.file.unknown for lo in loras)
        assert sd.set_loras(loras, mode) == mode
        te, out = sd_outputs(sd)
        want_te = LREF.get(f"sd1_{case}_te", SREF["clip_last_hidden_state"])
        assert rel_err(te, want_te) < TOL
        with sd.unet_session() as unet:  # the UNet on diffusers' LoRA'd context, alone
            out = unet(SREF["unet_x"], SREF["unet_t"], want_te)
        assert rel_err(out, LREF[f"sd1_{case}_unet"]) < TOL
        assert rel_err(out, SREF["unet_out"]) > 0.05  # the LoRA did something
        runtime = {n: r.memory().get("CPU") for n, r in sd.runners.items()}
        patched = [n for n, r in sd.runners.items() if r.lora is not None]
        assert set(patched) == ({"diffusion"} if case in ("loha", "lokr") else {"te", "diffusion"})
        for n in patched:  # at runtime the LoRA tensors are beside the weights; merged: none
            lora_bytes = runtime[n].lora if runtime[n] else 0
            assert (lora_bytes > 0) == (mode == "at_runtime"), n


@pytest.mark.parametrize("mode", MODES)
def test_sd1_full_run_with_a_prompt_tag(pool, mode: str) -> None:
    from sdplan.core.pipelines.sd.pipeline import GenerateParams

    with StableDiffusion(SD1, pool=pool, clip_heads=2, n_threads=1) as sd:
        prompt, loras = prompt_loras("a photo of a cat<lora:lora_sd1_kohya:1>", FIX, sd.lora_aliases())
        sd.set_loras(loras, mode)
        latents: list[np.ndarray] = []
        sd.txt2img(GenerateParams(prompt, "", 16, 16, 4, 7.0, 1, "euler", "discrete"),
                   on_step=lambda i, n, x: latents.append(x), noise=SREF["run_noise"], sigmas=SREF["run_sigmas"])
    assert rel_err(latents[-1], LREF["sd1_kohya_run_final_latent"]) < TOL


def flux(pool, placements=None, dit: Path = DEV) -> FluxPipeline:
    return FluxPipeline(FluxModels(dit, T5, CLIP, AE, axes=AXES, clip_heads=2), pool=pool,
                        placements=placements, n_threads=1)


def dit_velocity(pipe: FluxPipeline) -> np.ndarray:
    return pipe.velocity(FREF["dit_latent"], float(FREF["dit_t"][0]), FREF["dit_txt"], FREF["dit_y"],
                         float(FREF["dit_guidance"][0]))


def flux_lora(pipe: FluxPipeline, tag: str, mode: str) -> str | None:
    _, loras = prompt_loras(tag, FIX, pipe.lora_aliases())
    return pipe.set_loras(loras, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["kohya", "peft"])
def test_flux_lora_matches_diffusers(pool, case: str, mode: str) -> None:
    with flux(pool) as pipe:
        flux_lora(pipe, f"<lora:lora_flux_{case}:1>", mode)
        v = dit_velocity(pipe)
        assert rel_err(v, LREF[f"flux_{case}_dit"]) < TOL
        assert rel_err(v, FREF["dit_dev_out"]) > 0.05
        if case == "kohya":  # the CLIP-L part (lora_te1_)
            h = pipe.runners["clip_l"].run({"ids": FREF["clip_ids"], "mask": _mask()})["hidden"]
            eos = int(np.argmax(FREF["clip_ids"][0] == 49407))
            assert rel_err(h[:, eos], LREF["flux_kohya_clip_pooled"]) < TOL


def _mask() -> np.ndarray:
    from sdplan.core.models.clip import causal_mask

    return causal_mask(77)


@pytest.fixture(scope="module")
def q8(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("q8") / "flux_dev_q8_0.gguf"
    write_gguf(DEV, path, "q8_0")
    return path


def test_q8_0_at_runtime_is_close_to_the_f16_merge(pool, q8: Path) -> None:
    with flux(pool) as pipe:
        base_f16 = dit_velocity(pipe)
        flux_lora(pipe, "<lora:lora_flux_peft:1>", "immediately")
        merged = dit_velocity(pipe)
    with flux(pool, dit=q8) as pipe:
        assert any(i.dtype == "Q8_0" for i in pipe.runners["diffusion"].wf.infos.values())
        q8_error = rel_err(dit_velocity(pipe), base_f16)  # Q8_0's own rounding, without LoRA
        assert flux_lora(pipe, "<lora:lora_flux_peft:1>", "auto") == "at_runtime"  # sd-cli's auto rule
        at_runtime = dit_velocity(pipe)
        plain_lora = pipe.runners["diffusion"].lora
        flux_lora(pipe, "<lora:lora_flux_peft:1>", "immediately")  # requantized merge also works
        requantized = dit_velocity(pipe)
    assert plain_lora is not None and plain_lora.runtime
    assert rel_err(at_runtime, merged) < 1.5 * q8_error + 1e-3  # the LoRA adds next to nothing
    assert rel_err(at_runtime, merged) < 2e-2
    assert rel_err(requantized, merged) < 2e-2
    assert rel_err(at_runtime, LREF["flux_peft_dit"]) < 2e-2


@pytest.mark.parametrize("mode", MODES)
def test_flux_layer_split_and_disk_equal_one_device(pool, mode: str) -> None:
    with flux(pool) as pipe:
        flux_lora(pipe, "<lora:lora_flux_peft:1><lora:lora_flux_kohya:0.5>", mode)
        single = dit_velocity(pipe)
    split = {"diffusion": ModulePlacement(("CPU", "CPU1"), (BlockRange("CPU", 0, 1), BlockRange("CPU1", 2, 3)),
                                          "disk")}
    with flux(pool, split) as pipe:
        flux_lora(pipe, "<lora:lora_flux_peft:1><lora:lora_flux_kohya:0.5>", mode)
        v = dit_velocity(pipe)
        r = pipe.runners["diffusion"]
        if mode == "at_runtime":  # each range holds the LoRA tensors of its own blocks
            mem = r.memory()
            assert mem["CPU"].lora > 0 and mem["CPU1"].lora > 0
            held = mem["CPU"].lora + mem["CPU1"].lora
            assert r.lora.nbytes() <= held <= 1.1 * r.lora.nbytes() + 2048  # buffers: alignment only
        else:
            assert all(m.lora == 0 for m in r.last_peak.values())
    np.testing.assert_allclose(v, single, atol=1e-5 * np.abs(single).max())


def test_changing_loras_rereads_the_weights(pool) -> None:
    with flux(pool) as pipe:
        base = dit_velocity(pipe)
        flux_lora(pipe, "<lora:lora_flux_peft:1>", "immediately")
        with_lora = dit_velocity(pipe)
        pipe.set_loras([], "immediately")
        again = dit_velocity(pipe)
    assert rel_err(base, FREF["dit_dev_out"]) < 5e-3
    assert rel_err(with_lora, base) > 0.05
    np.testing.assert_array_equal(again, base)


@pytest.mark.rpc
@pytest.mark.parametrize("mode", MODES)
def test_flux_split_over_two_rpc_servers_equals_one_device(mode: str) -> None:
    """The engine job in its child process: the DiT split over RPC0 (blocks 0-1) and RPC1
    (2-3) with two LoRAs from the prompt, against the same request on the CPU alone."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers
    from sdplan.core.pipelines.jobs import GENERATE_JOB
    from sdplan.core.runtime.process import Engine

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    req = {"model_files": {"diffusion_model": [str(DEV)], "t5xxl": [str(T5)], "clip_l": [str(CLIP)], "vae": [str(AE)]},
           "prompt": "a photo of a cat<lora:lora_flux_peft:1><lora:lora_flux_kohya:0.5>", "width": 64, "height": 64,
           "steps": 4, "seed": 3, "sampling_method": "euler", "threads": 1, "lora_model_dir": str(FIX),
           "lora_apply_mode": mode, "overrides": {"clip_heads": 2, "flux_axes": list(AXES), "t5_length": 16},
           "previews": False}
    split = {"diffusion": ModulePlacement(("RPC0", "RPC1"), (BlockRange("RPC0", 0, 1), BlockRange("RPC1", 2, 3))),
             "te": ModulePlacement(("RPC0",)), "vae": ModulePlacement(("RPC1",))}
    with Engine() as engine:
        here = engine.call(GENERATE_JOB, {"request": req})
        with rpc_servers(2) as servers:
            rpc = engine.call(GENERATE_JOB, {"request": {**req, "placements": split,
                                                          "rpc_servers": [s.endpoint for s in servers]}})
    assert here["params"]["lora_apply_mode"] == mode and rpc["params"]["lora_apply_mode"] == mode
    assert [lo["name"] for lo in rpc["params"]["loras"]] == ["lora_flux_peft", "lora_flux_kohya"]
    assert np.abs(rpc["images"][0].astype(int) - here["images"][0].astype(int)).max() <= 1
