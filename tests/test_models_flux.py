"""Flux DiT graph against the diffusers reference: layouts, one device, a layer split over
two backends, disk residency, per-device weight bytes against the plan, GGUF weight types."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import AE, AXES, CLIP, DEV, SCHNELL, T5, ref, rel_err, write_gguf
from sdplan.core.models.base import ModelLayoutError
from sdplan.core.models.flux import (
    FluxDiT,
    apply_rope,
    flux_config,
    image_ids,
    patchify,
    rope_tables,
    unpatchify,
)

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.pipelines.flux.pipeline import _shapes  # noqa: E402
from sdplan.core.runtime.runner import BlockRange, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402

R = ref()
TOL = 2e-3  # f16 matrices and f16 activations in mul_mat against an f32 torch reference


def runner(pool, mod, path, ranges=None, mode="runtime", dtypes=None) -> ModuleRunner:
    """The engine's runner of the DiT: ``ranges`` ``(device, first, last)`` split it over
    CPU and CPU1 (None: CPU alone)."""
    devices = ("CPU", "CPU1") if ranges else ("CPU",)
    pl = ModulePlacement(devices, tuple(BlockRange(*r) for r in ranges or ()), mode)
    return ModuleRunner(mod, WeightFile(path, dtypes=dtypes, backend=pool.get("CPU")), pl, pool, n_threads=1)


def velocity(r, mod) -> np.ndarray:
    ins = mod.inputs(R["dit_latent"], R["dit_txt"], R["dit_y"], float(R["dit_t"][0]), float(R["dit_guidance"][0]))
    return unpatchify(r.run(ins)["out"], 8, 8)


def test_config_from_shapes_with_and_without_prefix() -> None:
    s, d = flux_config(_shapes(SCHNELL), axes=AXES), flux_config(_shapes(DEV), axes=AXES)
    assert s.prefix == "model.diffusion_model." and d.prefix == ""
    assert (s.variant, d.variant) == ("schnell", "dev")
    assert (d.width, d.heads, d.mlp, d.context, d.pooled, d.n_double, d.n_single) == (32, 2, 128, 16, 16, 2, 2)
    with pytest.raises(ModelLayoutError, match="RoPE axes"):
        flux_config(_shapes(DEV))  # head width 16 has no default split into even axes
    with pytest.raises(ModelLayoutError, match="no Flux DiT"):
        flux_config(_shapes(T5))


def test_full_size_defaults() -> None:
    shapes = {"img_in.weight": (3072, 64), "txt_in.weight": (3072, 4096), "vector_in.in_layer.weight": (3072, 768),
              "double_blocks.0.img_attn.qkv.weight": (9216, 3072), "double_blocks.0.img_mlp.0.weight": (12288, 3072),
              "single_blocks.0.linear1.weight": (21504, 3072)}
    c = flux_config(shapes)
    assert (c.heads, c.head_dim, c.axes, c.variant) == (24, 128, (16, 56, 56), "schnell")


def test_patchify_round_trip_and_order() -> None:
    lat = np.arange(2 * 4 * 6, dtype=np.float32).reshape(1, 2, 4, 6)
    p = patchify(lat)
    assert p.shape == (1, 6, 8)
    assert p[0, 1].tolist() == [lat[0, c, dy, 2 + dx] for c in range(2) for dy in range(2) for dx in range(2)]
    np.testing.assert_array_equal(unpatchify(p, 4, 6), lat)
    with pytest.raises(ValueError, match="even"):
        patchify(np.zeros((1, 16, 3, 4)))


def test_rope_tables() -> None:
    ids = image_ids(4, 6)
    assert ids.tolist()[:4] == [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0]]
    cos, sin = rope_tables(ids, AXES)
    assert cos.shape == (6, 8)
    # axis 2 (column) starts at channel pair 2 + 3 = 5 with frequency 1
    np.testing.assert_allclose(np.arccos(np.clip(cos[:, 5], -1, 1)), ids[:, 2], atol=1e-5)
    np.testing.assert_allclose(sin[:, 6], np.sin(ids[:, 2] * 10000 ** (-2 / 6)), atol=1e-6)


@pytest.mark.parametrize("n,heads,hd,axes", [(37, 3, 128, (32, 48, 48)), (5, 2, 8, (2, 2, 4)), (300, 4, 64, (16, 24, 24))])
def test_apply_rope_turns_each_channel_pair(cpus, n, heads, hd, axes) -> None:
    """apply_rope against float64 numpy: pair (2i, 2i+1) of every head turned by its angle
    (the graph splits the pairs into planes first; a plane's rows are hd/2 long)."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 64, (n, 3)).astype(np.float64)
    cos, sin = rope_tables(ids, axes)
    x = rng.standard_normal((1, n, heads, hd)).astype(np.float32)
    g = G.Graph([cpus.get("CPU")], n_threads=2)
    xi = g.input("x", (1, n, heads, hd), "f32")
    ci, si = (g.input(k, (n, 1, hd // 2, 1), "f32") for k in ("cos", "sin"))
    g.output("y", apply_rope(g, xi, ci, si))
    g.set_input("x", x)
    g.set_input("cos", cos[:, None, :, None].copy())
    g.set_input("sin", sin[:, None, :, None].copy())
    g.compute()
    xr = x.reshape(1, n, heads, hd // 2, 2).astype(np.float64)
    c, s = cos[None, :, None, :].astype(np.float64), sin[None, :, None, :].astype(np.float64)
    want = np.stack([xr[..., 0] * c - xr[..., 1] * s, xr[..., 0] * s + xr[..., 1] * c], -1).reshape(x.shape)
    np.testing.assert_allclose(g.get_output("y"), want, rtol=0, atol=2e-6)


@pytest.mark.parametrize("path,name", [(SCHNELL, "schnell"), (DEV, "dev")])
def test_one_device_matches_reference(cpus, path, name) -> None:
    mod = FluxDiT.from_weights(_shapes(path), axes=AXES)
    r = runner(cpus, mod, path)
    assert rel_err(velocity(r, mod), R[f"dit_{name}_out"]) < TOL


def test_split_and_disk_agree_and_bytes_follow_the_plan(cpus) -> None:
    from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
    from sdplan.core.planning import plan as P
    from sdplan.core.planning.inventory import Inventory

    gib = 1 << 30
    inv = Inventory.from_json({"devices": [
        {"name": n, "description": n, "type": "gpu", "registry": "RPC", "free": 8 * gib, "total": 8 * gib}
        for n in ("RPC0", "RPC1")] + [{"name": "CPU", "description": "host", "type": "cpu",
                                         "registry": "CPU", "free": 16 * gib, "total": 16 * gib}]})
    prof = profile_from_model_flags({"diffusion_model": [DEV], "t5xxl": [T5], "clip_l": [CLIP], "vae": [AE]})
    mp = P.resolve(["--backend", "diffusion=RPC0&RPC1"], inv, prof).modules["diffusion"]
    cpu_name = {"RPC0": "CPU", "RPC1": "CPU1"}
    ranges = [(cpu_name[r.device], r.first_block, r.last_block) for r in mp.ranges]
    assert len(ranges) == 2
    mod = FluxDiT.from_weights(_shapes(DEV), axes=AXES)
    one = velocity(runner(cpus, mod, DEV), mod)
    split = runner(cpus, mod, DEV, ranges)
    two = velocity(split, mod)
    np.testing.assert_allclose(two, one, atol=1e-6)
    placed = split.placed_bytes()
    assert placed["CPU"] == mp.ranges[0].bytes + mp.main_other_bytes
    assert placed["CPU1"] == mp.ranges[1].bytes
    now = split.memory()
    assert all(now[d].weights >= b for d, b in placed.items())
    disk = runner(cpus, mod, DEV, ranges, "disk")
    assert disk.memory() == {}
    np.testing.assert_allclose(velocity(disk, mod), one, atol=1e-6)
    assert all(m.weights == 0 for m in disk.memory().values())
    assert all(disk.last_peak[d].weights >= b for d, b in placed.items())


@pytest.mark.parametrize("dtype,tol", [("f32", 2e-3), ("f16", 2e-3), ("bf16", 3e-2), ("q8_0", 3e-2), ("q4_0", 0.25)])
def test_gguf_weight_types(cpus, tmp_path, dtype, tol) -> None:
    pytest.importorskip("gguf")
    path = tmp_path / f"dev_{dtype}.gguf"
    write_gguf(DEV, path, dtype)
    mod = FluxDiT.from_weights(_shapes(path), axes=AXES)
    base = FluxDiT.from_weights(_shapes(DEV), axes=AXES)
    f32 = velocity(runner(cpus, base, DEV, dtypes={n: "f32" for n in _shapes(DEV)}), base)
    r = runner(cpus, mod, path)
    assert dtype in set(r.wf.dtypes.values())  # the graph consumes the type as stored
    out = velocity(r, mod)
    assert rel_err(out, f32) < tol
    assert rel_err(out, R["dit_dev_out"]) < tol + TOL
