"""The hires fix's second pass as sd-cli runs it (``generate_image`` in
``src/stable-diffusion.cpp``; read, not copied).

After every picture of the batch is sampled, each final latent is upscaled to the hires
target and sampled again from a truncated schedule, then decoded:

1. the generators are seeded again with the picture's seed (``seed + b``);
2. the upscale: a ``Latent`` upscaler interpolates the latent itself (bilinear, nearest,
   nearest-exact, antialiased bilinear, bicubic, antialiased bicubic); ``Lanczos`` and
   ``Nearest`` decode the latent, interpolate the picture in [0, 1] and clamp it, an ESRGAN
   model upscales the decoded picture on the upscaler's device (resized by nearest to the
   target when its scale misses it); the picture is encoded again, drawing the VAE's sample
   from the seed's generator;
3. the noise is the generator's next draw at the hires latent's shape;
4. the schedule (:func:`hires_sigmas`): ``N = int(steps / strength)`` scheduler steps of the
   first pass's scheduler at the hires size, and the last ``int(N * strength) + 1`` steps of
   them (at most ``N``), so exactly ``--hires-steps`` (or ``--steps``) steps run; float32
   arithmetic as sd-cli's;
5. the upscaled latent noised to the schedule's first sigma as image to image does.

:func:`interpolate` is sd-cli's ``sd::ops::interpolate`` (``src/core/tensor.hpp``) for the
modes the hires fix uses, separable along both axes.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from sdplan.core.pipelines.request_parts import HiresFix

__all__ = ["interpolate", "hires_sigmas", "upscale_latent", "hires_upscaler", "flow_hires", "LATENT_MODES"]

#: ``--hires-upscaler`` latent names -> (interpolation mode, antialias).
LATENT_MODES = {"Latent": ("bilinear", False), "Latent (nearest)": ("nearest", False),
                "Latent (nearest-exact)": ("nearest-exact", False), "Latent (antialiased)": ("bilinear", True),
                "Latent (bicubic)": ("bicubic", False), "Latent (bicubic antialiased)": ("bicubic", True)}


def _cubic(x: np.ndarray) -> np.ndarray:
    a = -0.75  # PyTorch's bicubic
    x = np.abs(x)
    return np.where(x <= 1.0, ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
                    np.where(x < 2.0, ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a, 0.0))


def _lanczos(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 3.0, np.sinc(x) * np.sinc(x / 3.0), 0.0)


def _axis_matrix(n_in: int, n_out: int, mode: str, antialias: bool) -> np.ndarray:
    """The ``(n_out, n_in)`` float64 weights of one axis (sd-cli's interpolate contributors)."""
    m = np.zeros((n_out, n_in))
    scale = n_in / n_out
    out = np.arange(n_out)
    if mode in ("nearest", "nearest-exact"):
        if mode == "nearest":
            idx = out * n_in // n_out
        else:
            idx = np.clip(np.floor((out + 0.5) * scale - 0.5 + 0.5), 0, n_in - 1).astype(int)
        m[out, idx] = 1.0
        return m
    fscale = max(1.0, scale) if antialias else 1.0
    support = {"bilinear": 1.0, "bicubic": 2.0, "lanczos": 3.0}[mode] * fscale
    kernel: Callable[[np.ndarray], np.ndarray] = {
        "bilinear": lambda x: np.maximum(1.0 - np.abs(x), 0.0), "bicubic": _cubic, "lanczos": _lanczos}[mode]
    for o in range(n_out):
        center = (o + 0.5) * scale - 0.5
        taps = np.arange(math.ceil(center - support), math.floor(center + support) + 1)
        w = kernel((center - taps) / fscale)
        keep = w != 0.0
        taps, w = taps[keep], w[keep]
        if (antialias or mode == "lanczos") and abs(w.sum()) > 1e-12:
            w = w / w.sum()
        if len(taps) == 0:
            m[o, min(max(int(math.floor(center + 0.5)), 0), n_in - 1)] = 1.0
            continue
        np.add.at(m[o], np.clip(taps, 0, n_in - 1), w)
    return m


def interpolate(x: np.ndarray, height: int, width: int, mode: str, antialias: bool = False) -> np.ndarray:
    """``x`` ``(N, C, H, W)`` resized to ``height`` x ``width`` as sd-cli interpolates
    (module docstring): ``mode`` ``nearest`` (index ``o * in // out``), ``nearest-exact``,
    ``bilinear``, ``bicubic`` (a = -0.75), ``lanczos`` (radius 3, weights normalised);
    ``antialias`` widens the filters by the downscale. float32 out."""
    n, c, h, w = x.shape
    if (h, w) == (height, width):
        return np.asarray(x, np.float32)
    my = _axis_matrix(h, height, mode, antialias)
    mx = _axis_matrix(w, width, mode, antialias)
    return np.einsum("oh,nchw,pw->ncop", my, np.asarray(x, np.float64), mx).astype(np.float32)


def hires_sigmas(sigmas_for: Callable[[int], np.ndarray], steps: int, fix: HiresFix) -> np.ndarray:
    """The second pass's sigmas (module docstring, step 4): ``sigmas_for(n)`` gives the first
    pass's scheduler's ``n + 1`` sigmas at the hires size; ``steps`` are the first pass's."""
    strength = np.float32(fix.strength)
    effective = max(1, fix.steps if fix.steps > 0 else steps)
    total = max(1, int(np.float32(effective) / strength))
    sigmas = np.asarray(sigmas_for(total), np.float32)
    t_enc = int(np.float32(total) * strength)
    t_enc = min(t_enc, total - 1)
    return sigmas[total - t_enc - 1:]


def upscale_latent(latent: np.ndarray, fix: HiresFix, target: tuple[int, int], factor: int,
                   decode: Callable[[np.ndarray], np.ndarray],
                   encode: Callable[[np.ndarray, np.ndarray], np.ndarray],
                   draw: Callable[[tuple[int, ...]], np.ndarray], upscaler: Any = None) -> np.ndarray:
    """One picture's latent ``(1, C, h, w)`` upscaled for the second pass (module docstring,
    step 2).

    Args:
        fix: the hires fix; target: ``(width, height)`` in pixels; factor: pixels per latent
            pixel.
        decode: latent -> picture ``(1, 3, H, W)`` in about [-1, 1].
        encode: ``(picture in [-1, 1], standard normal noise)`` -> the diffusion latent (a
            draw of the VAE's distribution).
        draw: the seed's generator (the encode's noise is its next draw).
        upscaler: an :class:`~sdplan.core.pipelines.stages.upscale.Upscaler` for a model
            upscaler.
    """
    tw, th = target
    if fix.in_latent:
        mode, aa = LATENT_MODES[fix.upscaler]
        return interpolate(latent, th // factor, tw // factor, mode, aa)
    img = np.clip((decode(latent) + 1.0) * 0.5, 0.0, 1.0).astype(np.float32)
    if fix.is_model:
        up = upscaler.upscale_array(img)
        if up.shape[2:] != (th, tw):
            up = interpolate(up, th, tw, "nearest")
    else:
        up = np.clip(interpolate(img, th, tw, "lanczos" if fix.upscaler == "Lanczos" else "nearest"), 0.0, 1.0)
    shape = (1, latent.shape[1], th // factor, tw // factor)
    return encode((up * 2.0 - 1.0).astype(np.float32), draw(shape))


@contextlib.contextmanager
def hires_upscaler(request: Any, plan: Mapping[str, Any], pool: Any, cancel: Any = None) -> Iterator[Any]:
    """The hires fix's ESRGAN model of ``request`` (a
    :class:`~sdplan.core.pipelines.request.GenerationRequest`): an
    :class:`~sdplan.core.pipelines.stages.upscale.Upscaler` on the ``upscaler`` module's
    planned device with its residency and budget (without a plan entry, the VAE's main
    device), closed after the run; None for sd-cli's own upscalers.

    Raises:
        InvalidArgument: a model name with no file; ModelFileError: not an upscaler.
    """
    path = request.hires_model()
    if not path:
        yield None
        return
    from sdplan.core.pipelines.stages.upscale import Upscaler
    from sdplan.core.runtime.placement import ModulePlacement

    place = plan.get("upscaler") or ModulePlacement(plan["vae"].devices[:1])
    up = Upscaler(path, placement=ModulePlacement(place.devices[:1], (), place.params_mode, place.params_device,
                                                  place.budget), pool=pool)
    if cancel is not None:
        up.runner.cancel = cancel
    try:
        yield up
    finally:
        up.close()


@contextlib.contextmanager
def flow_hires(pipe: Any, request: Any, plan: Mapping[str, Any], progress: Any) -> Iterator[None]:
    """A flow family's run with the request's hires fix: ``pipe.hires`` is ``(HiresFix,
    Upscaler or None)`` meanwhile (read by
    :meth:`~sdplan.core.pipelines.stages.flow_dit.FlowDiTPipeline._hires_pass`), None after."""
    if not request.hires.active:
        pipe.hires = None
        yield
        return
    with hires_upscaler(request, plan, progress.pool(), progress.cancel) as up:
        pipe.hires = (request.hires, up)
        try:
            yield
        finally:
            pipe.hires = None
