"""The TAE family of tiny autoencoders (TAESD, TAEF1/TAESD3, TAEF2) as ggml graphs.

A TAE is a flat sequence of layers whose weights are named by their index in that
sequence (``3.conv.0.weight``), optionally under a prefix (``decoder.``,
``decoder.layers.``, ``first_stage_model.encoder.layers.``...). Layer kinds:

* a plain 3x3 convolution (padding 1, bias optional; stride 2 when it downsamples),
* a *Block(c)*: three 3x3 convolutions with ReLU between them (``conv.0``, ``conv.2``,
  ``conv.4``), a skip (identity, or a bias-free 1x1 ``skip``), then ReLU of the sum;
  TAEF2 blocks may carry a *pool* branch added to their input first: 1x1 conv
  (``pool.0``, bias-free) to 4x channels, GroupNorm with 4 groups (``pool.1``), ReLU,
  1x1 conv back (``pool.3``, bias-free),
* weight-free layers (ReLU, nearest 2x upsample, ``tanh(x/3)*3``) implied by the gaps in
  the index sequence: the layout is fixed, the weights only tell the widths.

Encoder (image ``(1, 3, H, W)`` in [0, 1] -> latent ``(1, C, H/8, W/8)``): conv 3->64,
Block, then three times (stride-2 conv without bias, three Blocks), then conv 64->C.
Decoder (latent -> image ``(1, 3, 8H, 8W)``, about [0, 1], unclamped): ``tanh(x/3)*3``,
conv C->64, ReLU, three Blocks, then three times (nearest 2x, conv without bias, three
Blocks; the last time one), then conv 64->3. Layout as published with TAESD
(madebyollin/taesd, MIT) and described in ``shared/weights/README.md``.

The variant is chosen from tensor shapes and names only (:func:`detect_tae`): the latent
channels (4: TAESD, 16: TAEF1 or TAESD3, which share one layout, 32: TAEF2) and whether
pool branches exist.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sdplan.core.errors import ModelFileError
from sdplan.core.models.base import Weights, WholeGraph
from sdplan.core.runtime import graph as gr

__all__ = ["TaeLayout", "TaeGraph", "detect_tae", "split_tae", "tae_encode", "tae_decode", "VARIANTS"]

Tensor = Any
Graph = Any

#: latent channels -> variant name.
VARIANTS = {4: "taesd", 16: "taef1", 32: "taef2"}
#: GroupNorm of the pool branch: 4 groups, PyTorch's default eps.
POOL_GROUPS = 4
POOL_EPS = 1e-5

_INDEXED = re.compile(r"^(?P<prefix>(?:.*?\.)??)(?P<index>\d+)\.(?P<rest>(?:conv\.\d+\.|skip\.|pool\.\d+\.)?(?:weight|bias))$")


@dataclass(frozen=True)
class TaeLayout:
    """One half of a TAE as found in a file.

    Attributes:
        part: ``"encoder"`` or ``"decoder"``.
        prefix: the name prefix in the file (``""``, ``"decoder."``...), stripped by
            :func:`split_tae` so the model sees ``"<index>.<rest>"`` names.
        latent_channels: 4, 16 or 32 (any positive count is accepted).
        variant: ``taesd``, ``taef1`` (also TAESD3), ``taef2`` or ``tae<C>`` otherwise.
        pool_blocks: indices of blocks with a pool branch.
        width: feature channels (64 in every published TAE).
    """

    part: str
    prefix: str
    latent_channels: int
    variant: str
    pool_blocks: tuple[int, ...]
    width: int


def _groups(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, dict[int, set[str]]]:
    """prefix -> layer index -> set of weight suffixes."""
    out: dict[str, dict[int, set[str]]] = {}
    for name in shapes:
        m = _INDEXED.match(name)
        if m:
            out.setdefault(m["prefix"], {}).setdefault(int(m["index"]), set()).add(m["rest"])
    return out


def _layout(prefix: str, layers: dict[int, set[str]], shapes: Mapping[str, tuple[int, ...]],
            source: str) -> TaeLayout | None:
    """Classify one prefix's layers as encoder or decoder, or None when neither fits."""
    blocks = sorted(i for i, s in layers.items() if "conv.0.weight" in s)
    convs = sorted(i for i, s in layers.items() if "weight" in s)
    if len(blocks) < 4 or not convs:
        return None
    first = shapes[f"{prefix}{convs[0]}.weight"]
    last = shapes[f"{prefix}{convs[-1]}.weight"]
    if len(first) != 4 or len(last) != 4:
        return None
    pools = tuple(i for i in blocks if "pool.0.weight" in layers[i])
    if convs[0] == 0 and first[1] == 3:
        part, latent, width = "encoder", last[0], first[0]
    elif convs[0] == 1 and last[0] == 3:
        part, latent, width = "decoder", first[1], first[0]
    else:
        return None
    expected = _ENCODER_BLOCKS if part == "encoder" else _DECODER_BLOCKS
    if tuple(blocks) != expected:
        raise ModelFileError(source, f"TAE {part} ({prefix or 'no prefix'}): blocks at layers "
                             f"{blocks}, expected {list(expected)}")
    return TaeLayout(part, prefix, int(latent), VARIANTS.get(int(latent), f"tae{latent}"),
                     pools, int(width))


# Layer indices of the Blocks in the fixed layouts.
_ENCODER_BLOCKS = (1, 3, 4, 5, 7, 8, 9, 11, 12, 13)
_DECODER_BLOCKS = (3, 4, 5, 8, 9, 10, 13, 14, 15, 18)


def detect_tae(shapes: Mapping[str, tuple[int, ...]], source: str = "<weights>") -> dict[str, TaeLayout]:
    """Find TAE encoder and/or decoder layouts among tensor ``shapes`` (name -> numpy-order
    shape); returns ``{"encoder": ..., "decoder": ...}`` with the halves present.

    Raises:
        ModelFileError: (naming ``source``) when no half is recognised, a half's blocks are
            not where the layout puts them, or the halves disagree on latent channels.
    """
    found: dict[str, TaeLayout] = {}
    for prefix, layers in sorted(_groups(shapes).items()):
        lay = _layout(prefix, layers, shapes, source)
        if lay is None:
            continue
        if lay.part in found:
            raise ModelFileError(source, f"two TAE {lay.part}s: prefixes "
                                 f"'{found[lay.part].prefix}' and '{prefix}'")
        found[lay.part] = lay
    if not found:
        raise ModelFileError(source, "no TAE encoder or decoder found (expected indexed layers "
                             "such as '1.conv.0.weight', optionally under 'decoder.')")
    if len({x.latent_channels for x in found.values()}) > 1:
        raise ModelFileError(source, "TAE encoder and decoder disagree on latent channels")
    return found


def split_tae(weights: Mapping[str, Any], layout: TaeLayout) -> dict[str, Any]:
    """The entries of ``weights`` under ``layout.prefix``, with the prefix removed."""
    n = len(layout.prefix)
    return {k[n:]: v for k, v in weights.items() if k.startswith(layout.prefix) and _INDEXED.match(k)
            and k[n:].split(".", 1)[0].isdigit()}


def _conv(g: Graph, w: Mapping[str, Tensor], name: str, x: Tensor, stride: int = 1) -> Tensor:
    wt = w[f"{name}.weight"]
    pad = wt.shape[-1] // 2
    return gr.conv2d(g, x, wt, w.get(f"{name}.bias"), stride=stride, padding=pad)


def _block(g: Graph, w: Mapping[str, Tensor], i: int, x: Tensor) -> Tensor:
    """Block ``i``: optional pool branch, three convs with ReLU, skip, ReLU."""
    if f"{i}.pool.0.weight" in w:
        p = _conv(g, w, f"{i}.pool.0", x)
        p = gr.group_norm(g, p, POOL_GROUPS, w[f"{i}.pool.1.weight"], w.get(f"{i}.pool.1.bias"), POOL_EPS)
        p = _conv(g, w, f"{i}.pool.3", g.unary("relu", p))
        x = g.add(x, p)
    h = g.unary("relu", _conv(g, w, f"{i}.conv.0", x))
    h = g.unary("relu", _conv(g, w, f"{i}.conv.2", h))
    h = _conv(g, w, f"{i}.conv.4", h)
    skip = _conv(g, w, f"{i}.skip", x) if f"{i}.skip.weight" in w else x
    return g.unary("relu", g.add(h, skip))


def tae_encode(g: Graph, w: Mapping[str, Tensor], image: Tensor) -> Tensor:
    """Encoder graph: ``image`` f32 ``(1, 3, H, W)`` in [0, 1] (H, W multiples of 8) ->
    latent ``(1, C, H/8, W/8)``. ``w`` maps ``"<index>.<rest>"`` names (see
    :func:`split_tae`) to tensors; KeyError names a missing weight."""
    x = _conv(g, w, "0", image)
    x = _block(g, w, 1, x)
    for down in (2, 6, 10):
        x = _conv(g, w, str(down), x, stride=2)
        for i in range(down + 1, down + 4):
            x = _block(g, w, i, x)
    return _conv(g, w, "14", x)


def tae_decode(g: Graph, w: Mapping[str, Tensor], latent: Tensor) -> Tensor:
    """Decoder graph: ``latent`` f32 ``(1, C, h, w)`` -> image ``(1, 3, 8h, 8w)`` (about
    [0, 1], not clamped). Names as in :func:`tae_encode`."""
    x = g.scale(g.unary("tanh", g.scale(latent, 1.0 / 3.0)), 3.0)
    x = g.unary("relu", _conv(g, w, "1", x))
    for i in (3, 4, 5):
        x = _block(g, w, i, x)
    for up, n in ((6, 3), (11, 3), (16, 1)):
        x = g.upscale(x, 2)
        x = _conv(g, w, str(up + 1), x)
        for i in range(up + 2, up + 2 + n):
            x = _block(g, w, i, x)
    return _conv(g, w, "19", x)


class TaeGraph(WholeGraph):
    """One TAE half as an engine module graph (``sdplan.core.models.ModuleGraph``): no
    blocks, every weight on the main device. Input ``"image"`` ``(1, 3, H, W)`` (encoder)
    or ``"latent"`` ``(1, C, h, w)`` (decoder), f32; output ``"latent"`` or ``"image"``.

    ``file_names``: the weight names of the file (to pick this half's, with its prefix).
    """

    def __init__(self, layout: TaeLayout, file_names: list[str]) -> None:
        self.layout = layout
        local = split_tae(dict.fromkeys(file_names), layout)
        self._tensors = [layout.prefix + n for n in sorted(local)]
        self.names = frozenset(self._tensors)

    @property
    def input_name(self) -> str:
        return "image" if self.layout.part == "encoder" else "latent"

    def other_tensors(self) -> list[str]:
        return list(self._tensors)

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        """``{input_name: (shape, "f32")}``; ValueError for a wrong input name or shape."""
        shape = shapes.get(self.input_name)
        want = 3 if self.layout.part == "encoder" else self.layout.latent_channels
        if shape is None or len(shape) != 4 or shape[0] != 1 or shape[1] != want:
            raise ValueError(f"TAE {self.layout.part}: input {self.input_name!r} must be "
                             f"(1, {want}, H, W), got {shapes}")
        if self.layout.part == "encoder" and (shape[2] % 8 or shape[3] % 8):
            raise ValueError(f"TAE encoder: image height and width must be multiples of 8, got {shape}")
        return {self.input_name: (tuple(shape), "f32")}

    def build(self, g: Graph, w: Any, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        ws = Weights(w, self.layout.prefix, self.names)
        x = inputs[self.input_name]
        if self.layout.part == "encoder":
            return {"latent": tae_encode(g, ws, x)}
        return {"image": tae_decode(g, ws, x)}
