"""SDXL (and its refiner): the UNet with size conditioning and two text encoders.

Recognised by a UNet cross-attention context of 2048 (CLIP-L and bigG side by side), 1280
with ``label_emb`` (the refiner: bigG alone), or a scaled-down UNet whose ``sdplan.family``
metadata says ``sdxl`` (with ``label_emb``). Sizes: the multi-aspect buckets around one
megapixel of Podell et al. 2023 ("SDXL", appendix: multi-aspect training). The estimate's
constants: 10 heads of 64 over 640 channels at a quarter of the latent (SDXL's first
attention level). Its ``ays`` scheduler uses sd-cli's SDXL Align Your Steps levels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sdplan.core.families import options as o
from sdplan.core.families.declaration import Companions, ComputeShape, Defaults, Family
from sdplan.core.families.sd import UNET_OPTIONS, unet_rule
from sdplan.core.families.tensors import lora_context_width


def _lora(names: Sequence[str], shapes: Mapping[str, tuple[int, ...]]) -> bool:
    """A second text encoder (kohya ``lora_te2_``, diffusers ``text_encoder_2.``) or a
    2048-wide cross-attention key."""
    return (any(n.startswith(("lora_te2_", "text_encoder_2.")) for n in names)
            or lora_context_width(names, shapes) == 2048)


SIZES = ((1024, 1024), (1152, 896), (896, 1152), (1216, 832), (832, 1216), (1344, 768),
         (768, 1344), (1536, 640), (640, 1536))

SDXL = Family(
    name="sdxl", title="SDXL", detect=unet_rule("sdxl", 2048, True), lora_rule=_lora,
    files=(("model",), ("diffusion_model",)),
    options=UNET_OPTIONS | {o.VAE_CONV_SCALE, o.TIMESTEP_SHIFT}, sampling="discrete",
    defaults=Defaults(7.0, 20, "euler_a", 1024, 1024, clip_skip=2), sizes=SIZES,
    size_rule="unet", latent_format="sdxl_vae",
    companions=Companions(("clip_l", "clip_g"), 4, 1024, prefers="xl", avoids="", autoencoder="SDXL"),
    variant_companions={"refiner": Companions(("clip_g",), 4, 1024, prefers="xl", avoids="", autoencoder="SDXL")},
    compute=ComputeShape("unet", 10, 640, 4), lora_names="sd", prediction="eps",
    unet_heads=(None, 64), ays_levels="sdxl", clip_pad="eos",
    pipeline="sdplan.core.pipelines.sdxl.generate:generate", parallel_cfg=True,
    work="sdplan.core.pipelines.sdxl.generate:work")

FAMILIES = (SDXL,)
