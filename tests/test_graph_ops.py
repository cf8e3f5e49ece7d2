"""Each graph op on the CPU backend against a numpy reference; shape errors raise ValueError."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
from sdplan.core.runtime import graph as gr  # noqa: E402

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def cpu():
    mgr = G.BackendManager(1)
    yield mgr.get("CPU")
    mgr.close()


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def run(cpu, build, arrays: dict[str, np.ndarray], dtypes: dict[str, str] | None = None) -> np.ndarray:
    """Build a graph with inputs named like ``arrays``, output ``build(g, **inputs)``."""
    g = gr.new_graph([cpu])
    dtypes = dtypes or {}
    ins = {k: g.input(k, v.shape, dtypes.get(k, "f32")) for k, v in arrays.items()}
    g.output("y", build(g, **ins))
    for k, v in arrays.items():
        g.set_input(k, v)
    g.compute()
    return g.get_output("y")


def close(a: np.ndarray, b: np.ndarray, tol: float = 1e-4) -> None:
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def test_mul_mat_broadcasts_weight_over_batch(cpu) -> None:
    w, x = rand(6, 8), rand(2, 5, 8)
    close(run(cpu, lambda g, w, x: g.mul_mat(w, x), {"w": w, "x": x}), x @ w.T)


@pytest.mark.parametrize("op,ref", [("add", np.add), ("sub", np.subtract),
                                    ("mul", np.multiply), ("div", np.divide)])
def test_binary_broadcast_both_ways(cpu, op, ref) -> None:
    a, b = rand(2, 3, 4, 5), rand(3, 1, 1) + 3.0
    close(run(cpu, lambda g, a, b: getattr(g, op)(a, b), {"a": a, "b": b}), ref(a, b))
    close(run(cpu, lambda g, a, b: getattr(g, op)(b, a), {"a": a, "b": b}), ref(b, a))


@pytest.mark.parametrize("op,ref", [("add", np.add), ("sub", np.subtract),
                                    ("mul", np.multiply), ("div", np.divide)])
def test_binary_per_channel_rows_widened(cpu, op, ref) -> None:
    """A (C, 1, 1) operand over (N, C, H, W) with wide rows (widened to rows internally)."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((2, 3, 4, 16)).astype(np.float32)
    b = rng.standard_normal((3, 1, 1)).astype(np.float32) + 3.0
    close(run(cpu, lambda g, a, b: getattr(g, op)(a, b), {"a": a, "b": b}), ref(a, b))
    close(run(cpu, lambda g, a, b: getattr(g, op)(b, a), {"a": a, "b": b}), ref(b, a))


def test_binary_mixed_dtypes_compute_in_f32(cpu) -> None:
    a, b = rand(4, 8), rand(8).astype(np.float16)
    y = run(cpu, lambda g, a, b: g.add(a, b), {"a": a, "b": b}, {"b": "f16"})
    close(y, a + b.astype(np.float32), 1e-3)


def test_scale_and_bias(cpu) -> None:
    a = rand(3, 7)
    close(run(cpu, lambda g, a: g.scale(a, 0.5, 2.0), {"a": a}), a * 0.5 + 2.0)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


_erf = np.vectorize(math.erf)
UNARY = {
    "gelu": _gelu_tanh,
    "gelu_erf": lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    "gelu_quick": lambda x: x / (1 + np.exp(-1.702 * x)),
    "silu": lambda x: x / (1 + np.exp(-x)),
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh, "exp": np.exp, "sqr": np.square, "abs": np.abs, "neg": np.negative,
    "sin": np.sin, "cos": np.cos,
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(cpu, op) -> None:
    a = rand(4, 33)
    close(run(cpu, lambda g, a: g.unary(op, a), {"a": a}), UNARY[op](a).astype(np.float32), 2e-3)


def test_unary_on_a_permuted_view_is_made_contiguous(cpu) -> None:
    a = rand(3, 5)
    close(run(cpu, lambda g, a: g.unary("relu", g.transpose(a)), {"a": a}), np.maximum(a.T, 0))


def test_leaky_relu_prelu_clamp(cpu) -> None:
    a = rand(4, 6)
    close(run(cpu, lambda g, a: g.leaky_relu(a, 0.2), {"a": a}), np.where(a > 0, a, 0.2 * a))
    s = np.full((6,), 0.25, np.float32)
    close(run(cpu, lambda g, a, s: gr.prelu(g, a, s), {"a": a, "s": s}), np.where(a > 0, a, 0.25 * a))
    close(run(cpu, lambda g, a: g.clamp(a, -0.5, 0.5), {"a": a}), np.clip(a, -0.5, 0.5))


def test_layer_norm_and_rms_norm(cpu) -> None:
    x, w, b = rand(2, 5, 16), rand(16), rand(16)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    ref = (x - mu) / np.sqrt(var + 1e-5) * w + b
    close(run(cpu, lambda g, x, w, b: gr.layer_norm(g, x, w, b, 1e-5), {"x": x, "w": w, "b": b}), ref)
    rms = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6)
    close(run(cpu, lambda g, x: g.rms_norm(x, 1e-6), {"x": x}), rms)


@pytest.mark.parametrize("shape", [(3, 7), (2, 5, 320), (1, 77, 768), (4, 1283), (2, 2, 3, 24)])
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
@pytest.mark.parametrize("wdtype", ["f32", "f16"])
def test_layer_norm_fused_affine(cpu, shape, affine, wdtype) -> None:
    """The fused op (CPU-only graphs) against float64 within 2e-5 of the output's scale: rows
    with a large common offset (mean 40, spread 3: the centred variance matters), tails past
    the 8-lane blocks, f16 weights (widened), either affine part alone; the op is one node."""
    rng = np.random.default_rng(shape[-1] + len(affine))
    x = (rng.standard_normal(shape) * 3 + 40).astype(np.float32)
    d = shape[-1]
    w = rng.standard_normal(d).astype(np.float32) if affine in ("both", "weight") else None
    b = rng.standard_normal(d).astype(np.float32) if affine in ("both", "bias") else None
    if wdtype == "f16":
        w = None if w is None else w.astype(np.float16)
        b = None if b is None else b.astype(np.float16)
    arrays = {"x": x} | ({"w": w} if w is not None else {}) | ({"b": b} if b is not None else {})
    g = gr.new_graph([cpu], n_threads=2)
    ins = {k: g.input(k, v.shape, "f16" if v.dtype == np.float16 else "f32") for k, v in arrays.items()}
    g.output("y", gr.layer_norm(g, ins["x"], ins.get("w"), ins.get("b"), 1e-5))
    for k, v in arrays.items():
        g.set_input(k, v)
    ops = [r[0] for r in g.profile() if r[0] not in ("RESHAPE", "VIEW", "CPY")]
    assert ops == ["CUSTOM"], ops
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5)
    ref = ref * (w.astype(np.float64) if w is not None else 1.0) + (b.astype(np.float64) if b is not None else 0.0)
    y = g.get_output("y")
    assert y.shape == x.shape
    assert np.abs(y - ref).max() <= 2e-5 * np.abs(ref).max()


def test_layer_norm_refuses_a_mismatched_weight(cpu) -> None:
    g = gr.new_graph([cpu])
    with pytest.raises(ValueError, match="layer_norm: weight and bias must be float vectors of the last axis' 8"):
        g.layer_norm(g.input("x", (3, 8)), 1e-5, weight=g.input("w", (7,)))


def test_rope_pairs_refuses_bad_tables_and_odd_widths(cpu) -> None:
    g = gr.new_graph([cpu])
    x = g.input("x", (1, 5, 2, 8))
    with pytest.raises(ValueError, match="rope_pairs: cos and sin must be contiguous f32 tables of 5 x 4 values"):
        g.rope_pairs(x, g.input("c", (5, 3)), g.input("s", (5, 4)))
    with pytest.raises(ValueError, match="rope_pairs: the last axis must be even"):
        g.rope_pairs(g.input("y", (1, 5, 2, 7)), g.input("c2", (5, 3)), g.input("s2", (5, 3)))
    for dtype in ("f64", "i32", "i8"):  # ggml cannot turn these into f32 in a graph (it aborted at compute)
        with pytest.raises(ValueError, match="rope_pairs: x must be a float tensor"):
            g.rope_pairs(g.input(f"x_{dtype}", (1, 5, 2, 8), dtype), g.input(f"c_{dtype}", (5, 4)),
                         g.input(f"s_{dtype}", (5, 4)))


def _group_norm_ref(x, groups, w, b, eps=1e-6):
    lead = x.shape[:-3]
    c = x.shape[-3]
    xg = x.reshape(*lead, groups, -1).astype(np.float64)
    y = (xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + eps)
    y = y.reshape(x.shape)
    if w is not None:
        y = y * w.reshape(c, 1, 1)
    if b is not None:
        y = y + b.reshape(c, 1, 1)
    return y.astype(np.float32)


@pytest.mark.parametrize("shape,groups", [((2, 8, 5, 7), 4), ((6, 3, 9), 3), ((1, 64, 16, 16), 32)])
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
def test_group_norm_fused_affine(cpu, shape, groups, affine) -> None:
    rng = np.random.default_rng(len(shape) + groups)
    c = shape[-3]
    x = (rng.standard_normal(shape) * 3 + 1.5).astype(np.float32)
    w = rng.standard_normal(c).astype(np.float32) if affine != "none" else None
    b = rng.standard_normal(c).astype(np.float32) if affine == "both" else None
    arrays = {"x": x} | ({"w": w} if w is not None else {}) | ({"b": b} if b is not None else {})

    def build(g, x, w=None, b=None):
        return g.group_norm(x, groups, 1e-6, weight=w, bias=b)
    close(run(cpu, build, arrays), _group_norm_ref(x, groups, w, b), 1e-4)


def test_group_norm(cpu) -> None:
    x, w, b = rand(2, 8, 3, 5), rand(8), rand(8)
    xg = x.reshape(2, 4, -1)
    ref = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-6)).reshape(x.shape)
    ref = ref * w[:, None, None] + b[:, None, None]
    close(run(cpu, lambda g, x, w, b: gr.group_norm(g, x, 4, w, b), {"x": x, "w": w, "b": b}), ref)


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def test_soft_max_with_mask_and_scale(cpu) -> None:
    a, m = rand(2, 3, 4, 6), rand(4, 6)
    close(run(cpu, lambda g, a, m: g.soft_max(a, m, 0.3), {"a": a, "m": m}), _softmax(a * 0.3 + m))


@pytest.mark.parametrize("flash", [False, True])
def test_attention_plain_and_flash(cpu, flash) -> None:
    q, k, v = rand(1, 2, 5, 8), rand(1, 2, 7, 8), rand(1, 2, 7, 8)
    m = np.zeros((5, 7), np.float32)
    m[:, -2:] = -np.inf
    p = _softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(8) + m)
    ref = (p @ v).transpose(0, 2, 1, 3).reshape(1, 5, 16)
    y = run(cpu, lambda g, q, k, v, m: gr.attention(g, q, k, v, m, flash=flash),
            {"q": q, "k": k, "v": v, "m": m})
    close(y, ref, 5e-3 if flash else 1e-4)


@pytest.mark.parametrize("d, flash_node", [(4, False), (8, True)])
def test_attention_picks_flash_by_head_width(cpu, d, flash_node) -> None:
    """``flash=None`` takes the flash kernel from FLASH_MIN_HEAD_DIM on (it is slower below),
    and both choices give the softmax reference."""
    q, k, v = rand(1, 2, 6, d), rand(1, 2, 6, d), rand(1, 2, 6, d)
    g = gr.new_graph([cpu])
    ins = {n: g.input(n, a.shape) for n, a in (("q", q), ("k", k), ("v", v))}
    g.output("y", gr.attention(g, ins["q"], ins["k"], ins["v"]))
    g.build()
    g.allocate()
    for n, a in (("q", q), ("k", k), ("v", v)):
        g.set_input(n, a)
    ops = {row[0] for row in g.profile()}
    # the flash kernel: sdplan's FMA attention op (a CUSTOM node) where the CPU runs it, else ggml's
    flash_op = "CUSTOM" if G.fma_gemm() else "FLASH_ATTN_EXT"
    assert (flash_op in ops) is flash_node
    ref = (_softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)) @ v).transpose(0, 2, 1, 3)
    close(g.get_output("y"), ref.reshape(1, 6, 2 * d), 5e-3)


def _conv2d_ref(x, w, stride, pad):
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, oc, oh, ow), np.float32)
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("stride,pad", [(1, 1), (2, 0)])
def test_conv2d(cpu, stride, pad, direct) -> None:
    x, w, b = rand(2, 3, 7, 6), rand(4, 3, 3, 3), rand(4)
    ref = _conv2d_ref(x, w, stride, pad) + b[:, None, None]
    y = run(cpu, lambda g, x, w, b: gr.conv2d(g, x, w, b, stride, pad, direct=direct),
            {"x": x, "w": w, "b": b})
    close(y, ref, 1e-3)


def _conv2d_ref_general(x, w, stride, pad, dil):
    """Direct convolution in numpy with (y, x) pairs for stride, padding and dilation."""
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    (sy, sx), (py, px), (dy, dx) = stride, pad, dil
    xp = np.pad(x, ((0, 0), (0, 0), (py, py), (px, px)))
    oh = (h + 2 * py - dy * (kh - 1) - 1) // sy + 1
    ow = (wd + 2 * px - dx * (kw - 1) - 1) // sx + 1
    out = np.zeros((n, oc, oh, ow), np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dy:i * dy + sy * (oh - 1) + 1:sy, j * dx:j * dx + sx * (ow - 1) + 1:sx]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out.astype(np.float32)


@pytest.mark.parametrize("method", ["auto", "im2col", "cpu_im2col", "direct", "winograd", "fma"])
@pytest.mark.parametrize("wdtype", ["f32", "f16"])
@pytest.mark.parametrize("n,ic,k,stride,pad,dil", [
    (1, 20, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 35, (3, 3), (2, 2), (1, 1), (1, 1)),
    (1, 17, (3, 2), (2, 1), (0, 1), (1, 2)),
    (2, 16, (1, 1), (1, 1), (0, 0), (1, 1)),
])
def test_conv2d_methods(cpu, method, wdtype, n, ic, k, stride, pad, dil) -> None:
    if method == "winograd" and (k, stride, pad, dil) != ((3, 3), (1, 1), (1, 1), (1, 1)):
        pytest.skip("winograd is for 3x3, stride 1, padding 1 only")
    if method == "fma" and not G.fma_gemm():
        pytest.skip("this CPU does not run the FMA product")
    rng = np.random.default_rng(ic)  # own generator: keeps the module's sequence for other tests
    x = rng.standard_normal((n, ic, 9, 11)).astype(np.float32)
    w = rng.standard_normal((5, ic, *k)).astype(np.float32) * 0.2
    b = rng.standard_normal(5).astype(np.float32)
    if wdtype == "f16":
        w = w.astype(np.float16)
    ref = _conv2d_ref_general(x, w.astype(np.float32), stride, pad, dil) + b[:, None, None]
    y = run(cpu, lambda g, x, w, b: gr.conv2d(g, x, w, b, stride, pad, dil, method=method),
            {"x": x, "w": w, "b": b}, {"w": wdtype})
    # f16 kernels round the columns to f16 as well (ggml's f16 matrix product; not the FMA
    # product, which widens the kernel instead)
    close(y, ref, 1e-3 if wdtype == "f32" or method == "fma" else 2e-2)


@pytest.mark.parametrize("h,w", [(8, 8), (7, 9), (1, 2)])
def test_conv2d_winograd_odd_sizes(cpu, h, w) -> None:
    rng = np.random.default_rng(h * 10 + w)
    x = rng.standard_normal((2, 12, h, w)).astype(np.float32)
    k = rng.standard_normal((6, 12, 3, 3)).astype(np.float32) * 0.2
    ref = _conv2d_ref_general(x, k, (1, 1), (1, 1), (1, 1))
    close(run(cpu, lambda g, x, k: gr.conv2d(g, x, k, padding=1, method="winograd"), {"x": x, "k": k}), ref, 1e-3)


def test_conv2d_winograd_refuses_other_shapes(cpu) -> None:
    g = gr.new_graph([cpu])
    with pytest.raises(ValueError, match="winograd"):
        g.conv_2d(g.input("w", (4, 3, 3, 3)), g.input("x", (1, 3, 8, 8)), (2, 2), (1, 1), method="winograd")


def test_conv2d_unknown_method(cpu) -> None:
    g = gr.new_graph([cpu])
    with pytest.raises(ValueError, match="conv_2d: method must be"):
        g.conv_2d(g.input("w", (4, 3, 3, 3)), g.input("x", (1, 3, 8, 8)), method="fft")


def _conv_t_ref(x, w, s):
    n, ic, h, wd = x.shape
    _, oc, kh, kw = w.shape
    out = np.zeros((n, oc, (h - 1) * s + kh, (wd - 1) * s + kw), np.float32)
    for i in range(h):
        for j in range(wd):
            out[:, :, i * s:i * s + kh, j * s:j * s + kw] += np.einsum("nc,cohw->nohw", x[:, :, i, j], w)
    return out


def test_conv_transpose2d_with_padding(cpu) -> None:
    x, w = rand(1, 3, 4, 5), rand(3, 2, 4, 4)
    ref = _conv_t_ref(x, w, 2)[:, :, 1:-1, 1:-1]
    close(run(cpu, lambda g, x, w: gr.conv_transpose2d(g, x, w, None, 2, 1), {"x": x, "w": w}), ref, 1e-3)


def test_upscale_pad_concat(cpu) -> None:
    x, y = rand(1, 2, 3, 4), rand(1, 3, 3, 4)
    close(run(cpu, lambda g, x: g.upscale(x, 2), {"x": x}), x.repeat(2, axis=2).repeat(2, axis=3))
    close(run(cpu, lambda g, x: g.pad(x, [(0, 0), (1, 0), (2, 1), (0, 3)]), {"x": x}),
          np.pad(x, [(0, 0), (1, 0), (2, 1), (0, 3)]))
    close(run(cpu, lambda g, x, y: g.concat(x, y, 1), {"x": x, "y": y}), np.concatenate([x, y], 1))
    close(run(cpu, lambda g, x: g.concat(x, x, -1), {"x": x}), np.concatenate([x, x], -1))


def test_interpolate_nearest_matches_upscale(cpu) -> None:
    x = rand(1, 2, 3, 4)
    close(run(cpu, lambda g, x: g.interpolate(x, (1, 2, 6, 8)), {"x": x}), x.repeat(2, 2).repeat(2, 3))


def test_shape_ops(cpu) -> None:
    x = rand(2, 3, 4, 5)
    close(run(cpu, lambda g, x: g.permute(x, (0, 2, 3, 1)), {"x": x}), x.transpose(0, 2, 3, 1))
    close(run(cpu, lambda g, x: g.permute(x, (3, 1, 0, 2)), {"x": x}), x.transpose(3, 1, 0, 2))
    close(run(cpu, lambda g, x: g.reshape(x, (6, -1)), {"x": x}), x.reshape(6, -1))
    close(run(cpu, lambda g, x: g.reshape(g.permute(x, (1, 0, 2, 3)), (3, 40)), {"x": x}),
          x.transpose(1, 0, 2, 3).reshape(3, 40))
    sub = x[:, 1:3, :, 2:4]
    strides = x.strides
    close(run(cpu, lambda g, x: g.view(x, sub.shape, strides, strides[1] + 2 * 4), {"x": x}), sub)
    close(run(cpu, lambda g, x: g.repeat(g.view(x, (1, 3, 4, 5)), (2, 3, 4, 5)), {"x": x}),
          np.broadcast_to(x[:1], x.shape))


def test_cast_roundtrip_and_quantize(cpu) -> None:
    x = rand(4, 64)
    close(run(cpu, lambda g, x: g.cast(g.cast(x, "f16"), "f32"), {"x": x}),
          x.astype(np.float16).astype(np.float32), 1e-6)
    close(run(cpu, lambda g, x: g.cast(g.cast(x, "bf16"), "f32"), {"x": x}), x, 1e-2)
    w = rand(3, 64)
    y = run(cpu, lambda g, w, x: g.mul_mat(g.cast(w, "q8_0"), x), {"w": w, "x": x})
    close(y, _q8_0(x) @ _q8_0(w).T, 1e-2)  # ggml quantizes the activations to q8_0 too


def _q8_0(a: np.ndarray) -> np.ndarray:
    """Round-trip through ggml's q8_0 (blocks of 32: f16 scale max|x|/127, int8 values)."""
    b = a.reshape(-1, 32)
    d = (np.abs(b).max(1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    q = np.round(np.divide(b, d, out=np.zeros_like(b), where=d != 0))
    return (q * d).reshape(a.shape)


def test_get_rows_and_reductions(cpu) -> None:
    table, ids = rand(10, 6), np.array([3, 0, 9, 3], np.int32)
    close(run(cpu, lambda g, t, i: g.get_rows(t, i), {"t": table, "i": ids}, {"i": "i32"}), table[ids])
    x = rand(3, 7)
    close(run(cpu, lambda g, x: g.sum_rows(x), {"x": x}), x.sum(-1, keepdims=True))
    close(run(cpu, lambda g, x: g.mean(x), {"x": x}), x.mean(-1, keepdims=True))


def test_rope_normal_and_neox(cpu) -> None:
    x, pos = rand(1, 5, 2, 8), np.arange(5, dtype=np.int32) * 3
    theta = pos[:, None] * 10000.0 ** (-np.arange(4) * 2 / 8)  # (T, D/2)
    c, s = np.cos(theta)[None, :, None, :], np.sin(theta)[None, :, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    ref = np.empty_like(x)
    ref[..., 0::2], ref[..., 1::2] = x0 * c - x1 * s, x0 * s + x1 * c
    close(run(cpu, lambda g, x, p: g.rope(x, p, 8), {"x": x, "p": pos}, {"p": "i32"}), ref, 1e-3)
    h0, h1 = x[..., :4], x[..., 4:]
    neox = np.concatenate([h0 * c - h1 * s, h0 * s + h1 * c], -1)
    close(run(cpu, lambda g, x, p: g.rope(x, p, 8, mode=2), {"x": x, "p": pos}, {"p": "i32"}), neox, 1e-3)


def test_timestep_embedding(cpu) -> None:
    t = np.array([1.0, 500.0], np.float32)
    half = 8
    freqs = np.exp(-math.log(10000) * np.arange(half) / half)
    args = t[:, None] * freqs[None]
    ref = np.concatenate([np.cos(args), np.sin(args)], -1).astype(np.float32)
    close(run(cpu, lambda g, t: g.timestep_embedding(t, 16), {"t": t}), ref, 1e-3)


def test_pixel_shuffle_and_geglu(cpu) -> None:
    x, r = rand(1, 8, 3, 5), 2
    ref = x.reshape(1, 2, r, r, 3, 5).transpose(0, 1, 4, 2, 5, 3).reshape(1, 2, 6, 10)
    close(run(cpu, lambda g, x: gr.pixel_shuffle(g, x, r), {"x": x}), ref)
    h = rand(2, 3, 8)
    a, gate = h[..., :4], h[..., 4:]
    ref = a * 0.5 * gate * (1 + _erf(gate / math.sqrt(2)))
    close(run(cpu, lambda g, h: gr.geglu(g, h), {"h": h}), ref.astype(np.float32), 1e-4)


@pytest.mark.parametrize("build,match", [
    (lambda g: g.mul_mat(g.input("a", (3, 4)), g.input("b", (3, 5))), r"mul_mat: inner dimensions"),
    (lambda g: g.add(g.input("a", (3, 4)), g.input("b", (3, 3))), r"add: shapes do not broadcast"),
    (lambda g: g.conv_2d(g.input("w", (4, 3, 3, 3)), g.input("x", (1, 2, 8, 8))), r"conv_2d: input channels"),
    (lambda g: g.conv_2d(g.input("w", (4, 3, 9, 9)), g.input("x", (1, 3, 4, 4))), r"conv_2d: kernel larger"),
    (lambda g: g.reshape(g.input("a", (3, 4)), (5, 3)), r"reshape: element count"),
    (lambda g: g.concat(g.input("a", (3, 4)), g.input("b", (2, 5)), 0), r"concat: shapes differ"),
    (lambda g: g.permute(g.input("a", (3, 4)), (0, 0)), r"permute: axes"),
    (lambda g: g.get_rows(g.input("a", (3, 4)), g.input("i", (2,))), r"get_rows: ids must be i32"),
    (lambda g: g.soft_max(g.input("a", (3, 4)), g.input("m", (3, 5))), r"soft_max: mask"),
    (lambda g: g.rope(g.input("x", (1, 5, 2, 8)), g.input("p", (4,), "i32"), 8), r"rope: positions"),
    (lambda g: g.group_norm(g.input("x", (1, 4, 2, 2)), 5), r"group_norm: n_groups"),
    (lambda g: g.view(g.input("a", (3, 4)), (4, 4)), r"view: view reaches"),
    (lambda g: g.input("a", (1, 2, 3, 4, 5)), r"input: shapes have 1 to 4"),
    (lambda g: g.input("a", (3,), "f33"), r"unknown dtype 'f33'"),
    (lambda g: g.flash_attn(g.input("q", (1, 2, 5, 8)), g.input("k", (1, 2, 7, 4)), g.input("v", (1, 2, 7, 4))),
     r"flash_attn: incompatible"),
])
def test_bad_shapes_raise_value_error_naming_the_op(cpu, build, match) -> None:
    g = gr.new_graph([cpu])
    with pytest.raises(ValueError, match=match):
        build(g)


def test_graph_is_reused_across_inputs_and_reserve_reports_bytes(cpu) -> None:
    g = gr.new_graph([cpu])
    a = g.input("a", (64, 64))
    g.output("y", g.unary("tanh", g.mul_mat(a, a)))
    sizes = g.reserve()
    assert len(sizes) == 1 and sizes[0] >= 64 * 64 * 4 * 2
    for _ in range(3):
        x = rand(64, 64)
        g.set_input("a", x)
        g.compute()
        close(g.get_output("y"), np.tanh(x @ x.T), 1e-3)
    with pytest.raises(ValueError, match="wants an array of shape"):
        g.set_input("a", rand(3, 3))
    with pytest.raises(ValueError, match="already built"):
        g.unary("relu", a)


def test_cancel_stops_a_long_compute_and_graph_stays_usable(cpu) -> None:
    # 1200 products of 256 x 256 (about 1 s on two Zen 4 cores): the cancel at 0.1 s lands
    # mid-compute with a wide margin (with 300, 0.25-0.3 s, one CI run saw no cancel)
    layers = 1200
    g = gr.new_graph([cpu])
    x = g.input("x", (256, 256))
    h = x
    for _ in range(layers):
        h = g.unary("tanh", g.mul_mat(x, h))
    g.output("y", h)
    xs = rand(256, 256) * 0.01
    g.set_input("x", xs)
    timer = threading.Timer(0.1, g.cancel)
    timer.start()
    t0 = time.perf_counter()
    with pytest.raises(G.ComputeCancelled):
        g.compute()
    assert time.perf_counter() - t0 < 1.1
    t0 = time.perf_counter()
    g.compute()  # still usable, and the full run takes longer than the cancelled one
    full = time.perf_counter() - t0
    ref = xs
    for _ in range(layers):
        ref = np.tanh(ref @ xs.T)
    close(g.get_output("y"), ref.astype(np.float32), 1e-3)
    assert full > 0.1


@pytest.mark.skipif(G.bf16_kernel() != "off", reason="a bf16 kernel runs flash_attn as sdplan's op")
@pytest.mark.parametrize("masked", [False, True])
def test_attention_wide_heads_take_chunked_plain_path(cpu, monkeypatch, masked) -> None:
    """Heads wider than FLASH_MAX_CPU_HEAD_DIM skip ggml's CPU flash kernel: the plain path,
    its queries in chunks of at most PLAIN_CHUNK_BYTES of scores (here 4 rows: 3 chunks of 10
    queries, the last short), with a row-sliced mask, equals the softmax reference. With the
    FMA attention op (a CPU with AVX2, FMA and F16C) they take that op instead, unchunked."""
    d = gr.FLASH_MAX_CPU_HEAD_DIM + 8
    monkeypatch.setattr(gr, "PLAIN_CHUNK_BYTES", 4 * 2 * 2 * 7 * 4)
    q, k, v = rand(2, 2, 10, d), rand(2, 2, 7, d), rand(2, 2, 7, d)
    m = rand(10, 7) if masked else np.zeros((10, 7), np.float32)
    p = _softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + m)
    ref = (p @ v).transpose(0, 2, 1, 3).reshape(2, 10, 2 * d)
    fma = bool(G.fma_gemm())
    for use_fma in ([False, True] if fma else [False]):
        G.set_fma_gemm(use_fma)
        try:
            g = gr.new_graph([cpu])
            ins = {n: g.input(n, a.shape) for n, a in (("q", q), ("k", k), ("v", v), ("m", m))}
            g.output("y", gr.attention(g, ins["q"], ins["k"], ins["v"], ins["m"]))
        finally:
            G.set_fma_gemm(fma)
        g.build()
        g.allocate()
        for n, a in (("q", q), ("k", k), ("v", v), ("m", m)):
            g.set_input(n, a)
        ops = [row[0] for row in g.profile()]
        if use_fma:
            assert "CUSTOM" in ops and "SOFT_MAX" not in ops
        else:
            assert "FLASH_ATTN_EXT" not in ops and ops.count("SOFT_MAX") == 3
        close(g.get_output("y"), ref, 1e-4)


def test_a_view_ggml_cannot_make_is_refused_in_one_line(cpu) -> None:
    """A zero-stride view with more elements than its tensor passes the reach check but ggml
    would abort the process on it (its elements, packed, must fit after the offset)."""
    g = gr.new_graph([cpu])
    x = g.input("x", (4, 8))
    with pytest.raises(ValueError, match=r"^view: ggml needs the view's 256 bytes .* within the tensor's 128 bytes"):
        g.view(x, (8, 8), (0, 4), 0)
    ok = g.view(x, (4, 4), (32, 4), 16)  # a strided view inside the tensor still works
    g.output("y", g.cont(ok))
    a = rand(4, 8)
    g.set_input("x", a)
    g.compute()
    assert np.array_equal(g.get_output("y"), a[:, 4:])


def test_ops_on_transposed_views_with_a_size_1_axis(cpu) -> None:
    """ggml counts a view with a size-1 axis as contiguous while its element-wise ops assert
    strictly packed strides: such inputs are copied first instead of aborting the process."""
    a = rand(31, 65, 1)
    close(run(cpu, lambda g, a: g.scale(g.transpose(a), 2.0), {"a": a}), 2.0 * a.transpose(0, 2, 1), 1e-6)
    close(run(cpu, lambda g, a: g.unary("silu", g.transpose(a)), {"a": a}),
          (a / (1 + np.exp(-a))).transpose(0, 2, 1), 1e-5)
