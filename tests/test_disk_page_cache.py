"""Disk residency leaves no copy of a module's weights in RAM: once a run (or a session) of a
module whose params are on ``disk`` ends, the file's pages of its tensors are out of the page
cache (``posix_fadvise(POSIX_FADV_DONTNEED)``), while resident weights keep theirs. Page-cache
residency is read with ``mincore(2)`` on a shared mapping of the file (Linux)."""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
from sdplan.core.models.blockstack import BlockStack, BlockStackConfig, write_model  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and fadvise: Linux")

CFG = BlockStackConfig(n_blocks=6, dim=256, heads=4, ffn=1024, d_in=16, d_out=16)  # about 19 MB of f32


def cached_fraction(path: Path, spans: list[tuple[int, int]]) -> float:
    """Fraction of the pages of ``spans`` (offset, length) that are in the page cache."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = path.stat().st_size
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value)
    finally:
        os.close(fd)
    try:
        vec = ctypes.create_string_buffer((size + page - 1) // page)
        assert libc.mincore(ctypes.c_void_p(addr), size, vec) == 0, ctypes.get_errno()
        resident = vec.raw  # one copy: each .raw makes a new bytes object
        pages = sum((off + n - 1) // page + 1 - off // page for off, n in spans)
        return sum(resident[off // page:(off + n - 1) // page + 1].count(1) for off, n in spans) / pages
    finally:
        libc.munmap(ctypes.c_void_p(addr), size)


def warm(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(1 << 20):
            pass


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("disk") / "stack.safetensors"
    write_model(path, CFG, seed=5)
    with open(path, "rb+") as fh:  # written back: the kernel never drops dirty pages
        os.fsync(fh.fileno())
    warm(path)
    if cached_fraction(path, [(0, path.stat().st_size)]) < 0.9:
        pytest.skip("this file system does not keep the file in the page cache")
    WeightFile(path).drop_cache(WeightFile(path).infos)
    if cached_fraction(path, [(0, path.stat().st_size)]) > 0.5:
        pytest.skip("this file system ignores POSIX_FADV_DONTNEED (tmpfs)")
    return path


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


def spans_of(wf: WeightFile, names: list[str] | None = None) -> list[tuple[int, int]]:
    return wf.file_spans(list(wf.infos) if names is None else names, gap=0)


def test_drop_cache_drops_only_the_names_given(model: Path) -> None:
    wf = WeightFile(model)
    warm(model)
    block0 = BlockStack(CFG).block_tensors(0)
    rest = [n for n in wf.infos if n not in block0]
    assert cached_fraction(model, spans_of(wf)) > 0.95
    advised = wf.drop_cache(block0)
    assert advised == sum(n for _, n in wf.file_spans(block0))
    assert advised >= wf.nbytes(block0) > 2 * mmap.PAGESIZE
    assert cached_fraction(model, spans_of(wf, block0)) < 0.1
    assert cached_fraction(model, spans_of(wf, rest)) > 0.9  # the other blocks' pages stay


@pytest.mark.parametrize("placement", [ModulePlacement(("CPU",), params_mode="disk"),
                                       ModulePlacement(("CPU", "CPU1"), (BlockRange("CPU", 0, 2),
                                                                         BlockRange("CPU1", 3, 5)), "disk")],
                         ids=["disk", "split_disk"])
def test_disk_residency_leaves_no_page_cache(model: Path, pool, placement: ModulePlacement) -> None:
    x = np.random.default_rng(1).standard_normal((1, 8, 16)).astype(np.float32)
    ref = ModuleRunner(BlockStack(CFG), WeightFile(model), ModulePlacement(("CPU",)), pool)
    want = ref.run({"x": x})["y"]
    ref.release()
    warm(model)
    wf = WeightFile(model)
    r = ModuleRunner(BlockStack(CFG), wf, placement, pool)
    with r.session():
        got = r.run({"x": x})["y"]
        assert cached_fraction(model, spans_of(wf)) > 0.9  # in use: the mapped weights are there
    assert sum(m.weights for m in r.memory().values()) == 0
    assert cached_fraction(model, spans_of(wf)) < 0.1
    np.testing.assert_array_equal(got, want)
    # a run outside a session is a session of its own
    warm(model)
    np.testing.assert_array_equal(r.run({"x": x})["y"], want)
    assert cached_fraction(model, spans_of(wf)) < 0.1


def test_resident_weights_keep_their_pages(model: Path, pool) -> None:
    x = np.random.default_rng(1).standard_normal((1, 8, 16)).astype(np.float32)
    warm(model)
    wf = WeightFile(model)
    r = ModuleRunner(BlockStack(CFG), wf, ModulePlacement(("CPU",)), pool)
    r.run({"x": x})
    assert cached_fraction(model, spans_of(wf)) > 0.9
    r.release()
