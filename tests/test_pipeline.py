"""The SD pipeline end to end on the tiny fixtures: prompt -> context (tokenizer + CLIP),
a full CFG euler run with fixed noise and sigmas, the decoded image; with the weights
resident, staged from a params device, read from disk for each use, and under a plan.

Tolerances: contexts, VAE 5e-3 x max |ref|; the final latent of the 4-step CFG run
1e-2 x max |ref| (measured 2e-3); the image within 2/255 per channel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from safetensors.numpy import load_file  # noqa: E402
from sdplan.core import sampling  # noqa: E402
from sdplan.core.inventory import Device, Inventory  # noqa: E402
from sdplan.core.pipeline import GenerateParams, StableDiffusion, image_to_uint8  # noqa: E402
from sdplan.core.plan import resolve  # noqa: E402
from test_models_clip import assert_close  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
GIB = 1 << 30


def model(family: str, plan=None) -> StableDiffusion:
    return StableDiffusion(FIX / f"{family}_tiny.safetensors", plan, n_threads=2, clip_heads=2,
                           unet_head_dim=8 if family == "sd2" else None)


def ref(family: str) -> dict[str, np.ndarray]:
    return load_file(str(FIX / f"{family}_ref.safetensors"))


def cpu_inventory() -> Inventory:
    return Inventory((Device("CPU", "CPU", "cpu", "CPU", 16 * GIB, 24 * GIB),))


@pytest.mark.parametrize("family", ["sd1", "sd2"])
def test_family_detection_and_contexts(family) -> None:
    r = ref(family)
    with model(family) as sd:
        assert sd.family == family and sd.prediction == ("eps" if family == "sd1" else "v")
        assert_close(sd.encode_prompt("a photo of a cat"), r["context_cond"])
        assert_close(sd.encode_prompt(""), r["context_uncond"])
        text = "a photo of a cat, " * 30  # 180 tokens: 3 chunks of 75
        assert sd.tokenizer.tokenize(text).n_chunks == 3
        long = sd.encode_prompt(text)
        assert long.shape == (1, 231, 16)
        assert_close(long[:, :77], sd.encode_ids(sd.tokenizer.tokenize(text).ids[:1]))


@pytest.mark.parametrize("family", ["sd1", "sd2"])
@pytest.mark.parametrize("mode", ["runtime", "device", "disk"])
def test_full_cfg_run_matches_reference(family, mode) -> None:
    r = ref(family)
    with model(family) as sd:
        for m in sd.modules.values():
            m.mode = mode
        p = GenerateParams("a photo of a cat", "", 16, 16, 4, float(r["run_cfg_scale"][0]), 1,
                           "euler", "discrete")
        latents = []
        imgs = sd.txt2img(p, on_step=lambda i, n, x: latents.append(x), noise=r["run_noise"],
                          sigmas=r["run_sigmas"])
        assert len(latents) == 4
        assert_close(latents[-1], r["run_final_latent"], 1e-2)
        expect = image_to_uint8(r["run_image"][0]).astype(int)
        assert np.abs(imgs[0].astype(int) - expect).max() <= 2
        if mode != "runtime":  # nothing stays on the runtime device between uses
            assert sd.modules["diffusion"].graphs == {}


def test_seeded_generation_is_reproducible_and_previews() -> None:
    with model("sd1") as sd:
        p = GenerateParams("a cat", "blurry", 16, 16, 3, 5.0, 7, "euler_a", "karras")
        shots = []
        a = sd.txt2img(p, preview=lambda i, rgb: shots.append(rgb.shape))
        b = sd.txt2img(p)
        assert np.array_equal(a[0], b[0])
        assert shots == [(8, 8, 3)] * 3
        c = sd.txt2img(GenerateParams("a cat", "blurry", 16, 16, 3, 5.0, 8, "euler_a", "karras"))
        assert not np.array_equal(a[0], c[0])
        with pytest.raises(ValueError, match="multiples of 4"):
            sd.txt2img(GenerateParams("a cat", width=18, height=16))


def test_placed_by_a_plan_with_disk_residency_and_small_budget() -> None:
    plan = resolve(["--params-backend", "diffusion=disk", "--max-vram", "0.5"], cpu_inventory())
    assert plan.modules["diffusion"].params.mode == "disk"
    r = ref("sd1")
    with model("sd1", plan) as sd:
        assert sd.modules["diffusion"].mode == "disk" and sd.modules["te"].mode == "runtime"
        with sd.unet_session() as unet:
            den = sd.denoiser(unet, r["context_cond"], r["context_uncond"], 7.0)
            s = r["run_sigmas"].astype(np.float64)
            out = sampling.sample("euler", den, sampling.initial_latent(r["run_noise"], s), s)
        assert_close(out, r["run_final_latent"], 1e-2)
        assert sd.modules["diffusion"].resident is None
