"""Contiguous copies of permuted f32 views on CPU-only graphs (native/kernels/transpose.cpp):
every permutation of 2-, 3- and 4-axis tensors, with sizes on and off the 8 x 8 blocks, equal
to numpy's transpose bit for bit (a copy moves values, it computes nothing), whatever the
threads; the blocked op runs exactly where its rule says (a view contiguous along one axis
other than the last, at least 8 along both), ggml's copy elsewhere."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
from sdplan.core.runtime import graph as gr  # noqa: E402


@pytest.fixture(scope="module")
def cpu():
    mgr = G.BackendManager(3)
    yield mgr.get("CPU")
    mgr.close()


def copy(cpu, x: np.ndarray, axes: tuple[int, ...], threads: int = 2, transpose: bool = False):
    g = gr.new_graph([cpu], n_threads=threads)
    xi = g.input("x", x.shape)
    g.output("y", g.cont(g.transpose(xi) if transpose else g.permute(xi, list(axes))))
    g.set_input("x", x)
    ops = [r[0] for r in g.profile()]
    return g.get_output("y"), ops


def blocked(shape: tuple[int, ...], axes: tuple[int, ...]) -> bool:
    """The op's rule in numpy terms: the result's last axis is strided in x (not x's last
    axis), some other result axis is x's last axis, and both have at least 8 elements."""
    last = len(shape) - 1
    return axes[-1] != last and shape[axes[-1]] >= 8 and shape[last] >= 8


SHAPES = [(2, 20, 9, 11), (1, 16, 8, 24), (3, 8, 5, 8), (2, 7, 33, 17)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("axes", list(itertools.permutations(range(4))))
def test_every_4d_permutation_is_numpys(cpu, shape, axes) -> None:
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    y, ops = copy(cpu, x, axes)
    want = np.ascontiguousarray(x.transpose(axes))
    assert y.shape == want.shape
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
    if axes != (0, 1, 2, 3):
        assert ops[-2 if ops[-1] == "RESHAPE" else -1] in ("CUSTOM", "CONT")
        assert ("CUSTOM" in ops) == blocked(shape, axes), (ops, shape, axes)


@pytest.mark.parametrize("shape,axes", [((2, 320, 64, 64), (0, 2, 3, 1)), ((2, 64, 64, 320), (0, 3, 1, 2)),
                                        ((2, 1280, 8, 8), (0, 2, 3, 1)), ((77, 768), (1, 0)),
                                        ((5, 9, 130), (2, 0, 1)), ((1, 1000, 8), (0, 2, 1))])
def test_unet_layouts_and_odd_sizes_for_any_threads(cpu, shape, axes) -> None:
    """The NCHW <-> token-row copies of SD 1.5's attention blocks, and bands of 64 (fewer
    planes than threads), bitwise equal for 1, 2 and 3 threads."""
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    want = np.ascontiguousarray(x.transpose(axes))
    for threads in (1, 2, 3):
        y, ops = copy(cpu, x, axes, threads)
        assert "CUSTOM" in ops
        assert np.array_equal(y, want)


def test_transpose_of_a_matrix(cpu) -> None:
    x = np.arange(37 * 45, dtype=np.float32).reshape(37, 45)
    y, ops = copy(cpu, x, (), transpose=True)
    assert "CUSTOM" in ops and np.array_equal(y, x.T)


def test_small_and_f16_views_stay_with_ggml(cpu) -> None:
    x = np.random.default_rng(2).standard_normal((4, 7, 5)).astype(np.float32)
    y, ops = copy(cpu, x, (0, 2, 1))  # 5 and 7: below one block
    assert "CUSTOM" not in ops and np.array_equal(y, x.transpose(0, 2, 1))
    g = gr.new_graph([cpu], n_threads=2)
    xi = g.input("x", (16, 24), "f16")
    g.output("y", g.cont(g.transpose(xi)))
    h = np.random.default_rng(3).standard_normal((16, 24)).astype(np.float16)
    g.set_input("x", h)
    assert "CUSTOM" not in [r[0] for r in g.profile()]
    assert np.array_equal(g.get_output("y"), h.T)
