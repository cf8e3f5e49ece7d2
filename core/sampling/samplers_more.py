"""The rest of sd-cli's samplers: ``tcd``, ``res_2s``, ``er_sde``, ``euler_cfg_pp``,
``euler_a_cfg_pp``, ``euler_ge``, and the rectified-flow form of ``dpm++2s_a``.

Each follows stable-diffusion.cpp's ``src/runtime/denoiser.hpp`` at commit 97d2990: TCD
(Zheng et al. 2024, strategic stochastic sampling, as diffusers' ``TCDScheduler``), RES 2S
(Zhang et al. 2023, second-order single-step exponential integrator, ``c2 = 1/2``), ER-SDE
(Cui et al. 2023, extended reverse-time SDE solver, 3 stages, 200-point integrals), Euler
CFG++ (Chung et al. 2024: the step uses the unconditional estimate), gradient estimation
(Permenter & Yuan 2024, ``gamma`` 2). Shapes, dtypes and arguments as
:class:`~sdplan.core.sampling.sampler_base.Sampler`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.noise import NoiseSource, require_noise
from sdplan.core.sampling.sampler_base import (
    StepCallback,
    ancestral_step,
    ancestral_step_flow,
    guided,
    no_callback,
    sigma_steps,
)
from sdplan.core.sampling.schedules import Denoiser, DiscreteSchedule

__all__ = ["sample_tcd", "sample_res_2s", "sample_er_sde", "sample_euler_cfg_pp",
           "sample_euler_a_cfg_pp", "sample_euler_ge", "sample_dpmpp_2s_ancestral_flow",
           "tcd_timestep"]


def _start(sigmas: np.ndarray, x: np.ndarray, callback: StepCallback | None
           ) -> tuple[list[float], np.ndarray, StepCallback]:
    return sigma_steps(sigmas), np.array(x, copy=True), callback or no_callback


def _step_down(s: float, sn: float, eta: float, flow: bool) -> tuple[float, float, float]:
    if flow:
        return ancestral_step_flow(s, sn, eta)
    down, up = ancestral_step(s, sn, eta)
    return down, up, 1.0


def _phi1(t: float) -> float:
    return 1.0 + t * 0.5 + t * t / 6.0 if abs(t) < 1e-6 else math.expm1(t) / t


def _phi2(t: float) -> float:
    return 0.5 + t / 6.0 + t * t / 24.0 if abs(t) < 1e-6 else (_phi1(t) - 1.0) / t


def tcd_timestep(sigma: float, schedule: DiscreteSchedule) -> int:
    """The training timestep whose sigma is nearest ``sigma`` (ties to the lower one; 0
    below the first, 999 above the last), as sd-cli's TCD maps a sigma back."""
    sig = schedule.sigmas.astype(np.float64)
    hi = int(np.searchsorted(sig, sigma, side="left"))
    if hi == 0:
        return 0
    if hi >= len(sig):
        return len(sig) - 1
    return hi if abs(sig[hi] - sigma) < abs(sig[hi - 1] - sigma) else hi - 1


def sample_tcd(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
               noise: NoiseSource | None = None, eta: float | None = None,
               callback: StepCallback | None = None,
               schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``tcd``: each step jumps to the intermediate timestep ``s = floor((1 - eta) t')`` of
    the next one ``t'`` (:func:`tcd_timestep`): ``x = sqrt(a_s/a') D + sqrt((1-a_s)/a') eps``
    with ``a = 1/(sigma^2 + 1)`` (``a_s`` from ``schedule``'s alphas), then, with
    ``eta > 0`` (the TCD gamma, default 0) and before the last step, re-noises to ``t'``:
    ``sqrt(a'/a_s) x + sqrt(1/a' - 1/a_s)`` times fresh noise."""
    sig, x, cb = _start(sigmas, x, callback)
    eta = 0.0 if eta is None else eta
    sch = schedule or DiscreteSchedule()
    ac = sch.alphas_cumprod.astype(np.float64)
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        t_s = int(math.floor((1.0 - eta) * tcd_timestep(sn, sch)))
        den = denoise(x, s)
        eps = (x - den) / s
        a_prev = 1.0 / (sn * sn + 1.0)
        a_s = float(ac[t_s])
        x = math.sqrt(a_s / a_prev) * den + math.sqrt((1.0 - a_s) / a_prev) * eps
        if eta > 0 and sn > 0:
            x = math.sqrt(a_prev / a_s) * x + math.sqrt(max(1.0 / a_prev - 1.0 / a_s, 0.0)) * \
                require_noise(noise, "tcd")(x.shape).astype(x.dtype)
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def sample_res_2s(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                  noise: NoiseSource | None = None, eta: float | None = None,
                  callback: StepCallback | None = None,
                  schedule: DiscreteSchedule | None = None, flow: bool = False) -> np.ndarray:
    """``res_2s``: a second model call at ``sigma_c = exp(-(t + h/2))`` after the stage
    ``x2 = x + h a21 (D - x)`` (``a21 = phi1(-h/2) / 2``), then
    ``x = x + h (b1 (D - x) + b2 (D2 - x))`` with ``b2 = 2 phi2(-h)``, ``b1 = phi1(-h) - b2``,
    towards the ancestral ``sigma_down`` (``t = -log sigma``); a step to 0 returns ``D``.
    With ``eta > 0`` (default 0) fresh noise times ``sigma_up`` follows (``flow``: the
    rectified-flow ancestral step). ``schedule`` is unused."""
    sig, x, cb = _start(sigmas, x, callback)
    eta = 0.0 if eta is None else eta
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        down, up, alpha = _step_down(s, sn, eta, flow)
        if down == 0.0 or s == 0.0:
            x = den
        else:
            t = -math.log(s)
            h = -math.log(down) - t
            a21 = 0.5 * _phi1(-h * 0.5)
            b2 = _phi2(-h) / 0.5
            b1 = _phi1(-h) - b2
            eps1 = den - x
            x2 = (x + eps1 * (h * a21)).astype(den.dtype, copy=False)
            den2 = denoise(x2, math.exp(-(t + h * 0.5)))
            x = x + h * (b1 * eps1 + b2 * (den2 - x))
        if sn > 0 and up > 0:
            if flow:
                x = x * alpha
            x = x + require_noise(noise, "res_2s")(x.shape).astype(x.dtype) * up
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def _er_noise_scaler(v: float) -> float:
    v = max(v, 0.0)
    return v * (math.exp(v ** 0.3) + 10.0)


def sample_er_sde(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                  noise: NoiseSource | None = None, eta: float | None = None,
                  callback: StepCallback | None = None,
                  schedule: DiscreteSchedule | None = None, flow: bool = False) -> np.ndarray:
    """``er_sde``: the ER-SDE solver in ``lambda = sigma`` (flow: ``sigma/(1 - sigma)`` with
    ``alpha = 1 - sigma``, sigmas clamped to ``[1e-6, 1 - 1e-4]``) with the noise scaler
    ``f(l) = l (e^{l^0.3} + 10)``: ``x = (alpha'/alpha) r x + alpha' (1 - r) D``,
    ``r = f(l')/f(l)``, plus the second and third stage corrections from divided differences
    of the earlier estimates (integrals of ``1/f`` by a 200-point sum), plus
    ``alpha' sqrt(l'^2 - l^2 r^2)`` times fresh noise when ``eta`` (the noise scale,
    default 1) is positive; a step to 0 returns ``D``. ``schedule`` is unused."""
    sig, x, cb = _start(sigmas, x, callback)
    eta = 1.0 if eta is None else eta

    def clamp_flow(v: float) -> float:
        return min(max(v, 1e-6), 1.0 - 1e-4)

    if flow:
        sig = [clamp_flow(v) if v > 1.0 and k + 1 < len(sig) else v for k, v in enumerate(sig)]

    def lam(v: float) -> float:
        if flow:
            v = clamp_flow(v)
            return v / max(1.0 - v, 1e-6)
        return max(v, 1e-6)

    def alpha_of(v: float) -> float:
        return 1.0 - clamp_flow(v) if flow else 1.0

    lams = [lam(v) for v in sig]
    old: np.ndarray | None = None
    old_d: np.ndarray | None = None
    points = 200
    for i in range(len(sig) - 1):
        den = denoise(x, sig[i])
        stage = min(3, i + 1)
        if sig[i + 1] == 0.0:
            x = den
        else:
            ls, lt = lams[i], lams[i + 1]
            a_s, a_t = alpha_of(sig[i]), alpha_of(sig[i + 1])
            fs, ft = _er_noise_scaler(ls), _er_noise_scaler(lt)
            r_alpha = a_t / a_s if a_s > 0 else 0.0
            r = ft / fs if fs > 0 else 0.0
            x = r_alpha * r * x + a_t * (1.0 - r) * den
            if stage >= 2 and old is not None:
                dt = lt - ls
                step = -dt / points
                pos = lt + np.arange(points) * step
                scaled = np.array([_er_noise_scaler(p) for p in pos])
                keep = scaled > 0
                s_int = float(np.sum(1.0 / scaled[keep])) * step
                s_u = float(np.sum((pos[keep] - ls) / scaled[keep])) * step
                denom = ls - lams[i - 1]
                if abs(denom) > 1e-12:
                    den_d = (den - old) / denom
                    x = x + a_t * (dt + s_int * ft) * den_d
                    if stage >= 3 and old_d is not None:
                        denom_u = (ls - lams[i - 2]) * 0.5
                        if abs(denom_u) > 1e-12:
                            x = x + a_t * (0.5 * dt * dt + s_u * ft) * ((den_d - old_d) / denom_u)
                    old_d = den_d
            var = lt * lt - ls * ls * r * r
            if eta > 0 and var > 0:
                x = x + require_noise(noise, "er_sde")(x.shape).astype(x.dtype) * \
                    (a_t * math.sqrt(var))
        old = den
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def sample_euler_cfg_pp(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                        noise: NoiseSource | None = None, eta: float | None = None,
                        callback: StepCallback | None = None,
                        schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``euler_cfg_pp``: Euler CFG++: ``x = D + sigma' (x - D_uncond) / sigma`` (the
    guided estimate, re-noised along the unconditional direction; :func:`guided`).
    ``noise``, ``eta`` and ``schedule`` are unused.

    Raises:
        SamplingError: the denoiser gives no unconditional estimate.
    """
    sig, x, cb = _start(sigmas, x, callback)
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den, den_u = guided(denoise, x, s, "euler_cfg_pp")
        x = (den + (x - den_u) / s * sn).astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def sample_euler_a_cfg_pp(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                          noise: NoiseSource | None = None, eta: float | None = None,
                          callback: StepCallback | None = None,
                          schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``euler_a_cfg_pp``: :func:`sample_euler_cfg_pp` to ``sigma_down``, then fresh noise
    times ``sigma_up`` (:func:`ancestral_step`, ``eta`` default 1). ``schedule`` is unused.

    Raises:
        SamplingError: the denoiser gives no unconditional estimate, or no noise source.
    """
    sig, x, cb = _start(sigmas, x, callback)
    eta = 1.0 if eta is None else eta
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den, den_u = guided(denoise, x, s, "euler_a_cfg_pp")
        down, up = ancestral_step(s, sn, eta)
        x = den + (x - den_u) / s * down
        if sn > 0:
            x = x + require_noise(noise, "euler_a_cfg_pp")(x.shape).astype(x.dtype) * up
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def sample_euler_ge(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                    noise: NoiseSource | None = None, eta: float | None = None,
                    callback: StepCallback | None = None,
                    schedule: DiscreteSchedule | None = None, flow: bool = False,
                    extra: Mapping[str, str] | None = None) -> np.ndarray:
    """``euler_ge``: gradient estimation: Euler steps to ``sigma_down`` with the direction
    ``gamma d + (1 - gamma) d_last`` after the first step (``gamma`` from ``extra``'s
    ``gamma``, default 2); a step to 0 returns ``D``. With ``eta > 0`` (default 0) fresh
    noise times ``sigma_up`` follows (``flow``: the rectified-flow ancestral step).
    ``schedule`` is unused.

    Raises:
        SamplingError: an ``extra`` gamma that is not a number.
    """
    sig, x, cb = _start(sigmas, x, callback)
    eta = 0.0 if eta is None else eta
    text = (extra or {}).get("gamma")
    try:
        gamma = 2.0 if text is None else float(text)
    except ValueError:
        raise SamplingError(f"--extra-sample-args gamma={text!r} is not a number") from None
    old: np.ndarray | None = None
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        if sn == 0.0:
            x = den
        else:
            down, up, alpha = _step_down(s, sn, eta, flow)
            d = (x - den) / s
            direction = d if old is None else d * gamma + old * (1.0 - gamma)
            x = x + direction * (down - s)
            old = d
            if up > 0:
                if flow:
                    x = x * alpha
                x = x + require_noise(noise, "euler_ge")(x.shape).astype(x.dtype) * up
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def sample_dpmpp_2s_ancestral_flow(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                                   noise: NoiseSource | None = None, eta: float | None = None,
                                   callback: StepCallback | None = None,
                                   schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """Flow ``dpm++2s_a``: DPM-Solver++(2S) in the flow's ``lambda = log((1 - s)/s)``
    towards the flow ancestral ``sigma_down``, its midpoint ``sigma_s = 1/(e^m + 1)``,
    ``e^m = sqrt((1-s)/s (1-s_down)/s_down)``, reached by interpolating towards ``D``; at
    ``sigma = 1`` the midpoint call is the first one. Then ``alpha_scale x + sigma_up``
    times fresh noise (``eta`` default 1). A step to 0 returns ``D``. ``schedule`` is
    unused."""
    sig, x, cb = _start(sigmas, x, callback)
    eta = 1.0 if eta is None else eta
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        if sn == 0.0:
            x = den
        else:
            down, up, alpha = ancestral_step_flow(s, sn, eta)
            if 1.0 - s < 1e-6:
                d_i = den
            else:
                exp_s = math.sqrt(((1 - s) / s) * ((1 - down) / down))
                s_mid = 1.0 / (exp_s + 1.0)
                ratio = s_mid / s
                u = (x * ratio + den * (1.0 - ratio)).astype(den.dtype, copy=False)
                d_i = denoise(u, s_mid)
            ratio = down / s
            x = x * ratio + d_i * (1.0 - ratio)
            if eta > 0:
                x = alpha * x + require_noise(noise, "dpm++2s_a")(x.shape).astype(x.dtype) * up
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x
