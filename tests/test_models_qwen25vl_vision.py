"""Qwen2.5-VL's vision tower against transformers (``tools/make_qwen_edit_fixtures.py``, the tiny
Qwen2.5-VL fixture's ``visual.*`` weights): the processor's patches, the window order and the
merged picture embeddings of a non-square picture (windows cut short at the edges) and a
square one, on one device and split over two."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import rel_err
from qwen_image_util import FIX, LLM
from sdplan.core.models.base import ModelLayoutError
from sdplan.core.models.qwen25vl_vision import (
    VisionTower,
    patchify,
    vision_config,
    weight_file,
    window_order,
)

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.pipelines.stages.flow_dit import shapes  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement, ModuleRunner  # noqa: E402

#: what the tiny tower's shapes do not say (``make_qwen_image_fixtures.py``'s VISION)
TINY = {"head_dim": 8, "full_blocks": (1,), "window": 56}
TOL = 2e-4  # f16 matrices against an f32 torch reference of the f16-rounded weights (seen: 6e-5)


def ref() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(FIX / "qwen_edit_ref.safetensors"))


R = ref()


@pytest.fixture(scope="module")
def cpus():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


def test_config_and_names() -> None:
    tower = VisionTower.from_weights(shapes(LLM), **TINY)
    c = tower.cfg
    assert (c.prefix, c.width, c.heads, c.head_dim, c.ffn, c.n_blocks, c.out_width) == ("visual.", 16, 2, 8, 24, 2, 16)
    names = tower.other_tensors() + [n for i in range(tower.n_blocks) for n in tower.block_tensors(i)]
    assert sorted(names) == sorted(n for n in shapes(LLM) if n.startswith("visual."))  # each once, all used
    with pytest.raises(ModelLayoutError, match="width 16 does not divide into heads of 80"):
        vision_config(shapes(LLM))  # the published head width
    with pytest.raises(ModelLayoutError, match="full-attention blocks"):
        vision_config(shapes(LLM), head_dim=8)
    with pytest.raises(ModelLayoutError, match="window 50"):
        vision_config(shapes(LLM), head_dim=8, full_blocks=(1,), window=50)
    with pytest.raises(ModelLayoutError, match="no Qwen2.5-VL vision tower"):
        vision_config({k: v for k, v in shapes(LLM).items() if not k.startswith("visual.")})


def test_patches_are_the_processors() -> None:
    for case in ("a", "b"):
        patches, grid = patchify(R[f"vision_{case}.picture"])
        assert grid == tuple(R[f"vision_{case}.grid"])
        np.testing.assert_allclose(patches, R[f"vision_{case}.pixels"], rtol=0, atol=2e-6)
    with pytest.raises(ValueError, match="multiples of 28"):
        patchify(np.zeros((30, 28, 3), np.uint8))


def test_window_order_cuts_the_edges() -> None:
    # a 6 x 10 patch grid: 3 x 5 merge groups, windows of 2 x 2 groups (56 pixels)
    order, wid = window_order((1, 6, 10), 56)
    assert order.tolist() == [0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14]
    assert wid.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4, 5]


@pytest.mark.parametrize("ranges", [None, (("CPU", 0, 0), ("CPU1", 1, 1))])
def test_embeddings_match_transformers(cpus, ranges) -> None:
    """The merged embeddings of both pictures, on one CPU and split block 0 | block 1 over two."""
    tower = VisionTower.from_weights(shapes(LLM), **TINY)
    names = tower.other_tensors() + [n for i in range(tower.n_blocks) for n in tower.block_tensors(i)]
    devices = ("CPU", "CPU1") if ranges else ("CPU",)
    pl = ModulePlacement(devices, tuple(BlockRange(*r) for r in ranges or ()), "runtime")
    r = ModuleRunner(tower, weight_file(LLM, names, backend=cpus.get("CPU")), pl, cpus, n_threads=1)
    try:
        for case in ("a", "b"):
            grid = tuple(int(v) for v in R[f"vision_{case}.grid"])
            out = r.run(tower.inputs(R[f"vision_{case}.pixels"], grid))["embeds"]
            want = R[f"vision_{case}.embeds"]
            assert out.shape == want.shape
            assert rel_err(out, want) < TOL
    finally:
        r.release()


def test_windows_matter(cpus) -> None:
    """Every block attending over the whole picture (no mask input) misses the reference of the
    picture with several windows, and matches that of the picture in one window."""
    tower = VisionTower.from_weights(shapes(LLM), **dict(TINY, full_blocks=(0, 1)))
    names = tower.other_tensors() + [n for i in range(tower.n_blocks) for n in tower.block_tensors(i)]
    r = ModuleRunner(tower, weight_file(LLM, names, backend=cpus.get("CPU")), ModulePlacement(("CPU",), (), "runtime"),
                     cpus, n_threads=1)
    try:
        errs = {}
        for case in ("a", "b"):
            inputs = tower.inputs(R[f"vision_{case}.pixels"], tuple(int(v) for v in R[f"vision_{case}.grid"]))
            assert "mask" not in inputs
            errs[case] = rel_err(r.run(inputs)["embeds"], R[f"vision_{case}.embeds"])
        assert errs["a"] > 10 * TOL and errs["b"] < TOL
    finally:
        r.release()


def test_bad_patches_are_refused() -> None:
    tower = VisionTower.from_weights(shapes(LLM), **TINY)
    with pytest.raises(ValueError, match="do not fit the grid"):
        tower.inputs(np.zeros((60, 1176), np.float32), (1, 6, 6))
