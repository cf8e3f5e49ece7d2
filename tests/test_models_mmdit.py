"""SD3 MMDiT graph against diffusers' ``SD3Transformer2DModel`` (a tiny SD3.5-medium-like model:
RMS qk norm, MMDiT-X ``attn2`` blocks, a context-pre-only last block): one device, a layer
split over two backends with disk residency, skip-layer guidance's skipped block, patches."""

from __future__ import annotations

import numpy as np
import pytest
from sd3_util import SD3, T5, ref, rel_err
from sdplan.core.models.base import ModelLayoutError
from sdplan.core.models.mmdit import MMDiT, mmdit_config, patches, unpatch

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.pipelines.stages.flow_dit import shapes  # noqa: E402
from sdplan.core.runtime.runner import BlockRange, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402

R = ref()
TOL = 2e-3  # f16 matrices and f16 activations in mul_mat against an f32 torch reference


def run(pool, mod: MMDiT, ranges=None, mode="runtime", path=SD3, dtypes=None) -> np.ndarray:
    devices = ("CPU", "CPU1") if ranges else ("CPU",)
    names = mod.other_tensors() + [n for i in range(mod.n_blocks) for n in mod.block_tensors(i)]
    pl = ModulePlacement(devices, tuple(BlockRange(*r) for r in ranges or ()), mode)
    r = ModuleRunner(mod, WeightFile(path, names, dtypes=dtypes, backend=pool.get("CPU")), pl, pool, n_threads=1)
    try:
        ins = mod.inputs(R["dit_latent"], R["dit_context"], R["dit_pooled"], float(R["dit_t"][0]) / 1000)
        return unpatch(r.run(ins)["out"], 8, 8)
    finally:
        r.release()


def test_config_from_shapes() -> None:
    c = mmdit_config(shapes(SD3))
    assert c.prefix == "model.diffusion_model."
    assert (c.width, c.heads, c.mlp, c.context, c.pooled, c.depth) == (32, 2, 128, 48, 32, 3)
    assert (c.qk_norm, sorted(c.x_self), c.pos_size, c.out_channels, c.variant) == ("rms", [0, 1], 16, 16,
                                                                                      "3.5-medium")
    with pytest.raises(ModelLayoutError, match="no SD3 MMDiT"):
        mmdit_config(shapes(T5))


def test_full_size_heads() -> None:
    s = {"x_embedder.proj.weight": (1536, 16, 2, 2), "pos_embed": (1, 36864, 1536),
         "joint_blocks.0.x_block.attn.qkv.weight": (4608, 1536), "joint_blocks.0.x_block.mlp.fc1.weight": (6144, 1536),
         "context_embedder.weight": (1536, 4096), "y_embedder.mlp.0.weight": (1536, 2048),
         "final_layer.linear.weight": (64, 1536)}
    s |= {f"joint_blocks.{i}.x_block.attn.qkv.weight": (4608, 1536) for i in range(24)}
    c = mmdit_config(s)
    assert (c.heads, c.head_dim, c.pos_size, c.depth, c.qk_norm, c.variant) == (24, 64, 192, 24, None, "medium")


def test_patches_round_trip_and_order() -> None:
    lat = np.arange(2 * 4 * 6, dtype=np.float32).reshape(1, 2, 4, 6)
    p = patches(lat)
    assert p.shape == (1, 2, 3, 8)
    assert p[0, 0, 1].tolist() == [lat[0, c, dy, 2 + dx] for c in range(2) for dy in range(2) for dx in range(2)]
    out = np.array([[[dy * 100 + dx * 10 + c for dy in range(2) for dx in range(2) for c in range(2)]]] * 6,
                   np.float32).reshape(1, 6, 8)
    back = unpatch(out, 4, 6)
    assert back[0, 1, 1, 0] == 101 and back[0, 1, 1, 1] == 111 and back[0, 0, 0, 1] == 10


def test_one_device_matches_diffusers(cpus) -> None:
    mod = MMDiT.from_weights(shapes(SD3))
    assert rel_err(run(cpus, mod), R["dit_out"]) < TOL


def _as_bf16(src, dst, names) -> None:
    """A copy of safetensors file ``src`` with the tensors named ``names`` (last part of the
    name) stored as bf16 (rounded
    to nearest even from their f32 values), as a bf16 release stores them."""
    import json
    import struct

    raw = src.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out, blobs, off = {}, [], 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        blob, dtype = data[a:b], info["dtype"]
        if name.split(".")[-1] in names:
            x = np.frombuffer(blob, {"F16": np.float16, "F32": np.float32}[dtype]).astype(np.float32)
            u = x.view(np.uint32).astype(np.uint64)
            blob = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16).tobytes()
            dtype = "BF16"
        out[name] = {"dtype": dtype, "shape": info["shape"], "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    hb = json.dumps(out).encode()
    hb += b" " * (-len(hb) % 8)
    dst.write_bytes(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))


def test_a_bf16_position_embedding_is_cropped_as_bf16(cpus, tmp_path) -> None:
    """A file whose ``pos_embed`` is bf16 (as some SD3.5 releases and converters store it),
    held as bf16 (as the runner holds a bf16 file's tensors where it runs bf16 products): its
    crop is a view with 2-byte elements (it was taken as f32 and the view refused)."""
    path = tmp_path / "sd3_bf16_pos.safetensors"
    _as_bf16(SD3, path, {"pos_embed"})
    mod = MMDiT.from_weights(shapes(path))
    out = run(cpus, mod, path=path, dtypes={mod.cfg.prefix + "pos_embed": "bf16"})
    assert rel_err(out, R["dit_out"]) < 2 * TOL  # the bf16 rounding of the table on top
    assert rel_err(out, run(cpus, mod)) < TOL


def test_split_with_disk_residency_matches(cpus) -> None:
    mod = MMDiT.from_weights(shapes(SD3))
    one = run(cpus, mod)
    split = run(cpus, mod, [("CPU", 0, 0), ("CPU1", 1, 2)], "disk")
    np.testing.assert_allclose(split, one, atol=1e-5)


def test_skipped_block_matches_diffusers_skip_layers(cpus) -> None:
    mod = MMDiT.from_weights(shapes(SD3)).skipping([1])
    assert rel_err(run(cpus, mod), R["dit_out_skip1"]) < TOL
    assert rel_err(R["dit_out_skip1"], R["dit_out"]) > 10 * TOL  # the skip changes the output
    with pytest.raises(ValueError, match="outside"):
        mod.skipping([3])
