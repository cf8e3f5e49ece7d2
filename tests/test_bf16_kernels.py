"""sdplan's CPU kernels behind mul_mat, conv_2d, flash_attn, gelu_erf and geglu against float64
numpy references, on every path this CPU runs: the bf16 kernel with AMX tiles, with
AVX512_BF16 dot products, and ``off`` (ggml's own ops; what a CPU without either runs), chosen
with ``set_bf16_kernel``; GELU/GEGLU with the AVX-512 erf, the AVX2 one and the scalar one
(``set_glu_simd``). Paths the CPU cannot run are skipped.

Tolerances (stated, not tuned to pass):

* products with a bf16 weight: the kernel rounds the activations to bf16 (nearest even) and
  sums in f32, so against the float64 product of the *rounded* operands the error is only f32
  summation: ``<= 1e-5 * sum|x||w|`` (``ABS_SUM_RTOL``); against the unrounded f32 operands
  (the numerical effect of bf16 on a layer) ``<= 2**-7 * sum|x||w|`` (two roundings of at
  most 2**-9 each, plus margin);
* attention (q, k and the probabilities in bf16; ggml's ``off`` path holds k and v in f16):
  ``<= 2e-2 * max|v|`` against float64;
* GELU/GEGLU: ``<= 2e-6`` absolute plus ``2e-6`` relative against float64 (the vectorized
  erf form computes erfc with a relative bound of 1.2e-7 and exp within 2e-7, in 16 or 8
  lanes alike: within 1.3e-6 relative to the value even in the negative tail, where the C
  library's ``1 + erff`` loses most digits).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
from sdplan.core.errors import InvalidArgument  # noqa: E402
from sdplan.core.runtime import graph as gr  # noqa: E402

ORDER = ["off", "avx512", "amx"]
CPU_KERNEL = G.bf16_cpu_kernel()
ABS_SUM_RTOL = 1e-5
BF16_RTOL = 2.0 ** -7


def _runnable(name: str) -> bool:
    return ORDER.index(name) <= ORDER.index(CPU_KERNEL)


@pytest.fixture(scope="module")
def mgr():
    m = G.BackendManager(2)
    yield m
    m.close()


@pytest.fixture(params=ORDER)
def kernel(request):
    yield from kernel_path(request.param)


def kernel_path(name: str):
    """Fixture body: use the bf16 kernel ``name`` (skip when this CPU cannot run it), then auto."""
    if not _runnable(name):
        pytest.skip(f"this CPU runs the bf16 kernel {CPU_KERNEL!r}, not {name!r}")
    before = G.bf16_kernel()
    G.set_bf16_kernel(name)
    assert G.bf16_kernel() == name
    yield name
    G.set_bf16_kernel(before)


def bf16(a: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 (nearest, ties to even), returned as float32."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32)


def _check_product(y, x, w, b, ref_fn) -> None:
    """y against ref_fn(x, w) (+ b) in float64: with the operands rounded (summation error
    only) and unrounded (bf16's effect)."""
    exact = ref_fn(bf16(x).astype(np.float64), w.astype(np.float64))
    plain = ref_fn(x.astype(np.float64), w.astype(np.float64))
    scale = ref_fn(np.abs(bf16(x)).astype(np.float64), np.abs(w).astype(np.float64))
    if b is not None:
        exact, plain = exact + b, plain + b
    assert y.shape == exact.shape
    err = np.abs(y - exact)
    assert np.all(err <= ABS_SUM_RTOL * scale + 1e-6), float(np.max(err - ABS_SUM_RTOL * scale))
    assert np.all(np.abs(y - plain) <= BF16_RTOL * scale + 1e-6)


def run_linear(mgr, x, w, b, threads):
    g = gr.new_graph([mgr.get("CPU")], n_threads=threads)
    xi, wi = g.input("x", x.shape), g.input("w", w.shape)
    bi = g.input("b", b.shape) if b is not None else None
    g.output("y", gr.linear(g, xi, g.cast(wi, "bf16"), bi))
    g.set_input("x", x)
    g.set_input("w", w)
    if b is not None:
        g.set_input("b", b)
    ops = _ops(g.profile())
    return np.array(g.get_output("y")), ops


def _ops(rows) -> list[str]:
    """Profile rows as op names; the bf16 kernel's op (a custom op reading bf16) as BF16."""
    return ["BF16" if r[0] == "CUSTOM" and "bf16" in r[3].split(",") else r[0] for r in rows]


@pytest.mark.parametrize("shape,n,threads", [
    ((5, 40), 24, 1),          # few rows: column blocks; K past a 32 step; N past a 16 group
    ((3, 7, 64), 48, 2),       # batched x; threads split the rows of W
    ((130, 96), 640, 2),       # fewer than 128 rows per thread: column blocks, row split
    ((300, 320), 77, 1),       # >= 128 rows per thread: x's rows as A, N odd
    ((2, 260, 72), 130, 2),    # rows path with 2 threads, N not a multiple of 16
    ((9, 33), 20, 1),          # odd depth: ggml's own product (the kernel needs an even K)
    ((200, 4096), 300, 2),     # W over 2 MB: wide column blocks, K outermost
])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_bf16_matches_reference(mgr, kernel, shape, n, threads, with_bias) -> None:
    rng = np.random.default_rng(shape[-1] * 7 + n)
    x = rng.standard_normal(shape).astype(np.float32)
    w = bf16((rng.standard_normal((n, shape[-1])) * 0.3).astype(np.float32))
    b = rng.standard_normal(n).astype(np.float32) if with_bias else None
    y, ops = run_linear(mgr, x, w, b, threads)
    _check_product(y, x, w, b, lambda xx, ww: xx @ ww.T)
    uses_kernel = kernel != "off" and shape[-1] % 2 == 0
    assert ("BF16" in ops) == uses_kernel, ops


def conv_ref(x: np.ndarray, w: np.ndarray, stride: int, pad: int, dil: int) -> np.ndarray:
    """Cross-correlation in the input's dtype: x (N, IC, H, W), w (OC, IC, KH, KW)."""
    n, _, h, wd = x.shape
    oc, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, oc, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i * dil:i * dil + stride * (oh - 1) + 1:stride, j * dil:j * dil + stride * (ow - 1) + 1:stride]
            out += np.einsum("nchw,oc->nohw", win, w[:, :, i, j])
    return out


@pytest.mark.parametrize("xs,oc,k,stride,pad,dil,threads", [
    ((1, 4, 10, 31), 20, 3, 1, 1, 1, 1),   # 3x3 padding 1: contiguous groups and edge gathers (from
                                           # 32 pixels wide Winograd F(4x4) may come first)
    ((2, 8, 9, 9), 17, 1, 1, 0, 1, 2),     # 1x1, batch 2 (columns across images), OC odd
    ((1, 6, 15, 16), 32, 3, 2, 1, 1, 2),   # stride 2: gathered columns
    ((1, 10, 12, 19), 40, 3, 1, 2, 2, 1),  # dilation 2
    ((1, 2, 1, 2), 16, 3, 1, 1, 1, 1),     # one row, mostly padding
    ((2, 64, 16, 16), 48, 3, 1, 1, 1, 2),  # a UNet-like block: K = 576, several panels
    ((1, 3, 8, 8), 16, 3, 1, 1, 1, 1),     # odd depth (27): another conv method
    # W over 2 MB: wide column blocks with K outermost in chunks (the last one short), a K
    # tail (3474 = 108 * 32 + 18), a partial row group, threads splitting the rows
    ((2, 386, 9, 13), 330, 3, 1, 1, 1, 2),
    ((2, 400, 12, 12), 300, 3, 1, 1, 1, 1),  # two wide blocks, the second partial
])
@pytest.mark.parametrize("with_bias", [True, False])
def test_conv_bf16_matches_reference(mgr, kernel, xs, oc, k, stride, pad, dil, threads, with_bias) -> None:
    rng = np.random.default_rng(xs[1] * 13 + oc + k)
    x = rng.standard_normal(xs).astype(np.float32)
    w = bf16((rng.standard_normal((oc, xs[1], k, k)) * 0.2).astype(np.float32))
    b = rng.standard_normal(oc).astype(np.float32) if with_bias else None
    g = gr.new_graph([mgr.get("CPU")], n_threads=threads)
    xi, wi = g.input("x", x.shape), g.input("w", w.shape)
    bi = g.input("b", (oc,)) if b is not None else None
    g.output("y", gr.conv2d(g, xi, g.cast(wi, "bf16"), bi, stride=stride, padding=pad, dilation=dil))
    g.set_input("x", x)
    g.set_input("w", w)
    if b is not None:
        g.set_input("b", b)
    ops = _ops(g.profile())
    y = np.array(g.get_output("y"))
    uses_kernel = kernel != "off" and xs[1] * k * k % 2 == 0
    assert ("BF16" in ops) == uses_kernel, ops
    bb = None if b is None else b[None, :, None, None]
    if uses_kernel:
        _check_product(y, x, w, bb, lambda xx, ww: conv_ref(xx, ww, stride, pad, dil))
    else:  # the f32 kernel's methods (Winograd, im2col): f32 accuracy against the bf16 weight
        ref = conv_ref(x.astype(np.float64), w.astype(np.float64), stride, pad, dil)
        scale = conv_ref(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64), stride, pad, dil)
        ref = ref + (0 if bb is None else bb)
        assert np.all(np.abs(y - ref) <= 1e-3 * scale + 1e-5)


def test_conv_auto_takes_bf16_only_with_the_kernel(kernel) -> None:
    on = kernel != "off"
    args = dict(kernel=(3, 3), image=(32, 32), out_channels=320, all_cpu=True, avx2_fma=True, padding=(1, 1))
    got = G.choose_conv_method("auto", bf16=on, in_channels=320, **args)
    assert got == ("bf16" if on else "winograd")
    assert G.choose_conv_method("auto", bf16=on, in_channels=3, **args) == "winograd"  # odd depth 27
    assert G.choose_conv_method("auto", bf16=False, in_channels=320, **args) == "winograd"


def _conv_auto(mgr, x, w, method="auto"):
    """(output, op names) of a 3x3 convolution (padding 1) of x with the bf16 weight ``w``."""
    g = gr.new_graph([mgr.get("CPU")], n_threads=2)
    xi, wi = g.input("x", x.shape), g.input("w", w.shape)
    g.output("y", gr.conv2d(g, xi, g.cast(wi, "bf16"), padding=1, method=method))
    g.set_input("x", x)
    g.set_input("w", w)
    ops = _ops(g.profile())
    return np.array(g.get_output("y")), ops


@pytest.mark.parametrize("wino_avx512", [True, False])
def test_conv_auto_takes_winograd_f4_before_the_avx512_bf16_kernel(mgr, kernel, wino_avx512) -> None:
    """From 32 pixels wide (F(4x4, 3x3)) the Winograd convolution's AVX-512 build outruns the
    AVX512_BF16 product, not AMX: auto takes winograd there for a bf16 kernel when the bf16
    kernel is avx512 and the Winograd path avx512, bf16 at 31 pixels; the graph does what the
    chooser says (the same output as the method named)."""
    if not wino_avx512 and G.wino_kernel() != "avx512":
        pytest.skip("the Winograd convolution has no AVX-512 path to turn off on this CPU")
    G.set_wino_avx512(wino_avx512)
    try:
        f4_first = kernel == "avx512" and G.wino_kernel() == "avx512"
        rng = np.random.default_rng(64)
        w = bf16((rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32))
        for width in (32, 31):
            want = G.choose_conv_method("auto", kernel=(3, 3), image=(5, width), out_channels=16, all_cpu=True,
                                        avx2_fma=G.cpu_avx2_fma(), padding=(1, 1), bf16=kernel != "off",
                                        in_channels=8, wino_f4_first=f4_first)
            if kernel == "off":  # the f32 kernel's rule: winograd from 32 pixels wide on AVX2/FMA CPUs
                assert (want == "winograd") == (width == 32 and G.cpu_avx2_fma()), (width, want)
            else:
                assert want == ("winograd" if f4_first and width == 32 else "bf16"), (width, want)
            x = rng.standard_normal((1, 8, 5, width)).astype(np.float32)
            auto, ops = _conv_auto(mgr, x, w)
            named, named_ops = _conv_auto(mgr, x, w, want)
            assert ops == named_ops
            assert ("BF16" in ops) == (want == "bf16"), ops
            np.testing.assert_array_equal(auto, named)
    finally:
        G.set_wino_avx512(True)


def _f16_as_bf16_pair(mgr, kind, x, w, b, threads, conv_args=None):
    """The product of x and the f16 weight ``w``: once with ``g.f16_as_bf16`` (the kernel rounds
    the f16 values as it uses them), once with the same weight converted to bf16 in the graph
    (a bf16 source: the kernel's op shows in the profile); returns both outputs and the second
    graph's op names."""
    outs, ops = [], []
    for in_kernel in (True, False):
        g = gr.new_graph([mgr.get("CPU")], n_threads=threads)
        g.f16_as_bf16 = in_kernel
        xi, wi = g.input("x", x.shape), g.input("w", w.shape, "f16")
        bi = g.input("b", b.shape) if b is not None else None
        wt = wi if in_kernel else g.cast(wi, "bf16")
        y = gr.linear(g, xi, wt, bi) if kind == "linear" else gr.conv2d(g, xi, wt, bi, **conv_args)
        g.output("y", y)
        g.set_input("x", x)
        g.set_input("w", w)
        if b is not None:
            g.set_input("b", b)
        ops = _ops(g.profile())
        outs.append(np.array(g.get_output("y")))
    return outs[0], outs[1], ops


@pytest.mark.parametrize("case", [
    ("linear", (5, 40), 24, 1),        # column blocks, a K tail, a partial row group
    ("linear", (130, 96), 640, 2),     # row split
    ("linear", (300, 320), 77, 1),     # x's rows as A: W packed per panel
    ("linear", (200, 4096), 300, 2),   # W over 2 MB: wide blocks, f16 rows converted per chunk
    ("linear", (5, 1024), 2048, 1),    # one narrow block, rows past half an L2: converted per 32 rows
    ("conv", (2, 64, 16, 16), 48, 2),
    ("conv", (2, 386, 9, 13), 330, 2),  # wide, K tail (3474), partial row group, row split
    ("conv", (2, 400, 12, 12), 300, 1),
])
def test_f16_weights_in_the_kernel_match_bf16_weights(mgr, kernel, case) -> None:
    """f16 weights rounded to bf16 inside the kernel (weights left in the file's dtype) give
    the same bits as weights converted to bf16 before (the load's conversion: both round to
    nearest even), on every path of the kernel (bitwise: neither the FMA product nor ggml's gives
    these bits, so the first graph ran the kernel); without a kernel (``off``) the f16 weights
    keep their products (the FMA kernel's f32, ggml's with x in f16), closer to the exact
    product than bf16's."""
    kind, xs, n, threads = case
    rng = np.random.default_rng(n + xs[1])
    x = rng.standard_normal(xs).astype(np.float32)
    wshape = (n, xs[-1]) if kind == "linear" else (n, xs[1], 3, 3)
    # f16 values with more than bf16's 8 significant bits, ties and subnormals among them
    w = (rng.standard_normal(wshape) * 0.2).astype(np.float16)
    w.flat[:4] = np.array([1.00390625, 1.01171875, 3e-6, -6.1e-5], np.float16)  # ties to even, subnormal
    b = rng.standard_normal(n).astype(np.float32)
    y, y_cast, ops = _f16_as_bf16_pair(mgr, kind, x, w, b, threads, dict(stride=1, padding=1, dilation=1))
    ref = (lambda xx, ww: xx @ ww.T) if kind == "linear" else (lambda xx, ww: conv_ref(xx, ww, 1, 1, 1))
    bb = b if kind == "linear" else b[None, :, None, None]
    if kernel != "off":
        assert "BF16" in ops, ops
        np.testing.assert_array_equal(y, y_cast)
        _check_product(y, x, bf16(w.astype(np.float32)), bb, ref)
    else:
        exact = ref(x.astype(np.float64), w.astype(np.float64)) + bb
        scale = ref(np.abs(x).astype(np.float64), np.abs(w).astype(np.float64))
        # ggml's f16 product (fewer than 32 rows) rounds x to f16: 2**-11 relative per element
        assert np.all(np.abs(y - exact) <= 2.0 ** -10 * scale + 1e-5)


def attention_ref(q, k, v, mask, scale):
    hq, hk = q.shape[1], k.shape[1]
    k = np.repeat(k, hq // hk, axis=1).astype(np.float64)
    v = np.repeat(v, hq // hk, axis=1).astype(np.float64)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) * scale
    if mask is not None:
        s = s + mask
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bhkd->bhqd", p, v)
    b, h, nq, d = o.shape
    return o.transpose(0, 2, 1, 3).reshape(b, nq, h * d)


@pytest.mark.parametrize("b,hq,hk,nq,nk,d,masked,threads", [
    (2, 2, 2, 50, 50, 40, False, 2),    # SD 1.5's head width (not a multiple of 32), self-attention
    (1, 4, 4, 64, 77, 64, False, 1),    # cross-attention to 77 tokens
    (1, 4, 2, 33, 20, 128, True, 2),    # grouped heads, a mask, odd lengths
    (1, 1, 1, 100, 37, 80, True, 2),    # one pair: threads split the query rows
    (1, 1, 1, 70, 50, 24, False, 1),    # one k step of 32 (head width up to 32)
    # more keys than a key block (256) and queries than a pass over the keys (128), both with
    # tails: the online softmax across blocks, with rows that see only the first or the last
    (1, 2, 2, 300, 600, 40, "blocks", 2),
    (2, 1, 1, 160, 520, 64, "blocks", 1),
])
def test_flash_attn_matches_reference(mgr, kernel, b, hq, hk, nq, nk, d, masked, threads) -> None:
    rng = np.random.default_rng(nq * 3 + nk + d)
    q = rng.standard_normal((b, hq, nq, d)).astype(np.float32)
    k = rng.standard_normal((b, hk, nk, d)).astype(np.float32)
    v = rng.standard_normal((b, hk, nk, d)).astype(np.float32)
    mask = None
    if masked == "blocks":
        mask = np.zeros((nq, nk), np.float32)
        mask[0::2, :512] = -np.inf  # even rows see only keys 512.. (the last, partial block)
        mask[1::4, 256:] = -np.inf  # every fourth row sees only the first block
    elif masked:
        mask = np.where(rng.random((nq, nk)) < 0.2, -np.inf, 0.0).astype(np.float32)
        mask[:, 0] = 0.0  # every row keeps a key
    scale = 1.0 / math.sqrt(d)
    g = gr.new_graph([mgr.get("CPU")], n_threads=threads)
    g.bf16_attention = True  # without a bf16 product before it, only when asked
    qi, ki, vi = g.input("q", q.shape), g.input("k", k.shape), g.input("v", v.shape)
    mi = g.input("m", mask.shape) if mask is not None else None
    g.output("o", gr.attention(g, qi, ki, vi, mi, scale, flash=True))
    for name, arr in (("q", q), ("k", k), ("v", v), ("m", mask)):
        if arr is not None:
            g.set_input(name, arr)
    ops = [r[0] for r in g.profile()]
    o = np.array(g.get_output("o"))
    # sdplan's own op on every path: bf16 products, or f32 ones by the FMA product (off, on a
    # CPU with AVX2, FMA and F16C); ggml's flash attention only without either
    assert ("CUSTOM" in ops) == (kernel != "off" or G.fma_gemm()), ops
    ref = attention_ref(q, k, v, mask, scale)
    assert o.shape == ref.shape
    err = float(np.max(np.abs(o - ref)))
    assert err <= 2e-2 * float(np.max(np.abs(v))), err


@pytest.mark.parametrize("nk", [64, 256, 270, 512])
def test_flash_attn_same_with_and_without_a_zero_mask(mgr, kernel, nk) -> None:
    """A NaN or infinite key gives the same outputs with no mask as with an all-zero mask (the
    softmax clamps the scores either way), so the same data does not turn NaN or not by
    whether a mask is passed."""
    if kernel == "off":
        pytest.skip("the bf16 attention op only")
    rng = np.random.default_rng(nk)
    q = rng.standard_normal((1, 2, 40, 40)).astype(np.float32)
    k = rng.standard_normal((1, 2, nk, 40)).astype(np.float32)
    v = rng.standard_normal((1, 2, nk, 40)).astype(np.float32)
    k[0, 0, 7, 5] = np.nan
    k[0, 1, 3, 2] = np.inf
    outs = []
    for mask in (None, np.zeros((40, nk), np.float32)):
        g = gr.new_graph([mgr.get("CPU")], n_threads=2)
        g.bf16_attention = True
        qi, ki, vi = g.input("q", q.shape), g.input("k", k.shape), g.input("v", v.shape)
        mi = g.input("m", mask.shape) if mask is not None else None
        g.output("o", g.flash_attn(qi, ki, vi, mi, scale=1.0 / math.sqrt(40)))
        for name, arr in (("q", q), ("k", k), ("v", v), ("m", mask)):
            if arr is not None:
                g.set_input(name, arr)
        g.compute()
        outs.append(np.array(g.get_output("o")))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("with_product", [False, True])
def test_attention_follows_the_graphs_products(mgr, kernel, with_product) -> None:
    """flash_attn runs the bf16 attention op only once the graph has a bf16 product (weights held
    in bf16); an f32 model keeps f32 attention and its precision (the FMA attention op where
    the CPU runs it, else ggml's flash attention)."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 2, 20, 64)).astype(np.float32)
    w = bf16(rng.standard_normal((64, 64)).astype(np.float32) * 0.1)
    g = gr.new_graph([mgr.get("CPU")], n_threads=1)
    qi, wi = g.input("q", q.shape), g.input("w", w.shape)
    qq = gr.linear(g, qi, g.cast(wi, "bf16") if with_product else wi)
    g.output("o", gr.attention(g, qq, qq, qq, flash=True))
    g.set_input("q", q)
    g.set_input("w", w)
    ops = _ops(g.profile())
    on = kernel != "off" and with_product
    assert g.bf16_products is on
    assert ("CUSTOM" in ops) is (on or G.fma_gemm()) and ("FLASH_ATTN_EXT" in ops) is not (on or G.fma_gemm()), ops
    # the f32 op keeps f32 precision: the same values as without sdplan's kernels, within ggml's
    # f16 keys and values
    if not with_product:  # (a bf16 weight with the kernel off is ggml's bf16 product: x in bf16)
        o = np.array(g.get_output("o"))
        s = (q @ w.T) @ (q @ w.T).transpose(0, 1, 3, 2) / 8.0
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = ((p / p.sum(-1, keepdims=True)) @ (q @ w.T)).transpose(0, 2, 1, 3).reshape(o.shape)
        tol = 1e-5 if G.fma_gemm() else 5e-3
        assert np.abs(o - ref).max() <= tol * np.abs(ref).max()


def _gelu_ref(x: np.ndarray, approximate: bool) -> np.ndarray:
    """GELU in float64; the erf form as x erfc(-x / sqrt 2) / 2 (1 + erf cancels for negative x,
    in float64 too)."""
    x = x.astype(np.float64)
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * np.vectorize(math.erfc)(-x / math.sqrt(2))


def _cpu_glu_versions() -> set[str]:
    """The GELU/GEGLU versions this CPU runs: 'avx512' and/or 'avx2' (AVX2 with FMA)."""
    have = set()
    try:
        G.set_glu_simd(True, True)
        have.add(G.glu_simd_name())
        G.set_glu_simd(True, False)
        have.add(G.glu_simd_name())
    finally:
        G.set_glu_simd(True)
    return have - {"off"}


@pytest.fixture(params=["avx512", "avx2", "scalar"])
def glu_simd(request):
    """Each GELU/GEGLU version in turn (True for the vectorized ones): AVX-512, AVX2 with FMA
    (also on an AVX-512 CPU, where it is forced), the C library's erff/expf."""
    if request.param != "scalar" and request.param not in _cpu_glu_versions():
        pytest.skip(f"this CPU does not run the {request.param} GELU/GEGLU")
    G.set_glu_simd(request.param != "scalar", request.param == "avx512")
    assert G.glu_simd_name() == {"scalar": "off"}.get(request.param, request.param)
    yield request.param != "scalar"
    G.set_glu_simd(True)


def _gelu_input(rng, shape) -> np.ndarray:
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    flat = x.reshape(-1)
    flat[:8] = [0.0, -0.0, 10.0, -10.0, 30.0, -30.0, 1e-8, -5.5]  # zero, saturation, tiny
    return x


@pytest.mark.parametrize("shape", [(3, 37), (2, 5, 64), (1, 4100)])
@pytest.mark.parametrize("approximate", [False, True], ids=["erf", "tanh"])
def test_gelu_matches_reference(mgr, glu_simd, shape, approximate) -> None:
    """Both GELUs: sdplan's vectorized op (AVX-512 or AVX2) within 2e-6 of float64; without it
    ggml's op, whose tanh form rounds x to f16 for a table on the CPU (held to 2e-3 here, and
    shown to miss 2e-6)."""
    x = _gelu_input(np.random.default_rng(shape[-1]), shape)
    g = gr.new_graph([mgr.get("CPU")], n_threads=2)
    g.output("y", gr.gelu(g, g.input("x", shape), approximate))
    g.set_input("x", x)
    ops = [r[0] for r in g.profile()]
    y = np.array(g.get_output("y"))
    assert ("CUSTOM" in ops) == glu_simd, ops
    ref = _gelu_ref(x, approximate)
    err = np.abs(y - ref) / (1 + np.abs(ref))
    if glu_simd or not approximate:
        assert np.all(np.abs(y - ref) <= 2e-6 + 2e-6 * np.abs(ref)), float(np.max(np.abs(y - ref)))
    else:
        assert 2e-6 < err.max() <= 2e-3, float(err.max())


@pytest.mark.parametrize("approximate", [False, True], ids=["erf", "tanh"])
def test_gelu_far_inputs(mgr, glu_simd, approximate) -> None:
    """Inputs where x^3 or z^2 overflow f32 and exp is clamped: x itself far above zero, 0 (within
    2e-6) far below, in every lane of a vector and in the masked tail (11 values)."""
    if not glu_simd:
        pytest.skip("the scalar path is the C library's")
    vals = np.array([1e30, -1e30, 3e38, -3e38, 1e6, -1e6, 200.0, -200.0, 88.0, -88.0, -104.0], np.float32)
    g = gr.new_graph([mgr.get("CPU")], n_threads=1)
    g.output("y", gr.gelu(g, g.input("x", (1, len(vals))), approximate))
    g.set_input("x", vals[None])
    g.compute()
    y = np.array(g.get_output("y"))[0].astype(np.float64)
    want = np.where(vals > 0, vals, 0.0).astype(np.float64)
    assert np.all(np.abs(y - want) <= 2e-6 + 2e-6 * np.abs(want)), (y, want)


def test_gelu_erf_negative_tail_is_accurate_relative_to_itself(mgr, glu_simd) -> None:
    """x Phi(x) for x in [-7, 0], where 1 + erf(x / sqrt 2) cancels: the vectorized op within
    2e-6 of float64 *relative to the value* wherever it is above 1e-12 (it computes erfc with a
    relative bound; measured 1.3e-6 at most); the C library's erff path (1 + erf) is shown to
    miss that by far."""
    x = np.linspace(-7.0, 0.0, 7001, dtype=np.float32)[None]
    g = gr.new_graph([mgr.get("CPU")], n_threads=2)
    g.output("y", gr.gelu(g, g.input("x", x.shape), False))
    g.set_input("x", x)
    g.compute()
    y = np.array(g.get_output("y")).astype(np.float64)
    ref = _gelu_ref(x, False)
    big = np.abs(ref) > 1e-12
    rel = float(np.max(np.abs(y - ref)[big] / np.abs(ref)[big]))
    assert (rel <= 2e-6) == glu_simd, rel


@pytest.mark.parametrize("approximate", [False, True], ids=["erf", "tanh"])
def test_geglu_with_large_hidden_values(mgr, glu_simd, approximate) -> None:
    """GEGLU multiplies the GELU's error by the hidden value: with hidden values of 30 and gates
    across [-6, 6] the product stays within 2e-6 + 2e-6 |ref| of float64 on the vectorized paths
    (an absolute bound on erf alone would not: 1 + erf cancels for negative gates)."""
    if not glu_simd:
        pytest.skip("the scalar path is the C library's (1 + erff: outside this bound)")
    gate = np.linspace(-6.0, 6.0, 1201, dtype=np.float32)
    x = np.concatenate([np.full_like(gate, 30.0), gate])[None].astype(np.float32)
    g = gr.new_graph([mgr.get("CPU")], n_threads=2)
    g.output("y", gr.geglu(g, g.input("x", x.shape), approximate))
    g.set_input("x", x)
    g.compute()
    y = np.array(g.get_output("y"))[0].astype(np.float64)
    ref = 30.0 * _gelu_ref(gate, approximate)
    err = np.abs(y - ref) - (2e-6 + 2e-6 * np.abs(ref))
    assert np.all(err <= 0), float(np.max(err))


@pytest.mark.parametrize("shape", [(3, 37), (2, 5, 64), (1, 77, 3072)])
@pytest.mark.parametrize("fma", [True, False], ids=["sdplan", "ggml"])
def test_gelu_quick_matches_reference(mgr, shape, fma) -> None:
    """Quick GELU (CLIP ViT-L's activation): sdplan's f32 op within 1e-6 relative (plus 1e-7
    absolute) of float64; ggml's (x rounded to f16 for a table) only within 3e-3, which the
    first bound refuses."""
    if fma and not G.fma_gemm():
        pytest.skip("this CPU does not run sdplan's FMA kernels")
    x = _gelu_input(np.random.default_rng(shape[-1] + 7), shape)
    G.set_fma_gemm(fma)
    try:
        g = gr.new_graph([mgr.get("CPU")], n_threads=2)
        g.output("y", g.unary("gelu_quick", g.input("x", shape)))
    finally:
        G.set_fma_gemm(True)
    g.set_input("x", x)
    ops = [r[0] for r in g.profile()]
    y = np.array(g.get_output("y")).astype(np.float64)
    assert ("CUSTOM" in ops) == fma, ops
    x64 = x.astype(np.float64)
    ref = x64 / (1 + np.exp(-1.702 * x64))
    err = np.abs(y - ref) - 1e-7
    assert np.all(err <= 1e-6 * np.abs(ref)) == fma, float(np.max(err / np.abs(ref).clip(1e-30)))
    assert np.all(err <= 3e-3 * np.abs(ref) + 1e-3)


def test_gelu_quick_far_negative_and_infinite_inputs(mgr) -> None:
    """x sigmoid(1.702 x) where exp(-1.702 x) overflows f32: -0 for a finite x (x below about
    -52), NaN for -inf and NaN, inf for inf, as float64 computes it, whether the value sits in
    an 8-wide vector of the AVX2 loop or in the scalar tail (element 8 of 9)."""
    if not G.fma_gemm():
        pytest.skip("this CPU does not run sdplan's FMA kernels")
    vals = np.array([-3.4e38, -1e38, -1e36, -1e30, -100.0, -60.0, -np.inf, np.inf, np.nan, 3.4e38], np.float32)
    with np.errstate(all="ignore"):
        x64 = vals.astype(np.float64)
        want = x64 * (1 / (1 + np.exp(-1.702 * x64)))
    for pos in range(9):  # 8 vector lanes, then the scalar tail
        x = np.zeros((len(vals), 9), np.float32)
        x[:, pos] = vals
        g = gr.new_graph([mgr.get("CPU")], n_threads=1)
        g.output("y", g.unary("gelu_quick", g.input("x", x.shape)))
        g.set_input("x", x)
        assert "CUSTOM" in [r[0] for r in g.profile()]
        y = np.array(g.get_output("y"))[:, pos].astype(np.float64)
        assert np.array_equal(np.isnan(y), np.isnan(want)), (pos, y, want)
        assert np.array_equal(y[np.isinf(want)], want[np.isinf(want)]), (pos, y, want)
        ok = np.isfinite(want)
        assert np.all(np.abs(y[ok] - want[ok]) <= 1e-6 * np.abs(want[ok]) + 1e-30), (pos, y, want)


@pytest.mark.parametrize("shape", [(3, 74), (2, 5, 128), (1, 2, 2 * 1283)])
@pytest.mark.parametrize("approximate", [False, True])
def test_geglu_matches_reference(mgr, glu_simd, shape, approximate) -> None:
    x = _gelu_input(np.random.default_rng(shape[-1] + approximate), shape)
    g = gr.new_graph([mgr.get("CPU")], n_threads=2)
    g.output("y", gr.geglu(g, g.input("x", shape), approximate))
    g.set_input("x", x)
    g.compute()
    y = np.array(g.get_output("y"))
    d = shape[-1] // 2
    ref = x[..., :d].astype(np.float64) * _gelu_ref(x[..., d:], approximate)
    assert y.shape == ref.shape
    assert np.all(np.abs(y - ref) <= 2e-6 + 2e-6 * np.abs(ref)), float(np.max(np.abs(y - ref)))


def test_environment_variable_chooses_the_kernel() -> None:
    """The kernel choice reads SDPLAN_BF16_KERNEL (in one place: sdplan.core.runtime.kernels)
    and hands the native module a decision."""
    from sdplan.core.runtime import kernels

    before = kernels.current(G)
    try:
        assert kernels.choose(G, {"SDPLAN_BF16_KERNEL": "AUTO"}).bf16 == CPU_KERNEL
        off = kernels.choose(G, {"SDPLAN_BF16_KERNEL": "off"})
        assert off.bf16 == "off" and off.cpu_bf16 == CPU_KERNEL and off.why["bf16"] == "SDPLAN_BF16_KERNEL=off"
        assert kernels.choose(G, {}).bf16 == CPU_KERNEL  # unset: the CPU's
        kernels.apply(G, off)
        assert G.bf16_kernel() == "off" and kernels.current(G).bf16 == "off"
        assert not kernels.current(G).holds_bf16(("amx", "avx512", "avx512_fast"), lambda: 9.0)
        with pytest.raises(InvalidArgument, match=r"^SDPLAN_BF16_KERNEL='fast': expected auto, amx, avx512 or off$"):
            kernels.choose(G, {"SDPLAN_BF16_KERNEL": "fast"})
        if CPU_KERNEL != "amx":
            with pytest.raises(InvalidArgument, match=rf"^SDPLAN_BF16_KERNEL='amx': this CPU runs {CPU_KERNEL} at best$"):
                kernels.choose(G, {"SDPLAN_BF16_KERNEL": "amx"})
    finally:
        kernels.apply(G, before)
    assert kernels.current(G) == before


def test_kernel_is_the_cpus_by_default() -> None:
    """Without SDPLAN_BF16_KERNEL a fresh process runs the CPU's fastest bf16 kernel; ``off``
    turns it off (f16 weights, multiplied by the FMA product or ggml's)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "SDPLAN_BF16_KERNEL"}
    code = "from sdplan.core.runtime.native import native; print(native().bf16_kernel())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == CPU_KERNEL
    env["SDPLAN_BF16_KERNEL"] = "off"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "off"


def test_weights_keep_their_dtype_for_the_kernel(mgr, kernel) -> None:
    from sdplan.core.modelfiles.readers import TensorInfo
    from sdplan.core.runtime.weights import runtime_dtype

    cpu = mgr.get("CPU")
    on = kernel != "off"
    for shape in ((320, 768), (320, 320, 3, 3)):
        info = TensorInfo("w", "F16", shape, 0, 0, "m.safetensors")
        # AMX: converted as it loads; AVX512_BF16: f16 stays f16 (the kernel rounds it as it
        # uses it: mapped from the file)
        assert runtime_dtype(info, cpu, bf16=True) == ("bf16" if kernel == "amx" else "f16")
        assert runtime_dtype(info, cpu) == "f16"
    # a bf16 conv kernel stays bf16 for a module whose products run the kernel, else f16
    info = TensorInfo("w", "BF16", (320, 320, 3, 3), 0, 0, "m.safetensors")
    assert runtime_dtype(info, cpu, bf16=True) == ("bf16" if on else "f16")
    assert runtime_dtype(info, cpu) == "f16"
    assert runtime_dtype(TensorInfo("b", "F16", (320,), 0, 0, "m.safetensors"), cpu, bf16=True) == "f32"


def _group_norm_affine_ref(x: np.ndarray, groups: int, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    xg = x.astype(np.float64).reshape(x.shape[0], groups, -1)
    y = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + eps)).reshape(x.shape)
    return y * w.reshape(-1, 1, 1) + b.reshape(-1, 1, 1)


@pytest.mark.parametrize(("shape", "groups"), [((2, 8, 5, 7), 4), ((1, 64, 16, 16), 32), ((1, 6, 33, 1), 3)])
def test_group_norm_with_its_silu_in_one_op(mgr, glu_simd, shape, groups) -> None:
    """GroupNorm, affine and SiLU as one CPU op (``silu=True``, as the UNets and VAEs run it):
    within 1e-5 (relative and absolute) of float64, gammas up to 60 driving the SiLU into both
    of its tails (values past -88, where exp is clamped, give tiny negatives, as the formula
    does), rows of 35, 256 and 33 values (the 16-lane sums' and the vectors' partial tails);
    and within 1e-6 of the GroupNorm op followed by ggml's SiLU, which the op replaces."""
    rng = np.random.default_rng(shape[-1] + groups)
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(np.float32)
    w = (rng.standard_normal(shape[1]) * 12).astype(np.float32)
    w[:2] = [60.0, -60.0]
    b = rng.standard_normal(shape[1]).astype(np.float32)
    out = {}
    for fused in (True, False):
        g = gr.new_graph([mgr.get("CPU")], n_threads=2)
        y = gr.group_norm(g, g.input("x", shape), groups, g.input("w", w.shape), g.input("b", b.shape), 1e-5,
                          silu=fused)
        g.output("y", y if fused else g.unary("silu", y))
        for name, v in (("x", x), ("w", w), ("b", b)):
            g.set_input(name, v)
        g.compute()
        out[fused] = np.array(g.get_output("y")).astype(np.float64)
        if fused:
            assert "SILU" not in [r[0] for r in g.profile()]
    v = _group_norm_affine_ref(x, groups, w, b, 1e-5)
    assert v.min() < -88 and v.max() > 88  # both tails reached
    with np.errstate(over="ignore"):
        ref = v / (1.0 + np.exp(-v))
    np.testing.assert_allclose(out[True], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[True], out[False], rtol=1e-6, atol=1e-6)


def test_group_norm_silu_far_negative_values(mgr, glu_simd) -> None:
    """Past exp's clamp the fused SiLU gives the formula's limits, as x / (1 + expf(-x)) does:
    -0 for finite values from -1e2 to -3e38, NaN for -inf and NaN, the value itself far above 0
    (weight 0 and the bias as the value, so the GroupNorm part is exact), in every lane and in
    a partial vector's tail."""
    vals = np.array([-1e2, -1e4, -1e30, -1e36, -1e38, -3e38, -np.inf, np.nan, 1e2, 1e30, 3e38], np.float32)
    c = len(vals)
    g = gr.new_graph([mgr.get("CPU")], n_threads=1)
    g.output("y", gr.group_norm(g, g.input("x", (1, c, 3, 7)), c, g.input("w", (c,)), g.input("b", (c,)), 1e-5,
                                silu=True))
    g.set_input("x", np.random.default_rng(0).standard_normal((1, c, 3, 7)).astype(np.float32))
    g.set_input("w", np.zeros(c, np.float32))
    g.set_input("b", vals)
    g.compute()
    y = np.array(g.get_output("y"))[0].reshape(c, -1)
    assert np.all(y[:6] == 0.0) and np.all(np.signbit(y[:6])), y[:6, 0]  # -0
    assert np.all(np.isnan(y[6:8]))
    np.testing.assert_array_equal(y[8:], np.repeat(vals[8:, None], y.shape[1], axis=1))


@pytest.mark.parametrize(("offset", "std"), [(1000.0, 1.0), (-3000.0, 0.5), (1e4, 2.0), (0.0, 1e-3)])
def test_group_norm_with_a_large_mean_against_its_spread(mgr, offset, std) -> None:
    """The one-pass GroupNorm's variance keeps its accuracy when a group's mean is large against
    its spread (the sums are taken about one of the group's values, not about 0): within
    5e-7 * |mean| / std + 2e-5 of float64, the size of float32's rounding of the offset in the
    fused scale-and-shift (mean 1000, std 1: 5.2e-4; they came out up to 0.09 off with the plain
    sums), without the SiLU and with it."""
    rng = np.random.default_rng(int(abs(offset)) + 7)
    shape, groups = (2, 8, 24, 24), 4
    x = (rng.standard_normal(shape) * std + offset).astype(np.float32)
    w = (1.0 + 0.25 * rng.standard_normal(shape[1])).astype(np.float32)
    b = rng.standard_normal(shape[1]).astype(np.float32)
    v = _group_norm_affine_ref(x, groups, w, b, 1e-12)
    tol = 5e-7 * abs(offset) / std + 2e-5
    for silu in (False, True):
        g = gr.new_graph([mgr.get("CPU")], n_threads=2)
        g.output("y", gr.group_norm(g, g.input("x", shape), groups, g.input("w", w.shape), g.input("b", b.shape),
                                    1e-12, silu=silu))
        for name, a in (("x", x), ("w", w), ("b", b)):
            g.set_input(name, a)
        g.compute()
        ref = v / (1.0 + np.exp(-v)) if silu else v
        np.testing.assert_allclose(np.array(g.get_output("y")), ref, rtol=0, atol=tol)


@pytest.mark.parametrize(("first", "hw"), [(1000.0, 256), (100.0, 128), (3e4, 64)])
def test_group_norm_with_an_outlier_first(mgr, glu_simd, first, hw) -> None:
    """A group whose first value is an outlier (a zero-padded convolution's corner can be one),
    the rest N(0, 1): the shifted sums are taken about that value and stay within 1e-5
    (relative and absolute) of float64 for every value, the outlier too (float sums about it
    were 2e-2 off for the rest at 1000 std and 256x256, 4.7 off for the outlier)."""
    shape, groups = (1, 8, hw, hw), 2
    rng = np.random.default_rng(hw)
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, 0, 0, 0] = first
    x[0, 4, 0, 0] = -first
    w = np.ones(shape[1], np.float32)
    b = np.zeros(shape[1], np.float32)
    g = gr.new_graph([mgr.get("CPU")], n_threads=2)
    g.output("y", gr.group_norm(g, g.input("x", shape), groups, g.input("w", w.shape), g.input("b", b.shape), 1e-6))
    for name, a in (("x", x), ("w", w), ("b", b)):
        g.set_input(name, a)
    g.compute()
    np.testing.assert_allclose(np.array(g.get_output("y")), _group_norm_affine_ref(x, groups, w, b, 1e-6),
                               rtol=1e-5, atol=1e-5)
