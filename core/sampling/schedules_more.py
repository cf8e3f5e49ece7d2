"""sd-cli's other sigma schedulers, and the flow models' timestep-to-sigma maps.

Each function takes the step count ``n``, the model's ``sigma_min``/``sigma_max`` and its
``t_to_sigma`` (fractional training timestep 0..999 -> sigma) and returns the ``n + 1``
descending sigmas ending in 0, following stable-diffusion.cpp's ``src/runtime/denoiser.hpp``
(commit 97d2990); :func:`sdplan.core.sampling.schedules.get_sigmas` dispatches to them by
``--scheduler`` name. Sources: GITS (Chen et al. 2024, the published ``coeff = 1.20``
noise levels for SD 1.x, as sd-cli ships them), smoothstep and simple (ComfyUI), KL-optimal
(Sabour et al. 2024, "Align Your Steps"), LCM (Luo et al. 2023: 50 original steps), bong
tangent (ComfyUI RES4LYF), the Beta schedule (Lee et al. 2024, ``alpha = beta = 0.6``),
Flux (Black Forest Labs' shifted linear schedule), Flux.2 (BFL's empirical ``mu``), LTX-2
(shift by token count, stretched to a terminal sigma), logit-normal (Ideogram 4).

The flow maps: :class:`FlowSchedule` gives a flow model's ``t_to_sigma`` (SD3-style
``shift t / (1 + (shift - 1) t)``, or Flux-style ``e^shift / (e^shift + 1/t - 1)``) so the
timestep-based schedulers run on flow models as sd-cli runs them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
from sdplan.core.sampling.errors import SamplingError

__all__ = ["FlowSchedule", "gits_sigmas", "smoothstep_sigmas", "kl_optimal_sigmas",
           "lcm_sigmas", "bong_tangent_sigmas", "beta_sigmas", "beta_ppf", "flux_sigmas_mu",
           "flux2_mu", "flux2_sigmas", "ltx2_sigmas", "logit_normal_sigmas", "ndtri",
           "loglinear_interpolation", "TIMESTEPS"]

TIMESTEPS = 1000
TToSigma = Callable[[float], float]


class FlowSchedule:
    """A flow model's noise levels as a schedule: ``t_to_sigma(t)`` for a training
    timestep ``t`` in 0..999 is ``shift(s)`` of ``s = (t + 1) / 1000`` with ``shift`` SD3's
    ``time_snr_shift`` (``kind="sd3"``: ``a s / (1 + (a - 1) s)``) or Flux's time shift
    (``kind="flux"``: ``e^a / (e^a + 1/s - 1)``), ``a`` the flow shift (sd-cli's
    ``--flow-shift``: 3 for SD3, Z-Image; 1.15 for Flux dev, 1 for schnell). ``sigma_to_t``
    is ``1000 s`` (sd3) or ``s`` (flux), as sd-cli's flow denoisers pass time to the model.

    Raises:
        SamplingError: an unknown kind or a non-positive SD3 shift.
    """

    def __init__(self, shift: float, kind: str = "sd3") -> None:
        if kind not in ("sd3", "flux"):
            raise SamplingError(f"unknown flow schedule kind {kind!r} (sd3 or flux)")
        if kind == "sd3" and shift <= 0:
            raise SamplingError(f"--flow-shift must be positive, got {shift}")
        self.shift, self.kind = float(shift), kind

    def t_to_sigma(self, t: float | np.ndarray) -> np.ndarray:
        """Sigma of timestep(s) ``t`` (float64, ``t``'s shape)."""
        s = (np.asarray(t, dtype=np.float64) + 1.0) / TIMESTEPS
        if self.kind == "sd3":
            a = self.shift
            return s if a == 1.0 else a * s / (1.0 + (a - 1.0) * s)
        e = math.exp(self.shift)
        return e / (e + (1.0 / s - 1.0))

    def sigma_to_t(self, sigma: float) -> float:
        """The time the model is given for ``sigma``."""
        return float(sigma) * TIMESTEPS if self.kind == "sd3" else float(sigma)

    @property
    def sigma_min(self) -> float:
        return float(self.t_to_sigma(0.0))

    @property
    def sigma_max(self) -> float:
        return float(self.t_to_sigma(TIMESTEPS - 1.0))


def loglinear_interpolation(levels: list[float] | tuple[float, ...], n: int) -> list[float]:
    """``levels`` (descending) resampled to ``n`` points, linear in log sigma over an even
    grid (sd-cli's ``log_linear_interpolation``)."""
    xs = np.linspace(0.0, 1.0, len(levels))
    ys = np.log(np.asarray(levels[::-1], dtype=np.float64))
    return list(np.exp(np.interp(np.linspace(0.0, 1.0, n), xs, ys))[::-1])


# GITS noise levels for coeff 1.20 (the coefficient sd-cli fixes), steps 2..20: each row is
# steps + 1 sigmas of the SD 1.x schedule (Chen et al. 2024, zju-pi/diff-sampler).
_GITS_1_20 = (
    (14.61464119, 0.803307, 0.02916753),
    (14.61464119, 1.56271636, 0.52423614, 0.02916753),
    (14.61464119, 2.36326075, 0.92192322, 0.36617002, 0.02916753),
    (14.61464119, 2.84484982, 1.24153244, 0.59516323, 0.25053367, 0.02916753),
    (14.61464119, 5.85520077, 2.05039096, 0.95350921, 0.45573691, 0.17026083, 0.02916753),
    (14.61464119, 5.85520077, 2.45070267, 1.24153244, 0.64427125, 0.29807833, 0.09824532,
     0.02916753),
    (14.61464119, 5.85520077, 2.45070267, 1.36964464, 0.803307, 0.45573691, 0.25053367,
     0.09824532, 0.02916753),
    (14.61464119, 5.85520077, 2.84484982, 1.61558151, 0.95350921, 0.59516323, 0.36617002,
     0.19894916, 0.09824532, 0.02916753),
    (14.61464119, 5.85520077, 2.84484982, 1.67050016, 1.08895338, 0.74807048, 0.50118381,
     0.32104823, 0.19894916, 0.09824532, 0.02916753),
    (14.61464119, 5.85520077, 2.95596409, 1.84880662, 1.24153244, 0.83188516, 0.59516323,
     0.41087446, 0.27464288, 0.17026083, 0.09824532, 0.02916753),
    (14.61464119, 5.85520077, 3.07277966, 1.98035145, 1.36964464, 0.95350921, 0.69515091,
     0.50118381, 0.36617002, 0.25053367, 0.17026083, 0.09824532, 0.02916753),
    (14.61464119, 6.77309084, 3.46139455, 2.36326075, 1.56271636, 1.08895338, 0.803307,
     0.59516323, 0.45573691, 0.34370604, 0.25053367, 0.17026083, 0.09824532, 0.02916753),
    (14.61464119, 6.77309084, 3.46139455, 2.45070267, 1.61558151, 1.162866, 0.86115354,
     0.64427125, 0.50118381, 0.38853383, 0.29807833, 0.22545385, 0.17026083, 0.09824532,
     0.02916753),
    (14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.12350607, 1.51179266, 1.08895338,
     0.83188516, 0.64427125, 0.50118381, 0.38853383, 0.29807833, 0.22545385, 0.17026083,
     0.09824532, 0.02916753),
    (14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.12350607, 1.51179266, 1.08895338,
     0.83188516, 0.64427125, 0.50118381, 0.41087446, 0.32104823, 0.25053367, 0.19894916,
     0.13792117, 0.09824532, 0.02916753),
    (14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.12350607, 1.51179266, 1.08895338,
     0.83188516, 0.64427125, 0.50118381, 0.41087446, 0.34370604, 0.27464288, 0.22545385,
     0.17026083, 0.13792117, 0.09824532, 0.02916753),
    (14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.19988537, 1.61558151, 1.20157266,
     0.92192322, 0.72133851, 0.57119018, 0.45573691, 0.36617002, 0.29807833, 0.25053367,
     0.19894916, 0.17026083, 0.13792117, 0.09824532, 0.02916753),
    (14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.19988537, 1.61558151, 1.24153244,
     0.95350921, 0.74807048, 0.59516323, 0.4783645, 0.38853383, 0.32104823, 0.27464288,
     0.22545385, 0.19894916, 0.17026083, 0.13792117, 0.09824532, 0.02916753),
    (14.61464119, 7.49001646, 4.65472794, 3.07277966, 2.19988537, 1.61558151, 1.24153244,
     0.95350921, 0.74807048, 0.59516323, 0.50118381, 0.41087446, 0.34370604, 0.29807833,
     0.25053367, 0.22545385, 0.19894916, 0.17026083, 0.13792117, 0.09824532, 0.02916753),
)


def gits_sigmas(n: int, sigma_min: float, sigma_max: float, t_to_sigma: TToSigma) -> list[float]:
    """``gits``: the published row for ``n`` steps (2..20), the 20-step row resampled
    log-linearly beyond; the last sigma 0.

    Raises:
        SamplingError: fewer than 2 steps (the table starts at 2).
    """
    if n < 2:
        raise SamplingError("--scheduler gits needs at least 2 steps")
    out = list(_GITS_1_20[n - 2]) if n <= 20 else loglinear_interpolation(_GITS_1_20[-1], n + 1)
    out[n] = 0.0
    return out


def smoothstep_sigmas(n: int, sigma_min: float, sigma_max: float, t_to_sigma: TToSigma
                      ) -> list[float]:
    """``smoothstep``: timesteps ``round(smoothstep(1 - i/n) * 999)``, ``smoothstep(u) =
    u^2 (3 - 2u)``; one step is timestep 999."""
    if n == 1:
        return [float(t_to_sigma(999.0)), 0.0]
    out = []
    for i in range(n):
        u = np.float32(1.0) - np.float32(i) / np.float32(n)
        out.append(float(t_to_sigma(math.floor(float(u * u * (np.float32(3) - 2 * u) * 999) + 0.5))))
    return [*out, 0.0]


def kl_optimal_sigmas(n: int, sigma_min: float, sigma_max: float, t_to_sigma: TToSigma
                      ) -> list[float]:
    """``kl_optimal``: ``tan(t atan(sigma_min) + (1 - t) atan(sigma_max))``, ``t = i/(n-1)``
    (``sigma_min`` at least 1e-6); one step is ``sigma_max``."""
    if n == 1:
        return [sigma_max, 0.0]
    lo, hi = math.atan(max(sigma_min, 1e-6)), math.atan(sigma_max)
    return [math.tan(i / (n - 1) * lo + (1 - i / (n - 1)) * hi) for i in range(n)] + [0.0]


def lcm_sigmas(n: int, sigma_min: float, sigma_max: float, t_to_sigma: TToSigma) -> list[float]:
    """``lcm``: the timesteps of 50 original steps, ``(50 - floor(50 i / n)) 20 - 1``."""
    return [float(t_to_sigma(float((50 - (i * 50) // n) * 20 - 1))) for i in range(n)] + [0.0]


def _bong_stage(steps: int, slope: float, pivot: float, start: float, end: float
                ) -> list[float]:
    if steps <= 0:
        return []

    def v(x: float) -> float:
        return ((2.0 / math.pi) * math.atan(-slope * (x - pivot)) + 1.0) * 0.5

    smax, smin = v(0.0), v(float(steps - 1))
    if abs(smax - smin) < 1e-8:
        if steps == 1:
            return [start]
        return [start + (end - start) * i / (steps - 1) for i in range(steps)]
    return [(v(float(x)) - smin) / (smax - smin) * (start - end) + end for x in range(steps)]


def bong_tangent_sigmas(n: int, sigma_min: float, sigma_max: float, t_to_sigma: TToSigma
                        ) -> list[float]:
    """``bong_tangent``: two arctangent stages from ``sigma_max`` to the middle sigma and on
    to ``sigma_min`` (pivots at 60 % of ``n + 2`` points, slopes ``0.2 / ((n + 2) / 40)``),
    the first stage's last point dropped, padded or cut to ``n + 1``, the last sigma 0."""
    steps = n + 2
    middle = sigma_min + (sigma_max - sigma_min) * 0.5
    pivot_i = int(steps * np.float32(0.6))
    midpoint = int((steps * np.float32(0.6) + steps * np.float32(0.6)) * 0.5)
    slope = 0.2 / (steps / 40.0)
    len2 = steps - midpoint
    len1 = steps - len2
    first = _bong_stage(len1, slope, float(pivot_i), sigma_max, middle)[:-1]
    out = first + _bong_stage(len2, slope, float(pivot_i - len1), middle, sigma_min)
    out = (out + [sigma_min] * (n + 1))[:n + 1]
    out[n] = 0.0
    return out


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _incbeta(x: float, a: float, b: float) -> float:
    """Regularised incomplete beta by Lentz's continued fraction (sd-cli's ``incbeta``)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    tiny = 1e-30
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) >= tiny else tiny)
    h = d
    for m in range(1, 201):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = d if abs(d) >= tiny else tiny
            c = 1.0 + aa / c
            c = c if abs(c) >= tiny else tiny
            d = 1.0 / d
            delta = d * c
            h *= delta
        if abs(delta - 1.0) < 3.0e-7:
            break
    return math.exp(a * math.log(x) + b * math.log(1.0 - x) - _log_beta(a, b)) / a * h


def _beta_cdf(x: float, a: float, b: float) -> float:
    if x in (0.0, 1.0):
        return x
    if x < (a + 1.0) / (a + b + 2.0):
        return _incbeta(x, a, b)
    return 1.0 - _incbeta(1.0 - x, b, a)


def beta_ppf(u: float, a: float, b: float, iterations: int = 30) -> float:
    """Quantile of the Beta(a, b) distribution at ``u`` by Newton's method from 0.5, kept in
    ``(0, 1)`` (sd-cli's ``beta_ppf``)."""
    x = 0.5
    for _ in range(iterations):
        f = _beta_cdf(x, a, b) - u
        if abs(f) < 1e-10:
            break
        x -= f / math.exp((a - 1.0) * math.log(x) + (b - 1.0) * math.log(1.0 - x)
                          - _log_beta(a, b))
        x = min(max(x, 1e-10), 1.0 - 1e-10)
    return x


def _float_arg(extra: Mapping[str, str] | None, key: str, default: float) -> float:
    text = (extra or {}).get(key)
    if text is None:
        return default
    try:
        return float(text)
    except ValueError:
        raise SamplingError(f"--extra-sample-args {key}={text!r} is not a number") from None


def beta_sigmas(n: int, sigma_min: float, sigma_max: float, t_to_sigma: TToSigma,
                extra: Mapping[str, str] | None = None) -> list[float]:
    """``beta``: timesteps ``round(ppf(1 - i/n; alpha, beta) * 999)`` (``alpha``, ``beta``
    from ``extra``, default 0.6), repeats dropped; one step is timestep 999.

    Raises:
        SamplingError: a non-positive or non-numeric ``alpha``/``beta``.
    """
    a, b = _float_arg(extra, "alpha", 0.6), _float_arg(extra, "beta", 0.6)
    if a <= 0 or b <= 0:
        raise SamplingError(f"--extra-sample-args alpha and beta must be positive, got {a}, {b}")
    if n == 1:
        return [float(t_to_sigma(999.0)), 0.0]
    out: list[float] = []
    last = -1
    for i in range(n):
        t = int(math.floor(beta_ppf(1.0 - i / n, a, b) * 999 + 0.5))
        if t != last:
            out.append(float(t_to_sigma(float(t))))
            last = t
    return [*out, 0.0]


def flux_sigmas_mu(n: int, mu: float) -> list[float]:
    """Flux's schedule for ``mu``: ``e^mu / (e^mu + 1/t - 1)`` at ``t = 1 - i/n``."""
    e = math.exp(mu)
    return [e / (e + (1.0 / t - 1.0)) if t > 0 else 0.0
            for t in (1.0 - i / n for i in range(n))] + [0.0]


def flux_mu_for(image_tokens: int, extra: Mapping[str, str] | None = None) -> float:
    """Flux's ``mu``: linear in the token count through (256, ``base_shift`` 0.5) and
    (4096, ``max_shift`` 1.15), both from ``extra`` when given."""
    base, top = _float_arg(extra, "base_shift", 0.5), _float_arg(extra, "max_shift", 1.15)
    m = (top - base) / (4096.0 - 256.0)
    return image_tokens * m + base - m * 256.0


def flux2_mu(image_tokens: int, steps: int) -> float:
    """FLUX.2's empirical ``mu`` (BFL ``compute_empirical_mu``): linear in the step count
    between fits at 10 and 200 steps, or the 200-step fit above 4300 tokens."""
    a1, b1, a2, b2 = 8.73809524e-05, 1.89833333, 0.00016927, 0.45666666
    if image_tokens > 4300:
        return a2 * image_tokens + b2
    m200, m10 = a2 * image_tokens + b2, a1 * image_tokens + b1
    a = (m200 - m10) / 190.0
    return a * steps + m200 - 200.0 * a


def flux2_sigmas(n: int, image_tokens: int) -> list[float]:
    """``flux2``: Flux's shift with :func:`flux2_mu`."""
    return flux_sigmas_mu(n, flux2_mu(image_tokens, n))


def ltx2_sigmas(n: int, image_tokens: int, extra: Mapping[str, str] | None = None
                ) -> list[float]:
    """``ltx2``: Flux's shift with ``mu`` linear in the token count through (1024,
    ``base_shift`` 0.95) and (4096, ``max_shift`` 2.05), then (``stretch``, default on)
    stretched so the last nonzero sigma is ``terminal`` (default 0.1)."""
    tokens = image_tokens if image_tokens > 0 else 4096
    top, base = _float_arg(extra, "max_shift", 2.05), _float_arg(extra, "base_shift", 0.95)
    terminal = min(max(_float_arg(extra, "terminal", 0.1), 0.0), 0.99)
    stretch = (extra or {}).get("stretch", "true").strip().lower() not in ("0", "false", "no")
    m = (top - base) / (4096.0 - 1024.0)
    out = flux_sigmas_mu(n, tokens * m + base - m * 1024.0)
    if stretch and n > 1:
        scale = (1.0 - out[n - 1]) / (1.0 - terminal)
        if scale > 1e-8:
            out = [1.0 - (1.0 - s) / scale for s in out[:n]] + [0.0]
    out[n] = 0.0
    return out


def ndtri(p: float) -> float:
    """The standard normal quantile by Acklam's rational approximation (relative error
    about 1e-9), as sd-cli computes it."""
    if p <= 0.0:
        return -math.inf
    if p >= 1.0:
        return math.inf
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
         -2.549732539343734e+00, 4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
         3.754408661907416e+00, 1.0)
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
         1.383577518672690e+02, -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
         6.680131188771972e+01, -1.328068155288572e+01, 1.0)

    def poly(coeffs: tuple[float, ...], v: float) -> float:
        out = coeffs[0]
        for k in coeffs[1:]:
            out = out * v + k
        return out

    if p < 0.02425 or p > 1.0 - 0.02425:
        q = math.sqrt(-2.0 * math.log(p if p < 0.5 else 1.0 - p))
        x = poly(c, q) / poly(d, q)
        return x if p < 0.5 else -x
    q = p - 0.5
    return poly(a, q * q) * q / poly(b, q * q)


def logit_normal_sigmas(n: int, image_tokens: int, extra: Mapping[str, str] | None = None
                        ) -> list[float]:
    """``logit_normal``: ``sigmoid(mu + std z)`` at ``z = -ndtri(i/n)``, clamped to
    ``[sigmoid(logsnr_min/2), sigmoid(logsnr_max/2)]`` (defaults ``mu`` 0, ``std`` 1.75,
    ``logsnr_min`` -15, ``logsnr_max`` 18; with ``resolution_aware`` (default on) ``mu``
    grows by ``log(tokens / 1024) / 2``), the last sigma 0."""
    mean = _float_arg(extra, "mu", 0.0)
    std = _float_arg(extra, "std", 1.75)
    lo_snr, hi_snr = _float_arg(extra, "logsnr_min", -15.0), _float_arg(extra, "logsnr_max", 18.0)
    aware = (extra or {}).get("resolution_aware", "true").strip().lower() not in ("0", "false",
                                                                                   "no")
    if image_tokens > 0 and aware:
        mean += 0.5 * math.log(image_tokens / 1024.0)

    def sigmoid(v: float) -> float:
        return 1.0 / (1.0 + math.exp(-v)) if v > -700 else 0.0

    top, bottom = sigmoid(0.5 * hi_snr), sigmoid(0.5 * lo_snr)
    out = []
    for i in range(n + 1):
        z = -ndtri(i / n)
        y = mean + std * z
        s = 1.0 if y == math.inf else 0.0 if y == -math.inf else sigmoid(y)
        out.append(min(max(s, bottom), top))
    out[n] = 0.0
    return out
