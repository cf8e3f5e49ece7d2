"""Building ggml graphs from Python: the conventions and a few composite layers.

Every model graph (CLIP, T5, UNet, VAE, TAE, ESRGAN, Flux, ...) is written against
``sdplan._ggml.Graph``; this module documents its conventions and adds the layers that are
compositions of ops.

Conventions
-----------
* **Shapes are numpy order**, outermost first: an image batch is ``(N, C, H, W)``, a token
  sequence ``(B, T, D)``, a linear weight ``(out, in)``, a conv weight ``(OC, IC, KH, KW)``
  (the PyTorch layouts). The binding reverses them into ggml's ``ne`` order. At most 4
  dimensions.
* **dtypes by name**: ``"f32"``, ``"f16"``, ``"bf16"``, ``"i32"``, ``"q8_0"``, ``"q4_0"``,
  ``"q4_k"``, ... (ggml's type names in lower case). Inputs and outputs cross as numpy
  ``float32``/``float16``/``int32`` arrays.
* **Broadcasting** in ``add``/``sub``/``mul``/``div`` follows numpy's trailing alignment,
  restricted to ggml's rule: every dimension of the smaller operand divides the larger's
  (so ``(C, 1, 1)`` with ``(N, C, H, W)`` works). Mixed float dtypes compute in f32.
* ``mul_mat(a, b, bias=None)`` computes ``b @ a.T (+ bias)`` over the last two axes: ``a`` is
  ``(..., M, K)`` (a weight ``(out, in)``), ``b`` is ``(..., N, K)``; the result is
  ``(..., N, M)``; ``a``'s batch axes broadcast over ``b``'s.
* **bf16 on the CPU**: on CPU-only graphs where the CPU runs sdplan's bf16 kernel
  (``sdplan._ggml.bf16_kernel()``: ``amx`` or ``avx512``), a bf16 2-D ``a`` in ``mul_mat``,
  a bf16 kernel in ``conv_2d`` and every ``flash_attn`` run it (native/kernels): operands rounded
  to bf16, f32 sums. ``sdplan._ggml.set_bf16_kernel("off")`` turns it off for graphs built
  afterwards.
* **f32 FMA products on the CPU**: on CPU-only graphs where the CPU has AVX2, FMA and F16C
  (``sdplan._ggml.fma_gemm()``), an f16 2-D ``a`` in ``mul_mat`` with at least 32 rows of
  ``b``, f16/f32 kernels in ``conv_2d`` (method ``fma``, where ``winograd`` is not taken, from
  64 output pixels) and ``flash_attn`` (where the bf16 op does not run) use sdplan's own
  kernels (native/kernels/fma_*.cpp): every value widened to f32, f32 sums. ``sdplan._ggml.set_fma_gemm(False)`` hands them back to ggml.
* Ops never let ggml assert: bad shapes or dtypes raise ``ValueError`` naming the op and the
  shapes. Non-contiguous operands are made contiguous where an op needs it.
* A graph is built once per input shape (``g.input(...)``, ops, ``g.output(name, t)``), then
  reused: ``g.set_input(name, array)``, ``g.compute()``, ``g.get_output(name)``.
  ``g.reserve()`` measures the compute buffers per backend before weights are loaded
  (weights from a ``WeightStore`` with a ``plan``). ``g.cancel()`` from another thread
  stops a compute (``ComputeCancelled``) and leaves the graph reusable.
* **Devices**: ``Graph(backends)`` takes the backends in scheduler order, first = the main
  device (inputs and outputs), last = a CPU backend (the scheduler's fallback). Ops run where
  their weights live; ``with on(g, i):`` pins the ops created inside to backend ``i``
  (used for layer split), and ``g.checkpoint(t)`` marks a node where a cancel can stop
  backends without an abort callback (RPC).

Native op methods of ``Graph`` (all shapes numpy order): ``input(name, shape, dtype="f32")``,
``output(name, x)``, ``mul_mat(a, b, bias=None)``, ``add/sub/mul/div(a, b)``, ``scale(a, s, bias=0)``,
``unary(op, a)`` with op in gelu (tanh approximation), gelu_erf, gelu_quick, silu, relu,
sigmoid, tanh, exp, sqr, sqrt, abs, neg, sin, cos, log; ``geglu(x, approximate=False)``,
``leaky_relu(a, slope)``,
``clamp(a, min, max)``, ``norm(a, eps)`` and ``rms_norm(a, eps)`` over the last axis,
``group_norm(a, n_groups, eps, weight=None, bias=None, silu=False)`` over (C, H, W) groups (then
SiLU), ``soft_max(a, mask=None, scale=1,
max_bias=0)`` over the last axis of ``a*scale + mask``, ``flash_attn(q, k, v, mask=None,
scale=1)`` with q ``(B, H, Nq, D)``, k/v ``(B, Hkv, Nk, D)`` returning ``(B, Nq, H, Dv)``,
``conv_2d(w, x, stride=(1,1), padding=(0,0), dilation=(1,1), direct=False, method="auto", bias=None)``
(method: ``im2col``, ``cpu_im2col``, ``winograd``, ``direct``, ``bf16``, ``fma``; on CPU-only
graphs auto takes ``bf16`` for a bf16 kernel where the CPU runs a bf16 kernel (except
``winograd`` for the Winograd shape from 32 pixels wide where that kernel is AVX512_BF16 and
the Winograd path AVX-512: F(4x4,3x3) in f32 took 0.4-0.85x its time on a Zen 4), else
``winograd`` (F(2x2,3x3), from 32 pixels wide F(4x4,3x3), f32 arithmetic) for 3x3, stride 1,
padding 1, dilation 1 kernels with at least 16 output channels on outputs at least 32 pixels
wide when the CPU has AVX2 and FMA, else ``fma`` (sdplan's f32 FMA product; an f16 or f32
kernel on a CPU with AVX2, FMA and F16C, ``sdplan._ggml.fma_gemm()``, and at least 64 output
pixels, batch included), else ``cpu_im2col`` when the output has at least OC/2 pixels (batch
included); ``im2col`` otherwise. The rule is the plain function
``sdplan._ggml.choose_conv_method(method, *, kernel, image, out_channels, all_cpu, avx2_fma,
stride, padding, dilation, batch, bf16, in_channels, fma, wino_f4_first)``, pairs ``(H, W)``:
it returns the method ``conv_2d`` lowers with, or raises conv_2d's ``ValueError`` for a method
it refuses, without building a graph; ``sdplan._ggml.cpu_avx2_fma()`` is this CPU's ``avx2_fma``),
``conv_transpose_2d(w, x, stride)`` (w ``(IC, OC, KH, KW)``, no padding),
``upscale(a, factor)`` (nearest, last two axes), ``interpolate(a, shape, mode)``,
``pad(a, [(before, after), ...])`` (zeros), ``concat(a, b, axis)``, ``permute(a, axes)``
(like ``np.transpose``), ``transpose(a)`` (swap the last two axes, a view),
``reshape(a, shape)`` (one ``-1`` allowed), ``view(a, shape, strides=None, offset=0)``
(byte strides, numpy order), ``cont(a)``, ``cast(a, dtype)``, ``repeat(a, shape)``,
``get_rows(table, ids)`` (``(R, C)`` with i32 ``(N,)`` -> ``(N, C)``), ``rope(x, pos,
n_dims, mode=0, ...)`` with x ``(B, T, H, D)`` and i32 positions ``(T,)``,
``timestep_embedding(t, dim, max_period=10000)`` (``(N,)`` -> ``(N, dim)``),
``sum_rows(a)``, ``mean(a)``, ``supports(x, backend_index=0)``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from typing import Any

from sdplan.core.runtime.native import cpu_kernels, native

__all__ = [
    "new_graph", "on", "linear", "layer_norm", "group_norm", "attention", "conv2d",
    "conv_transpose2d", "pixel_shuffle", "prelu", "gelu", "geglu", "swiglu", "NUMPY_DTYPES",
    "AdaptedWeight", "sdplan_attention_op", "dit_flash", "checkpoint_blocks", "MAX_CHECKPOINTS",
]

#: Narrowest head width for which ``attention`` picks ggml's flash kernel by itself. Below it
#: the CPU kernel is far slower than the plain path (bench/bench_ops.py style timing, 1 thread,
#: q/k/v (2, 8, 1024, D): D=4 flash 0.88 s vs plain 0.25 s; D=8 0.061 vs 0.108 s; D=40
#: 0.130 vs 0.233 s).
FLASH_MIN_HEAD_DIM = 8

#: Widest head for which ``attention`` picks ggml's flash kernel by itself on a CPU main
#: backend (without sdplan's attention ops). Above it ggml's CPU kernel, one query row
#: at a time, is several times slower than the plain path (bench/bench_ops.py style timing,
#: 2 threads, q/k/v (1, 1, N, 512) as in the SD / SDXL VAE mid-block: N=1024 flash 0.236 s vs
#: plain 0.060 s; N=4096 5.78 vs 0.75 s). Head widths of 8..160 time within noise of each other.
FLASH_MAX_CPU_HEAD_DIM = 256

#: Largest f32 score matrix (bytes) the plain path builds at once when it stands in for the
#: flash kernel; longer queries run in chunks of rows, so memory stays near this bound.
PLAIN_CHUNK_BYTES = 64 << 20

#: numpy dtype names of the dtypes that cross the Python boundary.
NUMPY_DTYPES = {"f32": "float32", "f16": "float16", "i32": "int32"}

Tensor = Any  # sdplan._ggml.Tensor
Graph = Any  # sdplan._ggml.Graph


def new_graph(backends: Sequence[Any], max_nodes: int = 16384, n_threads: int = 0) -> Graph:
    """A new ``sdplan._ggml.Graph`` over ``backends`` (first = main device).

    A CPU backend is required last (the scheduler's fallback); when ``backends`` does not end
    with one, a fresh CPU backend is appended. ``max_nodes`` bounds the number of tensors the
    graph may create; ``n_threads`` > 0 sets the CPU thread count at each compute.
    Raises ValueError for an empty list.
    """
    bs = list(backends)
    if not bs:
        raise ValueError("new_graph: needs at least one backend")
    ng = native()
    if ng.device_type(bs[-1].device_name) != "cpu":
        bs.append(ng.init_backend("CPU"))
    return ng.Graph(bs, max_nodes=max_nodes, n_threads=n_threads)


#: Checkpoints a module's graph keeps at most (:func:`checkpoint_blocks`). Each ends a chunk of
#: the compute, and a chunk on an RPC device is one more graph-compute round trip: at one per
#: block the demo UNet's step on an RPC server behind a 1 ms link took 15 round trips; three
#: still let a cancel stop it within a quarter of a call.
MAX_CHECKPOINTS = 3


def checkpoint_blocks(n_blocks: int, limit: int = MAX_CHECKPOINTS) -> frozenset[int]:
    """The blocks (0-based) after which a graph of ``n_blocks`` blocks marks
    ``g.checkpoint``: at most ``limit``, spread evenly, never after the last block (the
    graph's end stops a compute anyway)."""
    k = max(0, min(limit, n_blocks - 1))
    return frozenset(round((j + 1) * n_blocks / (k + 1)) - 1 for j in range(k))


@contextlib.contextmanager
def on(g: Graph, index: int | None) -> Iterator[None]:
    """Pin the ops created inside the block to backend ``index`` of ``g`` (None: no pinning)."""
    old = g.scope
    g.scope = -1 if index is None else index
    try:
        yield
    finally:
        g.scope = old


class AdaptedWeight:
    """A weight with a low-rank patch beside it (LoRA applied at runtime,
    :mod:`sdplan.core.runtime.lora`): :func:`linear` and :func:`conv2d` compute the weight's
    own product and add ``up(down(x))`` and ``dense(x)``. ``down`` ``(R, in)`` / ``(R, in,
    kh, kw)``, ``up`` ``(out, R)`` / ``(out, R, 1, 1)`` (scale folded in), ``dense`` of the
    weight's shape; each may be None. ``shape``, ``dtype`` and other attributes are the
    weight's, so graph code that only reads them sees the plain weight."""

    __slots__ = ("base", "down", "up", "dense")

    def __init__(self, base: Tensor, down: Tensor | None = None, up: Tensor | None = None,
                 dense: Tensor | None = None) -> None:
        self.base, self.down, self.up, self.dense = base, down, up, dense

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)


def linear(g: Graph, x: Tensor, w: Tensor, b: Tensor | None = None) -> Tensor:
    """``x @ w.T + b``: x ``(..., in)``, w ``(out, in)``, b ``(out,)`` -> ``(..., out)``.

    A bf16 ``w`` on a CPU-only graph runs sdplan's bf16 kernel with the bias fused
    (``Graph.mul_mat``), an f16 one too where the graph has ``f16_as_bf16``; otherwise ggml's matrix product and an add. An
    :class:`AdaptedWeight` adds ``x @ (up @ down + dense).T`` as ``up(down(x))``."""
    if isinstance(w, AdaptedWeight):
        y = g.mul_mat(w.base, x)
        if w.down is not None and w.up is not None:
            y = g.add(y, g.mul_mat(w.up, g.mul_mat(w.down, x)))
        if w.dense is not None:
            y = g.add(y, g.mul_mat(w.dense, x))
        return g.add(y, b) if b is not None else y
    return g.mul_mat(w, x, bias=b) if b is not None else g.mul_mat(w, x)


def layer_norm(g: Graph, x: Tensor, w: Tensor | None, b: Tensor | None, eps: float = 1e-5) -> Tensor:
    """LayerNorm over the last axis: ``norm(x) * w + b`` (w, b ``(D,)``, either may be None);
    one fused op on CPU-only graphs (``Graph.layer_norm``)."""
    return g.layer_norm(x, eps, weight=w, bias=b)


def group_norm(g: Graph, x: Tensor, n_groups: int, w: Tensor | None, b: Tensor | None,
               eps: float = 1e-6, silu: bool = False) -> Tensor:
    """GroupNorm of ``(N, C, H, W)`` with per-channel affine ``w, b`` of shape ``(C,)`` (either
    may be None), then SiLU with ``silu`` (the UNets' and VAEs' norm-then-activation); one
    fused op on CPU-only graphs (``Graph.group_norm``): on a 2-core Zen 4 a 134 MB map's
    GroupNorm and SiLU took 44.9 ms as two ops, 16-25 ms as one."""
    return g.group_norm(x, n_groups, eps, weight=w, bias=b, silu=silu)


def attention(g: Graph, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
              scale: float | None = None, flash: bool | None = None) -> Tensor:
    """Scaled dot-product attention; q ``(B, H, Nq, D)``, k and v ``(B, H, Nk, D)``, mask
    ``(Nq, Nk)`` (added to the scores) -> ``(B, Nq, H*D)``.

    ``scale`` defaults to ``1/sqrt(D)``. ``flash=None`` uses ``flash_attn`` when the main
    backend supports it and the head width is at least :data:`FLASH_MIN_HEAD_DIM`, and on a
    CPU main backend running ggml's kernel at most :data:`FLASH_MAX_CPU_HEAD_DIM` (wider
    heads, the VAE mid-block's 512, take the plain path in query chunks of at most
    :data:`PLAIN_CHUNK_BYTES` of scores). True forces flash, False the plain softmax path.
    """
    b, h, nq, d = q.shape
    s = 1.0 / math.sqrt(d) if scale is None else scale
    chunked = False
    if flash is None and d < FLASH_MIN_HEAD_DIM:
        flash = False
    elif flash is None and d > FLASH_MAX_CPU_HEAD_DIM and _ggml_cpu_flash(g):
        flash, chunked = False, True
    if flash is False or not sdplan_attention_op(g):  # only sdplan's ops read strided heads fast
        q, k, v = (t if t.is_contiguous else g.cont(t) for t in (q, k, v))
    if flash is not False:
        fa = g.flash_attn(q, k, v, mask, s)
        if flash or g.supports(fa, 0):
            return g.reshape(fa, (b, nq, h * v.shape[-1]))
    vt = g.cont(g.transpose(v))  # (B, H, D, Nk)
    rows = max(1, PLAIN_CHUNK_BYTES // (4 * b * h * k.shape[2])) if chunked else nq
    if rows < nq:
        q = q if q.is_contiguous else g.cont(q)
        mask = mask if mask is None or mask.is_contiguous else g.cont(mask)
    parts = []
    for r0 in range(0, nq, rows):
        n = min(rows, nq - r0)
        qc, mc = q, mask
        if n < nq:
            qe = q.nbytes // (b * h * nq * d)
            qc = g.view(q, (b, h, n, d), (h * nq * d * qe, nq * d * qe, d * qe, qe), r0 * d * qe)
            if mask is not None:
                me = mask.nbytes // (mask.shape[0] * mask.shape[1])
                mc = g.view(mask, (n, mask.shape[1]), (mask.shape[1] * me, me), r0 * mask.shape[1] * me)
        p = g.soft_max(g.mul_mat(k, qc), mc, s)  # (B, H, n, Nk)
        parts.append(g.mul_mat(vt, p))  # (B, H, n, D)
    o = _concat_tree(g, parts, 2)
    o = g.cont(g.permute(o, (0, 2, 1, 3)))  # (B, Nq, H, D)
    return g.reshape(o, (b, nq, h * v.shape[-1]))


def _cpu_main(g: Graph) -> bool:
    """Whether ``g``'s main backend is a CPU (a CPU standing in for another device is not)."""
    return bool(g.main_cpu)


def sdplan_attention_op(g: Graph) -> bool:
    """Whether ``g.flash_attn`` runs one of sdplan's attention ops: a CPU main backend, and
    either the bf16 op (a bf16 kernel, and a bf16 product in the graph or ``g.bf16_attention``)
    or the f32 FMA op (``sdplan._ggml.fma_gemm()``). Both read q, k and v through their strides
    (rows contiguous), so heads need no copy."""
    k = cpu_kernels()
    bf16 = k.bf16 != "off" and bool(g.bf16_products or g.bf16_attention)
    return _cpu_main(g) and (bf16 or k.fma_gemm)


def dit_flash(g: Graph, asked: bool) -> bool:
    """Whether a DiT's attention in graph ``g`` runs as flash attention: always where one of
    sdplan's CPU attention ops runs it (:func:`sdplan_attention_op`,
    f32 softmax in key blocks; measured on a FLUX.1-dev block at 384 tokens with AMX: the plain
    path's f32 products, softmax and copies were a fifth of the call), else as asked
    (sd-cli's ``--diffusion-fa``: ggml's flash attention on other backends)."""
    return asked or sdplan_attention_op(g)


def _ggml_cpu_flash(g: Graph) -> bool:
    """Whether ``g.flash_attn`` would run ggml's CPU kernel: a CPU main backend and none of
    sdplan's attention ops."""
    return _cpu_main(g) and not sdplan_attention_op(g)


def _concat_tree(g: Graph, parts: list[Tensor], axis: int) -> Tensor:
    """``parts`` joined along ``axis`` pairwise (each value copied about log2(len) times)."""
    while len(parts) > 1:
        parts = [g.concat(parts[i], parts[i + 1], axis) if i + 1 < len(parts) else parts[i]
                 for i in range(0, len(parts), 2)]
    return parts[0]


def conv2d(g: Graph, x: Tensor, w: Tensor, b: Tensor | None = None, stride: int | tuple[int, int] = 1,
           padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1,
           direct: bool = False, method: str = "auto") -> Tensor:
    """Conv2d like ``torch.nn.functional.conv2d``: x ``(N, IC, H, W)``, w ``(OC, IC, KH, KW)``,
    b ``(OC,)``; ints mean the same value on both axes. ``method`` picks the convolution path
    of ``Graph.conv_2d`` (``auto``, ``im2col``, ``cpu_im2col``, ``winograd``, ``direct``); ``direct=True``
    means ``direct``. The bias is added by ``Graph.conv_2d`` (inside the Winograd op, a
    per-channel add otherwise). An :class:`AdaptedWeight` adds ``up(down(x))`` (``down``
    with the weight's stride, padding and dilation, ``up`` 1x1) and ``dense(x)``. Raises
    ValueError for mismatched shapes or an unknown method."""
    if isinstance(w, AdaptedWeight):
        y = conv2d(g, x, w.base, b, stride, padding, dilation, direct, method)
        if w.down is not None and w.up is not None:
            y = g.add(y, conv2d(g, conv2d(g, x, w.down, None, stride, padding, dilation), w.up))
        if w.dense is not None:
            y = g.add(y, conv2d(g, x, w.dense, None, stride, padding, dilation))
        return y
    args = (w, x, _pair(stride), _pair(padding), _pair(dilation), direct, method)
    return g.conv_2d(*args, bias=b) if b is not None else g.conv_2d(*args)


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def conv_transpose2d(g: Graph, x: Tensor, w: Tensor, b: Tensor | None = None, stride: int = 1,
                     padding: int = 0, output_padding: int = 0) -> Tensor:
    """ConvTranspose2d like torch: x ``(N, IC, H, W)``, w ``(IC, OC, KH, KW)``; output
    ``(N, OC, (H-1)*s - 2p + KH + op, ...)``: computed unpadded, then cropped by a view."""
    y = g.conv_transpose_2d(w, x, stride)
    if padding or output_padding:
        n, c, hh, ww = y.shape
        oh, ow = hh - 2 * padding + output_padding, ww - 2 * padding + output_padding
        if output_padding > padding:
            y = g.pad(y, [(0, 0), (0, 0), (0, output_padding - padding), (0, output_padding - padding)])
            n, c, hh, ww = y.shape
        es = 4
        y = g.cont(g.view(y, (n, c, oh, ow), (c * hh * ww * es, hh * ww * es, ww * es, es),
                          (padding * ww + padding) * es))
    if b is not None:
        y = g.add(y, g.reshape(b, (b.shape[0], 1, 1)))
    return y


def pixel_shuffle(g: Graph, x: Tensor, r: int) -> Tensor:
    """``torch.nn.functional.pixel_shuffle`` for ``(1, C*r*r, H, W)`` or ``(C*r*r, H, W)``
    -> ``(1, C, H*r, W*r)`` (batch 1: ggml tensors have at most 4 axes)."""
    shape = x.shape
    if len(shape) == 4 and shape[0] != 1:
        raise ValueError(f"pixel_shuffle: batch must be 1, got {shape}")
    crr, h, w = shape[-3:]
    if crr % (r * r):
        raise ValueError(f"pixel_shuffle: channels {crr} not divisible by {r}*{r}")
    c = crr // (r * r)
    y = g.reshape(x, (c * r, r, h, w))                 # (c,i), j, h, w
    y = g.cont(g.permute(y, (0, 2, 3, 1)))             # (c,i), h, w, j
    y = g.reshape(y, (c, r, h, w * r))                 # c, i, h, (w,j)
    y = g.cont(g.permute(y, (0, 2, 1, 3)))             # c, h, i, (w,j)
    return g.reshape(y, (1, c, h * r, w * r) if len(shape) == 4 else (c, h * r, w * r))


def prelu(g: Graph, x: Tensor, slope: Tensor) -> Tensor:
    """PReLU: ``relu(x) - slope * relu(-x)``; slope broadcasts like ``mul``."""
    return g.sub(g.unary("relu", x), g.mul(g.unary("relu", g.unary("neg", x)), slope))


def gelu(g: Graph, x: Tensor, approximate: bool = False) -> Tensor:
    """GELU: exact (erf) by default, the tanh approximation with ``approximate=True``."""
    return g.unary("gelu" if approximate else "gelu_erf", x)


def geglu(g: Graph, x: Tensor, approximate: bool = False) -> Tensor:
    """GEGLU in the diffusers order: ``hidden, gate`` = the two halves of the last axis of
    ``x`` (f32 or f16); returns ``hidden * gelu(gate)`` with shape ``(..., D/2)``
    (``Graph.geglu``: one op on CPU-only graphs)."""
    return g.geglu(x, approximate)


def swiglu(g: Graph, x: Tensor) -> Tensor:
    """SwiGLU with the gate first (FLUX.2's fused MLP input; diffusers ``Flux2SwiGLU``,
    stable-diffusion.cpp ``ggml_ext_silu_act``): ``gate, hidden`` = the two halves of the last
    axis of ``x`` (f32 or f16); returns ``silu(gate) * hidden`` with shape ``(..., D/2)``."""
    *lead, d2 = x.shape
    d = d2 // 2
    es = 4 if x.dtype == "f32" else 2
    strides: list[int] = []
    acc = d2 * es
    for n in reversed(lead):
        strides.insert(0, acc)
        acc *= n
    gate = g.view(x, (*lead, d), (*strides, es), 0)
    hidden = g.view(x, (*lead, d), (*strides, es), d * es)
    return g.mul(g.cont(hidden), g.unary("silu", g.cont(gate)))
