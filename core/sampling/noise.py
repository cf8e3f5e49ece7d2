"""Seeded noise for sampling: sd-cli's three generators and the starting latent.

:class:`PhiloxNoise` is sd-cli's default generator (``--rng cuda``): Philox4x32-10 keyed by the
seed, one counter offset per draw, Box-Muller on the first two words, computed on the host in
float32. It was chosen over numpy's PCG64 because the same seed then gives the same starting
latent as sd-cli (and as torch's CUDA ``randn``, which it imitates), and because it is counter
based: noise depends only on (seed, draw index, element index), never on the device or the
placement that later consumes it.

:class:`TorchCpuNoise` is ``--rng cpu`` (torch's CPU ``randn``: MT19937, as sd-cli's
``rng_mt19937.hpp`` imitates it) and :class:`StdDefaultNoise` is ``--rng std_default``
(``std::default_random_engine`` with ``std::normal_distribution<float>``, as GCC's libstdc++
implements them: ``minstd_rand0`` and the Marsaglia polar method; other C++ libraries differ,
so sd-cli itself gives other numbers on Windows). :func:`make_noise` picks one by sd-cli's
name (:data:`RNGS`).
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.names import RNGS

__all__ = ["NoiseSource", "require_noise", "PhiloxNoise", "TorchCpuNoise", "StdDefaultNoise",
           "RNGS", "make_noise", "initial_latent"]

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

    def __call__(self, shape: tuple[int, ...], /) -> np.ndarray:
        """:meth:`randn` (a :class:`NoiseSource`)."""
        return self.randn(shape)


class TorchCpuNoise:
    """sd-cli's ``cpu`` generator: torch's CPU ``randn`` (MT19937 seeded with the seed's low
    32 bits; draws of 16 or more values fill uniforms ``(w & (2^24 - 1)) / 2^24`` from
    consecutive 32-bit outputs and turn each run of 16 into 8 Box-Muller pairs, the last 16
    recomputed from fresh outputs when the size is not a multiple of 16; smaller draws use
    double Box-Muller on 53-bit uniforms, caching the second value). The state runs on
    from draw to draw, as one generator object does.

    Raises:
        SamplingError: ``seed`` is not an integer.
    """

    def __init__(self, seed: int) -> None:
        if not isinstance(seed, (int, np.integer)):
            raise SamplingError(f"seed must be an integer, got {seed!r}")
        self.seed = int(seed)
        self._mt = np.random.MT19937(0)
        self._mt._legacy_seeding(self.seed & 0xFFFFFFFF)  # init_genrand: torch's seeding
        self._next_gauss: float | None = None

    def _u32(self, n: int) -> np.ndarray:
        return self._mt.random_raw(n).astype(np.uint64)

    def randn(self, shape: tuple[int, ...]) -> np.ndarray:
        """The next draw: float32 standard normals of ``shape`` (C order)."""
        n = int(np.prod(shape))
        if n >= 16:
            u = ((self._u32(n) & np.uint64(0xFFFFFF)).astype(np.float32)
                 * np.float32(1.0 / (1 << 24)))
            out = np.empty(n, np.float32)
            full = n // 16 * 16
            out[:full] = self._fill16(u[:full])
            if n % 16:
                tail = ((self._u32(16) & np.uint64(0xFFFFFF)).astype(np.float32)
                        * np.float32(1.0 / (1 << 24)))
                out[n - 16:] = self._fill16(tail)
            return out.reshape(shape)
        vals = np.empty(n, np.float32)
        for i in range(n):
            vals[i] = np.float32(self._normal_double())
        return vals.reshape(shape)

    @staticmethod
    def _fill16(u: np.ndarray) -> np.ndarray:
        g = u.reshape(-1, 2, 8)
        u1 = np.float32(1.0) - g[:, 0]
        u2 = g[:, 1]
        r = np.sqrt(np.float32(-2.0) * np.log(u1))
        theta = np.float32(2.0 * math.pi) * u2
        return np.concatenate([r * np.cos(theta), r * np.sin(theta)], axis=1).ravel()

    def _normal_double(self) -> float:
        if self._next_gauss is not None:
            v, self._next_gauss = self._next_gauss, None
            return v
        w = self._u32(4)
        mask = (1 << 53) - 1
        u1 = ((int(w[0]) << 32 | int(w[1])) & mask) / float(1 << 53)
        u2 = ((int(w[2]) << 32 | int(w[3])) & mask) / float(1 << 53)
        r = math.sqrt(-2.0 * math.log1p(-u2))
        theta = 2.0 * math.pi * u1
        self._next_gauss = r * math.sin(theta)
        return r * math.cos(theta)

    def __call__(self, shape: tuple[int, ...], /) -> np.ndarray:
        """:meth:`randn` (a :class:`NoiseSource`)."""
        return self.randn(shape)


class StdDefaultNoise:
    """sd-cli's ``std_default`` generator as GCC's libstdc++ builds it:
    ``std::default_random_engine`` (``minstd_rand0``: ``x <- 16807 x mod (2^31 - 1)``, seeded
    with the seed's low 32 bits, 0 mod m giving 1) and, per draw, a fresh
    ``std::normal_distribution<float>`` (Marsaglia's polar method on
    ``u = float(x - 1) / 2^31`` pairs ``2u - 1``, rejecting ``r^2 > 1`` or ``r^2 = 0``;
    each accepted pair gives ``y m`` then ``x m`` with ``m = sqrt(-2 ln r^2 / r^2)`` in
    float32). The engine runs on from draw to draw; an odd draw drops its saved value.

    Raises:
        SamplingError: ``seed`` is not an integer.
    """

    M = 2147483647
    A = 16807

    def __init__(self, seed: int) -> None:
        if not isinstance(seed, (int, np.integer)):
            raise SamplingError(f"seed must be an integer, got {seed!r}")
        x = (int(seed) & 0xFFFFFFFF) % self.M
        self.state = x if x != 0 else 1

    def _uniforms(self, n: int) -> np.ndarray:
        """The next ``n`` engine outputs as libstdc++'s ``generate_canonical<float>``."""
        powers = np.empty(n, dtype=np.uint64)
        p, base = 1, self.A
        # a^k mod m for k = 1..n by doubling blocks
        powers[0] = base
        filled = 1
        while filled < n:
            step = min(filled, n - filled)
            mult = int(powers[filled - 1])
            powers[filled:filled + step] = (powers[:step] * np.uint64(mult)) % np.uint64(self.M)
            filled += step
        xs = (powers * np.uint64(self.state)) % np.uint64(self.M)
        self.state = int(xs[-1])
        del p
        u = (xs - np.uint64(1)).astype(np.float32) / np.float32(2147483648.0)
        return np.minimum(u, np.float32(np.nextafter(np.float32(1), np.float32(0))))

    def randn(self, shape: tuple[int, ...]) -> np.ndarray:
        """The next draw: float32 standard normals of ``shape`` (C order)."""
        n = int(np.prod(shape))
        pairs_needed = (n + 1) // 2
        out = np.empty(0, np.float32)
        while out.size < 2 * pairs_needed:
            want = pairs_needed - out.size // 2
            state = self.state
            u = self._uniforms(2 * (int(want * 1.35) + 8))
            x = (np.float32(2.0) * u[0::2] - np.float32(1.0)).astype(np.float32)
            y = (np.float32(2.0) * u[1::2] - np.float32(1.0)).astype(np.float32)
            r2 = (x * x + y * y).astype(np.float32)
            ok = np.flatnonzero((r2 <= 1.0) & (r2 != 0.0))
            if ok.size >= want:  # rewind the engine to just after the last pair used
                last = int(ok[want - 1])
                self.state = state
                self._uniforms(2 * (last + 1))
                ok = ok[:want]
            mult = np.sqrt(np.float32(-2.0) * np.log(r2[ok]) / r2[ok]).astype(np.float32)
            pair = np.stack([y[ok] * mult, x[ok] * mult], axis=1).ravel()
            out = np.concatenate([out, pair.astype(np.float32)])
        return out[:n].reshape(shape)

    def __call__(self, shape: tuple[int, ...], /) -> np.ndarray:
        """:meth:`randn` (a :class:`NoiseSource`)."""
        return self.randn(shape)


def make_noise(rng: str, seed: int) -> NoiseSource:
    """The generator sd-cli's ``--rng``/``--sampler-rng`` name ``rng`` gives for ``seed``:
    ``cuda`` :class:`PhiloxNoise`, ``cpu`` :class:`TorchCpuNoise`, ``std_default``
    :class:`StdDefaultNoise`.

    Raises:
        SamplingError: an unknown name (the message lists :data:`RNGS`).
    """
    if rng == "cuda":
        return PhiloxNoise(seed)
    if rng == "cpu":
        return TorchCpuNoise(seed)
    if rng == "std_default":
        return StdDefaultNoise(seed)
    raise SamplingError(f"unknown --rng {rng!r} (choose one of {', '.join(RNGS)})")


def initial_latent(noise: np.ndarray, sigmas: np.ndarray) -> np.ndarray:
    """The starting latent for text-to-image: ``noise * sigmas[0]``.

    ``noise`` of any shape (usually ``(N, C, H, W)`` from :meth:`PhiloxNoise.randn`), ``sigmas``
    a schedule (:func:`~sdplan.core.sampling.schedules.get_sigmas`); returns float32 of
    ``noise``'s shape (k-diffusion's ``x = randn * sigmas[0]``).
    """
    return (np.asarray(noise, dtype=np.float32) * np.float32(sigmas[0])).astype(np.float32)
