"""The Wan 2.1 3D causal autoencoder *encoding* a whole video as one ggml graph (the picture
latent of Wan 2.2 I2V-A14B's condition; the layout and per-frame pieces are
:mod:`sdplan.core.models.qwen_image_vae`'s, the causal convolutions over frames
:mod:`sdplan.core.models.wan_vae`'s).

Frames are the graph's batch axis: a video is ``(F, 3, H, W)``. Wan encodes the first frame
alone and then chunks of four frames, each causal convolution keeping the last two frames of
its input for the next chunk (diffusers ``AutoencoderKLWan._encode``; Wan's ``vae.py``;
stable-diffusion.cpp ``wan_vae.hpp``). Over the whole video that is a causal convolution with
two zero frames in front (as the decoder's). A temporal downsampling (``downsample3d``: the
spatial ``resample.1`` then ``time_conv``) keeps the first frame as it is and, over the
frames after it, convolves ``time_conv`` (kernel ``(3, 1, 1)``, stride 2 in time, no padding)
on the sequence *from the first frame*: the windows ``(0, 1, 2), (2, 3, 4), ...`` (each chunk
after the first sees the last frame of the chunk before). So ``1 + 4 k`` frames encode to
``1 + k`` latent frames (two temporal downsamplings); frames beyond ``1 + 4 k`` are dropped
as diffusers and sd-cli drop them.

One graph over the whole video holds every frame's activations at once (the memory estimate
counts them); sd-cli encodes chunk by chunk with the cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdplan.core.models.base import Weights
from sdplan.core.models.qwen_image_vae import WanVaeConfig
from sdplan.core.models.wan_vae import _tap, _Video
from sdplan.core.runtime import graph as gr

__all__ = ["video_encode", "encoded_frames"]


def encoded_frames(frames: int, temporal: int = 2) -> int:
    """Latent frames of a video of ``frames`` pictures (``(frames - 1) // 4 + 1`` with two
    temporal downsamplings; diffusers' ``1 + (num_frame - 1) // 4`` chunks)."""
    return (frames - 1) // (2 ** temporal) + 1


class _Encoder(_Video):
    """The encoder's temporal downsampling over a whole video (module docstring)."""

    def time_downsample(self, p: str, x: Any) -> Any:
        """``downsample3d``'s temporal half on ``x`` ``(T, C, H, W)`` with ``T`` odd: frame 0 as
        it is, then ``time_conv`` with stride 2 over frames ``0..T-1`` (``(T - 1) / 2`` frames)."""
        g = self.g
        t, c, h, w = x.shape
        if t == 1:
            return x
        n = (t - 1) // 2
        k = self.w[p + "time_conv.weight"]
        full = self.shapes.get(self.w.prefix + p + "time_conv.weight") if self.shapes else None
        taps = int(full[2]) if full is not None and len(full) == 5 else 1
        frame = c * h * w * 4
        out = None
        for j in range(taps):
            xs = g.cont(g.view(x, (n, c, h, w), (2 * frame, h * w * 4, w * 4, 4), j * frame))
            y = gr.conv2d(g, xs, _tap(g, k, taps, j), self.w[p + "time_conv.bias"] if j == taps - 1 else None,
                          stride=1, padding=0)
            out = y if out is None else g.add(out, y)
        first = g.cont(g.view(x, (1, c, h, w), (frame, h * w * 4, w * 4, 4), 0))
        return g.concat(first, out, 0)


def video_encode(g: Any, weights: Mapping[str, Any], video: Any, cfg: WanVaeConfig,
                 shapes: Mapping[str, tuple[int, ...]]) -> Any:
    """The mean of the autoencoder's latent of a whole video (sd-cli's Wan encode: no sampling).

    Args:
        weights: the autoencoder's tensors in
            :func:`~sdplan.core.models.qwen_image_vae.folded_shape` shapes.
        video: f32 ``(F, 3, H, W)`` in [-1, 1], ``F = 1 + 4 k`` (frames as the batch axis),
            sides multiples of ``cfg.factor``.
        cfg: :func:`~sdplan.core.models.qwen_image_vae.wan_vae_config` of the file (with its
            encoder).
        shapes: the file's shapes (5-D kernels say how many temporal taps they fold; a
            ``time_conv`` marks a temporal downsampling).

    Returns:
        f32 ``(1 + k, z, H / factor, W / factor)`` in the autoencoder's own space (the DiT's
        is ``(mean - LATENT_MEAN) / LATENT_STD``).

    Raises:
        ValueError: a frame count that is not ``1 + 4 k`` for this autoencoder's temporal
            downsamplings.
    """
    m = _Encoder(g, Weights(weights, cfg.prefix), shapes)
    f = video.shape[0]
    temporal = sum(1 for kind, i in cfg.encoder
                   if kind != "res" and cfg.prefix + f"encoder.downsamples.{i}.time_conv.weight" in shapes)
    if (f - 1) % (2 ** temporal):
        raise ValueError(f"Wan autoencoder: a video of {f} frames to encode; it takes 1 + {2 ** temporal} k")
    x = m.conv("encoder.conv1", video)
    for kind, i in cfg.encoder:
        p = f"encoder.downsamples.{i}."
        if kind == "res":
            x = m.residual(p, x)
            continue
        x = m.conv(p + "resample.1", g.pad(x, [(0, 0), (0, 0), (0, 1), (0, 1)]), stride=2, padding=0)
        if cfg.prefix + p + "time_conv.weight" in shapes:
            x = m.time_downsample(p, x)
    x = m.head("encoder.", m.middle("encoder.", x))
    out = m.conv("conv1", x)  # (T, 2z, h, w): mean then log-variance
    t, c2, h, w = out.shape
    return g.cont(g.view(out, (t, cfg.z, h, w), (c2 * h * w * 4, h * w * 4, w * 4, 4), 0))
