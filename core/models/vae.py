"""AutoencoderKL (the SD 1.x / 2.x VAE) in the original layout, with tiled decoding.

Names under ``first_stage_model.`` (Rombach et al. 2022): ``encoder.{conv_in, down.I.block.J,
down.I.downsample.conv, mid.{block_1, attn_1, block_2}, norm_out, conv_out}``, ``quant_conv``,
``post_quant_conv`` and ``decoder.{conv_in, mid..., up.I.block.J, up.I.upsample.conv, norm_out,
conv_out}``. ResNet blocks are ``norm1, conv1, norm2, conv2`` and ``nin_shortcut`` (or
``conv_shortcut``) when the width changes; the mid attention is single-head with 1x1 convs
``q, k, v, proj_out``. The decoder runs ``up.I`` from the last level down to 0; level I > 0
ends with a nearest 2x upsample and a 3x3 conv. The encoder's stride-2 downsample pads the
right and bottom edges by one pixel first. The FLUX.2 autoencoder's BFL file keeps its 1x1
quant convs inside the halves (``encoder.quant_conv``, ``decoder.post_quant_conv``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from sdplan.core.models.base import ModelLayoutError, Weights, WholeGraph
from sdplan.core.runtime import graph as gr

__all__ = ["VaeConfig", "VaeGraph", "PREFIX", "vae_config", "vae_decode", "vae_encode", "vae_moments",
           "tiled_decode", "SCALE_FACTOR", "SDXL_SCALE_FACTOR", "SDXL_CONV_SCALE"]

Tensor = Any
PREFIX = "first_stage_model."
#: SD 1.x / 2.x latent scale (latent = mean * 0.18215).
SCALE_FACTOR = 0.18215
#: SDXL latent scale (``scale_factor: 0.13025`` in Stability's ``sd_xl_base.yaml``).
SDXL_SCALE_FACTOR = 0.13025
#: sd-cli's input scale around every VAE convolution of SDXL's own VAE (``1/32``): the
#: original SDXL VAE overflows f16 activations, so each conv computes ``conv(x * s) / s``
#: plus its bias (``ggml_ext_conv_2d``'s ``scale``). Exact in f32; it matters on backends
#: that compute convolutions in f16.
SDXL_CONV_SCALE = 1.0 / 32.0
_GROUPS = 32
_EPS = 1e-6


@dataclass(frozen=True)
class VaeConfig:
    """VAE hyper-parameters inferred from shapes: prefix, latent channels, per-level widths
    (``channels[i]`` = width of level i), ResNet blocks per level in the decoder and the
    encoder, image channels."""

    prefix: str
    latent_channels: int
    channels: tuple[int, ...]
    decoder_blocks: int
    encoder_blocks: int
    image_channels: int

    @property
    def factor(self) -> int:
        """Pixels per latent pixel along each axis (8 for SD)."""
        return 2 ** (len(self.channels) - 1)


def vae_config(weights: Mapping[str, Any], prefix: str = PREFIX) -> VaeConfig:
    """Infer a :class:`VaeConfig` from ``weights`` (tensors or shape tuples); decoder or
    encoder may be absent but not both.

    Raises:
        ModelLayoutError: neither ``decoder.conv_in`` nor ``encoder.conv_in`` present.
    """
    w = Weights(weights, prefix)
    if "decoder.conv_in.weight" in w:
        levels = w.indices("decoder.up.")
        chans = tuple(w.shape(f"decoder.up.{i}.block.0.conv2.weight")[0] for i in levels)
        z = w.shape("decoder.conv_in.weight")[1]
        img = w.shape("decoder.conv_out.weight")[0]
        dec = len(w.indices("decoder.up.0.block."))
    elif "encoder.conv_in.weight" in w:
        levels = w.indices("encoder.down.")
        chans = tuple(w.shape(f"encoder.down.{i}.block.0.conv2.weight")[0] for i in levels)
        z = w.shape("encoder.conv_out.weight")[0] // 2
        img = w.shape("encoder.conv_in.weight")[1]
        dec = 0
    else:
        raise ModelLayoutError(f"no VAE under {prefix!r}: decoder.conv_in/encoder.conv_in missing")
    enc = len(w.indices("encoder.down.0.block.")) if "encoder.conv_in.weight" in w else 0
    return VaeConfig(prefix, z, chans, dec, enc, img)


def _resnet(g: Any, w: Weights, x: Tensor) -> Tensor:
    h = gr.group_norm(g, x, _GROUPS, w["norm1.weight"], w["norm1.bias"], _EPS, silu=True)
    h = gr.conv2d(g, h, w["conv1.weight"], w["conv1.bias"], padding=1)
    h = gr.group_norm(g, h, _GROUPS, w["norm2.weight"], w["norm2.bias"], _EPS, silu=True)
    h = gr.conv2d(g, h, w["conv2.weight"], w["conv2.bias"], padding=1)
    for name in ("nin_shortcut", "conv_shortcut"):
        if f"{name}.weight" in w:
            x = gr.conv2d(g, x, w[f"{name}.weight"], w[f"{name}.bias"])
    return g.add(x, h)


def _attn(g: Any, w: Weights, x: Tensor) -> Tensor:
    n, c, hh, ww = x.shape
    h = gr.group_norm(g, x, _GROUPS, w["norm.weight"], w["norm.bias"], _EPS)

    def tokens(name: str) -> Tensor:  # (N, 1, HW, C)
        t = gr.conv2d(g, h, w[f"{name}.weight"], w[f"{name}.bias"])
        t = g.cont(g.permute(g.reshape(t, (n, c, hh * ww)), (0, 2, 1)))
        return g.reshape(t, (n, 1, hh * ww, c))

    o = gr.attention(g, tokens("q"), tokens("k"), tokens("v"))  # (N, HW, C)
    o = g.reshape(g.cont(g.permute(o, (0, 2, 1))), (n, c, hh, ww))
    return g.add(x, gr.conv2d(g, o, w["proj_out.weight"], w["proj_out.bias"]))


def _mid(g: Any, w: Weights, h: Tensor) -> Tensor:
    h = _resnet(g, w.sub("mid.block_1."), h)
    h = _attn(g, w.sub("mid.attn_1."), h)
    return _resnet(g, w.sub("mid.block_2."), h)


def vae_decode(g: Any, weights: Mapping[str, Any], z: Tensor, cfg: VaeConfig | None = None) -> Tensor:
    """Decode latents (already divided by the scale factor) to images.

    Args:
        z: f32 ``(N, latent_channels, h, w)``.

    Returns:
        f32 ``(N, 3, h*8, w*8)`` in about [-1, 1] (unclamped).
    """
    cfg = cfg or vae_config(weights)
    w = Weights(weights, cfg.prefix)
    for pq in ("post_quant_conv.", "decoder.post_quant_conv."):  # LDM / BFL FLUX.2 names
        if pq + "weight" in w:
            z = gr.conv2d(g, z, w[pq + "weight"], w[pq + "bias"])
    d = w.sub("decoder.")
    h = gr.conv2d(g, z, d["conv_in.weight"], d["conv_in.bias"], padding=1)
    h = _mid(g, d, h)
    for i in reversed(d.indices("up.")):
        for j in d.indices(f"up.{i}.block."):
            h = _resnet(g, d.sub(f"up.{i}.block.{j}."), h)
        if f"up.{i}.upsample.conv.weight" in d:
            h = gr.conv2d(g, g.upscale(h, 2), d[f"up.{i}.upsample.conv.weight"],
                          d[f"up.{i}.upsample.conv.bias"], padding=1)
    h = gr.group_norm(g, h, _GROUPS, d["norm_out.weight"], d["norm_out.bias"], _EPS, silu=True)
    return gr.conv2d(g, h, d["conv_out.weight"], d["conv_out.bias"], padding=1)


def vae_encode(g: Any, weights: Mapping[str, Any], img: Tensor, cfg: VaeConfig | None = None) -> Tensor:
    """Encode images to the latent distribution's mean (not yet times the scale factor).

    Args:
        img: f32 ``(N, 3, H, W)`` in [-1, 1], H and W divisible by the factor (8).

    Returns:
        f32 ``(N, latent_channels, H/8, W/8)``.

    Raises:
        ValueError: H or W not divisible by the factor.
    """
    return vae_moments(g, weights, img, cfg)[0]


def vae_moments(g: Any, weights: Mapping[str, Any], img: Tensor,
                cfg: VaeConfig | None = None) -> tuple[Tensor, Tensor]:
    """``(mean, logvar)`` of the latent distribution of images (as :func:`vae_encode`;
    logvar unclamped), each f32 ``(N, latent_channels, H/8, W/8)``."""
    cfg = cfg or vae_config(weights)
    if img.shape[-1] % cfg.factor or img.shape[-2] % cfg.factor:
        raise ValueError(f"vae_encode: image {img.shape[-2]}x{img.shape[-1]} is not divisible "
                         f"by {cfg.factor}")
    w = Weights(weights, cfg.prefix)
    e = w.sub("encoder.")
    h = gr.conv2d(g, img, e["conv_in.weight"], e["conv_in.bias"], padding=1)
    for i in e.indices("down."):
        for j in e.indices(f"down.{i}.block."):
            h = _resnet(g, e.sub(f"down.{i}.block.{j}."), h)
        if f"down.{i}.downsample.conv.weight" in e:
            h = g.pad(h, [(0, 0), (0, 0), (0, 1), (0, 1)])
            h = gr.conv2d(g, h, e[f"down.{i}.downsample.conv.weight"],
                          e[f"down.{i}.downsample.conv.bias"], stride=2)
    h = _mid(g, e, h)
    h = gr.group_norm(g, h, _GROUPS, e["norm_out.weight"], e["norm_out.bias"], _EPS, silu=True)
    h = gr.conv2d(g, h, e["conv_out.weight"], e["conv_out.bias"], padding=1)
    for q in ("quant_conv.", "encoder.quant_conv."):  # LDM / BFL FLUX.2 names
        if q + "weight" in w:
            h = gr.conv2d(g, h, w[q + "weight"], w[q + "bias"])
    n, c2, hh, ww = h.shape
    zc = c2 // 2
    st = (c2 * hh * ww * 4, hh * ww * 4, ww * 4, 4)
    return (g.cont(g.view(h, (n, zc, hh, ww), st, 0)),
            g.cont(g.view(h, (n, zc, hh, ww), st, zc * hh * ww * 4)))


class VaeGraph(WholeGraph):
    """The VAE as an engine module graph (:class:`sdplan.core.models.ModuleGraph`): whole,
    no blocks. Input ``z`` f32 ``(N, C, h, w)`` (already divided by the scale factor) gives
    output ``image`` ``(N, 3, 8h, 8w)``; input ``image`` f32 ``(N, 3, H, W)`` in [-1, 1]
    gives ``mean`` and ``logvar`` ``(N, C, H/8, W/8)``. ``names``: checkpoint name -> store name.
    ``conv_scale`` != 1 computes every convolution as ``conv(x * s) / s + bias``
    (:data:`SDXL_CONV_SCALE`, sd-cli's ``--force-sdxl-vae-conv-scale``).
    """

    #: The CPU bf16 kernels (sdplan._ggml.bf16_kernel()) with which this module's products with
    #: f16/bf16 weights run in bf16 (ModuleRunner; AMX converts the weights as they load): measured by bench/bench_cpu_bf16.py (1 thread,
    #: medians of 3 interleaved processes), a 256 px decode took 0.27x the f16/Winograd
    #: path's time with AMX but 1.63x with AVX512_BF16 alone on a Xeon and 1.6x on a Zen 4
    #: EPYC since the Winograd convolution's AVX-512 build (2.2 s against 1.3-1.4 s, profiled).
    #: Accuracy: tests/test_bf16_models.py.
    cpu_bf16_kernels: tuple[str, ...] = ("amx",)

    def __init__(self, cfg: VaeConfig, names: Mapping[str, str], conv_scale: float = 1.0) -> None:
        self.cfg, self.names, self.conv_scale = cfg, dict(names), conv_scale

    def other_tensors(self) -> list[str]:
        return list(self.names.values())

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        """``z`` or ``image`` (exactly one, 4-D) as f32; ValueError otherwise."""
        if len(shapes) != 1 or next(iter(shapes)) not in ("z", "image") or len(next(iter(shapes.values()))) != 4:
            raise ValueError(f"VAE input must be one 4-D 'z' or 'image', got {shapes}")
        return {k: (tuple(v), "f32") for k, v in shapes.items()}

    def build(self, g: Any, w: Any, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        view = Weights(w, names=self.names)
        if self.conv_scale != 1.0:
            g = _ConvScaled(g, self.conv_scale)
        if "z" in inputs:
            return {"image": vae_decode(g, view, inputs["z"], self.cfg)}
        mean, logvar = vae_moments(g, view, inputs["image"], self.cfg)
        return {"mean": mean, "logvar": logvar}


class _ConvScaled:
    """A graph whose ``conv_2d`` computes ``conv(x * s) / s`` and then adds the bias, as
    sd-cli's ``ggml_ext_conv_2d`` with ``scale``; every other op is the graph's own."""

    def __init__(self, g: Any, scale: float) -> None:
        self._g, self._s = g, scale

    def __getattr__(self, name: str) -> Any:
        return getattr(self._g, name)

    def conv_2d(self, w: Tensor, x: Tensor, *args: Any, bias: Tensor | None = None) -> Tensor:
        g = self._g
        y = g.scale(g.conv_2d(w, g.scale(x, self._s), *args), 1.0 / self._s)
        return g.add(y, g.reshape(bias, (bias.shape[0], 1, 1))) if bias is not None else y


def _starts(size: int, tile: int, overlap: int) -> list[int]:
    if size <= tile:
        return [0]
    n = math.ceil((size - overlap) / (tile - overlap))
    return [round(i * (size - tile) / (n - 1)) for i in range(n)]


def _ramp(length: int, lo_overlap: int, hi_overlap: int) -> np.ndarray:
    r = np.ones(length, np.float32)
    if lo_overlap:
        r[:lo_overlap] = (np.arange(lo_overlap, dtype=np.float32) + 0.5) / lo_overlap
    if hi_overlap:
        r[length - hi_overlap:] = np.minimum(
            r[length - hi_overlap:], (np.arange(hi_overlap, 0, -1, dtype=np.float32) - 0.5) / hi_overlap)
    return r


def tiled_decode(decode: Callable[[np.ndarray], np.ndarray], z: np.ndarray, tile: int = 32,
                 overlap: int = 8, factor: int = 8) -> np.ndarray:
    """Decode ``z`` ``(N, C, h, w)`` in overlapping latent tiles of ``tile`` x ``tile`` and blend.

    ``decode(tile_latent) -> image`` decodes one ``(N, C, th, tw)`` tile (every tile has the
    same shape, so one graph serves all); overlapping pixels are blended with linear ramps
    over the overlap (weights normalised to sum to 1). Returns ``(N, 3, h*factor, w*factor)``
    float32. A latent no larger than ``tile`` is decoded whole.

    Raises:
        ValueError: ``overlap`` not in ``0..tile-1``.
    """
    if not 0 <= overlap < tile:
        raise ValueError(f"tiled_decode: overlap {overlap} must be in 0..{tile - 1}")
    n, _, h, w = z.shape
    th, tw = min(tile, h), min(tile, w)
    ys, xs = _starts(h, th, overlap), _starts(w, tw, overlap)
    out = acc = None
    for y0 in ys:
        for x0 in xs:
            img = decode(np.ascontiguousarray(z[:, :, y0:y0 + th, x0:x0 + tw]))
            if out is None:
                out = np.zeros((n, img.shape[1], h * factor, w * factor), np.float32)
                acc = np.zeros((h * factor, w * factor), np.float32)
            lo_y = (ys[ys.index(y0) - 1] + th - y0) * factor if y0 != ys[0] else 0
            hi_y = (y0 + th - ys[ys.index(y0) + 1]) * factor if y0 != ys[-1] else 0
            lo_x = (xs[xs.index(x0) - 1] + tw - x0) * factor if x0 != xs[0] else 0
            hi_x = (x0 + tw - xs[xs.index(x0) + 1]) * factor if x0 != xs[-1] else 0
            wgt = np.outer(_ramp(th * factor, lo_y, hi_y), _ramp(tw * factor, lo_x, hi_x))
            sl = (slice(y0 * factor, (y0 + th) * factor), slice(x0 * factor, (x0 + tw) * factor))
            assert out is not None and acc is not None
            out[:, :, sl[0], sl[1]] += img * wgt
            acc[sl] += wgt
    assert out is not None and acc is not None
    return out / acc
