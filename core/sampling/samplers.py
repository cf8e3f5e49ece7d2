"""Sigma schedules, samplers and seeded noise for SD 1.x / 2.x, with sd-cli's names.

Everything here works in k-diffusion's formulation (Karras et al. 2022, "Elucidating the Design
Space of Diffusion-Based Generative Models"): the latent at noise level ``sigma`` is
``x = x0 + sigma * noise`` and a *denoiser* is a callable ``denoise(x, sigma) -> x0_estimate``
with arrays of the latent's shape. :func:`model_denoiser` builds one from a UNet callable and
the eps or v prediction scalings; :func:`sample` runs a sampler over a sigma schedule.

Sampler names (sd-cli's ``--sampling-method``): ``euler``, ``euler_a``, ``heun``, ``dpm2``,
``dpm++2s_a``, ``dpm++2m``, ``dpm++2mv2``, ``lcm``, ``ddim_trailing`` (``ddim`` is accepted as
its alias). Schedule names (``--scheduler``): ``discrete`` (also ``default``), ``karras``,
``exponential``, ``ays``, ``sgm_uniform``, ``simple``.

The algorithms follow k-diffusion's ``sampling.py`` (euler ... dpm++2m), the webui discussion
8457 (dpm++2mv2), the LCM paper (lcm) and DDIM with "trailing" timesteps (Song et al. 2020,
Lin et al. 2023) as sd-cli and diffusers' DDIMScheduler run it. One difference from sd-cli:
sd-cli's ``dpm++2s_a`` evaluates its midpoint model call at ``sigma[i+1]``; sdplan evaluates it
at the midpoint's own noise level, as DPM-Solver++(2S) and k-diffusion do.

Seeded noise: :class:`PhiloxNoise` is sd-cli's default generator (``--rng cuda``): Philox4x32-10
keyed by the seed, one counter offset per draw, Box-Muller on the first two words, computed on
the host in float32. It was chosen over numpy's PCG64 because the same seed then gives the same
starting latent as sd-cli (and as torch's CUDA ``randn``, which it imitates), and because it is
counter based: noise depends only on (seed, draw index, element index), never on the device or
the placement that later consumes it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Protocol

import numpy as np
from sdplan.core.errors import SdplanError

log = logging.getLogger(__name__)

TIMESTEPS = 1000
Denoiser = Callable[[np.ndarray, float], np.ndarray]
NoiseSource = Callable[[tuple[int, ...]], np.ndarray]


class SamplingError(SdplanError):
    """An unknown sampler or schedule name, or unusable sampling input."""

    code = "invalid_sampling"


# --------------------------------------------------------------------------- noise schedule


class DiscreteSchedule:
    """The 1000-step DDPM noise schedule of SD 1.x/2.x as sigmas (k-diffusion's CompVis wrapper).

    ``betas = linspace(sqrt(0.00085), sqrt(0.012), 1000) ** 2`` ("scaled linear"),
    ``alphas_cumprod = cumprod(1 - betas)``, ``sigma_t = sqrt((1 - a_t) / a_t)``, computed in
    float32 like sd-cli, LDM and diffusers. ``t_to_sigma`` interpolates log-sigma linearly.
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
        """Sigma at (fractional) timestep ``t`` in ``[0, 999]``, log-linear interpolated."""
        t = np.asarray(t, dtype=np.float64)
        lo = np.floor(t).astype(np.int64)
        hi = np.ceil(t).astype(np.int64)
        w = t - lo
        return np.exp((1.0 - w) * self.log_sigmas[lo] + w * self.log_sigmas[hi])

    def sigma_to_t(self, sigma: float) -> float:
        """Fractional timestep of ``sigma`` (inverse of :meth:`t_to_sigma`, clamped to 0..999)."""
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

SCHEDULES = ("discrete", "karras", "exponential", "ays", "sgm_uniform", "simple")


def _loglinear_resample(levels: list[float], n: int) -> np.ndarray:
    xs = np.linspace(0.0, 1.0, len(levels))
    ys = np.log(np.asarray(levels[::-1], dtype=np.float64))
    return np.exp(np.interp(np.linspace(0.0, 1.0, n), xs, ys))[::-1]


def get_sigmas(
    scheduler: str,
    steps: int,
    schedule: DiscreteSchedule | None = None,
    family: str = "sd1",
) -> np.ndarray:
    """The ``steps + 1`` descending sigmas of a schedule, the last one 0.

    Args:
        scheduler: an sd-cli ``--scheduler`` name from :data:`SCHEDULES` or ``default``.
        steps: number of sampling steps, >= 1.
        schedule: the model's noise schedule (default: SD 1.x/2.x :class:`DiscreteSchedule`).
        family: ``sd1``, ``sd2`` or ``sdxl``; only ``ays`` uses it (SDXL levels for ``sdxl``,
            the SD 1.5 levels otherwise).

    Returns:
        float32 array of length ``steps + 1``.

    Raises:
        SamplingError: unknown scheduler name or ``steps < 1``.

    Formulas: discrete and sgm_uniform/simple use timesteps mapped by ``t_to_sigma``
    (k-diffusion's DiscreteSchedule.get_sigmas / sd-cli); karras is Karras et al. eq. 5 with
    rho = 7; exponential is log-uniform between sigma_max and sigma_min.
    """
    if not isinstance(steps, int) or steps < 1:
        raise SamplingError(f"--steps must be a positive integer, got {steps!r}")
    sch = schedule or DiscreteSchedule()
    name = "discrete" if scheduler == "default" else scheduler
    smin, smax = sch.sigma_min, sch.sigma_max
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
        levels = _AYS_SDXL if family == "sdxl" else _AYS_SD1
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
        known = ", ".join(("default",) + SCHEDULES)
        raise SamplingError(f"unknown --scheduler {scheduler!r} (known: {known})")
    return np.append(np.asarray(body, dtype=np.float64), 0.0).astype(np.float32)


# ----------------------------------------------------------------------- model wrappers


def scalings(sigma: float, prediction: str, sigma_data: float = 1.0) -> tuple[float, float, float]:
    """``(c_skip, c_out, c_in)`` so that ``x0 = c_skip * x + c_out * F(c_in * x, t)``.

    ``eps``: (1, -sigma, 1/sqrt(sigma^2 + 1)) (k-diffusion CompVisDenoiser);
    ``v``: (1/(sigma^2 + 1), -sigma/sqrt(sigma^2 + 1), 1/sqrt(sigma^2 + 1))
    (CompVisVDenoiser), with sigma_data = 1.

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
    returns ``c_skip x + c_out out`` (float32 for float32 ``x``).
    """
    sch = schedule or DiscreteSchedule()
    scalings(1.0, prediction)  # validates the name

    def denoise(x: np.ndarray, sigma: float) -> np.ndarray:
        c_skip, c_out, c_in = scalings(float(sigma), prediction)
        t = sch.sigma_to_t(float(sigma))
        x_in = (x * c_in).astype(x.dtype, copy=False)
        out = unet(x_in, t, cond)
        if uncond is not None and cfg_scale != 1.0:
            out_u = unet(x_in, t, uncond)
            out = out_u + cfg_scale * (out - out_u)
        return (x * c_skip + out * c_out).astype(x.dtype, copy=False)

    return denoise


# ----------------------------------------------------------------------------- noise


class PhiloxNoise:
    """sd-cli's ``cuda`` generator: Philox4x32-10 normals, reproducible from the seed alone.

    Draw ``k`` (0 for the initial latent, then one per ancestral step) uses counter
    ``(k, 0, i, 0)`` for element ``i`` and key ``(seed & 0xffffffff, seed >> 32)``; the normal
    is ``sqrt(-2 ln u) * sin(v)`` with ``u = (w0 + 0.5) / 2^32`` and
    ``v = 2 pi (w1 + 0.5) / 2^32`` from the first two output words, in float32.
    """

    M0, M1 = 0xD2511F53, 0xCD9E8D57
    W0, W1 = 0x9E3779B9, 0xBB67AE85

    def __init__(self, seed: int) -> None:
        if not isinstance(seed, (int, np.integer)):
            raise SamplingError(f"seed must be an integer, got {seed!r}")
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        self.offset = 0

    @classmethod
    def philox4x32(cls, counter: np.ndarray, key: tuple[int, int], rounds: int = 10) -> np.ndarray:
        """Philox4x32 (Salmon et al. 2011) on a ``(4, n)`` uint32 counter array; returns (4, n)."""
        c = [counter[i].astype(np.uint64) for i in range(4)]
        k0, k1 = np.uint64(key[0]), np.uint64(key[1])
        mask = np.uint64(0xFFFFFFFF)
        for r in range(rounds):
            p0 = c[0] * np.uint64(cls.M0)
            p1 = c[2] * np.uint64(cls.M1)
            c = [
                (p1 >> np.uint64(32)) ^ c[1] ^ k0,
                p1 & mask,
                (p0 >> np.uint64(32)) ^ c[3] ^ k1,
                p0 & mask,
            ]
            if r != rounds - 1:
                k0 = (k0 + np.uint64(cls.W0)) & mask
                k1 = (k1 + np.uint64(cls.W1)) & mask
        return np.stack(c).astype(np.uint32)

    def randn(self, shape: tuple[int, ...]) -> np.ndarray:
        """The next draw: float32 standard normals of ``shape`` (C order, as ggml's layout)."""
        n = int(np.prod(shape))
        counter = np.zeros((4, n), dtype=np.uint32)
        counter[0] = self.offset & 0xFFFFFFFF
        counter[2] = np.arange(n, dtype=np.uint32)
        self.offset += 1
        words = self.philox4x32(counter, (self.seed & 0xFFFFFFFF, self.seed >> 32))
        inv = np.float32(2.3283064e-10)
        two_pi_inv = np.float32(2.3283064e-10) * np.float32(6.2831855)
        u = words[0].astype(np.float32) * inv + inv / np.float32(2)
        v = words[1].astype(np.float32) * two_pi_inv + two_pi_inv / np.float32(2)
        out = np.sqrt(np.float32(-2.0) * np.log(u)) * np.sin(v)
        return out.astype(np.float32).reshape(shape)

    __call__ = randn


def initial_latent(noise: np.ndarray, sigmas: np.ndarray) -> np.ndarray:
    """The starting latent for text-to-image: ``noise * sigmas[0]`` (float32)."""
    return (np.asarray(noise, dtype=np.float32) * np.float32(sigmas[0])).astype(np.float32)


# ----------------------------------------------------------------------------- samplers

SAMPLERS = (
    "euler",
    "euler_a",
    "heun",
    "dpm2",
    "dpm++2s_a",
    "dpm++2m",
    "dpm++2mv2",
    "lcm",
    "ddim_trailing",
)
_ALIASES = {"ddim": "ddim_trailing", "k_euler": "euler", "k_euler_a": "euler_a"}
StepCallback = Callable[[int, np.ndarray, np.ndarray], None]


def ancestral_step(sigma: float, sigma_next: float, eta: float = 1.0) -> tuple[float, float]:
    """``(sigma_down, sigma_up)`` of an ancestral step (k-diffusion ``get_ancestral_step``)."""
    if not eta or sigma_next == 0.0:
        return sigma_next, 0.0
    up = min(sigma_next, eta * math.sqrt(sigma_next**2 * (sigma**2 - sigma_next**2) / sigma**2))
    return math.sqrt(sigma_next**2 - up**2), up


def _need_noise(noise: NoiseSource | None, method: str) -> NoiseSource:
    if noise is None:
        raise SamplingError(f"sampler {method!r} adds noise every step: give it a noise source")
    return noise


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
) -> np.ndarray:
    """Run a sampler from ``x`` (noise level ``sigmas[0]``) down the schedule ``sigmas``.

    Args:
        method: an sd-cli ``--sampling-method`` name from :data:`SAMPLERS` (or ``ddim``).
        denoise: ``denoise(x, sigma) -> x0 estimate``, arrays of ``x``'s shape and dtype.
        x: starting latent ``(N, C, H, W)``, usually :func:`initial_latent`; not modified.
        sigmas: descending sigmas ending in 0 (:func:`get_sigmas`); ``len - 1`` steps.
        noise: ``noise(shape) -> standard normals`` for ``euler_a``, ``dpm++2s_a``, ``lcm``
            and ``ddim_trailing`` with ``eta > 0`` (e.g. the seed's :class:`PhiloxNoise`).
        eta: ancestral noise amount: default 1 for euler_a/dpm++2s_a, 0 for ddim_trailing.
        callback: called as ``callback(step, x, denoised)`` after each step (previews).
        schedule: the model's noise schedule (``ddim_trailing`` reads its alphas).

    Returns:
        The final latent, ``x``'s shape and dtype. For ``ddim_trailing`` it is at DDIM scale
        (sd-cli's output); for the others it is the sigma = 0 estimate.

    Raises:
        SamplingError: unknown method, bad sigmas, or a missing noise source.
    """
    name = _ALIASES.get(method, method)
    if name not in SAMPLERS:
        raise SamplingError(f"unknown --sampling-method {method!r} (known: {', '.join(SAMPLERS)})")
    sig = [float(s) for s in np.asarray(sigmas, dtype=np.float64).ravel()]
    if len(sig) < 2 or any(b > a for a, b in zip(sig, sig[1:], strict=False)) or sig[-1] < 0:
        raise SamplingError(f"sigmas must descend to 0 over at least one step, got {sig[:4]}...")
    x = np.array(x, copy=True)
    cb = callback or (lambda i, x_, d_: None)
    if name == "ddim_trailing":
        return _ddim_trailing(denoise, x, len(sig) - 1, noise, eta or 0.0, cb, schedule)
    eta_a = 1.0 if eta is None else eta
    old: np.ndarray | None = None
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        if name == "euler":
            x = x + (x - den) / s * (sn - s)
        elif name == "euler_a":
            down, up = ancestral_step(s, sn, eta_a)
            x = x + (x - den) / s * (down - s)
            if sn > 0:
                x = x + _need_noise(noise, name)(x.shape).astype(x.dtype) * up
        elif name in ("heun", "dpm2"):
            d = (x - den) / s
            if sn == 0:
                x = x + d * (sn - s)
            elif name == "heun":
                x2 = x + d * (sn - s)
                d2 = (x2 - denoise(x2, sn)) / sn
                x = x + (d + d2) / 2 * (sn - s)
            else:
                mid = math.exp(0.5 * (math.log(s) + math.log(sn)))
                x2 = x + d * (mid - s)
                x = x + (x2 - denoise(x2, mid)) / mid * (sn - s)
        elif name == "dpm++2s_a":
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
                x = x + _need_noise(noise, name)(x.shape).astype(x.dtype) * up
        elif name in ("dpm++2m", "dpm++2mv2"):
            if sn == 0:
                x = den
            else:
                t, t_next = -math.log(s), -math.log(sn)
                h = t_next - t
                if old is None:
                    x = (sn / s) * x - math.expm1(-h) * den
                else:
                    h_last = t - (-math.log(sig[i - 1]))
                    if name == "dpm++2m":
                        r, h_eff = h_last / h, h
                    else:
                        r, h_eff = max(h_last, h) / min(h_last, h), (h_last + h) / 2
                    den_d = (1 + 1 / (2 * r)) * den - (1 / (2 * r)) * old
                    x = (sn / s) * x - math.expm1(-h_eff) * den_d
            old = den
        elif name == "lcm":
            x = den
            if sn > 0:
                x = x + _need_noise(noise, name)(x.shape).astype(x.dtype) * sn
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def _ddim_trailing(
    denoise: Denoiser,
    x: np.ndarray,
    steps: int,
    noise: NoiseSource | None,
    eta: float,
    cb: StepCallback,
    schedule: DiscreteSchedule | None,
) -> np.ndarray:
    """DDIM (Song et al. 2020, eq. 12) on "trailing" timesteps, through the k-space denoiser.

    Timestep ``i`` is ``round(1000 - i * 1000 / steps) - 1``, the previous one is 1000 // steps
    lower (``alphas_cumprod[0]`` past the start), as in sd-cli and diffusers' DDIMScheduler
    with ``timestep_spacing="trailing"``, ``set_alpha_to_one=False``. ``x`` enters at
    k-diffusion scale (``noise * sigma_max``) and leaves at DDIM scale.
    """
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
            x_lat = x_lat + std * _need_noise(noise, "ddim_trailing")(x.shape).astype(dtype)
        x_lat = x_lat.astype(dtype, copy=False)
        cb(i, x_lat, den)
    assert x_lat is not None
    return x_lat
