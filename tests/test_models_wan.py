"""The Wan DiT graph against diffusers' ``WanTransformer3DModel`` (the fixture's reference): both
tiny experts on a two-frame latent video, one device, blocks split over two backends, disk
residency; patchify / unpatchify against a loop over the patches."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import rel_err
from safetensors.numpy import load_file
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.base import ModelLayoutError
from sdplan.core.models.wan import (
    WanDiT,
    head_dim_of,
    patchify,
    unpatchify,
    wan_config,
    weight_file,
)
from sparse_writer import FIXTURES

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement, ModuleRunner  # noqa: E402

LOW, HIGH = FIXTURES / "wan_tiny.safetensors", FIXTURES / "wan_high_noise_tiny.safetensors"
R = load_file(str(FIXTURES / "wan_ref.safetensors"))
TOL = 5e-3  # f16 matrices, ggml's f16 GELU table



def shapes(path):
    return {t.name: tuple(t.shape) for t in read_tensor_file(path).tensors}


def dit(path) -> WanDiT:
    return WanDiT.from_weights(shapes(path), head_dim_of(read_tensor_file(path).metadata))


def test_config_from_the_shapes() -> None:
    c = dit(LOW).cfg
    assert (c.width, c.heads, c.head_dim, c.in_channels, c.out_channels, c.patch) == (48, 2, 24, 16, 16, (1, 2, 2))
    assert (c.text, c.ffn, c.freq, c.n_blocks, c.axes) == (32, 64, 256, 2, (8, 8, 8))
    assert wan_config({"model.diffusion_model." + k: v for k, v in shapes(LOW).items()}, 24).prefix == \
        "model.diffusion_model."
    with pytest.raises(ModelLayoutError, match="head width 128"):
        wan_config(shapes(LOW))  # 48 is no multiple of the published 128
    with pytest.raises(ModelLayoutError, match="img_emb"):
        wan_config({**shapes(LOW), "img_emb.proj.1.weight": (48, 32)}, 24)


def test_patchify_round_trip_and_order() -> None:
    rng = np.random.default_rng(0)
    lat = rng.standard_normal((1, 3, 2, 4, 6)).astype(np.float32)
    p = patchify(lat, (1, 2, 2))
    # patch (f=1, r=1, c=2) of the 2 x 3 grid of frame 1 holds channel 2's 2x2 block at rows 2-3, cols 4-5
    idx = 1 * 6 + 1 * 3 + 2
    np.testing.assert_array_equal(p[0, idx, 8:12], lat[0, 2, 1, 2:4, 4:6].reshape(-1))
    # the head's values come per patch as (t, h, w, C)
    out = np.transpose(p.reshape(1, 12, 3, 4), (0, 1, 3, 2)).reshape(1, 12, 12)
    np.testing.assert_array_equal(unpatchify(out, 3, 2, 4, 6, (1, 2, 2)), lat)


@pytest.mark.parametrize("path, key", [(LOW, "dit.low"), (HIGH, "dit.high")])
def test_experts_one_device_split_and_disk(path, key) -> None:
    model = dit(path)
    lat, ctx, sigma = R["dit.latent"], R["dit.context"], float(R["dit.sigma"][0])
    ins = model.inputs(lat, ctx, sigma)
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    pool = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    names = model.other_tensors() + [n for i in range(model.n_blocks) for n in model.block_tensors(i)]

    def runner(ranges: tuple[BlockRange, ...] = (), mode: str = "runtime") -> ModuleRunner:
        pl = ModulePlacement(("CPU", "CPU1") if ranges else ("CPU",), ranges, mode)
        return ModuleRunner(model, weight_file(path, names), pl, pool, n_threads=1)

    one = model.velocity(runner().run(ins)["out"], lat.shape)
    assert one.shape == R[key].shape and rel_err(one, R[key]) < TOL
    split = runner((BlockRange("CPU", 0, 0), BlockRange("CPU1", 1, 1)))
    np.testing.assert_allclose(model.velocity(split.run(ins)["out"], lat.shape), one, atol=1e-5)
    disk = runner((BlockRange("CPU", 0, 0), BlockRange("CPU1", 1, 1)), "disk")
    np.testing.assert_allclose(model.velocity(disk.run(ins)["out"], lat.shape), one, atol=1e-5)
    pool.manager.close()


def test_bad_inputs() -> None:
    model = dit(LOW)
    with pytest.raises(ValueError, match=r"\(1, 16, F, H, W\)"):
        model.inputs(np.zeros((1, 16, 2, 3, 6), np.float32), R["dit.context"], 0.5)
    with pytest.raises(ValueError, match=r"\(1, L, 32\)"):
        model.inputs(R["dit.latent"], np.zeros((1, 4, 16), np.float32), 0.5)
