"""Generation settings a model family runs with unless the user chooses others.

Keys are sd-cli's generation keys (``cfg_scale``, ``steps``, ``sampling_method``...), as the
GUI's generation panel and :func:`sdplan.core.planning.sdcli.sdcli_command_line` use them.
Sources: Chroma, stable-diffusion.cpp's ``docs/chroma.md`` example (``--cfg-scale 4.0
--sampling-method euler``) with sd-cli's default 20 steps (diffusers' ``ChromaPipeline`` and
the Chroma1 model cards also guide with a real CFG around 4); FLUX.1, sd-cli's ``docs/flux.md``
(``--cfg-scale 1.0 --sampling-method euler``) and schnell's 4-step distillation; Z-Image
Turbo, its 8-step distillation without guidance (Tongyi's model card; sd-cli's
``docs/z_image.md``: ``--cfg-scale 1.0 --steps 8``) with euler, sd-cli's sampler for DiTs;
FLUX.2 klein 4B / 9B, their 4-step distillation (sd-cli's ``docs/flux2.md``: ``--cfg-scale 1.0
--steps 4``, euler; the klein *base* models, which no tensor tells apart, want CFG 4 and 20
steps); SD3 / SD3.5, sd-cli's ``docs/sd3.md`` (``--cfg-scale 4.5 --sampling-method euler``)
with sd-cli's default 20 steps.
"""

from __future__ import annotations

__all__ = ["FAMILY_DEFAULTS", "generation_defaults"]

#: Architecture name (``chroma``, ``flux-dev``...) or family -> generation settings.
FAMILY_DEFAULTS: dict[str, dict[str, object]] = {
    "chroma": {"cfg_scale": 4.0, "steps": 20, "sampling_method": "euler"},
    "flux-dev": {"cfg_scale": 1.0, "steps": 20, "sampling_method": "euler"},
    "flux-schnell": {"cfg_scale": 1.0, "steps": 4, "sampling_method": "euler"},
    "z_image": {"cfg_scale": 1.0, "steps": 8, "sampling_method": "euler"},
    "flux2_klein": {"cfg_scale": 1.0, "steps": 4, "sampling_method": "euler"},
    "sd3": {"cfg_scale": 4.5, "steps": 20, "sampling_method": "euler"},
    "sd1": {"cfg_scale": 7.0, "steps": 20, "sampling_method": "euler_a", "width": 512, "height": 512},
    "sd2": {"cfg_scale": 7.0, "steps": 20, "sampling_method": "euler_a", "width": 512, "height": 512},
    "sdxl": {"cfg_scale": 7.0, "steps": 20, "sampling_method": "euler_a", "width": 1024, "height": 1024},
}


def generation_defaults(architecture: str | None) -> dict[str, object]:
    """The settings of :data:`FAMILY_DEFAULTS` for an architecture name (``chroma``,
    ``flux-dev``, ``sd3-large``...): its own entry, else its family's (the part before the
    first ``-``), else none (a new dict each call)."""
    if not architecture:
        return {}
    entry = FAMILY_DEFAULTS.get(architecture) or FAMILY_DEFAULTS.get(architecture.split("-")[0]) or {}
    return dict(entry)
