"""SD 1.x and SD 2.x: the UNet families told apart by their cross-attention context width.

Recognised by a UNet's ``attn2.to_k`` input width (768: SD 1.x's CLIP-L; 1024: SD 2.x's
OpenCLIP ViT-H), or, for scaled-down UNets such as sdplan's demo model, by the file's
``sdplan.family`` metadata (without SDXL's ``label_emb``). Defaults: sd-cli's (CFG 7, 20 steps,
euler_a; SD 2.x 768-v reads the second-to-last CLIP layer and predicts v). Sizes: 512 px per
side for SD 1.x, 768 for SD 2.x. The estimate's constants: SD 1.5's widest self-attention is
8 heads over the first level's 320 channels at the latent's full size; SD 2.x's 5 heads of 64.
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
    LoraRule,
    Rule,
)
from sdplan.core.families.tensors import lora_context_width

#: What the SD pipeline honours (sdplan.core.pipelines.sd.pipeline).
UNET_OPTIONS = frozenset({o.NEGATIVE_PROMPT, o.CFG_SCALE, o.CLIP_SKIP, o.BATCH, o.ETA, o.SIGMAS,
                          o.RNG, o.SAMPLER_RNG, o.EXTRA_SAMPLE_ARGS, o.LORA, o.INIT_IMG, o.MASK,
                          o.TAESD, o.TAESD_DECODE, o.VAE_TILING, o.UPSCALE, o.HIRES, o.CONTROL})


def unet_context(t: DiffusionTensors) -> tuple[str, int] | None:
    """``(tensor name, context width)`` of the first UNet cross-attention key, or None."""
    return next(((n, s[1]) for n, s in t.shapes.items() if ".attn2.to_k.weight" in n and len(s) == 2), None)


def has_label_emb(t: DiffusionTensors) -> bool:
    """True when the UNet has SDXL's size conditioning (``label_emb``/``add_embedding``)."""
    return any(n.startswith(("label_emb.", "add_embedding.")) for n in t.shapes)


def unet_rule(name: str, width: int, sdxl: bool) -> Rule:
    """The detection rule of UNet family ``name``: context ``width``, or the file's
    ``sdplan.family`` metadata naming it for a scaled-down UNet (``label_emb`` present exactly
    when ``sdxl``; an SDXL UNet without clip_l beside it is a refiner)."""
    def rule(t: DiffusionTensors) -> Detection | None:
        ctx = unet_context(t)
        if ctx is None:
            return None
        ev = [f"UNet cross-attention context {ctx[1]} ({ctx[0]} {list(t.shapes[ctx[0]])})"]
        emb = has_label_emb(t)
        if emb:
            ev.append("label_emb/add_embedding present (SDXL size conditioning)")
        if ctx[1] == width:
            return None, tuple(ev)
        if sdxl and ctx[1] == 1280 and emb:
            return "refiner", tuple(ev)
        if ctx[1] in (768, 1024, 2048):
            return None
        named = set(t.metadata_families) & {"sd1", "sd2", "sdxl"}
        if named == {name} and emb == sdxl:
            ev.append(f"file metadata sdplan.family = {name}")
            enc = set(t.encoders)
            return ("refiner" if sdxl and enc and "clip_l" not in enc else None), tuple(ev)
        return None
    return rule


def lora_width_rule(width: int) -> LoraRule:
    """A LoRA rule: the file's cross-attention key is ``width`` wide."""
    def rule(names: Sequence[str], shapes: Mapping[str, tuple[int, ...]]) -> bool:
        return lora_context_width(names, shapes) == width
    return rule


SD1 = Family(
    name="sd1", title="SD 1.x", detect=unet_rule("sd1", 768, False),
    lora_rule=lora_width_rule(768),
    files=(("model",), ("diffusion_model",)),
    options=UNET_OPTIONS, sampling="discrete",
    defaults=Defaults(7.0, 20, "euler_a", 512, 512),
    sizes=((512, 512), (512, 768), (768, 512), (640, 448), (448, 640)),
    size_rule="unet", latent_format="sd_vae",
    companions=Companions(("clip_l",), 4, 512, autoencoder="SD"),
    compute=ComputeShape("unet", 8, 320, 1), lora_names="sd", prediction="eps",
    unet_heads=(8, None), ays_levels="sd15", clip_pad="eos",
    pipeline="sdplan.core.pipelines.sd.generate:generate",
    dry_run="sdplan.core.pipelines.sd.generate:measure",
    work="sdplan.core.pipelines.sd.generate:work", fitted_compute=True,
    parallel_cfg=True)

SD2 = Family(
    name="sd2", title="SD 2.x", detect=unet_rule("sd2", 1024, False),
    lora_rule=lora_width_rule(1024),
    files=(("model",), ("diffusion_model",)),
    options=UNET_OPTIONS, sampling="discrete",
    defaults=Defaults(7.0, 20, "euler_a", 512, 512, clip_skip=2),
    sizes=((768, 768), (768, 1024), (1024, 768), (512, 512)),
    size_rule="unet", latent_format="sd_vae",
    companions=Companions(("clip_h",), 4, 768, autoencoder="SD"),
    compute=ComputeShape("unet", 5, 320, 1), lora_names="sd", prediction="v",
    unet_heads=(None, 64), ays_levels="sd15", clip_pad="zero",
    pipeline="sdplan.core.pipelines.sd.generate:generate",
    dry_run="sdplan.core.pipelines.sd.generate:measure",
    work="sdplan.core.pipelines.sd.generate:work", fitted_compute=True,
    parallel_cfg=True)

FAMILIES = (SD1, SD2)
