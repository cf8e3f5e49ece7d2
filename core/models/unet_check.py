"""The UNet's tensor shapes checked against each other and against the head rule, before any
graph is built.

A file whose header is self-consistent (every tensor's bytes where its shape says) can still
describe no UNet: a ResBlock whose convolution takes 72 channels after a block that gives 64,
an output block whose skip connection comes from another resolution, a SpatialTransformer
whose 64 channels do not split into the 3 heads asked for. The graph builder would stop on
such a file with ``concat: shapes differ`` or a reshape that does not fit, naming neither
the file nor the tensor; :func:`check_unet` follows the channels and the resolution level
through the UNet's stages (:func:`~sdplan.core.models.unet.unet_stages`) as the graph will,
and raises :class:`~sdplan.core.models.base.ModelLayoutError` naming the first tensor whose
shape does not fit, the shape it has and the shape it needs.

Shapes are numpy order: a convolution ``(C_out, C_in, k, k)``, a linear layer ``(out, in)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sdplan.core.models.base import ModelLayoutError, Weights

__all__ = ["check_unet", "check_heads"]


def _need(w: Weights, key: str, ok: bool, have: tuple[int, ...], want: str) -> None:
    if not ok:
        raise ModelLayoutError(f"tensor {w.prefix}{key} has shape {have}; the UNet needs {want}")


def check_heads(name: str, channels: int, num_heads: int | None, head_dim: int | None) -> int:
    """The heads of an attention ``channels`` wide under the head rule (``num_heads``, else
    ``channels // head_dim``).

    Raises:
        ModelLayoutError: a head count or width below 1, or ``channels`` that do not split
            into whole heads (naming the tensor ``name``).
    """
    if num_heads is not None and num_heads < 1:
        raise ModelLayoutError(f"a head count must be at least 1, got {num_heads}")
    if not num_heads and (head_dim is None or head_dim < 1):
        raise ModelLayoutError(f"a head width must be at least 1, got {head_dim}")
    heads = num_heads or max(1, channels // int(head_dim or 1))
    if channels % heads:
        raise ModelLayoutError(f"tensor {name}: {channels} channels do not split into {heads} "
                               f"heads of equal width")
    return heads


def _resblock(w: Weights, h: int, emb: int) -> int:
    norm = w.shape("in_layers.0.weight")
    _need(w, "in_layers.0.weight", norm == (h,), norm, f"({h},) after {h} channels")
    conv = w.shape("in_layers.2.weight")
    _need(w, "in_layers.2.weight", len(conv) == 4 and conv[1] == h, conv, f"(C, {h}, k, k)")
    out = conv[0]
    for key, want in (("emb_layers.1.weight", (out, emb)), ("out_layers.0.weight", (out,)),
                      ("out_layers.3.weight", (out, out, 3, 3))):
        have = w.shape(key)
        _need(w, key, have == want, have, str(want))
    if h != out or "skip_connection.weight" in w:
        have = w.shape("skip_connection.weight")
        _need(w, "skip_connection.weight", have[:2] == (out, h), have, f"({out}, {h}, ...)")
    return out


def _transformer(w: Weights, h: int, context: int, num_heads: int | None,
                 head_dim: int | None) -> None:
    norm = w.shape("norm.weight")
    _need(w, "norm.weight", norm == (h,), norm, f"({h},)")
    proj = w.shape("proj_in.weight")
    _need(w, "proj_in.weight", len(proj) in (2, 4) and proj[1] == h, proj, f"(C, {h}...)")
    inner = proj[0]
    check_heads(f"{w.prefix}proj_in.weight", inner, num_heads, head_dim)
    for k in w.indices("transformer_blocks."):
        b = w.sub(f"transformer_blocks.{k}.")
        for key, want in (("attn1.to_q.weight", (inner, inner)), ("attn1.to_k.weight", (inner, inner)),
                          ("attn1.to_v.weight", (inner, inner)), ("attn1.to_out.0.weight", (inner, inner)),
                          ("attn2.to_q.weight", (inner, inner)), ("attn2.to_k.weight", (inner, context)),
                          ("attn2.to_v.weight", (inner, context)), ("attn2.to_out.0.weight", (inner, inner)),
                          ("norm1.weight", (inner,)), ("norm2.weight", (inner,)), ("norm3.weight", (inner,))):
            have = b.shape(key)
            _need(b, key, have == want, have, str(want))
        ff = b.shape("ff.net.0.proj.weight")
        _need(b, "ff.net.0.proj.weight", len(ff) == 2 and ff[1] == inner and ff[0] % 2 == 0, ff,
              f"(2F, {inner})")
        have = b.shape("ff.net.2.weight")
        _need(b, "ff.net.2.weight", have == (inner, ff[0] // 2), have, str((inner, ff[0] // 2)))
    out = w.shape("proj_out.weight")
    _need(w, "proj_out.weight", len(out) in (2, 4) and out[:2] == (h, inner), out, f"({h}, {inner}...)")


def check_unet(weights: Mapping[str, Any], prefix: str, context: int, num_heads: int | None,
               head_dim: int | None, stages: Sequence[str]) -> None:
    """Follow channels and resolution through the UNet (module docstring).

    Args:
        weights: checkpoint name -> tensor or shape tuple.
        prefix: the UNet's name prefix (``model.diffusion_model.`` or none).
        context: the cross-attention context width (0: none).
        num_heads, head_dim: the head rule (one of them set).
        stages: the UNet's stages in execution order
            (:func:`~sdplan.core.models.unet.unet_stages`).

    Raises:
        ModelLayoutError: naming the first tensor whose shape does not fit.
    """
    w = Weights(weights, prefix)
    stem = w.shape("input_blocks.0.0.weight")
    h = stem[0]
    emb = w.shape("time_embed.2.weight")[0]
    level = 0
    skips = [(h, level, "input_blocks.0")]
    for stage in stages:
        if stage.startswith("output_blocks."):
            if not skips:
                raise ModelLayoutError(f"{prefix}{stage[:-1]}: the output blocks outnumber the "
                                       "input blocks' skip connections")
            c, at, source = skips.pop()
            if at != level:
                raise ModelLayoutError(f"{prefix}{stage[:-1]} joins the skip connection of "
                                       f"{prefix}{source} from another resolution (the up- and "
                                       "downsampling layers do not match)")
            h += c
        s = w.sub(stage)
        for m in s.indices(""):
            b = s.sub(f"{m}.")
            if "in_layers.0.weight" in b:
                h = _resblock(b, h, emb)
            elif "proj_in.weight" in b:
                _transformer(b, h, context, num_heads, head_dim)
            elif "op.weight" in b or "conv.weight" in b:
                key = "op.weight" if "op.weight" in b else "conv.weight"
                have = b.shape(key)
                _need(b, key, len(have) == 4 and have[:2] == (h, h), have, f"({h}, {h}, 3, 3)")
                level += 1 if key == "op.weight" else -1
        if stage.startswith("input_blocks."):
            skips.append((h, level, stage[:-1]))
    have = w.shape("out.2.weight")
    _need(w, "out.2.weight", len(have) == 4 and have[1] == h, have, f"(C, {h}, 3, 3)")
