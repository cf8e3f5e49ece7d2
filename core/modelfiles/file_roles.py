"""Whether each model file holds what its flag says, from its tensor names alone.

``read_model_files`` puts every tensor of ``--llm FILE`` into the ``llm`` encoder because the
flag says so; a CLIP file given there then fails only inside the engine, as "no language
model", naming neither the flag nor the file. :func:`check_file_roles` reads each encoder's
and the VAE's headers first and refuses a file whose tensor names say it is another kind of
model, naming the flag, the file and what it holds; likewise a ``-m``, ``--diffusion-model``
or ``--high-noise-diffusion-model`` file that holds no diffusion model as ``-m`` reads it (its
single-file prefixes, else its standalone layout: an autoencoder, a text encoder...). Only
clear mismatches are refused: a kind the names do not tell (an unknown layout) passes, as do
the CLIP widths (a tiny ``--clip_g`` is as wide as a CLIP-L), and T5 and UMT5 (one ``t5xxl``
kind, told apart by the pipeline). :func:`check_files` then checks that the files fit
together (:mod:`sdplan.core.modelfiles.file_sets`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sdplan.core.errors import ModelFileError, SdplanError
from sdplan.core.modelfiles.checkpoint import (
    classify_checkpoint,
    detect_standalone,
    read_model_files,
)
from sdplan.core.modelfiles.file_sets import check_companions, regular_files
from sdplan.core.modelfiles.readers import read_tensor_file

__all__ = ["check_file_roles", "check_files", "held_besides_diffusion", "kind_of", "of_another_family",
           "read_checked"]

#: flag key -> (its spelling, the kind of model it takes)
ROLES = {"llm": ("--llm", "a language model"), "t5xxl": ("--t5xxl", "a T5 encoder"),
         "clip_l": ("--clip_l", "a CLIP text encoder"), "clip_g": ("--clip_g", "a CLIP text encoder"),
         "vae": ("--vae", "an autoencoder")}
#: diffusion-model flag key -> (its spelling, what it takes)
DIFFUSION_ROLES = {"model": ("-m", "a checkpoint or a diffusion model"),
                   "diffusion_model": ("--diffusion-model", "a diffusion model"),
                   "high_noise_diffusion_model": ("--high-noise-diffusion-model", "a diffusion model")}

#: detect_standalone's (module, encoder) -> the kind a reader is told
_KINDS = {("te", "llm"): "a language model", ("te", "t5xxl"): "a T5 encoder",
          ("te", "clip_l"): "a CLIP text encoder", ("te", "clip_g"): "a CLIP text encoder",
          ("te", "openclip_h"): "a CLIP text encoder", ("te", "clip_h"): "a CLIP text encoder",
          ("vae", None): "an autoencoder",
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


def held_besides_diffusion(path: str | Path) -> str | None:
    """What a ``-m`` / ``--diffusion-model`` file holds when it holds no diffusion model, read
    as ``-m`` reads it (:func:`~sdplan.core.modelfiles.checkpoint.classify_checkpoint`):
    ``"an autoencoder"``, ``"a CLIP text encoder and an autoencoder"``...; None when it holds
    a diffusion model or its names are in no known layout (the reader names that file).

    Raises:
        ModelFileError: the file cannot be read (as :func:`read_tensor_file`).
    """
    try:
        classified, _ = classify_checkpoint(read_tensor_file(path))
    except ModelFileError:
        return None
    targets = {(module, encoder if module == "te" else None) for _, module, encoder in classified}
    if not targets or any(module == "diffusion" for module, _ in targets):
        return None
    kinds = sorted({_KINDS.get(t) or ("a text encoder" if t[0] == "te" else f"a {t[0]} model") for t in targets})
    return " and ".join(kinds)


def check_file_roles(files: Mapping[str, Sequence[str]]) -> None:
    """Refuse an encoder, VAE or diffusion-model file that holds another kind of model
    (module docstring).

    Args:
        files: sd-cli's model flag keys (``llm``, ``t5xxl``, ``vae``, ``model``,
            ``diffusion_model``...) -> file paths; other keys, folders and missing paths are
            not checked here (the reader names a missing one).

    Raises:
        ModelFileError: ``"FILE: --llm takes a language model; this file holds a CLIP text
            encoder"``, ``"FILE: --diffusion-model takes a diffusion model; this file holds an
            autoencoder"``, naming the file and the flag.
    """
    for key, (flag, want) in ROLES.items():
        for path in regular_files(files, key):
            have = kind_of(path)
            if have is not None and have != want:
                raise ModelFileError(path, f"{flag} takes {want}; this file holds {have}")
    given = [(flag, want, path) for key, (flag, want) in DIFFUSION_ROLES.items() for path in regular_files(files, key)]
    first: tuple[str, str, str] | None = None  # (family, flag, file) of the first diffusion model given
    for flag, want, path in given:
        have = held_besides_diffusion(path)
        if have is not None:
            raise ModelFileError(path, f"{flag} takes {want}; this file holds {have}")
        fam = _diffusion_family([path]) if len(given) > 1 else None
        if fam is None:
            continue
        if first is None:
            first = (fam, flag, path)
        elif fam != first[0]:
            raise ModelFileError(path, f"{flag}: the diffusion model of {_title(fam)}, where {first[1]} "
                                       f"{first[2]} holds that of {_title(first[0])}: give the files of one model")


def check_files(models: Any, files: Mapping[str, Sequence[str]]) -> Any:
    """``models`` (a :class:`~sdplan.core.modelfiles.checkpoint.ModelSet` read from ``files``)
    once its family's own check finds that the files fit together
    (:meth:`~sdplan.core.families.declaration.Family.check_files`: a Wan DiT and its
    high-noise expert...) and so do the family's declared companions
    (:func:`sdplan.core.modelfiles.file_sets.check_companions`: the ``--vae`` of its latent
    channels, the ``--llm`` of its DiT's text width), before anything loads.

    Raises:
        ModelFileError: as those checks raise it, naming the file and its flag.
    """
    from sdplan.core.families import family

    fam = family(models.architecture.family)
    if fam is not None:
        fam.check_files(files)
        check_companions(models, fam, files)
    return models


def read_checked(files: Mapping[str, Sequence[str]], headers: dict[str, Any] | None = None) -> Any:
    """The :class:`~sdplan.core.modelfiles.checkpoint.ModelSet` of ``files`` (sd-cli's flag
    keys -> paths) once every file holds what its flag takes (:func:`check_file_roles`) and
    the files fit together (:func:`check_files`): the one check ``sdplan plan`` and
    ``sdplan generate`` run on the model files before anything loads. ``headers`` (path ->
    parsed header) is shared with :func:`~sdplan.core.modelfiles.checkpoint.read_model_files`.

    Raises:
        ModelFileError: naming the file and its flag (or as
            :func:`~sdplan.core.modelfiles.checkpoint.read_model_files` raises it).
    """
    check_file_roles(files)
    return check_files(read_model_files(files, headers), files)


def holds_diffusion_model(paths: Sequence[str]) -> bool:
    """Whether the files ``paths`` hold a diffusion model of their own, classified by their
    tensor names as ``-m`` reads them (headers only): another whole model, which the app's
    board may open in place of the one it has, where a lone autoencoder or text encoder only
    joins it. False when they cannot be read."""
    return _diffusion_family(paths) is not None


def of_another_family(open_files: Mapping[str, Sequence[str]], new: Sequence[str]) -> bool:
    """Whether the files ``new`` hold a diffusion model of their own of another family than
    the one among ``open_files`` (sd-cli's flag keys -> paths), both classified by their tensor
    names as ``-m`` reads them (headers only): another whole model, which the app's board opens
    in place of the open set. Joining them is no test of that: a whole SDXL checkpoint shares
    no tensor name with FLUX.2 klein's DiT, encoder and VAE, and was planned beside them as
    klein. False when either holds no diffusion model or cannot be read."""
    theirs = _diffusion_family(new)
    return theirs is not None and _diffusion_family([p for v in open_files.values() for p in v]) not in (None, theirs)


def _diffusion_family(paths: Sequence[str]) -> str | None:
    """The family of the diffusion model ``paths`` hold (as :func:`holds_diffusion_model`
    classifies them), or None."""
    if not paths:
        return None
    try:
        ms = read_model_files({"model": list(paths)})
    except (SdplanError, OSError, ValueError):
        return None
    return ms.architecture.family if "diffusion" in ms.modules() else None


def _title(family_name: str | None) -> str:
    """The registry's title of a family (``FLUX.2 klein``), else its name."""
    from sdplan.core.families import family

    fam = family(family_name) if family_name else None
    return fam.title if fam is not None else str(family_name)
