"""The latent-diffusion UNet (SD 1.x / 2.x, SDXL) in the original single-file layout.

Names under ``model.diffusion_model.`` (Rombach et al. 2022, the CompVis ``openaimodel``;
SDXL: Podell et al. 2023, Stability's ``generative-models``), or without that prefix in a
standalone ``--diffusion-model`` file: ``time_embed.{0,2}``, SDXL's vector conditioning
``label_emb.0.{0,2}`` (linear, SiLU, linear of the ``adm`` vector), ``input_blocks.N.M``
(``N.0`` the stem conv; then a ResBlock ``in_layers/emb_layers/out_layers/skip_connection``, a
SpatialTransformer ``norm, proj_in, transformer_blocks.K.{norm1, attn1, norm2, attn2, norm3,
ff}, proj_out``, or a Downsample ``op``), ``middle_block.{0,1,2}``, ``output_blocks.N.M``
(ResBlock, SpatialTransformer, Upsample ``conv``) and ``out.{0,2}``. LoRA files name these
same modules (``lora_unet_input_blocks_4_1_proj_in`` is ``input_blocks.4.1.proj_in``).

Every hyper-parameter comes from the shapes (:func:`unet_config`), so scaled-down models and
the reduced SDXL variants load too: a SpatialTransformer runs as many transformer blocks as
its weights have (SDXL: 2 at level 1 and 10 at level 2; SSD-1B and Vega fewer, per block), a
level without SpatialTransformers has no attention (SDXL's first), and a middle block runs
the layers it has (SSD-1B: one ResBlock). The head count is not in the shapes: SD 1.x uses 8
heads everywhere, SD 2.x and SDXL a head width of 64 (their registry entries'
:attr:`~sdplan.core.families.declaration.Family.unet_heads`); pass
``num_heads`` or ``head_dim`` for other models.

Engine stages: :class:`UNetGraph` gives the runner one block per stage, ``input_blocks.N``
(N >= 1), ``middle_block`` and ``output_blocks.N`` in execution order (:func:`unet_stages`),
so ``--max-vram`` can cut the UNet into segments; the skip activations the output blocks
take travel in the state between segments. These engine blocks are not the planner's blocks
of spec section 8: a UNet is never layer-split across devices.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sdplan.core.families import family as registry_family
from sdplan.core.models.base import ModelLayoutError, Weights
from sdplan.core.models.unet_check import check_unet
from sdplan.core.runtime import graph as gr

__all__ = ["UNetConfig", "UNetGraph", "PREFIX",
           "unet_config", "unet", "unet_stages", "find_prefix"]

Tensor = Any
PREFIX = "model.diffusion_model."
#: (num_heads, head_dim) of a UNet whose family names none: SD 1.x's 8 heads.
DEFAULT_HEADS = (8, None)
_GN_GROUPS = 32
_RES_EPS = 1e-5
_ST_EPS = 1e-6
_LN_EPS = 1e-5


@dataclass(frozen=True)
class UNetConfig:
    """UNet hyper-parameters inferred from tensor shapes.

    Attributes:
        prefix: checkpoint prefix.
        in_channels, out_channels, model_channels: stem in/out and base width.
        channel_mult: per level, ResBlock width / model_channels.
        num_res_blocks: ResBlocks per level on the way down.
        attention_levels: levels whose ResBlocks are followed by a SpatialTransformer.
        transformer_depth: transformer blocks per SpatialTransformer.
        context_dim: cross-attention context width.
        linear_proj: proj_in/proj_out are linear layers (SD 2.x) rather than 1x1 convs.
        num_heads, head_dim: the head rule (one of them set).
        adm_in_channels: width of the ``label_emb`` vector input (SDXL 2816, the refiner
            2560); 0 without ``label_emb``.
    """

    prefix: str
    in_channels: int
    out_channels: int
    model_channels: int
    channel_mult: tuple[int, ...]
    num_res_blocks: int
    attention_levels: tuple[int, ...]
    transformer_depth: int
    context_dim: int
    linear_proj: bool
    num_heads: int | None
    head_dim: int | None
    adm_in_channels: int = 0

    def heads(self, channels: int) -> int:
        """Attention heads of a SpatialTransformer of ``channels`` width."""
        if self.num_heads:
            return self.num_heads
        assert self.head_dim
        return max(1, channels // self.head_dim)


def find_prefix(names: Mapping[str, Any]) -> str:
    """The UNet's name prefix among ``names``: :data:`PREFIX` (single file, sd-cli's GGUF
    files) or none (a standalone ``--diffusion-model`` file, city96-style GGUF files).

    Raises:
        ModelLayoutError: no ``input_blocks.0.0.weight`` under either.
    """
    for prefix in (PREFIX, ""):
        if prefix + "input_blocks.0.0.weight" in names:
            return prefix
    raise ModelLayoutError("no UNet: input_blocks.0.0.weight is missing (with or without "
                           f"the {PREFIX} prefix)")


def unet_config(weights: Mapping[str, Any], family: str = "sd1", num_heads: int | None = None,
                head_dim: int | None = None, prefix: str = PREFIX) -> UNetConfig:
    """Infer a :class:`UNetConfig` from ``weights`` (tensors or shape tuples).

    ``num_heads``/``head_dim`` override the family's rule (its registry entry's ``unet_heads``;
    SD 1.x's 8 heads for a family without one);
    ``transformer_depth`` is the last SpatialTransformer's depth seen on the way down (the
    graph reads each block's own depth from its weights).

    Raises:
        ModelLayoutError: missing stem/output tensors, a block structure that is not a UNet,
            tensor shapes that do not fit together or channels that do not split into the
            heads (:func:`sdplan.core.models.unet_check.check_unet`, naming the tensor).
    """
    w = Weights(weights, prefix)
    mc, cin = w.shape("input_blocks.0.0.weight")[:2]
    cout = w.shape("out.2.weight")[0]
    levels: list[list[int]] = [[]]
    attn_levels: set[int] = set()
    depth = 0
    context = 0
    linear = False
    for n in w.indices("input_blocks.")[1:]:
        b = w.sub(f"input_blocks.{n}.")
        if "0.op.weight" in b:
            levels.append([])
            continue
        if "0.in_layers.2.weight" not in b:
            raise ModelLayoutError(f"input_blocks.{n} is neither a ResBlock nor a Downsample")
        levels[-1].append(b.shape("0.out_layers.3.weight")[0])
        if "1.proj_in.weight" in b:
            attn_levels.add(len(levels) - 1)
            depth = len(b.indices("1.transformer_blocks."))
            context = b.shape("1.transformer_blocks.0.attn2.to_k.weight")[1]
            linear = len(b.shape("1.proj_in.weight")) == 2
    if not levels[0]:
        raise ModelLayoutError(f"{prefix}input_blocks has no ResBlocks")
    if "middle_block.1.proj_in.weight" in w and not context:
        context = w.shape("middle_block.1.transformer_blocks.0.attn2.to_k.weight")[1]
        depth = len(w.indices("middle_block.1.transformer_blocks."))
        linear = len(w.shape("middle_block.1.proj_in.weight")) == 2
    if num_heads is None and head_dim is None:
        fam = registry_family(family)
        num_heads, head_dim = (fam.unet_heads if fam is not None and fam.unet_heads else DEFAULT_HEADS)
    adm = w.shape("label_emb.0.0.weight")[1] if "label_emb.0.0.weight" in w else 0
    check_unet(weights, prefix, context, num_heads, None if num_heads else head_dim,
               unet_stages(weights, prefix))
    return UNetConfig(prefix, cin, cout, mc, tuple(lv[-1] // mc for lv in levels),
                      len(levels[0]), tuple(sorted(attn_levels)), depth, context, linear,
                      num_heads, head_dim if not num_heads else None, adm)


def _resblock(g: Any, w: Weights, x: Tensor, emb: Tensor) -> Tensor:
    h = gr.group_norm(g, x, _GN_GROUPS, w["in_layers.0.weight"], w["in_layers.0.bias"], _RES_EPS, silu=True)
    h = gr.conv2d(g, h, w["in_layers.2.weight"], w["in_layers.2.bias"], padding=1)
    e = gr.linear(g, g.unary("silu", emb), w["emb_layers.1.weight"], w["emb_layers.1.bias"])  # (N, C)
    h = g.add(h, g.reshape(e, (e.shape[0], e.shape[1], 1, 1)))
    h = gr.group_norm(g, h, _GN_GROUPS, w["out_layers.0.weight"], w["out_layers.0.bias"], _RES_EPS, silu=True)
    h = gr.conv2d(g, h, w["out_layers.3.weight"], w["out_layers.3.bias"], padding=1)
    if "skip_connection.weight" in w:
        x = gr.conv2d(g, x, w["skip_connection.weight"], w["skip_connection.bias"])
    return g.add(x, h)


def _attn(g: Any, w: Weights, x: Tensor, ctx: Tensor, heads: int) -> Tensor:
    """Multi-head attention of ``x`` (N, L, C) over ``ctx`` (N, S, Cc) -> (N, L, C)."""
    n, length, c = x.shape
    s = ctx.shape[1]
    d = c // heads

    def split(t: Tensor, ln: int) -> Tensor:  # a view: the attention ops read strided heads
        return g.permute(g.reshape(t, (n, ln, heads, d)), (0, 2, 1, 3))

    q = split(gr.linear(g, x, w["to_q.weight"]), length)
    k = split(gr.linear(g, ctx, w["to_k.weight"]), s)
    v = split(gr.linear(g, ctx, w["to_v.weight"]), s)
    o = gr.attention(g, q, k, v)
    return gr.linear(g, o, w["to_out.0.weight"], w["to_out.0.bias"])


def _transformer(g: Any, w: Weights, x: Tensor, context: Tensor, cfg: UNetConfig) -> Tensor:
    n, c, hh, ww = x.shape
    heads = cfg.heads(c)
    h = gr.group_norm(g, x, _GN_GROUPS, w["norm.weight"], w["norm.bias"], _ST_EPS)
    linear = len(w.shape("proj_in.weight")) == 2
    if not linear:
        h = gr.conv2d(g, h, w["proj_in.weight"], w["proj_in.bias"])
    h = g.reshape(g.cont(g.permute(h, (0, 2, 3, 1))), (n, hh * ww, h.shape[1]))
    if linear:
        h = gr.linear(g, h, w["proj_in.weight"], w["proj_in.bias"])
    for k in w.indices("transformer_blocks."):
        b = w.sub(f"transformer_blocks.{k}.")
        a = gr.layer_norm(g, h, b["norm1.weight"], b["norm1.bias"], _LN_EPS)
        h = g.add(h, _attn(g, b.sub("attn1."), a, a, heads))
        a = gr.layer_norm(g, h, b["norm2.weight"], b["norm2.bias"], _LN_EPS)
        h = g.add(h, _attn(g, b.sub("attn2."), a, context, heads))
        a = gr.layer_norm(g, h, b["norm3.weight"], b["norm3.bias"], _LN_EPS)
        a = gr.geglu(g, gr.linear(g, a, b["ff.net.0.proj.weight"], b["ff.net.0.proj.bias"]))
        h = g.add(h, gr.linear(g, a, b["ff.net.2.weight"], b["ff.net.2.bias"]))
    if linear:
        h = gr.linear(g, h, w["proj_out.weight"], w["proj_out.bias"])
    ci = h.shape[-1]
    h = g.cont(g.permute(g.reshape(h, (n, hh, ww, ci)), (0, 3, 1, 2)))
    if not linear:
        h = gr.conv2d(g, h, w["proj_out.weight"], w["proj_out.bias"])
    return g.add(h, x)


def _block(g: Any, w: Weights, x: Tensor, emb: Tensor, context: Tensor, cfg: UNetConfig) -> Tensor:
    """One ``input_blocks.N`` / ``middle_block`` / ``output_blocks.N``: its layers in order."""
    for m in w.indices(""):
        b = w.sub(f"{m}.")
        if "in_layers.0.weight" in b:
            x = _resblock(g, b, x, emb)
        elif "proj_in.weight" in b:
            x = _transformer(g, b, x, context, cfg)
        elif "op.weight" in b:
            x = gr.conv2d(g, x, b["op.weight"], b["op.bias"], stride=2, padding=1)
        elif "conv.weight" in b:
            x = gr.conv2d(g, g.upscale(x, 2), b["conv.weight"], b["conv.bias"], padding=1)
        else:
            raise ModelLayoutError(f"{b.prefix}: unknown UNet layer")
    return x


def unet_stages(weights: Mapping[str, Any], prefix: str = PREFIX) -> list[str]:
    """The UNet's engine stages in execution order, as name prefixes after ``prefix``:
    ``input_blocks.N.`` (N >= 1; N = 0 is the stem), ``middle_block.`` when present,
    ``output_blocks.N.``.

    Raises:
        ModelLayoutError: no input or output blocks.
    """
    w = Weights(weights, prefix)
    ins = [n for n in w.indices("input_blocks.") if n > 0]
    outs = w.indices("output_blocks.")
    if not ins or not outs:
        raise ModelLayoutError(f"{prefix}: a UNet needs input_blocks.1... and output_blocks.0...")
    mid = ["middle_block."] if w.indices("middle_block.") else []
    return [f"input_blocks.{n}." for n in ins] + mid + [f"output_blocks.{n}." for n in outs]


def _embedding(g: Any, w: Weights, t: Tensor, y: Tensor | None, cfg: UNetConfig) -> Tensor:
    """Timestep embedding, plus ``label_emb`` of the vector ``y`` (SDXL): ``(N, 4*mc)``."""
    emb = g.timestep_embedding(t, cfg.model_channels)
    emb = gr.linear(g, emb, w["time_embed.0.weight"], w["time_embed.0.bias"])
    emb = gr.linear(g, g.unary("silu", emb), w["time_embed.2.weight"], w["time_embed.2.bias"])
    if cfg.adm_in_channels:
        if y is None:
            raise ValueError(f"unet: this UNet takes a vector y of width {cfg.adm_in_channels}")
        v = gr.linear(g, y, w["label_emb.0.0.weight"], w["label_emb.0.0.bias"])
        v = gr.linear(g, g.unary("silu", v), w["label_emb.0.2.weight"], w["label_emb.0.2.bias"])
        emb = g.add(emb, v)
    return emb


def _check(x: Tensor, context: Tensor, y: Tensor | None, cfg: UNetConfig) -> None:
    f = 2 ** (len(cfg.channel_mult) - 1)
    if x.shape[-1] % f or x.shape[-2] % f:
        raise ValueError(f"unet: latent {x.shape[-2]}x{x.shape[-1]} is not divisible by {f}")
    if cfg.context_dim and context.shape[-1] != cfg.context_dim:
        raise ValueError(f"unet: context width {context.shape[-1]} != {cfg.context_dim}")
    if y is not None and tuple(y.shape) != (x.shape[0], cfg.adm_in_channels):
        raise ValueError(f"unet: vector y must be ({x.shape[0]}, {cfg.adm_in_channels}), got {y.shape}")


def unet(g: Any, weights: Mapping[str, Any], x: Tensor, t: Tensor, context: Tensor,
         cfg: UNetConfig | None = None, y: Tensor | None = None) -> Tensor:
    """The UNet's output (eps or v, as the model was trained).

    Args:
        g: the graph.
        weights: checkpoint name -> tensor.
        x: f32 latent ``(N, C_in, H, W)``, H and W divisible by 2^(levels-1).
        t: f32 timesteps ``(N,)`` (0..999, fractional allowed).
        context: f32 cross-attention context ``(N, S, context_dim)``.
        cfg: hyper-parameters (default: :func:`unet_config` with the SD 1.x head rule).
        y: f32 vector conditioning ``(N, adm_in_channels)`` for a UNet with ``label_emb``
            (SDXL), else None.

    Returns:
        f32 ``(N, C_out, H, W)``.

    Raises:
        ValueError: H or W not divisible by the downsampling factor, a context or vector of
            the wrong width, or no vector for a UNet that takes one.
    """
    cfg = cfg or unet_config(weights)
    w = Weights(weights, cfg.prefix)
    _check(x, context, y, cfg)
    emb = _embedding(g, w, t, y, cfg)
    h = gr.conv2d(g, x, w["input_blocks.0.0.weight"], w["input_blocks.0.0.bias"], padding=1)
    skips = [h]
    for stage in unet_stages(weights, cfg.prefix):
        if stage.startswith("output_blocks."):
            if not skips:
                raise ModelLayoutError("output_blocks outnumber the skip connections")
            h = g.concat(h, skips.pop(), 1)
        h = _block(g, w.sub(stage), h, emb, context, cfg)
        if stage.startswith("input_blocks."):
            skips.append(h)
    return _out(g, w, h)


def _out(g: Any, w: Weights, h: Tensor) -> Tensor:
    h = gr.group_norm(g, h, _GN_GROUPS, w["out.0.weight"], w["out.0.bias"], _RES_EPS, silu=True)
    return gr.conv2d(g, h, w["out.2.weight"], w["out.2.bias"], padding=1)


class UNetGraph:
    """The UNet as an engine module graph (:class:`sdplan.core.models.ModuleGraph`) whose
    blocks are its stages (:func:`unet_stages`): block ``i`` holds the weights under stage
    ``i``; the time embedding, ``label_emb``, the stem and ``out`` are non-block weights on
    the main device. Spec section 8 still holds: these blocks are the runner's cut points for
    ``--max-vram`` segments, never planner blocks for a layer split.

    Inputs ``x`` f32 ``(N, C_in, H, W)``, ``t`` f32 ``(N,)``, ``c`` f32 ``(N, S, D)`` and, for
    a UNet with ``label_emb``, ``vec`` f32 ``(N, adm_in_channels)`` (the model's ``y``);
    output ``y`` ``(N, C_out, H, W)``. ``names``: checkpoint name -> store name of every UNet weight.

    The state between blocks: ``h`` (the running activation), ``emb``, ``c`` and
    ``skip.K`` for each skip activation not yet taken (K = 0 the stem's, K = N after
    ``input_blocks.N``); an output block takes the highest K left. A ControlNet's outputs
    (:class:`~sdplan.core.models.controlnet.ControlNetGraph`, times the strength) travel as
    inputs ``ctl.K``, added to skip K as it is taken, and ``ctl.mid``, added to the middle
    block's output (sd-cli's UNet with ``controls``).

    Raises ModelLayoutError (from the constructor) for weights without UNet stages.
    """

    #: The CPU bf16 kernels (sdplan._ggml.bf16_kernel()) with which this module's products with
    #: f16/bf16 weights run in bf16 (ModuleRunner; AMX converts the weights as they load): measured by bench/bench_cpu_bf16.py (1 thread,
    #: medians of 3 interleaved processes), an SD 1.5-size step took 0.24x (AMX) and 0.70x (AVX512_BF16) the f16 path's time.
    #: Accuracy: tests/test_bf16_models.py.
    cpu_bf16_kernels: tuple[str, ...] = ("amx", "avx512")

    def __init__(self, cfg: UNetConfig, names: Mapping[str, str]) -> None:
        self.cfg, self.names = cfg, dict(names)
        self.stages = unet_stages(self.names, cfg.prefix)
        self.n_blocks = len(self.stages)
        self._blocks: list[list[str]] = [[] for _ in self.stages]
        self._other: list[str] = []
        heads = [cfg.prefix + s for s in self.stages]
        for full, short in self.names.items():
            for i, p in enumerate(heads):
                if full.startswith(p):
                    self._blocks[i].append(short)
                    break
            else:
                self._other.append(short)

    def block_tensors(self, i: int) -> list[str]:
        """Store names of stage ``i``'s weights (IndexError outside 0..n_blocks-1)."""
        if not 0 <= i < self.n_blocks:
            raise IndexError(f"UNet stage {i} outside 0..{self.n_blocks - 1}")
        return list(self._blocks[i])

    def other_tensors(self) -> list[str]:
        return list(self._other)

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        """``x``, ``t``, ``c`` (and ``vec`` for a UNet with ``label_emb``) as f32, and a
        ControlNet's ``ctl.N`` / ``ctl.mid`` (already times the control strength) when given;
        ValueError when one is missing or extra, or ``t`` does not have one entry per latent."""
        want = {"x", "t", "c"} | ({"vec"} if self.cfg.adm_in_channels else set())
        want |= {k for k in shapes if k.startswith("ctl.")}
        if set(shapes) != want:
            raise ValueError(f"UNet inputs are {', '.join(sorted(want))}; got {sorted(shapes)}")
        if tuple(shapes["t"]) != (shapes["x"][0],):
            raise ValueError(f"UNet: t must be ({shapes['x'][0]},), got {shapes['t']}")
        return {k: (tuple(shapes[k]), "f32") for k in sorted(want)}

    def _view(self, w: Any) -> Weights:
        return Weights(w, self.cfg.prefix, self.names)

    def build_pre(self, g: Any, w: Any, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        v = self._view(w)
        _check(inputs["x"], inputs["c"], inputs.get("vec"), self.cfg)
        emb = _embedding(g, v, inputs["t"], inputs.get("vec"), self.cfg)
        h = gr.conv2d(g, inputs["x"], v["input_blocks.0.0.weight"], v["input_blocks.0.0.bias"], padding=1)
        return {"h": h, "emb": emb, "c": inputs["c"], "skip.0": h,
                **{k: t for k, t in inputs.items() if k.startswith("ctl.")}}

    def build_block(self, g: Any, w: Any, i: int, state: dict[str, Tensor]) -> dict[str, Tensor]:
        if not 0 <= i < self.n_blocks:
            raise IndexError(f"UNet stage {i} outside 0..{self.n_blocks - 1}")
        stage = self.stages[i]
        out = dict(state)
        h = state["h"]
        if stage.startswith("output_blocks."):
            left = [int(k[5:]) for k in state if k.startswith("skip.")]
            if not left:
                raise ModelLayoutError("output_blocks outnumber the skip connections")
            skip = out.pop(f"skip.{max(left)}")
            ctl = out.pop(f"ctl.{max(left)}", None)  # a ControlNet's residual for this skip
            h = g.concat(h, skip if ctl is None else g.add(skip, ctl), 1)
        h = _block(g, self._view(w).sub(stage), h, state["emb"], state["c"], self.cfg)
        if stage == "middle_block." and "ctl.mid" in out:
            h = g.add(h, out.pop("ctl.mid"))
        out["h"] = h
        if stage.startswith("input_blocks."):
            out[f"skip.{int(stage.split('.')[1])}"] = h
        return out

    def build_post(self, g: Any, w: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        return {"y": _out(g, self._view(w), state["h"])}
