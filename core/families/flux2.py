"""FLUX.2: dev (32 B, Mistral-Small-3.2 text encoder) and klein 4B / 9B (Qwen3), both run.

Recognised by the shared image-stream modulation ``double_stream_modulation_img`` (sd-cli's
test): 48 single blocks is FLUX.2 [dev] (Mistral Small 3.2 encoder); otherwise [klein], ``4b``
at width 3072 (Qwen3-4B states) or ``9b`` at 4096 (Qwen3-8B). Defaults: klein's 4-step
distillation (sd-cli's ``docs/flux2.md``: ``--cfg-scale 1.0 --steps 4``, euler); dev's are sd-cli's
general ones (20 steps, CFG 1, euler, ``--guidance`` 3.5 into its guidance embedder). The
estimate's constants: 24 heads over 3072 (klein 4B), 32 over 4096 (9B), 48 over 6144 (dev:
diffusers' ``Flux2Transformer2DModel`` defaults, 8 double + 48 single blocks), 512 text tokens.
The DiT reads the Qwen3 states after blocks 9, 18 and 27 (klein; blocks 27.. never run) and
the Mistral states after blocks 10, 20 and 30 (dev), as sd-cli's ``LLMEmbedder``.
In the library, dev pairs with an LLM file named for Mistral first, klein with one that is not.
"""

from __future__ import annotations

import re

from sdplan.core.families import options as o
from sdplan.core.families.declaration import (
    Companions,
    ComputeShape,
    Defaults,
    Detection,
    DiffusionTensors,
    Family,
)
from sdplan.core.families.tensors import count_blocks, llm_family

#: FLUX.2's shared image-stream modulation in BFL and diffusers names.
FLUX2_MARKERS = ("double_stream_modulation_img.lin.weight", "double_stream_modulation_img.linear.weight")
#: FLUX.2 klein variants by DiT width: (variant, text encoder).
KLEIN_WIDTHS = {3072: ("4b", "Qwen3-4B"), 4096: ("9b", "Qwen3-8B")}
#: The DiT's text input (BFL, diffusers names): three LLM states side by side.
TEXT_WIDTH = ("txt_in.weight", "context_embedder.weight")
#: Mistral-Small-3.x's vision tower (Pixtral) and projector: not the text encoder's blocks.
_PIXTRAL = re.compile(r"(?:^|\.)(?:vision_tower|multi_modal_projector)\.")


def _layout(t: DiffusionTensors) -> tuple[int, int, int, list[str]] | None:
    """``(double, single, width, evidence)`` of a FLUX.2 DiT, or None."""
    d = t.shapes
    if not any(m in d for m in FLUX2_MARKERS):
        return None
    bfl = "img_in.weight" in d
    dbl = count_blocks(d, "double_blocks" if bfl else "transformer_blocks")
    sgl = count_blocks(d, "single_blocks" if bfl else "single_transformer_blocks")
    img, txt = (d.get(n, ()) for n in (("img_in.weight", "txt_in.weight") if bfl
                                       else ("x_embedder.weight", "context_embedder.weight")))
    width = int(img[0]) if img else 0
    ev = [f"{dbl} double + {sgl} single blocks with shared modulation "
          "(double_stream_modulation_img: FLUX.2 DiT)", f"width {width}, text width {txt[-1] if txt else '?'}"]
    return dbl, sgl, width, ev


def _dev(t: DiffusionTensors) -> Detection | None:
    found = _layout(t)
    if found is None or found[1] != 48:
        return None
    ev = [*found[3], "48 single blocks: FLUX.2 [dev] (Mistral Small 3.2 text encoder)"]
    llm = llm_family(n for n in t.llm_names if not _PIXTRAL.search(n))
    if llm:
        ev.append(f"text encoder: {llm}")
    return "dev", tuple(ev)


def _klein(t: DiffusionTensors) -> Detection | None:
    found = _layout(t)
    if found is None or found[1] == 48:
        return None
    variant, encoder = KLEIN_WIDTHS.get(found[2], (None, "a Qwen3"))
    ev = [*found[3], f"FLUX.2 [klein]: the states of three {encoder} blocks as its text"]
    llm = llm_family(t.llm_names)
    if llm:
        ev.append(f"text encoder: {llm}")
    return variant, tuple(ev)


FLUX2_KLEIN = Family(
    name="flux2_klein", title="FLUX.2 klein", detect=_klein,
    files=(("model",), ("diffusion_model", "llm", "vae")),
    options=frozenset({o.NEGATIVE_PROMPT, o.CFG_SCALE, o.BATCH, o.ETA, o.SIGMAS, o.FLOW_SHIFT,
                       o.RNG, o.SAMPLER_RNG, o.EXTRA_SAMPLE_ARGS, o.REF_IMAGES, o.TAESD,
                       o.TAESD_DECODE, o.VAE_TILING, o.UPSCALE}),
    sampling="flow", defaults=Defaults(1.0, 4, "euler"),
    size_rule="patch8", latent_format="flux2_ae", vae_scale=16,
    companions=Companions(("llm",), 32, 1024, avoids="mistral", autoencoder="FLUX.2"),
    compute=ComputeShape("dit", 24, 3072, 512),
    variant_compute={"9b": ComputeShape("dit", 32, 4096, 512)}, llm_layers=(9, 18, 27),
    text_width=TEXT_WIDTH, llm_widths={2560: "Qwen3-4B", 4096: "Qwen3-8B"},
    pipeline="sdplan.core.pipelines.flux2.generate:generate",
    work="sdplan.core.pipelines.flux2.work:klein_work")

FLUX2_DEV = Family(
    name="flux2", title="FLUX.2 dev", detect=_dev,
    files=(("diffusion_model", "llm", "vae"),),
    options=frozenset({o.NEGATIVE_PROMPT, o.CFG_SCALE, o.GUIDANCE, o.BATCH, o.ETA, o.SIGMAS, o.FLOW_SHIFT,
                       o.RNG, o.SAMPLER_RNG, o.EXTRA_SAMPLE_ARGS, o.REF_IMAGES, o.TAESD,
                       o.TAESD_DECODE, o.VAE_TILING, o.UPSCALE}),
    sampling="flow", defaults=Defaults(1.0, 20, "euler"), size_rule="patch8",
    latent_format="flux2_ae", vae_scale=16, companions=Companions(("llm",), 32, 1024, prefers="mistral", avoids="", autoencoder="FLUX.2"),
    compute=ComputeShape("dit", 48, 6144, 512), llm_layers=(10, 20, 30),
    text_width=TEXT_WIDTH, llm_widths={5120: "Mistral-Small-3.2"},
    pipeline="sdplan.core.pipelines.flux2_dev.generate:generate",
    dry_run="sdplan.core.pipelines.flux2_dev.generate:measure",
    work="sdplan.core.pipelines.flux2.work:dev_work")

FAMILIES = (FLUX2_DEV, FLUX2_KLEIN)
