"""FLUX.1 dev and schnell: the DiT with double and single blocks, CLIP-L and T5-XXL.

Recognised by ``double_blocks``/``single_blocks`` (or diffusers' ``single_transformer_blocks``)
without Chroma's ``distilled_guidance_layer``: ``dev`` with a guidance embedder
(``guidance_in``), else ``schnell``. Defaults: sd-cli's ``docs/flux.md`` (``--cfg-scale 1.0
--sampling-method euler``, distilled guidance 3.5); schnell's 4-step distillation. The
estimate's constants: 24 heads over a 3072 width, 512 T5 tokens (256 for schnell).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sdplan.core.families import options as o
from sdplan.core.families.declaration import (
    Companions,
    ComputeShape,
    Defaults,
    Detection,
    DiffusionTensors,
    Family,
)
from sdplan.core.families.tensors import count_blocks, lora_flat_names

#: Sizes around one megapixel (FLUX.1's model card) and 512 px.
FLUX_SIZES = ((1024, 1024), (1216, 832), (832, 1216), (1344, 768), (768, 1344), (512, 512))


def flux1_blocks(t: DiffusionTensors) -> tuple[int, int]:
    """``(double, single)`` block counts of a FLUX.1-layout DiT (BFL or diffusers names);
    ``(0, 0)`` for another layout."""
    names = list(t.shapes)
    dbl, sgl = count_blocks(names, "double_blocks"), count_blocks(names, "single_blocks")
    if not (dbl or sgl) and any(n.startswith("single_transformer_blocks.") for n in names):
        dbl, sgl = count_blocks(names, "transformer_blocks"), count_blocks(names, "single_transformer_blocks")
    return dbl, sgl


def _detect(t: DiffusionTensors) -> Detection | None:
    dbl, sgl = flux1_blocks(t)
    if not (dbl or sgl) or "distilled_guidance_layer.in_proj.weight" in t.shapes:
        return None
    ev = [f"{dbl} double_blocks + {sgl} single_blocks (Flux MMDiT)"]
    guided = [n for n in t.shapes if n.startswith(("guidance_in.", "time_text_embed.guidance_embedder."))]
    if guided:
        ev.append(f"guidance embedder present ({guided[0]}): dev")
        return "dev", tuple(ev)
    ev.append("no guidance_in: schnell")
    return "schnell", tuple(ev)


def flux1_lora(names: Sequence[str], shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """FLUX.1-layout block names (``double_blocks``, ``single_blocks``,
    ``single_transformer_blocks``) in kohya's or PEFT's spelling."""
    return any("double.blocks" in n or "single.blocks" in n or "single.transformer.blocks" in n
               for n in lora_flat_names(names))


FLUX = Family(
    name="flux", title="FLUX.1", detect=_detect, lora_rule=flux1_lora,
    files=(("diffusion_model", "t5xxl", "clip_l", "vae"),),
    options=frozenset({o.NEGATIVE_PROMPT, o.CFG_SCALE, o.GUIDANCE, o.BATCH, o.ETA, o.SIGMAS, o.FLOW_SHIFT,
                       o.RNG, o.SAMPLER_RNG, o.EXTRA_SAMPLE_ARGS, o.LORA, o.INIT_IMG, o.MASK, o.TAESD,
                       o.TAESD_DECODE, o.VAE_TILING, o.UPSCALE, o.HIRES}),
    sampling="flow", defaults=Defaults(1.0, 20, "euler", guidance=3.5),
    variant_defaults={"schnell": Defaults(1.0, 4, "euler", guidance=3.5)},
    sizes=FLUX_SIZES, size_rule="patch8", latent_format="flux_ae",
    companions=Companions(("clip_l", "t5xxl"), 16, 1024, autoencoder="FLUX.1"),
    compute=ComputeShape("dit", 24, 3072, 512),
    variant_compute={"schnell": ComputeShape("dit", 24, 3072, 256)},
    lora_names="flux", pipeline="sdplan.core.pipelines.flux.generate:generate",
    work="sdplan.core.pipelines.flux.work:flux_work")

FAMILIES = (FLUX,)
