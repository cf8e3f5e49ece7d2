"""Qwen2.5-VL's vision tower (the ``visual.*`` tensors of a Qwen2.5-VL text-encoder file), as a
block-structured ggml graph: the picture embeddings Qwen-Image Edit places at the prompt's
``<|image_pad|>`` tokens.

Architecture (transformers ``Qwen2_5_VisionTransformerPretrainedModel``; stable-diffusion.cpp
``qwenvl.hpp``'s vision part):

* the picture is cut into patches of 14 x 14 pixels over a temporal patch of 2 frames (a still
  picture repeated), 2x2 neighbouring patches kept together ("merge groups", in reading order
  of the groups), each patch flattened as (channel, frame, row, column)
  (:func:`patchify`, transformers' ``Qwen2VLImageProcessor``);
* patch embedding: the ``(W, 3, 2, 14, 14)`` 3-D convolution with a stride equal to its kernel,
  i.e. one matrix product with the kernel flattened;
* ``depth`` blocks ``x += proj(attn(rope(q), rope(k), v))`` (q, k, v from one ``qkv`` matrix with
  bias, heads of ``head_dim``), ``x += down(silu(gate(n2 x)) * up(n2 x))`` (biases), RMS norms
  ``n1``, ``n2`` (eps 1e-6). The blocks in ``full_blocks`` attend over the whole picture, the
  others within windows of ``window`` pixels (:func:`window_order`); the tokens run in window
  order throughout and a mask keeps each window to itself;
* 2-D rotary embedding over the whole head: the first quarter of the rotated pairs turns with
  the patch's row, the second with its column, frequencies ``10000^(-2j / (head_dim / 2))``
  (ggml's ``GGML_ROPE_TYPE_VISION`` with sections ``(head_dim / 4, head_dim / 4)``, pairs
  ``(i, i + head_dim / 2)``, transformers' ``rotate_half``);
* patch merger: RMS norm ``ln_q``, each merge group's 4 patches concatenated
  ``(N / 4, 4 W)``, ``mlp.2(gelu(mlp.0(.)))`` (exact GELU) to the LLM's width; the result put back
  into the picture's merge-group order.

Published sizes (Qwen2.5-VL-7B, Qwen-Image's encoder): width 1280, 16 heads of 80, 32 blocks,
full attention in blocks 7, 15, 23, 31, windows of 112 pixels, MLP 3420, output 3584. The head
width, full-attention blocks and window are not in the shapes: the defaults are the published
ones, a file's metadata may state others (:data:`META_KEYS`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.models.base import ModelLayoutError, Weights, check_block
from sdplan.core.runtime import graph as gr
from sdplan.core.runtime.weights import WeightFile, runtime_dtype

__all__ = ["VisionConfig", "VisionTower", "vision_config", "find_vision_prefix", "patchify", "window_order",
           "vision_positions", "weight_file", "META_KEYS", "CLIP_MEAN", "CLIP_STD", "PATCH", "TEMPORAL", "MERGE"]

#: Patch side (pixels), temporal patch (frames) and merge side (patches) of Qwen2.5-VL
#: (``preprocessor_config.json``: ``patch_size`` 14, ``temporal_patch_size`` 2, ``merge_size`` 2).
PATCH, TEMPORAL, MERGE = 14, 2, 2
#: The processor's normalisation (OpenAI CLIP's mean and standard deviation, pixels in 0..1).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: Metadata keys of a text-encoder file stating what the shapes cannot: the vision head width,
#: the full-attention blocks (comma-separated) and the window side in pixels.
META_KEYS = {"head_dim": "sdplan.vision_head_dim", "full_blocks": "sdplan.vision_full_blocks",
             "window": "sdplan.vision_window"}
EPS = 1e-6
THETA = 10000.0


@dataclass(frozen=True)
class VisionConfig:
    """Sizes of a vision tower: ``prefix`` (``visual.``), ``width``, ``heads``, ``head_dim``,
    ``ffn`` (MLP width), ``n_blocks``, ``out_width`` (the LLM's width), ``full_blocks`` (blocks
    attending over the whole picture), ``window`` (pixels)."""

    prefix: str
    width: int
    heads: int
    head_dim: int
    ffn: int
    n_blocks: int
    out_width: int
    full_blocks: tuple[int, ...]
    window: int

    def name(self, part: str, i: int | None = None) -> str:
        """Full tensor name: ``("attn.qkv.weight", 3)`` -> ``visual.blocks.3.attn.qkv.weight``."""
        return f"{self.prefix}blocks.{i}.{part}" if i is not None else self.prefix + part


def find_vision_prefix(names: Mapping[str, Any] | Sequence[str]) -> str | None:
    """The prefix ending in ``visual.`` in front of ``patch_embed.proj.weight``, or None."""
    for n in names:
        if n.endswith("visual.patch_embed.proj.weight"):
            return n[: -len("patch_embed.proj.weight")]
    return None


def vision_config(weights: Mapping[str, Any], head_dim: int = 80, full_blocks: Sequence[int] = (7, 15, 23, 31),
                  window: int = 112) -> VisionConfig:
    """A :class:`VisionConfig` from ``weights`` (names -> tensors or shape tuples); the
    arguments give what shapes do not say (defaults: Qwen2.5-VL-7B's ``config.json``).

    Raises:
        ModelLayoutError: no vision tower, a patch embedding other than ``(W, 3, 2, 14, 14)``,
            blocks not numbered 0..N-1, a width not divisible into heads of ``head_dim`` (or
            ``head_dim`` not a multiple of 4), full-attention blocks outside the tower, or a
            window not a multiple of the merged patch (28 pixels).
    """
    prefix = find_vision_prefix(weights)
    if prefix is None:
        raise ModelLayoutError("no Qwen2.5-VL vision tower: 'visual.patch_embed.proj.weight' missing")
    w = Weights(weights, prefix)
    pe = w.shape("patch_embed.proj.weight")
    if len(pe) != 5 or pe[1:] != (3, TEMPORAL, PATCH, PATCH):
        raise ModelLayoutError(f"vision patch embedding {pe}: expected (W, 3, {TEMPORAL}, {PATCH}, {PATCH})")
    width = pe[0]
    blocks = w.indices("blocks.")
    if not blocks or blocks != list(range(len(blocks))):
        raise ModelLayoutError(f"vision blocks are not numbered 0..N-1: {blocks[:8]}")
    if head_dim % 4 or width % head_dim:
        raise ModelLayoutError(f"vision width {width} does not divide into heads of {head_dim} (a multiple of 4)")
    full = tuple(sorted(full_blocks))
    if any(not 0 <= b < len(blocks) for b in full):
        raise ModelLayoutError(f"vision full-attention blocks {full} outside 0..{len(blocks) - 1}")
    if window <= 0 or window % (PATCH * MERGE):
        raise ModelLayoutError(f"vision window {window} is not a multiple of {PATCH * MERGE} pixels")
    ffn = w.shape("blocks.0.mlp.gate_proj.weight")[0]
    out = w.shape("merger.mlp.2.weight")[0]
    return VisionConfig(prefix, width, width // head_dim, head_dim, ffn, len(blocks), out, full, window)


def patchify(picture: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
    """The processor's patches of ``picture``, u8 or float in 0..255 ``(H, W, 3)`` with ``H``
    and ``W`` multiples of 28 (already resized): rescaled to 0..1, normalised with
    :data:`CLIP_MEAN` / :data:`CLIP_STD`, the frame repeated over the temporal patch, cut into
    merge-group-major patches flattened as (channel, frame, row, column). Returns f32
    ``(N, 1176)`` and the grid ``(1, H / 14, W / 14)``.

    Raises:
        ValueError: a picture not ``(H, W, 3)`` or a side not a multiple of 28.
    """
    p = np.asarray(picture)
    if p.ndim != 3 or p.shape[2] != 3:
        raise ValueError(f"vision picture must be (H, W, 3), got {p.shape}")
    h, w = p.shape[:2]
    if h % (PATCH * MERGE) or w % (PATCH * MERGE) or not h or not w:
        raise ValueError(f"vision picture {w}x{h}: sides must be multiples of {PATCH * MERGE} pixels")
    x = (p.astype(np.float32) / 255.0 - np.array(CLIP_MEAN, np.float32)) / np.array(CLIP_STD, np.float32)
    x = np.repeat(x.transpose(2, 0, 1)[None], TEMPORAL, axis=0)  # (frames, C, H, W)
    gh, gw = h // PATCH, w // PATCH
    x = x.reshape(TEMPORAL, 3, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.transpose(2, 5, 3, 6, 1, 0, 4, 7)  # groups (rows, cols), in-group (row, col), C, frame, py, px
    return np.ascontiguousarray(x.reshape(gh * gw, 3 * TEMPORAL * PATCH * PATCH)), (1, gh, gw)


def window_order(grid: tuple[int, int, int], window: int) -> tuple[np.ndarray, np.ndarray]:
    """Windows of a ``(t, h, w)`` patch grid (transformers' ``get_vision_window_index``): the
    merge groups in window order (windows of ``window / 28`` groups a side, in reading order,
    the last row and column of windows cut short) as i32 ``(N / 4,)``, and each group's
    window number i32 ``(N / 4,)`` in that order."""
    t, h, w = grid
    gh, gw = h // MERGE, w // MERGE
    side = window // (PATCH * MERGE)
    order, wid = [], []
    n = 0
    for f in range(t):
        idx = np.arange(gh * gw).reshape(gh, gw) + f * gh * gw
        for r in range(0, gh, side):
            for c in range(0, gw, side):
                part = idx[r:r + side, c:c + side].reshape(-1)
                order.append(part)
                wid.append(np.full(part.size, n))
                n += 1
    return np.concatenate(order).astype(np.int32), np.concatenate(wid).astype(np.int32)


def vision_positions(grid: tuple[int, int, int]) -> np.ndarray:
    """Each patch's (row, column) in the merge-group-major order of :func:`patchify`,
    i32 ``(N, 2)`` (transformers' ``get_vision_position_ids``)."""
    t, h, w = grid
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    shape = (h // MERGE, MERGE, w // MERGE, MERGE)
    rows = rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    cols = cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    return np.tile(np.stack([rows, cols], -1), (t, 1)).astype(np.int32)


def weight_file(path: str | Path, names: Iterable[str] | None = None, backend: Any = None) -> WeightFile:
    """A :class:`~sdplan.core.runtime.weights.WeightFile` of a text-encoder file whose 5-D patch
    embedding ``(W, 3, 2, 14, 14)`` is held as the matrix ``(W, 1176)`` (the same bytes; ggml
    tensors have at most four dimensions; its dtype chosen by the runtime policy for the matrix).

    Raises:
        ModelFileError: an unreadable file or a missing name.
    """
    wf = WeightFile(path, names, backend=backend)
    for n, info in wf.infos.items():
        if len(info.shape) == 5:
            wf.infos[n] = replace(info, shape=(int(info.shape[0]), int(np.prod(info.shape[1:]))))
            wf.dtypes[n] = wf._policy[n] = runtime_dtype(wf.infos[n], backend)
    return wf


class VisionTower:
    """The vision tower as a :class:`sdplan.core.models.ModuleGraph` (module docstring).

    Inputs (:meth:`inputs`): ``patches`` f32 ``(N, 1176)`` in window order, ``pos`` i32
    ``(4 N,)`` (rows, columns, zeros, zeros), ``mask`` f32 ``(N, N)`` (0 within a window, -inf
    across; only when a block attends within windows), ``order`` i32 ``(N / 4,)`` (where each merge group went). Output ``embeds`` f32
    ``(N / 4, out_width)`` in the picture's merge-group order.
    """

    #: No CPU bf16 kernel measured for this module: f16 products (the LLM's measurements do not
    #: transfer to its 80-wide heads).
    cpu_bf16_kernels: tuple[str, ...] = ()

    def __init__(self, cfg: VisionConfig) -> None:
        self.cfg = cfg
        self.n_blocks = cfg.n_blocks

    @classmethod
    def from_weights(cls, weights: Mapping[str, Any], **kw: Any) -> VisionTower:
        """The tower for ``weights``; keyword arguments as :func:`vision_config`'s."""
        return cls(vision_config(weights, **kw))

    # ------------------------------------------------------------------ names
    def block_tensors(self, i: int) -> list[str]:
        check_block(self, i)
        parts = ["norm1.weight", "norm2.weight", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
                 "attn.proj.bias"] + [f"mlp.{m}.{k}" for m in ("gate_proj", "up_proj", "down_proj")
                                      for k in ("weight", "bias")]
        return [self.cfg.name(p, i) for p in parts]

    def other_tensors(self) -> list[str]:
        return [self.cfg.name(p) for p in ("patch_embed.proj.weight", "merger.ln_q.weight", "merger.mlp.0.weight",
                                           "merger.mlp.0.bias", "merger.mlp.2.weight", "merger.mlp.2.bias")]

    # ------------------------------------------------------------------ inputs
    def inputs(self, patches: np.ndarray, grid: tuple[int, int, int]) -> dict[str, np.ndarray]:
        """Graph inputs for one picture's ``patches`` f32 ``(N, 1176)`` (:func:`patchify`'s
        order) on ``grid`` ``(t, h, w)``.

        Raises:
            ValueError: patches not ``(t h w, 1176)`` or a grid not in merge groups.
        """
        t, h, w = (int(v) for v in grid)
        n = t * h * w
        p = np.asarray(patches, np.float32)
        if p.shape != (n, 3 * TEMPORAL * PATCH * PATCH) or h % MERGE or w % MERGE:
            raise ValueError(f"vision patches {p.shape} do not fit the grid {(t, h, w)}")
        unit = MERGE * MERGE
        order, wid = window_order((t, h, w), self.cfg.window)
        rows = (order[:, None] * unit + np.arange(unit)).reshape(-1)  # patches in window order
        pos = vision_positions((t, h, w))[rows]
        win = np.repeat(wid, unit)
        mask = np.where(win[:, None] == win[None, :], 0.0, -np.inf).astype(np.float32)
        zeros = np.zeros(n, np.int32)
        out = {"patches": np.ascontiguousarray(p[rows]),
               "pos": np.concatenate([pos[:, 0], pos[:, 1], zeros, zeros]).astype(np.int32),
               "mask": mask, "order": np.argsort(order).astype(np.int32)}
        if not self.windowed:
            del out["mask"]
        return out

    @property
    def windowed(self) -> bool:
        """Whether a block attends within windows (the graph then reads ``mask``)."""
        return len(self.cfg.full_blocks) < self.cfg.n_blocks

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        p = tuple(shapes.get("patches", ()))
        if len(p) != 2 or p[0] % (MERGE * MERGE):
            raise ValueError(f"vision tower: needs patches of shape (N, 1176), N a multiple of 4, got {shapes}")
        n = p[0]
        specs = {"patches": (p, "f32"), "pos": ((4 * n,), "i32"), "order": ((n // (MERGE * MERGE),), "i32")}
        if self.windowed:
            specs["mask"] = ((n, n), "f32")
        return specs

    # ------------------------------------------------------------------ graph
    def _norm(self, g: Any, x: Any, weight: Any) -> Any:
        return g.mul(g.rms_norm(x, EPS), weight)

    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        c = self.cfg
        p = inputs["patches"]
        x = gr.linear(g, p, w(c.name("patch_embed.proj.weight")))  # held as (W, 1176): weight_file
        state = {"x": g.reshape(x, (1, p.shape[0], c.width)), "pos": inputs["pos"], "order": inputs["order"]}
        if "mask" in inputs:
            state["mask"] = inputs["mask"]
        return state

    def _head(self, g: Any, qkv: Any, part: int, rope: bool, pos: Any) -> Any:
        """Part ``part`` (q, k, v) of the fused projection ``(1, N, 3 W)`` as ``(1, H, N, hd)``."""
        c = self.cfg
        _, n, _ = qkv.shape
        e = 4  # the projection's f32 output
        y = g.cont(g.view(qkv, (1, n, c.heads, c.head_dim), (n * 3 * c.width * e, 3 * c.width * e, c.head_dim * e, e),
                          part * c.width * e))
        if rope:
            q4 = c.head_dim // 4
            y = g.rope(y, pos, c.head_dim // 2, 24, sections=[q4, q4, 0, 0], freq_base=THETA)
        return g.permute(y, (0, 2, 1, 3))

    def build_block(self, g: Any, w: Any, i: int, state: dict[str, Any]) -> dict[str, Any]:
        c = self.cfg
        x = state["x"]
        h = self._norm(g, x, w(c.name("norm1.weight", i)))
        qkv = gr.linear(g, h, w(c.name("attn.qkv.weight", i)), w(c.name("attn.qkv.bias", i)))
        q, k, v = (self._head(g, qkv, j, j < 2, state["pos"]) for j in range(3))
        mask = None if i in c.full_blocks else state.get("mask")
        a = gr.attention(g, q, k, v, mask, flash=False)
        x = g.add(x, gr.linear(g, a, w(c.name("attn.proj.weight", i)), w(c.name("attn.proj.bias", i))))
        h = self._norm(g, x, w(c.name("norm2.weight", i)))
        gate = g.unary("silu", gr.linear(g, h, w(c.name("mlp.gate_proj.weight", i)), w(c.name("mlp.gate_proj.bias", i))))
        up = gr.linear(g, h, w(c.name("mlp.up_proj.weight", i)), w(c.name("mlp.up_proj.bias", i)))
        x = g.add(x, gr.linear(g, g.mul(gate, up), w(c.name("mlp.down_proj.weight", i)),
                               w(c.name("mlp.down_proj.bias", i))))
        return dict(state, x=x)

    def build_post(self, g: Any, w: Any, state: dict[str, Any]) -> dict[str, Any]:
        c = self.cfg
        x = self._norm(g, state["x"], w(c.name("merger.ln_q.weight")))
        n = x.shape[1]
        x = g.reshape(x, (n // (MERGE * MERGE), MERGE * MERGE * c.width))
        x = gr.gelu(g, gr.linear(g, x, w(c.name("merger.mlp.0.weight")), w(c.name("merger.mlp.0.bias"))))
        x = gr.linear(g, x, w(c.name("merger.mlp.2.weight")), w(c.name("merger.mlp.2.bias")))
        return {"embeds": g.get_rows(x, state["order"])}
