"""The Qwen-Image autoencoder (the Wan 2.1 3D causal autoencoder) run on still images, frame by
frame, as ggml graphs.

Layout (``qwen_image_vae.safetensors``: the original Wan names, no prefix; ``first_stage_model.``
or ``vae.`` in front are accepted): ``encoder.conv1``, ``encoder.downsamples.N`` (residual
blocks ``residual.{0,2,3,6}`` with a ``shortcut`` where the width changes, and resamples
``resample.1`` with a ``time_conv`` for the temporal ones), ``encoder.middle.{0,1,2}``
(residual, single-head attention, residual), ``encoder.head.{0,2}`` (RMS norm, convolution to
twice the latent channels), ``conv1`` (the quant convolution), ``conv2`` (the post-quant one),
``decoder.conv1``, ``decoder.middle``, ``decoder.upsamples.N`` (residual blocks and resamples
that halve the width) and ``decoder.head``. Convolution kernels are 5-D ``(OC, IC, KT, KH, KW)``
(causal in time), RMS-norm scales ``gamma`` ``(C, 1, 1, 1)`` (``(C, 1, 1)`` in the attention).

Forward pass on one frame (Wan's ``vae.py``; diffusers ``AutoencoderKLQwenImage``;
stable-diffusion.cpp ``wan_vae.hpp``): a causal convolution pads two frames of zeros in front
of the first frame, so on a still image only its last temporal tap ``kernel[:, :, -1]`` meets
data: a 2-D convolution (:func:`tap`); the temporal convolutions of the resamples
(``time_conv``) run only from the second frame on, so a still image never uses them. RMS norm
over the channels ``x / ||x|| * sqrt(C) * gamma`` (``rms_norm`` with eps 1e-12, as sd-cli
runs it); SiLU; downsampling pads one zero row and column at the bottom and right and
convolves 3x3 with stride 2; upsampling repeats each pixel 2x2 (nearest) and convolves 3x3 to
half the width; the attention is single-headed over the pixels of the frame, q/k/v from one
1x1 convolution. The encoder's output goes through ``conv1``; its first ``z`` channels are
the mean (sd-cli encodes to the mean, no sampling). The decoder starts with ``conv2``.

Latent normalisation (the DiT's space): ``(z - mean) / std`` per channel with Wan 2.1's
published 16 means and standard deviations (:data:`LATENT_MEAN`, :data:`LATENT_STD`; the
autoencoder's config in diffusers, sd-cli's ``WanVAERunner``).

Weights: ggml tensors have at most four dimensions, so :func:`folded_shape` folds a 5-D kernel
to ``(OC, IC * KT, KH, KW)`` and a ``gamma`` to ``(C,)``; the graph reads the last tap of a
folded kernel as a strided view. The file's bytes are read as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sdplan.core.models.base import ModelLayoutError, Weights
from sdplan.core.runtime import graph as gr
from sdplan.core.runtime.weights import WeightFile, runtime_dtype

__all__ = ["WanVaeConfig", "wan_vae_config", "folded_shape", "weight_file", "tap", "vae_decode", "vae_encode",
           "LATENT_MEAN", "LATENT_STD", "PREFIXES", "MARKER"]

#: Wan 2.1's latent statistics per channel (diffusers ``AutoencoderKLQwenImage`` config,
#: stable-diffusion.cpp ``WanVAERunner::get_latents_mean_std``).
LATENT_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
               0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
LATENT_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
              3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160)
#: Prefixes a Wan autoencoder's names may carry (a separate file has none).
PREFIXES = ("", "first_stage_model.", "vae.")
#: A tensor every Wan autoencoder has (its decoder's first causal convolution).
MARKER = "decoder.conv1.weight"
_EPS = 1e-12


@dataclass(frozen=True)
class WanVaeConfig:
    """The structure of a Wan autoencoder (inferred by :func:`wan_vae_config`).

    Attributes:
        prefix: in front of every name.
        z: latent channels (16 for Wan 2.1).
        encoder, decoder: the ``downsamples`` / ``upsamples`` in order, each ``("res", i)``
            or ``("down", i)`` / ``("up", i)``; empty when the file has no encoder / decoder.
        factor: image pixels per latent pixel (2 per resample).
    """

    prefix: str
    z: int
    encoder: tuple[tuple[str, int], ...]
    decoder: tuple[tuple[str, int], ...]
    factor: int


def _layers(w: Weights, part: str) -> tuple[tuple[str, int], ...]:
    out = []
    for i in w.indices(f"{part}."):
        if f"{part}.{i}.residual.0.gamma" in w:
            out.append(("res", i))
        elif f"{part}.{i}.resample.1.weight" in w:
            out.append(("down" if part.endswith("downsamples") else "up", i))
        else:
            raise ModelLayoutError(f"Wan autoencoder: {w.prefix}{part}.{i} is neither a residual block nor a resample")
    return tuple(out)


def wan_vae_config(weights: Mapping[str, Any]) -> WanVaeConfig:
    """Infer a :class:`WanVaeConfig` from ``weights`` (tensors or shape tuples) under one of
    :data:`PREFIXES`.

    Raises:
        ModelLayoutError: no Wan autoencoder (``decoder.conv1.weight`` or
            ``encoder.conv1.weight`` missing), a 2-D Wan 2.2 layout, or numbered layers that
            are neither residual blocks nor resamples.
    """
    for prefix in PREFIXES:
        w = Weights(weights, prefix)
        if MARKER in w or "encoder.conv1.weight" in w:
            break
    else:
        raise ModelLayoutError(f"no Wan autoencoder: {MARKER!r} and 'encoder.conv1.weight' missing")
    if "decoder.conv1.weight" in w and len(w.shape("decoder.conv1.weight")) != 5:
        raise ModelLayoutError("a Wan autoencoder with 2-D convolutions (Wan 2.2's 48-channel layout) is not "
                               "the Qwen-Image autoencoder")
    enc = _layers(w, "encoder.downsamples") if "encoder.conv1.weight" in w else ()
    dec = _layers(w, "decoder.upsamples") if MARKER in w else ()
    z = w.shape("conv2.weight")[0] if "conv2.weight" in w else w.shape("conv1.weight")[0] // 2
    resamples = sum(k != "res" for k, _ in (dec or enc))
    return WanVaeConfig(prefix, int(z), enc, dec, 2 ** resamples)


def folded_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ``name`` is held in: a 5-D kernel ``(OC, IC, KT, KH, KW)`` as
    ``(OC, IC * KT, KH, KW)``, an RMS norm's ``gamma`` as ``(C,)``, any other unchanged (the
    bytes are the same; ggml tensors have at most four dimensions)."""
    if len(shape) == 5:
        oc, ic, kt, kh, kw = shape
        return (oc, ic * kt, kh, kw)
    if name.endswith("gamma"):
        return (int(shape[0]),)
    return tuple(shape)



def weight_file(path: str | Path, names: Iterable[str] | None = None, backend: Any = None) -> WeightFile:
    """A :class:`~sdplan.core.runtime.weights.WeightFile` of a Wan autoencoder file whose
    tensors are held in their :func:`folded_shape` (dtypes chosen by the runtime policy for the
    folded shape: 4-D kernels f16 or f32, ``gamma`` f32).

    Raises:
        ModelFileError: an unreadable file or a missing name.
    """
    wf = WeightFile(path, names, backend=backend)
    for n, info in wf.infos.items():
        shape = folded_shape(n, tuple(info.shape))
        if shape != tuple(info.shape):
            wf.infos[n] = replace(info, shape=shape)
            wf.dtypes[n] = wf._policy[n] = runtime_dtype(wf.infos[n], backend)  # the policy of the held shape
    return wf


def tap(g: Any, kernel: Any, taps: int) -> Any:
    """The last temporal tap ``(OC, IC, KH, KW)`` of a folded causal kernel ``(OC, IC * taps,
    KH, KW)`` (a copy of a strided view; the kernel itself when ``taps`` is 1).

    Raises:
        ModelLayoutError: a quantized kernel (its rows cannot be sliced).
    """
    if taps == 1:
        return kernel
    if kernel.dtype not in ("f32", "f16", "bf16"):
        raise ModelLayoutError(f"Wan autoencoder: a {kernel.dtype} causal kernel cannot be sliced; "
                               "use an f16, bf16 or f32 autoencoder")
    oc, ict, kh, kw = kernel.shape
    es = kernel.nbytes // (oc * ict * kh * kw)
    ic = ict // taps
    v = g.view(kernel, (oc, ic, kh, kw), (ict * kh * kw * es, taps * kh * kw * es, kw * es, es),
               (taps - 1) * kh * kw * es)
    return g.cont(v)


class _Wan:
    """Graph pieces over one weights view (``w``: folded tensors; ``shapes``: the file's)."""

    def __init__(self, g: Any, w: Weights, shapes: Mapping[str, tuple[int, ...]] | None) -> None:
        self.g, self.w, self.shapes = g, w, shapes

    def conv(self, name: str, x: Any, stride: int = 1, padding: int | None = None) -> Any:
        """Convolution ``name`` (2-D, or a causal 3-D one on the frame) of ``x`` ``(1, C, H, W)``."""
        k = self.w[name + ".weight"]
        full = self.shapes.get(self.w.prefix + name + ".weight") if self.shapes else None
        taps = int(full[2]) if full is not None and len(full) == 5 else 1
        kernel = tap(self.g, k, taps)
        pad = kernel.shape[-1] // 2 if padding is None else padding
        return gr.conv2d(self.g, x, kernel, self.w[name + ".bias"], stride=stride, padding=pad)

    def norm(self, name: str, x: Any) -> Any:
        """RMS norm over the channels of ``x`` ``(1, C, H, W)`` times ``gamma``."""
        g = self.g
        h = g.rms_norm(g.cont(g.permute(x, (0, 2, 3, 1))), _EPS)
        h = g.mul(h, self.w[name + ".gamma"])
        return g.cont(g.permute(h, (0, 3, 1, 2)))

    def residual(self, p: str, x: Any) -> Any:
        g = self.g
        h = self.conv(p + "residual.2", g.unary("silu", self.norm(p + "residual.0", x)))
        h = self.conv(p + "residual.6", g.unary("silu", self.norm(p + "residual.3", h)))
        skip = self.conv(p + "shortcut", x) if p + "shortcut.weight" in self.w else x
        return g.add(h, skip)

    def attention(self, p: str, x: Any) -> Any:
        g = self.g
        n, c, hh, ww = x.shape
        qkv = self.conv(p + "to_qkv", self.norm(p + "norm", x))  # (1, 3C, H, W)
        tokens = g.cont(g.permute(g.reshape(qkv, (n, 3 * c, hh * ww)), (0, 2, 1)))  # (1, HW, 3C)

        def part(k: int) -> Any:
            v = g.view(tokens, (n, hh * ww, c), (hh * ww * 3 * c * 4, 3 * c * 4, 4), k * c * 4)
            return g.reshape(g.cont(v), (n, 1, hh * ww, c))

        o = gr.attention(g, part(0), part(1), part(2))  # (1, HW, C)
        o = g.reshape(g.cont(g.permute(o, (0, 2, 1))), (n, c, hh, ww))
        return g.add(x, self.conv(p + "proj", o))

    def middle(self, p: str, x: Any) -> Any:
        x = self.residual(p + "middle.0.", x)
        x = self.attention(p + "middle.1.", x)
        return self.residual(p + "middle.2.", x)

    def head(self, p: str, x: Any) -> Any:
        return self.conv(p + "head.2", self.g.unary("silu", self.norm(p + "head.0", x)))


def vae_decode(g: Any, weights: Mapping[str, Any], z: Any, cfg: WanVaeConfig,
               shapes: Mapping[str, tuple[int, ...]] | None = None) -> Any:
    """Decode a latent of the autoencoder's own space (``latent * std + mean`` of the DiT's).

    Args:
        weights: the autoencoder's tensors in :func:`folded_shape` shapes (a lookup or mapping).
        z: f32 ``(1, z, h, w)``.
        cfg: :func:`wan_vae_config` of the file.
        shapes: the file's shapes (5-D kernels say how many temporal taps they fold).

    Returns:
        f32 ``(1, 3, h * factor, w * factor)`` in about [-1, 1] (unclamped).
    """
    m = _Wan(g, Weights(weights, cfg.prefix), shapes)
    x = m.conv("conv2", z)
    x = m.conv("decoder.conv1", x)
    x = m.middle("decoder.", x)
    for kind, i in cfg.decoder:
        p = f"decoder.upsamples.{i}."
        if kind == "res":
            x = m.residual(p, x)
        else:
            x = m.conv(p + "resample.1", g.upscale(x, 2), padding=1)
    return m.head("decoder.", x)


def vae_encode(g: Any, weights: Mapping[str, Any], image: Any, cfg: WanVaeConfig,
               shapes: Mapping[str, tuple[int, ...]] | None = None) -> Any:
    """The mean of the autoencoder's latent of an image (sd-cli's Wan encode: no sampling).

    Args:
        image: f32 ``(1, 3, H, W)`` in [-1, 1], sides multiples of ``cfg.factor``.

    Returns:
        f32 ``(1, z, H / factor, W / factor)`` in the autoencoder's own space.
    """
    m = _Wan(g, Weights(weights, cfg.prefix), shapes)
    x = m.conv("encoder.conv1", image)
    for kind, i in cfg.encoder:
        p = f"encoder.downsamples.{i}."
        if kind == "res":
            x = m.residual(p, x)
        else:
            x = m.conv(p + "resample.1", g.pad(x, [(0, 0), (0, 0), (0, 1), (0, 1)]), stride=2, padding=0)
    x = m.head("encoder.", m.middle("encoder.", x))
    out = m.conv("conv1", x)  # (1, 2z, h, w): mean then log-variance
    n, c2, h, w = out.shape
    return g.cont(g.view(out, (n, cfg.z, h, w), (c2 * h * w * 4, h * w * 4, w * 4, 4), 0))
