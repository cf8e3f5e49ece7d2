"""The Wan 2.2 autoencoder (Wan 2.2 TI2V-5B's: 48 latent channels, 16x spatial, 4x temporal)
decoding a whole latent video, and encoding a whole video, as one ggml graph each, frames as
the graph's batch axis like :func:`sdplan.core.models.wan_vae.video_decode`.

Layout (``wan2.2_vae.safetensors``: the original Wan names; ``first_stage_model.`` or ``vae.``
in front are accepted): as Wan 2.1's (:mod:`sdplan.core.models.qwen_image_vae`: ``conv1``,
``conv2``, ``{encoder,decoder}.{conv1,middle,head}``, 5-D causal kernels, RMS-norm ``gamma``)
but the levels nest: ``decoder.upsamples.I.upsamples.J`` are level ``I``'s residual blocks
(``J`` below the resample's index) and its resample (``resample.1``, with a ``time_conv`` for a
temporal one), ``encoder.downsamples.I.downsamples.J`` alike. The decoder's last convolution
``decoder.head.2`` gives ``3 * p * p`` channels: 2x2 patches of the three colours (patch size
``p`` 2).

Decoder (diffusers ``AutoencoderKLWan`` with ``is_residual=True`` and ``patch_size`` 2: its
``WanResidualUpBlock``, ``DupUp3D`` and ``unpatchify``; Wan's ``vae2_2.py``;
stable-diffusion.cpp ``wan_vae.hpp``): ``conv2``, ``decoder.conv1`` and the middle block as
Wan 2.1's; each level runs its residual blocks and its resample (the resample convolution
keeps the width, unlike Wan 2.1's, which halves it), and adds a shortcut of the level's input
without weights (``DupUp3D``): every input channel repeated ``r = out * ft * 4 / in`` times, the
repeated channels read as ``(out, ft, 2, 2)`` and spread over ``ft`` frames and 2x2 pixels.
With the frames as the batch axis, output channel ``o`` at sub-frame ``a`` and pixel offset
``(b, c)`` takes input channel ``o * (in / out) + m // r`` with ``m = (a * 2 + b) * 2 + c``
(:func:`_dup_up`). The decoder runs one latent frame at a time and its first chunk drops the
first ``ft - 1`` sub-frames of the shortcut (``first_chunk``), so that, as the temporal
resample leaves the first frame single, both halves hold ``1 + 2 (T - 1)`` frames. After the
head, channel ``k = colour * 4 + pa * 2 + pb`` is pixel ``(2 h + pb, 2 w + pa)``
(:func:`_unpatchify`). ``T`` latent frames decode to ``1 + 4 (T - 1)`` frames.

Encoder (:func:`video_encode`; diffusers ``WanResidualDownBlock``, ``AvgDown3D``, ``patchify``
and ``_encode``): the video's 2x2 patches as 12 channels, ``encoder.conv1``, then per level its
residual blocks and its resample, plus a shortcut of the level's input without weights
(``AvgDown3D``: ``ft x 2 x 2`` neighbourhoods of every channel, ``ft`` 2 for a temporal level,
read as ``in * ft * 4`` channels whose consecutive groups of ``in * ft * 4 / out`` are
averaged; the last level's is the identity), the middle block, the head and ``conv1``; its first
``z`` channels are the mean (as sd-cli encodes, no sampling). diffusers encodes the first frame
alone and then 4 frames at a time with the causal cache; over the whole video that is: causal
convolutions as the decoder's, a temporal resample keeping frame 0 and turning frames
``2k - 1, 2k`` with the frame before into frame ``k`` (``time_conv``, 3 taps, stride 2, no
padding), and the shortcut's neighbourhoods in time ``(zero, 0), (1, 2), ...`` (one zero frame
in front).

Latent normalisation (the DiT's space): ``(z - mean) / std`` per channel with Wan 2.2's
published 48 statistics (:data:`LATENT_MEAN`, :data:`LATENT_STD`: the autoencoder's config of
``Wan2.2-TI2V-5B-Diffusers``; stable-diffusion.cpp's statistics of a 48-channel latent).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sdplan.core.models.base import ModelLayoutError, Weights
from sdplan.core.models.qwen_image_vae import PREFIXES
from sdplan.core.models.wan_vae import _tap, _Video
from sdplan.core.runtime import graph as gr

__all__ = ["Wan22VaeConfig", "Level", "wan22_vae_config", "is_wan22_vae", "video_decode", "video_encode",
           "encoder_levels", "LATENT_MEAN", "LATENT_STD", "MARKER"]

#: Wan 2.2's latent statistics per channel (``Wan2.2-TI2V-5B-Diffusers/vae/config.json``).
LATENT_MEAN = (-0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813,
               0.0891, 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108,
               -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313,
               -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944,
               0.3573, -0.0548, -0.1681, -0.0667)
LATENT_STD = (0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
              0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
              0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
              0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744)
#: A tensor only the Wan 2.2 layout has (the first residual block of the decoder's first level).
MARKER = "decoder.upsamples.0.upsamples.0.residual.0.gamma"


@dataclass(frozen=True)
class Level:
    """One decoder level: ``index`` (``I`` of ``decoder.upsamples.I``), its residual blocks'
    count ``blocks``, widths ``width_in`` / ``width_out``, ``up`` (a resample at index
    ``blocks``), ``temporal`` (that resample doubles the frames: a ``time_conv``)."""

    index: int
    blocks: int
    width_in: int
    width_out: int
    up: bool
    temporal: bool


@dataclass(frozen=True)
class Wan22VaeConfig:
    """The structure of a Wan 2.2 autoencoder (inferred by :func:`wan22_vae_config`).

    Attributes:
        prefix: in front of every name.
        z: latent channels (48).
        levels: the decoder's levels in order.
        patch: pixels per side of the head's patches (2).
        factor: image pixels per latent pixel (``patch * 2 ** resamples``: 16).
        temporal: the temporal resamples (2: 4x in time).
    """

    prefix: str
    z: int
    levels: tuple[Level, ...]
    patch: int
    factor: int
    temporal: int


def is_wan22_vae(shapes: Mapping[str, Any]) -> bool:
    """Whether ``shapes`` (names to shapes or tensors) hold the Wan 2.2 autoencoder's nested
    levels (:data:`MARKER` under one of the prefixes)."""
    return any(p + MARKER in shapes for p in PREFIXES)


def wan22_vae_config(shapes: Mapping[str, tuple[int, ...]]) -> Wan22VaeConfig:
    """Infer a :class:`Wan22VaeConfig` from a file's ``shapes``.

    Raises:
        ModelLayoutError: no Wan 2.2 decoder (:data:`MARKER` missing under every prefix), a
            level without residual blocks, a head whose channels are not ``3 * p * p``, or a
            level whose width grows by a factor the shortcut cannot spread (``in`` not a
            multiple of ``out``).
    """
    prefix = next((p for p in PREFIXES if p + MARKER in shapes), None)
    if prefix is None:
        raise ModelLayoutError(f"no Wan 2.2 autoencoder decoder: {MARKER!r} missing")
    w = Weights(shapes, prefix)
    levels = []
    for i in w.indices("decoder.upsamples."):
        p = f"decoder.upsamples.{i}.upsamples."
        j = 0
        while f"{p}{j}.residual.0.gamma" in w:
            j += 1
        if j == 0:
            raise ModelLayoutError(f"Wan 2.2 autoencoder: {prefix}decoder.upsamples.{i} has no residual blocks")
        up = f"{p}{j}.resample.1.weight" in w
        width_in = int(w.shape(f"{p}0.residual.0.gamma")[0])
        width_out = int(w.shape(f"{p}{j - 1}.residual.6.weight")[0])
        if up and width_in % width_out:
            raise ModelLayoutError(f"Wan 2.2 autoencoder: level {i} goes from width {width_in} to {width_out}, "
                                   "not a whole fraction")
        levels.append(Level(i, j, width_in, width_out, up, up and f"{p}{j}.time_conv.weight" in w))
    head = int(w.shape("decoder.head.2.weight")[0])
    patch = int(round((head / 3) ** 0.5))
    if 3 * patch * patch != head:
        raise ModelLayoutError(f"Wan 2.2 autoencoder: decoder.head.2 gives {head} channels, not 3 colours in "
                               "square patches")
    z = int(w.shape("conv2.weight")[0])
    ups = sum(lv.up for lv in levels)
    return Wan22VaeConfig(prefix, z, tuple(levels), patch, patch * 2 ** ups, sum(lv.temporal for lv in levels))


def _interleave(g: Any, pieces: list[list[Any]]) -> Any:
    """``(N, C, H * s, W * s)`` from ``pieces[b][c]`` ``(N, C, H, W)`` (``s = len(pieces)``):
    piece ``(b, c)`` lands on the pixels ``(h * s + b, w * s + c)``."""
    n, ch, h, w = pieces[0][0].shape
    s = len(pieces)
    rows = []
    for row in pieces:
        cols = [g.reshape(g.cont(p), (n * ch, h, w, 1)) for p in row]
        x = cols[0]
        for p in cols[1:]:
            x = g.concat(x, p, 3)  # (N C, H, W, s): the column offset innermost
        rows.append(g.reshape(x, (n * ch, h, 1, w * s)))
    x = rows[0]
    for r in rows[1:]:
        x = g.concat(x, r, 2)  # (N C, H, s, W s): the row offset under the row
    return g.reshape(x, (n, ch, h * s, w * s))


def _channels(g: Any, x: Any, count: int, step: int, first: int) -> Any:
    """Channels ``first, first + step, ...`` (``count`` of them) of contiguous f32 ``x``
    ``(N, C, H, W)``, a strided view."""
    n, c, h, w = x.shape
    return g.view(x, (n, count, h, w), (c * h * w * 4, step * h * w * 4, w * 4, 4), first * h * w * 4)


def _dup_up(g: Any, x: Any, width_out: int, ft: int, fs: int = 2) -> Any:
    """``DupUp3D`` over a whole video ``(T, in, H, W)`` (contiguous f32): ``(T ft - (ft - 1), out,
    H fs, W fs)``, the first ``ft - 1`` sub-frames dropped as the first chunk drops them
    (module docstring)."""
    t, cin, h, w = x.shape
    step = cin // width_out
    r = width_out * ft * fs * fs // cin
    frames = []
    for a in range(ft):
        pieces = [[_channels(g, x, width_out, step, ((a * fs + b) * fs + c) // r) for c in range(fs)]
                  for b in range(fs)]
        frames.append(g.reshape(_interleave(g, pieces), (t, 1, width_out * h * fs * w * fs)))
    y = frames[0]
    for f in frames[1:]:
        y = g.concat(y, f, 1)  # (T, ft, out H W fs fs): each frame's sub-frames in order
    y = g.reshape(y, (t * ft, width_out, h * fs, w * fs))
    if ft == 1:
        return y
    size = width_out * h * fs * w * fs * 4
    v = g.view(y, (t * ft - (ft - 1), width_out, h * fs, w * fs),
               (size, h * fs * w * fs * 4, w * fs * 4, 4), (ft - 1) * size)
    return g.cont(v)


def _unpatchify(g: Any, x: Any, patch: int) -> Any:
    """``(F, 3, H p, W p)`` from the head's ``(F, 3 p p, H, W)``: channel ``colour * p * p +
    pa * p + pb`` is pixel ``(h p + pb, w p + pa)`` (diffusers ``unpatchify``)."""
    if patch == 1:
        return x
    pieces = [[_channels(g, x, 3, patch * patch, pa * patch + pb) for pa in range(patch)] for pb in range(patch)]
    return _interleave(g, pieces)


def video_decode(g: Any, weights: Mapping[str, Any], z: Any, cfg: Wan22VaeConfig,
                 shapes: Mapping[str, tuple[int, ...]]) -> Any:
    """Decode a latent video of the autoencoder's own space (``latent * std + mean`` of the
    DiT's) with the Wan 2.2 decoder.

    Args:
        weights: the autoencoder's tensors in
            :func:`~sdplan.core.models.qwen_image_vae.folded_shape` shapes.
        z: f32 ``(T, z, h, w)``: the latent frames as the batch axis.
        cfg: :func:`wan22_vae_config` of the file.
        shapes: the file's shapes (5-D kernels say how many temporal taps they fold).

    Returns:
        f32 ``(1 + 4 (T - 1), 3, h * factor, w * factor)`` in about [-1, 1] (unclamped).
    """
    m = _Video(g, Weights(weights, cfg.prefix), shapes)
    x = m.conv("conv2", z)
    x = m.conv("decoder.conv1", x)
    x = m.middle("decoder.", x)
    for lv in cfg.levels:
        p = f"decoder.upsamples.{lv.index}.upsamples."
        skip = x
        for j in range(lv.blocks):
            x = m.residual(f"{p}{j}.", x)
        if not lv.up:
            continue
        r = f"{p}{lv.blocks}."
        if lv.temporal:
            x = m.time_upsample(r, x)
        x = m.conv(r + "resample.1", g.upscale(x, 2), padding=1)
        x = g.add(x, _dup_up(g, g.cont(skip), lv.width_out, 2 if lv.temporal else 1))
    return _unpatchify(g, m.head("decoder.", x), cfg.patch)


def encoder_levels(shapes: Mapping[str, tuple[int, ...]], prefix: str = "") -> tuple[Level, ...]:
    """The encoder's levels (``encoder.downsamples.I.downsamples.J``) as :class:`Level`
    (``up`` and ``temporal`` say a downsampling resample and a ``time_conv``); empty without
    an encoder.

    Raises:
        ModelLayoutError: a level without residual blocks, or widths the shortcut cannot
            average (``in * ft * 4`` not a multiple of ``out``, or groups that straddle a
            channel).
    """
    w = Weights(shapes, prefix)
    out = []
    for i in w.indices("encoder.downsamples."):
        p = f"encoder.downsamples.{i}.downsamples."
        j = 0
        while f"{p}{j}.residual.0.gamma" in w:
            j += 1
        if j == 0:
            raise ModelLayoutError(f"Wan 2.2 autoencoder: {prefix}encoder.downsamples.{i} has no residual blocks")
        down = f"{p}{j}.resample.1.weight" in w
        temporal = down and f"{p}{j}.time_conv.weight" in w
        width_in = int(w.shape(f"{p}0.residual.0.gamma")[0])
        width_out = int(w.shape(f"{p}{j - 1}.residual.6.weight")[0])
        factor = (2 if temporal else 1) * (4 if down else 1)
        group = width_in * factor // width_out if width_in * factor % width_out == 0 else 0
        if not group or factor % group:
            raise ModelLayoutError(f"Wan 2.2 autoencoder: encoder level {i} from width {width_in} to {width_out} "
                                   "has no whole averaging groups")
        out.append(Level(i, j, width_in, width_out, down, temporal))
    return tuple(out)


def _sub(g: Any, x: Any, ft: int, fs: int) -> list[list[list[Any]]]:
    """The ``ft x fs x fs`` sub-grids of contiguous f32 ``x`` ``(T, C, H, W)`` (``T`` a multiple
    of ``ft``, ``H`` and ``W`` of ``fs``): ``[a][b][c]`` ``(T / ft, C, H / fs, W / fs)`` holds
    ``x[t ft + a, :, h fs + b, w fs + c]``. The column offset is moved outermost first (a
    permutation), so that every sub-grid is a view with unit inner stride."""
    t, ch, h, w = x.shape
    wq = w // fs
    cols = g.cont(g.permute(g.reshape(x, (t * ch * h * wq, fs)), (1, 0)))  # (fs, T C H W/fs)
    plane = t * ch * h * wq
    return [[[g.view(cols, (t // ft, ch, h // fs, wq), (ft * ch * h * wq * 4, h * wq * 4, fs * wq * 4, 4),
                     (c * plane + a * ch * h * wq + b * wq) * 4) for c in range(fs)] for b in range(fs)]
            for a in range(ft)]


def _stack_channels(g: Any, parts: list[Any]) -> Any:
    """``(T, C * n, H, W)`` whose channel ``c * n + q`` is channel ``c`` of ``parts[q]`` (each
    ``(T, C, H, W)``)."""
    t, ch, h, w = parts[0].shape
    xs = [g.reshape(g.cont(p), (t, ch, 1, h * w)) for p in parts]
    y = xs[0]
    for p in xs[1:]:
        y = g.concat(y, p, 2)
    return g.reshape(y, (t, ch * len(parts), h, w))


def _patchify(g: Any, x: Any, patch: int) -> Any:
    """``(T, 3 p p, H / p, W / p)`` of a video ``(T, 3, H, W)``: channel ``colour * p * p + pa * p
    + pb`` is pixel ``(h p + pb, w p + pa)`` (diffusers ``patchify``)."""
    if patch == 1:
        return x
    sub = _sub(g, x, 1, patch)[0]
    return _stack_channels(g, [sub[pb][pa] for pa in range(patch) for pb in range(patch)])


def _avg_down(g: Any, x: Any, width_out: int, ft: int, fs: int) -> Any:
    """``AvgDown3D`` over a whole video ``(T, in, H, W)`` with one zero frame in front when
    ``ft`` is 2 (module docstring): ``(ceil(T / ft), out, H / fs, W / fs)``."""
    t, cin, h, w = x.shape
    factor = ft * fs * fs
    if factor == 1:
        return x
    group = cin * factor // width_out
    if ft > 1 and t % ft:
        x = g.pad(x, [(ft - t % ft, 0), (0, 0), (0, 0), (0, 0)])
    sub = _sub(g, g.cont(x), ft, fs)
    flat = [sub[a][b][c] for a in range(ft) for b in range(fs) for c in range(fs)]  # by m = (a fs + b) fs + c
    means = []
    for q in range(factor // group):
        acc = g.cont(flat[q * group])
        for m in range(q * group + 1, (q + 1) * group):
            acc = g.add(acc, flat[m])
        means.append(g.scale(acc, 1.0 / group))
    return _stack_channels(g, means)


def _time_down(m: _Video, name: str, x: Any) -> Any:
    """``downsample3d``'s temporal half over a whole video ``(T, C, H, W)``: frame 0 as it is,
    frame ``k >= 1`` the 3-tap ``time_conv`` of frames ``2k - 2, 2k - 1, 2k`` (module docstring)."""
    g = m.g
    t, c, h, w = x.shape
    k_out = (t - 1) // 2
    if k_out == 0:
        return g.view(x, (1, c, h, w), (c * h * w * 4, h * w * 4, w * 4, 4), 0)
    kernel = m.w[name + ".weight"]
    full = m.shapes.get(m.w.prefix + name + ".weight") if m.shapes else None
    taps = int(full[2]) if full is not None and len(full) == 5 else 1
    frame = c * h * w * 4
    y = None
    for j in range(taps):
        xs = g.view(x, (k_out, c, h, w), (2 * frame, h * w * 4, w * 4, 4), j * frame)
        o = gr.conv2d(g, g.cont(xs), _tap(g, kernel, taps, j), m.w[name + ".bias"] if j == taps - 1 else None,
                      stride=1, padding=0)
        y = o if y is None else g.add(y, o)
    first = g.cont(g.view(x, (1, c, h, w), (frame, h * w * 4, w * 4, 4), 0))
    return g.concat(first, y, 0)


def video_encode(g: Any, weights: Mapping[str, Any], video: Any, cfg: Wan22VaeConfig,
                 shapes: Mapping[str, tuple[int, ...]]) -> Any:
    """The mean of the Wan 2.2 autoencoder's latent of a video (sd-cli's encode: no sampling).

    Args:
        weights: the autoencoder's tensors in
            :func:`~sdplan.core.models.qwen_image_vae.folded_shape` shapes.
        video: f32 ``(F, 3, H, W)`` in [-1, 1]: ``F = 1 + 4 k`` frames as the batch axis, sides
            multiples of ``cfg.factor``.
        cfg: :func:`wan22_vae_config` of the file (its encoder read by :func:`encoder_levels`).
        shapes: the file's shapes.

    Returns:
        f32 ``(1 + (F - 1) / 4, z, H / factor, W / factor)`` in the autoencoder's own space.

    Raises:
        ModelLayoutError: a file without an encoder.
    """
    levels = encoder_levels(shapes, cfg.prefix)
    if not levels:
        raise ModelLayoutError("Wan 2.2 autoencoder: the file has no encoder (encoder.downsamples)")
    m = _Video(g, Weights(weights, cfg.prefix), shapes)
    x = m.conv("encoder.conv1", _patchify(g, video, cfg.patch))
    for lv in levels:
        p = f"encoder.downsamples.{lv.index}.downsamples."
        skip = g.cont(x)
        for j in range(lv.blocks):
            x = m.residual(f"{p}{j}.", x)
        if lv.up:
            r = f"{p}{lv.blocks}."
            x = m.conv(r + "resample.1", g.pad(x, [(0, 0), (0, 0), (0, 1), (0, 1)]), stride=2, padding=0)
            if lv.temporal:
                x = _time_down(m, r + "time_conv", g.cont(x))
        x = g.add(x, _avg_down(g, skip, lv.width_out, 2 if lv.temporal else 1, 2 if lv.up else 1))
    out = m.conv("conv1", m.head("encoder.", m.middle("encoder.", x)))  # (T, 2z, h, w): mean, log-variance
    t, c2, h, w = out.shape
    return g.cont(g.view(out, (t, cfg.z, h, w), (c2 * h * w * 4, h * w * 4, w * 4, 4), 0))
