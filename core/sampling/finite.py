"""No silent failure of the maths: latents and pictures are checked for NaN and infinities.

A NaN or an infinity in a latent never comes back: every later step and the decoder carry
it, and the picture's conversion to bytes turns it into black (``NaN`` cast to ``uint8`` is
0). So the shared sampling loops (:func:`sdplan.core.sampling.samplers.sample`,
:func:`sdplan.core.sampling.flow.sample_flow`) check the latent after every step
(:func:`finite_steps`) and the result they return, and the pipelines check the decoded
picture before it becomes bytes: the first non-finite value is a
:class:`~sdplan.core.errors.NonFiniteError` naming the step, and nothing is written. The job
that ran the request adds the likely cause (:mod:`sdplan.core.pipelines.finite`).

The check reads each latent once (``np.isfinite(x).all()``): some microseconds for a
128x128 latent, against the milliseconds to seconds of a denoising step.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from sdplan.core.errors import NonFiniteError

__all__ = ["check_finite", "finite_steps"]


def check_finite(x: np.ndarray, what: str) -> np.ndarray:
    """``x`` when every value is finite.

    Args:
        x: any float array (a latent ``(N, C, H, W)``, a picture ``(3, H, W)``).
        what: what it is, for the message (``"latent after step 3 of 20"``).

    Raises:
        NonFiniteError: a NaN or an infinity in ``x`` (``"the latent after step 3 of 20
            holds NaN or infinite values (nothing was written)"``).
    """
    if not np.isfinite(x).all():
        raise NonFiniteError(what)
    return x


def finite_steps(callback: Callable[[int, np.ndarray, np.ndarray], None] | None, total: int
                 ) -> Callable[[int, np.ndarray, np.ndarray], None]:
    """A sampler's step callback (``callback(step, x, denoised)``, step from 0) that first
    checks the latent ``x`` after step ``step + 1`` of ``total`` (:func:`check_finite`), then
    calls ``callback`` (None: nothing more), so no preview is made of a broken latent."""
    def step(i: int, x: np.ndarray, denoised: np.ndarray) -> None:
        check_finite(x, f"latent after step {i + 1} of {total}")
        if callback is not None:
            callback(i, x, denoised)
    return step
