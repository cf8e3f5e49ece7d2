"""ESRGAN-family upscalers as ggml graphs: SRVGGNetCompact and RRDBNet, plus tiling.

**SRVGGNetCompact** (the Real-ESRGAN compact family, ``body.N`` names): ``body.0`` conv
in->F (3x3, padding 1), ``body.1`` PReLU (F slopes), then ``n_conv`` times a conv F->F and
a PReLU, then a last conv F->out*s*s; pixel shuffle by ``s``, plus the input upsampled by
``s`` (nearest). F, ``n_conv`` and ``s`` come from the shapes.

**RRDBNet** (ESRGAN, RealESRGAN_x4plus; ``conv_first``/``body.N.rdbK.convJ``/``conv_body``/
``conv_up1``.../``conv_hr``/``conv_last`` names, or the original ``model.N`` names which
:func:`canonical_rrdb_names` maps onto them): conv_first, ``n_blocks`` RRDBs (three
residual dense blocks of five convs with growth G, each scaled by 0.2 into its residual),
conv_body added to the trunk, then per factor 2 a nearest 2x upsample and a conv with
LeakyReLU(0.2), conv_hr with LeakyReLU, conv_last. Inputs of 3*k*k channels mean the image
is pixel-unshuffled by k first (RealESRGAN x2plus: k=2, net scale 4 -> total scale 2).

Architectures as published with ESRGAN/Real-ESRGAN (xinntao, BSD-3-Clause).

**Tiling**: :func:`tile_grid` cuts an image into tiles whose padded regions all have one
size (so one graph serves all), with ``overlap`` pixels of context on every inner side;
each tile's output is cropped to its core. With ``overlap`` at least the receptive radius
(``receptive_radius``; 18 for the x4 compact network) tiled and whole results are equal up
to float rounding, so no seams appear.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sdplan.core.errors import ModelFileError
from sdplan.core.models.base import Weights, WholeGraph
from sdplan.core.runtime import graph as gr

__all__ = ["EsrganConfig", "detect_esrgan", "canonical_rrdb_names", "esrgan_forward",
           "tile_grid", "Tile", "UpscalerGraph"]

Tensor = Any
Graph = Any
LRELU = 0.2


@dataclass(frozen=True)
class EsrganConfig:
    """Hyper-parameters read from the weight shapes.

    Attributes:
        kind: ``"compact"`` or ``"rrdb"``.
        scale: output size / input size.
        in_channels, out_channels: image channels (3 for RGB).
        features: F, the trunk width.
        n_conv: compact: the inner F->F convs; rrdb: RRDB blocks.
        growth: rrdb: the dense growth channels G (0 for compact).
        unshuffle: rrdb: the input pixel-unshuffle factor (1 = none).
        n_up: rrdb: the 2x upsample stages.
        receptive_radius: input pixels of context a tile needs on each side for an exact
            result (compact: one per 3x3 conv; rrdb: capped at 64, the result is then
            very close but not exact).
    """

    kind: str
    scale: int
    in_channels: int
    out_channels: int
    features: int
    n_conv: int
    growth: int = 0
    unshuffle: int = 1
    n_up: int = 0
    receptive_radius: int = 0


_OLD_RDB = re.compile(r"^model\.1\.sub\.(\d+)\.RDB(\d)\.conv(\d)\.0\.(weight|bias)$")
_OLD_TOP = re.compile(r"^model\.(\d+)\.(weight|bias)$")


def canonical_rrdb_names(names: list[str]) -> dict[str, str]:
    """Map old ESRGAN names (``model.0``, ``model.1.sub.N.RDBk.convj.0``, ``model.1.sub.NB``,
    ``model.3``...) to the new ones (``conv_first``, ``body.N.rdbk.convj``, ``conv_body``,
    ``conv_up1``..., ``conv_hr``, ``conv_last``); returns ``{new: old}``. Names already new
    map to themselves; anything else is left out."""
    if not any(n.startswith("model.") for n in names):
        return {n: n for n in names}
    out: dict[str, str] = {}
    subs = [int(m.group(1)) for n in names if (m := re.match(r"^model\.1\.sub\.(\d+)\.weight$", n))]
    top = sorted({int(m.group(1)) for n in names if (m := _OLD_TOP.match(n))} - {0})
    for n in names:
        if m := _OLD_RDB.match(n):
            out[f"body.{m[1]}.rdb{m[2]}.conv{m[3]}.{m[4]}"] = n
        elif subs and (m := re.match(rf"^model\.1\.sub\.{max(subs)}\.(weight|bias)$", n)):
            out[f"conv_body.{m[1]}"] = n
        elif m := _OLD_TOP.match(n):
            i = int(m[1])
            if i == 0:
                new = "conv_first"
            elif i == top[-1]:
                new = "conv_last"
            elif i == top[-2]:
                new = "conv_hr"
            else:
                new = f"conv_up{top.index(i) + 1}"
            out[f"{new}.{m[2]}"] = n
    return out


def detect_esrgan(shapes: Mapping[str, tuple[int, ...]], source: str = "<weights>") -> EsrganConfig:
    """The :class:`EsrganConfig` of weights with these (canonical, see
    :func:`canonical_rrdb_names`) names and numpy-order shapes.

    Raises:
        ModelFileError: (naming ``source``) when the names fit neither layout or the shapes
            are inconsistent (a scale that is not an integer, missing PReLU slopes...).
    """
    if "body.0.weight" in shapes and "conv_first.weight" not in shapes:
        convs = sorted(int(m[1]) for n in shapes if (m := re.match(r"^body\.(\d+)\.weight$", n))
                       and len(shapes[n]) == 4)
        if convs != list(range(0, 2 * len(convs), 2)) or len(convs) < 2:
            raise ModelFileError(source, f"compact upscaler: convolutions at body.{convs}, "
                                 "expected body.0, body.2, ...")
        for i in convs[:-1]:
            if shapes.get(f"body.{i + 1}.weight", ()) != (shapes[f"body.{i}.weight"][0],):
                raise ModelFileError(source, f"compact upscaler: body.{i + 1}.weight should be "
                                     "the PReLU slopes of the conv before it")
        oc, feat, ic = shapes[f"body.{convs[-1]}.weight"][0], *shapes["body.0.weight"][:2]
        s = math.isqrt(oc // ic) if oc % ic == 0 else 0
        if s < 1 or s * s * ic != oc:
            raise ModelFileError(source, f"compact upscaler: last conv has {oc} channels, not "
                                 f"{ic}*scale^2")
        return EsrganConfig("compact", s, ic, ic, feat, len(convs) - 2,
                            receptive_radius=len(convs))
    if "conv_first.weight" in shapes:
        need = ["conv_body.weight", "conv_hr.weight", "conv_last.weight"]
        missing = [n for n in need if n not in shapes]
        if missing:
            raise ModelFileError(source, f"RRDB upscaler: missing {', '.join(missing)}")
        feat, cin = shapes["conv_first.weight"][:2]
        cout = shapes["conv_last.weight"][0]
        blocks = {int(m[1]) for n in shapes if (m := re.match(r"^body\.(\d+)\.rdb1\.conv1\.weight$", n))}
        if not blocks or blocks != set(range(len(blocks))):
            raise ModelFileError(source, "RRDB upscaler: blocks body.N.rdb1.conv1 missing or not 0..N-1")
        growth = shapes["body.0.rdb1.conv1.weight"][0]
        n_up = sum(1 for n in shapes if re.match(r"^conv_up\d+\.weight$", n))
        k = math.isqrt(cin // cout) if cin % cout == 0 else 0
        if k < 1 or k * k * cout != cin:
            raise ModelFileError(source, f"RRDB upscaler: {cin} input channels is not "
                                 f"{cout}*k^2 for an unshuffle factor k")
        scale = 2 ** n_up // k
        if scale * k != 2 ** n_up:
            raise ModelFileError(source, f"RRDB upscaler: unshuffle {k} does not divide 2^{n_up}")
        return EsrganConfig("rrdb", scale, cout, cout, feat, len(blocks), growth, k, n_up,
                            receptive_radius=64)
    raise ModelFileError(source, "not an ESRGAN upscaler: expected 'body.0.weight' (compact) or "
                         "'conv_first.weight' / 'model.0.weight' (RRDBNet)")


def _conv(g: Graph, w: Mapping[str, Tensor], name: str, x: Tensor) -> Tensor:
    wt = w[f"{name}.weight"]
    return gr.conv2d(g, x, wt, w.get(f"{name}.bias"), padding=wt.shape[-1] // 2)


def _compact(g: Graph, w: Mapping[str, Tensor], x: Tensor, cfg: EsrganConfig) -> Tensor:
    h = x
    for i in range(cfg.n_conv + 1):
        h = _conv(g, w, f"body.{2 * i}", h)
        slope = w[f"body.{2 * i + 1}.weight"]
        h = gr.prelu(g, h, g.reshape(slope, (slope.shape[0], 1, 1)))
    h = _conv(g, w, f"body.{2 * cfg.n_conv + 2}", h)
    return g.add(gr.pixel_shuffle(g, h, cfg.scale), g.upscale(x, cfg.scale))


def _pixel_unshuffle(g: Graph, x: Tensor, r: int) -> Tensor:
    """``(1, C, H*r, W*r)`` -> ``(1, C*r*r, H, W)`` like ``torch.nn.functional.pixel_unshuffle``."""
    _, c, hr, wr = x.shape
    h, w = hr // r, wr // r
    y = g.reshape(x, (c * h, r, w, r))                 # (c,h), i, w, j
    y = g.cont(g.permute(y, (0, 1, 3, 2)))             # (c,h), i, j, w
    y = g.reshape(y, (c, h, r * r, w))                 # c, h, (i,j), w
    y = g.cont(g.permute(y, (0, 2, 1, 3)))             # c, (i,j), h, w
    return g.reshape(y, (1, c * r * r, h, w))


def _lrelu(g: Graph, x: Tensor) -> Tensor:
    return g.leaky_relu(x, LRELU)


def _rdb(g: Graph, w: Mapping[str, Tensor], name: str, x: Tensor) -> Tensor:
    feats = x
    for j in range(1, 5):
        y = _lrelu(g, _conv(g, w, f"{name}.conv{j}", feats))
        feats = g.concat(feats, y, 1)
    y = _conv(g, w, f"{name}.conv5", feats)
    return g.add(g.scale(y, 0.2), x)


def _rrdb(g: Graph, w: Mapping[str, Tensor], x: Tensor, cfg: EsrganConfig) -> Tensor:
    if cfg.unshuffle > 1:
        x = _pixel_unshuffle(g, x, cfg.unshuffle)
    feat = _conv(g, w, "conv_first", x)
    h = feat
    for b in range(cfg.n_conv):
        y = h
        for k in (1, 2, 3):
            y = _rdb(g, w, f"body.{b}.rdb{k}", y)
        h = g.add(g.scale(y, 0.2), h)
    h = g.add(feat, _conv(g, w, "conv_body", h))
    for u in range(1, cfg.n_up + 1):
        h = _lrelu(g, _conv(g, w, f"conv_up{u}", g.upscale(h, 2)))
    return _conv(g, w, "conv_last", _lrelu(g, _conv(g, w, "conv_hr", h)))


def esrgan_forward(g: Graph, w: Mapping[str, Tensor], x: Tensor, cfg: EsrganConfig) -> Tensor:
    """Upscaler graph: ``x`` f32 ``(1, C, H, W)`` in [0, 1] -> ``(1, C, H*s, W*s)``
    (unclamped). ``w`` maps canonical names to tensors; for RRDB with unshuffle, H and W
    must be multiples of the unshuffle factor."""
    return _compact(g, w, x, cfg) if cfg.kind == "compact" else _rrdb(g, w, x, cfg)


@dataclass(frozen=True)
class Tile:
    """One tile: its padded input region ``[y0, y0+size_h) x [x0, x0+size_w)`` and the core
    ``[cy0, cy1) x [cx0, cx1)`` (absolute input pixels) whose output it contributes."""

    y0: int
    x0: int
    cy0: int
    cy1: int
    cx0: int
    cx1: int


def _axis(n: int, tile: int, overlap: int, align: int) -> tuple[int, list[tuple[int, int, int]]]:
    """Region size and ``(start, core0, core1)`` per tile along one axis of length ``n``."""
    size = -(-(tile + 2 * overlap + align - 1) // align) * align
    if size >= n:
        return n, [(0, 0, n)]
    out = []
    for c0 in range(0, n, tile):
        c1 = min(n, c0 + tile)
        start = min(max(c0 - overlap, 0), n - size)
        start -= start % align
        out.append((start, c0, c1))
    return size, out


def tile_grid(h: int, w: int, tile: int, overlap: int, align: int = 1) -> tuple[tuple[int, int], list[Tile]]:
    """Tiles covering an ``h`` x ``w`` image with cores of at most ``tile`` pixels and
    ``overlap`` pixels of context inside the image on every side (fewer only at the image
    border, where the network sees its usual zero padding). Every padded region has the
    returned ``(region_h, region_w)`` size; starts are multiples of ``align``.

    Raises ValueError when ``tile`` < 1 or ``overlap`` < 0.
    """
    if tile < 1 or overlap < 0:
        raise ValueError(f"tile_grid: tile must be >= 1 and overlap >= 0, got {tile}, {overlap}")
    rh, ys = _axis(h, tile, overlap, align)
    rw, xs = _axis(w, tile, overlap, align)
    return (rh, rw), [Tile(y0, x0, cy0, cy1, cx0, cx1) for (y0, cy0, cy1) in ys for (x0, cx0, cx1) in xs]


class UpscalerGraph(WholeGraph):
    """An ESRGAN network as an engine module graph (``sdplan.core.models.ModuleGraph``): no
    blocks; input ``"image"`` f32 ``(1, C, H, W)``, output ``"image"`` ``(1, C, sH, sW)``.
    ``names`` maps canonical weight names to the file's."""

    #: The CPU bf16 kernels with which the Upscaler holds the convolution kernels in bf16 (the
    #: files' f32 kernels rounded; everything else stays f32): measured by bench/bench_upscale.py
    #: (SRVGGNetCompact x4, a 256 px picture, 2 threads, best of 3, two runs each) 0.339-0.390 s
    #: against the f32 path's 0.578-0.663 s; output within 2.4e-2 of PyTorch fp32 there (1.1e-2,
    #: mean 7.2e-4, on tests/test_models_esrgan.py's picture). AVX512_BF16 alone: not listed (the
    #: SD VAE's convolutions measured slower with it than on their f32/f16 paths).
    cpu_bf16_kernels: tuple[str, ...] = ("amx",)

    def __init__(self, cfg: EsrganConfig, names: Mapping[str, str]) -> None:
        self.cfg, self.names = cfg, dict(names)

    def other_tensors(self) -> list[str]:
        return sorted(self.names.values())

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        """``{"image": (shape, "f32")}``; ValueError for another input or shape."""
        s = shapes.get("image")
        k = self.cfg.unshuffle
        if s is None or len(s) != 4 or s[0] != 1 or s[1] != self.cfg.in_channels or s[2] % k or s[3] % k:
            raise ValueError(f"upscaler: input 'image' must be (1, {self.cfg.in_channels}, H, W) with "
                             f"H, W multiples of {k}; got {shapes}")
        return {"image": (tuple(s), "f32")}

    def build(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"image": esrgan_forward(g, Weights(w, names=self.names), inputs["image"], self.cfg)}
