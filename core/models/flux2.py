"""The FLUX.2 DiT (klein 4B / 9B; the dev model shares it) in the BFL layout as a
block-structured ggml graph.

Layout (``flux-2-klein-4b.safetensors``, with or without ``model.diffusion_model.``; no
tensor has a bias): ``img_in``, ``txt_in``, ``time_in.{in,out}_layer``, ``guidance_in`` (dev
only, not klein), the shared modulations ``double_stream_modulation_img.lin``,
``double_stream_modulation_txt.lin``, ``single_stream_modulation.lin``,
``double_blocks.N.{img,txt}_{attn.qkv, attn.norm.{query,key}_norm.scale, attn.proj, mlp.0,
mlp.2}``, ``single_blocks.N.{linear1, linear2, norm.{query,key}_norm.scale}``,
``final_layer.{adaLN_modulation.1, linear}``.

Forward pass (Black Forest Labs' ``flux2``; diffusers ``Flux2Transformer2DModel``;
stable-diffusion.cpp ``flux.hpp`` with ``share_modulation`` and ``use_mlp_silu_act``): FLUX.1's
double and single blocks (:class:`sdplan.core.models.flux.FluxDiT`) with three differences:

* modulation is shared: ``vec = time_in(emb(1000 sigma))`` (no pooled vector, no guidance in
  klein) gives one ``lin(silu(vec))`` per stream kind, the same (shift, scale, gate) for every
  double block's image stream, every double block's text stream, every single block; the
  graph makes them and the final layer's (shift, scale) once, before the blocks, as one table
  ``mods`` ``(1, 17 D)`` every block reads (the state a layer split or a segment cut carries);
* MLPs are SwiGLU with the gate first (``mlp.0`` / ``linear1``'s MLP part is 2F wide,
  :func:`sdplan.core.runtime.graph.swiglu`), F = 3 x width;
* RoPE has four axes (time, row, column, text index) of hd/4 channels each, base 2000:
  text token ``l`` at ``(0, 0, 0, l)``, latent cell at row ``r``, column ``c`` at
  ``(0, r, c, 0)``, reference image ``k`` (0-based) at ``(10 (k + 1), r, c, 0)``
  (:func:`position_ids`; sd-cli's ``RefIndexMode::INCREASE`` with ``ref_index_scale`` 10).

Latents: the DiT works on the 128-channel latent (the autoencoder's 32 channels patchified
2x2, :func:`sdplan.core.models.flux.patchify`'s channel order) with patch size 1: one token
per latent cell, ``(1, 128, h, w)`` -> ``(1, h w, 128)`` (:func:`tokens`). Reference-image
latents are appended after the image tokens; the output keeps only the image tokens' rows
(the caller drops the rest).

Blocks for layer split: double blocks 0..D-1, then single blocks as D..D+S-1 (klein 4B:
5 + 20, 9B: 8 + 24).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sdplan.core.models.base import ModelLayoutError, Weights, check_block
from sdplan.core.models.flux import FluxConfig, FluxDiT, find_prefix, rope_tables
from sdplan.core.runtime import graph as gr

__all__ = ["Flux2DiT", "flux2_config", "tokens", "untokens", "position_ids", "patchify_latent",
           "unpatchify_latent", "THETA", "REF_INDEX_SCALE", "MARKER"]

#: FLUX.2's RoPE base and the time-axis step between reference images.
THETA = 2000.0
REF_INDEX_SCALE = 10
#: A tensor only FLUX.2 DiTs have (stable-diffusion.cpp's test for the family).
MARKER = "double_stream_modulation_img.lin.weight"
_SHARED = ("double_stream_modulation_img.lin", "double_stream_modulation_txt.lin", "single_stream_modulation.lin")
#: Rows (first, count) of each kind's vectors in the modulation table (:meth:`Flux2DiT._mods`).
_MOD_ROWS = {"img": (0, 6), "txt": (6, 6), "single": (12, 3), "final": (15, 2)}


def flux2_config(weights: Mapping[str, Any], axes: Sequence[int] | None = None) -> FluxConfig:
    """Infer the :class:`~sdplan.core.models.flux.FluxConfig` of a FLUX.2 DiT from ``weights``
    (tensors or shape tuples): width and latent channels from ``img_in``, the LLM width from
    ``txt_in``, the head width from the q-norm (heads = width / head width), the MLP width F
    from ``img_mlp.2``, ``guidance`` when ``guidance_in`` exists; RoPE ``axes`` when given,
    else four of hd/4 ((32, 32, 32, 32) for the published 128). ``pooled`` is 0.

    Raises:
        ModelLayoutError: not a FLUX.2 DiT (no shared modulation), blocks not numbered
            0..N-1, or axes that are not even widths summing to the head width.
    """
    p = find_prefix(weights)
    w = Weights(weights, p)
    if MARKER not in w:
        raise ModelLayoutError(f"not a FLUX.2 DiT: {MARKER!r} missing (FLUX.1 and Chroma modulate per block)")
    width, cin = w.shape("img_in.weight")
    dbl, sgl = w.indices("double_blocks."), w.indices("single_blocks.")
    for name, idx in (("double_blocks", dbl), ("single_blocks", sgl)):
        if idx != list(range(len(idx))):
            raise ModelLayoutError(f"FLUX.2 {name} are not numbered 0..N-1: {idx[:8]}")
    hd = w.shape("double_blocks.0.img_attn.norm.query_norm.scale")[0]
    if hd <= 0 or width % hd:
        raise ModelLayoutError(f"FLUX.2 width {width} is not divisible by the head width {hd}")
    ax = tuple(int(a) for a in axes) if axes is not None else (hd // 4,) * 4
    if sum(ax) != hd or any(a <= 0 or a % 2 for a in ax):
        raise ModelLayoutError(f"FLUX.2 RoPE axes {ax} must be even widths summing to the head width {hd}")
    return FluxConfig(p, cin, width, width // hd, w.shape("double_blocks.0.img_mlp.2.weight")[1],
                      w.shape("txt_in.weight")[1], 0, len(dbl), len(sgl), "guidance_in.in_layer.weight" in w, ax)


def tokens(latent: np.ndarray) -> np.ndarray:
    """``(1, C, h, w)`` -> ``(1, h w, C)`` float32 (patch size 1, row-major cells).

    Raises:
        ValueError: not a 4-D single latent.
    """
    lat = np.asarray(latent, dtype=np.float32)
    if lat.ndim != 4 or lat.shape[0] != 1:
        raise ValueError(f"FLUX.2 latent must be (1, C, h, w), got {lat.shape}")
    return np.ascontiguousarray(lat.reshape(1, lat.shape[1], -1).transpose(0, 2, 1))


def untokens(x: np.ndarray, h: int, w: int) -> np.ndarray:
    """Inverse of :func:`tokens` for the first ``h w`` rows of ``x`` ``(1, N >= h w, C)``."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 3 or x.shape[1] < h * w:
        raise ValueError(f"FLUX.2 tokens {x.shape} do not cover a {h}x{w} latent")
    return np.ascontiguousarray(x[:, : h * w].transpose(0, 2, 1).reshape(1, x.shape[2], h, w))


def patchify_latent(z: np.ndarray) -> np.ndarray:
    """The autoencoder's latent ``(1, C, H, W)`` -> the diffusion latent ``(1, 4C, H/2, W/2)``
    float32, channel ``4c + 2dy + dx`` (diffusers ``_patchify_latents``; sd-cli's FLUX.2
    ``AutoEncoderKLModel::encode``).

    Raises:
        ValueError: not 4-D or odd H/W.
    """
    z = np.asarray(z, dtype=np.float32)
    if z.ndim != 4 or z.shape[2] % 2 or z.shape[3] % 2:
        raise ValueError(f"FLUX.2 autoencoder latent must be (N, C, H, W) with even H and W, got {z.shape}")
    n, c, h, w = z.shape
    x = z.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 1, 3, 5, 2, 4)
    return np.ascontiguousarray(x.reshape(n, 4 * c, h // 2, w // 2))


def unpatchify_latent(x: np.ndarray) -> np.ndarray:
    """Inverse of :func:`patchify_latent`: ``(1, 4C, h, w)`` -> ``(1, C, 2h, 2w)`` float32."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 4 or x.shape[1] % 4:
        raise ValueError(f"FLUX.2 diffusion latent must be (N, 4C, h, w), got {x.shape}")
    n, c4, h, w = x.shape
    z = x.reshape(n, c4 // 4, 2, 2, h, w).transpose(0, 1, 4, 2, 5, 3)
    return np.ascontiguousarray(z.reshape(n, c4 // 4, 2 * h, 2 * w))


def _cells(h: int, w: int, index: float) -> np.ndarray:
    ids = np.zeros((h, w, 4))
    ids[..., 0] = index
    ids[..., 1] = np.arange(h)[:, None]
    ids[..., 2] = np.arange(w)[None, :]
    return ids.reshape(-1, 4)


def position_ids(n_txt: int, h: int, w: int, refs: Sequence[tuple[int, int]] = ()) -> np.ndarray:
    """Position ids ``(n_txt + h w + sum of ref cells, 4)`` of ``[text, image, refs...]`` (see
    the module docstring); ``refs`` are the reference latents' ``(h, w)``."""
    txt = np.zeros((n_txt, 4))
    txt[:, 3] = np.arange(n_txt)
    parts = [txt, _cells(h, w, 0)]
    parts += [_cells(rh, rw, REF_INDEX_SCALE * (k + 1)) for k, (rh, rw) in enumerate(refs)]
    return np.concatenate(parts)


class Flux2DiT(FluxDiT):
    """The FLUX.2 DiT as a :class:`sdplan.core.models.ModuleGraph` (module docstring).

    Inputs (:meth:`inputs` builds them): ``img`` f32 ``(1, N + M, C)`` (image then reference
    tokens), ``txt`` f32 ``(1, T, context)``, ``t`` f32 ``(1,)`` (sigma), ``guidance`` f32
    ``(1,)`` (dev only), ``pe_cos``/``pe_sin`` f32 ``(T + N + M, 1, hd/2, 1)``. Output ``out``
    f32 ``(1, N + M, C)``: its first N rows are the velocity ``noise - x0`` of the image tokens.
    """

    def __init__(self, cfg: FluxConfig, flash: bool = False) -> None:
        super().__init__(cfg, flash)

    @classmethod
    def from_weights(cls, weights: Mapping[str, Any], heads: int | None = None,  # type: ignore[override]
                     axes: Sequence[int] | None = None, flash: bool = False) -> Flux2DiT:
        """The DiT for ``weights`` (names -> tensors or shapes); see :func:`flux2_config`.
        ``heads`` must be None or agree with the q-norm's head width.

        Raises:
            ModelLayoutError: as :func:`flux2_config`, or a ``heads`` that disagrees.
        """
        cfg = flux2_config(weights, axes)
        if heads is not None and heads != cfg.heads:
            raise ModelLayoutError(f"FLUX.2 DiT has {cfg.heads} heads of {cfg.head_dim} (q-norm), not {heads}")
        return cls(cfg, flash)

    # ------------------------------------------------------------------ names
    def block_tensors(self, i: int) -> list[str]:
        check_block(self, i)
        c = self.cfg
        if i < c.n_double:
            p = f"{c.prefix}double_blocks.{i}."
            return [f"{p}{s}_{n}" for s in ("img", "txt") for n in (
                "attn.qkv.weight", "attn.proj.weight", "mlp.0.weight", "mlp.2.weight",
                "attn.norm.query_norm.scale", "attn.norm.key_norm.scale")]
        p = f"{c.prefix}single_blocks.{i - c.n_double}."
        return [p + n for n in ("linear1.weight", "linear2.weight", "norm.query_norm.scale", "norm.key_norm.scale")]

    def other_tensors(self) -> list[str]:
        c = self.cfg
        mods = ["img_in", "txt_in", "time_in.in_layer", "time_in.out_layer", *_SHARED,
                "final_layer.adaLN_modulation.1", "final_layer.linear"]
        if c.guidance:
            mods += ["guidance_in.in_layer", "guidance_in.out_layer"]
        return [f"{c.prefix}{m}.weight" for m in mods]

    # ------------------------------------------------------------------ inputs
    def inputs(self, latent: np.ndarray, context: np.ndarray, sigma: float,  # type: ignore[override]
               refs: Sequence[np.ndarray] = (), guidance: float | None = None) -> dict[str, np.ndarray]:
        """Graph input arrays for a latent ``(1, C, h, w)``, LLM states ``(1, T, context)``,
        ``sigma`` in [0, 1], reference latents ``(1, C, rh, rw)`` and the distilled guidance
        (dev only; klein has none).

        Raises:
            ValueError: shapes that do not fit the model.
        """
        c = self.cfg
        img = tokens(latent)
        ctx = np.asarray(context, dtype=np.float32)
        if img.shape[2] != c.in_channels:
            raise ValueError(f"FLUX.2 latent has {img.shape[2]} channels, the model takes {c.in_channels}")
        if ctx.ndim != 3 or ctx.shape[0] != 1 or ctx.shape[1] < 1 or ctx.shape[2] != c.context:
            raise ValueError(f"FLUX.2 context must be (1, T, {c.context}), got {ctx.shape}")
        ref_tokens = [tokens(r) for r in refs]
        if any(r.shape[2] != c.in_channels for r in ref_tokens):
            raise ValueError(f"FLUX.2 reference latents must have {c.in_channels} channels")
        h, w = latent.shape[2:]
        ids = position_ids(ctx.shape[1], h, w, [tuple(r.shape[2:]) for r in refs])  # type: ignore[misc]
        cos, sin = rope_tables(ids, c.axes, THETA)
        out = {"img": np.concatenate([img, *ref_tokens], axis=1), "txt": ctx, "t": np.array([sigma], np.float32),
               "pe_cos": cos[:, None, :, None].copy(), "pe_sin": sin[:, None, :, None].copy()}
        if c.guidance:
            out["guidance"] = np.array([4.0 if guidance is None else guidance], np.float32)
        return out

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        need = {"img", "txt", "t", "pe_cos", "pe_sin"} | ({"guidance"} if self.cfg.guidance else set())
        if not need <= set(shapes):
            raise ValueError(f"FLUX.2: inputs {sorted(need - set(shapes))} missing")
        return {k: (tuple(shapes[k]), "f32") for k in need}

    # ------------------------------------------------------------------ graph pieces
    def _lin(self, g: Any, w: Any, x: Any, name: str) -> Any:
        return gr.linear(g, x, w(name + ".weight"))

    def _mlp_act(self, g: Any, h: Any) -> Any:
        return gr.swiglu(g, h)

    def _mods(self, g: Any, w: Any, i: int, kind: str, state: dict[str, Any]) -> list[Any]:
        """Vectors ``(1, 1, D)`` of the table ``mods`` ``(1, 17 D)`` built once in
        :meth:`build_pre`: the image stream's 6, the text stream's 6, the single blocks' 3, the
        final layer's 2 (shift, scale, gate of attention then MLP; shift, scale)."""
        first, n = _MOD_ROWS[kind]
        mods = state["mods"]
        d = self.cfg.width
        total = mods.shape[-1]
        return [g.reshape(g.cont(g.view(mods, (1, d), (total * 4, 4), (first + k) * d * 4)), (1, 1, d))
                for k in range(n)]

    # ------------------------------------------------------------------ ModuleGraph
    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        c = self.cfg
        vec = self._mlp_embed(g, w, g.timestep_embedding(g.scale(inputs["t"], 1000.0), 256), "time_in")
        if c.guidance:
            gemb = g.timestep_embedding(g.scale(inputs["guidance"], 1000.0), 256)
            vec = g.add(vec, self._mlp_embed(g, w, gemb, "guidance_in"))
        svec = g.unary("silu", vec)
        mods = None
        for name in (*_SHARED, "final_layer.adaLN_modulation.1"):  # every block uses the one table
            m = self._lin(g, w, svec, c.prefix + name)
            mods = m if mods is None else g.concat(mods, m, 1)
        return {"img": self._lin(g, w, inputs["img"], c.prefix + "img_in"),
                "txt": self._lin(g, w, inputs["txt"], c.prefix + "txt_in"),
                "mods": mods, "pe_cos": inputs["pe_cos"], "pe_sin": inputs["pe_sin"]}
