"""What every sampler function shares: its signature, the step callback, sigma checks, the
ancestral step (k-diffusion's and the rectified-flow form) and the conditional/unconditional
pair the CFG++ samplers read.

The sampler functions live in :mod:`sdplan.core.sampling.samplers` (k-diffusion's and the
first sd-cli ones), :mod:`~sdplan.core.sampling.samplers_multistep` (linear multistep,
exponential multistep and SDE solvers) and :mod:`~sdplan.core.sampling.samplers_more`
(the rest); :data:`sdplan.core.sampling.samplers.SAMPLER_FUNCTIONS` dispatches by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import numpy as np
from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.noise import NoiseSource
from sdplan.core.sampling.schedules import Denoiser, DiscreteSchedule

__all__ = ["StepCallback", "Sampler", "ancestral_step", "ancestral_step_flow",
           "sigma_steps", "no_callback", "guided"]

#: ``callback(step, x, denoised)`` after each step, ``step`` from 0.
StepCallback = Callable[[int, np.ndarray, np.ndarray], None]


class Sampler(Protocol):
    """The signature every sampler function shares.

    Args:
        denoise: ``denoise(x, sigma) -> x0 estimate``, arrays of ``x``'s shape and dtype.
            The CFG++ samplers also read ``denoise.with_uncond(x, sigma) -> (x0, x0_uncond)``
            (:func:`guided`).
        x: starting latent ``(N, C, H, W)`` at noise level ``sigmas[0]``; not modified.
        sigmas: descending sigmas ending in 0, ``len - 1`` steps (any float dtype; the steps
            are computed with Python floats).
        noise: fresh standard normals per call, for the samplers that add noise.
        eta: noise amount; None is the sampler's own default (sd-cli's).
        callback: ``callback(step, x, denoised)`` after each step.
        schedule: the model's noise schedule (``ddim_trailing`` and ``tcd`` read it).

    Samplers with a rectified-flow form (sd-cli's ``is_flow_denoiser`` branches) also take
    ``flow: bool = False``.

    Returns:
        The final latent of ``x``'s shape, and its dtype for a denoiser that keeps it.
    """

    def __call__(self, denoise: Denoiser, x: np.ndarray, sigmas: np.ndarray, *,
                 noise: NoiseSource | None = None, eta: float | None = None,
                 callback: StepCallback | None = None,
                 schedule: DiscreteSchedule | None = None) -> np.ndarray: ...


def ancestral_step(sigma: float, sigma_next: float, eta: float = 1.0) -> tuple[float, float]:
    """``(sigma_down, sigma_up)`` of an ancestral step (k-diffusion ``get_ancestral_step``).

    ``sigma_up = min(sigma_next, eta sqrt(sigma_next^2 (sigma^2 - sigma_next^2) / sigma^2))``,
    ``sigma_down = sqrt(sigma_next^2 - sigma_up^2)``; ``(sigma_next, 0)`` for ``eta <= 0`` or
    ``sigma_next = 0``. Python floats.
    """
    if eta <= 0 or sigma_next == 0.0:
        return sigma_next, 0.0
    up = min(sigma_next, eta * math.sqrt(max(sigma_next**2 * (sigma**2 - sigma_next**2)
                                             / sigma**2, 0.0)))
    return math.sqrt(max(sigma_next**2 - up**2, 0.0)), up


def ancestral_step_flow(sigma: float, sigma_next: float, eta: float = 1.0
                        ) -> tuple[float, float, float]:
    """``(sigma_down, sigma_up, alpha_scale)`` of an ancestral step on a rectified flow
    (``x_s = (1 - s) x0 + s n``; sd-cli's ``get_ancestral_step_flow``).

    ``eta`` is clamped to 1; ``sigma_down = sigma_next (1 + (sigma_next/sigma - 1) eta)``
    (clamped to ``[0, sigma_next]``), ``alpha_scale = (1 - sigma_next) / (1 - sigma_down)``,
    ``sigma_up = sigma_next sqrt(1 - (sigma_down/sigma_next alpha_scale)^2)``: after the step
    to ``sigma_down``, ``alpha_scale x + sigma_up n`` is at ``sigma_next`` again.
    ``(sigma_next, 0, 1)`` for ``eta <= 0`` or a zero sigma.
    """
    if eta <= 0 or sigma <= 0 or sigma_next <= 0:
        return sigma_next, 0.0, 1.0
    eta = min(eta, 1.0)
    down = sigma_next * (1.0 + (sigma_next / sigma - 1.0) * eta)
    down = max(0.0, min(sigma_next, down))
    if 1.0 - down <= 0:
        return sigma_next, 0.0, 1.0
    alpha = (1.0 - sigma_next) / (1.0 - down)
    term = max(-1.0, min(1.0, down / sigma_next * alpha))
    return down, sigma_next * math.sqrt(max(1.0 - term * term, 0.0)), alpha


def sigma_steps(sigmas: np.ndarray) -> list[float]:
    """``sigmas`` as a list of Python floats (float64), checked to descend to 0.

    Raises:
        SamplingError: fewer than two sigmas, a rising pair, or a negative last sigma.
    """
    sig = [float(s) for s in np.asarray(sigmas, dtype=np.float64).ravel()]
    if len(sig) < 2 or any(b > a for a, b in zip(sig, sig[1:], strict=False)) or sig[-1] < 0:
        raise SamplingError(f"sigmas must descend to 0 over at least one step, got {sig[:4]}...")
    return sig


def no_callback(i: int, x: np.ndarray, den: np.ndarray) -> None:
    """The callback used when none is given."""
    return None


def guided(denoise: Denoiser, x: np.ndarray, sigma: float, method: str
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(x0, x0_uncond)``: the guided estimate and the unconditional one, for the CFG++
    samplers; from ``denoise.with_uncond`` (set by
    :func:`~sdplan.core.sampling.schedules.model_denoiser`, which gives the guided estimate
    twice when there is no unconditional pass).

    Raises:
        SamplingError: the denoiser cannot give the unconditional estimate.
    """
    pair = getattr(denoise, "with_uncond", None)
    if pair is None:
        raise SamplingError(f"sampler {method!r} needs the unconditional prediction "
                            "(classifier-free guidance); this denoiser does not give it")
    return pair(x, sigma)  # type: ignore[no-any-return]
