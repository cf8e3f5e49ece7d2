"""Seeded noise for sampling: sd-cli's default generator and the starting latent.

:class:`PhiloxNoise` is sd-cli's default generator (``--rng cuda``): Philox4x32-10 keyed by the
seed, one counter offset per draw, Box-Muller on the first two words, computed on the host in
float32. It was chosen over numpy's PCG64 because the same seed then gives the same starting
latent as sd-cli (and as torch's CUDA ``randn``, which it imitates), and because it is counter
based: noise depends only on (seed, draw index, element index), never on the device or the
placement that later consumes it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
from sdplan.core.sampling.errors import SamplingError

__all__ = ["NoiseSource", "require_noise", "PhiloxNoise", "initial_latent"]


class NoiseSource(Protocol):
    """Fresh noise for samplers: ``noise(shape) -> standard normals`` of ``shape``.

    Each call is a new draw (float32 from :class:`PhiloxNoise`; the samplers cast it to the
    latent's dtype).
    """

    def __call__(self, shape: tuple[int, ...], /) -> np.ndarray: ...


def require_noise(noise: NoiseSource | None, method: str) -> NoiseSource:
    """``noise`` itself, for a sampler that is about to draw from it.

    Raises:
        SamplingError: ``noise`` is None (the message names the sampler ``method``).
    """
    if noise is None:
        raise SamplingError(f"sampler {method!r} adds noise every step: give it a noise source")
    return noise


class PhiloxNoise:
    """sd-cli's ``cuda`` generator: Philox4x32-10 normals, reproducible from the seed alone.

    Draw ``k`` (0 for the initial latent, then one per ancestral step) uses counter
    ``(k, 0, i, 0)`` for element ``i`` and key ``(seed & 0xffffffff, seed >> 32)``; the normal
    is ``sqrt(-2 ln u) * sin(v)`` with ``u = (w0 + 0.5) / 2^32`` and
    ``v = 2 pi (w1 + 0.5) / 2^32`` from the first two output words, in float32 (sd-cli's
    ``rng_philox.hpp``, after torch's CUDA ``randn``).

    Raises:
        SamplingError: ``seed`` is not an integer.
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
    """The starting latent for text-to-image: ``noise * sigmas[0]``.

    ``noise`` of any shape (usually ``(N, C, H, W)`` from :meth:`PhiloxNoise.randn`), ``sigmas``
    a schedule (:func:`~sdplan.core.sampling.schedules.get_sigmas`); returns float32 of
    ``noise``'s shape (k-diffusion's ``x = randn * sigmas[0]``).
    """
    return (np.asarray(noise, dtype=np.float32) * np.float32(sigmas[0])).astype(np.float32)
