"""Model-family rules: which architecture a set of diffusion tensors is, from names and shapes.

:func:`detect_family` is the one decision (:func:`sdplan.core.modelfiles.checkpoint.detect_architecture`
feeds it a model set's diffusion tensors, its ``llm`` encoder's names and the files'
``sdplan.family`` metadata). Rules in order:

* Z-Image (:func:`z_image_family`): ``cap_embedder.1`` and noise refiners;
* FLUX.2 (:func:`flux2_family`): the shared ``double_stream_modulation_img`` (sd-cli's test);
  48 single blocks -> ``flux2`` ``dev`` (Mistral Small 3.2 encoder), else ``flux2_klein``,
  ``4b`` at width 3072 (Qwen3-4B states) or ``9b`` at 4096 (Qwen3-8B);
* ``double_blocks`` / ``single_blocks`` (or diffusers ``single_transformer_blocks``) ->
  ``flux``: ``chroma`` with ``distilled_guidance_layer.in_proj.weight`` (sd-cli's test;
  ``radiance`` with ``img_in_patch``), ``dev`` with a guidance embedder, else ``schnell``;
* ``joint_blocks`` (or diffusers ``context_embedder`` with ``pos_embed``) -> ``sd3``
  (``3.5-medium`` with MMDiT-X ``attn2``, ``medium`` at 24 blocks, ``large`` at 38);
* a UNet's cross-attention context width: 768 -> ``sd1``, 1024 -> ``sd2``, 2048 ->
  ``sdxl`` (1280 with ``label_emb``: its ``refiner``); another width -> the family a file's
  ``sdplan.family`` metadata names (sd1 or sd2 without ``label_emb``, sdxl with it, a refiner
  when no clip_l encoder is among the files; scaled-down models such as the demo);
* anything else with diffusion tensors is ``unknown`` but loadable.

:func:`llm_family` names the language model of a ``te`` file (the ``llm`` encoder).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping

__all__ = ["detect_family", "z_image_family", "flux2_family", "llm_family", "DIFFUSION_MARKERS"]

#: Name prefixes only a Z-Image DiT has (for classifying a standalone ``-m`` file).
DIFFUSION_MARKERS = ("cap_embedder.", "noise_refiner.", "context_refiner.")
#: FLUX.2's shared image-stream modulation in BFL and diffusers names.
FLUX2_MARKERS = ("double_stream_modulation_img.lin.weight", "double_stream_modulation_img.linear.weight")
#: FLUX.2 klein variants by DiT width: (variant, text encoder).
KLEIN_WIDTHS = {3072: ("4b", "Qwen3-4B"), 4096: ("9b", "Qwen3-8B")}

Family = tuple[str, str | None, tuple[str, ...]]


def _count(names: Iterable[str], seg: str) -> int:
    pat = re.compile(re.escape(seg) + r"\.(\d+)\.")
    return len({m.group(1) for n in names if (m := pat.match(n))})


def llm_family(names: Iterable[str]) -> str | None:
    """``qwen3`` (per-head q/k norms), ``qwen2.5`` (q/k/v biases) or ``llm`` (another
    decoder-only model) for the tensor names of a language model in transformers or
    llama.cpp names, with its block count, e.g. ``qwen3, 36 blocks``; None without blocks."""
    names = list(names)
    pat = re.compile(r"(?:^|\.)(?:layers|blk)\.(\d+)\.")
    blocks = {m.group(1) for n in names if (m := pat.search(n))}
    if not blocks:
        return None
    if any(n.endswith(("self_attn.q_norm.weight", "attn_q_norm.weight")) for n in names):
        kind = "qwen3"
    elif any(n.endswith(("self_attn.q_proj.bias", "attn_q.bias")) for n in names):
        kind = "qwen2.5"
    else:
        kind = "llm"
    return f"{kind}, {len(blocks)} blocks"


def z_image_family(diffusion: Mapping[str, tuple[int, ...]], llm_names: Iterable[str] = ()) -> Family | None:
    """``("z_image", None, evidence)`` when the diffusion tensors (names without
    ``model.diffusion_model.``, shapes) are a Z-Image DiT, else None. The evidence names the
    layer counts, the caption width (the text encoder it expects) and, when ``llm_names`` are
    given, the text encoder found."""
    if "cap_embedder.1.weight" not in diffusion or not _count(diffusion, "noise_refiner"):
        return None
    ev = [f"{_count(diffusion, 'layers')} layers + {_count(diffusion, 'noise_refiner')} noise / "
          f"{_count(diffusion, 'context_refiner')} context refiners (Z-Image single-stream DiT)"]
    width = diffusion["cap_embedder.1.weight"]
    ev.append(f"caption width {width[-1]} (cap_embedder.1.weight {list(width)}): "
              + ("a Qwen3-4B text encoder" if width[-1] == 2560 else "a language-model text encoder"))
    llm = llm_family(llm_names)
    if llm:
        ev.append(f"text encoder: {llm}")
    return "z_image", None, tuple(ev)


def flux2_family(diffusion: Mapping[str, tuple[int, ...]], llm_names: Iterable[str] = ()) -> Family | None:
    """``("flux2_klein", "4b" | "9b" | None, evidence)`` or ``("flux2", "dev", evidence)`` when
    the diffusion tensors (BFL or diffusers names, no ``model.diffusion_model.``) are a FLUX.2
    DiT, else None (rules in the module docstring). The evidence names the block counts, the
    width, the text width (three LLM states for klein) and the text encoder found."""
    if not any(m in diffusion for m in FLUX2_MARKERS):
        return None
    bfl = "img_in.weight" in diffusion
    dbl = _count(diffusion, "double_blocks" if bfl else "transformer_blocks")
    sgl = _count(diffusion, "single_blocks" if bfl else "single_transformer_blocks")
    img, txt = (diffusion.get(n, ()) for n in (("img_in.weight", "txt_in.weight") if bfl
                                               else ("x_embedder.weight", "context_embedder.weight")))
    width = int(img[0]) if img else 0
    ev = [f"{dbl} double + {sgl} single blocks with shared modulation "
          "(double_stream_modulation_img: FLUX.2 DiT)", f"width {width}, text width {txt[-1] if txt else '?'}"]
    llm = llm_family(llm_names)
    if sgl == 48:
        ev.append("48 single blocks: FLUX.2 [dev] (Mistral Small 3.2 text encoder)")
        return "flux2", "dev", tuple(ev)
    variant, encoder = KLEIN_WIDTHS.get(width, (None, "a Qwen3"))
    ev.append(f"FLUX.2 [klein]: the states of three {encoder} blocks as its text")
    if llm:
        ev.append(f"text encoder: {llm}")
    return "flux2_klein", variant, tuple(ev)


def _flux1(diff: Mapping[str, tuple[int, ...]], names: list[str]) -> Family | None:
    dbl, sgl = _count(names, "double_blocks"), _count(names, "single_blocks")
    if not (dbl or sgl) and any(n.startswith("single_transformer_blocks.") for n in names):
        dbl, sgl = _count(names, "transformer_blocks"), _count(names, "single_transformer_blocks")
    if not (dbl or sgl):
        return None
    ev = [f"{dbl} double_blocks + {sgl} single_blocks (Flux MMDiT)"]
    if "distilled_guidance_layer.in_proj.weight" in diff:
        ev.append("distilled_guidance_layer instead of per-block modulation: Chroma")
        return "chroma", "radiance" if "img_in_patch.weight" in diff else None, tuple(ev)
    guided = [n for n in names if n.startswith(("guidance_in.", "time_text_embed.guidance_embedder."))]
    if guided:
        ev.append(f"guidance embedder present ({guided[0]}): dev")
        return "flux", "dev", tuple(ev)
    ev.append("no guidance_in: schnell")
    return "flux", "schnell", tuple(ev)


def _sd3(diff: Mapping[str, tuple[int, ...]], names: list[str]) -> Family | None:
    joint = _count(names, "joint_blocks")
    if not (joint or ("pos_embed.proj.weight" in diff and "context_embedder.weight" in diff)):
        return None
    depth = joint or _count(names, "transformer_blocks")
    ev = [f"{depth} joint blocks (SD3 MMDiT)"]
    if any(".x_block.attn2." in n or ".attn2." in n for n in names):
        ev.append("x_block.attn2 present (MMDiT-X)")
        return "sd3", "3.5-medium", tuple(ev)
    return "sd3", {24: "medium", 38: "large"}.get(depth), tuple(ev)


def _unet(diff: Mapping[str, tuple[int, ...]], names: list[str], metadata_families: Iterable[str],
          encoders: Collection[str | None]) -> Family | None:
    ctx = next(((n, s[1]) for n, s in diff.items() if ".attn2.to_k.weight" in n and len(s) == 2), None)
    if ctx is None:
        return None
    ev = [f"UNet cross-attention context {ctx[1]} ({ctx[0]} {list(diff[ctx[0]])})"]
    sdxl_emb = any(n.startswith(("label_emb.", "add_embedding.")) for n in names)
    if sdxl_emb:
        ev.append("label_emb/add_embedding present (SDXL size conditioning)")
    known = {768: "sd1", 1024: "sd2", 2048: "sdxl"}
    if ctx[1] in known:
        return known[ctx[1]], None, tuple(ev)
    if ctx[1] == 1280 and sdxl_emb:
        return "sdxl", "refiner", tuple(ev)
    # A scaled-down UNet (sdplan's demo model, test models) names its family in the file's
    # metadata, as the pipelines read it (sdplan.core.pipelines.sd.METADATA_KEYS): sd1 or sd2
    # without label_emb, sdxl with it (its refiner when the text encoders lack clip_l).
    named = set(metadata_families) & {"sd1", "sd2", "sdxl"}
    if len(named) == 1 and (named == {"sdxl"}) == sdxl_emb:
        family = named.pop()
        ev.append(f"file metadata sdplan.family = {family}")
        enc = set(encoders) - {None}
        refiner = family == "sdxl" and bool(enc) and "clip_l" not in enc
        return family, "refiner" if refiner else None, tuple(ev)
    return None


def detect_family(diffusion: Mapping[str, tuple[int, ...]], llm_names: Iterable[str] = (),
                  metadata_families: Iterable[str] = (),
                  encoders: Collection[str | None] = ()) -> Family:
    """``(family, variant, evidence)`` of diffusion tensors (names without
    ``model.diffusion_model.`` -> shapes), by the rules of the module docstring.
    ``llm_names``: the ``llm`` encoder's tensor names (named in the evidence);
    ``metadata_families``: the files' ``sdplan.family`` metadata values; ``encoders``: the
    text encoders among the files (clip_l, clip_g, ...; a scaled-down SDXL UNet without
    clip_l beside it is a refiner)."""
    if not diffusion:
        return "unknown", None, ("no diffusion model among the files",)
    names = list(diffusion)
    llm = list(llm_names)
    found = (z_image_family(diffusion, llm) or flux2_family(diffusion, llm) or _flux1(diffusion, names)
             or _sd3(diffusion, names) or _unet(diffusion, names, metadata_families, encoders))
    if found is not None:
        return found
    return "unknown", None, (f"no known diffusion layout among {len(diffusion)} tensors; loadable by name",)
