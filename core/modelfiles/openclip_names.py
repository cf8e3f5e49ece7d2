"""OpenCLIP text-tower tensor names -> transformers' ``CLIPTextModelWithProjection`` names.

SD 2.x and SDXL single files store their OpenCLIP text encoders (ViT-H, ViT-bigG) in
open_clip's names (``transformer.resblocks.N.attn.in_proj_weight``...), while the standalone
``clip_g.safetensors`` files, LoRA trainers (kohya's ``lora_te2_text_model_encoder_...``,
diffusers' ``text_encoder_2.``) and stable-diffusion.cpp's loader use transformers' names
(``text_model.encoder.layers.N.self_attn.q_proj.weight``...). The one table of that renaming,
as diffusers' single-file converter (``convert_open_clip_checkpoint``) and stable-diffusion.cpp's
``name_conversion.cpp`` apply it (names after the tower's prefix):

==========================================  ======================================================
open_clip                                   transformers
==========================================  ======================================================
``token_embedding.weight``                  ``text_model.embeddings.token_embedding.weight``
``positional_embedding``                    ``text_model.embeddings.position_embedding.weight``
``ln_final.{weight,bias}``                  ``text_model.final_layer_norm.{weight,bias}``
``text_projection`` (``P``, ``x @ P``)      ``text_projection.weight`` = ``P.T`` (a linear layer)
``transformer.resblocks.N.``                ``text_model.encoder.layers.N.``
  ``attn.in_proj_{weight,bias}``            ``self_attn.{q,k,v}_proj.{weight,bias}``: its thirds
                                            along axis 0, in that order
  ``attn.out_proj``                         ``self_attn.out_proj``
  ``ln_1`` / ``ln_2``                       ``layer_norm1`` / ``layer_norm2``
  ``mlp.c_fc`` / ``mlp.c_proj``             ``mlp.fc1`` / ``mlp.fc2``
``logit_scale``                             none (the contrastive loss's temperature)
==========================================  ======================================================

:func:`openclip_to_transformers` renames one tensor; :func:`convert_openclip` a whole tower,
with the caller's split and transpose (shapes, arrays).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["ClipName", "DROPPED", "openclip_to_transformers", "convert_openclip"]

V = TypeVar("V")

#: open_clip names outside the blocks -> transformers names.
_TOP = {"token_embedding.weight": "text_model.embeddings.token_embedding.weight",
        "positional_embedding": "text_model.embeddings.position_embedding.weight",
        "ln_final.weight": "text_model.final_layer_norm.weight",
        "ln_final.bias": "text_model.final_layer_norm.bias",
        "text_projection": "text_projection.weight"}
#: a block's modules: open_clip -> transformers.
_BLOCK = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "attn.out_proj": "self_attn.out_proj",
          "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
#: open_clip tensors transformers' text model has no counterpart of.
DROPPED = ("logit_scale",)
_RESBLOCK = re.compile(r"transformer\.resblocks\.(\d+)\.(.+)")


@dataclass(frozen=True)
class ClipName:
    """Where one open_clip tensor goes in transformers' names.

    Attributes:
        names: the transformers names; several (q, k, v) are the open_clip tensor's equal
            parts along axis 0 (its output rows), in this order.
        transposed: the transformers tensor is the open_clip one transposed (the text
            projection: open_clip applies ``P`` as ``x @ P``, transformers a linear layer
            ``x @ W.T``, so ``W = P.T``).
    """

    names: tuple[str, ...]
    transposed: bool = False


def openclip_to_transformers(name: str) -> ClipName | None:
    """The transformers name(s) of the open_clip text-tower tensor ``name`` (after the tower's
    prefix: ``transformer.resblocks.3.attn.in_proj_weight``, ``text_projection``...; module
    docstring), or None for a name with none (:data:`DROPPED`, or not a text-tower name)."""
    if name in _TOP:
        return ClipName((_TOP[name],), name == "text_projection")
    m = _RESBLOCK.fullmatch(name)
    if m is None:
        return None
    layer, rest = f"text_model.encoder.layers.{m.group(1)}.", m.group(2)
    if rest in ("attn.in_proj_weight", "attn.in_proj_bias"):
        kind = rest[len("attn.in_proj_"):]
        return ClipName(tuple(f"{layer}self_attn.{c}_proj.{kind}" for c in "qkv"))
    module, _, kind = rest.rpartition(".")
    if module in _BLOCK and kind in ("weight", "bias"):
        return ClipName((f"{layer}{_BLOCK[module]}.{kind}",))
    return None


def convert_openclip(tensors: Mapping[str, V], prefix: str, split: Callable[[V, int], Sequence[V]],
                     transpose: Callable[[V], V]) -> dict[str, V]:
    """The open_clip text tower under ``prefix`` in ``tensors`` (name -> value: a shape, an
    array) in transformers' names (:func:`openclip_to_transformers`), in the order of
    ``tensors``; :data:`DROPPED` tensors left out. ``split(value, n)`` gives a fused tensor's
    ``n`` equal parts along axis 0, ``transpose(value)`` the text projection's transpose.

    Raises:
        ValueError: a name under ``prefix`` that is neither renamed nor dropped, naming it.
    """
    out: dict[str, V] = {}
    for full, value in tensors.items():
        if not full.startswith(prefix):
            continue
        name = full[len(prefix):]
        to = openclip_to_transformers(name)
        if to is None:
            if name in DROPPED:
                continue
            raise ValueError(f"{full}: not an OpenCLIP text-tower tensor name")
        if len(to.names) > 1:
            out.update(zip(to.names, split(value, len(to.names)), strict=True))
        else:
            out[to.names[0]] = transpose(value) if to.transposed else value
    return out
