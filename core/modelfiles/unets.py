"""UNet checkpoints (SD 1.x/2.x, SDXL): their family from names, shapes and metadata, and
their engine stages: the units ``--max-vram`` segmentation cuts a UNet at (spec section 8
keeps UNets unsplittable; these are not planner blocks).

Stages in execution order (the original single-file names, with or without the
``model.diffusion_model.`` prefix): ``input_blocks.N`` for N >= 1 (``input_blocks.0`` is the
stem, a fixed tensor like the time embedding and ``out``), ``middle_block``, then
``output_blocks.N``. :class:`sdplan.core.models.unet.UNetGraph` runs the same stages.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping

__all__ = ["stage_of", "stage_bytes", "unet_family"]

_STAGE_RE = re.compile(r"(?:^|\.)(input_blocks|middle_block|output_blocks)\.(\d+)\.")
_RANK = {"input_blocks": 0, "middle_block": 1, "output_blocks": 2}


def stage_of(name: str) -> tuple[int, int] | None:
    """``(rank, index)`` of the stage holding tensor ``name`` (rank 0 input blocks, 1 the
    middle block, 2 output blocks), or None for a tensor outside every stage."""
    m = _STAGE_RE.search(name)
    if m is None or (m.group(1) == "input_blocks" and m.group(2) == "0"):
        return None
    return _RANK[m.group(1)], 0 if m.group(1) == "middle_block" else int(m.group(2))


def stage_bytes(tensors: Iterable[tuple[str, int]]) -> tuple[int, ...]:
    """Bytes per stage, in execution order, of ``(name, bytes)`` pairs; empty when no name
    is in a stage."""
    per: dict[tuple[int, int], int] = {}
    for name, nbytes in tensors:
        key = stage_of(name)
        if key is not None:
            per[key] = per.get(key, 0) + nbytes
    return tuple(per[k] for k in sorted(per))


def unet_family(diff: Mapping[str, tuple[int, ...]], named: Collection[str | None],
                encoders: Collection[str | None]) -> tuple[str, str | None, tuple[str, ...]] | None:
    """``(family, variant, evidence)`` of a UNet from its diffusion tensors' local names and
    shapes, or None when none has a cross-attention ``attn2.to_k``: context width 768 ->
    sd1, 1024 -> sd2, 2048 with ``label_emb`` -> sdxl (1280: the refiner); another width ->
    the family of the files' ``sdplan.family`` metadata (``named``: sd1, sd2, or sdxl with
    ``label_emb``, its refiner when the text ``encoders`` lack clip_l; scaled-down models
    such as the demo), else None (the caller's ``unknown``)."""
    ctx = next(((n, s[1]) for n, s in diff.items() if ".attn2.to_k.weight" in n and len(s) == 2), None)
    if ctx is None:
        return None
    ev = [f"UNet cross-attention context {ctx[1]} ({ctx[0]} {list(diff[ctx[0]])})"]
    sdxl_emb = any(n.startswith(("label_emb.", "add_embedding.")) for n in diff)
    if sdxl_emb:
        ev.append("label_emb/add_embedding present (SDXL size conditioning)")
    known = {768: "sd1", 1024: "sd2", 2048: "sdxl"}
    if ctx[1] in known:
        return known[ctx[1]], None, tuple(ev)
    if ctx[1] == 1280 and sdxl_emb:
        return "sdxl", "refiner", tuple(ev)
    # A scaled-down UNet (sdplan's demo model, test models) names its family in the file's
    # metadata, as the pipelines read it (sdplan.core.pipelines.sd.METADATA_KEYS).
    fam = {f for f in named if f in ("sd1", "sd2", "sdxl")}
    if len(fam) == 1 and (fam == {"sdxl"}) == sdxl_emb:
        family = fam.pop()
        ev.append(f"file metadata sdplan.family = {family}")
        refiner = family == "sdxl" and bool(set(encoders) - {None}) and "clip_l" not in encoders
        return family, "refiner" if refiner else None, tuple(ev)
    return None
