"""A model's layout errors name its file, and the head counts name where they came from.

The architectures' config readers (:func:`sdplan.core.models.unet.unet_config`,
:func:`sdplan.core.models.clip.clip_config`, ...) check the tensors' shapes and the head rule
before any graph is built, and raise :class:`~sdplan.core.models.base.ModelLayoutError`
naming the tensor; they know shapes, not files. A pipeline reads them inside
:func:`naming_the_file`, which turns the error into a
:class:`~sdplan.core.errors.ModelFileError` naming the file, and, for an error about heads,
says where the head counts came from: a flag (``--unet-heads 3``), the file's ``sdplan.*``
metadata (``sdplan.unet_heads=3``), or the family's rule.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from sdplan.core.errors import ModelFileError
from sdplan.core.models.base import ModelLayoutError

__all__ = ["HEAD_FLAGS", "naming_the_file"]

#: Head-count keyword -> the flag that sets it.
HEAD_FLAGS = {"clip_heads": "--clip-heads", "unet_heads": "--unet-heads",
              "unet_head_dim": "--unet-head-dim", "flux_heads": "--flux-heads"}


def _origin(message: str, given: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    if "head" not in message:
        return ""
    keys = {"clip_heads"} if "CLIP" in message else set(HEAD_FLAGS) - {"clip_heads"}
    parts = [f"{HEAD_FLAGS[k]} {v}" for k, v in given.items() if k in keys and v]
    parts += [f"the file's metadata sdplan.{k}={v}" for k, v in meta.items()
              if k in keys and not given.get(k)]
    return f" (heads from {', '.join(parts)})" if parts else " (heads from the family's rule)"


@contextlib.contextmanager
def naming_the_file(path: str, given: Mapping[str, Any] | None = None,
                    meta: Mapping[str, Any] | None = None) -> Iterator[None]:
    """Turn a ModelLayoutError raised inside into a ModelFileError naming ``path``.

    Args:
        path: the model file.
        given: head counts passed by flags (``clip_heads``, ``unet_heads``...; None: unset).
        meta: head counts read from the file's metadata
            (:func:`sdplan.core.pipelines.sd.model_overrides`).

    Raises:
        ModelFileError: ``"PATH: tensor ...: 64 channels do not split into 3 heads of equal
            width (heads from --unet-heads 3)"``.
    """
    try:
        yield
    except ModelLayoutError as exc:
        raise ModelFileError(path, f"{exc}{_origin(str(exc), given or {}, meta or {})}") from None
