"""The SDXL text conditioner: CLIP ViT-L and OpenCLIP ViT-bigG, the pooled embedding and the
vector conditioning (Podell et al. 2023, "SDXL", section 2.2; Stability's
``generative-models`` ``GeneralConditioner``), run as engine module graphs.

Base model (``conditioner.embedders.0`` ViT-L, ``.1`` bigG, or ``--clip_l``/``--clip_g``
files): the context is the penultimate hidden states of both encoders, without the final
LayerNorm, concatenated per token (768 + 1280 = 2048 wide); the vector ``y`` (2816 wide) is
bigG's pooled projection followed by 256-wide Fourier embeddings of the original size
``(H, W)``, the crop's top-left ``(0, 0)`` and the target size ``(H, W)``, in pixels.

Refiner (``conditioner.embedders.0`` is bigG, no ViT-L): the context is bigG's alone (1280);
the vector (2560) is the pooled projection, the original size, the crop and the aesthetic
score (diffusers' default 6.0 for the prompt, 2.5 for the negative prompt).

Tokenisation as sd-cli does it for SDXL: the prompt's ``(word:1.2)`` weights and 77-token
chunks (:class:`~sdplan.core.text.clip_tokenizer.ClipTokenizer`, end-of-text padding); bigG
takes the same ids with everything after the first end-of-text token set to 0 (OpenCLIP's
padding); each chunk is encoded by both encoders and concatenated, then the token weights
apply with sd-cli's mean-keeping rule; the pooled embedding comes from the first chunk
only. The default clip skip is 2 (the penultimate layer). With an empty negative prompt
sd-cli zeroes the negative context (``zero_out_masked``) but keeps its pooled embedding.

The Fourier embedding (``timestep_embedding`` of sd-cli's ``ggml_extend.hpp`` and diffusers'
``Timesteps(flip_sin_to_cos=True, downscale_freq_shift=0)``): for a value ``v`` and ``d``
dims, ``f_i = exp(-ln(10000) i / (d/2))``, output ``[cos(v f), sin(v f)]``.

LoRA note: the encoders' weights keep their checkpoint names (``conditioner.embedders.N.``
prefix; transformers names for ViT-L, open_clip names with fused ``attn.in_proj_weight``
for bigG), so ``lora_te1_*`` maps to ViT-L and ``lora_te2_*`` to bigG's layers.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.checkpoint import ModelSet, ModelTensor
from sdplan.core.models import clip as clip_m
from sdplan.core.runtime.runner import ModulePlacement
from sdplan.core.runtime.weights import WeightFile
from sdplan.core.text.clip_tokenizer import EOS_ID, ClipTokenizer
from sdplan.core.text.prompt import apply_prompt_weights

__all__ = ["SdxlConditioner", "fourier_embedding", "openclip_ids", "DEFAULT_AESTHETIC",
           "DEFAULT_NEGATIVE_AESTHETIC"]

#: diffusers' ``StableDiffusionXLImg2ImgPipeline`` defaults for the refiner's aesthetic score.
DEFAULT_AESTHETIC = 6.0
DEFAULT_NEGATIVE_AESTHETIC = 2.5
#: Tensors sd-cli never loads (``unused_tensors`` of its model loader).
_UNUSED = ("position_ids", "logit_scale")


def fourier_embedding(values: list[float], dim: int, max_period: float = 10000.0) -> np.ndarray:
    """Sinusoidal embeddings of ``values`` (see the module docstring), float32
    ``(len(values) * dim,)``: each value's ``[cos(v f), sin(v f)]`` in turn, computed in
    float32 as diffusers does. Raises ValueError for an odd or non-positive ``dim``."""
    if dim <= 0 or dim % 2:
        raise ValueError(f"fourier_embedding: dim must be a positive even number, got {dim}")
    half = dim // 2
    freqs = np.exp(np.float32(-math.log(max_period)) * np.arange(half, dtype=np.float32) / np.float32(half))
    args = np.asarray(values, dtype=np.float32)[:, None] * freqs[None, :].astype(np.float32)
    return np.concatenate([np.cos(args), np.sin(args)], axis=1).astype(np.float32).reshape(-1)


def openclip_ids(chunk: np.ndarray) -> tuple[np.ndarray, int]:
    """bigG's ids of one 77-id chunk and the index of its first end-of-text token: the ids
    after that token become 0 (sd-cli's conditioner; ``!`` padding of diffusers'
    ``tokenizer_2``). Without an end-of-text token the index is the last position."""
    ids = np.array(chunk, dtype=np.int32, copy=True)
    hits = np.flatnonzero(ids == EOS_ID)
    eos = int(hits[0]) if hits.size else len(ids) - 1
    ids[eos + 1:] = 0
    return ids, eos


@dataclass
class _Encoder:
    name: str
    cfg: clip_m.ClipConfig
    tensors: list[ModelTensor]
    projection: tuple[str, str] | None


class SdxlConditioner:
    """SDXL's text encoders on the engine (see the module docstring).

    Args:
        pipe: the owning pipeline (its ``new_runner`` builds the runners, registered in its
            ``runners`` as ``clip_l`` and ``clip_g``).
        ms: the model set; its ``te`` tensors of encoders ``clip_l`` and ``clip_g``.
        placement: the ``te`` placement: bigG gets it whole (its layers are te's blocks);
            ViT-L the main device and residency, no split.
        clip_heads: heads of both encoders (default width / 64).

    Raises:
        ModelFileError: no bigG encoder, no text projection, an encoder spread over several
            files, or a UNet vector width that fits neither the base nor the refiner.
    """

    def __init__(self, pipe: Any, ms: ModelSet, placement: ModulePlacement, adm_in_channels: int,
                 clip_heads: int | None = None) -> None:
        self.pipe = pipe
        self.placement = placement
        by_enc: dict[str, list[ModelTensor]] = {}
        for t in ms.module_tensors("te"):
            if not t.info.name.endswith(_UNUSED):
                by_enc.setdefault(t.encoder or "te", []).append(t)
        label = ms.files[0].path if ms.files else "?"
        if "clip_g" not in by_enc:
            raise ModelFileError(label, "no OpenCLIP ViT-bigG text encoder (clip_g): not an SDXL "
                                        "checkpoint; give --clip_g")
        self.encoders: dict[str, _Encoder] = {}
        for name in ("clip_l", "clip_g"):
            if name not in by_enc:
                continue
            shapes = {t.info.name: tuple(t.info.shape) for t in by_enc[name]}
            prefix, _ = clip_m.find_prefix(shapes)
            act = "gelu_erf" if name == "clip_g" else None
            cfg = clip_m.clip_config(shapes, n_heads=clip_heads, prefix=prefix, activation=act)
            proj = clip_m.find_projection(shapes, prefix) if name == "clip_g" else None
            if name == "clip_g" and proj is None:
                raise ModelFileError(by_enc[name][0].info.file, "the bigG text encoder has no "
                                                                "text_projection")
            keep = [t for t in by_enc[name] if t.info.name.startswith(prefix)
                    or (proj is not None and t.info.name == proj[0])]
            self.encoders[name] = _Encoder(name, cfg, keep, proj)
        g = self.encoders["clip_g"]
        assert g.projection is not None
        pshape = shapes_of(g)[g.projection[0]]
        self.pooled_dim = pshape[1] if g.projection[1] == "matrix" else pshape[0]
        self.refiner = "clip_l" not in self.encoders
        n_values = 5 if self.refiner else 6
        rest = adm_in_channels - self.pooled_dim
        if rest <= 0 or rest % n_values or (rest // n_values) % 2:
            raise ModelFileError(label, f"UNet vector width {adm_in_channels} does not fit a pooled "
                                        f"embedding of {self.pooled_dim} and {n_values} Fourier embeddings "
                                        f"({'refiner' if self.refiner else 'base'})")
        self.fourier_dim = rest // n_values
        self.context_dim = sum(e.cfg.width for e in self.encoders.values())
        self.tokenizer = ClipTokenizer(EOS_ID)
        self._skip: int | None = None

    # ------------------------------------------------------------------ runners

    def _placement(self, name: str) -> ModulePlacement:
        if name == "clip_g":
            return self.placement
        te = self.placement
        return ModulePlacement(te.devices[:1], (), te.params_mode, te.params_device)

    def _runners(self, clip_skip: int) -> dict[str, Any]:
        """The encoders' runners for ``clip_skip`` (rebuilt, weights reloaded, when it changes)."""
        if self._skip != clip_skip or any(name not in self.pipe.runners for name in self.encoders):
            for enc in self.encoders.values():
                clip_m.check_clip_skip(enc.cfg, clip_skip)
            self._skip = None  # a failed rebuild leaves no stale skip behind
            for name in self.encoders:
                old = self.pipe.runners.pop(name, None)
                if old is not None:
                    old.release()
            for name, enc in self.encoders.items():
                files = sorted({t.info.file for t in enc.tensors})
                if len(files) > 1:
                    raise ModelFileError(files[1], f"text encoder {name} spans several files: {', '.join(files)}")
                names = [t.info.name for t in enc.tensors]
                graph = clip_m.ClipGraph(enc.cfg, {n: n for n in names}, clip_skip, final_ln=False,
                                         projection=enc.projection)
                self.pipe.runners[name] = self.pipe.new_runner(name, graph, WeightFile(files[0], names),
                                                               self._placement(name))
            self._skip = clip_skip
        return {name: self.pipe.runners[name] for name in self.encoders}

    def release(self) -> None:
        """Forget the runners (the pipeline frees them)."""
        self._skip = None

    @contextlib.contextmanager
    def session(self, clip_skip: int = 0) -> Iterator[None]:
        """Keep both encoders' run-scoped weights loaded for several encodings."""
        with contextlib.ExitStack() as stack:
            for r in self._runners(_skip(clip_skip)).values():
                stack.enter_context(r.session())
            yield

    # ------------------------------------------------------------------ encoding

    def encode_ids(self, ids: np.ndarray, clip_skip: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Token-id chunks ``(K, 77)`` int32 -> ``(hidden (K, 77, context_dim), pooled (1, P))``
        float32, unweighted: per chunk ViT-L's then bigG's states, and bigG's pooled
        projection of the first chunk."""
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        runners = self._runners(_skip(clip_skip))
        mask = clip_m.causal_mask(ids.shape[1])
        parts = []
        if "clip_l" in runners:
            parts.append(runners["clip_l"].run({"ids": ids, "mask": mask})["hidden"])
        g_ids, eos = zip(*(openclip_ids(c) for c in ids), strict=True)
        rows = np.asarray([k * ids.shape[1] + e for k, e in enumerate(eos)], dtype=np.int32)
        out = runners["clip_g"].run({"ids": np.stack(g_ids), "mask": mask, "eos": rows})
        parts.append(out["hidden"])
        return np.concatenate(parts, axis=-1).astype(np.float32), out["pooled"][:1].astype(np.float32)

    def encode(self, prompt: str, clip_skip: int = 0, zero_out: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(context (1, 77*K, context_dim), pooled (1, P))`` float32 of a prompt with
        sd-cli's weights and chunks; ``zero_out`` zeroes the context (sd-cli's empty negative
        prompt), not the pooled embedding."""
        tp = self.tokenizer.tokenize(prompt)
        hidden, pooled = self.encode_ids(np.asarray(tp.ids, dtype=np.int32).reshape(-1, 77), clip_skip)
        hidden = apply_prompt_weights(hidden, np.asarray(tp.weights, dtype=np.float32).reshape(hidden.shape[:2]))
        if zero_out:
            hidden = np.zeros_like(hidden)
        return hidden.reshape(1, -1, hidden.shape[-1]).astype(np.float32), pooled

    def vector(self, pooled: np.ndarray, width: int, height: int, aesthetic: float | None = None) -> np.ndarray:
        """The UNet's vector ``(1, adm)`` float32: ``pooled`` ``(1, P)`` and the Fourier
        embeddings of (height, width), crop (0, 0) and (height, width), or for the refiner
        (height, width), crop (0, 0) and ``aesthetic`` (default :data:`DEFAULT_AESTHETIC`)."""
        values = [float(height), float(width), 0.0, 0.0]
        values += [DEFAULT_AESTHETIC if aesthetic is None else float(aesthetic)] if self.refiner else \
            [float(height), float(width)]
        emb = fourier_embedding(values, self.fourier_dim)
        return np.concatenate([np.asarray(pooled, np.float32).reshape(-1), emb])[None, :].astype(np.float32)


def shapes_of(enc: _Encoder) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of an encoder's tensors."""
    return {t.info.name: tuple(t.info.shape) for t in enc.tensors}


def _skip(clip_skip: int) -> int:
    """sd-cli's SDXL default clip skip: 2 (the penultimate layer)."""
    return clip_skip if clip_skip > 0 else 2
