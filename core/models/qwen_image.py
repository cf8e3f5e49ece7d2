"""The Qwen-Image MMDiT (Qwen-Image and its Edit models) as a block-structured ggml graph.

Layout (``qwen_image_bf16.safetensors`` and the ``qwen-image-Q8_0.gguf`` files: diffusers'
names, with or without ``model.diffusion_model.``): ``img_in``, ``txt_norm`` (RMS norm of the
LLM states), ``txt_in``, ``time_text_embed.timestep_embedder.linear_{1,2}``,
``transformer_blocks.N.{img_mod.1, txt_mod.1, attn.{to_q, to_k, to_v, add_q_proj, add_k_proj,
add_v_proj, norm_q, norm_k, norm_added_q, norm_added_k, to_out.0, to_add_out},
img_mlp.net.{0.proj, 2}, txt_mlp.net.{0.proj, 2}}``, ``norm_out.linear``, ``proj_out``.

Forward pass (diffusers ``QwenImageTransformer2DModel``; stable-diffusion.cpp
``qwen_image.hpp``): ``temb = linear_2(silu(linear_1(emb(1000 sigma))))`` with the 256-wide
sinusoidal embedding ``[cos, sin]``; the image tokens ``img_in(x)``, the text tokens
``txt_in(rms_norm(states) * txt_norm)``. Each block modulates its image and text streams with
their own ``(shift, scale, gate) x 2`` from ``img_mod.1(silu(temb))`` / ``txt_mod.1(...)``
after a LayerNorm without affine weights (eps 1e-6), projects q, k, v of each stream
separately (biases), RMS-norms q and k per head (eps 1e-6), rotates them (RoPE) and attends
over ``[text, image]`` jointly; ``to_add_out`` / ``to_out.0`` project the two parts back, each
gated into its stream; the MLPs are GELU (tanh) 4x. The output ``proj_out(norm(x) (1 + scale)
+ shift)`` with ``(scale, shift)`` (in that order) from ``norm_out.linear(silu(temb))``.

RoPE (:func:`position_ids`, theta 10000, axes (16, 56, 56) of the 128-wide heads; the pairs
``(2i, 2i+1)`` turn, as FLUX.1's): an image patch at row ``r`` and column ``c`` of an
``h x w`` patch grid is at ``(0, r - h // 2, c - w // 2)`` (centred, sd-cli's
``gen_qwen_image_ids``), text token ``l`` at ``(s + l, s + l, s + l)`` with ``s = max(h, w)
// 2``. Reference latents (Edit) follow the image at frame index 1, 2, ... each centred on its
own grid (sd-cli's ``RefIndexMode::INCREASE``).

Qwen-Image-Edit-2511 (``zero_cond_t``; diffusers ``QwenImageTransformer2DModel(zero_cond_t=True)``,
sd-cli's ``--model-args qwen_image_zero_cond_t=true`` or a ``__index_timestep_zero__`` tensor in
the file, :data:`ZERO_COND_MARKER`): the image stream's modulation of the reference tokens comes
from the time embedding of ``t = 0``, the image tokens' from ``t``; the text stream and the
output norm take ``t``'s.

Latents: the 16-channel latent ``(1, 16, H, W)`` is patchified 2x2 into ``(1, HW/4, 64)``
(FLUX.1's order, :func:`sdplan.core.models.flux.patchify`); reference latents' tokens are
appended after the image's, and only the image's rows of the output are the velocity.

Blocks for layer split: the ``transformer_blocks`` (60 in Qwen-Image).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sdplan.core.models.base import ModelLayoutError, Weights, check_block, diffusion_prefix
from sdplan.core.models.flux import apply_rope, patchify, rope_tables, unpatchify
from sdplan.core.runtime import graph as gr

__all__ = ["QwenImageConfig", "QwenImageDiT", "qwen_image_config", "position_ids", "MARKER", "THETA", "AXES",
           "ZERO_COND_MARKER"]

#: A tensor every Qwen-Image DiT has (sd-cli's test for the family).
MARKER = "transformer_blocks.0.img_mod.1.weight"
#: The tensor whose presence marks a Qwen-Image-Edit-2511 file (sd-cli sets ``zero_cond_t`` from it).
ZERO_COND_MARKER = "__index_timestep_zero__"
THETA = 10000.0
#: The published RoPE widths (frame, row, column) of the 128-wide heads.
AXES = (16, 56, 56)
EPS = 1e-6
_ATTN = ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out")


@dataclass(frozen=True)
class QwenImageConfig:
    """Hyper-parameters of a Qwen-Image DiT (inferred by :func:`qwen_image_config`): the name
    ``prefix``, ``in_channels`` (64: 16 latent channels x 2x2), ``width`` (3072), ``heads``
    (24), ``context`` (the LLM width, 3584), ``mlp`` (4 x width), ``n_blocks`` (60), RoPE
    ``axes``."""

    prefix: str
    in_channels: int
    width: int
    heads: int
    context: int
    mlp: int
    n_blocks: int
    axes: tuple[int, ...]

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


def qwen_image_config(weights: Mapping[str, Any], axes: Sequence[int] | None = None) -> QwenImageConfig:
    """Infer a :class:`QwenImageConfig` from ``weights`` (tensors or shape tuples): width and
    input channels from ``img_in``, the LLM width from ``txt_in``, the head width from
    ``norm_q`` (heads = width / head width), the MLP width from ``img_mlp.net.0.proj``; RoPE
    ``axes`` when given, else :data:`AXES` scaled to the head width (hd/8, 7hd/16, 7hd/16).

    Raises:
        ModelLayoutError: not a Qwen-Image DiT, Qwen-Image-Layered (its extra time
            condition), blocks not numbered 0..N-1, or axes that are not three even widths
            summing to the head width.
    """
    p = diffusion_prefix(weights, (MARKER, "img_in.weight", "txt_norm.weight"), "Qwen-Image DiT")
    w = Weights(weights, p)
    if "time_text_embed.addition_t_embedding.weight" in w:
        raise ModelLayoutError("Qwen-Image-Layered (time_text_embed.addition_t_embedding) is not run by sdplan")
    width, cin = w.shape("img_in.weight")
    blocks = w.indices("transformer_blocks.")
    if blocks != list(range(len(blocks))):
        raise ModelLayoutError(f"Qwen-Image transformer_blocks are not numbered 0..N-1: {blocks[:8]}")
    hd = w.shape("transformer_blocks.0.attn.norm_q.weight")[0]
    if hd <= 0 or width % hd:
        raise ModelLayoutError(f"Qwen-Image width {width} is not divisible by the head width {hd}")
    a0 = hd // 8
    ax: tuple[int, ...] = ((a0, (hd - a0) // 2, hd - a0 - (hd - a0) // 2) if axes is None
                           else tuple(int(a) for a in axes))
    if len(ax) != 3 or sum(ax) != hd or any(a <= 0 or a % 2 for a in ax):
        raise ModelLayoutError(f"Qwen-Image RoPE axes {ax} must be three even widths summing to the head width {hd}")
    return QwenImageConfig(p, cin, width, width // hd, w.shape("txt_in.weight")[1],
                           w.shape("transformer_blocks.0.img_mlp.net.0.proj.weight")[0], len(blocks), ax)


def _grid(h: int, w: int, index: float) -> np.ndarray:
    ids = np.zeros((h, w, 3))
    ids[..., 0] = index
    ids[..., 1] = (np.arange(h) - h // 2)[:, None]
    ids[..., 2] = (np.arange(w) - w // 2)[None, :]
    return ids.reshape(-1, 3)


def position_ids(n_txt: int, h: int, w: int, refs: Sequence[tuple[int, int]] = ()) -> np.ndarray:
    """Position ids ``(n_txt + h w + sum of ref cells, 3)`` of ``[text, image, refs...]`` for
    an ``h x w`` patch grid and reference grids ``refs`` (module docstring)."""
    start = max(h, w) // 2
    txt = np.repeat((start + np.arange(n_txt, dtype=np.float64))[:, None], 3, axis=1)
    parts = [txt, _grid(h, w, 0)] + [_grid(rh, rw, k + 1) for k, (rh, rw) in enumerate(refs)]
    return np.concatenate(parts)


class QwenImageDiT:
    """The DiT as a :class:`sdplan.core.models.ModuleGraph` (module docstring).

    Inputs (:meth:`inputs`): ``img`` f32 ``(1, N + M, 64)`` (image then reference tokens),
    ``txt`` f32 ``(1, T, context)``, ``t`` f32 ``(1,)`` (sigma), ``pe_cos``/``pe_sin`` f32
    ``(T + N + M, 1, hd/2, 1)``; with ``zero_cond_t`` and reference latents ``t`` is
    ``(2,)`` (sigma, 0) and ``mod_index`` f32 ``(1, N + M, 1)`` is 0 on the image's tokens, 1 on
    the references'. Output ``out`` f32 ``(1, N + M, 64)``: its first N rows are the velocity
    ``noise - x0`` of the image tokens.
    """

    #: The CPU bf16 kernels with which this module's f16/bf16 weights run in bf16: FLUX.1's
    #: (the same double-stream blocks, linear layers and attention; bench/bench_cpu_bf16_families.py
    #: measured FLUX.1 and FLUX.2 klein, not this model).
    cpu_bf16_kernels: tuple[str, ...] = ("amx", "avx512_fast")

    def __init__(self, cfg: QwenImageConfig, flash: bool = False, zero_cond_t: bool = False) -> None:
        self.cfg = cfg
        self.flash = flash
        self.n_blocks = cfg.n_blocks
        #: Qwen-Image-Edit-2511's reference tokens modulated at ``t = 0`` (module docstring)
        self.zero_cond_t = zero_cond_t

    @classmethod
    def from_weights(cls, weights: Mapping[str, Any], axes: Sequence[int] | None = None,
                     flash: bool = False, zero_cond_t: bool | None = None) -> QwenImageDiT:
        """The DiT for ``weights`` (names -> tensors or shapes); see :func:`qwen_image_config`.
        ``zero_cond_t`` None: set when the file has :data:`ZERO_COND_MARKER` (as sd-cli)."""
        if zero_cond_t is None:
            zero_cond_t = any(n.endswith(ZERO_COND_MARKER) for n in weights)
        return cls(qwen_image_config(weights, axes), flash, zero_cond_t)

    # ------------------------------------------------------------------ names
    def block_tensors(self, i: int) -> list[str]:
        check_block(self, i)
        p = f"{self.cfg.prefix}transformer_blocks.{i}."
        lin = ["img_mod.1", "txt_mod.1", *(f"attn.{n}" for n in _ATTN), "img_mlp.net.0.proj", "img_mlp.net.2",
               "txt_mlp.net.0.proj", "txt_mlp.net.2"]
        names = [f"{p}{n}.{k}" for n in lin for k in ("weight", "bias")]
        return names + [f"{p}attn.{n}.weight" for n in ("norm_q", "norm_k", "norm_added_q", "norm_added_k")]

    def other_tensors(self) -> list[str]:
        p = self.cfg.prefix
        lin = ["img_in", "txt_in", "time_text_embed.timestep_embedder.linear_1",
               "time_text_embed.timestep_embedder.linear_2", "norm_out.linear", "proj_out"]
        return [f"{p}{n}.{k}" for n in lin for k in ("weight", "bias")] + [f"{p}txt_norm.weight"]

    # ------------------------------------------------------------------ inputs
    def inputs(self, latent: np.ndarray, context: np.ndarray, sigma: float,
               refs: Sequence[np.ndarray] = ()) -> dict[str, np.ndarray]:
        """Graph input arrays for a latent ``(1, 16, H, W)`` (even H, W), LLM states
        ``(1, T, context)``, ``sigma`` in [0, 1] and reference latents ``(1, 16, rh, rw)``.

        Raises:
            ValueError: shapes that do not fit the model.
        """
        c = self.cfg
        img = patchify(latent)
        ctx = np.asarray(context, dtype=np.float32)
        if img.shape[2] != c.in_channels:
            raise ValueError(f"Qwen-Image latent gives {img.shape[2]} patch channels, the model takes {c.in_channels}")
        if ctx.ndim != 3 or ctx.shape[0] != 1 or ctx.shape[1] < 1 or ctx.shape[2] != c.context:
            raise ValueError(f"Qwen-Image context must be (1, T, {c.context}), got {ctx.shape}")
        ref_tokens = [patchify(r) for r in refs]
        if any(r.shape[2] != c.in_channels for r in ref_tokens):
            raise ValueError(f"Qwen-Image reference latents must give {c.in_channels} patch channels")
        h, w = latent.shape[2] // 2, latent.shape[3] // 2
        ids = position_ids(ctx.shape[1], h, w, [(r.shape[2] // 2, r.shape[3] // 2) for r in refs])
        cos, sin = rope_tables(ids, c.axes, THETA)
        out = {"img": np.concatenate([img, *ref_tokens], axis=1), "txt": ctx, "t": np.array([sigma], np.float32),
               "pe_cos": cos[:, None, :, None].copy(), "pe_sin": sin[:, None, :, None].copy()}
        if self.zero_cond_t and ref_tokens:
            out["t"] = np.array([sigma, 0.0], np.float32)
            index = np.zeros((1, out["img"].shape[1], 1), np.float32)
            index[:, img.shape[1]:] = 1.0
            out["mod_index"] = index
        return out

    def velocity(self, out: np.ndarray, h: int, w: int) -> np.ndarray:
        """The velocity ``(1, 16, h, w)`` of the graph's ``out`` (the image tokens' rows)."""
        return unpatchify(np.asarray(out)[:, : (h // 2) * (w // 2)], h, w)

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        need = {"img", "txt", "t", "pe_cos", "pe_sin"}
        if not need <= set(shapes):
            raise ValueError(f"Qwen-Image: inputs {sorted(need - set(shapes))} missing")
        return {k: (tuple(shapes[k]), "f32") for k in need | ({"mod_index"} & set(shapes))}

    # ------------------------------------------------------------------ graph pieces
    def _lin(self, g: Any, w: Any, x: Any, name: str) -> Any:
        return gr.linear(g, x, w(name + ".weight"), w(name + ".bias"))

    def _chunks(self, g: Any, x: Any, n: int, row: int = 0) -> list[Any]:
        """Row ``row`` of ``(R, n*D)`` -> n tensors ``(1, 1, D)``."""
        d = x.shape[-1] // n
        return [g.reshape(g.cont(g.view(x, (1, d), (n * d * 4, 4), (row * n + k) * d * 4)), (1, 1, d))
                for k in range(n)]

    def _img_mod(self, g: Any, mod: Any, index: Any) -> list[Any]:
        """The image stream's 6 modulation tensors from ``img_mod.1``'s output ``(R, 6D)``: row
        0's ``(1, 1, D)``; with a ``mod_index`` ``(1, N + M, 1)``, row 0's on the image's tokens
        and row 1's (``t = 0``) on the references', ``(1, N + M, D)``."""
        m0 = self._chunks(g, mod, 6)
        if index is None:
            return m0
        m1 = self._chunks(g, mod, 6, 1)
        index = g.repeat(index, (1, index.shape[1], m0[0].shape[2]))  # ggml broadcasts the smaller only
        return [g.add(a, g.mul(index, g.sub(b, a))) for a, b in zip(m0, m1, strict=True)]

    def _modulate(self, g: Any, x: Any, shift: Any, scale: Any) -> Any:
        y = g.norm(x, EPS)
        return g.add(g.add(y, g.mul(y, scale)), shift)

    def _heads(self, g: Any, w: Any, x: Any, proj: str, norm: str | None) -> Any:
        c = self.cfg
        _, n, _ = x.shape
        y = g.reshape(self._lin(g, w, x, proj), (1, n, c.heads, c.head_dim))
        return y if norm is None else g.mul(g.rms_norm(y, EPS), w(norm + ".weight"))

    # ------------------------------------------------------------------ ModuleGraph
    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        p = self.cfg.prefix + "time_text_embed.timestep_embedder."
        temb = g.timestep_embedding(g.scale(inputs["t"], 1000.0), 256)
        temb = self._lin(g, w, g.unary("silu", self._lin(g, w, temb, p + "linear_1")), p + "linear_2")
        txt = g.mul(g.rms_norm(inputs["txt"], EPS), w(self.cfg.prefix + "txt_norm.weight"))
        state = {"img": self._lin(g, w, inputs["img"], self.cfg.prefix + "img_in"),
                 "txt": self._lin(g, w, txt, self.cfg.prefix + "txt_in"),
                 "temb": temb, "pe_cos": inputs["pe_cos"], "pe_sin": inputs["pe_sin"]}
        if "mod_index" in inputs:
            state["mod_index"] = inputs["mod_index"]
        return state

    def build_block(self, g: Any, w: Any, i: int, state: dict[str, Any]) -> dict[str, Any]:
        check_block(self, i)
        c, p = self.cfg, f"{self.cfg.prefix}transformer_blocks.{i}."
        stemb = g.unary("silu", state["temb"])
        names = {"img": ("to_q", "to_k", "to_v", "norm_q", "norm_k", "to_out.0"),
                 "txt": ("add_q_proj", "add_k_proj", "add_v_proj", "norm_added_q", "norm_added_k", "to_add_out")}
        streams = {}
        for s in ("txt", "img"):
            lin = self._lin(g, w, stemb, f"{p}{s}_mod.1")
            mod = self._img_mod(g, lin, state.get("mod_index")) if s == "img" else self._chunks(g, lin, 6)
            x = state[s]
            h = self._modulate(g, x, mod[0], mod[1])
            q, k, v, nq, nk, _ = names[s]
            streams[s] = (x, mod, self._heads(g, w, h, p + "attn." + q, p + "attn." + nq),
                          self._heads(g, w, h, p + "attn." + k, p + "attn." + nk),
                          self._heads(g, w, h, p + "attn." + v, None))
        nt, ni = state["txt"].shape[1], state["img"].shape[1]
        q, k, v = (g.concat(streams["txt"][j], streams["img"][j], 1) for j in (2, 3, 4))
        q = apply_rope(g, q, state["pe_cos"], state["pe_sin"])
        k = apply_rope(g, k, state["pe_cos"], state["pe_sin"])
        perm = (0, 2, 1, 3)
        attn = gr.attention(g, g.permute(q, perm), g.permute(k, perm), g.permute(v, perm),
                            flash=gr.dit_flash(g, self.flash))  # (1, nt + ni, D)
        d = c.width
        parts = {"txt": g.cont(g.view(attn, (1, nt, d), ((nt + ni) * d * 4, d * 4, 4), 0)),
                 "img": g.cont(g.view(attn, (1, ni, d), ((nt + ni) * d * 4, d * 4, 4), nt * d * 4))}
        out = dict(state)
        for s in ("txt", "img"):
            x, mod, *_ = streams[s]
            x = g.add(x, g.mul(self._lin(g, w, parts[s], p + "attn." + names[s][5]), mod[2]))
            h = self._lin(g, w, self._modulate(g, x, mod[3], mod[4]), f"{p}{s}_mlp.net.0.proj")
            h = self._lin(g, w, g.unary("gelu", h), f"{p}{s}_mlp.net.2")
            out[s] = g.add(x, g.mul(h, mod[5]))
        return out

    def build_post(self, g: Any, w: Any, state: dict[str, Any]) -> dict[str, Any]:
        p = self.cfg.prefix
        scale, shift = self._chunks(g, self._lin(g, w, g.unary("silu", state["temb"]), p + "norm_out.linear"), 2)  # row 0: t
        return {"out": self._lin(g, w, self._modulate(g, state["img"], shift, scale), p + "proj_out")}
