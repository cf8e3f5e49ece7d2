"""SDXL on the engine against diffusers, on the tiny base and refiner fixtures
(``tests/fixtures/make_sdxl_fixtures.py``): tokens, each encoder's hidden states, the pooled
projection, the context and vector conditioning, the UNet, the VAE and a full CFG run; sd-cli's
conditioning rules (empty negative prompt, chunks, weights); the separate-file layouts and a
Q8_0 GGUF UNet as sd-cli writes it; UNet segments under a budget (SDXL and SD 1.x).

Tolerances (max abs error / max |reference|): conditioning, UNet and VAE 5e-3 (fp16 weights,
f32 activations; measured 3e-4 .. 1e-3); the final latent of the 4-step CFG run 1e-2
(measured 1e-3); images within 2/255. Segmented runs equal the whole run to 1e-5 (the same
kernels, graphs cut at stage boundaries). GGUF UNets against the f16 UNet's output: Q8_0
3e-2 (measured 7.5e-3) and its images within 8/255; Q4_0 0.1 (measured 4.8e-2).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion  # noqa: E402
from sdplan.core.pipelines.sdxl.conditioner import fourier_embedding, openclip_ids  # noqa: E402
from sdplan.core.pipelines.sdxl.pipeline import StableDiffusionXL  # noqa: E402
from sdplan.core.pipelines.stages.results import image_to_uint8  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, ModulePlacement  # noqa: E402
from sdxl_util import BASE, FIX, REFINER, ref, rel_err, split_files, write_unet_gguf  # noqa: E402

W, H = 16, 24
PROMPT, NEGATIVE = "a photo of a cat", "blurry, low quality"
TOL = 5e-3


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(2)
    p = BackendPool(G.BackendManager(2), extra={"CPU1": second})
    yield p
    p.manager.close()


@pytest.fixture(scope="module")
def base(pool):
    with StableDiffusionXL(BASE, pool=pool, n_threads=2) as sd:
        yield sd


@pytest.fixture(scope="module")
def refiner(pool):
    with StableDiffusionXL(REFINER, pool=pool, n_threads=2) as sd:
        yield sd


def params(negative: str = NEGATIVE, cfg: float = 5.0) -> GenerateParams:
    return GenerateParams(PROMPT, negative, W, H, 4, cfg, 1, "euler", "discrete")


def test_model_detection(base, refiner) -> None:
    assert base.family == "sdxl" and not base.refiner and base.prediction == "eps"
    assert base.ms.architecture.name == "sdxl" and refiner.ms.architecture.name == "sdxl-refiner"
    assert refiner.refiner and set(refiner.cond.encoders) == {"clip_g"}
    assert set(base.cond.encoders) == {"clip_l", "clip_g"}
    assert base.unet_cfg.attention_levels == (1,) and base.unet_cfg.adm_in_channels == 128
    assert base.cond.fourier_dim == 16 and refiner.cond.fourier_dim == 16
    assert base.scale_factor == 0.13025
    assert base.vae_conv_scale == 1 / 32  # the checkpoint's own VAE: sd-cli's conv scale


def test_tokens_match_transformers(base) -> None:
    r = ref()
    tp = base.tokenizer.tokenize(PROMPT)
    assert np.array_equal(tp.ids, r["ids_l"])
    g_ids, eos = openclip_ids(tp.ids[0])
    assert np.array_equal(g_ids[None], r["ids_g"]) and eos == 6
    assert np.array_equal(openclip_ids(base.tokenizer.tokenize("").ids[0])[0][None], r["ids_g_empty"])


def test_each_encoder_and_the_conditioning_match_diffusers(base) -> None:
    r = ref()
    hidden, pooled = base.cond.encode_ids(r["ids_l"])
    assert rel_err(hidden[..., :16], r["clip_l_penultimate"]) <= TOL
    assert rel_err(hidden[..., 16:], r["clip_g_penultimate"]) <= TOL
    assert rel_err(pooled, r["clip_g_pooled"]) <= TOL
    cond, uncond = base.conditioning(params())
    assert uncond is not None
    assert rel_err(cond["c"], r["context_cond"]) <= TOL and rel_err(uncond["c"], r["context_uncond"]) <= TOL
    assert rel_err(cond["vec"], r["vector_cond"]) <= TOL and rel_err(uncond["vec"], r["vector_uncond"]) <= TOL
    assert rel_err(cond["vec"][:, :32], r["pooled_cond"]) <= TOL
    np.testing.assert_allclose(fourier_embedding([H, W, 0, 0, H, W], 16), r["time_embeds"][0], atol=1e-6)


def test_empty_negative_prompt_is_a_zero_context_with_its_pooled_embedding(base) -> None:
    r = ref()
    cond, uncond = base.conditioning(params(""))
    assert uncond is not None and uncond["c"].shape == cond["c"].shape and not uncond["c"].any()
    assert rel_err(uncond["vec"][:, :32], r["clip_g_pooled_empty"]) <= TOL
    assert base.conditioning(params("", cfg=1.0))[1] is None


def test_long_prompts_in_chunks_and_weights(base) -> None:
    text = "a photo of a cat, " * 20  # 120 tokens: two chunks of 75
    tp = base.tokenizer.tokenize(text)
    assert tp.n_chunks == 2
    ctx, pooled = base.encode_text(text)
    assert ctx.shape == (1, 154, 48)
    first, first_pooled = base.cond.encode_ids(tp.ids[:1])
    np.testing.assert_allclose(ctx[:, :77], first, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pooled, first_pooled, rtol=1e-5, atol=1e-6)  # pooled: chunk 0 only
    plain = base.encode_prompt(PROMPT)
    weighted = base.encode_prompt("a photo of a (cat:1.5)")
    assert not np.allclose(plain, weighted)
    assert np.isclose(weighted.mean(), plain.mean(), rtol=1e-4)  # sd-cli keeps the chunk's mean


def test_refiner_conditioning_matches_diffusers(refiner) -> None:
    r = ref("sdxl_refiner")
    tp = refiner.tokenizer.tokenize(PROMPT)
    assert np.array_equal(openclip_ids(tp.ids[0])[0][None], r["ids_g"])
    cond, uncond = refiner.conditioning(params())
    assert uncond is not None and cond["c"].shape == (1, 77, 32)
    for key, want in (("c", "context"), ("vec", "vector")):
        assert rel_err(cond[key], r[f"{want}_cond"]) <= TOL
        assert rel_err(uncond[key], r[f"{want}_uncond"]) <= TOL  # aesthetic score 2.5


@pytest.mark.parametrize("name", ["sdxl", "sdxl_refiner"])
def test_unet_and_vae_match_diffusers(base, refiner, name) -> None:
    r = ref(name)
    sd = base if name == "sdxl" else refiner
    with sd.unet_session() as unet:
        out = unet(r["unet_x"], r["unet_t"], {"c": r["context_cond"], "vec": r["vector_cond"]})
    assert rel_err(out, r["unet_out"]) <= TOL
    assert rel_err(sd.decode(r["vae_decode_in"] * sd.scale_factor), r["vae_decode_out"]) <= TOL


@pytest.mark.parametrize("name", ["sdxl", "sdxl_refiner"])
def test_full_cfg_run_matches_diffusers(base, refiner, name) -> None:
    r = ref(name)
    sd = base if name == "sdxl" else refiner
    latents: list[np.ndarray] = []
    img = sd.txt2img(params(), on_step=lambda i, n, x: latents.append(x), noise=r["run_noise"],
                     sigmas=r["run_sigmas"])[0]
    assert len(latents) == 4 and rel_err(latents[-1], r["run_final_latent"]) <= 1e-2
    assert np.abs(img.astype(int) - image_to_uint8(r["run_image"][0]).astype(int)).max() <= 2


def _unet_inputs(family: str) -> dict[str, np.ndarray]:
    """A CFG-sized UNet batch (two latents) from the stored references."""
    from safetensors.numpy import load_file

    r = ref() if family == "sdxl" else load_file(str(FIX / "sd1_ref.safetensors"))
    ins = {"x": np.concatenate([r["unet_x"]] * 2), "t": np.array([500.0, 17.0], np.float32),
           "c": np.concatenate([r["context_cond"], r["context_uncond"]])}
    if family == "sdxl":
        ins["vec"] = np.concatenate([r["vector_cond"], r["vector_uncond"]])
    return ins


@pytest.mark.parametrize("family", ["sdxl", "sd1"])
def test_unet_cut_into_segments_under_a_budget(pool, family) -> None:
    """A UNet (SDXL, and SD 1.x too) runs in stage segments under a small budget, holding
    less than its weights at once, with the whole run's output."""
    ins = _unet_inputs(family)
    shapes = {k: tuple(v.shape) for k, v in ins.items()}

    def make(budget: int):
        pl = {"diffusion": ModulePlacement(("CPU1",), budget=budget)}
        if family == "sdxl":
            return StableDiffusionXL(BASE, pool=pool, n_threads=2, placements=pl)
        return StableDiffusion(FIX / "sd1_tiny.safetensors", pool=pool, n_threads=2, clip_heads=2, placements=pl)

    def held(runner) -> int:
        return runner.last_peak["CPU1"].weights + runner.last_peak["CPU1"].staging

    with make(0) as whole:
        runner = whole.runners["diffusion"]
        want = runner.run(ins)["y"]
        stages, held_whole = runner.model.n_blocks, held(runner)
        cpu1 = pool.get("CPU1")
        fixed = runner.rt.alloc_size(runner.model.other_tensors(), cpu1) + runner.measure(shapes)["CPU1"]
        sizes = [runner.rt.alloc_size(runner.model.block_tensors(i), cpu1) for i in range(stages)]
    assert runner.last_segments == 0 and stages >= 8
    with make(1) as one_each:  # nothing fits: every stage is a segment
        runner = one_each.runners["diffusion"]
        got = runner.run(ins)["y"]
        assert runner.last_segments == stages and rel_err(got, want) <= 1e-5 and held(runner) < held_whole
    budget = fixed + max(sizes)  # room for the largest stage, or several smaller ones
    expect, room = 1, max(sizes)  # greedy packing in stage order, as the runner packs
    for size in sizes:
        if room < size:
            expect, room = expect + 1, max(sizes)
        room -= size
    with make(budget) as grouped:
        runner = grouped.runners["diffusion"]
        got = runner.run(ins)["y"]
        assert runner.last_segments == expect and 3 <= expect < stages and rel_err(got, want) <= 1e-5
    with make(fixed + sum(sizes) + 1) as roomy:  # everything fits: one segment, loaded once
        runner = roomy.runners["diffusion"]
        assert rel_err(runner.run(ins)["y"], want) <= 1e-5 and runner.last_segments == 1
        # the weights stay resident between runs (two buffers: alignment padding only)
        assert abs(runner.memory()["CPU1"].weights - held_whole) <= 256


def test_separate_files_give_the_single_file_picture(pool, tmp_path: Path) -> None:
    r = ref()
    flags = split_files(tmp_path)
    with StableDiffusionXL(flags, pool=pool, n_threads=2) as sd:
        assert sd.unet_cfg.prefix == "" and sd.cond.encoders["clip_g"].projection[1] == "linear"
        assert sd.vae_conv_scale == 1.0  # --vae given: no conv scale unless forced
        cond, uncond = sd.conditioning(params())
        assert rel_err(cond["c"], r["context_cond"]) <= TOL and rel_err(cond["vec"], r["vector_cond"]) <= TOL
        img = sd.txt2img(params(), noise=r["run_noise"], sigmas=r["run_sigmas"])[0]
    assert np.abs(img.astype(int) - image_to_uint8(r["run_image"][0]).astype(int)).max() <= 2
    with StableDiffusionXL(flags, pool=pool, n_threads=2, force_vae_conv_scale=True) as sd:
        assert sd.vae_conv_scale == 1 / 32
        scaled = sd.decode(r["vae_decode_in"] * sd.scale_factor)
    assert rel_err(scaled, r["vae_decode_out"]) <= TOL


@pytest.mark.parametrize("qtype, prefix, tol", [("q8_0", "model.diffusion_model.", 3e-2), ("q8_0", "", 3e-2),
                                                ("q4_0", "model.diffusion_model.", 0.1)])
def test_gguf_unet_as_sd_cli_writes_it(pool, tmp_path: Path, qtype: str, prefix: str, tol: float) -> None:
    flags = split_files(tmp_path)
    gguf_path = tmp_path / f"unet-{qtype}.gguf"
    types = write_unet_gguf(BASE, gguf_path, qtype, prefix)
    assert types[prefix + "input_blocks.3.1.transformer_blocks.0.attn1.to_q.weight"] == qtype
    assert types[prefix + "input_blocks.1.0.in_layers.0.weight"] == qtype  # 1-D rows of 32 too
    assert types[prefix + "label_emb.0.0.weight"] == "float16"
    r = ref()
    with StableDiffusionXL({**flags, "diffusion_model": [str(gguf_path)]}, pool=pool, n_threads=2) as sd:
        assert sd.ms.dtype_mix("diffusion").get(qtype.upper(), 0) > 0
        with sd.unet_session() as unet:
            out = unet(r["unet_x"], r["unet_t"], {"c": r["context_cond"], "vec": r["vector_cond"]})
        assert rel_err(out, r["unet_out"]) <= tol
        if qtype == "q8_0" and prefix:
            img = sd.txt2img(params(), noise=r["run_noise"], sigmas=r["run_sigmas"])[0]
            assert np.abs(img.astype(int) - image_to_uint8(r["run_image"][0]).astype(int)).max() <= 8


def test_not_an_sdxl_model_set(pool, tmp_path: Path) -> None:
    from sdplan.core.errors import ModelFileError

    with pytest.raises(ModelFileError, match="no label_emb: not an SDXL UNet"):
        StableDiffusionXL(FIX / "sd1_tiny.safetensors", pool=pool)
    flags = split_files(tmp_path)
    del flags["clip_g"]
    with pytest.raises(ModelFileError, match="give --clip_g"):
        StableDiffusionXL(flags, pool=pool)


def test_te_split_and_params_placement_from_a_plan(pool) -> None:
    """A resolved plan: bigG's layers split over CPU1 & CPU2 (ViT-L on the main device), the
    UNet staged from CPU params, the VAE read from disk: the one-device picture."""
    from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
    from sdplan.core.planning.inventory import Device, Inventory
    from sdplan.core.planning.plan import resolve

    gib = 1 << 30
    inv = Inventory((Device("CPU1", "second CPU backend", "gpu", "TEST", 8 * gib, 8 * gib),
                     Device("CPU2", "third CPU backend", "gpu", "TEST", 8 * gib, 8 * gib),
                     Device("CPU", "host", "cpu", "CPU", 16 * gib, 16 * gib)))
    extra = G.init_backend("CPU")
    extra.set_n_threads(2)
    pool.extra["CPU2"] = extra
    prof = profile_from_model_flags({"model": [BASE]})
    assert prof.modules["te"].block_encoder == "clip_g" and len(prof.modules["te"].blocks) == 3
    plan = resolve(["--backend", "CPU1,te=CPU1&CPU2", "--params-backend", "diffusion=CPU,vae=disk"], inv, prof)
    r = ref()
    with StableDiffusionXL(BASE, plan, pool, n_threads=2) as sd:
        img = sd.txt2img(params(), noise=r["run_noise"], sigmas=r["run_sigmas"])[0]
        g = sd.runners["clip_g"]
        assert [rg.device for rg in g.pl.ranges] == ["CPU1", "CPU2"] and g.memory()["CPU2"].weights > 0
        assert sd.runners["clip_l"].pl.devices == ("CPU1",) and "CPU2" not in sd.runners["clip_l"].memory()
        diff = sd.runners["diffusion"]
        assert diff.last_peak["CPU1"].staging > 0 and diff.memory()["CPU"].weights > 0
        assert sd.runners["vae"].memory() == {}
    assert np.abs(img.astype(int) - image_to_uint8(r["run_image"][0]).astype(int)).max() <= 2


def test_reduced_variant_read_from_its_shapes(pool, tmp_path: Path) -> None:
    """An SSD-1B / Vega-like reduction of the tiny base (a middle block of one ResBlock, one
    output SpatialTransformer one transformer block shallower) loads from its shapes alone
    and runs whole and in stage segments alike (structure only: no diffusers reference)."""
    from safetensors.numpy import load_file, save_file
    from sdxl_util import UNET, _metadata

    sd = load_file(str(BASE))
    drop = (UNET + "middle_block.1.", UNET + "middle_block.2.", UNET + "output_blocks.0.1.transformer_blocks.1.")
    path = tmp_path / "ssd_like.safetensors"
    save_file({k: v for k, v in sd.items() if not k.startswith(drop)}, str(path), metadata=_metadata(BASE))
    ins = _unet_inputs("sdxl")
    outs = []
    for budget in (0, 1):
        with StableDiffusionXL(path, pool=pool, n_threads=2,
                               placements={"diffusion": ModulePlacement(("CPU1",), budget=budget)}) as xl:
            graph = xl.runners["diffusion"].model
            assert graph.stages[3] == "middle_block." and graph.n_blocks == 8
            assert not any(n.startswith(UNET + "middle_block.1.") for n in graph.names)
            outs.append(xl.runners["diffusion"].run(ins)["y"])
            assert xl.runners["diffusion"].last_segments == (0 if budget == 0 else 8)
    assert outs[0].shape == (2, 4, 12, 8) and np.isfinite(outs[0]).all()
    assert rel_err(outs[1], outs[0]) <= 1e-5


def test_image_to_image_encodes_with_the_sdxl_scale_factor(base) -> None:
    """A picture's latent is the VAE's mean times SDXL's 0.13025 (not SD's 0.18215), and
    strength 1 is text-to-image started from ``noise + init / sigma_0`` (sd-cli's start)."""
    from sdplan.core.pipelines.stages.img2img import ImageInput
    from sdplan.core.sampling.noise import PhiloxNoise
    from sdplan.core.sampling.schedules import get_sigmas

    img = np.random.default_rng(0).uniform(-1, 1, (1, 3, H, W)).astype(np.float32)
    mean = base.runners["vae"].run({"image": img})["mean"]
    zero = np.zeros_like(mean)
    np.testing.assert_allclose(base.encode_sample(img, zero), mean * np.float32(0.13025), rtol=1e-6)
    p = params()
    lat: list[np.ndarray] = []
    a = base.txt2img(p, on_step=lambda i, n, x: lat.append(x), init=ImageInput(img, None, 1.0))[0]
    shape = (1, 4, H // 2, W // 2)  # the tiny VAE: factor 2
    init = base.encode_sample(img, PhiloxNoise(1).randn(shape))
    noise = PhiloxNoise(1).randn(shape) + init / np.float32(get_sigmas("discrete", 4, base.schedule, "sdxl")[0])
    lat2: list[np.ndarray] = []
    b = base.txt2img(p, on_step=lambda i, n, x: lat2.append(x), noise=noise)[0]
    # the two starts, init + sigma_0 noise and sigma_0 (noise + init / sigma_0), differ by f32
    # rounding (an ulp); four steps of the random UNet grow that to about 3e-4 of the range with
    # f32 products, more where a small layer's f16 rounding (ggml's products) flips
    np.testing.assert_allclose(lat[-1], lat2[-1], rtol=0, atol=5e-3 * np.abs(lat2[-1]).max())
    assert np.abs(a.astype(int) - b.astype(int)).max() <= 1


def test_timestep_shift_gives_the_unet_the_shifted_timestep(base) -> None:
    """sd-cli's ``--timestep-shift N`` (its ``adjust_sample_step_scalings``, SDXL only): at
    sigma ``s`` the UNet runs at timestep ``t' = round(t(s) N / 1000)`` on the input scaled by
    ``c_in(s)``, and the prediction is ``x c_in(s) / c_in(s') + c_out(s') F`` with ``s'`` the
    sigma of ``t'``. The reference here is SD's scaled-linear beta schedule written out in
    numpy (alphas_cumprod, log-sigma interpolation), against a recording UNet stand-in."""
    betas = np.linspace(0.00085 ** 0.5, 0.012 ** 0.5, 1000, dtype=np.float64) ** 2
    table = np.sqrt((1 - np.cumprod(1 - betas)) / np.cumprod(1 - betas))
    x = np.random.default_rng(0).standard_normal((1, 4, 3, 2)).astype(np.float32)
    seen: list[tuple[float, np.ndarray]] = []

    def unet(x_in: np.ndarray, t: np.ndarray, cond: dict) -> np.ndarray:
        seen.append((float(np.asarray(t).reshape(-1)[0]), x_in.copy()))
        return (0.5 * x_in + 0.25).astype(np.float32)

    cond = {"c": np.zeros((1, 77, 8), np.float32), "vec": np.zeros((1, 8), np.float32)}
    for sigma, shift in ((5.0, 300), (0.7, 250), (14.0, 1000)):
        seen.clear()
        got = base.denoiser(unet, cond, None, 1.0, timestep_shift=shift)(x, sigma)
        t = np.interp(np.log(sigma), np.log(table), np.arange(1000))
        t2 = int(min(max(round(t * shift / 1000), 0), 999))
        s2 = table[t2]
        c_in, c_in2 = 1 / np.sqrt(sigma ** 2 + 1), 1 / np.sqrt(s2 ** 2 + 1)
        assert seen[0][0] == t2
        np.testing.assert_allclose(seen[0][1], x * c_in, rtol=1e-6)
        want = x * (c_in / c_in2) + (-s2) * (0.5 * x * c_in + 0.25)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    plain = base.denoiser(unet, cond, None, 1.0)(x, 5.0)
    np.testing.assert_allclose(plain, x + (-5.0) * (0.5 * x / np.sqrt(26) + 0.25), rtol=1e-4, atol=1e-5)
