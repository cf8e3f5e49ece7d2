"""conv_2d's Winograd path on the CPU (F(2x2, 3x3) below 32 pixels wide, F(4x4, 3x3) from 32)
against a float64 numpy convolution: several tile blocks per row, odd sizes, channel counts
that fill no kernel panel, batches, threads; and that ``auto`` takes it for wide images on
AVX2/FMA CPUs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
from sdplan.core.runtime import graph as gr  # noqa: E402


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


FAST_CPU = {"avx2", "fma"} <= _cpu_flags()


@pytest.fixture(scope="module")
def mgr():
    m = G.BackendManager(2)
    yield m
    m.close()


def conv3x3_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Stride 1, padding 1 cross-correlation in float64: x (N, IC, H, W), w (OC, IC, 3, 3)."""
    n, _, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j].astype(np.float64))
    return out


def run_conv(mgr, x: np.ndarray, w: np.ndarray, method: str, threads: int = 1, wdtype: str = "f32",
             profile: bool = False, bias: np.ndarray | None = None):
    g = gr.new_graph([mgr.get("CPU")], n_threads=threads)
    xi, wi = g.input("x", x.shape), g.input("w", w.shape, wdtype)
    bi = g.input("b", bias.shape, wdtype) if bias is not None else None
    g.output("y", gr.conv2d(g, xi, wi, bi, padding=1, method=method))
    g.set_input("x", x)
    g.set_input("w", w.astype(np.float16) if wdtype == "f16" else w)
    if bias is not None:
        g.set_input("b", bias.astype(np.float16) if wdtype == "f16" else bias)
    rows = g.profile() if profile else (g.compute() or [])
    return np.array(g.get_output("y")), [r[0] for r in rows]


@pytest.mark.parametrize("n,ic,oc,h,w", [
    # F(2x2, 3x3) below 32 pixels wide
    (2, 20, 21, 9, 29),    # batch, output channels past one 16-wide panel, odd width
    (1, 33, 40, 5, 30),    # odd channel counts
    (1, 3, 17, 1, 2),      # a single tile, mostly padding
    (3, 4, 16, 41, 31),    # narrow rows: blocks of two whole tile rows, the last one alone
    # from 32 pixels wide F(4x4, 3x3)
    (2, 20, 21, 9, 37),    # the same at 37 pixels: 10 tiles per row, the last partial
    (1, 33, 40, 5, 34),
    (1, 8, 16, 70, 67),    # two tile blocks per row, the second partial; odd height and width
    (2, 16, 16, 9, 64),    # exactly 16 tiles per row: blocks of two rows, a partial last tile row
    (1, 5, 18, 7, 150),    # two blocks of tiles per row (32 + 6), widths not a multiple of 4
])
@pytest.mark.parametrize("wdtype", ["f32", "f16"])
def test_winograd_matches_reference(mgr, n, ic, oc, h, w, wdtype) -> None:
    rng = np.random.default_rng(n * 1000 + ic * 10 + h)
    x = rng.standard_normal((n, ic, h, w)).astype(np.float32)
    k = (rng.standard_normal((oc, ic, 3, 3)) * 0.2).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    if wdtype == "f16":  # the reference sees the rounded kernel and bias
        k, b = k.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)
    ref = conv3x3_ref(x, k) + b[:, None, None]
    y, _ = run_conv(mgr, x, k, "winograd", wdtype=wdtype, bias=b)
    assert y.shape == ref.shape
    # f32 arithmetic throughout (the kernel transform too): far tighter than the f16 columns
    # of the im2col paths
    assert np.abs(y - ref).max() <= 2e-5 * max(1.0, np.abs(ref).max())


def test_winograd_threads_and_repeats_agree(mgr) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 24, 12, 130)).astype(np.float32)
    k = (rng.standard_normal((32, 24, 3, 3)) * 0.1).astype(np.float32)
    one, _ = run_conv(mgr, x, k, "winograd", threads=1)
    two, _ = run_conv(mgr, x, k, "winograd", threads=2)
    # each output is computed by one thread in the same order whatever the split
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, conv3x3_ref(x, k), rtol=0, atol=1e-4)


@pytest.mark.skipif(not FAST_CPU, reason="auto takes winograd only on AVX2/FMA CPUs")
def test_auto_takes_winograd_for_wide_images(mgr) -> None:
    rng = np.random.default_rng(3)
    k = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    wide = rng.standard_normal((1, 8, 4, 32)).astype(np.float32)
    narrow = rng.standard_normal((1, 8, 4, 30)).astype(np.float32)
    y, ops = run_conv(mgr, wide, k, "auto", profile=True)
    # no column matrix product: the kernel transform and the fused Winograd op
    assert "MUL_MAT" not in ops and ops.count("CUSTOM") == 2
    assert np.abs(y - conv3x3_ref(wide, k)).max() <= 2e-5 * np.abs(y).max()

    def column_path(ops: list[str]) -> bool:
        """ggml's column product (cpu_im2col, im2col) or the FMA product's single op."""
        return "MUL_MAT" in ops if not G.fma_gemm() else ops == ["CUSTOM"]

    _, ops = run_conv(mgr, narrow, k, "auto", profile=True)
    assert column_path(ops)
    # fewer than 16 output channels: the column path too
    _, ops = run_conv(mgr, wide, k[:8], "auto", profile=True)
    assert column_path(ops)


@pytest.mark.parametrize("method", ["winograd", "cpu_im2col", "im2col", "fma"])
def test_bias_added_once_by_every_path(mgr, method) -> None:
    if method == "fma" and not G.fma_gemm():
        pytest.skip("this CPU does not run the FMA product")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 6, 5, 70)).astype(np.float32)
    k = (rng.standard_normal((20, 6, 3, 3)) * 0.2).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32) * 3
    y, _ = run_conv(mgr, x, k, method, bias=b)
    np.testing.assert_allclose(y, conv3x3_ref(x, k) + b[:, None, None], rtol=0, atol=2e-3)


def test_bias_shape_checked(mgr) -> None:
    g = gr.new_graph([mgr.get("CPU")])
    w, x = g.input("w", (4, 3, 3, 3)), g.input("x", (1, 3, 8, 8))
    with pytest.raises(ValueError, match="conv_2d: bias must be"):
        g.conv_2d(w, x, (1, 1), (1, 1), bias=g.input("b", (5,)))


@pytest.mark.parametrize("n,h,w", [(2, 16, 16), (1, 30, 22), (3, 9, 17), (2, 14, 26), (2, 9, 32), (1, 13, 44),
                                   (3, 5, 50)])
def test_winograd_rows_back_to_back(mgr, n, h, w) -> None:
    """Rows narrower than the micro-kernel's 16 tiles (8 to 15 tiles of 2, or of 4 from 32
    pixels wide) are packed back to
    back in a block: several rows per block, the block's last group partial; every thread count
    gives the same values (each output computed in the same order whatever the blocks)."""
    rng = np.random.default_rng(n * 100 + h + w)
    x = rng.standard_normal((n, 24, h, w)).astype(np.float32)
    k = (rng.standard_normal((20, 24, 3, 3)) * 0.2).astype(np.float32)
    b = rng.standard_normal(20).astype(np.float32)
    ref = conv3x3_ref(x, k) + b[:, None, None]
    outs = [run_conv(mgr, x, k, "winograd", threads=t, bias=b)[0] for t in (1, 2, 3)]
    assert np.abs(outs[0] - ref).max() <= 2e-5 * np.abs(ref).max()
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


@pytest.mark.skipif(G.wino_kernel() != "avx512", reason="the AVX-512 path needs an AVX-512F CPU")
@pytest.mark.parametrize("n,ic,oc,h,w,wdtype", [
    (2, 20, 21, 9, 29, "f32"),    # F(2x2): a partial second panel, odd width
    (2, 20, 21, 9, 37, "f32"),    # F(4x4): the same, 10 tiles per row
    (1, 8, 16, 70, 67, "f16"),    # F(4x4): two blocks per row, the second partial
    (1, 33, 40, 5, 34, "f32"),    # odd channel counts
    (3, 4, 16, 41, 31, "f16"),    # rows back to back in a block
    (1, 64, 48, 64, 64, "f32"),   # F(4x4), three panels, whole blocks
    (2, 24, 20, 14, 26, "f32"),   # F(2x2), rows of 13 tiles back to back
    (1, 32, 40, 36, 40, "f16"),   # f16 kernels gathered 16 x 16 in registers, a partial third panel
    (1, 48, 16, 10, 20, "f16"),   # the same for F(2x2)
])
def test_avx512_path_gives_the_avx2_bits(mgr, n, ic, oc, h, w, wdtype) -> None:
    """The AVX-512 micro-kernel (16 channels x 16 tiles) and transforms sum every product in the
    AVX2 path's order: the same bits, at 1 and 2 threads, and within the f32 bound of the
    float64 reference."""
    rng = np.random.default_rng(n * 7 + ic + h * w)
    x = rng.standard_normal((n, ic, h, w)).astype(np.float32)
    k = (rng.standard_normal((oc, ic, 3, 3)) * 0.2).astype(np.float32)
    b = rng.standard_normal(oc).astype(np.float32)
    try:
        wide = [run_conv(mgr, x, k, "winograd", threads=t, wdtype=wdtype, bias=b)[0] for t in (1, 2)]
        G.set_wino_avx512(False)
        assert G.wino_kernel() == "avx2"
        narrow = [run_conv(mgr, x, k, "winograd", threads=t, wdtype=wdtype, bias=b)[0] for t in (1, 2)]
    finally:
        G.set_wino_avx512(True)
    for a, c in zip(wide, narrow, strict=True):
        np.testing.assert_array_equal(a, c)
    if wdtype == "f16":
        k, b = k.astype(np.float16).astype(np.float32), b.astype(np.float16).astype(np.float32)
    ref = conv3x3_ref(x, k) + b[:, None, None]
    assert np.abs(wide[0] - ref).max() <= 2e-5 * max(1.0, np.abs(ref).max())
