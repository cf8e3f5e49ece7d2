"""The Wan 2.x DiT (Wan 2.1, Wan 2.2 T2V/I2V-A14B experts, TI2V-5B) as a block-structured ggml
graph.

Layout (the Comfy / sd-cli single files, original Wan names, with or without
``model.diffusion_model.``): ``patch_embedding`` (a 3-D convolution ``(dim, in, 1, 2, 2)``
with stride = kernel: one linear map per patch), ``text_embedding.{0,2}``,
``time_embedding.{0,2}``, ``time_projection.1``, ``blocks.N.{modulation (1, 6, dim),
self_attn.{q,k,v,o,norm_q,norm_k}, norm3 (the cross-attention's LayerNorm, affine),
cross_attn.{q,k,v,o,norm_q,norm_k}, ffn.{0,2}}``, ``head.{head, modulation (1, 2, dim)}``.

Forward pass (Wan's ``model.py``; diffusers ``WanTransformer3DModel``; stable-diffusion.cpp
``wan.hpp``): the latent video ``(1, C, F, H, W)`` cut into ``1 x 2 x 2`` patches (frame,
row, column order) and embedded; ``temb = time_embedding.2(silu(time_embedding.0(emb(1000
sigma))))`` with the 256-wide sinusoidal embedding ``[cos, sin]``, ``e = time_projection.1(
silu(temb))`` split in six; the text states through ``text_embedding.2(gelu_tanh(
text_embedding.0(.)))``. Each block: ``(shift, scale, gate, c_shift, c_scale, c_gate) =
modulation + e``; self-attention on ``LN(x) (1 + scale) + shift`` (LayerNorm without affine,
eps 1e-6) with q and k RMS-normed over the whole width (eps 1e-6, weights), rotated by 3-D
RoPE, ``x += o(.) gate``; cross-attention of ``norm3(x)`` to the text (q and k RMS-normed, no
RoPE), ``x += o(.)``; the FFN (GELU tanh) on ``LN(x) (1 + c_scale) + c_shift``,
``x += ffn(.) c_gate``. The output ``head.head(LN(x) (1 + scale) + shift)`` with ``(shift,
scale) = head.modulation + temb``, unpatchified (each patch's ``(t, h, w, C)`` values).

Per-frame timesteps (Wan 2.2 TI2V-5B's image to video; stable-diffusion.cpp ``wan.hpp`` with a
timestep per latent frame, diffusers ``expand_timesteps`` with one per token, the same value over
a frame's tokens): ``t`` of one sigma per patch frame gives ``temb`` and ``e`` per frame, and
every modulation (the blocks' six, the head's two) applies to each frame's tokens with its
frame's values (the tokens viewed as ``(frames, tokens per frame, dim)``).

RoPE (theta 10000; the head width ``d`` split into frames ``d - 4 (d // 6)``, rows and columns
``2 (d // 6)`` each; pairs ``(2i, 2i+1)`` turn): the patch at frame ``f``, row ``r``, column
``c`` is at ``(f, r, c)`` from 0.

Weights: the 5-D ``patch_embedding`` is held as the 2-D matrix ``(dim, in * 1 * 2 * 2)`` it is
(:func:`weight_file`; ggml tensors have at most four dimensions).

Blocks for layer split: the ``blocks`` (40 in the 14 B experts, 30 in TI2V-5B).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.models.base import ModelLayoutError, Weights, check_block, diffusion_prefix
from sdplan.core.models.flux import apply_rope, rope_tables
from sdplan.core.runtime import graph as gr
from sdplan.core.runtime.weights import WeightFile, runtime_dtype

__all__ = ["WanConfig", "WanDiT", "wan_config", "weight_file", "patchify", "unpatchify", "MARKER", "THETA",
           "HEAD_DIM", "HEAD_DIM_KEY"]

#: A tensor every Wan DiT has (sd-cli's test for the family).
MARKER = "blocks.0.cross_attn.norm_k.weight"
THETA = 10000.0
#: The published models' head width (5120 / 40, 3072 / 24, 1536 / 12).
HEAD_DIM = 128
#: The metadata key a small test model gives its head width under (the shapes cannot say it:
#: q and k are normed over the whole width).
HEAD_DIM_KEY = "sdplan.head_dim"
EPS = 1e-6
_PATCH = "patch_embedding.weight"


@dataclass(frozen=True)
class WanConfig:
    """Hyper-parameters of a Wan DiT (inferred by :func:`wan_config`): name ``prefix``,
    ``in_channels`` (16; 48 for TI2V-5B; 36 for I2V), ``out_channels``, ``patch`` (frames,
    rows, columns), ``width``, ``heads``, ``text`` (UMT5's 4096), ``ffn``, ``freq`` (256),
    ``n_blocks``."""

    prefix: str
    in_channels: int
    out_channels: int
    patch: tuple[int, int, int]
    width: int
    heads: int
    text: int
    ffn: int
    freq: int
    n_blocks: int

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def axes(self) -> tuple[int, int, int]:
        """RoPE widths (frames, rows, columns) of the head width."""
        d = self.head_dim
        return (d - 4 * (d // 6), 2 * (d // 6), 2 * (d // 6))

    @property
    def patch_values(self) -> int:
        return self.patch[0] * self.patch[1] * self.patch[2]


def wan_config(weights: Mapping[str, Any], head_dim: int | None = None) -> WanConfig:
    """Infer a :class:`WanConfig` from ``weights`` (tensors or shape tuples): width, inputs and
    patch from ``patch_embedding`` (5-D, or 4-D ``(dim, in, 2, 2)`` as a GGUF file stores it),
    the text width from ``text_embedding.0``, the FFN width from ``ffn.0``; heads from
    ``head_dim`` (default :data:`HEAD_DIM`).

    Raises:
        ModelLayoutError: not a Wan DiT, blocks not numbered 0..N-1, an image-conditioned
            Wan 2.1 model (``img_emb``: CLIP vision), or a width the head width does not divide.
    """
    p = diffusion_prefix(weights, (MARKER, _PATCH, "head.head.weight"), "Wan DiT")
    w = Weights(weights, p)
    if any(n.startswith("img_emb.") for n in w):
        raise ModelLayoutError("a Wan 2.1 I2V/FLF2V model (img_emb: CLIP vision embeddings) is not run by sdplan")
    pe = tuple(w.shape(_PATCH))
    if len(pe) == 5:
        width, cin, patch = pe[0], pe[1], (pe[2], pe[3], pe[4])
    elif len(pe) == 4:
        width, cin, patch = pe[0], pe[1], (1, pe[2], pe[3])
    else:
        raise ModelLayoutError(f"Wan {_PATCH} has shape {pe}, not (dim, in, 1, 2, 2)")
    blocks = w.indices("blocks.")
    if not blocks or blocks != list(range(len(blocks))):
        raise ModelLayoutError(f"Wan blocks are not numbered 0..N-1: {blocks[:8]}")
    hd = head_dim or HEAD_DIM
    if width % hd:
        raise ModelLayoutError(f"Wan width {width} is not divisible by the head width {hd}")
    out = w.shape("head.head.weight")[0] // (patch[0] * patch[1] * patch[2])
    return WanConfig(p, int(cin), int(out), patch, int(width), int(width // hd),
                     int(w.shape("text_embedding.0.weight")[1]), int(w.shape("blocks.0.ffn.0.weight")[0]),
                     int(w.shape("time_embedding.0.weight")[1]), len(blocks))


def folded_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ``name`` is held in: ``patch_embedding.weight`` as ``(dim, in * kt * kh * kw)``
    (a linear map of flattened patches), any other unchanged."""
    if name.endswith(_PATCH) and len(shape) >= 4:
        return (int(shape[0]), int(math.prod(shape[1:])))
    return tuple(shape)


def weight_file(path: str | Path, names: Iterable[str] | None = None, dtypes: Mapping[str, str] | None = None,
                backend: Any = None) -> WeightFile:
    """A :class:`~sdplan.core.runtime.weights.WeightFile` of a Wan DiT file with its patch
    embedding held 2-D (:func:`folded_shape`; the bytes are the same).

    Raises:
        ModelFileError: an unreadable file or a missing name.
    """
    wf = WeightFile(path, names, dtypes=dtypes, backend=backend)
    for n, info in wf.infos.items():
        shape = folded_shape(n, tuple(info.shape))
        if shape != tuple(info.shape):
            wf.infos[n] = replace(info, shape=shape)
            wf.dtypes[n] = wf._policy[n] = runtime_dtype(wf.infos[n], backend)
    return wf


def patchify(latent: np.ndarray, patch: tuple[int, int, int]) -> np.ndarray:
    """``(1, C, F, H, W)`` -> ``(1, F/pt * H/ph * W/pw, C * pt * ph * pw)``: patches in frame,
    row, column order, each patch's values in the kernel's ``(C, t, h, w)`` order."""
    x = np.asarray(latent, dtype=np.float32)
    _, c, f, h, w = x.shape
    pt, ph, pw = patch
    x = x.reshape(c, f // pt, pt, h // ph, ph, w // pw, pw).transpose(1, 3, 5, 0, 2, 4, 6)
    return np.ascontiguousarray(x.reshape(1, (f // pt) * (h // ph) * (w // pw), c * pt * ph * pw))


def unpatchify(out: np.ndarray, c: int, f: int, h: int, w: int, patch: tuple[int, int, int]) -> np.ndarray:
    """The head's output ``(1, N, pt * ph * pw * C)`` (each patch's ``(t, h, w, C)``) ->
    ``(1, C, F, H, W)``."""
    pt, ph, pw = patch
    x = np.asarray(out, dtype=np.float32).reshape(f // pt, h // ph, w // pw, pt, ph, pw, c)
    return np.ascontiguousarray(x.transpose(6, 0, 3, 1, 4, 2, 5).reshape(1, c, f, h, w))


def position_ids(f: int, h: int, w: int) -> np.ndarray:
    """``(f h w, 3)`` RoPE positions ``(frame, row, column)`` of the patch grid, from 0."""
    g = np.stack(np.meshgrid(np.arange(f), np.arange(h), np.arange(w), indexing="ij"), axis=-1)
    return g.reshape(-1, 3).astype(np.float64)


class WanDiT:
    """The DiT as a :class:`sdplan.core.models.ModuleGraph` (module docstring).

    Inputs (:meth:`inputs`): ``x`` f32 ``(1, N, C pt ph pw)`` patches, ``ctx`` f32 ``(1, L,
    text)``, ``t`` f32 ``(1,)`` (sigma) or ``(F / pt,)`` (a sigma per patch frame), ``pe_cos``/``pe_sin`` f32 ``(N, 1, hd/2, 1)``. Output
    ``out`` f32 ``(1, N, pt ph pw C)``; :meth:`velocity` unpatchifies it to ``noise - x0``.
    """

    #: The CPU bf16 kernels with which this module's f16/bf16 weights run in bf16: the DiTs'
    #: rule (linear layers and attention as FLUX.1's; bench/bench_cpu_bf16_families.py measured
    #: FLUX.1 and FLUX.2 klein, not this model).
    cpu_bf16_kernels: tuple[str, ...] = ("amx", "avx512_fast")

    def __init__(self, cfg: WanConfig, flash: bool = False) -> None:
        self.cfg = cfg
        self.flash = flash
        self.n_blocks = cfg.n_blocks

    @classmethod
    def from_weights(cls, weights: Mapping[str, Any], head_dim: int | None = None, flash: bool = False) -> WanDiT:
        """The DiT for ``weights`` (names -> tensors or shapes); see :func:`wan_config`."""
        return cls(wan_config(weights, head_dim), flash)

    # ------------------------------------------------------------------ names
    def block_tensors(self, i: int) -> list[str]:
        check_block(self, i)
        p = f"{self.cfg.prefix}blocks.{i}."
        lin = [f"{a}.{n}" for a in ("self_attn", "cross_attn") for n in "qkvo"] + ["norm3", "ffn.0", "ffn.2"]
        names = [f"{p}{n}.{k}" for n in lin for k in ("weight", "bias")]
        return names + [f"{p}{a}.{n}.weight" for a in ("self_attn", "cross_attn") for n in ("norm_q", "norm_k")] + \
            [p + "modulation"]

    def other_tensors(self) -> list[str]:
        p = self.cfg.prefix
        lin = ["patch_embedding", "text_embedding.0", "text_embedding.2", "time_embedding.0", "time_embedding.2",
               "time_projection.1", "head.head"]
        return [f"{p}{n}.{k}" for n in lin for k in ("weight", "bias")] + [p + "head.modulation"]

    # ------------------------------------------------------------------ inputs
    def inputs(self, latent: np.ndarray, context: np.ndarray, sigma: float,
               frame_sigmas: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Graph input arrays for a latent video ``(1, C, F, H, W)`` (H, W multiples of the
        patch), text states ``(1, L, text)`` and ``sigma`` in [0, 1]; ``frame_sigmas``: one
        sigma per patch frame ``(F / pt,)`` instead (Wan 2.2 TI2V-5B's image to video: 0 on the
        picture's frame), ``sigma`` then unused.

        Raises:
            ValueError: shapes that do not fit the model.
        """
        c = self.cfg
        lat = np.asarray(latent, dtype=np.float32)
        ctx = np.asarray(context, dtype=np.float32)
        pt, ph, pw = c.patch
        if lat.ndim != 5 or lat.shape[1] != c.in_channels or lat.shape[2] % pt or lat.shape[3] % ph or lat.shape[4] % pw:
            raise ValueError(f"Wan latent must be (1, {c.in_channels}, F, H, W) with H, W multiples of "
                             f"{ph}, got {lat.shape}")
        if ctx.ndim != 3 or ctx.shape[0] != 1 or ctx.shape[1] < 1 or ctx.shape[2] != c.text:
            raise ValueError(f"Wan context must be (1, L, {c.text}), got {ctx.shape}")
        _, _, f, h, w = lat.shape
        cos, sin = rope_tables(position_ids(f // pt, h // ph, w // pw), c.axes, THETA)
        if frame_sigmas is None:
            t = np.array([sigma], np.float32)
        else:
            t = np.asarray(frame_sigmas, np.float32).reshape(-1)
            if t.shape[0] != f // pt:
                raise ValueError(f"Wan frame sigmas: one per patch frame ({f // pt}), got {t.shape[0]}")
        return {"x": patchify(lat, c.patch), "ctx": ctx, "t": t,
                "pe_cos": cos[:, None, :, None].copy(), "pe_sin": sin[:, None, :, None].copy()}

    def velocity(self, out: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """The velocity ``(1, C_out, F, H, W)`` of the graph's ``out`` for a latent of ``shape``."""
        _, _, f, h, w = shape
        return unpatchify(out, self.cfg.out_channels, f, h, w, self.cfg.patch)

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        need = {"x", "ctx", "t", "pe_cos", "pe_sin"}
        if not need <= set(shapes):
            raise ValueError(f"Wan: inputs {sorted(need - set(shapes))} missing")
        return {k: (tuple(shapes[k]), "f32") for k in need}

    # ------------------------------------------------------------------ graph pieces
    def _lin(self, g: Any, w: Any, x: Any, name: str) -> Any:
        return gr.linear(g, x, w(name + ".weight"), w(name + ".bias"))

    def _chunks(self, g: Any, x: Any, n: int) -> list[Any]:
        """``(T, n, D)`` (contiguous f32) -> n tensors ``(T, 1, D)`` (T: 1 or the frames)."""
        t, d = x.shape[0], x.shape[-1]
        return [g.view(x, (t, 1, d), (n * d * 4, d * 4, 4), k * d * 4) for k in range(n)]

    def _by_frame(self, g: Any, x: Any, frames: int) -> Any:
        """Tokens ``(1, N, D)`` as ``(frames, N / frames, D)`` (frame-major order); unchanged for
        one frame."""
        return x if frames == 1 else g.reshape(x, (frames, x.shape[1] // frames, x.shape[2]))

    def _tokens(self, g: Any, x: Any, n: int) -> Any:
        return x if x.shape[0] == 1 else g.reshape(x, (1, n, x.shape[-1]))

    def _modulate(self, g: Any, x: Any, shift: Any, scale: Any) -> Any:
        """``LN(x) (1 + scale) + shift`` with ``shift``, ``scale`` ``(T, 1, D)`` per frame."""
        y = self._by_frame(g, g.norm(x, EPS), shift.shape[0])
        return self._tokens(g, g.add(g.add(y, g.mul(y, scale)), shift), x.shape[1])

    def _gated(self, g: Any, y: Any, gate: Any) -> Any:
        """``y * gate`` with ``gate`` ``(T, 1, D)`` per frame."""
        return self._tokens(g, g.mul(self._by_frame(g, y, gate.shape[0]), gate), y.shape[1])

    def _qk(self, g: Any, w: Any, x: Any, proj: str) -> Any:
        """``rms_norm(proj(x)) * norm`` over the whole width, as heads ``(1, N, H, hd)``."""
        c = self.cfg
        y = g.mul(g.rms_norm(self._lin(g, w, x, proj), EPS), w(proj.rsplit(".", 1)[0] + ".norm_" +
                                                              proj.rsplit(".", 1)[1] + ".weight"))
        return g.reshape(y, (1, x.shape[1], c.heads, c.head_dim))

    def _attend(self, g: Any, q: Any, k: Any, v: Any) -> Any:
        perm = (0, 2, 1, 3)
        return gr.attention(g, g.permute(q, perm), g.permute(k, perm), g.permute(v, perm),
                            flash=gr.dit_flash(g, self.flash))  # (1, Nq, D)

    # ------------------------------------------------------------------ ModuleGraph
    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        c, p = self.cfg, self.cfg.prefix
        temb = g.timestep_embedding(g.scale(inputs["t"], 1000.0), c.freq)  # (T, freq), T: 1 or the frames
        temb = self._lin(g, w, g.unary("silu", self._lin(g, w, temb, p + "time_embedding.0")), p + "time_embedding.2")
        e = self._lin(g, w, g.unary("silu", temb), p + "time_projection.1")  # (T, 6D)
        nt = inputs["t"].shape[0]
        ctx = self._lin(g, w, g.unary("gelu", self._lin(g, w, inputs["ctx"], p + "text_embedding.0")),
                        p + "text_embedding.2")
        return {"x": self._lin(g, w, inputs["x"], p + "patch_embedding"), "ctx": ctx,
                "temb": g.reshape(temb, (nt, 1, c.width)), "e": g.reshape(e, (nt, 6, c.width)),
                "pe_cos": inputs["pe_cos"], "pe_sin": inputs["pe_sin"]}

    def build_block(self, g: Any, w: Any, i: int, state: dict[str, Any]) -> dict[str, Any]:
        check_block(self, i)
        c, p = self.cfg, f"{self.cfg.prefix}blocks.{i}."
        x, ctx = state["x"], state["ctx"]
        n = x.shape[1]
        mod = self._chunks(g, g.cont(g.add(state["e"], w(p + "modulation"))), 6)
        h = self._modulate(g, x, mod[0], mod[1])
        q = apply_rope(g, self._qk(g, w, h, p + "self_attn.q"), state["pe_cos"], state["pe_sin"])
        k = apply_rope(g, self._qk(g, w, h, p + "self_attn.k"), state["pe_cos"], state["pe_sin"])
        v = g.reshape(self._lin(g, w, h, p + "self_attn.v"), (1, n, c.heads, c.head_dim))
        x = g.add(x, self._gated(g, self._lin(g, w, self._attend(g, q, k, v), p + "self_attn.o"), mod[2]))
        h = gr.layer_norm(g, x, w(p + "norm3.weight"), w(p + "norm3.bias"), EPS)
        q = self._qk(g, w, h, p + "cross_attn.q")
        k = self._qk(g, w, ctx, p + "cross_attn.k")
        v = g.reshape(self._lin(g, w, ctx, p + "cross_attn.v"), (1, ctx.shape[1], c.heads, c.head_dim))
        x = g.add(x, self._lin(g, w, self._attend(g, q, k, v), p + "cross_attn.o"))
        h = self._lin(g, w, self._modulate(g, x, mod[3], mod[4]), p + "ffn.0")
        x = g.add(x, self._gated(g, self._lin(g, w, g.unary("gelu", h), p + "ffn.2"), mod[5]))
        return {**state, "x": x}

    def build_post(self, g: Any, w: Any, state: dict[str, Any]) -> dict[str, Any]:
        p = self.cfg.prefix
        temb = state["temb"]  # (T, 1, D)
        if temb.shape[0] > 1:  # per frame: (T, 2, D) as sd-cli repeats it before adding the (1, 2, D) table
            temb = g.repeat(temb, (temb.shape[0], 2, temb.shape[2]))
        shift, scale = self._chunks(g, g.cont(g.add(temb, w(p + "head.modulation"))
                                              if temb.shape[0] > 1 else g.add(w(p + "head.modulation"), temb)), 2)
        return {"out": self._lin(g, w, self._modulate(g, state["x"], shift, scale), p + "head.head")}


def head_dim_of(metadata: Mapping[str, str]) -> int | None:
    """The head width a file's ``sdplan.head_dim`` metadata states, or None."""
    raw = metadata.get(HEAD_DIM_KEY)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def check_shapes(cfg: WanConfig, context_width: int, where: str) -> None:
    """Raise :class:`ModelLayoutError` naming ``where`` when the text encoder's width is not
    the DiT's text width."""
    if context_width != cfg.text:
        raise ModelLayoutError(f"{where}: the text encoder's width {context_width} is not the Wan DiT's text "
                               f"width {cfg.text} (Wan reads UMT5-XXL's 4096)")
