"""Where a LoRA's keys land: per model family, the names a LoRA may use for each of the
model's own weight tensors.

A LoRA names the layer it patches in the naming of the trainer that made it: kohya's
``lora_unet_down_blocks_0_attentions_0_..._to_q`` (diffusers module names, dots as
underscores; for SDXL and Flux also the original ``input_blocks_1_1_...`` /
``double_blocks_0_img_attn_qkv``), diffusers/PEFT's ``unet.down_blocks.0...to_q``,
ComfyUI's ``diffusion_model.double_blocks.0.img_attn.qkv``. sdplan runs the original
single-file layouts, so each family gives an :data:`AliasTable`: per *namespace* (``unet``
for the diffusion model, ``te1``/``te2``/``te3`` for the text encoders, as kohya's
``lora_te1_``... prefixes and diffusers' ``text_encoder_2.`` count them) a map from every
module path a LoRA may use (dotted) to the :class:`Target` it patches: the module the
engine runs it in, the model's tensor name, and for fused weights (Flux's ``qkv``,
``linear1``; OpenCLIP's ``in_proj_weight``) the rows of the output axis the part covers.

Families: :func:`sd_aliases` (SD 1.x/2.x/SDXL: the LDM UNet with diffusers' block
numbering, CLIP and OpenCLIP text encoders), :func:`flux_aliases` (the BFL DiT with
diffusers' ``transformer_blocks``/``single_transformer_blocks`` names, CLIP-L, T5) and
:func:`generic_aliases` (any other family: the model's own names, which is what ComfyUI-style
LoRAs of DiT families use). The renames follow diffusers' single-file converters
(``diffusers/loaders/single_file_utils.py``) and stable-diffusion.cpp's
``name_conversion.cpp``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from sdplan.core.families import family as registry_family
from sdplan.core.modelfiles.openclip_names import openclip_to_transformers

__all__ = ["Target", "AliasTable", "sd_aliases", "flux_aliases", "generic_aliases",
           "unet_ldm_to_diffusers", "aliases_for_family"]


@dataclass(frozen=True)
class Target:
    """One weight tensor a LoRA patches.

    Attributes:
        module: the engine module running it (``diffusion``, ``te``; Flux: ``clip_l``,
            ``t5xxl``).
        tensor: the model's tensor name (as in its file).
        rows: ``(start, stop)`` along the output axis when the LoRA covers part of a fused
            weight, else None.
        swap_halves: the LoRA's output rows are the two halves of the tensor's in the other
            order (diffusers' ``norm_out.linear`` is (scale, shift), BFL's (shift, scale)).
    """

    module: str
    tensor: str
    rows: tuple[int, int] | None = None
    swap_halves: bool = False


#: namespace -> dotted module path -> target.
AliasTable = dict[str, dict[str, Target]]

#: transformers names of the linear layers a LoRA patches (not norms, not embeddings).
_LINEAR = re.compile(r"(_proj|\.fc[12]|^text_projection)\.weight$")
_RESNET = (("in_layers.0", "norm1"), ("in_layers.2", "conv1"), ("emb_layers.1", "time_emb_proj"),
           ("out_layers.0", "norm2"), ("out_layers.3", "conv2"), ("skip_connection", "conv_shortcut"))


def _weights(names: Collection[str], prefix: str) -> list[str]:
    """The module paths (prefix and ``.weight`` removed) of ``names`` under ``prefix``."""
    return [n[len(prefix):-len(".weight")] for n in names if n.startswith(prefix) and n.endswith(".weight")]


def unet_ldm_to_diffusers(path: str, layers: int, attn_out: Collection[int]) -> str | None:
    """diffusers' name of an LDM UNet module path (``input_blocks.4.1.proj_in`` ->
    ``down_blocks.1.attentions.0.proj_in``), or None for paths without one.

    ``layers`` is the ResBlocks per level on the way down (``layers_per_block``);
    ``attn_out`` the output blocks ``n`` whose ``output_blocks.n.1`` is a transformer (their
    upsampler is ``.2``). Numbering as diffusers' ``convert_ldm_unet_checkpoint``.
    """
    simple = {"time_embed.0": "time_embedding.linear_1", "time_embed.2": "time_embedding.linear_2",
              "input_blocks.0.0": "conv_in", "out.0": "conv_norm_out", "out.2": "conv_out",
              "label_emb.0.0": "add_embedding.linear_1", "label_emb.0.2": "add_embedding.linear_2"}
    if path in simple:
        return simple[path]
    m = re.match(r"(input_blocks|output_blocks|middle_block)\.(?:(\d+)\.)?(\d+)(?:\.(.*))?$", path)
    if not m:
        return None
    kind, n_s, m_s, rest = m.group(1), m.group(2), m.group(3), m.group(4) or ""
    if kind == "middle_block":
        if n_s is not None:
            return None
        part = int(m_s)
        head = {0: "mid_block.resnets.0", 1: "mid_block.attentions.0", 2: "mid_block.resnets.1"}.get(part)
        is_res = part != 1
    else:
        if n_s is None:
            return None
        n, part = int(n_s), int(m_s)
        if kind == "input_blocks":
            i, j = divmod(n - 1, layers + 1)
            if j == layers:
                return f"down_blocks.{i}.downsamplers.0.conv" if rest == "op" else None
            head = {0: f"down_blocks.{i}.resnets.{j}", 1: f"down_blocks.{i}.attentions.{j}"}.get(part)
            is_res = part == 0
        else:
            i, j = divmod(n, layers + 1)
            up = 2 if n in attn_out else 1
            if part == up and rest == "conv":
                return f"up_blocks.{i}.upsamplers.0.conv"
            head = {0: f"up_blocks.{i}.resnets.{j}"}.get(part)
            if part == 1 and n in attn_out:
                head = f"up_blocks.{i}.attentions.{j}"
            is_res = part == 0
    if head is None:
        return None
    if is_res:
        for a, b in _RESNET:
            if rest == a or rest.startswith(a + "."):
                rest = b + rest[len(a):]
                break
    return f"{head}.{rest}" if rest else head


def _unet(names: Collection[str], prefix: str, module: str) -> dict[str, Target]:
    paths = _weights(names, prefix)
    downs = sorted(int(m.group(1)) for p in paths if (m := re.match(r"input_blocks\.(\d+)\.0\.op$", p)))
    layers = downs[0] - 1 if downs else max(
        [int(m.group(1)) for p in paths if (m := re.match(r"input_blocks\.(\d+)\.", p))], default=1)
    attn_out = {int(m.group(1)) for p in paths if (m := re.match(r"output_blocks\.(\d+)\.1\.proj_in$", p))}
    out: dict[str, Target] = {}
    for p in paths:
        t = Target(module, f"{prefix}{p}.weight")
        out[p] = t
        d = unet_ldm_to_diffusers(p, layers, attn_out)
        if d is not None:
            out.setdefault(d, t)
    return out


def _clip(names: Collection[str], prefix: str, module: str) -> dict[str, Target]:
    """CLIP (transformers layout) under ``prefix`` (which ends at ``text_model.``'s parent)."""
    out: dict[str, Target] = {}
    for p in _weights(names, prefix):
        out[p] = Target(module, f"{prefix}{p}.weight")
        if p.startswith("text_model."):  # transformers 5 saves CLIP without the text_model level
            out.setdefault(p[len("text_model."):], out[p])
    return out


def _openclip(names: Collection[str], prefix: str, module: str,
              shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Target]:
    """OpenCLIP (``transformer.resblocks.N.attn.in_proj_weight``...) under ``prefix`` with
    the transformers names a LoRA uses (``text_model.encoder.layers.N.self_attn.q_proj``, rows
    of the fused ``in_proj_weight``: :func:`~sdplan.core.modelfiles.openclip_names.openclip_to_transformers`),
    with and without ``text_model.``, and the open_clip module paths of the unfused linear layers."""
    out: dict[str, Target] = {}
    for name in names:
        if not name.startswith(prefix):
            continue
        own = name[len(prefix):]
        to = openclip_to_transformers(own)
        if to is None or not _LINEAR.search(to.names[0]):
            continue
        part = shapes[name][0] // len(to.names) if len(to.names) > 1 else 0
        for k, hf in enumerate(to.names):
            t = Target(module, name, (k * part, (k + 1) * part) if part else None)
            path = hf[:-len(".weight")]
            out[path] = t
            out.setdefault(path.removeprefix("text_model."), t)  # transformers 5: no text_model level
        if not part and own.endswith(".weight"):
            out.setdefault(own[:-len(".weight")], Target(module, name))
    return out


#: SD text-encoder prefixes in single-file checkpoints -> (namespace, layout).
_SD_TE = (("cond_stage_model.transformer.", "te1", "clip"), ("cond_stage_model.model.", "te1", "openclip"),
          ("conditioner.embedders.0.transformer.", "te1", "clip"),
          ("conditioner.embedders.1.model.", "te2", "openclip"),
          ("conditioner.embedders.0.model.", "te1", "openclip"))


def sd_aliases(names: Mapping[str, Collection[str]], shapes: Mapping[str, tuple[int, ...]]) -> AliasTable:
    """The :data:`AliasTable` of an SD 1.x / 2.x / SDXL checkpoint: a single file, or a
    separate UNet file (its names without ``model.diffusion_model.``); the text encoders of
    single files only.

    Args:
        names: module (``diffusion``, ``te``) -> its tensor names.
        shapes: tensor name -> numpy-order shape (for OpenCLIP's fused q/k/v rows).
    """
    table: AliasTable = {"unet": {}, "te1": {}, "te2": {}}
    unet = names.get("diffusion", ())
    # a single file's UNet is under model.diffusion_model.; a separate UNet file
    # (--diffusion-model) has its names bare
    prefix = "model.diffusion_model." if any(n.startswith("model.diffusion_model.") for n in unet) else ""
    table["unet"].update(_unet(unet, prefix, "diffusion"))
    te = names.get("te", ())
    for prefix, space, layout in _SD_TE:
        if not any(n.startswith(prefix) for n in te):
            continue
        if layout == "clip":
            table[space].update(_clip(te, prefix, "te"))
        else:
            table[space].update(_openclip(te, prefix, "te", shapes))
    return table


def flux_aliases(names: Mapping[str, Collection[str]], shapes: Mapping[str, tuple[int, ...]]) -> AliasTable:
    """The :data:`AliasTable` of a Flux.1 set: the BFL DiT (module ``diffusion``, with or
    without ``model.diffusion_model.``) under its own names and diffusers'
    (``transformer_blocks.N.attn.to_q`` -> rows of ``double_blocks.N.img_attn.qkv``...),
    CLIP-L (``clip_l``, namespace ``te1``) and T5 (``t5xxl``, ``te2`` and ``te3``).
    """
    dit = list(names.get("diffusion", ()))
    prefix = "model.diffusion_model." if any(n.startswith("model.diffusion_model.") for n in dit) else ""
    unet: dict[str, Target] = {}
    for p in _weights(dit, prefix):
        unet[p] = Target("diffusion", f"{prefix}{p}.weight")
    width = shapes[f"{prefix}img_in.weight"][0] if f"{prefix}img_in.weight" in shapes else 0

    def put(alias: str, bfl: str, rows: tuple[int, int] | None = None, swap: bool = False) -> None:
        name = f"{prefix}{bfl}.weight"
        if name in shapes:
            unet[alias] = Target("diffusion", name, rows, swap)

    simple = {"x_embedder": "img_in", "context_embedder": "txt_in", "proj_out": "final_layer.linear"}
    for a, b in (("timestep_embedder", "time_in"), ("text_embedder", "vector_in"),
                 ("guidance_embedder", "guidance_in")):
        simple[f"time_text_embed.{a}.linear_1"] = f"{b}.in_layer"
        simple[f"time_text_embed.{a}.linear_2"] = f"{b}.out_layer"
    for a, b in simple.items():
        put(a, b)
    put("norm_out.linear", "final_layer.adaLN_modulation.1", swap=True)
    dbl = {int(m.group(1)) for n in dit if (m := re.match(re.escape(prefix) + r"double_blocks\.(\d+)\.", n))}
    sgl = {int(m.group(1)) for n in dit if (m := re.match(re.escape(prefix) + r"single_blocks\.(\d+)\.", n))}
    d = width
    for i in sorted(dbl):
        a, b = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for k, c in enumerate("qkv"):
            put(f"{a}attn.to_{c}", b + "img_attn.qkv", (k * d, (k + 1) * d))
            put(f"{a}attn.add_{c}_proj", b + "txt_attn.qkv", (k * d, (k + 1) * d))
        for x, y in (("attn.to_out.0", "img_attn.proj"), ("attn.to_add_out", "txt_attn.proj"),
                     ("ff.net.0.proj", "img_mlp.0"), ("ff.net.2", "img_mlp.2"),
                     ("ff_context.net.0.proj", "txt_mlp.0"), ("ff_context.net.2", "txt_mlp.2"),
                     ("norm1.linear", "img_mod.lin"), ("norm1_context.linear", "txt_mod.lin")):
            put(a + x, b + y)
    for i in sorted(sgl):
        a, b = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        name = f"{prefix}{b}linear1.weight"
        mlp = shapes[name][0] - 3 * d if name in shapes else 0
        for k, c in enumerate("qkv"):
            put(f"{a}attn.to_{c}", b + "linear1", (k * d, (k + 1) * d))
        put(a + "proj_mlp", b + "linear1", (3 * d, 3 * d + mlp))
        put(a + "proj_out", b + "linear2")
        put(a + "norm.linear", b + "modulation.lin")
    table: AliasTable = {"unet": unet, "te1": {}, "te2": {}, "te3": {}}
    table["te1"].update(_clip(names.get("clip_l", ()), "", "clip_l"))
    t5 = {p: Target("t5xxl", f"{p}.weight") for p in _weights(names.get("t5xxl", ()), "")}
    table["te2"].update(t5)
    table["te3"].update(t5)
    return table


def generic_aliases(names: Mapping[str, Collection[str]], shapes: Mapping[str, tuple[int, ...]]) -> AliasTable:
    """The model's own names: the diffusion model's (``model.diffusion_model.`` removed)
    under ``unet``, the text encoders' under ``te1``. What ComfyUI-style LoRAs of DiT
    families name (``diffusion_model.<name>``)."""
    table: AliasTable = {"unet": {}, "te1": {}}
    for module, space in (("diffusion", "unet"), ("te", "te1")):
        for n in names.get(module, ()):
            if n.endswith(".weight") and len(shapes.get(n, (0, 0))) >= 2:
                path = n[:-len(".weight")]
                table[space][path] = Target(module, n)
                if path.startswith("model.diffusion_model."):
                    table[space].setdefault(path[len("model.diffusion_model."):], Target(module, n))
    return table


def aliases_for_family(family: str, names: Mapping[str, Collection[str]],
                       shapes: Mapping[str, tuple[int, ...]]) -> AliasTable:
    """The alias table of ``family``: its registry entry's table
    (:attr:`sdplan.core.families.declaration.Family.lora_names`: ``sd`` for the UNet families,
    ``flux`` for the FLUX.1-layout DiTs); for another family, the layout of the diffusion
    model's names decides (an LDM UNet: SD's table; BFL double blocks: Flux's), else
    :func:`generic_aliases`."""
    diffusion = names.get("diffusion", ())
    fam = registry_family(family)
    kind = fam.lora_names if fam is not None else "generic"
    if kind == "sd" or any(n.startswith("model.diffusion_model.input_blocks.") for n in diffusion):
        return sd_aliases(names, shapes)
    if kind == "flux" or any(".double_blocks." in "." + n for n in diffusion):
        return flux_aliases(names, shapes)
    return generic_aliases(names, shapes)
