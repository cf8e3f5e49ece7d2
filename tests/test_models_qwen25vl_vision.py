"""Qwen2.5-VL's vision tower and its encoder with pictures against transformers
(``tools/make_qwen_edit_fixtures.py``, the tiny Qwen2.5-VL fixture's weights): the processor's
patches, the window order and the merged picture embeddings of a non-square picture (windows cut
short at the edges) and a square one, on one device and split over two; M-RoPE's positions and
the LLM's final states over Qwen-Image-Edit-2509's template with both pictures."""

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
from sdplan.core.models.llm import (  # noqa: E402
    IMAGE_PAD,
    LLMEncoder,
    llm_config,
    mrope_positions,
    mrope_sections,
)
from sdplan.core.pipelines.stages.flow_dit import shapes  # noqa: E402
from sdplan.core.runtime.runner import BlockRange, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402

#: what the tiny tower's shapes do not say (``make_qwen_image_fixtures.py``'s VISION)
TINY = {"head_dim": 8, "full_blocks": (1,), "window": 56}
TOL = 2e-4  # f16 matrices against an f32 torch reference of the f16-rounded weights (seen: 6e-5)


def ref() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(FIX / "qwen_edit_ref.safetensors"))


R = ref()


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


# ------------------------------------------------------------------ the encoder with pictures
def encoder() -> LLMEncoder:
    """The tiny Qwen2.5-VL's LLM, heads of 8, its M-RoPE sections (1, 1, 2)."""
    return LLMEncoder(llm_config(shapes(LLM), head_dim=8), mrope=(1, 1, 2))


def grids() -> list[tuple[int, int, int]]:
    return [tuple(int(v) for v in R[f"vision_{c}.grid"]) for c in ("a", "b")]  # type: ignore[misc]


def test_mrope_positions_are_transformers() -> None:
    pos = mrope_positions(R["llm.ids"], grids())
    np.testing.assert_array_equal(pos, R["llm.pos"])
    assert pos.shape == (3, 106) and (pos[0] != pos[2]).any()  # the pictures' rows and columns differ
    with pytest.raises(ValueError, match="more pictures"):
        mrope_positions(R["llm.ids"], grids() + [(1, 2, 2)])
    with pytest.raises(ValueError, match="at 70 is not the 18 tokens of a \\(1, 6, 12\\) grid"):
        mrope_positions(R["llm.ids"], [(1, 6, 12), (1, 4, 4)])


def test_mrope_sections() -> None:
    assert mrope_sections(128) == (16, 24, 24)  # Qwen2.5-VL-7B's
    assert mrope_sections(16) == (2, 3, 3)
    assert mrope_sections(8, (1, 1, 2)) == (1, 1, 2)
    with pytest.raises(ValueError, match="do not scale to heads of 8"):
        mrope_sections(8)
    with pytest.raises(ValueError, match="summing to 4"):
        mrope_sections(8, (1, 1, 1))


def _hidden(cpus, enc: LLMEncoder, inputs: dict[str, np.ndarray]) -> np.ndarray:
    names = enc.other_tensors() + [n for i in range(enc.n_blocks) for n in enc.block_tensors(i)]
    r = ModuleRunner(enc, WeightFile(LLM, names, backend=cpus.get("CPU")), ModulePlacement(("CPU",), (), "runtime"),
                     cpus, n_threads=1)
    try:
        return r.run(inputs)["hidden"]
    finally:
        r.release()


def test_encoder_states_with_pictures_match_transformers(cpus) -> None:
    """Qwen-Image-Edit-2509's template with two pictures: the final normed states of every token
    from transformers' embeddings of the pictures and from this tower's, against
    transformers' run of the whole model; the plain positions miss it."""
    enc = encoder()
    ids = R["llm.ids"]
    assert (ids == IMAGE_PAD).sum() == 15 + 4
    want = R["llm.hidden"]
    theirs = _hidden(cpus, enc, enc.picture_inputs(ids, [R["vision_a.embeds"], R["vision_b.embeds"]], grids()))
    assert rel_err(theirs, want) < 1e-5  # f32 sums of the same f16 weights (seen: 4e-7)

    tower = VisionTower.from_weights(shapes(LLM), **TINY)
    names = tower.other_tensors() + [n for i in range(tower.n_blocks) for n in tower.block_tensors(i)]
    r = ModuleRunner(tower, weight_file(LLM, names, backend=cpus.get("CPU")), ModulePlacement(("CPU",), (), "runtime"),
                     cpus, n_threads=1)
    try:
        ours = [r.run(tower.inputs(R[f"vision_{c}.pixels"], g))["embeds"] for c, g in zip("ab", grids(), strict=True)]
    finally:
        r.release()
    inputs = enc.picture_inputs(ids, ours, grids())
    assert inputs["pos"].shape == (4 * ids.shape[1],)
    assert rel_err(_hidden(cpus, enc, inputs), want) < 1e-3

    t = ids.shape[1]
    plain = dict(inputs, pos=np.concatenate([np.tile(np.arange(t, dtype=np.int32), 3), np.zeros(t, np.int32)]))
    assert rel_err(_hidden(cpus, enc, plain), want) > 1e-2
    text = _hidden(cpus, enc, enc.inputs(ids))  # the pad tokens' own embeddings: not the pictures
    assert rel_err(text, want) > 1e-2


def test_picture_inputs_refuse_a_mismatch() -> None:
    enc = encoder()
    with pytest.raises(ValueError, match="not of the LLM's width 16"):
        enc.picture_inputs(R["llm.ids"], [np.zeros((15, 8)), np.zeros((4, 8))], grids())
    with pytest.raises(ValueError, match="more runs of picture tokens"):
        enc.picture_inputs(R["llm.ids"], [R["vision_a.embeds"]], grids()[:1])
