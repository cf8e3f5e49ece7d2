"""Model families: one declaration each, and the registry that answers every question about
them (:mod:`sdplan.core.families.registry`).

A family is declared once, in the module named after it here, and its pipeline lives in its
own folder under :mod:`sdplan.core.pipelines`. Nothing else in sdplan compares family names:
it asks the registry (a test checks this over every source file).
"""

from sdplan.core.families.declaration import (
    Companions,
    ComputeShape,
    Defaults,
    DiffusionTensors,
    Family,
)
from sdplan.core.families.registry import (
    FAMILIES,
    UNKNOWN,
    detect_family,
    families_with,
    family,
    family_of,
    generation_defaults,
    lora_family,
    recommended_sizes,
    variant_of,
)

__all__ = ["FAMILIES", "UNKNOWN", "Companions", "ComputeShape", "Defaults", "DiffusionTensors",
           "Family", "detect_family", "families_with", "family", "family_of", "generation_defaults",
           "lora_family", "recommended_sizes", "variant_of"]
