"""ControlNet for the latent-diffusion UNets (SD 1.x / 2.x, SDXL) in the original layout.

Names (Zhang et al. 2023, lllyasviel's ``cldm``; under ``control_model.`` in the published
files, or without a prefix): the UNet's encoder half (``time_embed.{0,2}``, SDXL's
``label_emb.0.{0,2}``, ``input_blocks.N.M``, ``middle_block.{0,1,2}``), the hint encoder
``input_hint_block.{0,2,...,14}`` (eight 3x3 convolutions with SiLU between, three of stride 2:
the control picture at image size down to the latent's, ``model_channels`` wide), one 1x1
``zero_convs.N.0`` per input block and ``middle_block_out.0``. sd-cli's ``ControlNetBlock``
(``src/model/diffusion/control.hpp``, read, not copied) runs the same graph: the stem's output
plus the guided hint, then each input block, each followed by its zero convolution, then the
middle block and its own.

:class:`ControlNetGraph`'s outputs ``ctl.N`` (one per UNet skip connection, ``N`` as the UNet's
``skip.N``) and ``ctl.mid`` are what the UNet adds, times the control strength, to the skip
each output block takes and to the middle block's output (:class:`~sdplan.core.models.unet.UNetGraph`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdplan.core.models.base import ModelLayoutError, Weights, WholeGraph
from sdplan.core.models.unet import UNetConfig, _block, _check, _embedding
from sdplan.core.runtime import graph as gr

__all__ = ["controlnet_config", "ControlNetGraph", "find_control_prefix", "residual_shapes", "HINT_LAYERS"]

Tensor = Any
#: The hint encoder's convolutions (index in ``input_hint_block``, stride); SiLU after all but the last.
HINT_LAYERS = ((0, 1), (2, 1), (4, 2), (6, 1), (8, 2), (10, 1), (12, 2), (14, 1))


def find_control_prefix(names: Mapping[str, Any]) -> str:
    """``control_model.`` (lllyasviel's files) or none.

    Raises:
        ModelLayoutError: no ``input_hint_block.0.weight`` under either (not a ControlNet).
    """
    for prefix in ("control_model.", ""):
        if prefix + "input_hint_block.0.weight" in names:
            return prefix
    raise ModelLayoutError("not a ControlNet: input_hint_block.0.weight is missing")


def controlnet_config(weights: Mapping[str, Any], num_heads: int | None, head_dim: int | None,
                      prefix: str | None = None) -> UNetConfig:
    """The ControlNet's hyper-parameters from its shapes (a UNet config without output blocks:
    ``out_channels`` 0), with the UNet's head rule (``num_heads`` or ``head_dim``).

    Raises:
        ModelLayoutError: missing tensors, or zero convolutions that do not match the blocks.
    """
    prefix = find_control_prefix(weights) if prefix is None else prefix
    w = Weights(weights, prefix)
    mc, cin = w.shape("input_blocks.0.0.weight")[:2]
    levels: list[list[int]] = [[]]
    attn: set[int] = set()
    depth = context = 0
    linear = False
    blocks = [n for n in w.indices("input_blocks.") if n > 0]
    for n in blocks:
        b = w.sub(f"input_blocks.{n}.")
        if "0.op.weight" in b:
            levels.append([])
            continue
        if "0.in_layers.2.weight" not in b:
            raise ModelLayoutError(f"{prefix}input_blocks.{n} is neither a ResBlock nor a Downsample")
        levels[-1].append(b.shape("0.out_layers.3.weight")[0])
        if "1.proj_in.weight" in b:
            attn.add(len(levels) - 1)
            depth = len(b.indices("1.transformer_blocks."))
            context = b.shape("1.transformer_blocks.0.attn2.to_k.weight")[1]
            linear = len(b.shape("1.proj_in.weight")) == 2
    if not context and "middle_block.1.proj_in.weight" in w:
        context = w.shape("middle_block.1.transformer_blocks.0.attn2.to_k.weight")[1]
    if not levels[0]:
        raise ModelLayoutError(f"{prefix}input_blocks has no ResBlocks")
    missing = [n for n in (0, *blocks) if f"zero_convs.{n}.0.weight" not in w]
    if missing or "middle_block_out.0.weight" not in w:
        raise ModelLayoutError(f"{prefix}zero_convs.{missing[0] if missing else 'middle_block_out'}: missing; "
                               "a ControlNet has one zero convolution per input block and the middle block")
    adm = w.shape("label_emb.0.0.weight")[1] if "label_emb.0.0.weight" in w else 0
    return UNetConfig(prefix, cin, 0, mc, tuple(lv[-1] // mc for lv in levels), len(levels[0]),
                      tuple(sorted(attn)), depth, context, linear, num_heads, None if num_heads else head_dim, adm)


class ControlNetGraph(WholeGraph):
    """The ControlNet as an engine module graph, whole (module docstring).

    Inputs ``x`` f32 ``(N, C, h, w)`` (the UNet's scaled input, ``x * c_in``), ``hint`` f32
    ``(N, 3, 8h, 8w)`` (the control picture in [0, 1]), ``t`` f32 ``(N,)``, ``c`` f32
    ``(N, S, D)`` and, with ``label_emb`` (SDXL), ``vec`` f32 ``(N, adm)``. Outputs ``ctl.N``
    for each input block ``N`` (0: the stem) and ``ctl.mid``. ``names``: checkpoint name ->
    store name.
    """

    cpu_bf16_kernels: tuple[str, ...] = ("amx", "avx512")

    def __init__(self, cfg: UNetConfig, names: Mapping[str, str]) -> None:
        self.cfg, self.names = cfg, dict(names)
        w = Weights(self.names, cfg.prefix)
        self.blocks = [n for n in w.indices("input_blocks.") if n > 0]

    def other_tensors(self) -> list[str]:
        return list(self.names.values())

    def outputs(self) -> list[str]:
        """The output names in the UNet's skip order, then ``ctl.mid``."""
        return [f"ctl.{n}" for n in (0, *self.blocks)] + ["ctl.mid"]

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        """``x``, ``hint``, ``t``, ``c`` (and ``vec`` with ``label_emb``) as f32; ValueError
        for others or a hint that is not 8x the latent."""
        want = {"x", "hint", "t", "c"} | ({"vec"} if self.cfg.adm_in_channels else set())
        if set(shapes) != want:
            raise ValueError(f"ControlNet inputs are {', '.join(sorted(want))}; got {sorted(shapes)}")
        x, hint = shapes["x"], shapes["hint"]
        if len(hint) != 4 or hint[0] != x[0] or tuple(hint[2:]) != (x[2] * 8, x[3] * 8):
            raise ValueError(f"ControlNet: hint must be ({x[0]}, 3, {x[2] * 8}, {x[3] * 8}), got {hint}")
        return {k: (tuple(shapes[k]), "f32") for k in sorted(want)}

    def build(self, g: Any, w: Any, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        v = Weights(w, self.cfg.prefix, self.names)
        _check(inputs["x"], inputs["c"], inputs.get("vec"), self.cfg)
        emb = _embedding(g, v, inputs["t"], inputs.get("vec"), self.cfg)
        hint = inputs["hint"]
        for k, (i, stride) in enumerate(HINT_LAYERS):
            hint = gr.conv2d(g, hint, v[f"input_hint_block.{i}.weight"], v[f"input_hint_block.{i}.bias"],
                             stride=stride, padding=1)
            if k < len(HINT_LAYERS) - 1:
                hint = g.unary("silu", hint)
        h = gr.conv2d(g, inputs["x"], v["input_blocks.0.0.weight"], v["input_blocks.0.0.bias"], padding=1)
        h = g.add(h, hint)

        def zero(n: int | str, t: Tensor) -> Tensor:
            name = f"zero_convs.{n}.0" if n != "mid" else "middle_block_out.0"
            return gr.conv2d(g, t, v[f"{name}.weight"], v[f"{name}.bias"])

        out = {"ctl.0": zero(0, h)}
        for n in self.blocks:
            h = _block(g, v.sub(f"input_blocks.{n}."), h, emb, inputs["c"], self.cfg)
            out[f"ctl.{n}"] = zero(n, h)
        h = _block(g, v.sub("middle_block."), h, emb, inputs["c"], self.cfg)
        out["ctl.mid"] = zero("mid", h)
        return out


def residual_shapes(graph: ControlNetGraph, shapes: Mapping[str, tuple[int, ...]], n: int, h: int,
                    w: int) -> dict[str, tuple[int, ...]]:
    """The shapes of ``graph``'s outputs for ``n`` latents of ``h`` x ``w`` (the UNet's extra
    inputs, for its dry run), from the weights' ``shapes``: a Downsample halves the size
    (rounding up), a ResBlock sets the width."""
    p = graph.cfg.prefix
    c = graph.cfg.model_channels
    out: dict[str, tuple[int, ...]] = {"ctl.0": (n, c, h, w)}
    for b in graph.blocks:
        if f"{p}input_blocks.{b}.0.op.weight" in shapes:
            h, w = (h + 1) // 2, (w + 1) // 2
        else:
            c = shapes[f"{p}input_blocks.{b}.0.out_layers.3.weight"][0]
        out[f"ctl.{b}"] = (n, c, h, w)
    out["ctl.mid"] = (n, c, h, w)
    return out
