"""The Flux.1 DiT (dev and schnell) in the BFL layout as a block-structured ggml graph.

Layout (with or without the ``model.diffusion_model.`` prefix): ``img_in``, ``txt_in``,
``time_in.{in,out}_layer``, ``vector_in.{in,out}_layer``, ``guidance_in.{in,out}_layer`` (dev
only), ``double_blocks.N.{img,txt}_{mod.lin, attn.qkv, attn.norm.{query,key}_norm.scale,
attn.proj, mlp.0, mlp.2}``, ``single_blocks.N.{modulation.lin, linear1, linear2,
norm.{query,key}_norm.scale}``, ``final_layer.{adaLN_modulation.1, linear}``.

Forward pass (Black Forest Labs' reference ``flux/model.py``; Esser et al. 2024 for the
MMDiT): ``vec = time_in(emb(1000 t)) [+ guidance_in(emb(1000 g))] + vector_in(y)`` with the
256-wide sinusoidal embedding ``[cos, sin]``; double blocks modulate image and text streams
separately (shift, scale, gate for attention and MLP from ``lin(silu(vec))``), attend over
the joined sequence (text first), per-head RMS-normed q and k, RoPE; single blocks run one
stream with the fused ``linear1`` (q, k, v and the 4x MLP input) and ``linear2`` over
``[attn, gelu_tanh(mlp)]``; the final layer modulates with (shift, scale) and projects back.
LayerNorms have no affine weights, eps 1e-6; MLPs use GELU (tanh).

RoPE (:func:`rope_tables`): position ids ``(index, row, column)`` per token (text: zeros;
image patch at row r, column c: ``(0, r, c)``); axis ``a`` rotates ``axes[a]`` consecutive
channels of each head as pairs ``(2i, 2i+1)`` by angle ``pos_a * 10000^(-2i/axes[a])``.

Latents: 16-channel ``(1, 16, H, W)`` latents are patchified 2x2 into ``(1, HW/4, 64)``
with channel order ``c*4 + 2*dy + dx`` (:func:`patchify`, :func:`unpatchify`, numpy).

Blocks for layer split: double blocks 0..D-1, then single blocks as D..D+S-1.

Variants: a config with ``approximator`` set is Chroma (``distilled_guidance_layer`` in
place of the per-block ``mod.lin``/``modulation.lin``, no ``time_in``/``vector_in``/
``guidance_in``/``final_layer.adaLN_modulation``); its graph is
:class:`sdplan.core.models.chroma.ChromaDiT`, which takes its modulation vectors from
:meth:`FluxDiT._mods`'s override.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from sdplan.core.models.base import ModelLayoutError, Weights, check_block, diffusion_prefix
from sdplan.core.runtime import graph as gr

__all__ = ["FluxConfig", "FluxDiT", "flux_config", "find_prefix", "patchify", "unpatchify",
           "rope_tables", "apply_rope", "image_ids", "HEAD_DIM", "THETA"]

#: Flux.1's published head width; heads = width / HEAD_DIM unless the weights say otherwise.
HEAD_DIM = 128
THETA = 10000.0
EPS = 1e-6


def find_prefix(names: Mapping[str, Any]) -> str:
    """``model.diffusion_model.`` or ``""``: the prefix in front of ``img_in.weight``.

    Raises:
        ModelLayoutError: no Flux DiT among ``names``.
    """
    return diffusion_prefix(names, ("img_in.weight", "double_blocks.0.img_attn.qkv.weight"),
                            "Flux DiT in the BFL layout")


@dataclass(frozen=True)
class FluxConfig:
    """Hyper-parameters of a Flux DiT (inferred from shapes by :func:`flux_config`).

    Attributes: prefix, ``in_channels`` (64 = 16 latent channels x 2x2), ``width``,
    ``heads``, ``mlp`` (hidden width of the MLPs), ``context`` (T5 width), ``pooled`` (CLIP
    width; 0 without ``vector_in``), ``n_double``, ``n_single``, ``guidance`` (dev), ``axes``
    (RoPE widths per axis), ``approximator``: Chroma's distilled guidance layer as (input
    width, hidden width, layers), None for FLUX.1.
    """

    prefix: str
    in_channels: int
    width: int
    heads: int
    mlp: int
    context: int
    pooled: int
    n_double: int
    n_single: int
    guidance: bool
    axes: tuple[int, ...]
    approximator: tuple[int, int, int] | None = None

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def variant(self) -> str:
        """``chroma`` with a distilled guidance layer, ``dev`` with a guidance embedder, else
        ``schnell``."""
        return "chroma" if self.approximator else "dev" if self.guidance else "schnell"


def _default_axes(hd: int) -> tuple[int, int, int]:
    a0 = hd // 8
    rest = (hd - a0) // 2
    axes = (a0, rest, hd - a0 - rest)
    if any(a % 2 or a <= 0 for a in axes):
        raise ModelLayoutError(f"Flux head width {hd}: no default RoPE axes (index, row, column); "
                               "give axes explicitly")
    return axes


def flux_config(weights: Mapping[str, Any], heads: int | None = None,
                axes: tuple[int, int, int] | None = None) -> FluxConfig:
    """Infer a :class:`FluxConfig` from ``weights`` (tensors or shape tuples).

    Heads: ``heads`` when given, else width / head width where the head width is the length
    of ``query_norm.scale`` (falling back to :data:`HEAD_DIM`, Flux.1's 128). RoPE axes:
    ``axes`` when given, else (hd/8, rest/2, rest/2): (16, 56, 56) for Flux.1. Chroma (a
    ``distilled_guidance_layer.in_proj.weight``, sd-cli's test) gets ``approximator`` from the
    in_proj shape and the count of ``distilled_guidance_layer.layers.N``, and ``pooled`` 0.

    Raises:
        ModelLayoutError: missing tensors, blocks not numbered 0..N-1, width not divisible
            by the heads, or axes that do not sum to the head width.
    """
    p = find_prefix(weights)
    w = Weights(weights, p)
    width, cin = w.shape("img_in.weight")
    context = w.shape("txt_in.weight")[1]
    approx = None
    if "distilled_guidance_layer.in_proj.weight" in w:
        hidden, a_in = w.shape("distilled_guidance_layer.in_proj.weight")
        approx = (a_in, hidden, len(w.indices("distilled_guidance_layer.layers.")))
    pooled = 0 if approx else w.shape("vector_in.in_layer.weight")[1]
    dbl, sgl = w.indices("double_blocks."), w.indices("single_blocks.")
    for name, idx in (("double_blocks", dbl), ("single_blocks", sgl)):
        if idx != list(range(len(idx))):
            raise ModelLayoutError(f"Flux {name} are not numbered 0..N-1: {idx[:8]}")
    mlp = w.shape("double_blocks.0.img_mlp.0.weight")[0]
    if heads is None:
        qn = w.get("double_blocks.0.img_attn.norm.query_norm.scale")
        hd = int((qn.shape if hasattr(qn, "shape") else qn)[0]) if qn is not None else HEAD_DIM
        heads = width // hd
    if heads <= 0 or width % heads:
        raise ModelLayoutError(f"Flux width {width} is not divisible by {heads} heads")
    hd = width // heads
    axes = tuple(axes) if axes is not None else _default_axes(hd)  # type: ignore[assignment]
    assert axes is not None
    if len(axes) != 3 or sum(axes) != hd or any(a % 2 for a in axes):
        raise ModelLayoutError(f"Flux RoPE axes {axes} must be three even widths summing to {hd}")
    return FluxConfig(p, cin, width, heads, mlp, context, pooled, len(dbl), len(sgl),
                      "guidance_in.in_layer.weight" in w, axes, approx)  # type: ignore[arg-type]


def patchify(latent: np.ndarray) -> np.ndarray:
    """``(1, C, H, W)`` -> ``(1, H/2 * W/2, 4C)`` float32 (2x2 patches, channel-major).

    Raises:
        ValueError: not 4-D or odd H/W.
    """
    lat = np.asarray(latent, dtype=np.float32)
    if lat.ndim != 4 or lat.shape[2] % 2 or lat.shape[3] % 2:
        raise ValueError(f"Flux latent must be (N, C, H, W) with even H and W, got {lat.shape}")
    b, c, h, w = lat.shape
    x = lat.reshape(b, c, h // 2, 2, w // 2, 2).transpose(0, 2, 4, 1, 3, 5)
    return np.ascontiguousarray(x.reshape(b, (h // 2) * (w // 2), c * 4))


def unpatchify(x: np.ndarray, h: int, w: int) -> np.ndarray:
    """Inverse of :func:`patchify`: ``(1, h/2 * w/2, 4C)`` -> ``(1, C, h, w)`` float32."""
    x = np.asarray(x, dtype=np.float32)
    b, n, c4 = x.shape
    if n != (h // 2) * (w // 2) or c4 % 4:
        raise ValueError(f"Flux tokens {x.shape} do not fit a {h}x{w} latent")
    c = c4 // 4
    y = x.reshape(b, h // 2, w // 2, c, 2, 2).transpose(0, 3, 1, 4, 2, 5)
    return np.ascontiguousarray(y.reshape(b, c, h, w))


def image_ids(h: int, w: int) -> np.ndarray:
    """Position ids ``(h/2 * w/2, 3)`` of the patches of an ``h x w`` latent: (0, row, col)."""
    ids = np.zeros((h // 2, w // 2, 3), dtype=np.float64)
    ids[..., 1] = np.arange(h // 2)[:, None]
    ids[..., 2] = np.arange(w // 2)[None, :]
    return ids.reshape(-1, 3)


def rope_tables(ids: np.ndarray, axes: tuple[int, ...], theta: float = THETA) -> tuple[np.ndarray, np.ndarray]:
    """``(cos, sin)`` float32 ``(N, hd/2)`` for position ids ``(N, len(axes))``."""
    angles = []
    for a, d in enumerate(axes):
        freq = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        angles.append(ids[:, a:a + 1].astype(np.float64) * freq[None, :])
    ang = np.concatenate(angles, axis=1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def apply_rope(g: Any, x: Any, cos: Any, sin: Any) -> Any:
    """Rotate ``x`` ``(1, N, H, hd)`` (f32) by the tables of :func:`rope_tables` as graph
    inputs ``(N, 1, hd/2, 1)``: each channel pair ``(2i, 2i+1)`` turns by its angle
    (``Graph.rope_pairs``: one pass on CPU-only graphs; elsewhere the pairs are split into two
    planes so that each product runs along rows of hd/2 values. Multiplying the
    ``(..., hd/2, 1)`` columns directly made each row one value long, which the CPU backend
    ran a value at a time: about a fifth of a Z-Image layer's time at 288 tokens)."""
    return g.rope_pairs(x, cos, sin)


class FluxDiT:
    """The DiT as a :class:`sdplan.core.models.ModuleGraph`.

    Inputs (:meth:`inputs` builds them): ``img`` f32 ``(1, N, 64)``, ``txt`` f32
    ``(1, T, context)``, ``y`` f32 ``(1, pooled)``, ``t`` f32 ``(1,)`` (sigma in [0, 1]),
    ``guidance`` f32 ``(1,)`` (dev only), ``pe_cos``/``pe_sin`` f32 ``(T + N, 1, hd/2, 1)``.
    Output ``out`` f32 ``(1, N, 64)``: the velocity ``noise - x0`` in patch form.
    """

    #: The CPU bf16 kernels (sdplan._ggml.bf16_kernel()) with which this module's f16/bf16 weights are
    #: run in bf16 (ModuleRunner): measured by bench/bench_cpu_bf16_families.py (2 threads, medians of
    #: 3 interleaved processes, three runs, random f16 weights), a FLUX.1-dev call (one double and one
    #: single block at the real width, 256 image and 128 text tokens) took 0.19-0.29x the f16 path's
    #: time with AMX, FLUX.2 klein's (Flux2DiT) 0.19-0.28x; Chroma's blocks are FLUX.1's. AVX512_BF16
    #: alone: 0.73-0.92x and 0.75-0.99x, within this host's spread (one figure moves up to 2x between
    #: runs), so that Xeon keeps f16's precision.
    #: Accuracy: tests/test_bf16_dit_models.py.
    #: With AVX512_BF16 alone it depends on the core: on an AMD EPYC (Zen 4) this module's call took
    #: 0.53x (FLUX.2 klein 0.51x) the f16 path's time (the families' benchmark, medians of 3 interleaved processes), hence
    #: ``avx512_fast``: bf16 where the CPU's AVX512_BF16 product measures fast
    #: (sdplan.core.runtime.bf16_rule; the Xeon above does not, the EPYC does).
    cpu_bf16_kernels: tuple[str, ...] = ("amx", "avx512_fast")

    def __init__(self, cfg: FluxConfig, flash: bool = False) -> None:
        if cfg.approximator is not None and type(self) is FluxDiT:
            raise ModelLayoutError("a Chroma DiT (distilled_guidance_layer, no per-block modulation): "
                                   "sdplan.core.models.chroma.ChromaDiT builds its graph")
        self.cfg = cfg
        self.flash = flash
        self.n_blocks = cfg.n_double + cfg.n_single

    @classmethod
    def from_weights(cls, weights: Mapping[str, Any], heads: int | None = None,
                     axes: tuple[int, int, int] | None = None, flash: bool = False) -> FluxDiT:
        """The DiT for ``weights`` (names -> tensors or shapes); see :func:`flux_config`."""
        return cls(flux_config(weights, heads, axes), flash)

    # ------------------------------------------------------------------ names
    def block_tensors(self, i: int) -> list[str]:
        check_block(self, i)
        c = self.cfg
        if i < c.n_double:
            p = f"{c.prefix}double_blocks.{i}."
            names = []
            for s in ("img", "txt"):
                for lin in ("mod.lin", "attn.qkv", "attn.proj", "mlp.0", "mlp.2"):
                    names += [f"{p}{s}_{lin}.weight", f"{p}{s}_{lin}.bias"]
                names += [f"{p}{s}_attn.norm.query_norm.scale", f"{p}{s}_attn.norm.key_norm.scale"]
            return names
        p = f"{c.prefix}single_blocks.{i - c.n_double}."
        return [p + n for n in ("modulation.lin.weight", "modulation.lin.bias", "linear1.weight",
                                "linear1.bias", "linear2.weight", "linear2.bias",
                                "norm.query_norm.scale", "norm.key_norm.scale")]

    def other_tensors(self) -> list[str]:
        c = self.cfg
        mods = ["img_in", "txt_in", "time_in.in_layer", "time_in.out_layer", "vector_in.in_layer",
                "vector_in.out_layer", "final_layer.adaLN_modulation.1", "final_layer.linear"]
        if c.guidance:
            mods += ["guidance_in.in_layer", "guidance_in.out_layer"]
        return [f"{c.prefix}{m}.{k}" for m in mods for k in ("weight", "bias")]

    # ------------------------------------------------------------------ inputs
    def inputs(self, latent: np.ndarray, context: np.ndarray, pooled: np.ndarray, sigma: float,
               guidance: float | None = None) -> dict[str, np.ndarray]:
        """Graph input arrays for a latent ``(1, 16, H, W)``, T5 states ``(1, T, context)``,
        the pooled CLIP vector ``(1, pooled)``, ``sigma`` in [0, 1] and the distilled
        guidance (dev; ignored by schnell).

        Raises:
            ValueError: shapes that do not fit the model.
        """
        c = self.cfg
        img = patchify(latent)
        ctx = np.asarray(context, dtype=np.float32)
        y = np.asarray(pooled, dtype=np.float32).reshape(1, -1)
        if img.shape[2] != c.in_channels:
            raise ValueError(f"Flux latent gives {img.shape[2]} patch channels, the model takes {c.in_channels}")
        if ctx.ndim != 3 or ctx.shape[0] != 1 or ctx.shape[2] != c.context:
            raise ValueError(f"Flux context must be (1, T, {c.context}), got {ctx.shape}")
        if y.shape[1] != c.pooled:
            raise ValueError(f"Flux pooled vector must have {c.pooled} values, got {y.shape[1]}")
        h, w = latent.shape[2:]
        ids = np.concatenate([np.zeros((ctx.shape[1], 3)), image_ids(h, w)])
        cos, sin = rope_tables(ids, c.axes)
        out = {"img": img, "txt": ctx, "y": y, "t": np.array([sigma], np.float32),
               "pe_cos": cos[:, None, :, None].copy(), "pe_sin": sin[:, None, :, None].copy()}
        if c.guidance:
            out["guidance"] = np.array([3.5 if guidance is None else guidance], np.float32)
        return out

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        need = {"img", "txt", "y", "t", "pe_cos", "pe_sin"} | ({"guidance"} if self.cfg.guidance else set())
        if not need <= set(shapes):
            raise ValueError(f"Flux: inputs {sorted(need - set(shapes))} missing")
        return {k: (tuple(shapes[k]), "f32") for k in need}

    # ------------------------------------------------------------------ graph pieces
    def _lin(self, g: Any, w: Any, x: Any, name: str) -> Any:
        return gr.linear(g, x, w(name + ".weight"), w(name + ".bias"))

    def _mlp_embed(self, g: Any, w: Any, x: Any, name: str) -> Any:
        h = g.unary("silu", self._lin(g, w, x, self.cfg.prefix + name + ".in_layer"))
        return self._lin(g, w, h, self.cfg.prefix + name + ".out_layer")

    def _chunks(self, g: Any, x: Any, n: int) -> list[Any]:
        """``(1, n*D)`` -> n tensors ``(1, 1, D)``."""
        d = x.shape[-1] // n
        return [g.reshape(g.cont(g.view(x, (1, d), (n * d * 4, 4), k * d * 4)), (1, 1, d)) for k in range(n)]

    def _mods(self, g: Any, w: Any, i: int, kind: str, state: dict[str, Any]) -> list[Any]:
        """The modulation vectors ``(1, 1, D)`` of block ``i``: ``kind`` ``img``/``txt`` (double
        blocks: shift, scale, gate of attention then MLP), ``single`` (shift, scale, gate) or
        ``final`` (shift, scale of the final layer), from ``lin(silu(vec))``."""
        c = self.cfg
        svec = g.unary("silu", state["vec"])
        if kind == "final":
            return self._chunks(g, self._lin(g, w, svec, c.prefix + "final_layer.adaLN_modulation.1"), 2)
        if kind == "single":
            name = f"{c.prefix}single_blocks.{i - c.n_double}.modulation.lin"
            return self._chunks(g, self._lin(g, w, svec, name), 3)
        return self._chunks(g, self._lin(g, w, svec, f"{c.prefix}double_blocks.{i}.{kind}_mod.lin"), 6)

    def _modulate(self, g: Any, x: Any, shift: Any, scale: Any) -> Any:
        y = g.norm(x, EPS)
        return g.add(g.add(y, g.mul(y, scale)), shift)

    def _heads(self, g: Any, x: Any, part: int, n_parts: int) -> Any:
        """Part ``part`` of width D of ``x`` ``(1, N, n_parts*D...)`` as ``(1, N, H, hd)``."""
        c = self.cfg
        _, n, total = x.shape
        v = g.view(x, (1, n, c.width), (n * total * 4, total * 4, 4), part * c.width * 4)
        return g.reshape(g.cont(v), (1, n, c.heads, c.head_dim))

    def _mlp_act(self, g: Any, h: Any) -> Any:
        """The MLP activation on the up-projection ``h`` ``(1, N, F)``: GELU (tanh)."""
        return g.unary("gelu", h)

    def _qk_norm(self, g: Any, x: Any, scale: Any) -> Any:
        return g.mul(g.rms_norm(x, EPS), scale)

    def _attention(self, g: Any, q: Any, k: Any, v: Any, state: dict[str, Any]) -> Any:
        """q, k, v ``(1, N, H, hd)`` -> ``(1, N, D)`` with RoPE on q and k."""
        q = apply_rope(g, q, state["pe_cos"], state["pe_sin"])
        k = apply_rope(g, k, state["pe_cos"], state["pe_sin"])
        perm = (0, 2, 1, 3)  # heads as views: gr.attention copies them only for a path that needs it
        return gr.attention(g, g.permute(q, perm), g.permute(k, perm), g.permute(v, perm),
                            flash=gr.dit_flash(g, self.flash))

    # ------------------------------------------------------------------ ModuleGraph
    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        c = self.cfg
        temb = g.timestep_embedding(g.scale(inputs["t"], 1000.0), 256)
        vec = self._mlp_embed(g, w, temb, "time_in")
        if c.guidance:
            gemb = g.timestep_embedding(g.scale(inputs["guidance"], 1000.0), 256)
            vec = g.add(vec, self._mlp_embed(g, w, gemb, "guidance_in"))
        vec = g.add(vec, self._mlp_embed(g, w, inputs["y"], "vector_in"))
        return {"img": self._lin(g, w, inputs["img"], c.prefix + "img_in"),
                "txt": self._lin(g, w, inputs["txt"], c.prefix + "txt_in"),
                "vec": vec, "pe_cos": inputs["pe_cos"], "pe_sin": inputs["pe_sin"]}

    def build_block(self, g: Any, w: Any, i: int, state: dict[str, Any]) -> dict[str, Any]:
        return self._double(g, w, i, state) if i < self.cfg.n_double else self._single(g, w, i, state)

    def _double(self, g: Any, w: Any, i: int, state: dict[str, Any]) -> dict[str, Any]:
        c, p = self.cfg, f"{self.cfg.prefix}double_blocks.{i}."
        streams = {}
        for s in ("txt", "img"):
            mod = self._mods(g, w, i, s, state)
            x = state[s]
            qkv = self._lin(g, w, self._modulate(g, x, mod[0], mod[1]), p + s + "_attn.qkv")
            q = self._qk_norm(g, self._heads(g, qkv, 0, 3), w(p + s + "_attn.norm.query_norm.scale"))
            k = self._qk_norm(g, self._heads(g, qkv, 1, 3), w(p + s + "_attn.norm.key_norm.scale"))
            streams[s] = (x, mod, q, k, self._heads(g, qkv, 2, 3))
        nt = state["txt"].shape[1]
        ni = state["img"].shape[1]
        q, k, v = (g.concat(streams["txt"][j], streams["img"][j], 1) for j in (2, 3, 4))
        attn = self._attention(g, q, k, v, state)  # (1, nt + ni, D)
        d = c.width
        parts = {"txt": g.cont(g.view(attn, (1, nt, d), ((nt + ni) * d * 4, d * 4, 4), 0)),
                 "img": g.cont(g.view(attn, (1, ni, d), ((nt + ni) * d * 4, d * 4, 4), nt * d * 4))}
        out = dict(state)
        for s in ("txt", "img"):
            x, mod, *_ = streams[s]
            x = g.add(x, g.mul(self._lin(g, w, parts[s], p + s + "_attn.proj"), mod[2]))
            h = self._lin(g, w, self._modulate(g, x, mod[3], mod[4]), p + s + "_mlp.0")
            h = self._lin(g, w, self._mlp_act(g, h), p + s + "_mlp.2")
            out[s] = g.add(x, g.mul(h, mod[5]))
        return out

    def _single(self, g: Any, w: Any, i: int, state: dict[str, Any]) -> dict[str, Any]:
        c = self.cfg
        p = f"{c.prefix}single_blocks.{i - c.n_double}."
        out = dict(state)
        nt = state["txt"].shape[1]
        x = g.concat(state["txt"], state["img"], 1)
        _, n, d = x.shape
        shift, scale, gate = self._mods(g, w, i, "single", state)
        h = self._lin(g, w, self._modulate(g, x, shift, scale), p + "linear1")  # (1, n, 3D + mlp)
        q = self._qk_norm(g, self._heads(g, h, 0, 3), w(p + "norm.query_norm.scale"))
        k = self._qk_norm(g, self._heads(g, h, 1, 3), w(p + "norm.key_norm.scale"))
        v = self._heads(g, h, 2, 3)
        attn = self._attention(g, q, k, v, state)
        total = h.shape[2]
        mlp = g.cont(g.view(h, (1, n, total - 3 * d), (n * total * 4, total * 4, 4), 3 * d * 4))
        y = self._lin(g, w, g.concat(attn, self._mlp_act(g, mlp), 2), p + "linear2")
        x = g.add(x, g.mul(y, gate))
        st = (n * d * 4, d * 4, 4)
        out["txt"] = g.cont(g.view(x, (1, nt, d), st, 0))
        out["img"] = g.cont(g.view(x, (1, n - nt, d), st, nt * d * 4))
        return out

    def build_post(self, g: Any, w: Any, state: dict[str, Any]) -> dict[str, Any]:
        c = self.cfg
        img = state["img"]
        shift, scale = self._mods(g, w, c.n_double + c.n_single, "final", state)
        return {"out": self._lin(g, w, self._modulate(g, img, shift, scale), c.prefix + "final_layer.linear")}
