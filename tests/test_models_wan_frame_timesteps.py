"""The Wan DiT with a timestep per latent frame (Wan 2.2 TI2V-5B's image to video) against
diffusers' ``WanTransformer3DModel`` called with one timestep per token (the fixture's
reference: frame 0 at 0, frame 1 at 700, as ``WanImageToVideoPipeline`` with ``expand_timesteps``
calls it); the same on one device and with the blocks split over two backends; equal timesteps
give the single-timestep graph's output; a count of frame sigmas that is not the frames'
refused."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import rel_err
from safetensors.numpy import load_file
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.wan import WanDiT, head_dim_of, weight_file
from sparse_writer import FIXTURES

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement, ModuleRunner  # noqa: E402

PATH = FIXTURES / "wan_ti2v_tiny.safetensors"
R = load_file(str(FIXTURES / "wan_ti2v_i2v_ref.safetensors"))
TOL = 5e-3  # f16 matrices, ggml's f16 GELU table (as the other Wan DiT tests)



@pytest.fixture(scope="module")
def setup():
    model = WanDiT.from_weights({t.name: tuple(t.shape) for t in read_tensor_file(PATH).tensors},
                                head_dim_of(read_tensor_file(PATH).metadata))
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    pool = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    names = model.other_tensors() + [n for i in range(model.n_blocks) for n in model.block_tensors(i)]

    def runner(ranges: tuple[BlockRange, ...] = ()) -> ModuleRunner:
        pl = ModulePlacement(("CPU", "CPU1") if ranges else ("CPU",), ranges, "runtime")
        return ModuleRunner(model, weight_file(PATH, names), pl, pool, n_threads=1)

    yield model, runner
    pool.manager.close()


def test_frame_timesteps_against_diffusers(setup) -> None:
    model, runner = setup
    lat, ctx = R["dit.latent"], R["dit.context"]
    ins = model.inputs(lat, ctx, 0.0, frame_sigmas=R["dit.timestep"] / 1000.0)
    assert ins["t"].shape == (2,)
    one = model.velocity(runner().run(ins)["out"], lat.shape)
    assert one.shape == R["dit.out"].shape == (1, 48, 2, 4, 6)
    assert rel_err(one, R["dit.out"]) < TOL
    split = runner((BlockRange("CPU", 0, 0), BlockRange("CPU1", 1, 1)))
    np.testing.assert_allclose(model.velocity(split.run(ins)["out"], lat.shape), one, atol=1e-5)
    # each frame's output depends on its own timestep: the picture's frame at 0 is not frame 1's
    same = model.velocity(runner().run(model.inputs(lat, ctx, 0.7))["out"], lat.shape)
    assert rel_err(one[:, :, 0], same[:, :, 0]) > 0.05


def test_equal_frame_timesteps_are_the_single_timestep(setup) -> None:
    model, runner = setup
    lat, ctx = R["dit.latent"], R["dit.context"]
    r = runner()
    single = model.velocity(r.run(model.inputs(lat, ctx, 0.7))["out"], lat.shape)
    per_frame = model.velocity(r.run(model.inputs(lat, ctx, 0.0, frame_sigmas=np.array([0.7, 0.7])))["out"],
                               lat.shape)
    np.testing.assert_allclose(per_frame, single, atol=1e-5)


def test_frame_sigma_count_checked(setup) -> None:
    model, _ = setup
    with pytest.raises(ValueError, match="one per patch frame"):
        model.inputs(R["dit.latent"], R["dit.context"], 0.0, frame_sigmas=np.array([0.0, 0.5, 0.7]))
