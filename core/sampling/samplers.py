"""Samplers for SD 1.x / 2.x with sd-cli's names: one function per sampler and a dispatcher.

Each sampler runs a denoiser (:data:`~sdplan.core.sampling.schedules.Denoiser`,
``denoise(x, sigma) -> x0 estimate``) down a descending sigma schedule ending in 0
(:func:`~sdplan.core.sampling.schedules.get_sigmas`), in k-diffusion's formulation
``x = x0 + sigma * noise``. All of them share one signature (:class:`Sampler`):
``sample_xxx(denoise, x, sigmas, *, noise, eta, callback, schedule)``; :data:`SAMPLER_FUNCTIONS`
maps the sd-cli ``--sampling-method`` names of :data:`SAMPLERS` to them and :func:`sample`
dispatches by name (``ddim``, ``k_euler`` and ``k_euler_a`` are accepted as aliases).

The algorithms follow k-diffusion's ``sampling.py`` (euler ... dpm++2m), the webui discussion
8457 (dpm++2mv2), the LCM paper (lcm) and DDIM with "trailing" timesteps (Song et al. 2020,
Lin et al. 2023) as sd-cli and diffusers' DDIMScheduler run it; the rest of sd-cli's 21
(``ipndm`` ... ``lms``) live in :mod:`~sdplan.core.sampling.samplers_multistep` and
:mod:`~sdplan.core.sampling.samplers_more`, each following stable-diffusion.cpp's
``src/runtime/denoiser.hpp`` (commit 97d2990).

Common to every sampler: ``x`` is not modified; each step casts the latent to the denoiser's
output dtype (``ddim_trailing``: to ``x``'s) and then calls ``callback(step, x, denoised)``;
samplers that add noise take a fresh draw from ``noise`` per noised step and fail with
:class:`~sdplan.core.sampling.errors.SamplingError` at that step when ``noise`` is None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.finite import check_finite, finite_steps
from sdplan.core.sampling.names import SAMPLERS
from sdplan.core.sampling.noise import NoiseSource, require_noise
from sdplan.core.sampling.sampler_base import (
    Sampler,
    StepCallback,
    ancestral_step,
    no_callback,
    sigma_steps,
)
from sdplan.core.sampling.samplers_more import (
    sample_er_sde,
    sample_euler_a_cfg_pp,
    sample_euler_cfg_pp,
    sample_euler_ge,
    sample_res_2s,
    sample_tcd,
)
from sdplan.core.sampling.samplers_multistep import (
    sample_dpmpp_2m_sde,
    sample_dpmpp_2m_sde_bt,
    sample_ipndm,
    sample_ipndm_v,
    sample_lms,
    sample_res_multistep,
)
from sdplan.core.sampling.schedules import TIMESTEPS, Denoiser, DiscreteSchedule

_sigma_steps = sigma_steps
_no_callback = no_callback

__all__ = ["SAMPLERS", "StepCallback", "Sampler", "SAMPLER_FUNCTIONS", "ancestral_step",
           "DEFAULT_ETA", "sample", "sample_euler", "sample_euler_ancestral", "sample_heun",
           "sample_dpm2", "sample_dpmpp_2s_ancestral", "sample_dpmpp_2m", "sample_dpmpp_2m_v2",
           "sample_ipndm", "sample_ipndm_v", "sample_lcm", "sample_ddim_trailing",
           "sample_tcd", "sample_res_multistep", "sample_res_2s", "sample_er_sde",
           "sample_euler_cfg_pp", "sample_euler_a_cfg_pp", "sample_euler_ge",
           "sample_dpmpp_2m_sde", "sample_dpmpp_2m_sde_bt", "sample_lms", "TAKES_EXTRA"]

_ALIASES = {"ddim": "ddim_trailing", "k_euler": "euler", "k_euler_a": "euler_a"}
#: sd-cli's ``--eta`` default per sampler (``resolve_eta``); the others take 0 (and most
#: ignore it).
DEFAULT_ETA = {"euler_a": 1.0, "dpm++2s_a": 1.0, "er_sde": 1.0, "euler_a_cfg_pp": 1.0,
               "dpm++2m_sde": 1.0, "dpm++2m_sde_bt": 1.0}
# ----------------------------------------------------------------------------- samplers


def sample_euler(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                 noise: NoiseSource | None = None, eta: float | None = None,
                 callback: StepCallback | None = None,
                 schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``euler``: Euler steps of the probability-flow ODE ``dx/dsigma = (x - D(x)) / sigma``
    (k-diffusion ``sample_euler`` without churn). ``noise``, ``eta`` and ``schedule`` are
    unused. Shapes and dtypes as :class:`Sampler`."""
    sig, x, cb = _sigma_steps(sigmas), np.array(x, copy=True), callback or _no_callback
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        x = x + (x - den) / s * (sn - s)
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def sample_euler_ancestral(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                           noise: NoiseSource | None = None, eta: float | None = None,
                           callback: StepCallback | None = None,
                           schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``euler_a``: an Euler step to ``sigma_down`` then fresh noise times ``sigma_up``
    (:func:`ancestral_step`, ``eta`` default 1; k-diffusion ``sample_euler_ancestral``).
    Draws noise on every step but the last. ``schedule`` is unused."""
    sig, x, cb = _sigma_steps(sigmas), np.array(x, copy=True), callback or _no_callback
    eta_a = 1.0 if eta is None else eta
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        down, up = ancestral_step(s, sn, eta_a)
        x = x + (x - den) / s * (down - s)
        if sn > 0:
            x = x + require_noise(noise, "euler_a")(x.shape).astype(x.dtype) * up
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def sample_heun(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                noise: NoiseSource | None = None, eta: float | None = None,
                callback: StepCallback | None = None,
                schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``heun``: Heun's 2nd-order method (Karras et al. 2022, algorithm 1; k-diffusion
    ``sample_heun`` without churn), an Euler step for the last step to sigma 0. Two model
    calls per step. ``noise``, ``eta`` and ``schedule`` are unused."""
    sig, x, cb = _sigma_steps(sigmas), np.array(x, copy=True), callback or _no_callback
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        d = (x - den) / s
        if sn == 0:
            x = x + d * (sn - s)
        else:
            x2 = x + d * (sn - s)
            d2 = (x2 - denoise(x2, sn)) / sn
            x = x + (d + d2) / 2 * (sn - s)
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def sample_dpm2(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                noise: NoiseSource | None = None, eta: float | None = None,
                callback: StepCallback | None = None,
                schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``dpm2``: DPM-Solver-2 as k-diffusion's ``sample_dpm_2``: the derivative at the
    log-midpoint ``sqrt(sigma sigma_next)`` after a half Euler step, an Euler step for the last
    step to sigma 0. ``noise``, ``eta`` and ``schedule`` are unused."""
    sig, x, cb = _sigma_steps(sigmas), np.array(x, copy=True), callback or _no_callback
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        d = (x - den) / s
        if sn == 0:
            x = x + d * (sn - s)
        else:
            mid = math.exp(0.5 * (math.log(s) + math.log(sn)))
            x2 = x + d * (mid - s)
            x = x + (x2 - denoise(x2, mid)) / mid * (sn - s)
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def sample_dpmpp_2s_ancestral(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                              noise: NoiseSource | None = None, eta: float | None = None,
                              callback: StepCallback | None = None,
                              schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``dpm++2s_a``: DPM-Solver++(2S) to ``sigma_down`` with its midpoint model call at the
    midpoint's noise level, then fresh noise times ``sigma_up`` (``eta`` default 1;
    k-diffusion ``sample_dpmpp_2s_ancestral``). ``schedule`` is unused."""
    sig, x, cb = _sigma_steps(sigmas), np.array(x, copy=True), callback or _no_callback
    eta_a = 1.0 if eta is None else eta
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        down, up = ancestral_step(s, sn, eta_a)
        if down == 0:
            x = den
        else:
            t, t_next = -math.log(s), -math.log(down)
            h = t_next - t
            s_mid = math.exp(-(t + 0.5 * h))
            x2 = (s_mid / s) * x - math.expm1(-0.5 * h) * den
            x = (down / s) * x - math.expm1(-h) * denoise(x2, s_mid)
        if sn > 0:
            x = x + require_noise(noise, "dpm++2s_a")(x.shape).astype(x.dtype) * up
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def _dpmpp_2m(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray,
              callback: StepCallback | None, v2: bool) -> np.ndarray:
    """DPM-Solver++(2M) steps; ``v2`` takes the webui's ratio and averaged step size."""
    sig, x, cb = _sigma_steps(sigmas), np.array(x, copy=True), callback or _no_callback
    old: np.ndarray | None = None
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        if sn == 0:
            x = den
        else:
            t, t_next = -math.log(s), -math.log(sn)
            h = t_next - t
            if old is None:
                x = (sn / s) * x - math.expm1(-h) * den
            else:
                h_last = t - (-math.log(sig[i - 1]))
                if not v2:
                    r, h_eff = h_last / h, h
                else:
                    r, h_eff = max(h_last, h) / min(h_last, h), (h_last + h) / 2
                den_d = (1 + 1 / (2 * r)) * den - (1 / (2 * r)) * old
                x = (sn / s) * x - math.expm1(-h_eff) * den_d
        old = den
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def sample_dpmpp_2m(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                    noise: NoiseSource | None = None, eta: float | None = None,
                    callback: StepCallback | None = None,
                    schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``dpm++2m``: DPM-Solver++(2M), multistep with the previous step's x0 estimate (Lu et al.
    2022; k-diffusion ``sample_dpmpp_2m``); the last step to sigma 0 returns the estimate.
    ``noise``, ``eta`` and ``schedule`` are unused."""
    return _dpmpp_2m(denoise, x, sigmas, callback, v2=False)


def sample_dpmpp_2m_v2(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                       noise: NoiseSource | None = None, eta: float | None = None,
                       callback: StepCallback | None = None,
                       schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``dpm++2mv2``: :func:`sample_dpmpp_2m` with ``r = max(h_last, h) / min(h_last, h)`` and
    the step ``(h_last + h) / 2`` (stable-diffusion-webui discussion 8457, as in sd-cli).
    ``noise``, ``eta`` and ``schedule`` are unused."""
    return _dpmpp_2m(denoise, x, sigmas, callback, v2=True)


def sample_lcm(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
               noise: NoiseSource | None = None, eta: float | None = None,
               callback: StepCallback | None = None,
               schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``lcm``: the consistency-model sampler (Luo et al. 2023, LCM; k-diffusion
    ``sample_lcm``): the x0 estimate, re-noised as ``x0 + sigma_next * noise`` on every step
    but the last. ``eta`` and ``schedule`` are unused."""
    sig, x, cb = _sigma_steps(sigmas), np.array(x, copy=True), callback or _no_callback
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        x = den
        if sn > 0:
            x = x + require_noise(noise, "lcm")(x.shape).astype(x.dtype) * sn
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def sample_ddim_trailing(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                         noise: NoiseSource | None = None, eta: float | None = None,
                         callback: StepCallback | None = None,
                         schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``ddim_trailing``: DDIM (Song et al. 2020, eq. 12) on "trailing" timesteps, through the
    k-space denoiser.

    Only the step count ``len(sigmas) - 1`` is taken from ``sigmas``: timestep ``i`` is
    ``round(1000 - i * 1000 / steps) - 1``, the previous one is 1000 // steps lower
    (``alphas_cumprod[0]`` past the start), with the alphas of ``schedule`` (default SD 1.x),
    as in sd-cli and diffusers' DDIMScheduler with ``timestep_spacing="trailing"``,
    ``set_alpha_to_one=False``. ``x`` enters at k-diffusion scale (``noise * sigma_max``) and
    the result is at DDIM scale (sd-cli's output). ``eta`` (default 0) adds noise per step.
    """
    steps = len(_sigma_steps(sigmas)) - 1
    x, cb = np.array(x, copy=True), callback or _no_callback
    eta = eta or 0.0
    ac = (schedule or DiscreteSchedule()).alphas_cumprod
    dtype = x.dtype
    x_lat: np.ndarray | None = None
    for i in range(steps):
        t = int(math.floor(TIMESTEPS - i * (TIMESTEPS / steps) + 0.5)) - 1
        t_prev = t - TIMESTEPS // steps
        a_t = float(ac[t])
        a_prev = float(ac[t_prev]) if t_prev >= 0 else float(ac[0])
        sigma = math.sqrt((1 - a_t) / a_t)
        if x_lat is None:
            x_k = x * (math.sqrt(sigma * sigma + 1) / sigma)
        else:
            x_k = x_lat * math.sqrt(sigma * sigma + 1)
        x_k = x_k.astype(dtype, copy=False)
        den = denoise(x_k, sigma)
        eps = (x_k - den) / sigma
        std = eta * math.sqrt((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev))
        x_lat = math.sqrt(a_prev) * den + math.sqrt(max(0.0, 1 - a_prev - std * std)) * eps
        if eta > 0:
            x_lat = x_lat + std * require_noise(noise, "ddim_trailing")(x.shape).astype(dtype)
        x_lat = x_lat.astype(dtype, copy=False)
        cb(i, x_lat, den)
    assert x_lat is not None
    return x_lat


#: sd-cli sampler name -> its function (one entry per name of :data:`SAMPLERS`).
SAMPLER_FUNCTIONS: dict[str, Sampler] = {
    "euler": sample_euler,
    "euler_a": sample_euler_ancestral,
    "heun": sample_heun,
    "dpm2": sample_dpm2,
    "dpm++2s_a": sample_dpmpp_2s_ancestral,
    "dpm++2m": sample_dpmpp_2m,
    "dpm++2mv2": sample_dpmpp_2m_v2,
    "ipndm": sample_ipndm,
    "ipndm_v": sample_ipndm_v,
    "lcm": sample_lcm,
    "ddim_trailing": sample_ddim_trailing,
    "tcd": sample_tcd,
    "res_multistep": sample_res_multistep,
    "res_2s": sample_res_2s,
    "er_sde": sample_er_sde,
    "euler_cfg_pp": sample_euler_cfg_pp,
    "euler_a_cfg_pp": sample_euler_a_cfg_pp,
    "euler_ge": sample_euler_ge,
    "dpm++2m_sde": sample_dpmpp_2m_sde,
    "dpm++2m_sde_bt": sample_dpmpp_2m_sde_bt,
    "lms": sample_lms,
}


def sample(
    method: str,
    denoise: Denoiser,
    x: np.ndarray,
    sigmas: np.ndarray,
    *,
    noise: NoiseSource | None = None,
    eta: float | None = None,
    callback: StepCallback | None = None,
    schedule: DiscreteSchedule | None = None,
    extra: Mapping[str, str] | None = None,
) -> np.ndarray:
    """Run a sampler from ``x`` (noise level ``sigmas[0]``) down the schedule ``sigmas``.

    Args:
        method: an sd-cli ``--sampling-method`` name from :data:`SAMPLERS` (or ``ddim``).
        denoise: ``denoise(x, sigma) -> x0 estimate``, arrays of ``x``'s shape and dtype.
        x: starting latent ``(N, C, H, W)``, usually
            :func:`~sdplan.core.sampling.noise.initial_latent`; not modified.
        sigmas: descending sigmas ending in 0
            (:func:`~sdplan.core.sampling.schedules.get_sigmas`); ``len - 1`` steps.
        noise: ``noise(shape) -> standard normals`` for the samplers that add noise
            (``euler_a``, ``dpm++2s_a``, ``lcm``, the SDE samplers, and the others with
            ``eta > 0``), e.g. the seed's :class:`~sdplan.core.sampling.noise.PhiloxNoise`.
        eta: noise amount; None gives sd-cli's default (:data:`DEFAULT_ETA`, else 0).
        callback: called as ``callback(step, x, denoised)`` after each step (previews).
        schedule: the model's noise schedule (``ddim_trailing`` and ``tcd`` read it).
        extra: ``--extra-sample-args`` as key -> text (``lms_max_order``, ``lms_shift``,
            ``lms_divisions`` for ``lms``; ``gamma`` for ``euler_ge``).

    Returns:
        The final latent, ``x``'s shape and dtype. For ``ddim_trailing`` it is at DDIM scale
        (sd-cli's output); for the others it is the sigma = 0 estimate.

    Raises:
        SamplingError: unknown method, bad sigmas, or a missing noise source.
        NonFiniteError: a latent holds NaN or infinite values after a step
            (:mod:`sdplan.core.sampling.finite`).
    """
    name = _ALIASES.get(method, method)
    if name not in SAMPLERS:
        raise SamplingError(f"unknown --sampling-method {method!r} (known: {', '.join(SAMPLERS)})")
    kwargs = {"extra": extra} if name in TAKES_EXTRA else {}
    callback = finite_steps(callback, len(sigmas) - 1)  # NaN/inf: an error, never black
    return check_finite(SAMPLER_FUNCTIONS[name](denoise, x, sigmas, noise=noise, eta=eta, callback=callback,
                                                schedule=schedule, **kwargs), "final latent")


#: Samplers that read ``--extra-sample-args`` (an ``extra`` keyword).
TAKES_EXTRA = frozenset({"lms", "euler_ge"})
