"""Chroma DiT graph against the diffusers reference (``make_chroma_fixtures.py``): the
approximator input, the velocity with sd-cli's padding mask (as dropped tokens) and without
it, the config told apart from FLUX.1, a layer split over two backends, GGUF weight types."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import AXES, CHROMA, CHROMA_REF, DEV, ref, rel_err, write_gguf
from sdplan.core.models.base import ModelLayoutError
from sdplan.core.models.chroma import ChromaDiT, approximator_input, kept_tokens
from sdplan.core.models.flux import FluxDiT, flux_config, unpatchify

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.pipelines.flux.pipeline import _shapes  # noqa: E402
from sdplan.core.runtime.runner import BlockRange, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402

R = ref(CHROMA_REF)
TOL = 2e-3  # f16 matrices and f16 activations in mul_mat against an f32 torch reference


def runner(pool, mod, path, ranges=None, mode="runtime", dtypes=None) -> ModuleRunner:
    devices = ("CPU", "CPU1") if ranges else ("CPU",)
    pl = ModulePlacement(devices, tuple(BlockRange(*r) for r in ranges or ()), mode)
    return ModuleRunner(mod, WeightFile(path, dtypes=dtypes, backend=pool.get("CPU")), pl, pool, n_threads=1)


def velocity(r, mod, keep: int | None = None) -> np.ndarray:
    txt = R["dit_txt"] if keep is None else R["dit_txt"][:, :keep]
    return unpatchify(r.run(mod.inputs(R["dit_latent"], txt, None, float(R["dit_t"][0])))["out"], 8, 8)


@pytest.fixture(scope="module")
def model() -> ChromaDiT:
    return ChromaDiT.from_weights(_shapes(CHROMA), axes=AXES)


def test_config_is_chroma_not_schnell(model) -> None:
    c = flux_config(_shapes(CHROMA), axes=AXES)
    assert c.variant == "chroma" and c.approximator == (64, 64, 2)
    assert (c.width, c.heads, c.mlp, c.context, c.pooled, c.n_double, c.n_single) == (32, 2, 128, 16, 0, 2, 2)
    assert model.n_mods == 3 * 2 + 12 * 2 + 2 == R["mod_in"].shape[1]
    with pytest.raises(ModelLayoutError, match="ChromaDiT"):
        FluxDiT.from_weights(_shapes(CHROMA), axes=AXES)
    with pytest.raises(ModelLayoutError, match="not a Chroma DiT"):
        ChromaDiT.from_weights(_shapes(DEV), axes=AXES)
    # every tensor of the file is used, and none twice
    names = model.other_tensors() + [n for i in range(model.n_blocks) for n in model.block_tensors(i)]
    assert sorted(names) == sorted(_shapes(CHROMA))


def test_approximator_input_matches_diffusers() -> None:
    ours = approximator_input(float(R["dit_t"][0]), R["mod_in"].shape[1])
    assert ours.shape == R["mod_in"].shape
    # sigma and guidance columns (arguments up to 700) agree closely; the row-index columns
    # (arguments up to 31000) differ by up to ~5e-4 from float32 rounding of the frequencies
    np.testing.assert_allclose(ours[..., :32], R["mod_in"][..., :32], atol=1e-5)
    np.testing.assert_allclose(ours, R["mod_in"], atol=1e-3)


def test_kept_tokens() -> None:
    assert kept_tokens(8, 512) == 9 and kept_tokens(8, 512, mask_pad=3) == 11
    assert kept_tokens(512, 512) == 512 and kept_tokens(8, 512, dit_mask=False) == 512
    with pytest.raises(ValueError):
        kept_tokens(0, 16)


def test_masked_and_unmasked_velocity_match_diffusers(cpus, model) -> None:
    r = runner(cpus, model, CHROMA)
    keep = int(R["dit_keep"][0])
    masked = velocity(r, model, keep)
    assert rel_err(masked, R["dit_masked"]) < TOL
    assert rel_err(velocity(r, model), R["dit_unmasked"]) < TOL
    assert rel_err(R["dit_masked"], R["dit_unmasked"]) > 5 * TOL  # the mask matters
    with pytest.raises(ValueError, match="pooled"):
        model.inputs(R["dit_latent"], R["dit_txt"], np.zeros((1, 16), np.float32), 0.5)


def test_layer_split_and_disk_agree(cpus, model) -> None:
    one = velocity(runner(cpus, model, CHROMA), model, 9)
    for ranges, mode in ((((("CPU", 0, 2), ("CPU1", 3, 3))), "runtime"), ((("CPU", 0, 0), ("CPU1", 1, 3)), "disk")):
        split = runner(cpus, model, CHROMA, list(ranges), mode)
        np.testing.assert_allclose(velocity(split, model, 9), one, atol=1e-6)
        placed = split.placed_bytes()
        assert set(placed) == {"CPU", "CPU1"} and placed["CPU1"] > 0
    # --max-vram graph-cut segments: the modulation table crosses segment boundaries as state
    seg = ModuleRunner(model, WeightFile(CHROMA, backend=cpus.get("CPU")),
                       ModulePlacement(("CPU",), (), "device", "CPU1", budget=200_000), cpus, n_threads=1)
    np.testing.assert_allclose(velocity(seg, model, 9), one, atol=1e-6)
    ins = model.inputs(R["dit_latent"], R["dit_txt"][:, :9], None, 0.5)
    assert len(seg.segments({k: v.shape for k, v in ins.items()})) > 1


@pytest.mark.parametrize("dtype,tol", [("f16", 2e-3), ("q8_0", 3e-2)])
def test_gguf_weight_types(cpus, tmp_path, dtype, tol) -> None:
    pytest.importorskip("gguf")
    path = tmp_path / f"chroma_{dtype}.gguf"
    write_gguf(CHROMA, path, dtype)
    mod = ChromaDiT.from_weights(_shapes(path), axes=AXES)
    f32 = velocity(runner(cpus, mod, CHROMA, dtypes={n: "f32" for n in _shapes(CHROMA)}), mod, 9)
    r = runner(cpus, mod, path)
    assert dtype in set(r.wf.dtypes.values())
    out = velocity(r, mod, 9)
    assert rel_err(out, f32) < tol
    assert rel_err(out, R["dit_masked"]) < tol + TOL
