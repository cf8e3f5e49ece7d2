"""The Z-Image DiT (Turbo and base; Alibaba Tongyi, 2025) in the single-file layout as a
block-structured ggml graph.

Layout (ComfyUI / stable-diffusion.cpp ``z_image_turbo_bf16.safetensors``, with or without
``model.diffusion_model.``): ``x_embedder``, ``cap_embedder.{0,1}`` (RMS norm, linear),
``t_embedder.mlp.{0,2}``, ``x_pad_token``, ``cap_pad_token`` ``(1, D)``,
``noise_refiner.N``, ``context_refiner.N`` and ``layers.N`` blocks of
``attention.{qkv, out, q_norm, k_norm}``, ``feed_forward.{w1, w2, w3}``,
``attention_norm{1,2}``, ``ffn_norm{1,2}`` and (not the context refiner)
``adaLN_modulation.0``; ``final_layer.{adaLN_modulation.1, linear}``.

Forward pass (diffusers ``ZImageTransformer2DModel``; stable-diffusion.cpp ``z_image.hpp``):
``c = t_embedder(emb(1000 t))`` with ``t = 1 - sigma`` and the 256-wide ``[cos, sin]``
embedding; image patches (2x2, channel order ``(dy, dx, c)``) through ``x_embedder``, the
LLM states through ``cap_embedder``; each stream is padded to a multiple of 32 tokens with its
pad token; the context refiners (no modulation) run on the text, the noise refiners on the
image, then the main layers on ``[text, image]``; the final layer takes the image tokens.
A block with modulation ``scale_a, gate_a, scale_f, gate_f = lin(c)`` computes
``x += tanh(gate_a) * n2(attn(n1(x) * (1 + scale_a)))`` and
``x += tanh(gate_f) * f2(ffn(f1(x) * (1 + scale_f)))`` (all norms RMS, eps 1e-5; ffn is
``w2(silu(w1 x) * w3 x)``); attention has fused q, k, v, per-head RMS-normed q and k, and
3-axis RoPE (:func:`position_ids`, base 256, axes (32, 48, 48) of the 128-wide heads). The
final layer is ``linear(LN(x) * (1 + lin(silu(c))))`` (LayerNorm without affine, eps 1e-6).
The network outputs ``x0 - noise``; :class:`ZImageDiT` negates it, so its output ``out`` is
the flow velocity ``noise - x0`` like Flux's.

Blocks for layer split: the main ``layers.N`` (30 in Z-Image); the refiners are non-block
work on the main device, as sd-cli's block rule counts them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from sdplan.core.models.base import ModelLayoutError, Weights, check_block, diffusion_prefix
from sdplan.core.models.flux import apply_rope, rope_tables
from sdplan.core.runtime import graph as gr

__all__ = ["ZImageConfig", "ZImageDiT", "z_image_config", "find_prefix", "patchify", "unpatchify",
           "position_ids", "SEQ_MULTI_OF", "THETA", "PATCH"]

#: Token counts are padded to a multiple of this (``SEQ_MULTI_OF``).
SEQ_MULTI_OF = 32
#: RoPE base of Z-Image (``rope_theta``).
THETA = 256.0
PATCH = 2
EPS = 1e-5
FINAL_EPS = 1e-6


def find_prefix(names: Mapping[str, Any]) -> str:
    """``model.diffusion_model.`` or ``""``: the prefix in front of ``cap_embedder.1.weight``.

    Raises:
        ModelLayoutError: no Z-Image DiT among ``names``.
    """
    return diffusion_prefix(names, ("cap_embedder.1.weight", "x_embedder.weight"),
                            "Z-Image DiT")


@dataclass(frozen=True)
class ZImageConfig:
    """Hyper-parameters of a Z-Image DiT (inferred by :func:`z_image_config`).

    Attributes: prefix, ``channels`` (latent channels), ``width``, ``heads``, ``kv_heads``,
    ``head_dim``, ``ffn`` (feed-forward width), ``context`` (LLM width), ``adaln`` (modulation
    input width), ``n_layers``, ``n_noise_refiner``, ``n_context_refiner``, ``axes`` (RoPE
    widths per axis).
    """

    prefix: str
    channels: int
    width: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    context: int
    adaln: int
    n_layers: int
    n_noise_refiner: int
    n_context_refiner: int
    axes: tuple[int, int, int]


def _count(w: Weights, seg: str) -> int:
    idx = w.indices(seg)
    if idx != list(range(len(idx))):
        raise ModelLayoutError(f"Z-Image {seg.rstrip('.')} blocks are not numbered 0..N-1: {idx[:8]}")
    return len(idx)


def z_image_config(weights: Mapping[str, Any], axes: tuple[int, int, int] | None = None) -> ZImageConfig:
    """Infer a :class:`ZImageConfig` from ``weights`` (tensors or shape tuples).

    The head width is the q-norm's length; heads = width / head width, key/value heads from
    the fused qkv rows; RoPE axes ``axes`` when given, else (hd/4, 3hd/8, 3hd/8): (32, 48, 48)
    for Z-Image's 128.

    Raises:
        ModelLayoutError: missing tensors, blocks not numbered 0..N-1, widths that do not
            divide into heads, or axes that do not sum to the head width.
    """
    p = find_prefix(weights)
    w = Weights(weights, p)
    width, patch_in = w.shape("x_embedder.weight")
    context = w.shape("cap_embedder.1.weight")[1]
    n_layers = _count(w, "layers.")
    if not n_layers:
        raise ModelLayoutError("Z-Image DiT without main layers ('layers.0.' missing)")
    hd = w.shape("layers.0.attention.q_norm.weight")[0]
    qkv = w.shape("layers.0.attention.qkv.weight")[0]
    if width % hd or qkv % hd or (qkv // hd - width // hd) % 2:
        raise ModelLayoutError(f"Z-Image width {width} / qkv rows {qkv} do not divide into heads of {hd}")
    heads = width // hd
    kv_heads = (qkv // hd - heads) // 2
    axes = tuple(axes) if axes is not None else (hd // 4, 3 * hd // 8, hd - hd // 4 - 3 * hd // 8)  # type: ignore[assignment]
    assert axes is not None
    if len(axes) != 3 or sum(axes) != hd or any(a % 2 or a <= 0 for a in axes):
        raise ModelLayoutError(f"Z-Image RoPE axes {axes} must be three even widths summing to {hd}")
    if patch_in % (PATCH * PATCH):
        raise ModelLayoutError(f"Z-Image x_embedder input {patch_in} is not 2x2 patches")
    return ZImageConfig(p, patch_in // (PATCH * PATCH), width, heads, kv_heads, hd,
                        w.shape("layers.0.feed_forward.w1.weight")[0], context,
                        w.shape("layers.0.adaLN_modulation.0.weight")[1], n_layers,
                        _count(w, "noise_refiner."), _count(w, "context_refiner."), axes)  # type: ignore[arg-type]


def patchify(latent: np.ndarray) -> np.ndarray:
    """``(1, C, H, W)`` -> ``(1, H/2 * W/2, 4C)`` float32, features in ``(dy, dx, c)`` order.

    Raises:
        ValueError: not 4-D or odd H/W.
    """
    lat = np.asarray(latent, dtype=np.float32)
    if lat.ndim != 4 or lat.shape[2] % PATCH or lat.shape[3] % PATCH:
        raise ValueError(f"Z-Image latent must be (N, C, H, W) with even H and W, got {lat.shape}")
    b, c, h, w = lat.shape
    x = lat.reshape(b, c, h // 2, 2, w // 2, 2).transpose(0, 2, 4, 3, 5, 1)
    return np.ascontiguousarray(x.reshape(b, (h // 2) * (w // 2), 4 * c))


def unpatchify(x: np.ndarray, h: int, w: int) -> np.ndarray:
    """Inverse of :func:`patchify`: ``(1, h/2 * w/2, 4C)`` -> ``(1, C, h, w)`` float32."""
    x = np.asarray(x, dtype=np.float32)
    b, n, c4 = x.shape
    if n != (h // 2) * (w // 2) or c4 % 4:
        raise ValueError(f"Z-Image tokens {x.shape} do not fit a {h}x{w} latent")
    y = x.reshape(b, h // 2, w // 2, 2, 2, c4 // 4).transpose(0, 5, 1, 3, 2, 4)
    return np.ascontiguousarray(y.reshape(b, c4 // 4, h, w))


def padded(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`SEQ_MULTI_OF`."""
    return -(-n // SEQ_MULTI_OF) * SEQ_MULTI_OF


def position_ids(n_txt: int, h: int, w: int) -> np.ndarray:
    """Position ids ``(padded(n_txt) + padded(h/2 * w/2), 3)`` of ``[text, image]`` for an
    ``h x w`` latent: text token ``i`` (pads included) at ``(i + 1, 0, 0)``, image patch at row
    ``r``, column ``c`` at ``(padded(n_txt) + 1, r, c)``, image pads at ``(0, 0, 0)``
    (diffusers ``patchify_and_embed``; stable-diffusion.cpp ``gen_z_image_ids``)."""
    tp = padded(n_txt)
    txt = np.zeros((tp, 3))
    txt[:, 0] = np.arange(1, tp + 1)
    img = np.zeros((h // 2, w // 2, 3))
    img[..., 0] = tp + 1
    img[..., 1] = np.arange(h // 2)[:, None]
    img[..., 2] = np.arange(w // 2)[None, :]
    n_img = (h // 2) * (w // 2)
    pad = np.zeros((padded(n_img) - n_img, 3))
    return np.concatenate([txt, img.reshape(-1, 3), pad])


class ZImageDiT:
    """The DiT as a :class:`sdplan.core.models.ModuleGraph` (module docstring).

    Inputs (:meth:`inputs` builds them): ``img`` f32 ``(1, N, 4C)``, ``txt`` f32
    ``(1, T, context)``, ``t`` f32 ``(1,)`` (``1 - sigma``), ``pe_cos`` / ``pe_sin`` f32
    ``(padded(T) + padded(N), 1, hd/2, 1)``, ``rows`` i32 ``(N,)`` (the image tokens'
    places in the sequence, ``padded(T) + i``). Output ``out`` f32 ``(1, N, 4C)``: the velocity
    ``noise - x0`` in patch form.
    """

    #: The CPU bf16 kernels (sdplan._ggml.bf16_kernel()) with which this module's f16/bf16 weights are
    #: run in bf16 (ModuleRunner): measured by bench/bench_cpu_bf16_families.py (2 threads, medians of
    #: 3 interleaved processes, three runs, random f16 weights), a Z-Image Turbo call (one main, one
    #: noise-refiner and one context-refiner layer at the real width, 256 image and 128 text tokens)
    #: took 0.15-0.25x the f16 path's time with AMX; AVX512_BF16 alone 0.78-1.03x on that Xeon, so
    #: it keeps f16's precision.
    #: Accuracy: tests/test_bf16_dit_models.py.
    #: With AVX512_BF16 alone it depends on the core: on an AMD EPYC (Zen 4) this module's call took
    #: 0.51x the f16 path's time (the families' benchmark, medians of 3 interleaved processes), hence
    #: ``avx512_fast``: bf16 where the CPU's AVX512_BF16 product measures fast
    #: (sdplan.core.runtime.bf16_rule; the Xeon above does not, the EPYC does).
    cpu_bf16_kernels: tuple[str, ...] = ("amx", "avx512_fast")

    def __init__(self, cfg: ZImageConfig, flash: bool = False) -> None:
        self.cfg = cfg
        self.flash = flash
        self.n_blocks = cfg.n_layers

    @classmethod
    def from_weights(cls, weights: Mapping[str, Any], axes: tuple[int, int, int] | None = None,
                     flash: bool = False) -> ZImageDiT:
        """The DiT for ``weights`` (names -> tensors or shapes); see :func:`z_image_config`."""
        return cls(z_image_config(weights, axes), flash)

    # ------------------------------------------------------------------ names
    def _block_names(self, p: str, modulation: bool) -> list[str]:
        names = [p + n for n in ("attention.qkv.weight", "attention.out.weight", "attention.q_norm.weight",
                                 "attention.k_norm.weight", "feed_forward.w1.weight", "feed_forward.w2.weight",
                                 "feed_forward.w3.weight", "attention_norm1.weight", "attention_norm2.weight",
                                 "ffn_norm1.weight", "ffn_norm2.weight")]
        if modulation:
            names += [p + "adaLN_modulation.0.weight", p + "adaLN_modulation.0.bias"]
        return names

    def block_tensors(self, i: int) -> list[str]:
        check_block(self, i)
        return self._block_names(f"{self.cfg.prefix}layers.{i}.", True)

    def other_tensors(self) -> list[str]:
        c = self.cfg
        names = [c.prefix + n for n in (
            "x_embedder.weight", "x_embedder.bias", "cap_embedder.0.weight", "cap_embedder.1.weight",
            "cap_embedder.1.bias", "t_embedder.mlp.0.weight", "t_embedder.mlp.0.bias", "t_embedder.mlp.2.weight",
            "t_embedder.mlp.2.bias", "x_pad_token", "cap_pad_token", "final_layer.adaLN_modulation.1.weight",
            "final_layer.adaLN_modulation.1.bias", "final_layer.linear.weight", "final_layer.linear.bias")]
        for i in range(c.n_noise_refiner):
            names += self._block_names(f"{c.prefix}noise_refiner.{i}.", True)
        for i in range(c.n_context_refiner):
            names += self._block_names(f"{c.prefix}context_refiner.{i}.", False)
        return names

    # ------------------------------------------------------------------ inputs
    def inputs(self, latent: np.ndarray, context: np.ndarray, sigma: float) -> dict[str, np.ndarray]:
        """Graph input arrays for a latent ``(1, C, H, W)``, LLM states ``(1, T, context)``
        and ``sigma`` in [0, 1].

        Raises:
            ValueError: shapes that do not fit the model.
        """
        c = self.cfg
        img = patchify(latent)
        ctx = np.asarray(context, dtype=np.float32)
        if img.shape[2] != 4 * c.channels:
            raise ValueError(f"Z-Image latent has {latent.shape[1]} channels, the model takes {c.channels}")
        if ctx.ndim != 3 or ctx.shape[0] != 1 or ctx.shape[1] < 1 or ctx.shape[2] != c.context:
            raise ValueError(f"Z-Image context must be (1, T, {c.context}), got {ctx.shape}")
        h, w = latent.shape[2:]
        cos, sin = rope_tables(position_ids(ctx.shape[1], h, w), c.axes, THETA)
        rows = np.arange(img.shape[1], dtype=np.int32) + padded(ctx.shape[1])
        return {"img": img, "txt": ctx, "t": np.array([1.0 - sigma], np.float32),
                "pe_cos": cos[:, None, :, None].copy(), "pe_sin": sin[:, None, :, None].copy(),
                "rows": rows}

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        need = {"img", "txt", "t", "pe_cos", "pe_sin", "rows"}
        if not need <= set(shapes):
            raise ValueError(f"Z-Image: inputs {sorted(need - set(shapes))} missing")
        return {k: (tuple(shapes[k]), "i32" if k == "rows" else "f32") for k in need}

    # ------------------------------------------------------------------ graph pieces
    def _lin(self, g: Any, w: Any, x: Any, name: str, bias: bool = True) -> Any:
        return gr.linear(g, x, w(name + ".weight"), w(name + ".bias") if bias else None)

    def _rms(self, g: Any, x: Any, weight: Any) -> Any:
        return g.mul(g.rms_norm(x, EPS), weight)

    def _slice(self, g: Any, x: Any, start: int, n: int) -> Any:
        """Rows ``start..start+n`` of the first axis of a contiguous f32 ``x``."""
        shape = tuple(x.shape)
        rest = int(np.prod(shape[1:]))
        v = g.view(g.reshape(x, (shape[0], rest)), (n, rest), (rest * 4, 4), start * rest * 4)
        return g.reshape(g.cont(v), (n, *shape[1:]))

    def _pad(self, g: Any, x: Any, token: Any) -> Any:
        """``x`` ``(1, n, D)`` followed by copies of ``token`` ``(1, D)`` up to :func:`padded`."""
        _, n, d = x.shape
        extra = padded(n) - n
        if not extra:
            return x
        return g.concat(x, g.repeat(g.reshape(token, (1, 1, d)), (1, extra, d)), 1)

    def _attention(self, g: Any, w: Any, p: str, x: Any, cos: Any, sin: Any) -> Any:
        c = self.cfg
        _, n, _ = x.shape
        groups = c.heads + 2 * c.kv_heads
        qkv = g.reshape(gr.linear(g, x, w(p + "attention.qkv.weight")), (1, n, groups, c.head_dim))
        st = (n * groups * c.head_dim * 4, groups * c.head_dim * 4, c.head_dim * 4, 4)

        def part(first: int, count: int) -> Any:
            return g.cont(g.view(qkv, (1, n, count, c.head_dim), st, first * c.head_dim * 4))

        q = apply_rope(g, self._rms(g, part(0, c.heads), w(p + "attention.q_norm.weight")), cos, sin)
        k = apply_rope(g, self._rms(g, part(c.heads, c.kv_heads), w(p + "attention.k_norm.weight")), cos, sin)
        v = part(c.heads + c.kv_heads, c.kv_heads)
        perm = (0, 2, 1, 3)  # heads as views: gr.attention copies them only for a path that needs it
        a = gr.attention(g, g.permute(q, perm), g.permute(k, perm), g.permute(v, perm),
                         flash=gr.dit_flash(g, self.flash))
        return gr.linear(g, a, w(p + "attention.out.weight"))

    def _block(self, g: Any, w: Any, p: str, x: Any, cos: Any, sin: Any, cond: Any | None) -> Any:
        """One transformer block; ``cond`` ``(1, adaln)`` modulates it (None: no modulation)."""
        d = self.cfg.width
        mods: list[Any] = []
        if cond is not None:
            m = self._lin(g, w, cond, p + "adaLN_modulation.0")  # (1, 4D)
            mods = [g.reshape(g.cont(g.view(m, (1, d), (4 * d * 4, 4), k * d * 4)), (1, 1, d)) for k in range(4)]
        h = self._rms(g, x, w(p + "attention_norm1.weight"))
        if mods:
            h = g.add(h, g.mul(h, mods[0]))
        a = self._rms(g, self._attention(g, w, p, h, cos, sin), w(p + "attention_norm2.weight"))
        x = g.add(x, g.mul(a, g.unary("tanh", mods[1])) if mods else a)
        h = self._rms(g, x, w(p + "ffn_norm1.weight"))
        if mods:
            h = g.add(h, g.mul(h, mods[2]))
        gate = g.unary("silu", gr.linear(g, h, w(p + "feed_forward.w1.weight")))
        f = gr.linear(g, g.mul(gate, gr.linear(g, h, w(p + "feed_forward.w3.weight"))), w(p + "feed_forward.w2.weight"))
        f = self._rms(g, f, w(p + "ffn_norm2.weight"))
        return g.add(x, g.mul(f, g.unary("tanh", mods[3])) if mods else f)

    # ------------------------------------------------------------------ ModuleGraph
    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        c = self.cfg
        pf = c.prefix
        temb = g.timestep_embedding(g.scale(inputs["t"], 1000.0), w(pf + "t_embedder.mlp.0.weight").shape[1])
        cond = self._lin(g, w, g.unary("silu", self._lin(g, w, temb, pf + "t_embedder.mlp.0")), pf + "t_embedder.mlp.2")
        txt = self._rms(g, inputs["txt"], w(pf + "cap_embedder.0.weight"))
        txt = self._pad(g, self._lin(g, w, txt, pf + "cap_embedder.1"), w(pf + "cap_pad_token"))
        img = self._pad(g, self._lin(g, w, inputs["img"], pf + "x_embedder"), w(pf + "x_pad_token"))
        nt, ni = txt.shape[1], img.shape[1]
        cos, sin = inputs["pe_cos"], inputs["pe_sin"]
        if cos.shape[0] != nt + ni:
            raise ValueError(f"Z-Image: RoPE tables for {cos.shape[0]} tokens, the sequence has {nt + ni}")
        tc, ts = self._slice(g, cos, 0, nt), self._slice(g, sin, 0, nt)
        ic, is_ = self._slice(g, cos, nt, ni), self._slice(g, sin, nt, ni)
        for i in range(c.n_context_refiner):
            txt = self._block(g, w, f"{pf}context_refiner.{i}.", txt, tc, ts, None)
        for i in range(c.n_noise_refiner):
            img = self._block(g, w, f"{pf}noise_refiner.{i}.", img, ic, is_, cond)
        return {"x": g.concat(txt, img, 1), "cond": cond, "pe_cos": cos, "pe_sin": sin,
                "rows": inputs["rows"]}

    def build_block(self, g: Any, w: Any, i: int, state: dict[str, Any]) -> dict[str, Any]:
        x = self._block(g, w, f"{self.cfg.prefix}layers.{i}.", state["x"], state["pe_cos"], state["pe_sin"],
                        state["cond"])
        return dict(state, x=x)

    def build_post(self, g: Any, w: Any, state: dict[str, Any]) -> dict[str, Any]:
        pf = self.cfg.prefix
        x = state["x"]
        scale = self._lin(g, w, g.unary("silu", state["cond"]), pf + "final_layer.adaLN_modulation.1")
        h = g.norm(x, FINAL_EPS)
        h = g.add(h, g.mul(h, g.reshape(scale, (1, 1, self.cfg.width))))
        y = self._lin(g, w, h, pf + "final_layer.linear")  # (1, L, 4C)
        _, total, c4 = y.shape
        rows = state["rows"]
        img = g.get_rows(g.reshape(y, (total, c4)), rows)  # the image tokens, pads left out
        return {"out": g.scale(g.reshape(img, (1, rows.shape[0], c4)), -1.0)}
