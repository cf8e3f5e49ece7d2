"""A decoder-only language model used as a text encoder (Qwen3, Qwen2.5, Mistral-style), as a
block-structured ggml graph.

Architecture (the Llama family as transformers' ``Qwen3Model`` / ``Qwen2Model`` /
``MistralModel`` compute it): ``x = embed[ids]``; per block
``x += o(attn(RoPE(qn(q(n1 x))), RoPE(kn(k(n1 x))), v(n1 x)))`` with causal, grouped-query
attention (``heads`` query heads share ``kv_heads`` key/value heads, query head ``h`` using
key/value head ``h // (heads / kv_heads)``) and ``x += down(silu(gate(n2 x)) * up(n2 x))``;
``n1``, ``n2`` and the final norm are RMS norms ``x / sqrt(mean(x^2) + eps) * w``. What
differs between families is configuration (:class:`LLMArch`, :data:`ARCHS`):

* ``qwen3``: per-head RMS norms ``qn``/``kn`` on q and k (before RoPE), no biases, RoPE
  base 1e6, eps 1e-6 (Qwen3 ``config.json``; stable-diffusion.cpp ``llm.hpp``
  ``LLMArch::QWEN3``);
* ``qwen2.5``: biases on q, k, v, no q/k norms, RoPE base 1e6, eps 1e-6;
* ``mistral``: no biases, no q/k norms, RoPE base 1e9, eps 1e-5 (stable-diffusion.cpp
  ``MISTRAL_SMALL_3_2``).

RoPE rotates the two halves of each head (transformers' ``rotate_half``, ggml's NEOX mode)
in transformers names. llama.cpp's converter stores the q/k rows of Llama-architecture models
(Mistral) permuted so that adjacent pairs rotate (ggml's normal mode), as stable-diffusion.cpp
runs its Mistral GGUF files; Qwen rows are stored as they are (:attr:`LLMArch.gguf_rope`).

Weight layouts (:data:`LAYOUTS`), found after any prefix (``model.``, ``text_encoders.llm.``):
transformers names (``embed_tokens``, ``layers.N.self_attn.q_proj``, ``...mlp.gate_proj``,
``input_layernorm``, ``post_attention_layernorm``, ``norm``; ``qwen_3_4b.safetensors``) and
llama.cpp GGUF names (``token_embd``, ``blk.N.attn_q``, ``attn_q_norm``, ``ffn_gate``,
``attn_norm``, ``ffn_norm``, ``output_norm``). llama.cpp stores Qwen q/k rows unpermuted
(its Qwen models use NEOX RoPE), so both layouts share one graph.

Which hidden state an image model takes is the caller's ``out_layers`` (stable-diffusion.cpp's
convention): ``k`` in 1..N is the state after ``k`` blocks (no final norm), ``N + 1`` the final
normed output; several are concatenated along the width (FLUX.2 klein). Blocks after the last
one needed build nothing and their weights do not load (:attr:`LLMEncoder.blocks_read`; sd-cli
builds its graph up to that state and loads only the tensors the graph uses: 298 of Qwen3-4B's
398 for klein). Z-Image takes ``N - 1`` (``hidden_states[-2]`` in transformers).

Pictures (Qwen2.5-VL, Qwen-Image Edit): the vision tower's embeddings
(:mod:`sdplan.core.models.qwen25vl_vision`) replace the embeddings of the ``<|image_pad|>``
tokens, one per merged 2x2 patch group, in reading order; the positions are then M-RoPE's
three rows (transformers ``Qwen2_5_VLModel.get_rope_index``, :func:`mrope_positions`): text
tokens count on with all three equal, a picture's tokens take (start, start + row,
start + column) over its merged grid, and the text after it starts at start + max(rows,
columns). The rotated pairs are split into sections turned by the time, row and column rows
(``mrope_section`` (16, 24, 24) of the published 128-wide heads; ggml's
``GGML_ROPE_TYPE_MROPE``, llama.cpp's Qwen2-VL). Without pictures the three rows are equal and
M-RoPE is the plain rotation, which the text path keeps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sdplan.core.models.base import ModelLayoutError, Weights, check_block
from sdplan.core.runtime import graph as gr

__all__ = ["LLMArch", "ARCHS", "LAYOUTS", "LLMConfig", "LLMEncoder", "llm_config", "find_layout",
           "causal_mask", "ROPE_MODES", "mrope_positions", "mrope_sections", "IMAGE_PAD", "MROPE_SECTION"]


@dataclass(frozen=True)
class LLMArch:
    """What shapes do not say about a family: ``qk_norm`` (per-head q/k RMS norms),
    ``qkv_bias``, RoPE base ``theta``, norm ``eps``, the ``head_dim`` used when no q-norm
    gives it, and ``gguf_rope``: the RoPE style (``neox`` or ``normal``) of the family's
    llama.cpp files (transformers files are always ``neox``)."""

    name: str
    qk_norm: bool
    qkv_bias: bool
    theta: float
    eps: float
    head_dim: int = 128
    gguf_rope: str = "neox"


#: Family presets (sources in the module docstring).
ARCHS: dict[str, LLMArch] = {
    "qwen3": LLMArch("qwen3", True, False, 1e6, 1e-6),
    "qwen2.5": LLMArch("qwen2.5", False, True, 1e6, 1e-6),
    "mistral": LLMArch("mistral", False, False, 1e9, 1e-5, gguf_rope="normal"),
}
#: ggml RoPE mode per style (``GGML_ROPE_TYPE_NORMAL`` 0, ``GGML_ROPE_TYPE_NEOX`` 2).
ROPE_MODES = {"normal": 0, "neox": 2}

#: Qwen2.5-VL's picture placeholder token (``<|image_pad|>``, ``config.json`` ``image_token_id``).
IMAGE_PAD = 151655
#: Qwen2.5-VL's M-RoPE sections of its 128-wide heads (``rope_scaling.mrope_section``): rotated
#: pairs turned by the time, row and column positions.
MROPE_SECTION = (16, 24, 24)
#: ggml's multi-section RoPE mode (``GGML_ROPE_TYPE_MROPE``).
MROPE_MODE = 8

#: Layout -> role -> name (``{i}``: block index), for both naming conventions.
LAYOUTS: dict[str, dict[str, str]] = {
    "hf": {"embed": "embed_tokens.weight", "final": "norm.weight", "block": "layers.{i}.",
           "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
           "o": "self_attn.o_proj", "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm",
           "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
           "norm1": "input_layernorm", "norm2": "post_attention_layernorm"},
    "gguf": {"embed": "token_embd.weight", "final": "output_norm.weight", "block": "blk.{i}.",
             "q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
             "q_norm": "attn_q_norm", "k_norm": "attn_k_norm", "gate": "ffn_gate",
             "up": "ffn_up", "down": "ffn_down", "norm1": "attn_norm", "norm2": "ffn_norm"},
}


def find_layout(names: Mapping[str, Any] | Sequence[str]) -> tuple[str, str]:
    """``(layout, prefix)`` of the language model among ``names``: the prefix in front of
    block 0's first norm (``layers.0.input_layernorm.weight`` or ``blk.0.attn_norm.weight``).

    Raises:
        ModelLayoutError: no language model in either layout.
    """
    for layout, r in LAYOUTS.items():
        key = r["block"].format(i=0) + r["norm1"] + ".weight"
        for n in names:
            if n == key or n.endswith("." + key):
                return layout, n[: -len(key)]
    raise ModelLayoutError("no language model: neither 'layers.0.input_layernorm.weight' "
                           "(transformers names) nor 'blk.0.attn_norm.weight' (llama.cpp names)")


@dataclass(frozen=True)
class LLMConfig:
    """Sizes of a language model (inferred by :func:`llm_config`): ``vocab``, ``hidden``,
    ``heads``, ``kv_heads``, ``head_dim``, ``ffn`` (MLP width), ``n_blocks``; its ``arch``
    preset, weight ``layout`` and name ``prefix``."""

    prefix: str
    layout: str
    arch: LLMArch
    vocab: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    n_blocks: int

    @property
    def rope(self) -> str:
        """``neox`` or ``normal``: how this file's q/k rows are rotated."""
        return self.arch.gguf_rope if self.layout == "gguf" else "neox"

    def name(self, role: str, i: int | None = None, kind: str = "weight") -> str:
        """Full tensor name of ``role`` (of block ``i``), e.g. ``("q", 3)`` ->
        ``model.layers.3.self_attn.q_proj.weight``."""
        r = LAYOUTS[self.layout]
        if i is None:
            return self.prefix + r[role]
        return f"{self.prefix}{r['block'].format(i=i)}{r[role]}.{kind}"


def llm_config(weights: Mapping[str, Any], arch: str | None = None,
               head_dim: int | None = None) -> LLMConfig:
    """Infer an :class:`LLMConfig` from ``weights`` (tensors or shape tuples).

    The family is ``arch`` when given, else ``qwen3`` with q/k norms, ``qwen2.5`` with a
    q bias, ``mistral`` otherwise. The head width is ``head_dim`` when given, else the
    q-norm's length, else the preset's; heads and key/value heads follow from the q and k
    projections' rows.

    Raises:
        ModelLayoutError: no language model, blocks not numbered 0..N-1, an unknown
            ``arch``, or projections that do not divide into heads.
    """
    layout, prefix = find_layout(weights)
    r = LAYOUTS[layout]
    w = Weights(weights, prefix)
    blocks = w.indices(r["block"].split("{")[0])
    if not blocks or blocks != list(range(len(blocks))):
        raise ModelLayoutError(f"language-model blocks are not numbered 0..N-1: {blocks[:8]}")
    b0 = r["block"].format(i=0)
    if arch is None:
        arch = ("qwen3" if b0 + r["q_norm"] + ".weight" in w
                else "qwen2.5" if b0 + r["q"] + ".bias" in w else "mistral")
    if arch not in ARCHS:
        raise ModelLayoutError(f"unknown language-model family {arch!r} (known: {', '.join(ARCHS)})")
    a = ARCHS[arch]
    vocab, hidden = w.shape(r["embed"])
    q_rows = w.shape(b0 + r["q"] + ".weight")[0]
    k_rows = w.shape(b0 + r["k"] + ".weight")[0]
    hd = head_dim or (w.shape(b0 + r["q_norm"] + ".weight")[0] if a.qk_norm else a.head_dim)
    if q_rows % hd or k_rows % hd or (q_rows // hd) % max(k_rows // hd, 1):
        raise ModelLayoutError(f"language-model projections q {q_rows} / k {k_rows} rows do not "
                               f"divide into heads of {hd}")
    ffn = w.shape(b0 + r["gate"] + ".weight")[0]
    return LLMConfig(prefix, layout, a, vocab, hidden, q_rows // hd, k_rows // hd, hd, ffn, len(blocks))


def causal_mask(n: int) -> np.ndarray:
    """``(n, n)`` float32: 0 on and below the diagonal, -inf above (token i sees 0..i)."""
    return np.triu(np.full((n, n), -np.inf, dtype=np.float32), 1)


def mrope_sections(head_dim: int, given: Sequence[int] | None = None) -> tuple[int, int, int]:
    """The M-RoPE sections for heads of ``head_dim``: ``given`` (a file's statement), else
    :data:`MROPE_SECTION` scaled by ``head_dim / 128``.

    Raises:
        ValueError: sections not three non-negative counts summing to ``head_dim / 2``, or a
            head width the published sections do not scale to.
    """
    if given is None:
        if any(v * head_dim % 128 for v in MROPE_SECTION):
            raise ValueError(f"M-RoPE sections {MROPE_SECTION} do not scale to heads of {head_dim}")
        given = tuple(v * head_dim // 128 for v in MROPE_SECTION)
    sec = tuple(int(v) for v in given)
    if len(sec) != 3 or min(sec) < 0 or sum(sec) * 2 != head_dim:
        raise ValueError(f"M-RoPE sections {sec} must be three counts summing to {head_dim // 2}")
    return sec[0], sec[1], sec[2]


def mrope_positions(ids: np.ndarray, grids: Sequence[tuple[int, int, int]], image_token: int = IMAGE_PAD,
                    merge: int = 2) -> np.ndarray:
    """M-RoPE positions ``(3, T)`` i32 (time, row, column) of token ids ``(1, T)`` whose runs of
    ``image_token`` are pictures with patch grids ``grids`` ``(t, h, w)``, in order (module
    docstring; transformers ``get_rope_index`` for still pictures).

    Raises:
        ValueError: the runs of picture tokens do not match the grids' merged token counts.
    """
    ids = np.asarray(ids).reshape(-1)
    out = np.zeros((3, ids.size), np.int64)
    pics = iter(grids)
    i = cur = 0
    while i < ids.size:
        if ids[i] != image_token:
            out[:, i] = cur
            i, cur = i + 1, cur + 1
            continue
        grid = next(pics, None)
        if grid is None:
            raise ValueError("more runs of picture tokens than pictures")
        t, h, w = grid[0], grid[1] // merge, grid[2] // merge
        n = t * h * w
        if ids[i:i + n].size != n or (ids[i:i + n] != image_token).any() or (i + n < ids.size and ids[i + n] == image_token):
            raise ValueError(f"a run of picture tokens at {i} is not the {n} tokens of a {grid} grid")
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
        out[:, i:i + n] = np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + cur
        i, cur = i + n, cur + max(h, w)
    if next(pics, None) is not None:
        raise ValueError("more pictures than runs of picture tokens")
    return out.astype(np.int32)


class LLMEncoder:
    """The language model as a :class:`sdplan.core.models.ModuleGraph` (module docstring).

    Inputs (:meth:`inputs`): ``ids`` i32 ``(1, T)``, ``pos`` i32 ``(T,)``, ``mask`` f32
    ``(T, T)``; with pictures also ``images`` f32 ``(N, hidden)`` (their embeddings), ``sel``
    i32 ``(T,)`` (token ``i`` takes row ``sel[i]`` of the ids' embeddings followed by
    ``images``) and ``pos`` i32 ``(4 T,)`` (M-RoPE's time, row, column rows and zeros; the
    ``mrope`` sections, :func:`mrope_sections`). Output ``hidden`` f32
    ``(1, T, hidden * len(out_layers))``.

    Raises:
        ValueError: an out layer outside 1..N+1.
    """

    #: The CPU bf16 kernels (sdplan._ggml.bf16_kernel()) with which this module's f16/bf16 weights are
    #: run in bf16 (ModuleRunner): measured by bench/bench_cpu_bf16_families.py (2 threads, medians of
    #: 3 interleaved processes, three runs, random f16 weights), a Qwen3-4B call (one block at the real
    #: width, 128 tokens) took 0.12-0.19x the f16 path's time with AMX; AVX512_BF16 alone 0.81-0.84x
    #: (the other modules 0.73-1.03x, within this host's spread; the UNet's 0.70x is the one counted),
    #: so that Xeon keeps f16's precision.
    #: Accuracy: tests/test_bf16_dit_models.py.
    #: With AVX512_BF16 alone it depends on the core: on an AMD EPYC (Zen 4) this module's call took
    #: 0.49x the f16 path's time (the families' benchmark, medians of 3 interleaved processes), hence
    #: ``avx512_fast``: bf16 where the CPU's AVX512_BF16 product measures fast
    #: (sdplan.core.runtime.bf16_rule; the Xeon above does not, the EPYC does).
    cpu_bf16_kernels: tuple[str, ...] = ("amx", "avx512_fast")

    def __init__(self, cfg: LLMConfig, out_layers: Sequence[int] | None = None,
                 mrope: Sequence[int] | None = None) -> None:
        self.cfg = cfg
        #: M-RoPE sections (time, row, column) for runs with pictures; None: the published ones
        #: scaled to the head width when asked
        self.mrope = tuple(mrope) if mrope is not None else None
        self.n_blocks = cfg.n_blocks
        self.out_layers = tuple(out_layers) if out_layers else (cfg.n_blocks + 1,)
        bad = [k for k in self.out_layers if not 1 <= k <= cfg.n_blocks + 1]
        if bad:
            raise ValueError(f"LLM out layers {bad} outside 1..{cfg.n_blocks + 1}")
        #: blocks that compute: up to the last hidden state asked for
        self.active = min(max(self.out_layers), cfg.n_blocks)
        #: the leading blocks whose weights a runner loads (the later ones stay in the file)
        self.blocks_read = self.active

    @classmethod
    def from_weights(cls, weights: Mapping[str, Any], out_layers: Sequence[int] | None = None,
                     arch: str | None = None, head_dim: int | None = None) -> LLMEncoder:
        """The encoder for ``weights`` (names -> tensors or shapes); see :func:`llm_config`."""
        return cls(llm_config(weights, arch, head_dim), out_layers)

    # ------------------------------------------------------------------ names
    def block_tensors(self, i: int) -> list[str]:
        check_block(self, i)
        c = self.cfg
        names = [c.name(r, i) for r in ("q", "k", "v", "o", "gate", "up", "down", "norm1", "norm2")]
        if c.arch.qk_norm:
            names += [c.name("q_norm", i), c.name("k_norm", i)]
        if c.arch.qkv_bias:
            names += [c.name(r, i, "bias") for r in ("q", "k", "v")]
        return names

    def other_tensors(self) -> list[str]:
        return [self.cfg.name("embed"), self.cfg.name("final")]

    # ------------------------------------------------------------------ inputs
    def inputs(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Graph input arrays for token ids ``(1, T)``.

        Raises:
            ValueError: ids not of shape (1, T) or outside the vocabulary.
        """
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] < 1:
            raise ValueError(f"LLM ids must have shape (1, T), got {ids.shape}")
        if ids.min() < 0 or ids.max() >= self.cfg.vocab:
            raise ValueError(f"LLM ids must be in 0..{self.cfg.vocab - 1}, got {ids.min()}..{ids.max()}")
        t = ids.shape[1]
        return {"ids": ids.astype(np.int32), "pos": np.arange(t, dtype=np.int32), "mask": causal_mask(t)}

    def picture_inputs(self, ids: np.ndarray, images: Sequence[np.ndarray],
                       grids: Sequence[tuple[int, int, int]], image_token: int = IMAGE_PAD,
                       mrope: bool = True) -> dict[str, np.ndarray]:
        """Graph inputs for ids ``(1, T)`` whose runs of ``image_token`` take the embeddings
        ``images`` (one f32 ``(n, hidden)`` per picture, the vision tower's output) of pictures
        on patch grids ``grids``, with M-RoPE positions (module docstring), or with ``mrope``
        False every token's position its index (sd-cli's Qwen2.5-VL).

        Raises:
            ValueError: bad ids, runs of picture tokens that do not match the pictures, or
                embeddings not of the model's width.
        """
        base = self.inputs(ids)
        if not images:
            return base
        t = base["ids"].shape[1]
        pos = mrope_positions(base["ids"], grids, image_token)
        emb = np.concatenate([np.asarray(e, np.float32) for e in images])
        if emb.ndim != 2 or emb.shape[1] != self.cfg.hidden:
            raise ValueError(f"picture embeddings {emb.shape} are not of the LLM's width {self.cfg.hidden}")
        at = np.flatnonzero(base["ids"][0] == image_token)
        if at.size != emb.shape[0]:
            raise ValueError(f"{at.size} picture tokens for {emb.shape[0]} picture embeddings")
        sel = np.arange(t, dtype=np.int32)
        sel[at] = t + np.arange(at.size, dtype=np.int32)
        base.update(images=emb, sel=sel)
        if mrope:
            base["pos"] = np.concatenate([pos.reshape(-1), np.zeros(t, np.int32)])
        return base

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        ids = tuple(shapes.get("ids", ()))
        if len(ids) != 2 or ids[0] != 1:
            raise ValueError(f"LLM: needs ids of shape (1, T), got {shapes}")
        t = ids[1]
        specs = {"ids": (ids, "i32"), "pos": ((t,), "i32"), "mask": ((t, t), "f32")}
        if "images" in shapes:
            specs.update(images=(tuple(shapes["images"]), "f32"), sel=((t,), "i32"))
            if tuple(shapes.get("pos", (t,))) == (4 * t,):
                specs["pos"] = ((4 * t,), "i32")
        return specs

    # ------------------------------------------------------------------ graph
    def _norm(self, g: Any, x: Any, weight: Any) -> Any:
        return g.mul(g.rms_norm(x, self.cfg.arch.eps), weight)

    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        ids = inputs["ids"]
        b, t = ids.shape
        x = g.get_rows(w(self.cfg.name("embed")), g.reshape(ids, (b * t,)))
        state = {"pos": inputs["pos"], "mask": inputs["mask"]}
        if "images" in inputs:  # the pictures' embeddings in place of their tokens'
            x = g.get_rows(g.concat(x, inputs["images"], 0), inputs["sel"])
        state["x"] = g.reshape(x, (b, t, self.cfg.hidden))
        return state

    def _heads(self, g: Any, w: Any, h: Any, role: str, i: int, n: int, state: dict[str, Any]) -> Any:
        """Projection ``role`` of ``h`` as ``(B, n, T, hd)`` (normed and rotated for q, k)."""
        c = self.cfg
        b, t, _ = h.shape
        bias = w(c.name(role, i, "bias")) if c.arch.qkv_bias else None
        y = g.reshape(gr.linear(g, h, w(c.name(role, i)), bias), (b, t, n, c.head_dim))
        if role in ("q", "k"):
            if c.arch.qk_norm:
                y = self._norm(g, y, w(c.name(role + "_norm", i)))
            if state["pos"].shape[0] == 4 * t:  # M-RoPE's rows: a run with pictures
                sec = mrope_sections(c.head_dim, self.mrope)
                y = g.rope(y, state["pos"], c.head_dim, MROPE_MODE, sections=[*sec, 0], freq_base=c.arch.theta)
            else:
                y = g.rope(y, state["pos"], c.head_dim, ROPE_MODES[c.rope], freq_base=c.arch.theta)
        return g.cont(g.permute(y, (0, 2, 1, 3)))

    def build_block(self, g: Any, w: Any, i: int, state: dict[str, Any]) -> dict[str, Any]:
        if i >= self.active:
            return state  # after the last hidden state asked for: nothing to compute
        c = self.cfg
        x = state["x"]
        h = self._norm(g, x, w(c.name("norm1", i)))
        q = self._heads(g, w, h, "q", i, c.heads, state)
        k = self._heads(g, w, h, "k", i, c.kv_heads, state)
        v = self._heads(g, w, h, "v", i, c.kv_heads, state)
        # sdplan's CPU attention ops where they run (as CLIP's), else the plain softmax path
        a = gr.attention(g, q, k, v, state["mask"], flash=gr.sdplan_attention_op(g))
        x = g.add(x, gr.linear(g, a, w(c.name("o", i))))
        h = self._norm(g, x, w(c.name("norm2", i)))
        gate = g.unary("silu", gr.linear(g, h, w(c.name("gate", i))))
        x = g.add(x, gr.linear(g, g.mul(gate, gr.linear(g, h, w(c.name("up", i)))), w(c.name("down", i))))
        out = dict(state, x=x)
        if i + 1 in self.out_layers:
            out[f"out{i + 1}"] = x
        if i + 1 == self.active < c.n_blocks:  # the rest carry only the states asked for
            out = {k: v for k, v in out.items() if k.startswith("out")}
        return out

    def build_post(self, g: Any, w: Any, state: dict[str, Any]) -> dict[str, Any]:
        n = self.cfg.n_blocks
        parts = [self._norm(g, state["x"], w(self.cfg.name("final"))) if k == n + 1 else state[f"out{k}"]
                 for k in self.out_layers]
        hidden = parts[0]
        for p in parts[1:]:
            hidden = g.concat(hidden, p, 2)
        return {"hidden": hidden}
