"""Generation settings a model family recommends in place of sd-cli's defaults.

sd-cli's defaults (20 steps, CFG 7, euler_a; euler for DiTs) suit SD 1.x. A distilled
model needs others: Z-Image Turbo is made for 8 steps without guidance (CFG 1), as
Tongyi's model card and stable-diffusion.cpp's ``docs/z_image.md`` run it; euler is
sd-cli's sampler for DiTs. The command line applies them where a flag was not given, the
app when a model of the family is opened.
"""

from __future__ import annotations

from typing import Any

#: Architecture family -> recommended ``steps``, ``cfg_scale``, ``sampling_method``.
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "z_image": {"steps": 8, "cfg_scale": 1.0, "sampling_method": "euler"},
}


def family_defaults(architecture: str | None) -> dict[str, Any]:
    """The recommended generation settings of an architecture (``z_image``; a name such as
    ``flux-dev`` counts by its family), or ``{}``."""
    return dict(FAMILY_DEFAULTS.get((architecture or "").split("-")[0], {}))
