"""Z-Image: the single-stream DiT with noise and context refiners and a Qwen3 text encoder.

Recognised by ``cap_embedder.1`` beside noise refiners. Defaults: Z-Image Turbo's 8-step
distillation without guidance (Tongyi's model card; sd-cli's ``docs/z_image.md``:
``--cfg-scale 1.0 --steps 8``) with euler. The estimate's constants: 30 heads over a 3840
width, 512 caption tokens. It decodes with FLUX.1's autoencoder. The DiT reads the LLM's
second to last hidden state (``hidden_states[-2]``; sd-cli's out layer 35 of Qwen3-4B's 36):
the last block never runs.
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

#: Name prefixes only a Z-Image DiT has (for classifying a standalone ``-m`` file).
DIFFUSION_MARKERS = ("cap_embedder.", "noise_refiner.", "context_refiner.")


def _detect(t: DiffusionTensors) -> Detection | None:
    d = t.shapes
    if "cap_embedder.1.weight" not in d or not count_blocks(d, "noise_refiner"):
        return None
    ev = [f"{count_blocks(d, 'layers')} layers + {count_blocks(d, 'noise_refiner')} noise / "
          f"{count_blocks(d, 'context_refiner')} context refiners (Z-Image single-stream DiT)"]
    width = d["cap_embedder.1.weight"]
    ev.append(f"caption width {width[-1]} (cap_embedder.1.weight {list(width)}): "
              + ("a Qwen3-4B text encoder" if width[-1] == 2560 else "a language-model text encoder"))
    llm = llm_family(t.llm_names)
    if llm:
        ev.append(f"text encoder: {llm}")
    return None, tuple(ev)


Z_IMAGE = Family(
    name="z_image", title="Z-Image", detect=_detect,
    files=(("diffusion_model", "llm", "vae"),),
    options=frozenset({o.NEGATIVE_PROMPT, o.CFG_SCALE, o.BATCH, o.ETA, o.SIGMAS, o.FLOW_SHIFT, o.RNG,
                       o.SAMPLER_RNG, o.EXTRA_SAMPLE_ARGS, o.LORA, o.INIT_IMG, o.MASK, o.TAESD,
                       o.TAESD_DECODE, o.VAE_TILING, o.UPSCALE, o.HIRES}),
    sampling="flow", defaults=Defaults(1.0, 8, "euler"),
    sizes=FLUX_SIZES, size_rule="patch8", latent_format="flux_ae",
    companions=Companions(("llm",), 16, 1024, autoencoder="FLUX.1"),
    compute=ComputeShape("dit", 30, 3840, 512), llm_layers=(-2,),
    text_width=("cap_embedder.1.weight",), llm_widths={2560: "Qwen3-4B"},
    pipeline="sdplan.core.pipelines.z_image.generate:generate",
    work="sdplan.core.pipelines.z_image.work:work")

FAMILIES = (Z_IMAGE,)
