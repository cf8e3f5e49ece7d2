"""The LLM text encoder's tensors a family's graph never reads.

A family reads the hidden states :attr:`sdplan.core.families.declaration.Family.llm_layers`
names; the blocks after the last of them never run. stable-diffusion.cpp (97d2990) builds its
``LLMEmbedder`` graph from those ``out_layers`` and loads only the parameters that graph uses
(``collect_used_param_tensors`` in ``src/core/ggml_extend.hpp``, through its weight manager's
``prepare_params``: 298 of Qwen3-4B's 398 tensors for FLUX.2 klein), and sdplan's engine does
the same (:attr:`sdplan.core.models.llm.LLMEncoder.blocks_read`). The unread tensors are:

* the blocks from the read count on (klein: 27..35 of Qwen3-4B's 36; Z-Image: the last;
  FLUX.2 dev: 30..39 of Mistral-Small's 40);
* the final norm (``model.norm``, GGUF ``output_norm``) when the final normed state is not
  read (klein, dev, Z-Image);
* the output head (``lm_head``, GGUF ``output``), which no graph reads (sd-cli's loader lists
  it as unused).

The token embedding is always read. A family that reads the final state (Qwen-Image) or
declares no states, and every encoder but the LLM's text blocks (its vision tower, CLIP, T5),
keep all their tensors. sd-cli's ``--eager-load`` loads every registered tensor at start, and
its ``--auto-fit`` counts every tensor of the file; neither is modelled here.

Pure Python (the family registry and tensor names only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Protocol

from sdplan.core.families import family_of
from sdplan.core.planning.profile import ModuleProfile

__all__ = ["unread_llm_tensors", "is_llm_tail", "trim_llm_profile"]

_FINAL_NORM = re.compile(r"(?:^|\.)(?:norm|output_norm)\.weight$")
_HEAD = re.compile(r"(?:^|\.)(?:lm_head|output)\.weight$")


def is_llm_tail(name: str) -> bool:
    """True for an LLM encoder's final norm or output head (a non-block tensor's name)."""
    return bool(_HEAD.search(name) or _FINAL_NORM.search(name))


class _Info(Protocol):
    name: str


class _Tensor(Protocol):
    info: _Info
    module: str
    encoder: str | None
    block: tuple[int, int] | None


def unread_llm_tensors(tensors: Iterable[_Tensor], architecture: str | None) -> frozenset[str]:
    """Names of the ``llm`` text encoder's tensors the family of ``architecture`` (a profile's
    architecture name: ``flux2_klein-4b``) never reads (module docstring); empty for a family
    that declares no LLM states, an unknown architecture, no LLM blocks among ``tensors``, or
    an encoder without a state the family reads (klein's 27th of a shorter encoder: the
    pipeline refuses it by name when it loads; the plan counts the whole file meanwhile).
    """
    fam = family_of(architecture) if architecture else None
    if fam is None or not fam.llm_layers:
        return frozenset()
    llm = [t for t in tensors if t.module == "te" and t.encoder == "llm"]
    blocks = {t.block[1] for t in llm if t.block is not None}
    if not blocks:
        return frozenset()
    n = max(blocks) + 1
    try:
        read, final = fam.llm_blocks_read(n), n + 1 in fam.llm_out_layers(n)
    except ValueError:
        return frozenset()
    out = {t.info.name for t in llm if (t.block is not None and t.block[1] >= read) or (
        t.block is None and (_HEAD.search(t.info.name) or (not final and _FINAL_NORM.search(t.info.name))))}
    return frozenset(out)


def trim_llm_profile(mp: ModuleProfile, architecture: str | None) -> ModuleProfile:
    """``mp``, the ``te`` profile of LLM files read without their diffusion model (the model
    library's per-file profiles), less what the family of ``architecture`` never reads: the
    blocks after its last state and, when it does not read the final state, the
    :attr:`~sdplan.core.planning.profile.ModuleProfile.tail` (final norm and output head).
    The same bytes :func:`unread_llm_tensors` leaves out of files read together, but for a
    family that reads the final state among others, whose output head stays counted.
    ``mp`` unchanged when the family declares no states, its blocks are not the LLM's or it
    lacks a state the family reads."""
    fam = family_of(architecture) if architecture else None
    n = len(mp.blocks)
    if fam is None or not fam.llm_layers or mp.block_encoder != "llm" or not n:
        return mp
    try:
        read, final = fam.llm_blocks_read(n), n + 1 in fam.llm_out_layers(n)
    except ValueError:
        return mp
    tail = 0 if final else mp.tail
    dropped = sum(mp.blocks[read:]) + tail
    encoders = {**mp.encoders, "llm": mp.encoders.get("llm", 0) - dropped} if "llm" in mp.encoders else dict(mp.encoders)
    return ModuleProfile(mp.blocks[:read], mp.other - tail, encoders, mp.block_encoder, mp.stages, mp.tail - tail)
