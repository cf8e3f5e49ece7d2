"""Qwen-Image: the 20 B MMDiT (and its Edit models, the same layout: reference pictures with
``-r``) with the Qwen2.5-VL-7B language model as text encoder (its vision tower for the
reference pictures) and the Wan 2.1 autoencoder.

Recognised by ``transformer_blocks.0.img_mod.1`` beside a 64-wide ``img_in`` (sd-cli's test;
128 inputs is MageFlow, which sdplan does not know); ``time_text_embed.addition_t_embedding``
is Qwen-Image-Layered (variant ``layered``, refused when it loads). Defaults: sd-cli's
``docs/qwen_image.md`` (``--cfg-scale 2.5 --sampling-method euler``, 20 steps) with the
family's flow shift 3 (sd-cli's default for it). The estimate's constants: 24 heads over a
3072 width (the published config), 256 LLM tokens (sd-cli does not pad the prompt; a long
prompt's share), the LLM's 28 heads.
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
from sdplan.core.families.flux import FLUX_SIZES
from sdplan.core.families.tensors import count_blocks, llm_family

#: The tensor sd-cli tests for (``model.diffusion_model.`` stripped).
MARKER = "transformer_blocks.0.img_mod.1.weight"


def _detect(t: DiffusionTensors) -> Detection | None:
    d = t.shapes
    img_in = d.get("img_in.weight", ())
    if MARKER not in d or "txt_norm.weight" not in d or (len(img_in) == 2 and img_in[1] != 64):
        return None
    txt = d.get("txt_in.weight", ())
    ev = [f"{count_blocks(d, 'transformer_blocks')} transformer blocks with img_mod/txt_mod (Qwen-Image MMDiT)",
          f"width {img_in[0] if img_in else '?'}, text width {txt[-1] if txt else '?'}"
          + (": a Qwen2.5-VL-7B text encoder" if txt and txt[-1] == 3584 else "")]
    llm = llm_family(t.llm_names)
    if llm:
        ev.append(f"text encoder: {llm}")
    vision = count_blocks((n.split("visual.", 1)[-1] for n in t.llm_names if "visual." in n), "blocks")
    if vision:
        ev.append(f"vision tower: {vision} blocks (reference pictures; stays on the main device)")
    if "time_text_embed.addition_t_embedding.weight" in d:
        return "layered", (*ev, "time_text_embed.addition_t_embedding: Qwen-Image-Layered")
    return None, tuple(ev)


QWEN_IMAGE = Family(
    name="qwen_image", title="Qwen-Image", detect=_detect,
    files=(("diffusion_model", "llm", "vae"),),
    options=frozenset({o.NEGATIVE_PROMPT, o.CFG_SCALE, o.BATCH, o.ETA, o.SIGMAS, o.FLOW_SHIFT, o.RNG,
                       o.SAMPLER_RNG, o.EXTRA_SAMPLE_ARGS, o.INIT_IMG, o.MASK, o.REF_IMAGES, o.VAE_TILING,
                       o.UPSCALE, o.HIRES}),
    sampling="flow", defaults=Defaults(2.5, 20, "euler"),
    sizes=FLUX_SIZES, size_rule="patch8", latent_format="wan21_vae",
    companions=Companions(("llm",), 16, 1024, autoencoder="Qwen-Image (Wan 2.1)", autoencoder_dims=3),
    text_width=("txt_in.weight",), llm_widths={3584: "Qwen2.5-VL-7B"},
    compute=ComputeShape("dit", 24, 3072, 256),
    pipeline="sdplan.core.pipelines.qwen_image.generate:generate",
    dry_run="sdplan.core.pipelines.qwen_image.generate:measure",
    work="sdplan.core.pipelines.qwen_image.generate:work", vision_refs=True)

FAMILIES = (QWEN_IMAGE,)
