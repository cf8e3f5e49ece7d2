"""Flow-matching schedule and samplers: BFL's schedule, exactness on straight flows,
euler_a's flow noising, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flux_util import ref
from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.flow import (
    DEFAULT_STEPS,
    FLOW_SAMPLER_FUNCTIONS,
    FLOW_SAMPLERS,
    flux_mu,
    flux_sigmas,
    sample_flow,
)
from sdplan.core.sampling.noise import PhiloxNoise


def test_schedule_matches_reference_and_formula() -> None:
    np.testing.assert_allclose(flux_sigmas(4, 16), ref()["run_sigmas"], atol=1e-7)
    s = flux_sigmas(20, 4096)
    t = np.linspace(1, 0, 21)[:-1]
    np.testing.assert_allclose(s[:-1], math.exp(1.15) / (math.exp(1.15) + 1 / t - 1), rtol=1e-6)
    assert s[0] == 1.0 and s[-1] == 0.0 and np.all(np.diff(s) < 0)
    assert flux_mu(256) == pytest.approx(0.5) and flux_mu(4096) == pytest.approx(1.15)
    np.testing.assert_allclose(flux_sigmas(4, shift=False), [1, 0.75, 0.5, 0.25, 0])
    assert DEFAULT_STEPS == {"schnell": 4, "dev": 20}


@pytest.mark.parametrize("method", ["euler", "heun", "dpm2", "dpm++2m", "dpm++2mv2", "euler_a", "lcm"])
def test_straight_flow_lands_on_its_target(method) -> None:
    """v = noise - x0 with a fixed x0 is a straight line: every sampler ends at x0."""
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((1, 16, 4, 4)).astype(np.float32)
    noise0 = rng.standard_normal(x0.shape).astype(np.float32)
    seen: list[float] = []

    def vel(x: np.ndarray, s: float) -> np.ndarray:
        seen.append(s)
        return (x - x0) / s

    out = sample_flow(method, vel, noise0, flux_sigmas(6, 64), noise=PhiloxNoise(3))
    np.testing.assert_allclose(out, x0, atol=1e-4)
    assert seen[0] == 1.0


def test_euler_steps_along_the_velocity() -> None:
    rng = np.random.default_rng(1)
    noise0 = rng.standard_normal((1, 16, 2, 2)).astype(np.float32)
    sig = flux_sigmas(3, 4)
    steps: list[np.ndarray] = []
    out = sample_flow("euler", lambda x, s: np.sin(x) * s, noise0, sig, callback=lambda i, x, d: steps.append(x))
    x = noise0.astype(np.float64)
    for i in range(3):
        x = x + (sig[i + 1] - sig[i]) * np.sin(x) * sig[i]
        np.testing.assert_allclose(steps[i], x, atol=1e-5)
    np.testing.assert_allclose(out, x, atol=1e-5)


def test_euler_a_keeps_the_flow_marginal_scale() -> None:
    """With x0 = 0 the noisy latent at s is s * noise: euler_a's renoising keeps std s."""
    noise0 = PhiloxNoise(5).randn((1, 16, 64, 64))
    sig = np.array([1.0, 0.6, 0.3, 0.0], np.float32)
    stds: list[float] = []
    sample_flow("euler_a", lambda x, s: x / s, noise0, sig, noise=PhiloxNoise(6),
                callback=lambda i, x, d: stds.append(float(x.std())))
    np.testing.assert_allclose(stds[:2], [0.6, 0.3], rtol=0.02)
    det = sample_flow("euler_a", lambda x, s: np.cos(x), noise0[..., :4, :4], sig, eta=0.0)
    np.testing.assert_allclose(det, sample_flow("euler", lambda x, s: np.cos(x), noise0[..., :4, :4], sig), atol=1e-6)


def test_errors() -> None:
    with pytest.raises(SamplingError, match="does not apply to flow matching"):
        sample_flow("tcd", lambda x, s: x, np.zeros((1, 1, 2, 2)), flux_sigmas(2, 4))
    with pytest.raises(SamplingError, match="noise source"):
        sample_flow("euler_a", lambda x, s: x, np.zeros((1, 1, 2, 2)), flux_sigmas(2, 4))
    with pytest.raises(SamplingError, match="at least 1"):
        flux_sigmas(0, 4)
    with pytest.raises(SamplingError, match="token count"):
        flux_sigmas(4)
    assert set(FLOW_SAMPLERS) >= {"euler", "euler_a", "heun"}


@pytest.mark.parametrize("method", FLOW_SAMPLERS)
def test_sample_flow_dispatches_to_the_per_sampler_function(monkeypatch, method: str) -> None:
    noise0 = PhiloxNoise(1).randn((1, 16, 2, 2))
    sig = flux_sigmas(4, 16)

    def vel(x: np.ndarray, s: float) -> np.ndarray:
        return np.sin(x) * (1 + s)

    def run() -> np.ndarray:
        return sample_flow(method, vel, noise0, sig, noise=PhiloxNoise(2), eta=0.5)

    first = run()
    assert first.dtype == np.float32 and first.shape == noise0.shape
    np.testing.assert_array_equal(run(), first)  # deterministic
    calls: list[str] = []
    real = FLOW_SAMPLER_FUNCTIONS[method]

    def spy(*args, **kwargs) -> np.ndarray:
        calls.append(method)
        return real(*args, **kwargs)

    monkeypatch.setitem(FLOW_SAMPLER_FUNCTIONS, method, spy)
    np.testing.assert_array_equal(run(), first)
    assert calls == [method]
