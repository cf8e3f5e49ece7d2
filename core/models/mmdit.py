"""The MMDiT of Stable Diffusion 3 / 3.5 (medium, large) in the original single-file layout as a
block-structured ggml graph.

Layout (with or without the ``model.diffusion_model.`` prefix): ``pos_embed`` ``(1, M*M, D)``,
``x_embedder.proj`` (a 2x2 stride-2 convolution), ``t_embedder.mlp.{0,2}``,
``y_embedder.mlp.{0,2}``, ``context_embedder``, ``joint_blocks.N.{context_block,x_block}.{
adaLN_modulation.1, attn.qkv, attn.proj, attn.ln_q, attn.ln_k, mlp.fc1, mlp.fc2}``, MMDiT-X's
``joint_blocks.N.x_block.attn2.{qkv, proj, ln_q, ln_k}`` (SD3.5 medium, blocks 0..12), and
``final_layer.{adaLN_modulation.1, linear}``. The last block's context stream is
*pre-only*: it has only ``adaLN_modulation.1`` (shift, scale) and ``attn.qkv`` (and ``ln_q``/
``ln_k``); the context is not updated after it.

Forward pass (Esser et al. 2024, "Scaling Rectified Flow Transformers"; Stability's
``sd3_impls.py``/``mmditx.py``; stable-diffusion.cpp's ``mmdit.hpp``): the latent's 2x2 patches
are embedded and the centre crop of the fixed 2D sin-cos ``pos_embed`` (top = (M - h)/2,
left = (M - w)/2 in patches) is added; ``c = t_embedder(emb(t)) + y_embedder(pooled)`` with the
256-wide sinusoidal embedding ``[cos, sin]`` of the timestep ``t = 1000 sigma``;
``context = context_embedder(context)``. Each joint block modulates both streams from
``adaLN_modulation.1(silu(c))`` (shift, scale, gate of attention, then of the MLP; MMDiT-X adds
shift, scale, gate of ``attn2``), runs one attention over the joined sequence (context first)
with per-head q/k RMS norms (SD3.5; eps 1e-6), and in MMDiT-X blocks a second, image-only
self-attention ``attn2`` on the same normed input with its own modulation. The final layer
modulates with (shift, scale) and projects to 2x2x16 values per patch. LayerNorms have no
affine weights, eps 1e-6; MLPs use GELU (tanh).

Heads: the weights do not give them; a qk norm's length is the head width, else the
published 64 (sd-cli: heads = depth, width = 64 x depth).

Patches (numpy, :func:`patches`/:func:`unpatch`): the input ``(1, 16, H, W)`` as
``(1, H/2, W/2, 64)`` with channel order ``c*4 + 2*dy + dx`` (the convolution's weight
flattened); the output's per-patch order is ``(dy, dx, c)`` (``nhwpqc -> nchpwq``).

Blocks for layer split: the joint blocks, in order. Skip-layer guidance: blocks in ``skip``
pass their state through unchanged (sd-cli's ``skip_layers``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sdplan.core.models.base import ModelLayoutError, Weights, diffusion_prefix
from sdplan.core.runtime import graph as gr

__all__ = ["MMDiTConfig", "MMDiT", "mmdit_config", "find_prefix", "patches", "unpatch", "HEAD_DIM"]

#: SD3's head width (64 x heads = width; sd-cli's heads = depth).
HEAD_DIM = 64
EPS = 1e-6


def find_prefix(names: Mapping[str, Any]) -> str:
    """``model.diffusion_model.`` or ``""``: the prefix in front of ``joint_blocks.0``.

    Raises:
        ModelLayoutError: no SD3 MMDiT among ``names``.
    """
    return diffusion_prefix(names, ("x_embedder.proj.weight", "joint_blocks.0.x_block.attn.qkv.weight"),
                            "SD3 MMDiT")


@dataclass(frozen=True)
class MMDiTConfig:
    """Hyper-parameters of an MMDiT (inferred from shapes by :func:`mmdit_config`).

    Attributes: prefix, ``in_channels`` (16), ``patch`` (2), ``width``, ``heads``, ``mlp``
    (hidden width of the MLPs), ``context`` (the conditioning's width, 4096), ``pooled``
    (2048), ``depth`` (joint blocks), ``qk_norm`` (``rms``, ``ln`` or None), ``x_self``
    (blocks with MMDiT-X ``attn2``), ``pos_size`` (M: ``pos_embed`` covers M x M patches),
    ``out_channels``, ``skip`` (blocks skipped, for skip-layer guidance).
    """

    prefix: str
    in_channels: int
    patch: int
    width: int
    heads: int
    mlp: int
    context: int
    pooled: int
    depth: int
    qk_norm: str | None
    x_self: frozenset[int]
    pos_size: int
    out_channels: int
    skip: frozenset[int] = frozenset()

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def variant(self) -> str:
        """``3.5-medium`` (MMDiT-X), ``large`` (38 blocks), ``medium`` (24) or ``d<depth>``."""
        if self.x_self:
            return "3.5-medium"
        return {24: "medium", 38: "large"}.get(self.depth, f"d{self.depth}")


def mmdit_config(weights: Mapping[str, Any], heads: int | None = None) -> MMDiTConfig:
    """Infer an :class:`MMDiTConfig` from ``weights`` (tensors or shape tuples).

    Heads: ``heads`` when given, else width / the length of ``attn.ln_q.weight`` (SD3.5),
    else width / :data:`HEAD_DIM`.

    Raises:
        ModelLayoutError: missing tensors, blocks not numbered 0..N-1, a ``pos_embed`` that
            is not square, or a width not divisible by the heads.
    """
    p = find_prefix(weights)
    w = Weights(weights, p)
    width, cin, ph, pw = w.shape("x_embedder.proj.weight")
    if ph != pw:
        raise ModelLayoutError(f"SD3 patch embedding {ph}x{pw} is not square")
    blocks = w.indices("joint_blocks.")
    if blocks != list(range(len(blocks))):
        raise ModelLayoutError(f"SD3 joint_blocks are not numbered 0..N-1: {blocks[:8]}")
    n_pos = w.shape("pos_embed")[-2]
    side = int(round(n_pos ** 0.5))
    if side * side != n_pos:
        raise ModelLayoutError(f"SD3 pos_embed has {n_pos} positions, not a square")
    qn = "joint_blocks.0.x_block.attn.ln_q."
    qk = None if qn + "weight" not in w else "ln" if qn + "bias" in w else "rms"
    if heads is None:
        heads = width // (w.shape(qn + "weight")[0] if qk else HEAD_DIM)
    if heads <= 0 or width % heads:
        raise ModelLayoutError(f"SD3 width {width} is not divisible by {heads} heads")
    x_self = frozenset(i for i in blocks if f"joint_blocks.{i}.x_block.attn2.qkv.weight" in w)
    out = w.shape("final_layer.linear.weight")[0] // (ph * ph)
    return MMDiTConfig(p, cin, ph, width, heads, w.shape("joint_blocks.0.x_block.mlp.fc1.weight")[0],
                       w.shape("context_embedder.weight")[1], w.shape("y_embedder.mlp.0.weight")[1],
                       len(blocks), qk, x_self, side, out)


def patches(latent: np.ndarray, patch: int = 2) -> np.ndarray:
    """``(1, C, H, W)`` -> ``(1, H/p, W/p, C p p)`` float32, channel order ``c p^2 + p dy + dx``.

    Raises:
        ValueError: not 4-D or H/W not multiples of ``patch``.
    """
    lat = np.asarray(latent, dtype=np.float32)
    if lat.ndim != 4 or lat.shape[2] % patch or lat.shape[3] % patch:
        raise ValueError(f"SD3 latent must be (N, C, H, W) with H and W multiples of {patch}, got {lat.shape}")
    b, c, h, w = lat.shape
    x = lat.reshape(b, c, h // patch, patch, w // patch, patch).transpose(0, 2, 4, 1, 3, 5)
    return np.ascontiguousarray(x.reshape(b, h // patch, w // patch, c * patch * patch))


def unpatch(x: np.ndarray, h: int, w: int, patch: int = 2) -> np.ndarray:
    """The final layer's ``(1, h/p * w/p, p p C)`` (per patch ``(dy, dx, c)``) -> ``(1, C, h, w)``."""
    x = np.asarray(x, dtype=np.float32)
    b, n, k = x.shape
    hp, wp = h // patch, w // patch
    if n != hp * wp or k % (patch * patch):
        raise ValueError(f"SD3 tokens {x.shape} do not fit a {h}x{w} latent")
    c = k // (patch * patch)
    y = x.reshape(b, hp, wp, patch, patch, c).transpose(0, 5, 1, 3, 2, 4)
    return np.ascontiguousarray(y.reshape(b, c, h, w))


class MMDiT:
    """The MMDiT as a :class:`sdplan.core.models.ModuleGraph`.

    Inputs (:meth:`inputs` builds them): ``img`` f32 ``(1, H/2, W/2, 64)``, ``txt`` f32
    ``(1, T, context)``, ``y`` f32 ``(1, pooled)``, ``t`` f32 ``(1,)`` (timestep, 1000 sigma).
    Output ``out`` f32 ``(1, HW/4, 64)``: the velocity ``noise - x0`` per patch
    (:func:`unpatch` gives the latent).
    """

    #: The CPU bf16 kernels (sdplan._ggml.bf16_kernel()) with which this module's f16/bf16 weights are
    #: run in bf16 (ModuleRunner): measured by bench/bench_cpu_bf16_families.py (2 threads, medians of
    #: 3 interleaved processes, three runs, random f16 weights), an SD3-medium call (one joint block at
    #: the real width, 256 image and 128 text tokens) took 0.24-0.51x the f16 path's time with AMX;
    #: AVX512_BF16 alone 0.97-1.00x, so that Xeon keeps f16's precision.
    #: Accuracy: tests/test_bf16_dit_models.py.
    #: With AVX512_BF16 alone it depends on the core: on an AMD EPYC (Zen 4) this module's call took
    #: 0.67x the f16 path's time (the families' benchmark, medians of 3 interleaved processes), hence
    #: ``avx512_fast``: bf16 where the CPU's AVX512_BF16 product measures fast
    #: (sdplan.core.runtime.bf16_rule; the Xeon above does not, the EPYC does).
    cpu_bf16_kernels: tuple[str, ...] = ("amx", "avx512_fast")

    def __init__(self, cfg: MMDiTConfig, flash: bool = False) -> None:
        self.cfg = cfg
        self.flash = flash
        self.n_blocks = cfg.depth

    @classmethod
    def from_weights(cls, weights: Mapping[str, Any], heads: int | None = None, flash: bool = False) -> MMDiT:
        """The MMDiT for ``weights`` (names -> tensors or shapes); see :func:`mmdit_config`."""
        return cls(mmdit_config(weights, heads), flash)

    def skipping(self, skip: Collection[int]) -> MMDiT:
        """The same graph with the blocks in ``skip`` passed through (skip-layer guidance).

        Raises:
            ValueError: a block index outside 0..depth-1.
        """
        bad = sorted(i for i in skip if not 0 <= i < self.cfg.depth)
        if bad:
            raise ValueError(f"skip layers {bad} outside the MMDiT's blocks 0..{self.cfg.depth - 1}")
        return MMDiT(replace(self.cfg, skip=frozenset(skip)), self.flash)

    # ------------------------------------------------------------------ names
    def _check(self, i: int) -> None:
        if not 0 <= i < self.cfg.depth:
            raise IndexError(f"MMDiT block {i} outside 0..{self.cfg.depth - 1}")

    def block_tensors(self, i: int) -> list[str]:
        self._check(i)
        c = self.cfg
        p = f"{c.prefix}joint_blocks.{i}."
        last = i == c.depth - 1
        names = []
        for s in ("context_block", "x_block"):
            mods = ["adaLN_modulation.1", "attn.qkv"]
            if not (last and s == "context_block"):
                mods += ["attn.proj", "mlp.fc1", "mlp.fc2"]
            if s == "x_block" and i in c.x_self:
                mods += ["attn2.qkv", "attn2.proj"]
            names += [f"{p}{s}.{m}.{k}" for m in mods for k in ("weight", "bias")]
            if c.qk_norm:
                for a in ("attn",) + (("attn2",) if s == "x_block" and i in c.x_self else ()):
                    for n in ("ln_q", "ln_k"):
                        names.append(f"{p}{s}.{a}.{n}.weight")
                        if c.qk_norm == "ln":
                            names.append(f"{p}{s}.{a}.{n}.bias")
        return names

    def other_tensors(self) -> list[str]:
        c = self.cfg
        mods = ["x_embedder.proj", "t_embedder.mlp.0", "t_embedder.mlp.2", "y_embedder.mlp.0", "y_embedder.mlp.2",
                "context_embedder", "final_layer.adaLN_modulation.1", "final_layer.linear"]
        return [c.prefix + "pos_embed"] + [f"{c.prefix}{m}.{k}" for m in mods for k in ("weight", "bias")]

    # ------------------------------------------------------------------ inputs
    def inputs(self, latent: np.ndarray, context: np.ndarray, pooled: np.ndarray,
               sigma: float) -> dict[str, np.ndarray]:
        """Graph input arrays for a latent ``(1, 16, H, W)``, the conditioning ``(1, T, context)``,
        the pooled vector ``(1, pooled)`` and ``sigma`` in [0, 1] (timestep ``1000 sigma``).

        Raises:
            ValueError: shapes that do not fit the model, or a latent larger than ``pos_embed``.
        """
        c = self.cfg
        img = patches(latent, c.patch)
        ctx = np.asarray(context, dtype=np.float32)
        y = np.asarray(pooled, dtype=np.float32).reshape(1, -1)
        if img.shape[3] != c.in_channels * c.patch ** 2:
            raise ValueError(f"SD3 latent has {latent.shape[1]} channels, the model takes {c.in_channels}")
        if max(img.shape[1:3]) > c.pos_size:
            raise ValueError(f"SD3 latent {latent.shape[2]}x{latent.shape[3]} exceeds the model's position "
                             f"table ({c.pos_size * c.patch} latent cells per side)")
        if ctx.ndim != 3 or ctx.shape[0] != 1 or ctx.shape[2] != c.context:
            raise ValueError(f"SD3 context must be (1, T, {c.context}), got {ctx.shape}")
        if y.shape[1] != c.pooled:
            raise ValueError(f"SD3 pooled vector must have {c.pooled} values, got {y.shape[1]}")
        return {"img": img, "txt": ctx, "y": y, "t": np.array([1000.0 * sigma], np.float32)}

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        need = {"img", "txt", "y", "t"}
        if not need <= set(shapes):
            raise ValueError(f"MMDiT: inputs {sorted(need - set(shapes))} missing")
        return {k: (tuple(shapes[k]), "f32") for k in need}

    # ------------------------------------------------------------------ graph pieces
    def _lin(self, g: Any, w: Any, x: Any, name: str) -> Any:
        return gr.linear(g, x, w(name + ".weight"), w(name + ".bias"))

    def _embed(self, g: Any, w: Any, x: Any, name: str) -> Any:
        h = g.unary("silu", self._lin(g, w, x, self.cfg.prefix + name + ".mlp.0"))
        return self._lin(g, w, h, self.cfg.prefix + name + ".mlp.2")

    def _chunks(self, g: Any, w: Any, vec: Any, name: str) -> list[Any]:
        """``adaLN_modulation.1(silu(vec))`` as its ``(1, 1, D)`` parts."""
        m = self._lin(g, w, g.unary("silu", vec), name)
        d = self.cfg.width
        n = m.shape[-1] // d
        return [g.reshape(g.cont(g.view(m, (1, d), (n * d * 4, 4), k * d * 4)), (1, 1, d)) for k in range(n)]

    def _modulate(self, g: Any, x: Any, shift: Any, scale: Any) -> Any:
        return g.add(g.add(x, g.mul(x, scale)), shift)

    def _qkv(self, g: Any, w: Any, x: Any, name: str) -> tuple[Any, Any, Any]:
        """q, k, v ``(1, H, N, hd)`` of ``name`` (``...attn`` or ``...attn2``) applied to ``x``."""
        c = self.cfg
        qkv = self._lin(g, w, x, name + ".qkv")
        _, n, _ = qkv.shape
        out = []
        for j in range(3):
            v = g.view(qkv, (1, n, c.width), (n * 3 * c.width * 4, 3 * c.width * 4, 4), j * c.width * 4)
            h = g.reshape(g.cont(v), (1, n, c.heads, c.head_dim))
            if j < 2 and c.qk_norm:
                ln = f"{name}.ln_{'qk'[j]}"
                if c.qk_norm == "rms":
                    h = g.mul(g.rms_norm(h, EPS), w(ln + ".weight"))
                else:
                    h = gr.layer_norm(g, h, w(ln + ".weight"), w(ln + ".bias"), EPS)
            out.append(g.cont(g.permute(h, (0, 2, 1, 3))))
        return out[0], out[1], out[2]

    def _attend(self, g: Any, q: Any, k: Any, v: Any) -> Any:
        return gr.attention(g, q, k, v, flash=gr.dit_flash(g, self.flash))

    def _mlp(self, g: Any, w: Any, x: Any, name: str) -> Any:
        h = g.unary("gelu", self._lin(g, w, x, name + ".mlp.fc1"))
        return self._lin(g, w, h, name + ".mlp.fc2")

    # ------------------------------------------------------------------ ModuleGraph
    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        c = self.cfg
        img = inputs["img"]
        _, hp, wp, k = img.shape
        x = g.reshape(img, (1, hp * wp, k))
        proj = w(c.prefix + "x_embedder.proj.weight")
        x = gr.linear(g, x, g.reshape(proj, (c.width, k)), w(c.prefix + "x_embedder.proj.bias"))
        pos = w(c.prefix + "pos_embed")
        es = 2 if pos.dtype in ("f16", "bf16") else 4  # the crop is a strided view of its rows
        m, d = c.pos_size, c.width
        top, left = (m - hp) // 2, (m - wp) // 2
        crop = g.view(pos, (hp, wp, d), (m * d * es, d * es, es), (top * m + left) * d * es)
        crop = g.reshape(g.cast(crop, "f32"), (1, hp * wp, d))
        vec = self._embed(g, w, g.timestep_embedding(inputs["t"], 256), "t_embedder")
        vec = g.add(vec, self._embed(g, w, inputs["y"], "y_embedder"))
        return {"img": g.add(x, crop), "txt": self._lin(g, w, inputs["txt"], c.prefix + "context_embedder"),
                "vec": vec}

    def build_block(self, g: Any, w: Any, i: int, state: dict[str, Any]) -> dict[str, Any]:
        self._check(i)
        c = self.cfg
        if i in c.skip:
            return dict(state)
        p = f"{c.prefix}joint_blocks.{i}."
        last = i == c.depth - 1
        vec, txt, img = state["vec"], state["txt"], state["img"]
        cm = self._chunks(g, w, vec, p + "context_block.adaLN_modulation.1")
        xm = self._chunks(g, w, vec, p + "x_block.adaLN_modulation.1")
        tn, xn = g.norm(txt, EPS), g.norm(img, EPS)
        cq, ck, cv = self._qkv(g, w, self._modulate(g, tn, cm[0], cm[1]), p + "context_block.attn")
        xq, xk, xv = self._qkv(g, w, self._modulate(g, xn, xm[0], xm[1]), p + "x_block.attn")
        nt, ni = txt.shape[1], img.shape[1]
        attn = self._attend(g, g.concat(cq, xq, 2), g.concat(ck, xk, 2), g.concat(cv, xv, 2))  # (1, nt+ni, D)
        d = c.width
        st = ((nt + ni) * d * 4, d * 4, 4)
        out = dict(state)
        if not last:
            a = self._lin(g, w, g.cont(g.view(attn, (1, nt, d), st, 0)), p + "context_block.attn.proj")
            txt = g.add(txt, g.mul(a, cm[2]))
            h = self._mlp(g, w, self._modulate(g, g.norm(txt, EPS), cm[3], cm[4]), p + "context_block")
            out["txt"] = g.add(txt, g.mul(h, cm[5]))
        a = self._lin(g, w, g.cont(g.view(attn, (1, ni, d), st, nt * d * 4)), p + "x_block.attn.proj")
        img = g.add(img, g.mul(a, xm[2]))
        if i in c.x_self:
            q2, k2, v2 = self._qkv(g, w, self._modulate(g, xn, xm[6], xm[7]), p + "x_block.attn2")
            a2 = self._lin(g, w, self._attend(g, q2, k2, v2), p + "x_block.attn2.proj")
            img = g.add(img, g.mul(a2, xm[8]))
        h = self._mlp(g, w, self._modulate(g, g.norm(img, EPS), xm[3], xm[4]), p + "x_block")
        out["img"] = g.add(img, g.mul(h, xm[5]))
        return out

    def build_post(self, g: Any, w: Any, state: dict[str, Any]) -> dict[str, Any]:
        c = self.cfg
        shift, scale = self._chunks(g, w, state["vec"], c.prefix + "final_layer.adaLN_modulation.1")
        x = self._modulate(g, g.norm(state["img"], EPS), shift, scale)
        return {"out": self._lin(g, w, x, c.prefix + "final_layer.linear")}
