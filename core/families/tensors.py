"""What the families' detection rules share: counting numbered blocks, naming a language
model, and reading a LoRA file's names (pure Python over tensor names and shapes)."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping

__all__ = ["count_blocks", "llm_family", "lora_flat_names", "lora_context_width"]


def count_blocks(names: Iterable[str], segment: str) -> int:
    """The number of distinct ``<segment>.<N>.`` indices at the start of ``names``."""
    pat = re.compile(re.escape(segment) + r"\.(\d+)\.")
    return len({m.group(1) for n in names if (m := pat.match(n))})


def llm_family(names: Iterable[str]) -> str | None:
    """``qwen3`` (per-head q/k norms), ``qwen2.5`` (q/k/v biases) or ``llm`` (another
    decoder-only model) for the tensor names of a language model in transformers or
    llama.cpp names, with its block count, e.g. ``qwen3, 36 blocks``; None without blocks."""
    names = list(names)
    pat = re.compile(r"(?:^|\.)(?:layers|blk)\.(\d+)\.")
    blocks = {m.group(1) for n in names if (m := pat.search(n))}
    if not blocks:
        return None
    if any(n.endswith(("self_attn.q_norm.weight", "attn_q_norm.weight")) for n in names):
        kind = "qwen3"
    elif any(n.endswith(("self_attn.q_proj.bias", "attn_q.bias")) for n in names):
        kind = "qwen2.5"
    else:
        kind = "llm"
    return f"{kind}, {len(blocks)} blocks"


def lora_flat_names(names: Collection[str]) -> list[str]:
    """LoRA tensor names with ``_`` as ``.`` (kohya's ``lora_unet_double_blocks_0_...`` and
    PEFT's ``double_blocks.0....`` read alike)."""
    return [n.replace("_", ".") for n in names]


_DOWN = (".lora.down.", ".lora.A.", ".lora.down", ".lora.A")


def lora_context_width(names: Collection[str], shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    """The cross-attention context width a UNet LoRA was trained on: the input width of an
    ``attn2.to_k`` down matrix (``(rank, width)``, or ``(rank, width, 1, 1)`` as a
    convolution); None when the file has none."""
    for name in names:
        flat = name.replace("_", ".")
        if "attn2" in flat and "to.k" in flat and any(d in flat for d in _DOWN):
            shape = shapes.get(name, ())
            if len(shape) in (2, 4):
                return int(shape[1])
    return None
