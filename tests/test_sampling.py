"""Schedules, scalings, samplers and seeded noise against k-diffusion/diffusers references.

The references (tests/fixtures/samplers.safetensors) come from make_fixtures.py: k-diffusion
0.1.1.post1's schedules and samplers, diffusers' DDIMScheduler, computed in float64 with the
analytic denoiser re-implemented here in numpy.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from sdplan.core.sampling import samplers
from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.flow import FLOW_SAMPLER_FUNCTIONS, FLOW_SAMPLERS
from sdplan.core.sampling.noise import PhiloxNoise, initial_latent
from sdplan.core.sampling.samplers import SAMPLER_FUNCTIONS, SAMPLERS, sample
from sdplan.core.sampling.schedules import DiscreteSchedule, get_sigmas, model_denoiser

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def ref() -> dict[str, np.ndarray]:
    return load_file(str(FIX / "samplers.safetensors"))


def analytic(x: np.ndarray, sigma: float) -> np.ndarray:
    c = 1.0 / math.sqrt(1.0 + sigma * sigma)
    return 0.9 * np.tanh(c * x) + 0.1 * sigma / (1.0 + sigma) * np.roll(c * x, 1, axis=1)


def replay(noise: np.ndarray):
    it = iter(noise)
    return lambda shape: next(it).reshape(shape)


def test_discrete_schedule_matches_k_diffusion(ref) -> None:
    sch = DiscreteSchedule()
    # float32 cumulative products: torch and numpy round in a different order.
    np.testing.assert_allclose(sch.alphas_cumprod, ref["alphas_cumprod"], rtol=5e-6)
    np.testing.assert_allclose(sch.sigmas, ref["schedule_sigmas"], rtol=5e-6)
    assert sch.sigma_max == pytest.approx(14.6146, abs=1e-4)
    assert sch.sigma_min == pytest.approx(0.0291675, rel=1e-4)
    for s, t in zip(ref["sigma_to_t_probe"], ref["sigma_to_t"], strict=True):
        assert sch.sigma_to_t(float(s)) == pytest.approx(float(t), abs=2e-3)


@pytest.mark.parametrize("name", ["discrete", "karras", "exponential"])
def test_schedules_match_k_diffusion(ref, name: str) -> None:
    out = get_sigmas(name, 8)
    assert out.dtype == np.float32 and out.shape == (9,) and out[-1] == 0
    np.testing.assert_allclose(out, ref[f"sigmas_{name}"], rtol=2e-6)


def test_one_step_discrete_and_default(ref) -> None:
    np.testing.assert_allclose(get_sigmas("discrete", 1), ref["sigmas_discrete_1"], rtol=1e-6)
    np.testing.assert_array_equal(get_sigmas("default", 5), get_sigmas("discrete", 5))


def test_ays_uses_published_levels_and_interpolates() -> None:
    s10 = get_sigmas("ays", 10)
    assert s10[1] == pytest.approx(6.4745760956, rel=1e-6) and s10[-1] == 0
    s20 = get_sigmas("ays", 20)
    # log-linear resampling keeps the end points and stays monotonic
    assert s20[0] == pytest.approx(14.6146412293, rel=1e-6)
    assert np.all(np.diff(s20) < 0)
    assert get_sigmas("ays", 10, family="sdxl")[1] == pytest.approx(6.3184485287, rel=1e-6)


def test_simple_and_sgm_uniform_follow_timesteps() -> None:
    sch = DiscreteSchedule()
    np.testing.assert_allclose(
        get_sigmas("simple", 4)[:-1], sch.sigmas[[999, 749, 499, 249]], rtol=1e-6
    )
    np.testing.assert_allclose(
        get_sigmas("sgm_uniform", 4)[:-1],
        sch.t_to_sigma(np.array([999, 749.25, 499.5, 249.75])),
        rtol=1e-6,
    )


def test_unknown_names_and_bad_steps_are_errors() -> None:
    with pytest.raises(SamplingError, match="scheduler"):
        get_sigmas("cosine", 4)
    with pytest.raises(SamplingError, match="steps"):
        get_sigmas("karras", 0)
    with pytest.raises(SamplingError, match="sampling-method"):
        sample("plms", analytic, np.zeros((1, 4, 2, 2)), get_sigmas("discrete", 2))


@pytest.mark.parametrize("prediction", ["eps", "v"])
def test_model_denoiser_scalings_match_k_diffusion(ref, prediction: str) -> None:
    sch = DiscreteSchedule()
    seen: list[float] = []

    def unet(x_in, t, context):
        seen.append(t)
        assert context is cond
        return np.sin(x_in) * (1 + t / 1000.0)

    cond = np.zeros((1, 77, 8), np.float32)
    den = model_denoiser(unet, prediction, cond, schedule=sch)
    x = ref["scaling_x"]
    for s in (0.1, 1.0, 10.0):
        np.testing.assert_allclose(
            den(x, s), ref[f"denoised_{prediction}_{s}"], rtol=1e-5, atol=1e-6
        )
    assert seen[2] == pytest.approx(sch.sigma_to_t(10.0))


def test_model_denoiser_cfg_mixes_outputs() -> None:
    def unet(x_in, t, context):
        return x_in * 0 + context.mean()

    den = model_denoiser(
        unet, "eps", np.full((1, 2, 2), 1.0), np.full((1, 2, 2), 0.25), cfg_scale=3.0
    )
    x = np.ones((1, 4, 2, 2), np.float32)
    # out = u + 3 (c - u) = 0.25 + 3 * 0.75 = 2.5; eps denoised = x - sigma * out
    np.testing.assert_allclose(den(x, 2.0), x - 2.0 * 2.5, rtol=1e-6)


@pytest.mark.parametrize("sched", ["discrete", "karras"])
@pytest.mark.parametrize(
    "method", ["euler", "euler_a", "heun", "dpm2", "dpm++2s_a", "dpm++2m", "dpm++2mv2", "lcm"]
)
def test_samplers_match_reference_float64(ref, sched: str, method: str) -> None:
    sigmas = ref[f"sigmas_{sched}"].astype(np.float64)
    x0 = ref["noise0"].astype(np.float64) * sigmas[0]
    out = sample(method, analytic, x0, sigmas, noise=replay(ref["step_noise"].astype(np.float64)))
    # The stored reference is float32; the float64 runs agree to its rounding.
    np.testing.assert_allclose(out, ref[f"final_{sched}_{method}"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["euler", "euler_a", "dpm++2m", "heun"])
def test_samplers_in_float32_stay_close(ref, method: str) -> None:
    sigmas = get_sigmas("discrete", 8)
    x0 = initial_latent(ref["noise0"], sigmas)
    out = sample(
        method,
        lambda x, s: analytic(x, s).astype(np.float32),
        x0,
        sigmas,
        noise=replay(ref["step_noise"]),
    )
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref[f"final_discrete_{method}"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_ddim_trailing_matches_diffusers(ref, eta: float) -> None:
    sigmas = get_sigmas("discrete", 8).astype(np.float64)
    x0 = ref["noise0"].astype(np.float64) * sigmas[0]
    out = sample(
        "ddim", analytic, x0, sigmas, eta=eta, noise=replay(ref["step_noise"].astype(np.float64))
    )
    key = "final_discrete_ddim_trailing" + ("_eta1" if eta else "")
    np.testing.assert_allclose(out, ref[key], rtol=1e-4, atol=1e-5)


def test_ancestral_sampler_needs_noise() -> None:
    with pytest.raises(SamplingError, match="noise source"):
        sample("euler_a", analytic, np.ones((1, 4, 2, 2)), get_sigmas("discrete", 3))


def test_callback_sees_every_step() -> None:
    steps: list[int] = []
    sample(
        "dpm++2m",
        analytic,
        np.ones((1, 4, 2, 2)),
        get_sigmas("karras", 5),
        callback=lambda i, x, d: steps.append(i),
    )
    assert steps == [0, 1, 2, 3, 4]
    assert set(SAMPLERS) >= {
        "euler",
        "euler_a",
        "heun",
        "dpm2",
        "dpm++2s_a",
        "dpm++2m",
        "lcm",
        "ddim_trailing",
    }


def test_philox_known_answers() -> None:
    # Random123's published Philox4x32-10 test vectors.
    f = PhiloxNoise.philox4x32
    assert f(np.zeros((4, 1), np.uint32), (0, 0)).ravel().tolist() == [
        0x6627E8D5,
        0xE169C58D,
        0xBC57AC4C,
        0x9B00DBD8,
    ]
    ones = np.full((4, 1), 0xFFFFFFFF, np.uint32)
    assert f(ones, (0xFFFFFFFF, 0xFFFFFFFF)).ravel().tolist() == [
        0x408F276D,
        0x41C83B0E,
        0xA20BC7C6,
        0x6D5451FD,
    ]
    pi = np.array([[0x243F6A88], [0x85A308D3], [0x13198A2E], [0x03707344]], np.uint32)
    assert f(pi, (0xA4093822, 0x299F31D0)).ravel().tolist() == [
        0xD16CFE09,
        0x94FDCCEB,
        0x5001E420,
        0x24126EA1,
    ]


def test_philox_noise_matches_torch_cuda_randn_seed_42() -> None:
    # torch.manual_seed(42); torch.randn(8, device="cuda") -- the generator sd-cli imitates.
    out = PhiloxNoise(42).randn((8,))
    np.testing.assert_allclose(
        out, [0.1940, 2.1614, -0.1721, 0.8491, -1.9244, 0.6530, -0.6494, -0.8175], atol=1e-4
    )


def test_philox_noise_is_reproducible_and_advances() -> None:
    a, b = PhiloxNoise(123), PhiloxNoise(123)
    first = a.randn((1, 4, 8, 8))
    np.testing.assert_array_equal(first, b.randn((1, 4, 8, 8)))
    second = a.randn((1, 4, 8, 8))
    assert not np.array_equal(first, second)
    # Element i of a draw depends only on (seed, draw, i): a prefix of a longer draw matches.
    np.testing.assert_array_equal(
        PhiloxNoise(123).randn((10,)), PhiloxNoise(123).randn((100,))[:10]
    )
    big = PhiloxNoise(7).randn((200_000,))
    assert abs(big.mean()) < 0.01 and abs(big.std() - 1) < 0.01
    assert not np.array_equal(PhiloxNoise(2**40 + 5).randn((4,)), PhiloxNoise(5).randn((4,)))


@pytest.mark.parametrize("family", ["sd1", "sd2"])
def test_model_run_fixtures_use_the_discrete_schedule(family: str) -> None:
    run = load_file(str(FIX / f"{family}_ref.safetensors"))
    np.testing.assert_allclose(
        get_sigmas("discrete", len(run["run_sigmas"]) - 1), run["run_sigmas"], rtol=2e-6
    )


def test_every_sampler_name_has_a_dispatch_entry() -> None:
    assert tuple(SAMPLER_FUNCTIONS) == SAMPLERS
    per_sampler = {n for n in samplers.__all__ if n.startswith("sample_")}
    assert {f.__name__ for f in SAMPLER_FUNCTIONS.values()} == per_sampler
    assert all(getattr(samplers, f.__name__) is f for f in SAMPLER_FUNCTIONS.values())
    assert set(FLOW_SAMPLER_FUNCTIONS) == set(FLOW_SAMPLERS)
    # the flow ODE samplers are the same functions; only the noising ones have flow forms
    flow_forms = ("euler_a", "lcm", "dpm++2s_a", "ddim_trailing", "res_multistep", "res_2s",
                  "er_sde", "euler_ge")
    for name, fn in FLOW_SAMPLER_FUNCTIONS.items():
        assert (fn is SAMPLER_FUNCTIONS[name]) == (name not in flow_forms), name


@pytest.mark.parametrize("method", [*SAMPLERS, "ddim", "k_euler", "k_euler_a"])
def test_sample_dispatches_to_the_per_sampler_function(monkeypatch, method: str) -> None:
    sigmas = get_sigmas("karras", 4)
    x0 = initial_latent(PhiloxNoise(1).randn((1, 4, 3, 3)), sigmas)
    before = x0.copy()

    def den(x: np.ndarray, s: float) -> np.ndarray:
        return analytic(x, s).astype(np.float32)

    den.with_uncond = lambda x, s: (den(x, s), (0.5 * den(x, s)).astype(np.float32))

    def run(fn, *args) -> tuple[np.ndarray, list[int]]:
        steps: list[int] = []
        out = fn(*args, den, x0, sigmas, noise=PhiloxNoise(2), eta=0.5,
                 callback=lambda i, x, d: steps.append(i), schedule=DiscreteSchedule())
        return out, steps

    name = {"ddim": "ddim_trailing", "k_euler": "euler", "k_euler_a": "euler_a"}.get(method, method)
    direct, steps = run(SAMPLER_FUNCTIONS[name])
    assert direct.dtype == np.float32 and direct.shape == x0.shape and steps == [0, 1, 2, 3]
    np.testing.assert_array_equal(run(SAMPLER_FUNCTIONS[name])[0], direct)  # deterministic
    np.testing.assert_array_equal(x0, before)  # the start is not modified
    calls: list[str] = []
    real = SAMPLER_FUNCTIONS[name]

    def spy(*args, **kwargs) -> np.ndarray:
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setitem(SAMPLER_FUNCTIONS, name, spy)
    np.testing.assert_array_equal(run(sample, method)[0], direct)
    assert calls == [name]
