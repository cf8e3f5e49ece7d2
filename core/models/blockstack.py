"""A generic pre-norm transformer block stack (tests and benchmarks).

Input ``x`` ``(B, T, d_in)`` -> ``embed`` linear -> ``n_blocks`` blocks of
``h += attn(LN(h)); h += mlp(LN(h))`` (multi-head self-attention with a fused qkv
projection, GELU-tanh MLP) -> final LayerNorm -> ``head`` linear -> ``y`` ``(B, T, d_out)``.

Weights (PyTorch layouts, linear weights ``(out, in)``): ``embed.{weight,bias}``,
``blocks.{i}.norm1.{weight,bias}``, ``blocks.{i}.attn.qkv.{weight,bias}`` ``(3D, D)``,
``blocks.{i}.attn.out.{weight,bias}``, ``blocks.{i}.norm2.{weight,bias}``,
``blocks.{i}.mlp.fc1.{weight,bias}`` ``(F, D)``, ``blocks.{i}.mlp.fc2.{weight,bias}``,
``final_norm.{weight,bias}``, ``head.{weight,bias}``. Block tensors follow spec section 8
(``blocks.{i}.``). :func:`reference` is the same forward pass in numpy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.models.base import check_block
from sdplan.core.runtime import graph as gr

EPS = 1e-5


@dataclass(frozen=True)
class BlockStackConfig:
    """Sizes: model width ``dim``, ``heads`` (dim divisible), MLP width ``ffn``."""

    n_blocks: int = 4
    dim: int = 64
    heads: int = 4
    ffn: int = 256
    d_in: int = 16
    d_out: int = 16


class BlockStack:
    """The block stack as a :class:`sdplan.core.models.ModuleGraph`."""

    def __init__(self, cfg: BlockStackConfig) -> None:
        if cfg.dim % cfg.heads:
            raise ValueError(f"BlockStack: dim {cfg.dim} is not divisible by heads {cfg.heads}")
        self.cfg = cfg
        self.n_blocks = cfg.n_blocks

    def block_tensors(self, i: int) -> list[str]:
        check_block(self, i)
        p = f"blocks.{i}."
        return [p + s + "." + k for s in ("norm1", "attn.qkv", "attn.out", "norm2", "mlp.fc1", "mlp.fc2")
                for k in ("weight", "bias")]

    def other_tensors(self) -> list[str]:
        return [f"{m}.{k}" for m in ("embed", "final_norm", "head") for k in ("weight", "bias")]

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        if set(shapes) != {"x"} or len(shapes["x"]) != 3 or shapes["x"][2] != self.cfg.d_in:
            raise ValueError(f"BlockStack: needs one input x of shape (B, T, {self.cfg.d_in}), got {shapes}")
        return {"x": (tuple(shapes["x"]), "f32")}

    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"h": gr.linear(g, inputs["x"], w("embed.weight"), w("embed.bias"))}

    def build_block(self, g: Any, w: Any, i: int, state: dict[str, Any]) -> dict[str, Any]:
        c, p = self.cfg, f"blocks.{i}."
        h = state["h"]
        b, t, d = h.shape
        hd = d // c.heads
        x = gr.layer_norm(g, h, w(p + "norm1.weight"), w(p + "norm1.bias"), EPS)
        qkv = gr.linear(g, x, w(p + "attn.qkv.weight"), w(p + "attn.qkv.bias"))  # (B, T, 3D)
        qkv = g.reshape(qkv, (b * t, 3, c.heads, hd))

        def head(k: int) -> Any:  # (B, H, T, hd)
            v = g.view(qkv, (b * t, 1, c.heads, hd), (3 * d * 4, d * 4, hd * 4, 4), k * d * 4)
            return g.cont(g.permute(g.reshape(g.cont(v), (b, t, c.heads, hd)), (0, 2, 1, 3)))

        a = gr.attention(g, head(0), head(1), head(2), flash=False)  # (B, T, D)
        h = g.add(h, gr.linear(g, a, w(p + "attn.out.weight"), w(p + "attn.out.bias")))
        x = gr.layer_norm(g, h, w(p + "norm2.weight"), w(p + "norm2.bias"), EPS)
        x = g.unary("gelu", gr.linear(g, x, w(p + "mlp.fc1.weight"), w(p + "mlp.fc1.bias")))
        h = g.add(h, gr.linear(g, x, w(p + "mlp.fc2.weight"), w(p + "mlp.fc2.bias")))
        return {"h": h}

    def build_post(self, g: Any, w: Any, state: dict[str, Any]) -> dict[str, Any]:
        x = gr.layer_norm(g, state["h"], w("final_norm.weight"), w("final_norm.bias"), EPS)
        return {"y": gr.linear(g, x, w("head.weight"), w("head.bias"))}


def random_weights(cfg: BlockStackConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights of the stack (scaled so activations stay O(1))."""
    rng = np.random.default_rng(seed)
    d, f = cfg.dim, cfg.ffn

    def lin(o: int, i: int, name: str, out: dict[str, np.ndarray]) -> None:
        out[name + ".weight"] = (rng.standard_normal((o, i)) / math.sqrt(i)).astype(np.float32)
        out[name + ".bias"] = (0.1 * rng.standard_normal(o)).astype(np.float32)

    def ln(name: str, out: dict[str, np.ndarray]) -> None:
        out[name + ".weight"] = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
        out[name + ".bias"] = (0.1 * rng.standard_normal(d)).astype(np.float32)

    w: dict[str, np.ndarray] = {}
    lin(d, cfg.d_in, "embed", w)
    for i in range(cfg.n_blocks):
        p = f"blocks.{i}."
        ln(p + "norm1", w)
        lin(3 * d, d, p + "attn.qkv", w)
        lin(d, d, p + "attn.out", w)
        ln(p + "norm2", w)
        lin(f, d, p + "mlp.fc1", w)
        lin(d, f, p + "mlp.fc2", w)
    ln("final_norm", w)
    lin(cfg.d_out, d, "head", w)
    return w


def write_model(path: str | Path, cfg: BlockStackConfig, seed: int = 0, dtype: str = "f32") -> dict[str, np.ndarray]:
    """Write random weights to a safetensors file (matrices in ``dtype`` f32 or f16, vectors
    f32); returns the float32 weights as stored (after rounding)."""
    from safetensors.numpy import save_file

    w = random_weights(cfg, seed)
    stored = {k: (v.astype(np.float16) if dtype == "f16" and v.ndim == 2 else v) for k, v in w.items()}
    save_file(stored, str(path))
    return {k: v.astype(np.float32) for k, v in stored.items()}


def reference(cfg: BlockStackConfig, w: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """The forward pass in float64 numpy: x ``(B, T, d_in)`` -> ``(B, T, d_out)`` float32."""
    def lin(v: np.ndarray, n: str) -> np.ndarray:
        return v @ w[n + ".weight"].T.astype(np.float64) + w[n + ".bias"]

    def ln(v: np.ndarray, n: str) -> np.ndarray:
        mu, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
        return (v - mu) / np.sqrt(var + EPS) * w[n + ".weight"] + w[n + ".bias"]

    b, t, _ = x.shape
    d, hd = cfg.dim, cfg.dim // cfg.heads
    h = lin(x.astype(np.float64), "embed")
    for i in range(cfg.n_blocks):
        p = f"blocks.{i}."
        qkv = lin(ln(h, p + "norm1"), p + "attn.qkv").reshape(b, t, 3, cfg.heads, hd)
        q, k, v = (qkv[:, :, j].transpose(0, 2, 1, 3) for j in range(3))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        h = h + lin(a.transpose(0, 2, 1, 3).reshape(b, t, d), p + "attn.out")
        m = lin(ln(h, p + "norm2"), p + "mlp.fc1")
        m = 0.5 * m * (1 + np.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m ** 3)))
        h = h + lin(m, p + "mlp.fc2")
    return lin(ln(h, "final_norm"), "head").astype(np.float32)


def _from_args(**cfg: int) -> BlockStack:
    """Factory for engine jobs: ``BlockStack(BlockStackConfig(**cfg))``."""
    return BlockStack(BlockStackConfig(**cfg))
