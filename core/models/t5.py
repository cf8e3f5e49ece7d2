"""The T5 encoder (T5-XXL of Flux and SD3, UMT5-XXL of Wan) as a block-structured ggml graph.

Layout (after an optional prefix such as ``text_encoders.t5xxl.transformer.``): token
embedding ``shared.weight`` (or ``encoder.embed_tokens.weight``), blocks
``encoder.block.N.layer.0.{layer_norm, SelfAttention.{q,k,v,o}}`` and
``encoder.block.N.layer.1.{layer_norm, DenseReluDense.{wi_0, wi_1, wo}}`` (no biases), the
relative-position table ``encoder.block.0.layer.0.SelfAttention.relative_attention_bias``
``(buckets, heads)`` and ``encoder.final_layer_norm``.

Computation (Raffel et al. 2020, T5 v1.1 as in transformers' ``T5EncoderModel``):
``x = shared[ids]``; per block ``x += o(attn(LN(x)))`` with unscaled dot-product scores plus
the position bias of block 0 (bidirectional buckets, shared by every block), then
``x += wo(gelu_tanh(wi_0 LN(x)) * wi_1 LN(x))``; final LN. LN is T5's RMS norm
``x / sqrt(mean(x^2) + eps) * w`` (eps 1e-6). No attention mask: Flux attends to padding too.

UMT5 (Wan's ``--t5xxl``; transformers ``UMT5EncoderModel``, sd-cli's ``T5Runner`` with
``is_umt5``) has the same blocks, each with a relative-position table of its own
(``encoder.block.N.layer.0.SelfAttention.relative_attention_bias``) instead of block 0's
shared one; Wan masks the padding out of the attention (an additive key mask: 0 for tokens,
-inf for padding, the ``mask`` input).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from sdplan.core.models.base import ModelLayoutError, Weights, check_block
from sdplan.core.runtime import graph as gr

__all__ = ["T5Config", "T5Encoder", "t5_config", "relative_buckets", "find_prefix"]

EPS = 1e-6
_FINAL = "encoder.final_layer_norm.weight"


def find_prefix(names: Mapping[str, Any]) -> str:
    """The prefix in front of ``encoder.final_layer_norm.weight``.

    Raises:
        ModelLayoutError: no T5 encoder among ``names``.
    """
    for n in names:
        if n.endswith(_FINAL) and (n == _FINAL or n.endswith("." + _FINAL)):
            return n[: -len(_FINAL)]
    raise ModelLayoutError(f"no T5 encoder: no tensor named '{_FINAL}' (with or without a prefix)")


@dataclass(frozen=True)
class T5Config:
    """Hyper-parameters inferred from shapes: ``width`` (d_model), ``heads``, ``d_kv``
    (inner attention width = heads * head dim), ``d_ff``, ``n_blocks``, ``buckets``,
    ``max_distance`` (128 in every published T5), ``vocab``, the token-embedding name and
    ``per_block_bias`` (UMT5: every block has its own relative-position table)."""

    prefix: str
    vocab: int
    width: int
    heads: int
    inner: int
    d_ff: int
    n_blocks: int
    buckets: int
    max_distance: int
    embedding: str
    per_block_bias: bool = False


def t5_config(weights: Mapping[str, Any], max_distance: int = 128) -> T5Config:
    """Infer a :class:`T5Config` from ``weights`` (tensors or shape tuples).

    Heads come from the relative-position table ``(buckets, heads)`` of block 0.

    Raises:
        ModelLayoutError: missing tensors, or blocks not numbered 0..N-1.
    """
    prefix = find_prefix(weights)
    w = Weights(weights, prefix)
    emb = "shared.weight" if "shared.weight" in w else "encoder.embed_tokens.weight"
    vocab, width = w.shape(emb)
    blocks = w.indices("encoder.block.")
    if not blocks or blocks != list(range(len(blocks))):
        raise ModelLayoutError(f"T5 blocks are not numbered 0..N-1: {blocks[:8]}")
    buckets, heads = w.shape("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
    inner = w.shape("encoder.block.0.layer.0.SelfAttention.q.weight")[0]
    d_ff = w.shape("encoder.block.0.layer.1.DenseReluDense.wi_0.weight")[0]
    if inner % heads:
        raise ModelLayoutError(f"T5 attention width {inner} is not divisible by {heads} heads")
    per_block = len(blocks) > 1 and "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" in w
    return T5Config(prefix, vocab, width, heads, inner, d_ff, len(blocks), buckets, max_distance, emb, per_block)


def relative_buckets(n: int, buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """Bidirectional relative-position buckets ``(n, n)`` int32 for query i, key j.

    Half the buckets for keys after the query; within a half, exact buckets for distances
    below ``buckets/4`` and logarithmic ones up to ``max_distance`` (T5's rule,
    Raffel et al. 2020, section 2.1).
    """
    rel = np.arange(n)[None, :] - np.arange(n)[:, None]  # key - query
    half = buckets // 2
    out = (rel > 0).astype(np.int64) * half
    dist = np.abs(rel)
    exact = half // 2
    with np.errstate(divide="ignore"):
        large = exact + (np.log(np.maximum(dist, 1) / exact) / math.log(max_distance / exact)
                         * (half - exact)).astype(np.int64)
    large = np.minimum(large, half - 1)
    return (out + np.where(dist < exact, dist, large)).astype(np.int32)


class T5Encoder:
    """The encoder as a :class:`sdplan.core.models.ModuleGraph`.

    Inputs: ``ids`` i32 ``(1, T)`` and ``buckets`` i32 ``(T*T,)`` (:meth:`inputs` makes
    both); output ``hidden`` f32 ``(1, T, width)``. Block 0 carries the position table and
    computes the bias ``(heads, T, T)`` that the state hands to every later block.
    """

    #: The CPU bf16 kernels (sdplan._ggml.bf16_kernel()) with which this module's f16/bf16 weights are
    #: run in bf16 (ModuleRunner): measured by bench/bench_cpu_bf16_families.py (2 threads, medians of
    #: 3 interleaved processes, three runs, random f16 weights), a T5-XXL call (one block at the real
    #: width, 128 tokens) took 0.14-0.22x the f16 path's time with AMX; AVX512_BF16 alone 0.75-0.90x,
    #: within this host's spread, so that Xeon keeps f16's precision.
    #: Accuracy: tests/test_bf16_dit_models.py.
    #: With AVX512_BF16 alone it depends on the core: on an AMD EPYC (Zen 4) this module's call took
    #: 0.57x the f16 path's time (the families' benchmark, medians of 3 interleaved processes), hence
    #: ``avx512_fast``: bf16 where the CPU's AVX512_BF16 product measures fast
    #: (sdplan.core.runtime.bf16_rule; the Xeon above does not, the EPYC does).
    cpu_bf16_kernels: tuple[str, ...] = ("amx", "avx512_fast")

    def __init__(self, cfg: T5Config) -> None:
        self.cfg = cfg
        self.n_blocks = cfg.n_blocks

    @classmethod
    def from_weights(cls, weights: Mapping[str, Any]) -> T5Encoder:
        """The encoder for ``weights`` (names -> tensors or shapes)."""
        return cls(t5_config(weights))

    def _p(self, i: int) -> str:
        return f"{self.cfg.prefix}encoder.block.{i}."

    def block_tensors(self, i: int) -> list[str]:
        check_block(self, i)
        p = self._p(i)
        names = [p + "layer.0.layer_norm.weight"] + [p + f"layer.0.SelfAttention.{c}.weight" for c in "qkvo"]
        names += [p + "layer.1.layer_norm.weight"] + [p + f"layer.1.DenseReluDense.{c}.weight"
                                                       for c in ("wi_0", "wi_1", "wo")]
        if i == 0 or self.cfg.per_block_bias:
            names.append(p + "layer.0.SelfAttention.relative_attention_bias.weight")
        return names

    def other_tensors(self) -> list[str]:
        return [self.cfg.prefix + self.cfg.embedding, self.cfg.prefix + _FINAL]

    def inputs(self, ids: np.ndarray, mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Graph input arrays for token ids ``(1, T)``: ``ids`` and ``buckets``, and with
        ``mask`` ``(1, T)`` (1 for a token, 0 for padding) the additive key mask ``mask`` f32
        ``(T,)`` (0 or -inf).

        Raises:
            ValueError: ids not of shape (1, T) or outside the vocabulary, or a mask of
                another shape.
        """
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
            raise ValueError(f"T5 ids must have shape (1, T), got {ids.shape}")
        if ids.min() < 0 or ids.max() >= self.cfg.vocab:
            raise ValueError(f"T5 ids must be in 0..{self.cfg.vocab - 1}, got {ids.min()}..{ids.max()}")
        t = ids.shape[1]
        out = {"ids": ids.astype(np.int32),
               "buckets": relative_buckets(t, self.cfg.buckets, self.cfg.max_distance).reshape(-1)}
        if mask is not None:
            m = np.asarray(mask)
            if m.shape != ids.shape:
                raise ValueError(f"T5 mask must have the ids' shape {ids.shape}, got {m.shape}")
            out["mask"] = np.where(m.reshape(-1) > 0, 0.0, -np.inf).astype(np.float32)
        return out

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        ids = tuple(shapes.get("ids", ()))
        if len(ids) != 2 or ids[0] != 1:
            raise ValueError(f"T5: needs ids of shape (1, T), got {shapes}")
        specs = {"ids": (ids, "i32"), "buckets": ((ids[1] * ids[1],), "i32")}
        if "mask" in shapes:
            specs["mask"] = ((ids[1],), "f32")
        return specs

    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        ids = inputs["ids"]
        b, t = ids.shape
        x = g.get_rows(w(self.cfg.prefix + self.cfg.embedding), g.reshape(ids, (b * t,)))
        state = {"x": g.reshape(x, (b, t, self.cfg.width)), "buckets": inputs["buckets"]}
        if "mask" in inputs:
            state["mask"] = g.reshape(inputs["mask"], (1, 1, 1, t))
        return state

    def _ln(self, g: Any, x: Any, weight: Any) -> Any:
        return g.mul(g.rms_norm(x, EPS), weight)

    def build_block(self, g: Any, w: Any, i: int, state: dict[str, Any]) -> dict[str, Any]:
        c, p = self.cfg, self._p(i)
        x = state["x"]
        b, t, _ = x.shape
        hd = c.inner // c.heads
        if "bias" in state and not c.per_block_bias:
            bias = state["bias"]
        else:
            table = w(p + "layer.0.SelfAttention.relative_attention_bias.weight")  # (buckets, H)
            bias = g.reshape(g.get_rows(table, state["buckets"]), (t, t, c.heads))
            bias = g.reshape(g.cont(g.permute(bias, (2, 0, 1))), (1, c.heads, t, t))  # (1, H, Tq, Tk)
            if "mask" in state:  # padding keys out of every query's attention
                bias = g.add(bias, state["mask"])
        h = self._ln(g, x, w(p + "layer.0.layer_norm.weight"))

        def heads(name: str) -> Any:
            y = gr.linear(g, h, w(p + f"layer.0.SelfAttention.{name}.weight"))
            return g.cont(g.permute(g.reshape(y, (b, t, c.heads, hd)), (0, 2, 1, 3)))  # (B, H, T, hd)

        q, k, v = heads("q"), heads("k"), heads("v")
        scores = g.add(g.mul_mat(k, q), bias)  # (B, H, Tq, Tk)
        prob = g.soft_max(scores)
        o = g.mul_mat(g.cont(g.transpose(v)), prob)  # (B, H, Tq, hd)
        o = g.reshape(g.cont(g.permute(o, (0, 2, 1, 3))), (b, t, c.inner))
        x = g.add(x, gr.linear(g, o, w(p + "layer.0.SelfAttention.o.weight")))
        h = self._ln(g, x, w(p + "layer.1.layer_norm.weight"))
        gate = g.unary("gelu", gr.linear(g, h, w(p + "layer.1.DenseReluDense.wi_0.weight")))
        up = gr.linear(g, h, w(p + "layer.1.DenseReluDense.wi_1.weight"))
        x = g.add(x, gr.linear(g, g.mul(gate, up), w(p + "layer.1.DenseReluDense.wo.weight")))
        out = {"x": x, "bias": bias}
        if c.per_block_bias:  # UMT5: every block looks its own table up
            out["buckets"] = state["buckets"]
            if "mask" in state:
                out["mask"] = state["mask"]
        return out

    def build_post(self, g: Any, w: Any, state: dict[str, Any]) -> dict[str, Any]:
        return {"hidden": self._ln(g, state["x"], w(self.cfg.prefix + _FINAL))}


