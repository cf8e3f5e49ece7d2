"""The Z-Image DiT against diffusers' ZImageTransformer2DModel: configuration from shapes,
patch order and position ids written out by hand, the velocity on a latent with padded
image tokens and on a non-square one, its 4 main layers split over two backends, flash
attention, and the file as a Q8_0 GGUF."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import write_gguf
from sdplan.core.models.base import ModelLayoutError
from sdplan.core.models.z_image import (
    ZImageDiT,
    padded,
    patchify,
    position_ids,
    unpatchify,
    z_image_config,
)
from zimage_util import DIT, ref, rel_err

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.pipelines.stages.flow_dit import shapes as _shapes  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402

R = ref()
TOL = 2e-3
SHAPES = _shapes(DIT)
F32 = {"x_pad_token": "f32", "cap_pad_token": "f32"}


def test_config_from_shapes() -> None:
    c = z_image_config(SHAPES)
    assert (c.prefix, c.channels, c.width, c.heads, c.kv_heads, c.head_dim) == ("", 16, 32, 2, 2, 16)
    assert (c.ffn, c.context, c.adaln, c.n_layers, c.n_noise_refiner, c.n_context_refiner, c.axes) == \
        (85, 32, 32, 4, 2, 2, (4, 6, 6))
    assert z_image_config({"model.diffusion_model." + k: v for k, v in SHAPES.items()}).prefix == "model.diffusion_model."
    dit = ZImageDiT(c)
    assert dit.n_blocks == 4 and dit.block_tensors(3)[0] == "layers.3.attention.qkv.weight"
    listed = set(dit.other_tensors()) | {n for i in range(4) for n in dit.block_tensors(i)}
    assert listed == set(SHAPES)  # every tensor of the file, once
    with pytest.raises(ModelLayoutError, match="axes"):
        z_image_config(SHAPES, (4, 4, 6))
    with pytest.raises(ModelLayoutError, match="no Z-Image DiT"):
        z_image_config({"x.weight": (1,)})


def test_patch_order_and_positions() -> None:
    lat = np.arange(2 * 4 * 6, dtype=np.float32).reshape(1, 2, 4, 6)
    p = patchify(lat)
    assert p.shape == (1, 6, 8)
    for r in range(2):
        for c in range(3):
            for dy in range(2):
                for dx in range(2):
                    for ch in range(2):  # features in (dy, dx, channel) order
                        assert p[0, r * 3 + c, (dy * 2 + dx) * 2 + ch] == lat[0, ch, 2 * r + dy, 2 * c + dx]
    np.testing.assert_array_equal(unpatchify(p, 4, 6), lat)
    ids = position_ids(10, 4, 6)  # 10 -> 32 text tokens, 6 -> 32 image tokens
    assert ids.shape == (64, 3) and padded(10) == 32 and padded(32) == 32
    np.testing.assert_array_equal(ids[:32, 0], np.arange(1, 33))
    assert ids[32].tolist() == [33, 0, 0] and ids[37].tolist() == [33, 1, 2]
    assert not ids[38:].any()  # image pad tokens at the origin
    with pytest.raises(ValueError, match="even H and W"):
        patchify(np.zeros((1, 16, 5, 4)))


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


def velocity(pool, case: str, path=DIT, ranges=(), flash=False) -> np.ndarray:
    dit = ZImageDiT.from_weights(_shapes(path), flash=flash)
    pl = ModulePlacement(("CPU", "CPU1") if ranges else ("CPU",), ranges)
    r = ModuleRunner(dit, WeightFile(path, dtypes=F32), pl, pool, n_threads=1)
    try:
        ins = dit.inputs(R[f"dit_{case}.latent"], R[f"dit_{case}.context"], float(R[f"dit_{case}.sigma"][0]))
        out = r.run(ins)["out"]
    finally:
        r.release()
    lat = R[f"dit_{case}.latent"]
    return unpatchify(out, lat.shape[2], lat.shape[3])


@pytest.mark.parametrize("case", ["a", "b"])
def test_velocity_matches_diffusers(pool, case) -> None:
    out = velocity(pool, case)
    assert rel_err(out, R[f"dit_{case}.out"]) < TOL


def test_split_and_flash_equal_one_device(pool) -> None:
    one = velocity(pool, "a")
    split = velocity(pool, "a", ranges=(BlockRange("CPU", 0, 1), BlockRange("CPU1", 2, 3)))
    np.testing.assert_allclose(split, one, atol=1e-5)
    flash = velocity(pool, "a", flash=True)
    assert rel_err(flash, R["dit_a.out"]) < 5e-3  # f16 K/V in ggml's flash kernel


def test_q8_0_gguf(pool, tmp_path) -> None:
    path = tmp_path / "z_image_tiny-Q8_0.gguf"
    write_gguf(DIT, path, "q8_0")
    out = velocity(pool, "b", path)
    assert 0 < rel_err(out, R["dit_b.out"]) < 6e-2  # Q8_0 weights (pad tokens too), f32 reference


def test_bad_inputs() -> None:
    dit = ZImageDiT.from_weights(SHAPES)
    with pytest.raises(ValueError, match="context must be"):
        dit.inputs(R["dit_a.latent"], np.zeros((1, 4, 16)), 0.5)
    with pytest.raises(ValueError, match="channels"):
        dit.inputs(np.zeros((1, 4, 8, 8)), R["dit_a.context"], 0.5)
