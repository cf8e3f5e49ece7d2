"""The FMA product (native/kernels/fma_gemm.cpp): linear layers with f16 weights and
convolutions with f16 or f32 kernels on CPUs with AVX2, FMA and F16C, against float64 numpy.

Tolerance (stated, not tuned to pass): the op widens every value to f32 exactly and sums in f32,
so against the float64 product of the same values the error is only f32 summation, at most
``K * 2**-24 * sum|x||w|`` per element (the worst-case bound of recursive summation, Higham,
"Accuracy and Stability of Numerical Algorithms", 2002, section 4.2; the products themselves
are exact in f32 FMA's intermediate). A term dropped or taken twice is about ``sum|x||w| / K``,
far above that bound for the sizes here. Each element is summed in the same order whatever the
threads, so results are bitwise equal across thread counts.
"""

from __future__ import annotations

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
from sdplan.core.runtime import graph as gr  # noqa: E402

pytestmark = pytest.mark.skipif(not G.fma_gemm(), reason="this CPU does not run the FMA product")


@pytest.fixture(scope="module")
def cpu():
    mgr = G.BackendManager(2)
    yield mgr.get("CPU")
    mgr.close()


def bound(k: int, scale: np.ndarray) -> np.ndarray:
    return k * 2.0 ** -24 * scale + 1e-30


def linear(cpu, x, w, b, threads: int, profile: bool = False):
    g = gr.new_graph([cpu], n_threads=threads)
    xi, wi = g.input("x", x.shape), g.input("w", w.shape, "f16")
    bi = g.input("b", b.shape) if b is not None else None
    g.output("y", g.mul_mat(wi, xi, bi))
    g.set_input("x", x)
    g.set_input("w", w)
    if b is not None:
        g.set_input("b", b)
    ops = [r[0] for r in g.profile()] if profile else g.compute()
    return g.get_output("y"), ops


# (rows of x, at least 32 (kFmaMinRows), K, N): micro-panel edges (rows not a multiple of 6, columns not of 16 or 8), depth
# tails (K below 8, not a multiple of 8, more than one chunk of about 256), several column blocks
LINEAR = [
    (32, 8, 16), (35, 7, 17), (77, 768, 768), (37, 33, 40), (300, 320, 1280), (64, 385, 23),
    (41, 1000, 530), (2049, 40, 70), (36, 1536, 1100),
]


@pytest.mark.parametrize("m,k,n", LINEAR)
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_against_float64(cpu, m, k, n, with_bias) -> None:
    rng = np.random.default_rng(m * 7 + k * 3 + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 0.1).astype(np.float16)
    b = rng.standard_normal(n).astype(np.float32) if with_bias else None
    ref = x.astype(np.float64) @ w.astype(np.float64).T + (b if b is not None else 0.0)
    scale = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T
    results = []
    for threads in (1, 2, 3):
        y, _ = linear(cpu, x, w, b, threads)
        assert y.shape == (m, n)
        err = np.abs(y - ref)
        assert (err <= bound(k, scale) + (np.abs(b) * 2.0 ** -24 if b is not None else 0)).all(), err.max()
        results.append(y)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])


def test_linear_batched_rows(cpu) -> None:
    """x with outer dimensions: every row of every batch."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 50, 96)).astype(np.float32)
    w = (rng.standard_normal((33, 96)) * 0.1).astype(np.float16)
    y, _ = linear(cpu, x, w, None, 2)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    assert y.shape == (2, 3, 50, 33)
    assert (np.abs(y - ref) <= bound(96, np.abs(x) @ np.abs(w).astype(np.float64).T)).all()


def test_linear_below_32_rows_keeps_ggmls_product(cpu) -> None:
    """Fewer than 32 rows of x do not pay for packing the whole weight: ggml's product."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((48, 64)) * 0.1).astype(np.float16)
    for rows, op in ((31, "MUL_MAT"), (32, "CUSTOM")):
        x = rng.standard_normal((rows, 64)).astype(np.float32)
        y, ops = linear(cpu, x, w, None, 2, profile=True)
        assert op in ops and (op == "CUSTOM") == (ops == ["CUSTOM"])
        np.testing.assert_allclose(y, x @ w.astype(np.float32).T, rtol=0, atol=2e-3 * np.abs(y).max())


def test_linear_uses_the_op_unless_forbidden(cpu) -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((40, 64)).astype(np.float32)
    w = (rng.standard_normal((48, 64)) * 0.1).astype(np.float16)
    y, ops = linear(cpu, x, w, None, 2, profile=True)
    assert ops == ["CUSTOM"]
    G.set_fma_gemm(False)
    try:
        assert not G.fma_gemm()
        y_ggml, ops = linear(cpu, x, w, None, 2, profile=True)
    finally:
        G.set_fma_gemm(True)
    assert "MUL_MAT" in ops
    # ggml's f16 product rounds x to f16 as well: equal within that rounding
    np.testing.assert_allclose(y, y_ggml, rtol=0, atol=2e-3 * np.abs(y).max())


def conv_ref(x, w, stride, pad, dil):
    """Cross-correlation in float64 (pairs are (y, x)), and the same with |x| and |w|."""
    n, c, h, wd = x.shape
    oc, _, kh, kw = w.shape
    (sy, sx), (py, px), (dy, dx) = stride, pad, dil
    oh = (h + 2 * py - dy * (kh - 1) - 1) // sy + 1
    ow = (wd + 2 * px - dx * (kw - 1) - 1) // sx + 1
    out = np.zeros((n, oc, oh, ow))
    scale = np.zeros_like(out)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (py, py), (px, px)))
    w64 = w.astype(np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dy:i * dy + sy * (oh - 1) + 1:sy, j * dx:j * dx + sx * (ow - 1) + 1:sx]
            out += np.einsum("nchw,oc->nohw", patch, w64[:, :, i, j])
            scale += np.einsum("nchw,oc->nohw", np.abs(patch), np.abs(w64[:, :, i, j]))
    return out, scale


def conv(cpu, x, w, b, stride, pad, dil, threads: int, wdtype: str):
    g = gr.new_graph([cpu], n_threads=threads)
    xi, wi = g.input("x", x.shape), g.input("w", w.shape, wdtype)
    bi = g.input("b", b.shape) if b is not None else None
    g.output("y", gr.conv2d(g, xi, wi, bi, stride, pad, dil, method="fma"))
    g.set_input("x", x)
    g.set_input("w", w)
    if b is not None:
        g.set_input("b", b)
    g.compute()
    return g.get_output("y")


# (N, IC, OC, H, W, kernel, stride, padding, dilation): output rows that are not a multiple of
# 16 pixels (groups cross rows and images), rows of 16 and 32 (whole groups; the padding's
# partial groups), channel counts off the micro-kernel's 6 rows, depths of several chunks
CONVS = [
    (1, 20, 5, 9, 11, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 35, 13, 9, 11, (3, 3), (2, 2), (1, 1), (1, 1)),
    (1, 17, 7, 9, 11, (3, 2), (2, 1), (0, 1), (1, 2)),
    (2, 16, 40, 8, 8, (1, 1), (1, 1), (0, 0), (1, 1)),
    (2, 64, 70, 16, 16, (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 3, 1, 20, 32, (3, 3), (1, 1), (1, 1), (1, 1)),
    (2, 40, 12, 7, 5, (5, 5), (1, 1), (2, 2), (1, 1)),
    (1, 300, 100, 6, 6, (3, 3), (1, 1), (1, 1), (1, 1)),
    (3, 8, 9, 5, 40, (3, 3), (1, 1), (1, 1), (1, 1)),
    (1, 4, 6, 33, 17, (4, 4), (2, 2), (1, 1), (1, 1)),
]


@pytest.mark.parametrize("n,ic,oc,h,w,k,s,p,d", CONVS)
@pytest.mark.parametrize("wdtype", ["f16", "f32"])
def test_conv_against_float64(cpu, n, ic, oc, h, w, k, s, p, d, wdtype) -> None:
    rng = np.random.default_rng(ic * 100 + oc * 10 + w)
    x = rng.standard_normal((n, ic, h, w)).astype(np.float32)
    kern = (rng.standard_normal((oc, ic, *k)) * 0.2).astype(np.float16 if wdtype == "f16" else np.float32)
    b = rng.standard_normal(oc).astype(np.float32) if oc % 2 else None  # with and without a bias
    ref, scale = conv_ref(x, kern, s, p, d)
    if b is not None:
        ref += b[:, None, None]
    depth = ic * k[0] * k[1]
    results = []
    for threads in (1, 2, 3):
        y = conv(cpu, x, kern, b, s, p, d, threads, wdtype)
        assert y.shape == ref.shape
        err = np.abs(y - ref)
        assert (err <= bound(depth, scale) + (np.abs(b)[:, None, None] * 2.0 ** -24 if b is not None else 0)).all(), \
            err.max()
        results.append(y)
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])


def test_environment_setting() -> None:
    """SDPLAN_FMA_GEMM is read by the kernel choice (sdplan.core.runtime.kernels) alone."""
    from sdplan.core.errors import InvalidArgument
    from sdplan.core.runtime import kernels

    before = kernels.current(G)
    try:
        off = kernels.choose(G, {"SDPLAN_FMA_GEMM": "off"})
        assert not off.fma_gemm and off.why["fma_gemm"] == "SDPLAN_FMA_GEMM=off"
        assert kernels.choose(G, {"SDPLAN_FMA_GEMM": ""}).fma_gemm == bool(G.cpu_avx2_fma())  # empty: auto
        assert kernels.choose(G, {"SDPLAN_FMA_GEMM": " ON "}).fma_gemm == bool(G.cpu_avx2_fma())
        kernels.apply(G, off)
        assert not G.fma_gemm() and not kernels.current(G).fma_gemm
        with pytest.raises(InvalidArgument, match=r"^SDPLAN_FMA_GEMM='fast': expected on or off \(1 or 0\)$"):
            kernels.choose(G, {"SDPLAN_FMA_GEMM": "fast"})
    finally:
        kernels.apply(G, before)
    assert G.fma_gemm() == before.fma_gemm


def test_devices_line_names_the_products() -> None:
    from sdplan.core.commands.devices import _feature_line

    feat = {"ggml_version": "0.20.2", "rpc": True, "llamafile": True, "cpu_features": {"AVX2": "1"},
            "bf16_kernel": "off", "fma_gemm": True}
    # the bf16 kernel off: its parenthesis names the products, once
    assert _feature_line(feat).endswith("sdplan bf16 kernel off (f16 weights, sdplan's FMA products)")
    feat["fma_gemm"] = False
    assert _feature_line(feat).endswith("sdplan bf16 kernel off (f16 weights, ggml's products)")
    # on a CPU with a bf16 kernel the line still says whether the FMA products run (f16 weights
    # not held in bf16, attention of modules without bf16 weights)
    feat["bf16_kernel"] = "amx"
    assert _feature_line(feat).endswith("sdplan bf16 kernel amx (UNets, DiTs, VAEs, text encoders, upscalers in bf16) · sdplan FMA products [red]no[/]")
    # and which build of the Winograd convolution runs (the VAEs' wide 3x3 convolutions)
    feat["wino_kernel"] = "avx512"
    assert _feature_line(feat).endswith("sdplan FMA products [red]no[/] · sdplan Winograd avx512")


# ---- attention (native/kernels/fma_attention.cpp)


def attention_ref(q, k, v, mask, scale):
    """softmax(scale q k^T + mask) v in float64, (B, Nq, H, Dv); a row whose keys are all masked
    gives zeros (the op's rule)."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, 1).astype(np.float64), np.repeat(v, rep, 1).astype(np.float64)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) * scale
    if mask is not None:
        s = s + mask
    top = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = p.sum(-1, keepdims=True)
    p = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    return np.einsum("bhqk,bhkd->bqhd", p, v)


# (B, Hq, Hk, Nq, Nk, D, Dv, mask): SD's 40-wide heads, one key block (240) and several with
# tails, grouped heads, head widths off 6 and 8, value widths other than the keys', masks that
# hide whole key blocks and whole rows
ATTENTION = [
    (2, 2, 2, 50, 50, 40, 40, None),
    (1, 4, 4, 64, 77, 64, 64, None),
    (1, 4, 2, 33, 20, 128, 128, "random"),
    (1, 1, 1, 100, 37, 80, 80, "causal"),
    (1, 2, 2, 70, 600, 24, 17, "blocks"),
    (2, 1, 1, 17, 481, 7, 9, "rows"),
]


@pytest.mark.parametrize("b,hq,hk,nq,nk,d,dv,masked", ATTENTION)
def test_attention_against_float64(cpu, b, hq, hk, nq, nk, d, dv, masked) -> None:
    rng = np.random.default_rng(nq * 3 + nk + d)
    q = rng.standard_normal((b, hq, nq, d)).astype(np.float32)
    k = rng.standard_normal((b, hk, nk, d)).astype(np.float32)
    v = rng.standard_normal((b, hk, nk, dv)).astype(np.float32)
    mask = None
    if masked == "random":
        mask = np.where(rng.random((nq, nk)) < 0.3, -np.inf, rng.standard_normal((nq, nk))).astype(np.float32)
    elif masked == "causal":
        mask = np.triu(np.full((nq, nk), -np.inf, np.float32), 1)
    elif masked == "blocks":  # even rows see only the keys after the first two blocks of 240
        mask = np.zeros((nq, nk), np.float32)
        mask[0::2, :480] = -np.inf
        mask[1::4, 240:] = -np.inf  # every fourth row only the first block
    elif masked == "rows":  # rows with no key at all give zeros
        mask = np.zeros((nq, nk), np.float32)
        mask[3] = -np.inf
        mask[10, :470] = -np.inf
    scale = 1.0 / np.sqrt(d)
    ref = attention_ref(q, k, v, mask, scale)
    results = []
    for threads in (1, 2, 3):
        g = gr.new_graph([cpu], n_threads=threads)
        ins = [g.input("q", q.shape), g.input("k", k.shape), g.input("v", v.shape)]
        mi = g.input("m", mask.shape) if mask is not None else None
        g.output("o", g.flash_attn(*ins, mi, scale))
        for name, arr in (("q", q), ("k", k), ("v", v), ("m", mask)):
            if arr is not None:
                g.set_input(name, arr)
        ops = [r[0] for r in g.profile()]
        assert ops == ["CUSTOM"]
        o = g.get_output("o")
        assert o.shape == ref.shape
        err = np.abs(o - ref).max()
        assert err <= 1e-5 * np.abs(v).max(), err
        results.append(o)
    if masked == "rows":
        assert not results[0][:, 3].any()
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])


def test_attention_probabilities_to_f32_precision(cpu) -> None:
    """Two keys with values 1 and 0: each query's output is its first probability,
    sigmoid(score difference), over differences from -20 to 20. exp2's polynomial (relative
    error 2.4e-7) and the f32 scaling keep it within 2e-6 of itself (a polynomial one degree
    short is off by about 4e-5)."""
    diff = np.linspace(-20, 20, 4001).astype(np.float32)
    q = diff.reshape(1, 1, -1, 1)
    k = np.array([1.0, 0.0], np.float32).reshape(1, 1, 2, 1)
    v = np.array([1.0, 0.0], np.float32).reshape(1, 1, 2, 1)
    g = gr.new_graph([cpu], n_threads=2)
    ins = [g.input("q", q.shape), g.input("k", k.shape), g.input("v", v.shape)]
    g.output("o", g.flash_attn(*ins, None, 1.0))
    for name, arr in (("q", q), ("k", k), ("v", v)):
        g.set_input(name, arr)
    g.compute()
    o = g.get_output("o").reshape(-1).astype(np.float64)
    p = 1.0 / (1.0 + np.exp(-diff.astype(np.float64)))
    rel = np.abs(o - p) / p
    assert rel.max() <= 2e-6, rel.max()
