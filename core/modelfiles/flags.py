"""Model files -> the sd-cli flags that name them (``-m`` for a whole checkpoint,
``--diffusion-model``, ``--t5xxl``, ``--vae``... for a file holding one module)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from sdplan.core.modelfiles.checkpoint import ModelSet
from sdplan.core.planning.modules import flag_for


def files_by_flag(ms: ModelSet, flags: Mapping[str, Sequence[str | Path]]) -> dict[str, list[str]]:
    """sd-cli model flags for the files of a model set: a file given as ``model`` whose
    tensors all belong to one module (or one encoder) gets that module's flag
    (``diffusion_model``, ``t5xxl``, ``vae``, ``taesd``...; :func:`flag_for`); anything else
    keeps the flag it was given."""
    by_file: dict[str, set[tuple[str, str | None, str]]] = {}
    for t in ms.tensors:
        by_file.setdefault(str(t.info.file), set()).add((t.module, t.encoder, t.role))
    out: dict[str, list[str]] = {}
    for key, paths in flags.items():
        for p in paths:
            flag = key
            kinds = by_file.get(str(p), set())
            if key == "model" and len({k[0] for k in kinds}) == 1:
                # an LLM's vision tower is part of its --llm file
                encoders = {"llm" if k[1] == "llm_vision" else k[1] for k in kinds}
                roles = {k[2] for k in kinds}
                module = next(iter(kinds))[0]
                if len(encoders) == 1 and len(roles) == 1:
                    flag = flag_for(module, next(iter(encoders)), next(iter(roles)))
            out.setdefault(flag, []).append(str(p))
    return out
