"""UNet checkpoints (SD 1.x/2.x, SDXL): their engine stages, the units ``--max-vram``
segmentation cuts a UNet at (spec section 8 keeps UNets unsplittable; these are not planner
blocks). Their family is one of the family registry's rules (:mod:`sdplan.core.families`).

Stages in execution order (the original single-file names, with or without the
``model.diffusion_model.`` prefix): ``input_blocks.N`` for N >= 1 (``input_blocks.0`` is the
stem, a fixed tensor like the time embedding and ``out``), ``middle_block``, then
``output_blocks.N``. :class:`sdplan.core.models.unet.UNetGraph` runs the same stages.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["stage_of", "stage_bytes"]

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
