"""FLUX.2 DiT graph against diffusers' ``Flux2Transformer2DModel`` (``make_flux2_fixtures.py``):
the velocity on a square latent and on a non-square one with a reference latent, the config
told apart from FLUX.1 and Chroma, position ids, a layer split over two backends, a Q8_0
GGUF file of the DiT."""

from __future__ import annotations

import numpy as np
import pytest
from flux2_util import DIT, ref
from flux_util import AXES, CHROMA, DEV, rel_err, write_gguf
from sdplan.core.models.base import ModelLayoutError
from sdplan.core.models.flux2 import Flux2DiT, flux2_config, position_ids, tokens, untokens

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.pipelines.stages.flow_dit import shapes  # noqa: E402
from sdplan.core.runtime.runner import BlockRange, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402

R = ref()
TOL = 2e-3  # f16 matrices and f16 activations in mul_mat against an f32 torch reference


@pytest.fixture(scope="module")
def model() -> Flux2DiT:
    return Flux2DiT.from_weights(shapes(DIT))


def runner(pool, mod, path, ranges=None) -> ModuleRunner:
    devices = ("CPU", "CPU1") if ranges else ("CPU",)
    pl = ModulePlacement(devices, tuple(BlockRange(*r) for r in ranges or ()), "runtime")
    return ModuleRunner(mod, WeightFile(path, backend=pool.get("CPU")), pl, pool, n_threads=1)


def velocity(r, mod, case: str) -> np.ndarray:
    lat = R[f"dit_{case}.latent"]
    refs = [R[k] for k in sorted(R) if k.startswith(f"dit_{case}.ref")]
    out = r.run(mod.inputs(lat, R[f"dit_{case}.context"], float(R[f"dit_{case}.sigma"][0]), refs))["out"]
    assert out.shape[1] == lat.shape[2] * lat.shape[3] + sum(x.shape[2] * x.shape[3] for x in refs)
    return out[:, : lat.shape[2] * lat.shape[3]]


def test_config_of_the_tiny_klein(model) -> None:
    c = model.cfg
    assert (c.in_channels, c.width, c.heads, c.head_dim, c.mlp, c.context) == (128, 32, 2, 16, 96, 48)
    assert (c.n_double, c.n_single, c.guidance, c.pooled, c.axes) == (2, 2, False, 0, (4, 4, 4, 4))
    assert model.n_blocks == 4
    names = model.other_tensors() + [n for i in range(model.n_blocks) for n in model.block_tensors(i)]
    assert sorted(names) == sorted(shapes(DIT))  # every tensor used, none twice
    assert flux2_config(shapes(DIT), axes=(2, 6, 4, 4)).axes == (2, 6, 4, 4)
    with pytest.raises(ModelLayoutError, match="summing to the head width 16"):
        flux2_config(shapes(DIT), axes=(4, 4, 4))
    with pytest.raises(ModelLayoutError, match="not a FLUX.2 DiT"):
        Flux2DiT.from_weights(shapes(DEV), axes=AXES)
    with pytest.raises(ModelLayoutError, match="not a FLUX.2 DiT"):
        Flux2DiT.from_weights(shapes(CHROMA), axes=AXES)
    with pytest.raises(ModelLayoutError, match="2 heads of 16"):
        Flux2DiT.from_weights(shapes(DIT), heads=4)


def test_position_ids_and_tokens() -> None:
    ids = position_ids(3, 2, 3, [(1, 2), (2, 1)])
    assert ids.shape == (3 + 6 + 2 + 2, 4)
    assert ids[:3].tolist() == [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2]]
    assert ids[3:9].tolist() == [[0, r, c, 0] for r in range(2) for c in range(3)]
    assert ids[9:].tolist() == [[10, 0, 0, 0], [10, 0, 1, 0], [20, 0, 0, 0], [20, 1, 0, 0]]
    lat = np.arange(2 * 3 * 4, dtype=np.float32).reshape(1, 2, 3, 4)
    t = tokens(lat)
    assert t.shape == (1, 12, 2) and t[0, 5].tolist() == [5.0, 17.0]
    np.testing.assert_array_equal(untokens(np.concatenate([t, t], 1), 3, 4), lat)


@pytest.mark.parametrize("case", ["a", "b"])
def test_velocity_matches_diffusers(cpus, model, case) -> None:
    r = runner(cpus, model, DIT)
    try:
        assert rel_err(velocity(r, model, case), R[f"dit_{case}.out"]) < TOL
    finally:
        r.release()


def test_reference_tokens_and_text_matter(cpus, model) -> None:
    """The fixture's tokens mix: dropping the reference latent or shifting the text moves the
    output far beyond the tolerance (so RoPE and attention across streams are checked)."""
    r = runner(cpus, model, DIT)
    try:
        lat, ctx, s = R["dit_b.latent"], R["dit_b.context"], float(R["dit_b.sigma"][0])
        no_ref = r.run(model.inputs(lat, ctx, s))["out"]
        assert rel_err(no_ref, R["dit_b.out"]) > 10 * TOL
        other = r.run(model.inputs(lat, np.roll(ctx, 1, axis=1), s, [R["dit_b.ref0"]]))["out"][:, :24]
        assert rel_err(other, R["dit_b.out"]) > 5 * TOL  # the text order alone: RoPE on the text axis
    finally:
        r.release()


def test_layer_split_over_two_backends(cpus, model) -> None:
    one = runner(cpus, model, DIT)
    split = runner(cpus, model, DIT, [("CPU", 0, 1), ("CPU1", 2, 3)])
    try:
        np.testing.assert_allclose(velocity(split, model, "b"), velocity(one, model, "b"), atol=1e-5)
    finally:
        one.release()
        split.release()


def test_q8_0_gguf_dit(cpus, model, tmp_path) -> None:
    path = tmp_path / "flux-2-klein-tiny-Q8_0.gguf"
    write_gguf(DIT, path, "q8_0")
    gg = Flux2DiT.from_weights(shapes(path))
    assert gg.cfg == model.cfg
    r = runner(cpus, gg, path)
    try:
        err = rel_err(velocity(r, gg, "b"), R["dit_b.out"])
        assert TOL / 10 < err < 3e-2  # Q8_0 rounding, visibly not the f16 file
    finally:
        r.release()
