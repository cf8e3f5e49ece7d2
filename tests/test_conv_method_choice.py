"""``sdplan._ggml.choose_conv_method``: the rule by which ``Graph.conv_2d`` picks its
convolution method (auto) or refuses an explicit one, over the rule's boundaries (3x3 and other
kernels, stride/padding/dilation, output widths around 32 and 64, output channels around 16,
pixels against output channels, CPU-only graphs or not, AVX2/FMA or not, the FMA product or
not); and that conv_2d on
real graphs does what the chooser says (same ops, same output as the method named explicitly;
same error messages)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
from sdplan.core.runtime import graph as gr  # noqa: E402

UNKNOWN = "conv_2d: method must be auto, im2col, cpu_im2col, winograd, direct, bf16 or fma, got '{}'"
WINO_SHAPE = ("conv_2d: method 'winograd' needs a 3x3 kernel, stride 1, padding 1, dilation 1 and a graph "
              "whose backends are all CPUs")
CPU_ONLY = "conv_2d: method 'cpu_im2col' needs a graph whose backends are all CPUs"
FMA_NEEDS = ("conv_2d: method 'fma' needs an f16 or f32 kernel, a CPU with AVX2, FMA and F16C and a graph "
             "whose backends are all CPUs")
GEOMETRY = "conv_2d: stride and dilation must be >= 1, padding >= 0"
TOO_SMALL = "conv_2d: kernel larger than padded input"
DIMS = "conv_2d: kernel, image, batch and output channels must be >= 1"

#: The Winograd request by default: 3x3, stride 1, padding 1, dilation 1, 32 wide, 16 channels.
BASE = {"method": "auto", "kernel": (3, 3), "image": (8, 32), "out_channels": 16, "all_cpu": True,
        "avx2_fma": True, "stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "batch": 1}


def choose(**changes):
    args = {**BASE, **changes}
    return G.choose_conv_method(args.pop("method"), **args)


# (changes to BASE, the method chosen)
CHOICES = [
    # auto on CPU-only graphs with AVX2/FMA: winograd from 32 pixels wide and 16 output channels
    ({}, "winograd"),
    ({"image": (8, 31)}, "cpu_im2col"),
    ({"image": (8, 33)}, "winograd"),
    ({"image": (8, 63)}, "winograd"),   # F(2x2, 3x3) below 32 pixels, F(4x4, 3x3) from 32:
    ({"image": (8, 64)}, "winograd"),   # the same method either way
    ({"image": (8, 65)}, "winograd"),
    ({"image": (1, 32)}, "winograd"),
    ({"image": (32, 8)}, "cpu_im2col"),  # the width counts, not the height
    ({"out_channels": 15}, "cpu_im2col"),
    ({"out_channels": 17}, "winograd"),
    ({"out_channels": 1280, "image": (1, 32)}, "winograd"),  # before the pixels rule (64 px < 1280/2)
    ({"avx2_fma": False}, "cpu_im2col"),
    ({"avx2_fma": False, "image": (8, 64)}, "cpu_im2col"),
    ({"all_cpu": False}, "im2col"),
    ({"all_cpu": False, "avx2_fma": False}, "im2col"),
    ({"all_cpu": False, "image": (64, 64), "out_channels": 4}, "im2col"),
    # not the Winograd shape
    ({"kernel": (1, 1), "padding": (0, 0)}, "cpu_im2col"),
    ({"kernel": (5, 5), "padding": (2, 2)}, "cpu_im2col"),
    ({"kernel": (3, 1), "padding": (1, 0)}, "cpu_im2col"),
    ({"kernel": (1, 3), "padding": (0, 1)}, "cpu_im2col"),
    ({"stride": (2, 2)}, "cpu_im2col"),
    ({"stride": (1, 2)}, "cpu_im2col"),
    ({"stride": (2, 1)}, "cpu_im2col"),
    ({"padding": (0, 0)}, "cpu_im2col"),
    ({"padding": (1, 0)}, "cpu_im2col"),
    ({"padding": (0, 1)}, "cpu_im2col"),
    ({"padding": (2, 2)}, "cpu_im2col"),
    ({"dilation": (2, 2)}, "cpu_im2col"),
    ({"dilation": (1, 2)}, "cpu_im2col"),
    ({"dilation": (2, 1)}, "cpu_im2col"),
    # cpu_im2col while the output has at least half as many pixels (batch included) as the
    # kernel has output channels, im2col below
    ({"kernel": (1, 1), "padding": (0, 0), "image": (2, 2), "out_channels": 8}, "cpu_im2col"),
    ({"kernel": (1, 1), "padding": (0, 0), "image": (2, 2), "out_channels": 9}, "im2col"),
    ({"kernel": (1, 1), "padding": (0, 0), "image": (2, 2), "out_channels": 16, "batch": 2}, "cpu_im2col"),
    ({"kernel": (1, 1), "padding": (0, 0), "image": (2, 2), "out_channels": 17, "batch": 2}, "im2col"),
    # the output's pixels: stride 2 on 8x8 leaves 4x4
    ({"kernel": (1, 1), "padding": (0, 0), "stride": (2, 2), "image": (8, 8), "out_channels": 32},
     "cpu_im2col"),
    ({"kernel": (1, 1), "padding": (0, 0), "stride": (2, 2), "image": (8, 8), "out_channels": 33},
     "im2col"),
    # the UNet's deepest level: 8x8 images, batch 2, 1280 channels
    ({"image": (8, 8), "batch": 2, "out_channels": 1280}, "im2col"),
    ({"image": (8, 8), "batch": 2, "out_channels": 256}, "cpu_im2col"),
    ({"image": (8, 8), "batch": 2, "out_channels": 257}, "im2col"),
    # explicit methods
    ({"method": "im2col"}, "im2col"),
    ({"method": "im2col", "all_cpu": False}, "im2col"),
    ({"method": "direct"}, "direct"),
    ({"method": "direct", "all_cpu": False, "kernel": (5, 5), "stride": (2, 2)}, "direct"),
    ({"method": "cpu_im2col"}, "cpu_im2col"),
    ({"method": "cpu_im2col", "kernel": (1, 1), "padding": (0, 0), "image": (1, 1),
      "out_channels": 1280}, "cpu_im2col"),
    ({"method": "winograd"}, "winograd"),
    ({"method": "winograd", "avx2_fma": False}, "winograd"),  # the generic kernel
    ({"method": "winograd", "image": (1, 1)}, "winograd"),
    ({"method": "winograd", "out_channels": 1}, "winograd"),
    ({"method": "winograd", "image": (8, 8), "batch": 2, "out_channels": 1280}, "winograd"),
    # the FMA product (f16/f32 kernels on a CPU with AVX2, FMA and F16C) takes what cpu_im2col
    # and im2col would on CPU-only graphs; winograd and bf16 keep theirs
    ({"fma": True}, "winograd"),
    ({"fma": True, "image": (8, 31)}, "fma"),
    ({"fma": True, "out_channels": 15}, "fma"),
    ({"fma": True, "image": (8, 8), "batch": 2, "out_channels": 1280}, "fma"),
    # ... from 64 output pixels, batch included (fewer do not pay for packing the whole kernel)
    ({"fma": True, "kernel": (1, 1), "padding": (0, 0), "image": (2, 2), "out_channels": 9}, "im2col"),
    ({"fma": True, "kernel": (1, 1), "padding": (0, 0), "image": (2, 2), "out_channels": 8}, "cpu_im2col"),
    ({"fma": True, "image": (4, 8), "batch": 2, "out_channels": 1280}, "fma"),
    ({"fma": True, "image": (4, 8), "batch": 1, "out_channels": 1280}, "im2col"),
    ({"fma": True, "image": (7, 9), "batch": 1, "out_channels": 16}, "cpu_im2col"),
    ({"fma": True, "stride": (2, 2)}, "fma"),
    ({"fma": True, "avx2_fma": False}, "fma"),
    ({"fma": True, "all_cpu": False}, "im2col"),
    ({"fma": True, "bf16": True, "in_channels": 4, "image": (8, 31)}, "bf16"),
    ({"fma": True, "bf16": True, "in_channels": 3, "image": (8, 31)}, "fma"),  # odd depth: not bf16
    # the F(4x4, 3x3) Winograd path before the AVX512_BF16 kernel (wino_f4_first): from 32
    # pixels wide, 16 output channels, the Winograd shape, CPU-only graphs; bf16 elsewhere
    ({"bf16": True, "in_channels": 4, "image": (8, 64), "wino_f4_first": True}, "winograd"),
    ({"bf16": True, "in_channels": 4, "image": (8, 32), "wino_f4_first": True}, "winograd"),
    ({"bf16": True, "in_channels": 4, "image": (8, 31), "wino_f4_first": True}, "bf16"),
    ({"bf16": True, "in_channels": 4, "image": (16, 16), "wino_f4_first": True}, "bf16"),
    ({"bf16": True, "in_channels": 4, "image": (8, 64)}, "bf16"),
    ({"bf16": True, "in_channels": 4, "image": (8, 64), "wino_f4_first": True, "out_channels": 15}, "bf16"),
    ({"bf16": True, "in_channels": 4, "image": (8, 130), "wino_f4_first": True, "stride": (2, 2)}, "bf16"),
    ({"bf16": True, "in_channels": 4, "image": (8, 64), "wino_f4_first": True, "all_cpu": False}, "im2col"),
    ({"bf16": True, "in_channels": 4, "image": (8, 64), "wino_f4_first": True, "avx2_fma": False}, "bf16"),
    ({"method": "bf16", "bf16": True, "in_channels": 4, "image": (8, 64), "wino_f4_first": True}, "bf16"),
    ({"method": "fma", "fma": True}, "fma"),
    ({"method": "fma", "fma": True, "kernel": (5, 5), "stride": (2, 2)}, "fma"),
    ({"method": "cpu_im2col", "fma": True, "image": (8, 31)}, "cpu_im2col"),
]

# (changes to BASE, conv_2d's error message)
ERRORS = [
    ({"method": "winograd", "all_cpu": False}, WINO_SHAPE),
    ({"method": "winograd", "kernel": (1, 1), "padding": (0, 0)}, WINO_SHAPE),
    ({"method": "winograd", "kernel": (5, 5), "padding": (2, 2)}, WINO_SHAPE),
    ({"method": "winograd", "kernel": (3, 1)}, WINO_SHAPE),
    ({"method": "winograd", "stride": (2, 2)}, WINO_SHAPE),
    ({"method": "winograd", "stride": (1, 2)}, WINO_SHAPE),
    ({"method": "winograd", "padding": (0, 0)}, WINO_SHAPE),
    ({"method": "winograd", "padding": (2, 1)}, WINO_SHAPE),
    ({"method": "winograd", "dilation": (2, 2)}, WINO_SHAPE),
    ({"method": "cpu_im2col", "all_cpu": False}, CPU_ONLY),
    ({"method": "fma"}, FMA_NEEDS),
    ({"method": "fma", "fma": True, "all_cpu": False}, FMA_NEEDS),
    ({"method": "fft"}, UNKNOWN.format("fft")),
    ({"method": ""}, UNKNOWN.format("")),
    ({"method": "Auto"}, UNKNOWN.format("Auto")),
    ({"method": "WINOGRAD"}, UNKNOWN.format("WINOGRAD")),
    ({"method": "fft", "all_cpu": False}, UNKNOWN.format("fft")),
    ({"stride": (0, 1)}, GEOMETRY),
    ({"stride": (1, 0)}, GEOMETRY),
    ({"dilation": (0, 1)}, GEOMETRY),
    ({"padding": (-1, 1)}, GEOMETRY),
    ({"padding": (1, -1)}, GEOMETRY),
    ({"method": "fft", "stride": (0, 1)}, GEOMETRY),  # the geometry first, as in conv_2d
    ({"kernel": (9, 9), "padding": (0, 0), "image": (4, 4)}, TOO_SMALL),
    ({"kernel": (3, 3), "padding": (0, 0), "image": (2, 8)}, TOO_SMALL),
    ({"method": "winograd", "kernel": (3, 3), "dilation": (2, 2), "image": (1, 32)}, TOO_SMALL),
    ({"kernel": (0, 3)}, DIMS),
    ({"image": (8, 0)}, DIMS),
    ({"out_channels": 0}, DIMS),
    ({"batch": 0}, DIMS),
]


@pytest.mark.parametrize("changes,expected", CHOICES, ids=[str(c) for c, _ in CHOICES])
def test_choice(changes, expected) -> None:
    assert choose(**changes) == expected


@pytest.mark.parametrize("changes,message", ERRORS, ids=[str(c) for c, _ in ERRORS])
def test_refusal(changes, message) -> None:
    with pytest.raises(ValueError) as err:
        choose(**changes)
    assert str(err.value) == message


def out_size(n: int, k: int, s: int, p: int, d: int) -> int:
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def documented_rule(method: str, kernel, image, out_channels, all_cpu, avx2_fma, stride, padding,
                    dilation, batch, fma=False) -> str:
    """The rule as core/runtime/graph.py documents it (valid geometry only)."""
    wino_shape = (kernel, stride, padding, dilation) == ((3, 3), (1, 1), (1, 1), (1, 1))
    ow = out_size(image[1], kernel[1], stride[1], padding[1], dilation[1])
    oh = out_size(image[0], kernel[0], stride[0], padding[0], dilation[0])
    if method == "winograd":
        return "winograd" if wino_shape and all_cpu else "refused"
    if method == "cpu_im2col":
        return "cpu_im2col" if all_cpu else "refused"
    if method == "fma":
        return "fma" if all_cpu and fma else "refused"
    if method != "auto":
        return method
    if wino_shape and all_cpu and avx2_fma and ow >= 32 and out_channels >= 16:
        return "winograd"
    if all_cpu and fma and ow * oh * batch >= 64:
        return "fma"
    return "cpu_im2col" if all_cpu and 2 * ow * oh * batch >= out_channels else "im2col"


def test_sweep_matches_the_documented_rule() -> None:
    counts: dict[str, int] = {}
    for method, kernel, stride, padding, dilation, width, height, oc, batch, cpu, avx, fma in itertools.product(
            ["auto", "winograd", "cpu_im2col", "im2col", "direct", "fma"], [(3, 3), (1, 1), (3, 1), (5, 5)],
            [(1, 1), (2, 1), (1, 2)], [(1, 1), (0, 0), (0, 1), (2, 2)], [(1, 1), (2, 1)],
            [8, 31, 32, 33, 64], [1, 4], [1, 15, 16, 17, 300], [1, 2], [True, False], [True, False],
            [True, False]):
        args = {"kernel": kernel, "image": (height, width), "out_channels": oc, "all_cpu": cpu,
                "avx2_fma": avx, "stride": stride, "padding": padding, "dilation": dilation, "batch": batch,
                "fma": fma}
        if min(out_size(height, kernel[0], stride[0], padding[0], dilation[0]),
               out_size(width, kernel[1], stride[1], padding[1], dilation[1])) < 1:
            continue
        want = documented_rule(method, **args)
        try:
            got = G.choose_conv_method(method, **args)
        except ValueError:
            got = "refused"
        assert got == want, (method, args)
        counts[got] = counts.get(got, 0) + 1
    assert set(counts) == {"winograd", "cpu_im2col", "im2col", "direct", "fma", "refused"}


# ---- conv_2d on real (CPU-only) graphs does what the chooser says


@pytest.fixture(scope="module")
def cpu():
    mgr = G.BackendManager(2)
    yield mgr.get("CPU")
    mgr.close()


def run_conv(cpu, x, w, method, stride, padding, wdtype="f32", bias=None):
    """(output, op names) of one conv_2d on a CPU-only graph."""
    g = gr.new_graph([cpu], n_threads=2)
    xi, wi = g.input("x", x.shape), g.input("w", w.shape, wdtype)
    bi = g.input("b", bias.shape) if bias is not None else None
    g.output("y", gr.conv2d(g, xi, wi, bi, stride=stride, padding=padding, method=method))
    g.set_input("x", x)
    g.set_input("w", w.astype(np.float16) if wdtype == "f16" else w)
    if bias is not None:
        g.set_input("b", bias)
    rows = g.profile()
    return np.array(g.get_output("y")), [r[0] for r in rows]


# (N, IC, OC, H, W, K, stride, padding)
GRAPHS = [
    (1, 4, 16, 3, 32, 3, 1, 1),    # winograd on AVX2/FMA CPUs
    (1, 4, 16, 3, 31, 3, 1, 1),    # one pixel too narrow: cpu_im2col
    (1, 4, 15, 3, 32, 3, 1, 1),    # one channel short: cpu_im2col
    (1, 4, 16, 2, 64, 3, 1, 1),    # winograd F(4x4, 3x3)
    (1, 2, 80, 1, 32, 3, 1, 1),    # winograd although 32 pixels < 80 / 2 channels, else im2col
    (1, 2, 80, 1, 31, 3, 1, 1),    # im2col: 31 pixels < 80 / 2
    (2, 3, 40, 1, 31, 3, 1, 1),    # cpu_im2col: 2 * 31 pixels >= 40 / 2
    (2, 3, 16, 2, 2, 1, 1, 0),     # 8 pixels, 16 channels: cpu_im2col
    (2, 3, 17, 2, 2, 1, 1, 0),     # im2col
    (1, 3, 8, 5, 6, 3, 2, 1),      # stride 2: cpu_im2col
]


@pytest.mark.parametrize("n,ic,oc,h,w,k,s,p", GRAPHS)
@pytest.mark.parametrize("wdtype", ["f32", "f16"])
def test_conv_2d_takes_the_chosen_method(cpu, n, ic, oc, h, w, k, s, p, wdtype) -> None:
    method = G.choose_conv_method("auto", kernel=(k, k), image=(h, w), out_channels=oc, all_cpu=True,
                                  avx2_fma=G.cpu_avx2_fma(), stride=(s, s), padding=(p, p), batch=n,
                                  fma=G.fma_gemm())
    rng = np.random.default_rng(n * 1000 + oc * 10 + w)
    x = rng.standard_normal((n, ic, h, w)).astype(np.float32)
    kernel = (rng.standard_normal((oc, ic, k, k)) * 0.2).astype(np.float32)
    bias = rng.standard_normal(oc).astype(np.float32)
    auto, auto_ops = run_conv(cpu, x, kernel, "auto", s, p, wdtype, bias)
    chosen, chosen_ops = run_conv(cpu, x, kernel, method, s, p, wdtype, bias)
    assert auto_ops == chosen_ops
    np.testing.assert_array_equal(auto, chosen)
    # the ops tell the methods apart: no IM2COL and no MUL_MAT in the fused Winograd and FMA
    # ops, ggml's IM2COL for im2col, custom ops and a MUL_MAT for cpu_im2col
    assert ("IM2COL" in auto_ops) == (method == "im2col")
    assert ("MUL_MAT" in auto_ops) == (method not in ("winograd", "fma"))


@pytest.mark.parametrize("n,ic,oc,h,w,k,s,p", GRAPHS)
def test_conv_2d_without_the_fma_product(cpu, n, ic, oc, h, w, k, s, p) -> None:
    """set_fma_gemm(False): the graphs take the methods of a CPU without it (and the same
    values as the FMA product within f16 rounding of the columns)."""
    if not G.fma_gemm():
        pytest.skip("this CPU does not run the FMA product")
    method = G.choose_conv_method("auto", kernel=(k, k), image=(h, w), out_channels=oc, all_cpu=True,
                                  avx2_fma=G.cpu_avx2_fma(), stride=(s, s), padding=(p, p), batch=n)
    rng = np.random.default_rng(oc * 10 + w)
    x = rng.standard_normal((n, ic, h, w)).astype(np.float32)
    kernel = (rng.standard_normal((oc, ic, k, k)) * 0.2).astype(np.float32)
    with_fma, fma_ops = run_conv(cpu, x, kernel, "auto", s, p, "f32")
    G.set_fma_gemm(False)
    try:
        assert not G.fma_gemm()
        without, ops = run_conv(cpu, x, kernel, "auto", s, p, "f32")
    finally:
        G.set_fma_gemm(True)
    assert ("MUL_MAT" in ops) == (method != "winograd")
    method_fma = G.choose_conv_method("auto", kernel=(k, k), image=(h, w), out_channels=oc, all_cpu=True,
                                      avx2_fma=G.cpu_avx2_fma(), stride=(s, s), padding=(p, p), batch=n, fma=True)
    assert ("MUL_MAT" in fma_ops) == (method_fma not in ("winograd", "fma"))
    np.testing.assert_allclose(with_fma, without, rtol=0, atol=1e-4 * np.abs(without).max())


def test_graphs_cover_every_auto_choice() -> None:
    chosen = {G.choose_conv_method("auto", kernel=(k, k), image=(h, w), out_channels=oc, all_cpu=True,
                                   avx2_fma=True, stride=(s, s), padding=(p, p), batch=n)
              for n, _, oc, h, w, k, s, p in GRAPHS}
    assert chosen == {"winograd", "cpu_im2col", "im2col"}
    with_fma = {G.choose_conv_method("auto", kernel=(k, k), image=(h, w), out_channels=oc, all_cpu=True,
                                     avx2_fma=True, stride=(s, s), padding=(p, p), batch=n, fma=True)
                for n, _, oc, h, w, k, s, p in GRAPHS}
    # the FMA product from 64 output pixels; the smallest graphs keep the column paths
    assert with_fma == {"winograd", "fma", "cpu_im2col", "im2col"}


@pytest.mark.parametrize("changes", [
    {"method": "fft"}, {"method": "winograd", "kernel": (1, 1), "padding": (0, 0)},
    {"method": "winograd", "stride": (2, 2)}, {"method": "winograd", "dilation": (2, 2)},
    {"stride": (0, 1)}, {"padding": (-1, 0)}, {"kernel": (9, 9), "padding": (0, 0), "image": (4, 4)},
])
def test_conv_2d_refuses_with_the_choosers_message(cpu, changes) -> None:
    args = {**BASE, **changes}
    with pytest.raises(ValueError) as chooser_err:
        G.choose_conv_method(args["method"], **{k: v for k, v in args.items() if k != "method"})
    g = gr.new_graph([cpu])
    (kh, kw), (h, w) = args["kernel"], args["image"]
    wi, xi = g.input("w", (args["out_channels"], 2, kh, kw)), g.input("x", (args["batch"], 2, h, w))
    with pytest.raises(ValueError) as graph_err:
        g.conv_2d(wi, xi, args["stride"], args["padding"], args["dilation"], method=args["method"])
    # conv_2d names the shapes after the chooser's message where it can
    assert str(graph_err.value).startswith(str(chooser_err.value))


def test_cpu_avx2_fma_reads_the_cpu_flags() -> None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        pytest.skip("no /proc/cpuinfo")
    flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines()
                  if line.startswith("flags")), None)
    if flags is None:
        pytest.skip("no CPU flags in /proc/cpuinfo")
    assert G.cpu_avx2_fma() == ({"avx2", "fma"} <= flags)
    G.set_fma_gemm(True)
    assert G.fma_gemm() == ({"avx2", "fma", "f16c"} <= flags)
