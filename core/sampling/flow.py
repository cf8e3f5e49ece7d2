"""Flow-matching sampling for Flux: the shifted sigma schedule, the flow denoiser and samplers.

Rectified flow (Liu et al. 2022; Esser et al. 2024) interpolates ``x_s = (1 - s) x0 + s noise``
for ``s`` in [0, 1]; the DiT predicts the velocity ``v = noise - x0``, so the x0 estimate is
``x - s v`` (:func:`flow_denoiser`). With that denoiser, k-diffusion's ODE samplers of
:mod:`sdplan.core.sampling.samplers` (euler, heun, dpm2, dpm++2m, dpm++2mv2) integrate the flow ODE
``dx/ds = (x - x0)/s = v`` unchanged: :data:`FLOW_SAMPLER_FUNCTIONS` maps those names to the
same functions :func:`~sdplan.core.sampling.samplers.sample` runs. Samplers that add noise need
the flow form of noising, so they have functions of their own here:
:func:`sample_flow_euler_ancestral` steps down to ``s_down`` and re-noises to ``s_next`` keeping
the signal scale
(``x <- (1 - s_next)/(1 - s_down) x + sqrt(s_next^2 - s_down^2 (1 - s_next)^2/(1 - s_down)^2) n``,
``s_down = s_next (1 + (s_next/s - 1) eta)``), :func:`sample_flow_lcm` re-noises its x0
estimate as ``(1 - s_next) x0 + s_next n``.

Schedule (Black Forest Labs' ``get_schedule``): ``t = linspace(1, 0, steps + 1)``; dev shifts it
as ``e^mu / (e^mu + (1/t - 1))`` with ``mu`` linear in the image token count (0.5 at 256 tokens,
1.15 at 4096); schnell runs unshifted, 4 steps by default.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping

import numpy as np
from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.finite import check_finite, finite_steps
from sdplan.core.sampling.names import FLOW_SAMPLERS
from sdplan.core.sampling.noise import NoiseSource, require_noise
from sdplan.core.sampling.samplers import (
    SAMPLER_FUNCTIONS,
    TAKES_EXTRA,
    StepCallback,
    sample_er_sde,
    sample_euler_ge,
    sample_res_2s,
    sample_res_multistep,
)
from sdplan.core.sampling.samplers_more import sample_dpmpp_2s_ancestral_flow
from sdplan.core.sampling.schedules import Denoiser, DiscreteSchedule

__all__ = ["FLOW_SAMPLERS", "FLOW_SAMPLER_FUNCTIONS", "DEFAULT_STEPS", "flux_mu", "flux2_mu", "time_shift",
           "flux_sigmas", "discrete_flow_sigmas", "flow_denoiser", "sample_flow_euler_ancestral",
           "sample_flow_lcm", "sample_flow_ddim_trailing", "sample_flow", "guided_velocity"]

#: Steps when none are given: schnell is distilled for 4, dev runs sd-cli's default 20.
DEFAULT_STEPS = {"schnell": 4, "dev": 20}
VelocityFn = Callable[[np.ndarray, float], np.ndarray]


def flux_mu(image_tokens: int, base_shift: float = 0.5, max_shift: float = 1.15,
            base_tokens: int = 256, max_tokens: int = 4096) -> float:
    """The time shift ``mu`` for ``image_tokens`` patches (linear through (256, 0.5) and
    (4096, 1.15); a 1024x1024 image has 4096)."""
    slope = (max_shift - base_shift) / (max_tokens - base_tokens)
    return base_shift + slope * (image_tokens - base_tokens)


def flux2_mu(image_tokens: int, steps: int) -> float:
    """FLUX.2's empirical time shift ``mu`` for ``image_tokens`` latent cells (``H/16 * W/16``)
    and ``steps`` (Black Forest Labs' ``flux2`` ``compute_empirical_mu``; stable-diffusion.cpp
    ``Flux2Scheduler``; diffusers ``Flux2KleinPipeline``): above 4300 tokens
    ``0.00016927 n + 0.45666666``; otherwise linear in the steps through that value at 200
    steps and ``8.73809524e-05 n + 1.89833333`` at 10 steps."""
    a1, b1, a2, b2 = 8.73809524e-05, 1.89833333, 0.00016927, 0.45666666
    m200 = a2 * image_tokens + b2
    if image_tokens > 4300:
        return m200
    m10 = a1 * image_tokens + b1
    a = (m200 - m10) / 190.0
    return a * steps + m200 - 200.0 * a


def time_shift(mu: float, t: np.ndarray) -> np.ndarray:
    """``e^mu / (e^mu + (1/t - 1))`` elementwise (0 stays 0, 1 stays 1)."""
    t = np.asarray(t, dtype=np.float64)
    out = np.zeros_like(t)
    pos = t > 0
    out[pos] = math.exp(mu) / (math.exp(mu) + (1.0 / t[pos] - 1.0))
    return out


def flux_sigmas(steps: int, image_tokens: int | None = None, *, shift: bool = True,
                mu: float | None = None) -> np.ndarray:
    """Descending float32 sigmas ``(steps + 1,)`` from 1 to 0.

    Args:
        steps: sampling steps (>= 1).
        image_tokens: patches of the latent (``H/16 * W/16`` pixels); sets ``mu`` when
            ``shift`` and no ``mu`` is given.
        shift: apply the time shift (dev); False gives the plain linear schedule (schnell).
        mu: an explicit shift.

    Raises:
        SamplingError: steps below 1, or a shift without ``image_tokens`` or ``mu``.
    """
    if steps < 1:
        raise SamplingError(f"steps must be at least 1, got {steps}")
    t = np.linspace(1.0, 0.0, steps + 1)
    if shift:
        if mu is None:
            if image_tokens is None or image_tokens < 1:
                raise SamplingError("the shifted Flux schedule needs the image token count or mu")
            mu = flux_mu(image_tokens)
        t = time_shift(mu, t)
    return t.astype(np.float32)


def discrete_flow_sigmas(steps: int, shift: float = 3.0) -> np.ndarray:
    """sd-cli's sigmas for its discrete flow models (SD3, Z-Image...): descending float32
    ``(steps + 1,)`` ending in 0.

    stable-diffusion.cpp's ``DiscreteFlowDenoiser`` with its default (``discrete``) scheduler:
    ``t_i = 999 - i * 999 / (steps - 1)`` (one step: ``t = 999``), ``sigma_i = s(shift,
    (t_i + 1) / 1000)`` with ``s(a, t) = a t / (1 + (a - 1) t)``, then a final 0. Z-Image's
    shift is 3 (its scheduler config and sd-cli's default for the family).

    Raises:
        SamplingError: steps below 1 or a shift that is not positive.
    """
    if steps < 1:
        raise SamplingError(f"steps must be at least 1, got {steps}")
    if not shift > 0:
        raise SamplingError(f"the flow shift must be positive, got {shift}")
    t = np.array([999.0]) if steps == 1 else 999.0 - np.arange(steps) * (999.0 / (steps - 1))
    t = (t + 1.0) / 1000.0
    s = shift * t / (1.0 + (shift - 1.0) * t)
    return np.append(s, 0.0).astype(np.float32)


def flow_denoiser(velocity: VelocityFn) -> Denoiser:
    """``denoise(x, s) = x - s * velocity(x, s)`` as float32 of ``x``'s shape: the rectified-flow
    x0 estimate, a denoiser for the samplers of :data:`FLOW_SAMPLER_FUNCTIONS`. Its
    ``with_uncond`` (the CFG++ samplers) gives the guided and the unconditional estimates from
    ``velocity.with_uncond(x, s) -> (v, v_uncond)`` when the velocity has it (classifier-free
    guidance with a negative prompt; :func:`guided_velocity`), else the guided one twice (a
    velocity guided already, as FLUX.1's distilled guidance)."""
    pair = getattr(velocity, "with_uncond", None)

    def denoise(x: np.ndarray, s: float) -> np.ndarray:
        return (x - np.float32(s) * velocity(x, s)).astype(np.float32)

    def both(x: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray]:
        if pair is None:
            d = denoise(x, s)
            return d, d
        v, vu = pair(x, s)
        return (x - np.float32(s) * v).astype(np.float32), (x - np.float32(s) * vu).astype(np.float32)

    denoise.with_uncond = both  # type: ignore[attr-defined]
    return denoise


def guided_velocity(cond: VelocityFn, uncond: VelocityFn | None, cfg_scale: float) -> VelocityFn:
    """Classifier-free guidance of a flow model: ``v = u + cfg (c - u)`` of the velocities on
    the prompt (``cond``) and on the negative prompt (``uncond``; None: ``cond`` alone, no
    guidance), float32; its ``with_uncond(x, s) -> (v, u)`` gives the CFG++ samplers the
    unconditional velocity from the same two DiT passes (:func:`flow_denoiser`)."""
    if uncond is None:
        return cond
    scale = np.float32(cfg_scale)

    def both(x: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray]:
        c, u = cond(x, s), uncond(x, s)
        return (u + scale * (c - u)).astype(np.float32), u

    def vel(x: np.ndarray, s: float) -> np.ndarray:
        return both(x, s)[0]

    vel.with_uncond = both  # type: ignore[attr-defined]
    return vel


def _flow_sigma_steps(sigmas: np.ndarray) -> list[float]:
    sig = [float(s) for s in np.asarray(sigmas, dtype=np.float64)]
    if (len(sig) < 2 or any(b > a for a, b in zip(sig, sig[1:], strict=False)) or sig[-1] < 0
            or sig[0] > 1):
        raise SamplingError(f"flow sigmas must descend from at most 1 to 0, got {sig[:4]}...")
    return sig


def sample_flow_euler_ancestral(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                                noise: NoiseSource | None = None, eta: float | None = None,
                                callback: StepCallback | None = None,
                                schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """Flow ``euler_a``: an Euler step to ``s_down = s_next (1 + (s_next/s - 1) eta)``, then
    re-noising to ``s_next`` at the flow's signal scale (module docstring; the rectified-flow
    form of k-diffusion's ``sample_euler_ancestral``, as ComfyUI's ``sample_euler_ancestral_RF``).
    The last step to 0 returns the x0 estimate.

    Args as :class:`~sdplan.core.sampling.samplers.Sampler`: ``x`` float32 ``(N, C, H, W)`` at
    ``sigmas[0] <= 1``; ``eta`` default 1 (0 draws no noise and is euler); ``schedule`` unused.
    Returns float32 of ``x``'s shape.

    Raises:
        SamplingError: sigmas not descending from at most 1 to 0, or no ``noise`` with
            ``eta > 0``.
    """
    sig, cb = _flow_sigma_steps(sigmas), callback or (lambda i, x_, d_: None)
    eta = 1.0 if eta is None else eta
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        d0 = denoise(x, s)
        if sn == 0:
            x = d0
        else:
            down = sn * (1 + (sn / s - 1) * eta)
            x = x + (x - d0) / s * (down - s)
            if eta > 0:
                a_next, a_down = 1 - sn, 1 - down
                renoise = math.sqrt(max(sn**2 - down**2 * a_next**2 / a_down**2, 0.0))
                draw = require_noise(noise, "euler_a")(x.shape).astype(np.float32)
                x = (a_next / a_down) * x + renoise * draw
        x = x.astype(np.float32)
        cb(i, x, d0)
    return x


def sample_flow_lcm(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                    noise: NoiseSource | None = None, eta: float | None = None,
                    callback: StepCallback | None = None,
                    schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """Flow ``lcm``: the x0 estimate, re-noised as ``(1 - s_next) x0 + s_next n`` on every step
    but the last (the rectified-flow form of the LCM sampler; Luo et al. 2023).

    Args as :class:`~sdplan.core.sampling.samplers.Sampler`: ``x`` float32 ``(N, C, H, W)`` at
    ``sigmas[0] <= 1``; ``eta`` and ``schedule`` unused. Returns float32 of ``x``'s shape.

    Raises:
        SamplingError: sigmas not descending from at most 1 to 0, or no ``noise``.
    """
    sig, cb = _flow_sigma_steps(sigmas), callback or (lambda i, x_, d_: None)
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        d0 = denoise(x, s)
        x = d0
        if sn > 0:
            x = (1 - sn) * x + sn * require_noise(noise, "lcm")(x.shape).astype(np.float32)
        x = x.astype(np.float32)
        cb(i, x, d0)
    return x


def sample_flow_ddim_trailing(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                              noise: NoiseSource | None = None, eta: float | None = None,
                              callback: StepCallback | None = None,
                              schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """Flow ``ddim_trailing``: as sd-cli runs it on a flow model, the flow ``euler_a``
    (:func:`sample_flow_euler_ancestral`) with ``eta`` default 0 (plain DDIM: deterministic
    steps along the flow); arguments as there."""
    return sample_flow_euler_ancestral(denoise, x, sigmas, noise=noise,
                                       eta=0.0 if eta is None else eta, callback=callback)


#: Flow sampler name -> its function: the ODE samplers are k-diffusion's, unchanged; the ones
#: that add noise use the flow's ancestral step (sd-cli's ``is_flow_denoiser`` branches).
FLOW_SAMPLER_FUNCTIONS: dict[str, Callable[..., np.ndarray]] = {
    **{name: SAMPLER_FUNCTIONS[name] for name in FLOW_SAMPLERS},
    "euler_a": sample_flow_euler_ancestral,
    "dpm++2s_a": sample_dpmpp_2s_ancestral_flow,
    "lcm": sample_flow_lcm,
    "ddim_trailing": sample_flow_ddim_trailing,
    "res_multistep": functools.partial(sample_res_multistep, flow=True),
    "res_2s": functools.partial(sample_res_2s, flow=True),
    "er_sde": functools.partial(sample_er_sde, flow=True),
    "euler_ge": functools.partial(sample_euler_ge, flow=True),
}


def sample_flow(method: str, velocity: VelocityFn, noise0: np.ndarray, sigmas: np.ndarray, *,
                noise: NoiseSource | None = None, eta: float | None = None,
                callback: StepCallback | None = None,
                extra: Mapping[str, str] | None = None) -> np.ndarray:
    """Sample from pure noise ``noise0`` (sigma ``sigmas[0]``, usually 1) down to 0.

    Args:
        method: a name of :data:`FLOW_SAMPLERS`.
        velocity: ``velocity(x, s) -> v`` of ``x``'s shape.
        noise0: the starting noise ``(N, C, H, W)``; the start is ``sigmas[0] * noise0``
            (exact for ``sigmas[0] = 1``).
        sigmas: descending to 0 (:func:`flux_sigmas`).
        noise: fresh normals per step for the samplers that add noise.
        eta: noise amount; None gives sd-cli's default for the sampler (euler_a: 1).
        callback: ``callback(step, x, denoised)`` after each step.
        extra: ``--extra-sample-args`` (``lms``, ``euler_ge``).

    Returns:
        The final latent, float32 ``(N, C, H, W)``.

    Raises:
        SamplingError: unknown method, a sampler that does not apply to flow matching, bad
            sigmas or a missing noise source.
        NonFiniteError: a latent holds NaN or infinite values after a step
            (:mod:`sdplan.core.sampling.finite`).
    """
    if method not in FLOW_SAMPLERS:
        raise SamplingError(f"--sampling-method {method!r} does not apply to flow matching "
                            f"(Flux takes: {', '.join(FLOW_SAMPLERS)})")
    den = flow_denoiser(velocity)
    x = (np.asarray(noise0, dtype=np.float32) * np.float32(sigmas[0])).astype(np.float32)
    kwargs = {"extra": extra} if method in TAKES_EXTRA else {}
    callback = finite_steps(callback, len(sigmas) - 1)  # NaN/inf: an error, never black
    return check_finite(FLOW_SAMPLER_FUNCTIONS[method](den, x, sigmas, noise=noise, eta=eta,
                                                       callback=callback, **kwargs), "final latent")
