"""Wan 2.x video: the Wan DiT (3D patches, RoPE over frames, height and width, cross-attention
to UMT5-XXL text states) with its causal 3D autoencoder, run by sd-cli as ``-M vid_gen``.

Recognised as sd-cli recognises it (``model_loader.cpp``): ``blocks.0.cross_attn.norm_k``
marks a Wan DiT; the input channels of ``patch_embedding`` ([dim, in, 1, 2, 2]) and the block
count tell the model (``wan.hpp``'s ``WanRunner``): 48 input channels is Wan 2.2 TI2V-5B (30
blocks of width 3072; the 48-channel Wan 2.2 autoencoder, 16x spatial); ``img_emb`` is Wan 2.1
I2V/FLF2V (CLIP vision image embeddings); 36 inputs without it is Wan 2.2 I2V-A14B; width
1536 is Wan 2.1 1.3B; anything else a T2V model (40 blocks of width 5120: Wan 2.x T2V-14B,
each Wan 2.2 T2V-A14B expert). The A14B models are two experts of one layout: the low-noise one
is ``--diffusion-model``, the high-noise one ``--high-noise-diffusion-model`` (the ``diffusion``
module's ``high_noise`` phase, :mod:`sdplan.core.planning.phases`).

Image to video (Wan 2.2 I2V-A14B) takes ``-i/--init-img`` (the first frame) and needs it: sd-cli
would run without one on a grey condition, sdplan refuses that request by name. Wan 2.2 TI2V-5B
takes ``-i`` optionally (the picture's latent as the first latent frame; text to video without
it). A text-to-video model refuses ``-i`` by name (sd-cli ignores it there).

Defaults: sd-cli's ``docs/wan.md`` examples (``--cfg-scale 6.0 --sampling-method euler``,
832x480) and its flow shift for Wan (5, ``stable-diffusion.cpp``); 20 steps (sd-cli's).
Estimate constants: the published configs (5B: 24 heads over 3072; 14B: 40 heads over 5120;
1.3B: 12 over 1536), 512 UMT5 tokens (``text_len``); the 5B's latent cells at 1/16 of the
size (the Wan 2.2 autoencoder's ``vae_stride`` (4, 16, 16)).
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
from sdplan.core.families.tensors import count_blocks

#: The tensor sd-cli tests for (``model.diffusion_model.`` stripped).
MARKER = "blocks.0.cross_attn.norm_k.weight"
#: Trained sizes (width, height): 480p and 720p landscape and portrait, the 5B's 1280x704.
WAN_SIZES = ((832, 480), (480, 832), (1280, 720), (720, 1280), (1280, 704), (704, 1280))


def _detect(t: DiffusionTensors) -> Detection | None:
    d = t.shapes
    if MARKER not in d:
        return None
    pe = d.get("patch_embedding.weight", ())  # (dim, in, 1, 2, 2); a GGUF file holds it 4-D
    width, inputs = (pe[0], pe[1]) if len(pe) in (4, 5) else (0, 0)
    blocks = count_blocks(d, "blocks")
    img_emb = any(n.startswith("img_emb.") for n in d)
    ev = [f"{blocks} blocks with self_attn/cross_attn and cross_attn.norm_k (Wan DiT)",
          f"width {width or '?'}, patch_embedding inputs {inputs or '?'}"]
    if inputs == 48:
        variant = "ti2v_5b"
        ev.append("48 latent channels: Wan 2.2 TI2V-5B (the Wan 2.2 autoencoder)")
    elif img_emb:
        variant = "i2v_14b"
        ev.append("img_emb (CLIP vision): Wan 2.1 I2V/FLF2V-14B")
    elif inputs == 36:
        variant = "i2v_a14b"
        ev.append("36 inputs (noise + image latent and mask), no img_emb: Wan 2.2 I2V-A14B")
    elif width == 1536:
        variant = "1.3b"
        ev.append("width 1536: Wan 2.1 1.3B")
    else:
        variant = "t2v_a14b"
        ev.append(f"{inputs} inputs: Wan 2.x T2V (a Wan 2.2 T2V-A14B expert at width 5120)")
    if "t5xxl" in t.encoders:
        ev.append("text encoder: UMT5-XXL (--t5xxl)")
    return variant, tuple(ev)


_SHIFT5 = "sd-cli's flow shift for Wan: 5"
_OPTIONS = frozenset({o.NEGATIVE_PROMPT, o.CFG_SCALE, o.ETA, o.SIGMAS, o.FLOW_SHIFT, o.RNG, o.SAMPLER_RNG,
                      o.EXTRA_SAMPLE_ARGS, o.VIDEO, o.HIGH_NOISE})
WAN = Family(
    name="wan", title="Wan 2.x video", detect=_detect,
    files=(("diffusion_model", "t5xxl", "vae"),),
    options=_OPTIONS,
    variant_options={"i2v_a14b": _OPTIONS | {o.INIT_IMG}, "ti2v_5b": _OPTIONS | {o.INIT_IMG}},
    variant_needs={"i2v_a14b": {o.INIT_IMG: "a Wan 2.2 I2V-A14B model animates a start picture"}},
    sampling="flow", defaults=Defaults(6.0, 20, "euler", 832, 480),
    sizes=WAN_SIZES, size_rule="patch", latent_format="wan21_vae",
    companions=Companions(("t5xxl",), 16, 832, autoencoder="Wan 2.1", autoencoder_dims=3),
    variant_companions={"ti2v_5b": Companions(("t5xxl",), 48, 1280, autoencoder="Wan 2.2", autoencoder_dims=3)},
    compute=ComputeShape("dit", 40, 5120, 512),
    variant_compute={"ti2v_5b": ComputeShape("dit", 24, 3072, 512, scale=16),
                     "1.3b": ComputeShape("dit", 12, 1536, 512)},
    pipeline="sdplan.core.pipelines.wan.generate:generate",
    dry_run="sdplan.core.pipelines.wan.generate:measure", work="sdplan.core.pipelines.wan.generate:work",
    file_check="sdplan.core.pipelines.wan.files:check_files")

FAMILIES = (WAN,)
