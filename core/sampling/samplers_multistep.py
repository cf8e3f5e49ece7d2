"""Multistep samplers of sd-cli: ``ipndm``, ``ipndm_v``, ``lms``, ``res_multistep``,
``dpm++2m_sde`` and ``dpm++2m_sde_bt`` (with its Brownian tree).

Each follows stable-diffusion.cpp's ``src/runtime/denoiser.hpp`` at commit 97d2990, which
follows k-diffusion / ComfyUI: iPNDM (Zhang & Chen 2022, DEIS) with its fixed Adams-Bashforth
weights (``ipndm_v`` varies only its second-order weight with the step ratio, as sd-cli
does), LMS (k-diffusion's ``sample_lms`` with sd-cli's history shift and a midpoint Riemann
sum for the coefficients), RES multistep (Zhang et al. 2023, exponential integrator with
``phi`` functions), DPM-Solver++(2M) SDE midpoint (Lu et al. 2022; k-diffusion's
``sample_dpmpp_2m_sde``). Shapes, dtypes and arguments as
:class:`~sdplan.core.sampling.sampler_base.Sampler`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.noise import NoiseSource, StdDefaultNoise, require_noise
from sdplan.core.sampling.sampler_base import (
    StepCallback,
    ancestral_step,
    ancestral_step_flow,
    no_callback,
    sigma_steps,
)
from sdplan.core.sampling.schedules import Denoiser, DiscreteSchedule

__all__ = ["sample_ipndm", "sample_ipndm_v", "sample_lms", "lms_coefficient",
           "sample_res_multistep", "sample_dpmpp_2m_sde", "sample_dpmpp_2m_sde_bt",
           "BrownianTree", "phi1", "phi2"]

#: Adams-Bashforth weights of iPNDM by order (newest derivative first).
_AB = {1: (1.0,), 2: (1.5, -0.5), 3: (23 / 12, -16 / 12, 5 / 12),
       4: (55 / 24, -59 / 24, 37 / 24, -9 / 24)}


def _start(sigmas: np.ndarray, x: np.ndarray, callback: StepCallback | None
           ) -> tuple[list[float], np.ndarray, StepCallback]:
    return sigma_steps(sigmas), np.array(x, copy=True), callback or no_callback


def sample_ipndm(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                 noise: NoiseSource | None = None, eta: float | None = None,
                 callback: StepCallback | None = None,
                 schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``ipndm``: Euler steps whose derivative is the Adams-Bashforth blend of up to the
    last 4 derivatives ``d = (x - D(x)) / sigma`` (weights 1; 3/2, -1/2; 23/12, -16/12, 5/12;
    55/24, -59/24, 37/24, -9/24). ``noise``, ``eta`` and ``schedule`` are unused."""
    sig, x, cb = _start(sigmas, x, callback)
    hist: list[np.ndarray] = []
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        d = (x - den) / s
        w = _AB[min(4, i + 1)]
        blend = w[0] * d
        for k, wk in enumerate(w[1:], start=1):
            blend = blend + wk * hist[-k]
        x = (x + blend * (sn - s)).astype(den.dtype, copy=False)
        hist = [*hist[-2:], d]
        cb(i, x, den)
    return x


def sample_ipndm_v(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                   noise: NoiseSource | None = None, eta: float | None = None,
                   callback: StepCallback | None = None,
                   schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``ipndm_v``: :func:`sample_ipndm` with the second-order weights for a variable step,
    ``((2 + h/h_last) d - (h/h_last) d_last) / 2``; third and fourth order keep the fixed
    weights, as sd-cli does. ``noise``, ``eta`` and ``schedule`` are unused."""
    sig, x, cb = _start(sigmas, x, callback)
    hist: list[np.ndarray] = []
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        d = (x - den) / s
        h = sn - s
        order = min(4, i + 1)
        if order == 2:
            ratio = h / (s - sig[i - 1])
            blend = ((2.0 + ratio) * d - ratio * hist[-1]) / 2.0
        else:
            w = _AB[order]
            blend = w[0] * d
            for k, wk in enumerate(w[1:], start=1):
                blend = blend + wk * hist[-k]
        x = (x + blend * h).astype(den.dtype, copy=False)
        hist = [*hist[-2:], d]
        cb(i, x, den)
    return x


def lms_coefficient(sig: list[float], order: int, m: int, j: int, divisions: int = 1000
                    ) -> float:
    """The LMS weight of derivative ``m - j`` over step ``m``: the integral from ``sig[m]``
    to ``sig[m+1]`` of the Lagrange basis polynomial through ``sig[m - k]``, ``k < order``,
    that is 1 at ``sig[m - j]`` (k-diffusion's ``linear_multistep_coeff``), by sd-cli's
    midpoint Riemann sum over ``divisions`` intervals (0: the step ``sig[m+1] - sig[m]``).
    Float64."""
    if divisions == 0:
        return sig[m + 1] - sig[m]
    a = sig[m]
    dx = (sig[m + 1] - a) / divisions
    b = a + (np.arange(divisions, dtype=np.float64) + 0.5) * dx
    prod = np.ones(divisions)
    for k in range(order):
        if k != j:
            t = sig[m - k]
            prod *= (b - t) / (sig[m - j] - t)
    return float(prod.sum() * dx)


def _int_arg(extra: Mapping[str, str] | None, key: str, default: int) -> int:
    text = (extra or {}).get(key)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise SamplingError(f"--extra-sample-args {key}={text!r} is not an integer") from None


def sample_lms(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
               noise: NoiseSource | None = None, eta: float | None = None,
               callback: StepCallback | None = None,
               schedule: DiscreteSchedule | None = None,
               extra: Mapping[str, str] | None = None) -> np.ndarray:
    """``lms``: linear multistep on the derivatives ``d`` (k-diffusion's ``sample_lms``) with
    sd-cli's options from ``extra`` (``--extra-sample-args``): ``lms_max_order`` (default 4,
    at most the step count), ``lms_shift`` (default 1: the older history terms are taken one
    place later, so the fourth-order term repeats the third's derivative; 0 is k-diffusion's
    LMS), ``lms_divisions`` (default 1000, :func:`lms_coefficient`). ``noise``, ``eta`` and
    ``schedule`` are unused.

    Raises:
        SamplingError: an ``extra`` value that is not an integer.
    """
    sig, x, cb = _start(sigmas, x, callback)
    steps = len(sig) - 1
    max_order = min(max(1, _int_arg(extra, "lms_max_order", 4)), steps)
    shift = max(0, _int_arg(extra, "lms_shift", 1))
    divisions = _int_arg(extra, "lms_divisions", 1000)
    hist: list[np.ndarray] = []
    for i in range(steps):
        s = sig[i]
        den = denoise(x, s)
        order = min(max_order, i + 1)
        coeff = [lms_coefficient(sig, order, i, c, divisions) for c in range(order)]
        d = (x - den) / s
        x = x + d * coeff[0]
        if max_order > 1:
            size_p1 = len(hist) + 1
            if i:
                last = len(hist) - 1
                for c in range(2, order + 1):
                    x = x + hist[min(last, size_p1 - c + shift)] * coeff[c - 1]
            if size_p1 == max_order:
                hist.pop(0)
            hist.append(d)
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def phi1(t: float) -> float:
    """``(e^t - 1) / t`` (its series near 0)."""
    return 1.0 + t * 0.5 + t * t / 6.0 if abs(t) < 1e-6 else math.expm1(t) / t


def phi2(t: float) -> float:
    """``(phi1(t) - 1) / t`` (its series near 0)."""
    return 0.5 + t / 6.0 + t * t / 24.0 if abs(t) < 1e-6 else (phi1(t) - 1.0) / t


def _step_down(s: float, sn: float, eta: float, flow: bool) -> tuple[float, float, float]:
    if flow:
        return ancestral_step_flow(s, sn, eta)
    down, up = ancestral_step(s, sn, eta)
    return down, up, 1.0


def sample_res_multistep(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                         noise: NoiseSource | None = None, eta: float | None = None,
                         callback: StepCallback | None = None,
                         schedule: DiscreteSchedule | None = None,
                         flow: bool = False) -> np.ndarray:
    """``res_multistep``: the second-order RES multistep exponential integrator, in
    ``t = -log sigma`` towards the ancestral ``sigma_down``: with ``h = t_down - t``,
    ``c2 = (t_prev - t_old_down) / h``, ``b2 = phi2(-h) / c2``, ``b1 = phi1(-h) - b2``,
    ``x = e^-h x + h (b1 D + b2 D_old)``; the first step and a step to 0 are Euler steps.
    With ``eta > 0`` (default 0) fresh noise times ``sigma_up`` follows each step
    (``flow``: the rectified-flow ancestral step, :func:`ancestral_step_flow`).
    ``schedule`` is unused."""
    sig, x, cb = _start(sigmas, x, callback)
    eta = 0.0 if eta is None else eta
    old: np.ndarray | None = None
    old_down = 0.0
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        down, up, alpha = _step_down(s, sn, eta, flow)
        if down == 0.0 or old is None:
            x = x + (x - den) / s * (down - s)
        else:
            t, t_old, t_next = -math.log(s), -math.log(old_down), -math.log(down)
            h = t_next - t
            c2 = (-math.log(sig[i - 1]) - t_old) / h
            b2 = phi2(-h) / c2
            b1 = phi1(-h) - b2
            b1 = b1 if math.isfinite(b1) else 0.0
            b2 = b2 if math.isfinite(b2) else 0.0
            x = math.exp(-h) * x + h * (b1 * den + b2 * old)
        if sn > 0 and up > 0:
            if flow:
                x = x * alpha
            x = x + require_noise(noise, "res_multistep")(x.shape).astype(x.dtype) * up
        old, old_down = den, down
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def _dpmpp_2m_sde(denoise: Denoiser, x: np.ndarray, sig: list[float], eta: float,
                  draw: Callable[[int, tuple[int, ...]], np.ndarray],
                  cb: StepCallback) -> np.ndarray:
    old: np.ndarray | None = None
    h_last = 0.0
    for i in range(len(sig) - 1):
        s, sn = sig[i], sig[i + 1]
        den = denoise(x, s)
        if sn == 0.0:
            x = den
        else:
            h = -math.log(sn) + math.log(s)
            eta_h = eta * h
            b = -math.expm1(-h - eta_h)
            x = sn / s * math.exp(-eta_h) * x + b * den
            if old is not None:
                x = x + (0.5 * b / (h_last / h)) * (den - old)
            if eta > 0:
                x = x + draw(i, x.shape).astype(x.dtype) * (sn * math.sqrt(-math.expm1(-2 * eta_h)))
            h_last = h
        old = den
        x = x.astype(den.dtype, copy=False)
        cb(i, x, den)
    return x


def sample_dpmpp_2m_sde(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                        noise: NoiseSource | None = None, eta: float | None = None,
                        callback: StepCallback | None = None,
                        schedule: DiscreteSchedule | None = None) -> np.ndarray:
    """``dpm++2m_sde``: DPM-Solver++(2M) SDE, midpoint form (k-diffusion's
    ``sample_dpmpp_2m_sde``): ``x = (s'/s) e^{-eta h} x + (1 - e^{-h - eta h}) D``, plus
    ``(1 - e^{-h-eta h}) / (2 r) (D - D_old)`` after the first step (``r = h_last / h``), plus
    ``s' sqrt(1 - e^{-2 eta h})`` times fresh noise (``eta`` default 1); a step to 0
    returns ``D``. ``schedule`` is unused."""
    sig, x, cb = _start(sigmas, x, callback)
    eta = 1.0 if eta is None else eta
    return _dpmpp_2m_sde(denoise, x, sig, eta,
                         lambda i, shape: require_noise(noise, "dpm++2m_sde")(shape), cb)


class BrownianTree:
    """sd-cli's seeded Brownian tree over ``[sigma_min, sigma_max]``: ``W(sigma_max)`` is
    ``sqrt(sigma_max - sigma_min)`` times a normal draw; ``W(t)`` between two known values is
    their Brownian bridge, bisected to depth 24, each midpoint ``(W_a + W_c)/2 + std z`` with
    ``std = sqrt((c - m)(m - a)/(c - a))`` and ``z`` from a node seed (``std_default``
    normals, :class:`~sdplan.core.sampling.noise.StdDefaultNoise`); seeds split with the
    SplitMix64 finaliser as sd-cli's ``mix64``. ``tree(a, b)`` is ``(W(b) - W(a)) /
    sqrt(|b - a|)``: unit-variance noise whose values do not depend on the step count.
    """

    MAX_DEPTH = 24
    _MASK = (1 << 64) - 1

    def __init__(self, shape: tuple[int, ...], sigma_min: float, sigma_max: float,
                 seed: int) -> None:
        self.shape = tuple(shape)
        self.t_min, self.t_max = float(sigma_min), float(sigma_max)
        self.root_seed = self.mix64(seed, 0x9E3779B97F4A7C15)
        top = StdDefaultNoise(self.mix64(seed, 0xBF58476D1CE4E5B9)).randn(self.shape)
        self.w_max = (top * np.float32(math.sqrt(self.t_max - self.t_min))).astype(np.float32)
        self._cache: dict[float, np.ndarray] = {}

    @classmethod
    def mix64(cls, v: int, salt: int) -> int:
        """sd-cli's seed mixer: SplitMix64's finaliser of ``v + salt`` (64-bit)."""
        z = (v + salt) & cls._MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & cls._MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & cls._MASK
        return z ^ (z >> 31)

    def w(self, t: float) -> np.ndarray:
        """``W(t)`` (cached), float32 of :attr:`shape`."""
        if t not in self._cache:
            a, c = self.t_min, self.t_max
            w_a = np.zeros(self.shape, np.float32)
            w_c = self.w_max
            seed = self.root_seed
            out = None
            for _ in range(self.MAX_DEPTH):
                if c - a < 1e-9:
                    break
                m = 0.5 * (a + c)
                std = math.sqrt((c - m) * (m - a) / (c - a))
                z = StdDefaultNoise(seed).randn(self.shape)
                w_m = (np.float32(0.5) * (w_a + w_c) + np.float32(std) * z).astype(np.float32)
                if t == m:
                    out = w_m
                    break
                if t < m:
                    c, w_c, seed = m, w_m, self.mix64(seed, 1)
                else:
                    a, w_a, seed = m, w_m, self.mix64(seed, 2)
            if out is None:
                alpha = np.float32((t - a) / (c - a)) if c > a else np.float32(0.5)
                out = ((np.float32(1.0) - alpha) * w_a + alpha * w_c).astype(np.float32)
            self._cache[t] = out
        return self._cache[t]

    def __call__(self, sigma_a: float, sigma_b: float) -> np.ndarray:
        clamp = lambda t: min(max(t, self.t_min), self.t_max)  # noqa: E731
        a, b = clamp(min(sigma_a, sigma_b)), clamp(max(sigma_a, sigma_b))
        span = max(abs(sigma_b - sigma_a), 1e-12)
        return ((self.w(b) - self.w(a)) * np.float32(1.0 / math.sqrt(span))).astype(np.float32)


def sample_dpmpp_2m_sde_bt(denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                           noise: NoiseSource | None = None, eta: float | None = None,
                           callback: StepCallback | None = None,
                           schedule: DiscreteSchedule | None = None,
                           tree: Callable[[float, float], np.ndarray] | None = None
                           ) -> np.ndarray:
    """``dpm++2m_sde_bt``: :func:`sample_dpmpp_2m_sde` whose noise for the step from
    ``sigma`` to ``sigma'`` is a :class:`BrownianTree` increment, so a seed gives the same
    trajectory at any step count. The tree's seed is the bits of two float32 draws of
    ``noise`` read as one little-endian 64-bit integer (sd-cli), its range the smallest and
    largest positive sigmas; ``tree`` replaces it (tests). ``eta`` default 1.

    Raises:
        SamplingError: no ``noise`` (and no ``tree``) with ``eta > 0``.
    """
    sig, x, cb = _start(sigmas, x, callback)
    eta = 1.0 if eta is None else eta
    positive = [s for s in sig if s > 0]
    if max(positive) <= min(positive):
        return x
    if tree is None and eta > 0:
        bits = np.asarray(require_noise(noise, "dpm++2m_sde_bt")((2,)), np.float32)
        seed = int(bits.view(np.uint32)[0]) | int(bits.view(np.uint32)[1]) << 32
        tree = BrownianTree(x.shape, min(positive), max(positive), seed)

    def draw(i: int, shape: tuple[int, ...]) -> np.ndarray:
        assert tree is not None
        return tree(sig[i], sig[i + 1])

    return _dpmpp_2m_sde(denoise, x, sig, eta, draw, cb)
