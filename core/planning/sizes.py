"""Image sizes each model family is trained for, as the generation panel offers them (beside
the family generation defaults of :mod:`sdplan.core.planning.generation_defaults`).

SDXL: the multi-aspect buckets around one megapixel of Podell et al. 2023 ("SDXL",
appendix: multi-aspect training), the sizes SDXL checkpoints and their derivatives draw
best; SD 1.x at 512 and SD 2.x (768-v) at 768 pixels per side; Flux and SD3 around one
megapixel. Every size is a multiple of 64 pixels.
"""

from __future__ import annotations

__all__ = ["SIZES", "recommended_sizes"]

_SDXL = ((1024, 1024), (1152, 896), (896, 1152), (1216, 832), (832, 1216), (1344, 768),
         (768, 1344), (1536, 640), (640, 1536))
#: family -> (width, height) pairs in pixels, the family's default first.
SIZES: dict[str, tuple[tuple[int, int], ...]] = {
    "sd1": ((512, 512), (512, 768), (768, 512), (640, 448), (448, 640)),
    "sd2": ((768, 768), (768, 1024), (1024, 768), (512, 512)),
    "sdxl": _SDXL,
    "flux": ((1024, 1024), (1216, 832), (832, 1216), (1344, 768), (768, 1344), (512, 512)),
    "sd3": ((1024, 1024), (1216, 832), (832, 1216), (1344, 768), (768, 1344)),
}


def recommended_sizes(architecture: str | None) -> tuple[tuple[int, int], ...]:
    """The sizes of an architecture name (``sdxl``, ``sdxl-refiner``, ``flux-dev``...) by its
    family, default first; empty for an unknown or absent architecture."""
    return SIZES.get((architecture or "").split("-")[0], ())
