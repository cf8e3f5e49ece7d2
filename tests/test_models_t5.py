"""T5 encoder graph against the transformers reference: buckets, one device, blocks split
over two backends, disk residency."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flux_util import T5, ref, rel_err
from sdplan.core.models.base import ModelLayoutError
from sdplan.core.models.t5 import T5Encoder, relative_buckets, t5_config

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.pipelines.flux.pipeline import _shapes  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402

R = ref()
TOL = 5e-3  # f16 matrices, ggml's f16 GELU table


def bucket_loop(q: int, k: int, buckets: int = 32, max_distance: int = 128) -> int:
    """T5's bidirectional bucket of one (query, key) pair, written as a scalar loop."""
    rel = k - q
    half = buckets // 2
    base = half if rel > 0 else 0
    n = abs(rel)
    exact = half // 2
    if n < exact:
        return base + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (half - exact))
    return base + min(large, half - 1)


def test_relative_buckets_match_the_scalar_rule() -> None:
    b = relative_buckets(300)
    for q, k in [(0, 0), (0, 1), (1, 0), (0, 7), (0, 8), (9, 0), (0, 20), (0, 127), (0, 128), (299, 0), (0, 299)]:
        assert b[q, k] == bucket_loop(q, k), (q, k)
    assert b.min() == 0 and b.max() == 31


def test_config() -> None:
    c = t5_config(_shapes(T5))
    assert (c.width, c.heads, c.inner, c.d_ff, c.n_blocks, c.buckets) == (16, 2, 16, 32, 3, 32)
    prefixed = {"text_encoders.t5xxl.transformer." + k: v for k, v in _shapes(T5).items()}
    assert t5_config(prefixed).prefix == "text_encoders.t5xxl.transformer."
    with pytest.raises(ModelLayoutError, match="no T5 encoder"):
        t5_config({"x.weight": (1,)})


def test_bad_ids() -> None:
    enc = T5Encoder.from_weights(_shapes(T5))
    with pytest.raises(ValueError, match="0..32127"):
        enc.inputs(np.array([[40000]]))
    with pytest.raises(ValueError, match=r"\(1, T\)"):
        enc.inputs(np.array([1, 2]))


def test_one_device_split_and_disk() -> None:
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    pool = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    enc = T5Encoder.from_weights(_shapes(T5))
    ins = enc.inputs(R["t5_ids"])

    def runner(ranges: tuple[BlockRange, ...] = (), mode: str = "runtime") -> ModuleRunner:
        pl = ModulePlacement(("CPU", "CPU1") if ranges else ("CPU",), ranges, mode)
        return ModuleRunner(enc, WeightFile(T5), pl, pool, n_threads=1)

    one = runner().run(ins)["hidden"]
    assert rel_err(one, R["t5_hidden"]) < TOL
    split = runner((BlockRange("CPU", 0, 0), BlockRange("CPU1", 1, 2)))
    np.testing.assert_allclose(split.run(ins)["hidden"], one, atol=1e-6)
    placed = split.placed_bytes()
    assert placed["CPU1"] == sum(split.rt.nbytes(n) for i in (1, 2) for n in enc.block_tensors(i))
    assert split.memory()["CPU1"].weights >= placed["CPU1"]
    disk = runner((BlockRange("CPU", 0, 1), BlockRange("CPU1", 2, 2)), "disk")
    np.testing.assert_allclose(disk.run(ins)["hidden"], one, atol=1e-6)
    assert all(m.weights == 0 for m in disk.memory().values())
    pool.manager.close()
