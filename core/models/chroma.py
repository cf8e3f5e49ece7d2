"""The Chroma DiT (Chroma1-HD and its relatives) as a block-structured ggml graph.

Chroma is FLUX.1 [schnell] with its modulation pruned: every per-block ``mod.lin`` /
``modulation.lin``, the final layer's ``adaLN_modulation`` and the ``time_in`` /
``vector_in`` / ``guidance_in`` embedders are gone; one *distilled guidance layer* (the
approximator) makes all the modulation vectors at once. There is no pooled CLIP vector:
Chroma is conditioned on T5-XXL alone. The double and single blocks, RoPE, patchify and the
final projection are FLUX.1's (:class:`sdplan.core.models.flux.FluxDiT`; this class only
replaces where the modulation vectors come from).

Layout (BFL names, with or without ``model.diffusion_model.``): FLUX.1's ``img_in``,
``txt_in``, ``double_blocks.N`` without ``{img,txt}_mod``, ``single_blocks.N`` without
``modulation``, ``final_layer.linear``; plus ``distilled_guidance_layer.{in_proj,
layers.K.{in_layer,out_layer}, norms.K.scale, out_proj}``.

Approximator (sd-cli ``ChromaApproximator``; diffusers ``ChromaApproximator``): its input is
``L = 3 S + 12 D + 2`` rows (S single, D double blocks: 344 for 19 + 38) of 64 values,
row ``r`` = ``[emb16(1000 sigma), emb16(0), emb32(1000 r)]`` with ``embN`` the
``[cos, sin]`` sinusoidal embedding of width N (max period 10000; sd-cli feeds guidance 0,
as diffusers does). Then ``x = in_proj(x)``, K times ``x = x + out_layer(silu(in_layer(
rms_norm(x) * scale)))`` (eps 1e-6), ``out_proj(x)``: ``L`` vectors of the model width.
Row use: single block ``j`` takes rows ``3j..3j+2`` (shift, scale, gate); double block ``i``
takes ``3S + 6i ..`` for the image stream and ``3S + 6D + 6i ..`` for the text stream (shift,
scale, gate of attention, then of the MLP); the final layer the last two (shift, scale).

Attention mask (sd-cli's ``chroma_use_dit_mask``, on by default): the T5 tokens after the
prompt's ``</s>``, except the first ``mask_pad`` of them, are masked as keys for every query
in every block. Those tokens then never reach an image token, so dropping them from the
sequence gives the same image tokens exactly: :func:`kept_tokens` counts what stays and the
pipeline passes only those rows of the T5 states (fewer tokens, no mask tensor).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from sdplan.core.models.base import ModelLayoutError
from sdplan.core.models.flux import (
    EPS,
    FluxConfig,
    FluxDiT,
    flux_config,
    image_ids,
    patchify,
    rope_tables,
)

__all__ = ["ChromaDiT", "approximator_input", "kept_tokens", "APPROX"]

APPROX = "distilled_guidance_layer."


def _embedding(t: np.ndarray, dim: int, max_period: float = 10000.0) -> np.ndarray:
    """``[cos, sin]`` sinusoidal embedding ``(len(t), dim)`` float32 as diffusers'
    ``get_timestep_embedding`` (flip_sin_to_cos, no shift) and ggml's ``timestep_embedding``
    define it: ``freq_i = exp(-ln(max_period) i / (dim/2))`` and ``arg = t * freq`` rounded to
    float32 as both compute them, then cos and sin in float64. (Their float32 cos/sin of
    arguments up to ``1000 L`` differ from the exact values by up to about 5e-4.)"""
    half = dim // 2
    freqs = np.exp(np.float32(-np.log(max_period)) * np.arange(half, dtype=np.float32)
                   / np.float32(half)).astype(np.float32)
    args = (np.asarray(t, dtype=np.float32)[:, None] * freqs[None, :]).astype(np.float32).astype(np.float64)
    return np.concatenate([np.cos(args), np.sin(args)], axis=1).astype(np.float32)


def approximator_input(sigma: float, rows: int, width: int = 64) -> np.ndarray:
    """The approximator's input ``(1, rows, width)`` float32 for ``sigma`` in [0, 1]: per row
    ``r``, the embeddings of ``1000 sigma`` and of guidance 0 (``width/4`` each) and of
    ``1000 r`` (``width/2``); see the module docstring.

    Raises:
        ValueError: ``width`` not a positive multiple of 4.
    """
    if width <= 0 or width % 4:
        raise ValueError(f"Chroma approximator input width {width} must be a positive multiple of 4")
    q = width // 4
    tg = np.concatenate([_embedding(np.array([1000.0 * sigma]), q), _embedding(np.zeros(1), q)], axis=1)
    idx = _embedding(np.arange(rows, dtype=np.float32) * np.float32(1000.0), 2 * q)
    out = np.concatenate([np.repeat(tg, rows, axis=0), idx], axis=1)
    return np.ascontiguousarray(out[None], dtype=np.float32)


def kept_tokens(length: int, total: int, mask_pad: int = 1, dit_mask: bool = True) -> int:
    """How many leading T5 tokens the Chroma DiT attends to: the prompt's ``length`` tokens
    (pieces and ``</s>``) plus ``mask_pad`` padding tokens (sd-cli's ``chroma_t5_mask_pad``,
    1 by default), at most ``total``; all ``total`` without the DiT mask
    (``chroma_use_dit_mask=false``).

    Raises:
        ValueError: ``length`` outside 1..total or a negative ``mask_pad``.
    """
    if not 1 <= length <= total or mask_pad < 0:
        raise ValueError(f"Chroma mask: prompt length {length} of {total} tokens, pad {mask_pad}")
    return min(length + mask_pad, total) if dit_mask else total


class ChromaDiT(FluxDiT):
    """The Chroma DiT as a :class:`sdplan.core.models.ModuleGraph`.

    Inputs (:meth:`inputs` builds them): ``img`` f32 ``(1, N, 64)``, ``txt`` f32
    ``(1, T, context)`` (the kept T5 tokens), ``mod_in`` f32 ``(1, L, 64)`` (see
    :func:`approximator_input`), ``pe_cos``/``pe_sin`` f32 ``(T + N, 1, hd/2, 1)``. Output
    ``out`` f32 ``(1, N, 64)``: the velocity ``noise - x0`` in patch form.

    Raises:
        ModelLayoutError: weights without a distilled guidance layer, or one whose width does
            not fit the model.
    """

    def __init__(self, cfg: FluxConfig, flash: bool = False) -> None:
        if cfg.approximator is None:
            raise ModelLayoutError("not a Chroma DiT: no 'distilled_guidance_layer.in_proj.weight'")
        super().__init__(cfg, flash)
        self.approx_in, self.approx_hidden, self.approx_layers = cfg.approximator
        self.n_mods = 3 * cfg.n_single + 12 * cfg.n_double + 2

    @classmethod
    def from_weights(cls, weights: Mapping[str, Any], heads: int | None = None,
                     axes: tuple[int, int, int] | None = None, flash: bool = False) -> ChromaDiT:
        """The DiT for ``weights`` (names -> tensors or shapes); see
        :func:`sdplan.core.models.flux.flux_config`."""
        return cls(flux_config(weights, heads, axes), flash)

    # ------------------------------------------------------------------ names
    def block_tensors(self, i: int) -> list[str]:
        return [n for n in super().block_tensors(i) if not n.endswith(("_mod.lin.weight", "_mod.lin.bias",
                                                                         "modulation.lin.weight",
                                                                         "modulation.lin.bias"))]

    def other_tensors(self) -> list[str]:
        p = self.cfg.prefix
        mods = ["img_in", "txt_in", "final_layer.linear", APPROX + "in_proj", APPROX + "out_proj"]
        for k in range(self.approx_layers):
            mods += [f"{APPROX}layers.{k}.in_layer", f"{APPROX}layers.{k}.out_layer"]
        names = [f"{p}{m}.{k}" for m in mods for k in ("weight", "bias")]
        return names + [f"{p}{APPROX}norms.{k}.scale" for k in range(self.approx_layers)]

    # ------------------------------------------------------------------ inputs
    def inputs(self, latent: np.ndarray, context: np.ndarray, pooled: np.ndarray | None, sigma: float,
               guidance: float | None = None) -> dict[str, np.ndarray]:
        """Graph input arrays for a latent ``(1, 16, H, W)``, the kept T5 states
        ``(1, T, context)`` and ``sigma`` in [0, 1]. ``pooled`` must be None (Chroma has no
        pooled vector); ``guidance`` is ignored (sd-cli feeds the approximator guidance 0).

        Raises:
            ValueError: shapes that do not fit the model, or a pooled vector.
        """
        c = self.cfg
        if pooled is not None:
            raise ValueError("Chroma takes no pooled CLIP vector (T5 only)")
        img = patchify(latent)
        ctx = np.asarray(context, dtype=np.float32)
        if img.shape[2] != c.in_channels:
            raise ValueError(f"Chroma latent gives {img.shape[2]} patch channels, the model takes {c.in_channels}")
        if ctx.ndim != 3 or ctx.shape[0] != 1 or ctx.shape[2] != c.context or ctx.shape[1] < 1:
            raise ValueError(f"Chroma context must be (1, T >= 1, {c.context}), got {ctx.shape}")
        h, w = latent.shape[2:]
        ids = np.concatenate([np.zeros((ctx.shape[1], 3)), image_ids(h, w)])
        cos, sin = rope_tables(ids, c.axes)
        return {"img": img, "txt": ctx, "mod_in": approximator_input(sigma, self.n_mods, self.approx_in),
                "pe_cos": cos[:, None, :, None].copy(), "pe_sin": sin[:, None, :, None].copy()}

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        need = {"img", "txt", "mod_in", "pe_cos", "pe_sin"}
        if not need <= set(shapes):
            raise ValueError(f"Chroma: inputs {sorted(need - set(shapes))} missing")
        return {k: (tuple(shapes[k]), "f32") for k in need}

    # ------------------------------------------------------------------ graph
    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        c = self.cfg
        a = c.prefix + APPROX
        x = self._lin(g, w, inputs["mod_in"], a + "in_proj")  # (1, L, hidden)
        for k in range(self.approx_layers):
            h = g.mul(g.rms_norm(x, EPS), w(f"{a}norms.{k}.scale"))
            h = self._lin(g, w, g.unary("silu", self._lin(g, w, h, f"{a}layers.{k}.in_layer")),
                          f"{a}layers.{k}.out_layer")
            x = g.add(x, h)
        return {"img": self._lin(g, w, inputs["img"], c.prefix + "img_in"),
                "txt": self._lin(g, w, inputs["txt"], c.prefix + "txt_in"),
                "mods": self._lin(g, w, x, a + "out_proj"),  # (1, L, D)
                "pe_cos": inputs["pe_cos"], "pe_sin": inputs["pe_sin"]}

    def _rows(self, g: Any, mods: Any, first: int, n: int) -> list[Any]:
        """Rows ``first..first+n-1`` of the modulation table ``(1, L, D)`` as ``(1, 1, D)``."""
        _, rows, d = mods.shape
        if first + n > rows:
            raise ModelLayoutError(f"Chroma modulation table has {rows} rows, block needs {first + n}")
        return [g.cont(g.view(mods, (1, 1, d), (rows * d * 4, d * 4, 4), (first + r) * d * 4)) for r in range(n)]

    def _mods(self, g: Any, w: Any, i: int, kind: str, state: dict[str, Any]) -> list[Any]:
        c = self.cfg
        mods = state["mods"]
        if kind == "final":
            return self._rows(g, mods, self.n_mods - 2, 2)
        if kind == "single":
            return self._rows(g, mods, 3 * (i - c.n_double), 3)
        base = 3 * c.n_single + (6 * c.n_double if kind == "txt" else 0)
        return self._rows(g, mods, base + 6 * i, 6)
