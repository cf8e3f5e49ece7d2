"""The Wan 2.1 3D causal autoencoder decoding a whole latent video as one ggml graph (Wan 2.1 and
the Wan 2.2 A14B experts; the layout and the per-frame pieces are
:mod:`sdplan.core.models.qwen_image_vae`'s).

Frames are the graph's batch axis: a video is ``(T, C, H, W)``. Wan decodes a latent video
one latent frame at a time, each causal convolution keeping the last two frames of its input
as the next chunk's front padding (diffusers ``AutoencoderKLWan._decode``; Wan's ``vae.py``;
stable-diffusion.cpp ``wan_vae.hpp``); over the whole video that is a causal convolution with
two zero frames in front: ``out[t] = sum_j conv2d(x[t - (kt - 1) + j], kernel[:, :, j])``
(:meth:`_Video.conv`: the frames padded in front and one 2-D convolution per temporal tap of
the folded kernel). A temporal upsampling (``upsample3d``: ``resample.1`` after ``time_conv``)
leaves the first frame as it is and turns every later frame into two: ``time_conv`` (a
causal ``(3, 1, 1)`` convolution over frames 1.., doubling the channels) gives each frame's
pair as the two halves of its channels, in order; then every frame is upsampled 2x2 (nearest)
and convolved. So ``T`` latent frames decode to ``1 + 4 (T - 1)`` frames (two temporal
upsamplings), RMS norms and the single-head attention of the middle block act per frame.

sd-cli decodes a long video in chunks with the cache; one graph over the whole video holds
every frame's activations at once (the memory estimate counts them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdplan.core.models.base import ModelLayoutError, Weights
from sdplan.core.models.qwen_image_vae import WanVaeConfig, _Wan
from sdplan.core.runtime import graph as gr

__all__ = ["video_decode", "video_frames", "latent_frames"]


def video_frames(latent_frames: int, temporal: int = 2) -> int:
    """Frames a latent video of ``latent_frames`` decodes to: ``1 + 4 (T - 1)`` with two
    temporal upsamplings (``temporal``)."""
    return 1 + (2 ** temporal) * (latent_frames - 1)


def latent_frames(frames: int, temporal: int = 2) -> int:
    """Latent frames of a video of ``frames`` (sd-cli's ``(frames - 1) / 4 + 1``, rounding
    down: ``--video-frames 6`` samples the 5 frames of 2 latent frames)."""
    return (frames - 1) // (2 ** temporal) + 1


def _tap(g: Any, kernel: Any, taps: int, j: int) -> Any:
    """Temporal tap ``j`` ``(OC, IC, KH, KW)`` of a folded causal kernel ``(OC, IC * taps, KH, KW)``."""
    if taps == 1:
        return kernel
    if kernel.dtype not in ("f32", "f16", "bf16"):
        raise ModelLayoutError(f"Wan autoencoder: a {kernel.dtype} causal kernel cannot be sliced; "
                               "use an f16, bf16 or f32 autoencoder")
    oc, ict, kh, kw = kernel.shape
    es = kernel.nbytes // (oc * ict * kh * kw)
    v = g.view(kernel, (oc, ict // taps, kh, kw), (ict * kh * kw * es, taps * kh * kw * es, kw * es, es),
               j * kh * kw * es)
    return g.cont(v)


class _Video(_Wan):
    """The per-frame pieces with causal convolutions over the frames (module docstring)."""

    def conv(self, name: str, x: Any, stride: int = 1, padding: int | None = None) -> Any:
        g = self.g
        k = self.w[name + ".weight"]
        full = self.shapes.get(self.w.prefix + name + ".weight") if self.shapes else None
        taps = int(full[2]) if full is not None and len(full) == 5 else 1
        pad = k.shape[-1] // 2 if padding is None else padding
        t, c, h, w = x.shape
        if taps == 1:
            return gr.conv2d(g, x, k, self.w[name + ".bias"], stride=stride, padding=pad)
        xp = g.pad(x, [(taps - 1, 0), (0, 0), (0, 0), (0, 0)])
        frame = c * h * w * 4
        out = None
        for j in range(taps):
            xs = g.view(xp, (t, c, h, w), (frame, h * w * 4, w * 4, 4), j * frame)
            y = gr.conv2d(g, xs, _tap(g, k, taps, j), self.w[name + ".bias"] if j == taps - 1 else None,
                          stride=stride, padding=pad)
            out = y if out is None else g.add(out, y)
        return out

    def time_upsample(self, p: str, x: Any) -> Any:
        """``upsample3d``'s temporal half: frame 0 as it is, every later frame turned into two
        by ``time_conv`` (module docstring)."""
        g = self.g
        t, c, h, w = x.shape
        if t == 1:
            return x
        rest = g.view(x, (t - 1, c, h, w), (c * h * w * 4, h * w * 4, w * 4, 4), c * h * w * 4)
        y = self.conv(p + "time_conv", g.cont(rest))  # (t - 1, 2C, H, W): each frame's pair in order
        first = g.view(x, (1, c, h, w), (c * h * w * 4, h * w * 4, w * 4, 4), 0)
        return g.concat(g.cont(first), g.reshape(y, (2 * (t - 1), c, h, w)), 0)


def video_decode(g: Any, weights: Mapping[str, Any], z: Any, cfg: WanVaeConfig,
                 shapes: Mapping[str, tuple[int, ...]]) -> Any:
    """Decode a latent video of the autoencoder's own space (``latent * std + mean`` of the
    DiT's).

    Args:
        weights: the autoencoder's tensors in
            :func:`~sdplan.core.models.qwen_image_vae.folded_shape` shapes.
        z: f32 ``(T, z, h, w)``: the latent frames as the batch axis.
        cfg: :func:`~sdplan.core.models.qwen_image_vae.wan_vae_config` of the file.
        shapes: the file's shapes (5-D kernels say how many temporal taps they fold; a
            ``time_conv`` marks a temporal upsampling).

    Returns:
        f32 ``(1 + 4 (T - 1), 3, h * factor, w * factor)`` in about [-1, 1] (unclamped).
    """
    m = _Video(g, Weights(weights, cfg.prefix), shapes)
    x = m.conv("conv2", z)
    x = m.conv("decoder.conv1", x)
    x = m.middle("decoder.", x)
    for kind, i in cfg.decoder:
        p = f"decoder.upsamples.{i}."
        if kind == "res":
            x = m.residual(p, x)
            continue
        if cfg.prefix + p + "time_conv.weight" in shapes:
            x = m.time_upsample(p, x)
        x = m.conv(p + "resample.1", g.upscale(x, 2), padding=1)
    return m.head("decoder.", x)
