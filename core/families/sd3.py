"""SD3 and SD3.5: the MMDiT with joint blocks and three text encoders.

Recognised by ``joint_blocks`` (or diffusers' ``context_embedder`` beside ``pos_embed``):
``3.5-medium`` with MMDiT-X's second attention (``attn2``), ``medium`` at 24 blocks, ``large``
at 38. Defaults: sd-cli's ``docs/sd3.md`` (``--cfg-scale 4.5 --sampling-method euler``, 20
steps; CLIP reads the second-to-last layer). Skip-layer guidance (``--slg-scale``) is SD3's.
The estimate's constants: 24 heads over a 1536 width (SD3 medium; 38 over 2432 for large),
77 + 77 text tokens, each encoder on 77-token chunks.
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


def _detect(t: DiffusionTensors) -> Detection | None:
    names = list(t.shapes)
    joint = count_blocks(names, "joint_blocks")
    if not (joint or ("pos_embed.proj.weight" in t.shapes and "context_embedder.weight" in t.shapes)):
        return None
    depth = joint or count_blocks(names, "transformer_blocks")
    ev = [f"{depth} joint blocks (SD3 MMDiT)"]
    if any(".x_block.attn2." in n or ".attn2." in n for n in names):
        ev.append("x_block.attn2 present (MMDiT-X)")
        return "3.5-medium", tuple(ev)
    return {24: "medium", 38: "large"}.get(depth), tuple(ev)


def _lora(names: Sequence[str], shapes: Mapping[str, tuple[int, ...]]) -> bool:
    return any("joint.blocks" in n for n in lora_flat_names(names))


SD3 = Family(
    name="sd3", title="SD3 / SD3.5", detect=_detect, lora_rule=_lora,
    files=(("model",), ("diffusion_model", "clip_l", "clip_g", "vae")),
    options=frozenset({o.NEGATIVE_PROMPT, o.CFG_SCALE, o.CLIP_SKIP, o.BATCH, o.ETA, o.SIGMAS,
                       o.FLOW_SHIFT, o.RNG, o.SAMPLER_RNG, o.EXTRA_SAMPLE_ARGS, o.SLG,
                       o.INIT_IMG, o.MASK, o.TAESD, o.TAESD_DECODE, o.VAE_TILING, o.UPSCALE, o.HIRES}),
    sampling="flow", defaults=Defaults(4.5, 20, "euler", clip_skip=2),
    sizes=((1024, 1024), (1216, 832), (832, 1216), (1344, 768), (768, 1344)),
    size_rule="patch", latent_format="sd3_ae",
    companions=Companions(("clip_l", "clip_g", "t5xxl"), 16, 1024, autoencoder="SD3"),
    compute=ComputeShape("dit", 24, 1536, 154, te_tokens=77),
    variant_compute={"large": ComputeShape("dit", 38, 2432, 154, te_tokens=77)},
    pipeline="sdplan.core.pipelines.sd3.generate:generate",
    dry_run="sdplan.core.pipelines.sd3.generate:measure",
    work="sdplan.core.pipelines.sd3.generate:work")

FAMILIES = (SD3,)
