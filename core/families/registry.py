"""The family registry: every model family's declaration in detection order, and the one
place questions about families are answered.

Everything outside the declarations (:mod:`sdplan.core.families.declaration`, one module per
family here) and each family's pipeline folder asks the registry (:func:`family`,
:func:`family_of`, :func:`detect_family`, :func:`lora_family`) instead of comparing family
names: a test checks every source file for such comparisons. Pure Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from sdplan.core.families import chroma, flux, flux2, qwen_image, sd, sd3, sdxl, wan, z_image
from sdplan.core.families.declaration import DiffusionTensors, Family

__all__ = ["FAMILIES", "UNKNOWN", "family", "family_of", "variant_of", "detect_family",
           "lora_family", "families_with", "generation_defaults", "recommended_sizes"]

#: The family of a model set nothing recognises (loadable by name; the SD pipeline runs a
#: UNet of sd-cli's names).
UNKNOWN = "unknown"


#: Every family, in detection order: the most specific layouts first (sd-cli's own order of
#: tests: Wan, Qwen-Image, Z-Image, FLUX.2, FLUX.1 / Chroma, SD3, then the UNets by context width).
FAMILIES: tuple[Family, ...] = (*wan.FAMILIES, *qwen_image.FAMILIES, *z_image.FAMILIES, *flux2.FAMILIES, *chroma.FAMILIES, *flux.FAMILIES,
                                *sd3.FAMILIES, *sdxl.FAMILIES, *sd.FAMILIES)
_BY_NAME: Mapping[str, Family] = MappingProxyType({f.name: f for f in FAMILIES})


def family(name: str | None) -> Family | None:
    """The family called ``name`` (``flux``), or None (unknown or absent)."""
    return _BY_NAME.get(name or "")


def family_of(architecture: str | None) -> Family | None:
    """The family of an architecture name (``flux-dev``, ``sdxl-refiner``, ``flux2_klein-4b``:
    the family, a ``-`` and the variant), or None."""
    if not architecture:
        return None
    return _BY_NAME.get(architecture) or _BY_NAME.get(architecture.split("-", 1)[0])


def variant_of(architecture: str | None) -> str | None:
    """The variant part of an architecture name (``dev`` of ``flux-dev``), or None."""
    fam = family_of(architecture)
    if fam is None or not architecture or architecture == fam.name:
        return None
    return architecture[len(fam.name) + 1:] or None


def detect_family(tensors: DiffusionTensors) -> tuple[str, str | None, tuple[str, ...]]:
    """``(family, variant, evidence)`` of a model set: the first family whose rule answers, in
    :data:`FAMILIES` order; ``unknown`` when none does (or without diffusion tensors)."""
    if not tensors.shapes:
        return UNKNOWN, None, ("no diffusion model among the files",)
    for fam in FAMILIES:
        found = fam.detect(tensors)
        if found is not None:
            return fam.name, found[0], found[1]
    return UNKNOWN, None, (f"no known diffusion layout among {len(tensors.shapes)} tensors; "
                           "loadable by name",)


def lora_family(names: Iterable[str], shapes: Mapping[str, tuple[int, ...]]) -> str:
    """The family a LoRA file adapts, from its tensor names and shapes (header only): the first
    family whose LoRA rule answers, else ``unknown``."""
    names = list(names)
    for fam in FAMILIES:
        if fam.lora_rule is not None and fam.lora_rule(names, shapes):
            return fam.name
    return UNKNOWN


def families_with(option: str) -> tuple[str, ...]:
    """The names of the families whose pipeline honours ``option``."""
    return tuple(f.name for f in FAMILIES if f.runs and f.honours(option))


def generation_defaults(architecture: str | None) -> dict[str, object]:
    """The settings a generation panel takes for an architecture name (``chroma``,
    ``flux-schnell``, ``sd3-large``...): its variant's sd-cli defaults, else its family's
    (:meth:`~sdplan.core.families.declaration.Defaults.settings`); none for an unknown or
    absent architecture (a new dict each call)."""
    fam = family_of(architecture)
    return fam.defaults_for(variant_of(architecture)).settings() if fam is not None else {}


def recommended_sizes(architecture: str | None) -> tuple[tuple[int, int], ...]:
    """The trained image sizes ``(width, height)`` in pixels of an architecture name's family,
    default first; empty for an unknown or absent architecture or a family without sizes."""
    fam = family_of(architecture)
    return fam.sizes if fam is not None else ()
