"""Noise schedules and the k-diffusion denoiser parameterisation for SD 1.x / 2.x / XL.

Everything here works in k-diffusion's formulation (Karras et al. 2022, "Elucidating the Design
Space of Diffusion-Based Generative Models"): the latent at noise level ``sigma`` is
``x = x0 + sigma * noise`` and a *denoiser* is a callable ``denoise(x, sigma) -> x0_estimate``
with arrays of the latent's shape (:data:`Denoiser`, what the samplers of
:mod:`sdplan.core.sampling.samplers` run).

- :class:`DiscreteSchedule`: the 1000-step DDPM schedule as sigmas (k-diffusion's
  ``DiscreteSchedule`` in ``external.py``).
- :func:`get_sigmas`: the sigmas of a sampling run for an sd-cli ``--scheduler`` name:
  ``discrete`` (also ``default``), ``karras``, ``exponential``, ``ays``, ``sgm_uniform``,
  ``simple`` here, the other ten of :data:`SCHEDULES` in
  :mod:`~sdplan.core.sampling.schedules_more`.
- :func:`scalings` and :func:`model_denoiser`: a UNet's eps or v output as a denoiser
  (k-diffusion's ``CompVisDenoiser`` / ``CompVisVDenoiser``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np
from sdplan.core.families import family as registry_family
from sdplan.core.sampling import schedules_more as sm
from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.names import SCHEDULES, TOKEN_SCHEDULES
from sdplan.core.sampling.schedules_more import FlowSchedule

__all__ = ["TIMESTEPS", "Denoiser", "DiscreteSchedule", "SCHEDULES", "get_sigmas", "scalings",
           "UNetFn", "model_denoiser"]

#: Training timesteps of the DDPM schedule.
TIMESTEPS = 1000
#: ``denoise(x, sigma) -> x0 estimate``, arrays of ``x``'s shape (and dtype, for float32 ``x``).
Denoiser = Callable[[np.ndarray, float], np.ndarray]


# --------------------------------------------------------------------------- noise schedule


class DiscreteSchedule:
    """The 1000-step DDPM noise schedule of SD 1.x/2.x as sigmas (k-diffusion's CompVis wrapper).

    ``betas = linspace(sqrt(0.00085), sqrt(0.012), 1000) ** 2`` ("scaled linear"),
    ``alphas_cumprod = cumprod(1 - betas)``, ``sigma_t = sqrt((1 - a_t) / a_t)``, computed in
    float32 like sd-cli, LDM and diffusers. ``t_to_sigma`` interpolates log-sigma linearly.

    Attributes:
        alphas_cumprod: float32 ``(1000,)``, decreasing.
        sigmas: float32 ``(1000,)``, increasing with ``t``.
        log_sigmas: float64 ``(1000,)``, ``log(sigmas)``.
    """

    def __init__(self, linear_start: float = 0.00085, linear_end: float = 0.012) -> None:
        root = np.linspace(math.sqrt(linear_start), math.sqrt(linear_end), TIMESTEPS)
        betas = root.astype(np.float32) ** 2
        self.alphas_cumprod = np.cumprod(np.float32(1.0) - betas, dtype=np.float32)
        ac = self.alphas_cumprod
        self.sigmas = np.sqrt((np.float32(1.0) - ac) / ac).astype(np.float32)
        self.log_sigmas = np.log(self.sigmas.astype(np.float64))

    @property
    def sigma_min(self) -> float:
        """Smallest sigma (t = 0), about 0.0292."""
        return float(self.sigmas[0])

    @property
    def sigma_max(self) -> float:
        """Largest sigma (t = 999), about 14.6146."""
        return float(self.sigmas[-1])

    def t_to_sigma(self, t: float | np.ndarray) -> np.ndarray:
        """Sigma at (fractional) timestep ``t`` in ``[0, 999]``, log-linear interpolated.

        ``t`` a scalar or array of any shape; returns float64 of ``t``'s shape (k-diffusion's
        ``DiscreteSchedule.t_to_sigma``).
        """
        t = np.asarray(t, dtype=np.float64)
        lo = np.floor(t).astype(np.int64)
        hi = np.ceil(t).astype(np.int64)
        w = t - lo
        return np.exp((1.0 - w) * self.log_sigmas[lo] + w * self.log_sigmas[hi])

    def sigma_to_t(self, sigma: float) -> float:
        """Fractional timestep of ``sigma`` (inverse of :meth:`t_to_sigma`, clamped to 0..999;
        k-diffusion's ``DiscreteSchedule.sigma_to_t``, not quantized)."""
        log_sigma = math.log(sigma)
        dists = log_sigma - self.log_sigmas
        low = int(np.clip(np.count_nonzero(dists >= 0) - 1, 0, TIMESTEPS - 2))
        lo_v, hi_v = self.log_sigmas[low], self.log_sigmas[low + 1]
        w = min(1.0, max(0.0, (lo_v - log_sigma) / (lo_v - hi_v)))
        return (1.0 - w) * low + w * (low + 1)


# ----------------------------------------------------------------------------- schedules

# Align Your Steps noise levels (NVIDIA, 2024) as sd-cli ships them.
_AYS_SD1 = [
    14.6146412293,
    6.4745760956,
    3.8636745985,
    2.6946151520,
    1.8841921177,
    1.3943805092,
    0.9642583904,
    0.6523686016,
    0.3977456272,
    0.1515232662,
    0.0291671582,
]
_AYS_SDXL = [
    14.6146412293,
    6.3184485287,
    3.7681790315,
    2.1811480769,
    1.3405244945,
    0.8620721141,
    0.5550693289,
    0.3798540708,
    0.2332364134,
    0.1114188177,
    0.0291671582,
]
#: Align Your Steps tables by name (a family's ``ays_levels``).
_AYS_LEVELS = {"sd15": _AYS_SD1, "sdxl": _AYS_SDXL}



def _loglinear_resample(levels: list[float], n: int) -> np.ndarray:
    xs = np.linspace(0.0, 1.0, len(levels))
    ys = np.log(np.asarray(levels[::-1], dtype=np.float64))
    return np.exp(np.interp(np.linspace(0.0, 1.0, n), xs, ys))[::-1]


def _ays_table(name: str) -> str:
    """The Align Your Steps table of a family name, or ``name`` itself (a table's name)."""
    fam = registry_family(name)
    return fam.ays_levels if fam is not None else name


def get_sigmas(
    scheduler: str,
    steps: int,
    schedule: DiscreteSchedule | FlowSchedule | None = None,
    family: str = "sd1",
    image_tokens: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> np.ndarray:
    """The ``steps + 1`` descending sigmas of a schedule, the last one 0.

    Args:
        scheduler: an sd-cli ``--scheduler`` name from :data:`SCHEDULES`, ``default`` or
            ``normal``.
        steps: number of sampling steps, >= 1.
        schedule: the model's noise schedule (default: SD 1.x/2.x :class:`DiscreteSchedule`;
            a flow model's :class:`~sdplan.core.sampling.schedules_more.FlowSchedule`).
        family: a family's name (``sd1``, ``sdxl``...) or an Align Your Steps table
            (``sd15``, ``sdxl``); only ``ays`` uses it: the family's
            :attr:`~sdplan.core.families.declaration.Family.ays_levels` (SDXL's levels for
            SDXL, SD 1.5's otherwise).
        image_tokens: the latent's patch count, for :data:`TOKEN_SCHEDULES`.
        extra: ``--extra-sample-args`` (``beta``: ``alpha``, ``beta``; ``flux``:
            ``base_shift``, ``max_shift``; ``ltx2`` and ``logit_normal``: theirs).

    Returns:
        float32 array of length ``steps + 1``.

    Raises:
        SamplingError: unknown scheduler name, ``steps < 1``, a token schedule without
            ``image_tokens``, a bad ``extra`` value.

    Formulas: discrete and sgm_uniform/simple use timesteps mapped by ``t_to_sigma``
    (k-diffusion's DiscreteSchedule.get_sigmas / sd-cli); karras is Karras et al. eq. 5 with
    rho = 7; exponential is log-uniform between sigma_max and sigma_min (k-diffusion's
    ``get_sigmas_karras`` / ``get_sigmas_exponential``); ays is sd-cli's Align Your Steps
    table, resampled log-linearly for other step counts.
    """
    if not isinstance(steps, int) or steps < 1:
        raise SamplingError(f"--steps must be a positive integer, got {steps!r}")
    sch = schedule or DiscreteSchedule()
    name = "discrete" if scheduler in ("default", "normal") else scheduler
    smin, smax = sch.sigma_min, sch.sigma_max
    if name in _MORE or name in TOKEN_SCHEDULES or name == "beta":
        return np.asarray(_more_sigmas(name, steps, sch, image_tokens, extra),
                          dtype=np.float64).astype(np.float32)
    t_max = TIMESTEPS - 1
    if name == "discrete":
        if steps == 1:
            body = sch.t_to_sigma(np.array([float(t_max)]))
        else:
            body = sch.t_to_sigma(np.linspace(t_max, 0.0, steps))
    elif name == "karras":
        rho = 7.0
        ramp = np.linspace(0.0, 1.0, steps) if steps > 1 else np.zeros(1)
        lo, hi = max(smin, 1e-6) ** (1 / rho), smax ** (1 / rho)
        body = (hi + ramp * (lo - hi)) ** rho
    elif name == "exponential":
        body = np.exp(np.linspace(math.log(smax), math.log(smin), steps))
    elif name == "ays":
        levels = _AYS_LEVELS.get(_ays_table(family), _AYS_SD1)
        body = (
            _loglinear_resample(levels, steps + 1)[:-1]
            if steps + 1 != len(levels)
            else np.array(levels[:-1])
        )
    elif name == "sgm_uniform":
        body = sch.t_to_sigma(np.linspace(t_max, 0.0, steps + 1)[:-1])
    elif name == "simple":
        idx = t_max - (np.arange(steps) * (TIMESTEPS / steps)).astype(np.int64)
        body = sch.t_to_sigma(np.maximum(idx, 0).astype(np.float64))
    else:
        known = ", ".join(SCHEDULES)
        raise SamplingError(f"unknown --scheduler {scheduler!r} (known: {known})")
    return np.append(np.asarray(body, dtype=np.float64), 0.0).astype(np.float32)


_MORE = {"gits": sm.gits_sigmas, "smoothstep": sm.smoothstep_sigmas,
         "kl_optimal": sm.kl_optimal_sigmas, "lcm": sm.lcm_sigmas,
         "bong_tangent": sm.bong_tangent_sigmas}


def _more_sigmas(name: str, steps: int, sch: DiscreteSchedule | FlowSchedule,
                 image_tokens: int | None, extra: Mapping[str, str] | None) -> list[float]:
    def t_to_sigma(t: float) -> float:
        return float(sch.t_to_sigma(t))

    if name in _MORE:
        return _MORE[name](steps, sch.sigma_min, sch.sigma_max, t_to_sigma)
    if name == "beta":
        return sm.beta_sigmas(steps, sch.sigma_min, sch.sigma_max, t_to_sigma, extra)
    if image_tokens is None or image_tokens < 1:
        raise SamplingError(f"--scheduler {name} needs the image's token count")
    if name == "flux":
        return sm.flux_sigmas_mu(steps, sm.flux_mu_for(image_tokens, extra))
    if name == "flux2":
        return sm.flux2_sigmas(steps, image_tokens)
    if name == "ltx2":
        return sm.ltx2_sigmas(steps, image_tokens, extra)
    return sm.logit_normal_sigmas(steps, image_tokens, extra)


# ----------------------------------------------------------------------- model wrappers


def scalings(sigma: float, prediction: str, sigma_data: float = 1.0) -> tuple[float, float, float]:
    """``(c_skip, c_out, c_in)`` so that ``x0 = c_skip * x + c_out * F(c_in * x, t)``.

    ``eps``: (1, -sigma, 1/sqrt(sigma^2 + 1)) (k-diffusion CompVisDenoiser);
    ``v``: (1/(sigma^2 + 1), -sigma/sqrt(sigma^2 + 1), 1/sqrt(sigma^2 + 1))
    (CompVisVDenoiser), with sigma_data = 1. Python floats in and out.

    Raises:
        SamplingError: ``prediction`` is neither ``eps`` nor ``v``.
    """
    sd2 = sigma_data * sigma_data
    c_in = 1.0 / math.sqrt(sigma * sigma + sd2)
    if prediction == "eps":
        return 1.0, -sigma, c_in
    if prediction == "v":
        return sd2 / (sigma * sigma + sd2), -sigma * sigma_data * c_in, c_in
    raise SamplingError(f"unknown prediction type {prediction!r} (known: eps, v)")


class UNetFn(Protocol):
    """The engine's UNet: ``unet(x_in, t, context) -> output`` (eps or v), shapes as x_in."""

    def __call__(self, x_in: np.ndarray, t: float, context: np.ndarray) -> np.ndarray: ...


def model_denoiser(
    unet: UNetFn,
    prediction: str,
    cond: np.ndarray,
    uncond: np.ndarray | None = None,
    cfg_scale: float = 1.0,
    schedule: DiscreteSchedule | None = None,
) -> Denoiser:
    """A denoiser from a UNet with classifier-free guidance.

    Per call: ``t = sigma_to_t(sigma)``, ``out = unet(c_in x, t, cond)``; with ``uncond`` and
    ``cfg_scale != 1`` also ``u = unet(c_in x, t, uncond)`` and ``out = u + cfg (out - u)``;
    returns ``c_skip x + c_out out`` in ``x``'s shape and dtype (k-diffusion's
    ``DiscreteEpsDDPMDenoiser`` / ``DiscreteVDDPMDenoiser`` forward, CFG as in sd-cli). Its
    ``with_uncond(x, sigma)`` gives that estimate and the unconditional one (the guided one
    again without ``uncond``), for the CFG++ samplers.

    Raises:
        SamplingError: ``prediction`` is neither ``eps`` nor ``v``.
    """
    sch = schedule or DiscreteSchedule()
    scalings(1.0, prediction)  # validates the name

    def both(x: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
        c_skip, c_out, c_in = scalings(float(sigma), prediction)
        t = sch.sigma_to_t(float(sigma))
        x_in = (x * c_in).astype(x.dtype, copy=False)
        out = unet(x_in, t, cond)
        out_u = out
        if uncond is not None and cfg_scale != 1.0:
            out_u = unet(x_in, t, uncond)
            out = out_u + cfg_scale * (out - out_u)
        return ((x * c_skip + out * c_out).astype(x.dtype, copy=False),
                (x * c_skip + out_u * c_out).astype(x.dtype, copy=False))

    def denoise(x: np.ndarray, sigma: float) -> np.ndarray:
        return both(x, sigma)[0]

    denoise.with_uncond = both  # type: ignore[attr-defined]
    return denoise
