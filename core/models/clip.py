"""CLIP text encoder graphs: SD 1.x (transformers names), SD 2.x (OpenCLIP names) and the
two SDXL encoders (CLIP ViT-L in transformers names, OpenCLIP ViT-bigG in either).

Layouts (tensor names after the checkpoint prefix):

* ``openai`` (``cond_stage_model.transformer.text_model.``): ``embeddings.token_embedding``,
  ``embeddings.position_embedding``, ``encoder.layers.N.{layer_norm1, self_attn.{q,k,v,out}_proj,
  layer_norm2, mlp.fc1, mlp.fc2}``, ``final_layer_norm``; activation quick-GELU.
* ``openclip`` (``cond_stage_model.model.``): ``token_embedding``, ``positional_embedding``,
  ``transformer.resblocks.N.{ln_1, attn.in_proj_weight/bias (fused q,k,v), attn.out_proj, ln_2,
  mlp.c_fc, mlp.c_proj}``, ``ln_final``; activation GELU (erf).

The encoder is the pre-LN transformer of Radford et al. 2021 with a causal mask. ``clip_skip``
follows sd-cli / A1111: ``clip_skip = k`` stops after layer ``n_layers - k + 1`` and applies the
final LayerNorm (1 = last layer; SD 2.x uses 2, the penultimate layer).

SDXL prefixes: ``conditioner.embedders.0.transformer.text_model.`` (ViT-L),
``conditioner.embedders.1.model.`` (bigG; the refiner's only encoder is
``conditioner.embedders.0.model.``); standalone ``--clip_l``/``--clip_g`` files use
transformers names under ``text_model.``. The *pooled* output (:class:`ClipGraph` with
``projection``) is the final-LayerNorm state of the last layer at the first end-of-text
token, times the text projection: OpenCLIP's ``text_projection`` matrix ``P`` as
``pooled @ P`` (open_clip's ``encode_text``), or transformers' ``text_projection.weight``
``W`` as ``pooled @ W.T``; diffusers' single-file converter stores ``W = P.T``. (sd-cli
applies either tensor as a linear layer, which transposes ``P``; sdplan follows open_clip
and diffusers.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from sdplan.core.errors import InvalidArgument
from sdplan.core.models.base import ModelLayoutError, Weights, check_block
from sdplan.core.runtime import graph as gr

__all__ = ["ClipConfig", "ClipGraph", "PREFIXES", "layer_prefix", "clip_config", "clip_text", "causal_mask",
           "find_prefix", "find_projection"]

Tensor = Any

#: Checkpoint prefix -> layout name.
PREFIXES = {
    "cond_stage_model.transformer.text_model.": "openai",
    "cond_stage_model.model.": "openclip",
    "conditioner.embedders.0.transformer.text_model.": "openai",
    "conditioner.embedders.1.model.": "openclip",
    "conditioner.embedders.0.model.": "openclip",
    "text_encoders.clip_l.transformer.text_model.": "openai",
    "text_encoders.clip_g.transformer.text_model.": "openai",
    "text_model.": "openai",
    "": "openai",
}
_LN_EPS = 1e-5


@dataclass(frozen=True)
class ClipConfig:
    """Hyper-parameters of a CLIP text encoder (inferred from shapes).

    Attributes: layout (``openai``/``openclip``), prefix, vocab size, positions, width D,
    MLP width, layer count, heads, activation (``gelu_quick`` or ``gelu_erf``).
    """

    layout: str
    prefix: str
    vocab: int
    n_positions: int
    width: int
    mlp_width: int
    n_layers: int
    n_heads: int
    activation: str


def find_prefix(names: Mapping[str, Any]) -> tuple[str, str]:
    """``(prefix, layout)`` of the CLIP text encoder among ``names``.

    Raises:
        ModelLayoutError: no known token-embedding name is present.
    """
    for prefix, layout in PREFIXES.items():
        key = "embeddings.token_embedding.weight" if layout == "openai" else "token_embedding.weight"
        if prefix + key in names:
            return prefix, layout
    raise ModelLayoutError("no CLIP text encoder: none of the known token-embedding names "
                           f"({', '.join(p or '(none)' for p in PREFIXES)}) is present")


def find_projection(names: Mapping[str, Any], prefix: str) -> tuple[str, str] | None:
    """``(name, kind)`` of the text projection of the encoder under ``prefix``: OpenCLIP's
    ``{prefix}text_projection`` matrix (kind ``matrix``, applied as ``x @ P``) or
    transformers' ``text_projection.weight`` beside ``text_model.`` (kind ``linear``,
    ``x @ W.T``); None when there is none."""
    if prefix + "text_projection" in names:
        return prefix + "text_projection", "matrix"
    parent = prefix[: -len("text_model.")] if prefix.endswith("text_model.") else prefix
    if parent + "text_projection.weight" in names:
        return parent + "text_projection.weight", "linear"
    return None


def clip_config(weights: Mapping[str, Any], n_heads: int | None = None,
                prefix: str | None = None, activation: str | None = None) -> ClipConfig:
    """Infer a :class:`ClipConfig` from ``weights`` (tensors or shape tuples).

    ``n_heads`` defaults to ``width // 64`` (CLIP ViT-L/14, OpenCLIP ViT-H/14 and ViT-bigG/14
    all use 64-wide heads); tiny test models pass it explicitly. The layout under an explicit
    ``prefix`` is read from the names. ``activation`` (``gelu_quick``/``gelu_erf``) defaults
    to GELU for OpenCLIP names and for transformers names 1024 or 1280 wide (ViT-H, ViT-bigG:
    ``hidden_act: gelu``; sd-cli's rule), quick-GELU otherwise (OpenAI's ViT-L).

    Raises:
        ModelLayoutError: missing tensors, or ``width`` not divisible by ``n_heads``.
    """
    if prefix is None:
        prefix, layout = find_prefix(weights)
    else:
        layout = "openclip" if prefix + "token_embedding.weight" in weights else "openai"
    w = Weights(weights, prefix)
    if layout == "openai":
        vocab, width = w.shape("embeddings.token_embedding.weight")
        n_pos = w.shape("embeddings.position_embedding.weight")[0]
        layers = w.indices("encoder.layers.")
        mlp = w.shape("encoder.layers.0.mlp.fc1.weight")[0]
        act = "gelu_erf" if width in (1024, 1280) else "gelu_quick"
    else:
        vocab, width = w.shape("token_embedding.weight")
        n_pos = w.shape("positional_embedding")[0]
        layers = w.indices("transformer.resblocks.")
        mlp = w.shape("transformer.resblocks.0.mlp.c_fc.weight")[0]
        act = "gelu_erf"
    heads = n_heads or max(1, width // 64)
    emb = "embeddings.token_embedding.weight" if layout == "openai" else "token_embedding.weight"
    if heads < 1:
        raise ModelLayoutError(f"a head count must be at least 1, got {heads}")
    if width % heads:
        raise ModelLayoutError(f"tensor {prefix}{emb}: CLIP width {width} is not divisible by "
                               f"{heads} heads")
    if layers != list(range(len(layers))):
        raise ModelLayoutError(f"CLIP layers are not numbered 0..N-1: {layers[:8]}")
    return ClipConfig(layout, prefix, vocab, n_pos, width, mlp, len(layers), heads, activation or act)


def causal_mask(n: int) -> np.ndarray:
    """``(n, n)`` float32 mask: 0 on and below the diagonal, -inf above."""
    return np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)


def _names(cfg: ClipConfig, i: int) -> dict[str, str]:
    if cfg.layout == "openai":
        p = f"encoder.layers.{i}."
        return {"ln1": p + "layer_norm1", "ln2": p + "layer_norm2", "out": p + "self_attn.out_proj",
                "fc1": p + "mlp.fc1", "fc2": p + "mlp.fc2", "attn": p + "self_attn."}
    p = f"transformer.resblocks.{i}."
    return {"ln1": p + "ln_1", "ln2": p + "ln_2", "out": p + "attn.out_proj",
            "fc1": p + "mlp.c_fc", "fc2": p + "mlp.c_proj", "attn": p + "attn."}


def _qkv(g: Any, w: Weights, cfg: ClipConfig, x: Tensor, attn: str) -> list[Tensor]:
    """q, k, v of ``x`` ``(B, T, D)`` each as ``(B, H, T, D/H)``."""
    b, t, d = x.shape
    h = cfg.n_heads
    if cfg.layout == "openai":
        outs = [gr.linear(g, x, w[f"{attn}{n}_proj.weight"], w[f"{attn}{n}_proj.bias"])
                for n in ("q", "k", "v")]
    else:
        fused = gr.linear(g, x, w[attn + "in_proj_weight"], w[attn + "in_proj_bias"])  # (B,T,3D)
        es = 4
        strides = (t * 3 * d * es, 3 * d * es, es)
        outs = [g.cont(g.view(fused, (b, t, d), strides, i * d * es)) for i in range(3)]
    # views: sdplan's attention ops read the heads through their strides, the plain path copies
    return [g.permute(g.reshape(o, (b, t, h, d // h)), (0, 2, 1, 3)) for o in outs]


def clip_text(g: Any, weights: Mapping[str, Any], ids: Tensor, mask: Tensor,
              cfg: ClipConfig | None = None, clip_skip: int = 1, final_ln: bool = True) -> Tensor:
    """The text encoder's hidden states.

    Args:
        g: the graph.
        weights: checkpoint name -> tensor (see the module docstring for the names).
        ids: i32 token ids ``(B, T)``, T <= the position count (77).
        mask: f32 ``(T, T)`` causal mask (:func:`causal_mask`), a graph input.
        cfg: hyper-parameters (default: :func:`clip_config` of ``weights``).
        clip_skip: 1 = last layer, k = stop after layer ``n_layers - k + 1``.
        final_ln: apply the final LayerNorm (sd-cli always does; False gives raw hidden states).

    Returns:
        f32 ``(B, T, D)``.

    Raises:
        ValueError: ``clip_skip`` outside 1..n_layers.
    """
    cfg = cfg or clip_config(weights)
    if not 1 <= clip_skip <= cfg.n_layers:
        raise ValueError(f"clip_skip must be in 1..{cfg.n_layers}, got {clip_skip}")
    w = Weights(weights, cfg.prefix)
    x = _embed(g, w, cfg, ids)
    for i in range(cfg.n_layers - clip_skip + 1):
        x = _layer(g, w, cfg, i, x, mask)
    return _final(g, w, cfg, x) if final_ln else x


def _embed(g: Any, w: Weights, cfg: ClipConfig, ids: Tensor) -> Tensor:
    """Token plus position embeddings of i32 ``ids`` ``(B, T)`` -> ``(B, T, D)``."""
    b, t = ids.shape
    if cfg.layout == "openai":
        tok, pos = w["embeddings.token_embedding.weight"], w["embeddings.position_embedding.weight"]
    else:
        tok, pos = w["token_embedding.weight"], w["positional_embedding"]
    x = g.get_rows(tok, g.reshape(ids, (b * t,)))
    x = g.reshape(x, (b, t, cfg.width))
    if t != cfg.n_positions:
        es = 2 if pos.dtype in ("f16", "bf16") else 4
        pos = g.view(pos, (t, cfg.width), (cfg.width * es, es), 0)
    return g.add(x, pos)


def _layer(g: Any, w: Weights, cfg: ClipConfig, i: int, x: Tensor, mask: Tensor) -> Tensor:
    """Pre-LN transformer layer ``i`` with the causal ``mask``."""
    n = _names(cfg, i)
    h = gr.layer_norm(g, x, w[n["ln1"] + ".weight"], w[n["ln1"] + ".bias"], _LN_EPS)
    q, k, v = _qkv(g, w, cfg, h, n["attn"])
    # sdplan's CPU attention ops (f32 FMA or bf16) take the causal mask as it is; elsewhere the
    # plain softmax path (ggml's flash attention would round K and V to f16)
    a = gr.attention(g, q, k, v, mask, flash=gr.sdplan_attention_op(g))
    x = g.add(x, gr.linear(g, a, w[n["out"] + ".weight"], w[n["out"] + ".bias"]))
    h = gr.layer_norm(g, x, w[n["ln2"] + ".weight"], w[n["ln2"] + ".bias"], _LN_EPS)
    h = g.unary(cfg.activation, gr.linear(g, h, w[n["fc1"] + ".weight"], w[n["fc1"] + ".bias"]))
    return g.add(x, gr.linear(g, h, w[n["fc2"] + ".weight"], w[n["fc2"] + ".bias"]))


def _final(g: Any, w: Weights, cfg: ClipConfig, x: Tensor) -> Tensor:
    fln = "final_layer_norm" if cfg.layout == "openai" else "ln_final"
    return gr.layer_norm(g, x, w[fln + ".weight"], w[fln + ".bias"], _LN_EPS)


def check_clip_skip(cfg: ClipConfig, clip_skip: int) -> None:
    """Refuse a clip skip this encoder cannot run (``--clip-skip``), before a pipeline drops
    the runner it has for another skip.

    Raises:
        InvalidArgument: ``clip_skip`` outside 1..n_layers, naming the flag and the range.
    """
    if not 1 <= clip_skip <= cfg.n_layers:
        raise InvalidArgument(f"--clip-skip {clip_skip}: this text encoder has {cfg.n_layers} layers; "
                              f"give 1..{cfg.n_layers} (or -1 for the model's default)")


def layer_prefix(cfg: ClipConfig, i: int) -> str:
    """Checkpoint-name prefix of layer ``i`` (``...encoder.layers.{i}.`` or
    ``...transformer.resblocks.{i}.``)."""
    mid = "encoder.layers." if cfg.layout == "openai" else "transformer.resblocks."
    return f"{cfg.prefix}{mid}{i}."


class ClipGraph:
    """The CLIP text encoder as an engine module graph (:class:`sdplan.core.models.ModuleGraph`):
    block ``i`` is layer ``i`` (``layers.N``, the unit of ``te`` layer split); embeddings, the
    final LayerNorm and the text projection are non-block tensors on the main device.

    Inputs ``ids`` i32 ``(B, T)`` and ``mask`` f32 ``(T, T)`` (:func:`causal_mask`); output
    ``hidden`` f32 ``(B, T, D)``. Layers after ``n_layers - clip_skip + 1`` are identity
    blocks (their weights are still placed, as sd-cli loads them). ``names``: checkpoint name
    -> store name of the encoder's weights (``position_ids`` left out; the projection only
    with ``projection``).

    With ``projection`` = :func:`find_projection`'s ``(name, kind)`` every layer runs and the
    graph also takes ``eos`` i32 ``(B,)`` (the row ``b * T + position`` of each sequence's
    first end-of-text token) and outputs ``pooled`` f32 ``(B, P)``: the last layer's state
    after the final LayerNorm at that row, projected (see the module docstring).

    Raises ValueError for ``clip_skip`` outside 1..n_layers.
    """

    #: The CPU bf16 kernels (sdplan._ggml.bf16_kernel()) with which this module's products with
    #: f16/bf16 weights run in bf16 (ModuleRunner; AMX converts the weights as they load): measured by bench/bench_cpu_bf16.py (1 thread,
    #: medians of 3 interleaved processes), text encoding took 0.39x (AMX) and 0.67x (AVX512_BF16) the f16 path's time.
    #: Accuracy: tests/test_bf16_models.py.
    cpu_bf16_kernels: tuple[str, ...] = ("amx", "avx512")

    def __init__(self, cfg: ClipConfig, names: Mapping[str, str], clip_skip: int = 1,
                 final_ln: bool = True, projection: tuple[str, str] | None = None) -> None:
        if not 1 <= clip_skip <= cfg.n_layers:
            raise ValueError(f"clip_skip must be in 1..{cfg.n_layers}, got {clip_skip}")
        self.cfg, self.clip_skip, self.final_ln = cfg, clip_skip, final_ln
        self.projection = projection
        self.n_blocks = cfg.n_layers
        self.names = dict(names)
        self._blocks: list[list[str]] = [[] for _ in range(cfg.n_layers)]
        self._other: list[str] = []
        prefixes = [layer_prefix(cfg, i) for i in range(cfg.n_layers)]
        for full, short in self.names.items():
            for i, p in enumerate(prefixes):
                if full.startswith(p):
                    self._blocks[i].append(short)
                    break
            else:
                self._other.append(short)

    def block_tensors(self, i: int) -> list[str]:
        check_block(self, i)
        return list(self._blocks[i])

    def other_tensors(self) -> list[str]:
        return list(self._other)

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        """``ids`` i32 ``(B, T)``, ``mask`` f32 ``(T, T)`` (and ``eos`` i32 ``(B,)`` with a
        projection); ValueError otherwise."""
        ids, mask = tuple(shapes.get("ids", ())), tuple(shapes.get("mask", ()))
        want = {"ids", "mask"} | ({"eos"} if self.projection else set())
        if (set(shapes) != want or len(ids) != 2 or mask != (ids[1], ids[1]) or ids[1] > self.cfg.n_positions
                or (self.projection and tuple(shapes["eos"]) != (ids[0],))):
            raise ValueError(f"CLIP inputs must be {', '.join(sorted(want))}: ids (B, T<={self.cfg.n_positions}), "
                             f"mask (T, T){', eos (B,)' if self.projection else ''}; got {shapes}")
        out: dict[str, tuple[tuple[int, ...], str]] = {"ids": (ids, "i32"), "mask": (mask, "f32")}
        if self.projection:
            out["eos"] = ((ids[0],), "i32")
        return out

    def _view(self, w: Any) -> Weights:
        return Weights(w, self.cfg.prefix, self.names)

    def build_pre(self, g: Any, w: Any, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        x = _embed(g, self._view(w), self.cfg, inputs["ids"])
        return {k: v for k, v in (("x", x), ("mask", inputs["mask"]), ("eos", inputs.get("eos")))
                if v is not None}

    def build_block(self, g: Any, w: Any, i: int, state: dict[str, Tensor]) -> dict[str, Tensor]:
        stop = self.cfg.n_layers - self.clip_skip
        if i > stop and not self.projection:
            return state
        out = dict(state)
        out["x"] = _layer(g, self._view(w), self.cfg, i, state["x"], state["mask"])
        if self.projection and i == stop:
            out["hidden"] = out["x"]
        return out

    def build_post(self, g: Any, w: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        view = self._view(w)
        x = state.get("hidden", state["x"])
        out = {"hidden": _final(g, view, self.cfg, x) if self.final_ln else x}
        if self.projection:
            last = _final(g, view, self.cfg, state["x"])
            b, t, d = last.shape
            pooled = g.get_rows(g.reshape(last, (b * t, d)), state["eos"])  # (B, D)
            name, kind = self.projection
            proj = w(self.names[name])
            if kind == "matrix":  # x @ P with P (D, P): mul_mat takes P.T
                proj = g.cont(g.transpose(proj))
            out["pooled"] = gr.linear(g, pooled, proj)
        return out
