"""Whether each model file holds what its flag says, from its tensor names alone.

``read_model_files`` puts every tensor of ``--llm FILE`` into the ``llm`` encoder because the
flag says so; a CLIP file given there then fails only inside the engine, as "no language
model", naming neither the flag nor the file. :func:`check_file_roles` reads each encoder's
and the VAE's headers first and refuses a file whose tensor names say it is another kind of
model, naming the flag, the file and what it holds. Only clear mismatches are refused: a kind
the names do not tell (an unknown layout) passes, as do the CLIP widths (a tiny ``--clip_g``
is as wide as a CLIP-L), and T5 and UMT5 (one ``t5xxl`` kind, told apart by the pipeline).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.checkpoint import detect_standalone
from sdplan.core.modelfiles.readers import read_tensor_file

__all__ = ["check_file_roles", "check_files", "kind_of"]

#: flag key -> (its spelling, the kind of model it takes)
ROLES = {"llm": ("--llm", "a language model"), "t5xxl": ("--t5xxl", "a T5 encoder"),
         "clip_l": ("--clip_l", "a CLIP text encoder"), "clip_g": ("--clip_g", "a CLIP text encoder"),
         "vae": ("--vae", "an autoencoder")}

#: detect_standalone's (module, encoder) -> the kind a reader is told
_KINDS = {("te", "llm"): "a language model", ("te", "t5xxl"): "a T5 encoder",
          ("te", "clip_l"): "a CLIP text encoder", ("te", "clip_g"): "a CLIP text encoder",
          ("te", "openclip_h"): "a CLIP text encoder", ("vae", None): "an autoencoder",
          ("diffusion", None): "a diffusion model", ("controlnet", None): "a ControlNet",
          ("clip_vision", None): "a CLIP vision encoder", ("upscaler", None): "an upscaler",
          ("taesd", None): "a tiny autoencoder"}


def kind_of(path: str | Path) -> str | None:
    """What a standalone model file holds by its tensor names (``"a language model"``...),
    or None when the names do not tell (a single-file checkpoint, an unknown layout).

    Raises:
        ModelFileError: the file cannot be read (as :func:`read_tensor_file`).
    """
    tf = read_tensor_file(path)
    try:
        target = detect_standalone(tf)
    except ModelFileError:
        return None
    return _KINDS.get(target) if target is not None else None


def check_file_roles(files: Mapping[str, Sequence[str]]) -> None:
    """Refuse an encoder or VAE file that holds another kind of model (module docstring).

    Args:
        files: sd-cli's model flag keys (``llm``, ``t5xxl``, ``vae``...) -> file paths; other
            keys and folders are not checked here.

    Raises:
        ModelFileError: ``"FILE: --llm takes a language model; this file holds a CLIP text
            encoder"``, naming the file and the flag.
    """
    for key, (flag, want) in ROLES.items():
        for path in files.get(key, ()):
            if Path(path).is_dir():
                continue
            have = kind_of(path)
            if have is not None and have != want:
                raise ModelFileError(path, f"{flag} takes {want}; this file holds {have}")


def check_files(models: Any, files: Mapping[str, Sequence[str]]) -> Any:
    """``models`` (a :class:`~sdplan.core.modelfiles.checkpoint.ModelSet` read from ``files``)
    once its family's own check finds that the files fit together
    (:meth:`~sdplan.core.families.declaration.Family.check_files`: a Wan DiT with the
    autoencoder of its latent channels...), before anything loads.

    Raises:
        ModelFileError: as the family's check raises it, naming the file and its flag.
    """
    from sdplan.core.families import family

    fam = family(models.architecture.family)
    if fam is not None:
        fam.check_files(files)
    return models
