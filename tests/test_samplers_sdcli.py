"""sd-cli's other twelve samplers and ten schedulers against references.

``tests/fixtures/samplers_sdcli.safetensors`` comes from ``make_sampler_fixtures.py`` (the
``ref`` extra): k-diffusion (``lms``, ``dpm++2m_sde``), diffusers (the LCM scheduler's
timesteps, Flux / FLUX.2 / LTX-2 flow schedules), scipy (Beta quantiles, normal quantiles),
and for the samplers no library has, the published update rules written again in torch.
All in float64 on the analytic denoiser; here the numpy samplers run in float64 too.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.flow import FLOW_SAMPLER_FUNCTIONS, FLOW_SAMPLERS
from sdplan.core.sampling.noise import StdDefaultNoise, TorchCpuNoise, make_noise
from sdplan.core.sampling.samplers import DEFAULT_ETA, SAMPLER_FUNCTIONS, SAMPLERS, sample
from sdplan.core.sampling.samplers_multistep import BrownianTree, sample_dpmpp_2m_sde_bt
from sdplan.core.sampling.schedules import SCHEDULES, DiscreteSchedule, get_sigmas, model_denoiser
from sdplan.core.sampling.schedules_more import FlowSchedule, beta_ppf, ndtri

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def ref() -> dict[str, np.ndarray]:
    return load_file(str(FIX / "samplers_sdcli.safetensors"))


def analytic(x: np.ndarray, sigma: float) -> np.ndarray:
    c = 1.0 / math.sqrt(1.0 + sigma * sigma)
    return 0.9 * np.tanh(c * x) + 0.1 * sigma / (1.0 + sigma) * np.roll(c * x, 1, axis=1)


def uncond(x: np.ndarray, sigma: float) -> np.ndarray:
    c = 1.0 / math.sqrt(1.0 + sigma * sigma)
    return 0.7 * np.tanh(c * x) - 0.05 * np.roll(c * x, 1, axis=2)


def guided(x: np.ndarray, sigma: float) -> np.ndarray:
    u = uncond(x, sigma)
    return u + 3.0 * (analytic(x, sigma) - u)


guided.with_uncond = lambda x, s: (guided(x, s), uncond(x, s))  # type: ignore[attr-defined]


def flow_den(x: np.ndarray, s: float) -> np.ndarray:
    return 0.8 * np.tanh(x) + 0.1 * (1.0 - s) * np.roll(x, 1, axis=1)


def replay(noise: np.ndarray):
    it = iter(noise)
    return lambda shape: next(it).reshape(shape)


# (method, denoiser, eta, extra) -> fixture key suffix
CASES = {
    "ipndm": (analytic, None, None, "ipndm"),
    "ipndm_v": (analytic, None, None, "ipndm_v"),
    "lms": (analytic, None, None, "lms"),
    "res_multistep": (analytic, None, None, "res_multistep"),
    "res_2s": (analytic, None, None, "res_2s"),
    "er_sde": (analytic, None, None, "er_sde"),
    "euler_cfg_pp": (guided, None, None, "euler_cfg_pp"),
    "euler_a_cfg_pp": (guided, None, None, "euler_a_cfg_pp"),
    "euler_ge": (analytic, None, None, "euler_ge"),
    "dpm++2m_sde": (analytic, None, None, "dpm++2m_sde"),
}


@pytest.mark.parametrize("sched", ["discrete", "karras"])
@pytest.mark.parametrize("method", list(CASES))
def test_samplers_match_references(ref, sched: str, method: str) -> None:
    den, eta, extra, key = CASES[method]
    sigmas = ref[f"sigmas_{sched}"]
    x0 = ref["noise0"] * sigmas[0]
    out = sample(method, den, x0, sigmas, eta=eta, extra=extra, noise=replay(ref["step_noise"]))
    np.testing.assert_allclose(out, ref[f"final_{sched}_{key}"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sched", ["discrete", "karras"])
def test_lms_without_the_history_shift_is_k_diffusions(ref, sched: str) -> None:
    sigmas = ref[f"sigmas_{sched}"]
    out = sample("lms", analytic, ref["noise0"] * sigmas[0], sigmas, extra={"lms_shift": "0"})
    np.testing.assert_allclose(out, ref[f"final_{sched}_lms_k"], rtol=1e-5, atol=1e-6)
    # the shift changes the result (the default is sd-cli's shift 1)
    assert not np.allclose(out, ref[f"final_{sched}_lms"], atol=1e-4)


@pytest.mark.parametrize("gamma", [0.0, 0.3])
def test_tcd_matches_the_rule_in_ddpm_scale(ref, gamma: float) -> None:
    sigmas = ref["sigmas_tcd"]
    out = sample("tcd", analytic, ref["noise0"] * sigmas[0], sigmas, eta=gamma,
                 noise=replay(ref["step_noise"]), schedule=DiscreteSchedule())
    np.testing.assert_allclose(out, ref[f"final_tcd_{gamma}"], rtol=1e-4, atol=1e-5)


def test_flow_forms(ref) -> None:
    sigmas = ref["sigmas_flow"]
    out = FLOW_SAMPLER_FUNCTIONS["dpm++2s_a"](flow_den, ref["noise0"].copy(), sigmas,
                                              noise=replay(ref["step_noise"]))
    np.testing.assert_allclose(out, ref["final_flow_dpm++2s_a"], rtol=1e-5, atol=1e-6)
    out = FLOW_SAMPLER_FUNCTIONS["res_multistep"](flow_den, ref["noise0"].copy(), sigmas)
    np.testing.assert_allclose(out, ref["final_flow_res_multistep"], rtol=1e-5, atol=1e-6)


def test_dpmpp_2m_sde_bt_is_2m_sde_with_tree_noise(ref) -> None:
    sigmas = ref["sigmas_karras"]
    x0 = ref["noise0"] * sigmas[0]
    it = iter(ref["step_noise"])
    out = sample_dpmpp_2m_sde_bt(analytic, x0, sigmas, tree=lambda a, b: next(it))
    np.testing.assert_allclose(out, ref["final_karras_dpm++2m_sde"], rtol=1e-5, atol=1e-6)


def test_brownian_tree_is_brownian_and_step_count_stable() -> None:
    tree = BrownianTree((4096,), 0.03, 14.6, seed=1234)
    # W(b) - W(a) for disjoint intervals: unit variance after scaling, independent
    inc1, inc2 = tree(14.6, 7.0), tree(7.0, 1.0)
    assert abs(inc1.std() - 1) < 0.05 and abs(inc2.std() - 1) < 0.05
    assert abs(float(np.corrcoef(inc1, inc2)[0, 1])) < 0.05
    # the value of W at a sigma does not depend on which other sigmas were asked
    again = BrownianTree((4096,), 0.03, 14.6, seed=1234)
    again(14.6, 3.3)
    np.testing.assert_array_equal(again.w(7.0), tree.w(7.0))
    # an increment is the sum of its halves (W is one path)
    np.testing.assert_allclose(tree.w(14.6) - tree.w(1.0),
                               (tree.w(14.6) - tree.w(7.0)) + (tree.w(7.0) - tree.w(1.0)),
                               atol=1e-5)
    assert BrownianTree.mix64(0, 0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF  # SplitMix64(0)


def test_sampler_defaults_follow_sd_cli() -> None:
    assert len(SAMPLERS) == 21 and SAMPLERS[-1] == "lms" and tuple(SAMPLER_FUNCTIONS) == SAMPLERS
    assert DEFAULT_ETA == {"euler_a": 1.0, "dpm++2s_a": 1.0, "er_sde": 1.0,
                           "euler_a_cfg_pp": 1.0, "dpm++2m_sde": 1.0, "dpm++2m_sde_bt": 1.0}
    assert set(FLOW_SAMPLERS) == set(SAMPLERS) - {"tcd"}
    with pytest.raises(SamplingError, match="unconditional"):
        sample("euler_cfg_pp", analytic, np.ones((1, 4, 2, 2)), get_sigmas("karras", 3))


def test_model_denoiser_gives_the_unconditional_estimate() -> None:
    def unet(x_in, t, context):
        return np.sin(x_in) * context.mean()

    cond, unc = np.full((1, 2, 2), 1.0), np.full((1, 2, 2), 0.25)
    den = model_denoiser(unet, "eps", cond, unc, cfg_scale=3.0)
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 4, 2, 2)
    g, u = den.with_uncond(x, 2.0)
    np.testing.assert_allclose(g, den(x, 2.0))
    np.testing.assert_allclose(u, model_denoiser(unet, "eps", unc)(x, 2.0), rtol=1e-6)


# ----------------------------------------------------------------------------- schedules
@pytest.mark.parametrize("n", [4, 8, 13])
@pytest.mark.parametrize("name", ["lcm", "beta", "kl_optimal", "smoothstep", "logit_normal"])
def test_timestep_schedules_match_references(ref, name: str, n: int) -> None:
    out = get_sigmas(name, n, image_tokens=1024)
    assert out.dtype == np.float32 and out[-1] == 0
    np.testing.assert_allclose(out, ref[f"sched_{name}_{n}"], rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("tokens", [1024, 4096])
@pytest.mark.parametrize("n", [4, 8, 13])
@pytest.mark.parametrize("name", ["flux", "flux2", "ltx2"])
def test_flow_schedules_match_diffusers(ref, name: str, n: int, tokens: int) -> None:
    out = get_sigmas(name, n, image_tokens=tokens)
    np.testing.assert_allclose(out, ref[f"sched_{name}_{n}_{tokens}"], rtol=1e-5, atol=1e-6)


def test_gits_levels_span_the_models_sigmas() -> None:
    sch = DiscreteSchedule()
    rows = {n: get_sigmas("gits", n) for n in range(2, 21)}
    for n, out in rows.items():
        assert out.shape == (n + 1,) and out[-1] == 0 and np.all(np.diff(out) < 0)
        # the published levels start at the SD schedule's sigma_max; their last level (the
        # schedule's sigma_min) is replaced by 0, as sd-cli does
        assert out[0] == pytest.approx(sch.sigma_max, rel=1e-6)
        assert out[-2] > sch.sigma_min
    assert rows[2][1] == pytest.approx(0.803307, rel=1e-6)  # the table's 2-step level
    # beyond 20 steps: the 20-step levels resampled linearly in log sigma
    last = np.append(rows[20][:-1].astype(np.float64), 0.02916753)  # the published 21 levels
    grid = np.linspace(0, 1, 31)
    want = np.exp(np.interp(grid, np.linspace(0, 1, len(last)), np.log(last[::-1])))[::-1]
    np.testing.assert_allclose(get_sigmas("gits", 30)[:-1], want[:-1], rtol=1e-6)
    with pytest.raises(SamplingError, match="2 steps"):
        get_sigmas("gits", 1)


def test_bong_tangent_shape() -> None:
    sch = DiscreteSchedule()
    assert get_sigmas("bong_tangent", 1)[0] == pytest.approx(
        (sch.sigma_max + sch.sigma_min) / 2, rel=1e-6)  # one step starts at the middle stage
    for n in (4, 10, 30):
        out = get_sigmas("bong_tangent", n)
        assert out.shape == (n + 1,) and out[-1] == 0
        assert out[0] == pytest.approx(sch.sigma_max, rel=1e-6)
        assert np.all(np.diff(out[:-1]) <= 0)
    mid = get_sigmas("bong_tangent", 10)
    # the two stages meet at the middle sigma
    assert np.any(np.isclose(mid, (sch.sigma_max + sch.sigma_min) / 2, rtol=1e-5))


def test_quantile_functions() -> None:
    from statistics import NormalDist

    for p in (1e-6, 0.01, 0.3, 0.5, 0.97, 1 - 1e-7):
        assert ndtri(p) == pytest.approx(NormalDist().inv_cdf(p), rel=2e-9, abs=1e-9)
    # Beta(1, 1) is uniform; Beta(a, b) and Beta(b, a) mirror
    assert beta_ppf(0.3, 1.0, 1.0) == pytest.approx(0.3, abs=1e-8)
    assert beta_ppf(0.2, 0.6, 0.6) == pytest.approx(1 - beta_ppf(0.8, 0.6, 0.6), abs=1e-8)


def test_every_scheduler_on_sd_and_flow_models() -> None:
    assert len(SCHEDULES) == 16
    for sch in (DiscreteSchedule(), FlowSchedule(3.0), FlowSchedule(1.15, "flux")):
        for name in SCHEDULES:
            if name == "ays" and isinstance(sch, FlowSchedule):
                continue
            out = get_sigmas(name, 6, sch, image_tokens=4096)
            assert out.shape[0] <= 7 and out[-1] == 0 and np.all(np.diff(out) <= 0), name
    assert get_sigmas("normal", 5).tolist() == get_sigmas("discrete", 5).tolist()
    with pytest.raises(SamplingError, match="token"):
        get_sigmas("flux", 4)


# ----------------------------------------------------------------------------- rng
def test_torch_cpu_noise_matches_torch() -> None:
    # torch.manual_seed(42); torch.randn(20); then torch.randn(5) on the same generator
    g = TorchCpuNoise(42)
    np.testing.assert_allclose(g.randn((20,))[:6], [1.9269, 1.4873, 0.9007, -2.1055, -0.7581,
                                                     1.0783], atol=1e-4)
    np.testing.assert_allclose(g.randn((5,)), [-0.7658, -0.7506, 1.3525, 0.6863, -0.3278],
                               atol=1e-4)
    np.testing.assert_allclose(TorchCpuNoise(42).randn((4,)), [0.3367, 0.1288, 0.2345, 0.2303],
                               atol=1e-4)


def test_std_default_noise_matches_libstdcxx() -> None:
    # std::default_random_engine g(42) and three std::normal_distribution<float> draws of
    # 6, 5 and 6 values, printed by a GCC 12 build
    g = StdDefaultNoise(42)
    want = json.loads("[[-0.901248038, 0.896408677, -1.20271361, -0.490155309, 0.0114701251, "
                      "0.443113595], [-1.67704475, 0.210229442, -0.110191122, 0.920058191, "
                      "-0.811931431], [-0.569248319, -1.00437653, 1.20672989, 0.120552331, "
                      "-0.317240506, 0.178320795]]")
    for expect in want:
        np.testing.assert_allclose(g.randn((len(expect),)), expect, atol=2e-7)
    assert make_noise("cuda", 1).__class__.__name__ == "PhiloxNoise"
    with pytest.raises(SamplingError, match="rng"):
        make_noise("mersenne", 1)
