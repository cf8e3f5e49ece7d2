"""Chroma: FLUX.1's blocks with the modulation from an approximator, T5-XXL alone.

Recognised by a FLUX.1-layout DiT with ``distilled_guidance_layer.in_proj.weight`` (sd-cli's
test); ``radiance`` with ``img_in_patch`` (pixel space, no autoencoder). Defaults:
stable-diffusion.cpp's ``docs/chroma.md`` example (``--cfg-scale 4.0 --sampling-method
euler``) with sd-cli's 20 steps. The estimate's constants are FLUX.1 dev's.
"""

from __future__ import annotations

from sdplan.core.families import options as o
from sdplan.core.families.declaration import (
    Companions,
    ComputeShape,
    Defaults,
    Detection,
    DiffusionTensors,
    Family,
)
from sdplan.core.families.flux import FLUX_SIZES, flux1_blocks


def _detect(t: DiffusionTensors) -> Detection | None:
    dbl, sgl = flux1_blocks(t)
    if not (dbl or sgl) or "distilled_guidance_layer.in_proj.weight" not in t.shapes:
        return None
    ev = (f"{dbl} double_blocks + {sgl} single_blocks (Flux MMDiT)",
          "distilled_guidance_layer instead of per-block modulation: Chroma")
    return ("radiance" if "img_in_patch.weight" in t.shapes else None), ev


CHROMA = Family(
    name="chroma", title="Chroma", detect=_detect,
    files=(("diffusion_model", "t5xxl", "vae"),),
    options=frozenset({o.NEGATIVE_PROMPT, o.CFG_SCALE, o.BATCH, o.ETA, o.SIGMAS, o.FLOW_SHIFT, o.RNG,
                       o.SAMPLER_RNG, o.EXTRA_SAMPLE_ARGS, o.LORA, o.INIT_IMG, o.MASK, o.TAESD,
                       o.TAESD_DECODE, o.VAE_TILING, o.UPSCALE, o.HIRES}),
    sampling="flow", defaults=Defaults(4.0, 20, "euler"),
    sizes=FLUX_SIZES, size_rule="patch8", latent_format="flux_ae",
    companions=Companions(("t5xxl",), 16, 1024, autoencoder="FLUX.1"),
    variant_companions={"radiance": Companions(("t5xxl",), None, 1024)},
    compute=ComputeShape("dit", 24, 3072, 512),
    lora_names="flux", pipeline="sdplan.core.pipelines.chroma.generate:generate",
    work="sdplan.core.pipelines.flux.work:chroma_work")

FAMILIES = (CHROMA,)
