"""The SD3 text conditioner: CLIP ViT-L, OpenCLIP ViT-bigG and T5-XXL as stable-diffusion.cpp's
``SD3CLIPEmbedder`` combines them, run as engine module graphs.

Per 77-token chunk (sd-cli's ``chunk_len``): CLIP-L's and bigG's penultimate hidden states
(clip skip 2 by default, no final LayerNorm) are concatenated per token (768 + 1280 = 2048
wide) and zero-padded to the T5 width (4096); T5-XXL's states of the chunk's 77 T5 tokens
follow along the sequence, so a chunk is 154 rows. The pooled vector is CLIP-L's pooled
projection followed by bigG's (768 + 1280), from the first chunk: the last layer's state after
the final LayerNorm at the first end-of-text token, through ``text_projection``. Diffusers'
``StableDiffusion3Pipeline.encode_prompt`` builds the same with ``max_sequence_length=77``.

Tokens: the prompt's ``(word:1.2)`` weights, CLIP-L's ids padded with end-of-text, bigG's the
same ids with everything after the first end-of-text set to 0 (sd-cli's ``clip_g_tokenizer(0)``,
diffusers' ``!`` padding), T5's ids plus ``</s>``, padded with ``<pad>`` to 77 per chunk. Each
encoder's states get the token weights with sd-cli's mean-keeping rule. Without a T5 file the
T5 rows are zeros (sd-cli; SD3 files shipped without T5); an empty negative prompt is encoded,
not zeroed (sd-cli zeroes it for SDXL only).

Placement: T5-XXL takes the ``te`` placement (its blocks are te's layer-split blocks); the two
CLIP encoders run on the ``te`` main device with its residency.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.checkpoint import ModelSet, ModelTensor
from sdplan.core.models import clip as clip_m
from sdplan.core.models.t5 import T5Encoder
from sdplan.core.pipelines.sdxl.conditioner import openclip_ids
from sdplan.core.pipelines.work import input_shapes
from sdplan.core.runtime.runner import ModulePlacement
from sdplan.core.runtime.weights import WeightFile
from sdplan.core.text.clip_tokenizer import EOS_ID, ClipTokenizer
from sdplan.core.text.prompt import apply_prompt_weights
from sdplan.core.text.t5_tokenizer import T5Tokenizer

__all__ = ["Sd3Conditioner", "CHUNK"]

#: sd-cli's chunk length for all three encoders of SD3.
CHUNK = 77
_UNUSED = ("position_ids", "logit_scale")


def _one_file(name: str, tensors: list[ModelTensor]) -> str:
    files = sorted({t.info.file for t in tensors})
    if len(files) > 1:
        raise ModelFileError(files[1], f"text encoder {name} spans several files: {', '.join(files)}")
    return files[0]


class Sd3Conditioner:
    """SD3's text encoders on the engine (see the module docstring).

    Args:
        pipe: the owning pipeline (its ``new_runner`` builds the runners, registered in its
            ``runners`` as ``clip_l``, ``clip_g`` and ``t5xxl``).
        ms: the model set; its ``te`` tensors of encoders ``clip_l``, ``clip_g``, ``t5xxl``.
        placement: the ``te`` placement.
        context_dim: the DiT's context width (T5-XXL's, 4096; the zero rows without T5).
        pooled_dim: the DiT's pooled width (CLIP-L's plus bigG's projection, 2048).
        clip_heads: heads of both CLIP encoders (default width / 64).
        dtypes: weight name -> runtime dtype overrides.

    Raises:
        ModelFileError: no CLIP-L or no bigG encoder, a CLIP without ``text_projection``, an
            encoder spread over several files, or widths that do not fit the DiT.
    """

    def __init__(self, pipe: Any, ms: ModelSet, placement: ModulePlacement, context_dim: int, pooled_dim: int,
                 clip_heads: int | None = None, dtypes: Any = None) -> None:
        self.pipe, self.placement, self.dtypes = pipe, placement, dtypes
        self.context_dim, self.pooled_dim = context_dim, pooled_dim
        by_enc: dict[str, list[ModelTensor]] = {}
        for t in ms.module_tensors("te"):
            if not t.info.name.endswith(_UNUSED):
                by_enc.setdefault(t.encoder or "te", []).append(t)
        label = ms.files[0].path if ms.files else "?"
        missing = [f"--{e}" for e in ("clip_l", "clip_g") if e not in by_enc]
        if missing:
            raise ModelFileError(label, f"an SD3 run needs the CLIP-L and CLIP-G text encoders; give {' and '.join(missing)}")
        self.clip: dict[str, tuple[clip_m.ClipConfig, list[str], tuple[str, str], str]] = {}
        for name in ("clip_l", "clip_g"):
            shapes = {t.info.name: tuple(t.info.shape) for t in by_enc[name]}
            prefix, _ = clip_m.find_prefix(shapes)
            cfg = clip_m.clip_config(shapes, n_heads=clip_heads, prefix=prefix,
                                     activation="gelu_erf" if name == "clip_g" else None)
            proj = clip_m.find_projection(shapes, prefix)
            if proj is None:
                raise ModelFileError(by_enc[name][0].info.file, f"the {name} text encoder has no text_projection "
                                                                "(SD3's pooled vector needs it)")
            names = [n for n in shapes if n.startswith(prefix) or n == proj[0]]
            self.clip[name] = (cfg, names, proj, _one_file(name, by_enc[name]))
        widths = {n: c[0].width for n, c in self.clip.items()}
        pooled = sum(shapes_of(by_enc[n])[proj][1 if kind == "matrix" else 0]
                     for n, (_, _, (proj, kind), _) in self.clip.items())
        if pooled != pooled_dim or sum(widths.values()) > context_dim:
            raise ModelFileError(label, f"CLIP widths {widths} and pooled width {pooled} do not fit the MMDiT "
                                        f"(context {context_dim}, pooled {pooled_dim})")
        self.t5: T5Encoder | None = None
        if "t5xxl" in by_enc:
            self.t5_file = _one_file("t5xxl", by_enc["t5xxl"])
            self.t5 = T5Encoder.from_weights(shapes_of(by_enc["t5xxl"]))
            if self.t5.cfg.width != context_dim:
                raise ModelFileError(self.t5_file, f"T5 width {self.t5.cfg.width} does not fit the MMDiT's "
                                                   f"context width {context_dim}")
        self.tokenizer = ClipTokenizer(EOS_ID)
        self._skip: int | None = None

    # ------------------------------------------------------------------ runners

    def _runners(self, clip_skip: int) -> dict[str, Any]:
        """The encoders' runners (the CLIP ones rebuilt, weights reloaded, when ``clip_skip``
        changes)."""
        te = self.placement
        if self.t5 is not None and "t5xxl" not in self.pipe.runners:
            t5 = self.t5
            names = t5.other_tensors() + [n for i in range(t5.n_blocks) for n in t5.block_tensors(i)]
            wf = WeightFile(self.t5_file, names, dtypes=self.dtypes)
            self.pipe.runners["t5xxl"] = self.pipe.new_runner("t5xxl", t5, wf, te)
        if self._skip != clip_skip or any(name not in self.pipe.runners for name in self.clip):
            for cfg, *_ in self.clip.values():
                clip_m.check_clip_skip(cfg, clip_skip)
            self._skip = None  # a failed rebuild leaves no stale skip behind
            main = ModulePlacement(te.devices[:1], (), te.params_mode, te.params_device)
            for name, (cfg, names, proj, path) in self.clip.items():
                old = self.pipe.runners.pop(name, None)
                if old is not None:
                    old.release()
                graph = clip_m.ClipGraph(cfg, {n: n for n in names}, clip_skip, final_ln=False, projection=proj)
                self.pipe.runners[name] = self.pipe.new_runner(name, graph, WeightFile(path, names, dtypes=self.dtypes),
                                                               main)
            self._skip = clip_skip
        return {n: self.pipe.runners[n] for n in ("clip_l", "clip_g", "t5xxl") if n in self.pipe.runners}

    @contextlib.contextmanager
    def session(self, clip_skip: int = 0) -> Iterator[None]:
        """Keep the encoders' run-scoped weights loaded for several encodings."""
        with contextlib.ExitStack() as stack:
            for r in self._runners(_skip(clip_skip)).values():
                stack.enter_context(r.session())
            yield

    def release(self) -> None:
        """Forget the CLIP runners' clip skip (the pipeline frees the runners)."""
        self._skip = None

    # ------------------------------------------------------------------ encoding

    def encode(self, prompt: str, clip_skip: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(context (1, 154 K, context_dim), pooled (1, pooled_dim))`` float32 of ``prompt``
        (sd-cli weighting syntax) in K chunks of 77 CLIP then 77 T5 rows."""
        runners = self._runners(_skip(clip_skip))
        tp = self.tokenizer.tokenize(prompt)
        ids = np.asarray(tp.ids, dtype=np.int32).reshape(-1, CHUNK)
        weights = np.asarray(tp.weights, dtype=np.float32).reshape(ids.shape)
        t5_tok = T5Tokenizer().tokenize(prompt, None) if self.t5 is not None else None
        n_t5 = len(t5_tok.ids.reshape(-1)) if t5_tok is not None else 0
        chunks = max(ids.shape[0], math.ceil(n_t5 / CHUNK))
        if chunks > ids.shape[0]:  # T5 is longer: CLIP chunks of end-of-text padding
            pad = np.full((chunks - ids.shape[0], CHUNK), EOS_ID, np.int32)
            pad[:, 0] = ids[0, 0]
            ids = np.concatenate([ids, pad])
            weights = np.concatenate([weights, np.ones(pad.shape, np.float32)])
        mask = clip_m.causal_mask(CHUNK)
        hid_l = runners["clip_l"].run({"ids": ids, "mask": mask, "eos": _eos_rows(ids)})
        g_ids = np.stack([openclip_ids(c)[0] for c in ids])
        hid_g = runners["clip_g"].run({"ids": g_ids, "mask": mask, "eos": _eos_rows(g_ids)})
        clip = np.concatenate([apply_prompt_weights(hid_l["hidden"], weights),
                               apply_prompt_weights(hid_g["hidden"], weights)], axis=-1)
        clip = np.pad(clip, ((0, 0), (0, 0), (0, self.context_dim - clip.shape[-1])))
        t5 = np.zeros((chunks, CHUNK, self.context_dim), np.float32)
        if t5_tok is not None:
            t5 = self._t5(runners["t5xxl"], prompt, chunks)
        context = np.concatenate([clip, t5], axis=1).reshape(1, -1, self.context_dim)
        pooled = np.concatenate([hid_l["pooled"][:1], hid_g["pooled"][:1]], axis=-1)
        return context.astype(np.float32), pooled.astype(np.float32)

    def dry_run_inputs(self, clip_skip: int = 0) -> list[tuple[Any, dict[str, tuple[int, ...]]]]:
        """``(runner, input shapes)`` of each encoder on one 77-token chunk, for a dry-run
        reserve of their compute buffers (they run one after another)."""
        runners = self._runners(_skip(clip_skip))
        clip = {"ids": (1, CHUNK), "mask": (CHUNK, CHUNK), "eos": (1,)}
        out = [(runners[n], dict(clip)) for n in ("clip_l", "clip_g")]
        if self.t5 is not None:
            ids = np.zeros((1, CHUNK), np.int32)
            out.append((runners["t5xxl"], input_shapes(self.t5.inputs(ids))))
        return out

    def _t5(self, runner: Any, prompt: str, chunks: int) -> np.ndarray:
        """T5 states ``(chunks, 77, width)``: each chunk of the padded ids encoded alone."""
        assert self.t5 is not None
        tok = T5Tokenizer().tokenize(prompt, chunks * CHUNK)
        ids = np.asarray(tok.ids).reshape(chunks, CHUNK)
        weights = np.asarray(tok.weights, dtype=np.float32).reshape(chunks, CHUNK)
        out = [runner.run(self.t5.inputs(ids[k:k + 1]))["hidden"][0] for k in range(chunks)]
        return apply_prompt_weights(np.stack(out), weights)


def shapes_of(tensors: list[ModelTensor]) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> numpy-order shape."""
    return {t.info.name: tuple(t.info.shape) for t in tensors}


def _eos_rows(ids: np.ndarray) -> np.ndarray:
    """Row ``k * 77 + position`` of each chunk's first end-of-text token (the last position
    without one), as :class:`~sdplan.core.models.clip.ClipGraph` takes ``eos``."""
    rows = []
    for k, c in enumerate(ids):
        hits = np.flatnonzero(c == EOS_ID)
        rows.append(k * ids.shape[1] + (int(hits[0]) if hits.size else ids.shape[1] - 1))
    return np.asarray(rows, dtype=np.int32)


def _skip(clip_skip: int) -> int:
    """sd-cli's SD3 default clip skip: 2 (the penultimate layer)."""
    return clip_skip if clip_skip > 0 else 2
