"""Family rules for the LLM-encoder generation of image models, from tensor names and shapes.

:func:`z_image_family` recognises the Z-Image single-stream DiT (Turbo and base share one
architecture); :func:`llm_family` names the language model of a ``te`` file (the ``llm``
encoder). :func:`sdplan.core.modelfiles.checkpoint.detect_architecture` asks them first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

__all__ = ["z_image_family", "llm_family", "DIFFUSION_MARKERS"]

#: Name prefixes only a Z-Image DiT has (for classifying a standalone ``-m`` file).
DIFFUSION_MARKERS = ("cap_embedder.", "noise_refiner.", "context_refiner.")


def _count(names: Iterable[str], seg: str) -> int:
    pat = re.compile(re.escape(seg) + r"\.(\d+)\.")
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


def z_image_family(diffusion: Mapping[str, tuple[int, ...]], llm_names: Iterable[str] = ()
                   ) -> tuple[str, str | None, tuple[str, ...]] | None:
    """``("z_image", None, evidence)`` when the diffusion tensors (names without
    ``model.diffusion_model.``, shapes) are a Z-Image DiT, else None. The evidence names the
    layer counts, the caption width (the text encoder it expects) and, when ``llm_names`` are
    given, the text encoder found."""
    if "cap_embedder.1.weight" not in diffusion or not _count(diffusion, "noise_refiner"):
        return None
    ev = [f"{_count(diffusion, 'layers')} layers + {_count(diffusion, 'noise_refiner')} noise / "
          f"{_count(diffusion, 'context_refiner')} context refiners (Z-Image single-stream DiT)"]
    width = diffusion["cap_embedder.1.weight"]
    ev.append(f"caption width {width[-1]} (cap_embedder.1.weight {list(width)}): "
              + ("a Qwen3-4B text encoder" if width[-1] == 2560 else "a language-model text encoder"))
    llm = llm_family(llm_names)
    if llm:
        ev.append(f"text encoder: {llm}")
    return "z_image", None, tuple(ev)
