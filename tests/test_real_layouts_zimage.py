"""Full-size Z-Image Turbo and Qwen3-4B layouts from ``../shared/models`` as sparse files
(bf16 safetensors; a Q8_0 GGUF header written here in llama.cpp's format): they inspect as
Z-Image with a Qwen3 encoder, 30 + 36 splittable blocks, sizes equal to the layouts' bytes,
open as two ``-m`` files onto the right modules, and plan on a two-GPU inventory with both
modules split.

Expected bytes are computed here from the layouts (elements x 2 for bf16; Q8_0 stores 32
values in 34 bytes: ggml's ``block_q8_0``), independently of the readers.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.plan import resolve
from test_real_layouts import nbytes, write_sparse

Layout = dict[str, list[int]]
GIB = 1 << 30


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, Layout]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


def q8_bytes(shape: list[int]) -> int:
    return math.prod(shape) // 32 * 34


def write_sparse_gguf(path: Path, shapes: Layout) -> int:
    """A GGUF v3 header (no metadata) listing ``shapes`` (PyTorch order; written as ggml
    ``ne``, reversed): matrices Q8_0 (type 8), vectors F32 (type 0); data region sparse.
    Returns the data bytes."""
    def text(s: str) -> bytes:
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    head = b"GGUF" + struct.pack("<IQQ", 3, len(shapes), 0)
    off = 0
    for name, shape in shapes.items():
        q8 = len(shape) == 2
        head += text(name) + struct.pack("<I", len(shape)) + struct.pack(f"<{len(shape)}Q", *reversed(shape))
        head += struct.pack("<IQ", 8 if q8 else 0, off)
        n = q8_bytes(shape) if q8 else math.prod(shape) * 4
        off += -(-n // 32) * 32  # tensor data aligned to general.alignment (32)
    start = -(-len(head) // 32) * 32
    with open(path, "wb") as fh:
        fh.write(head)
        fh.seek(start + off - 1)
        fh.write(b"\0")
    return sum(q8_bytes(s) if len(s) == 2 else math.prod(s) * 4 for s in shapes.values())


@pytest.fixture(scope="module")
def files(tmp_path_factory, layouts) -> dict[str, tuple[Path, int]]:
    d = tmp_path_factory.mktemp("zimage_real")
    out = {}
    for key, name in (("z_image_turbo", "z_image_turbo_bf16.safetensors"), ("qwen3_4b_hf", "qwen_3_4b.safetensors")):
        out[key] = (d / name, write_sparse(d / name, layouts[key]))
    path = d / "Qwen3-4B-Q8_0.gguf"
    out["qwen3_4b_gguf"] = (path, write_sparse_gguf(path, layouts["qwen3_4b_gguf"]))
    return out


def test_z_image_turbo_with_qwen3_safetensors(files, layouts) -> None:
    dit, dit_bytes = files["z_image_turbo"]
    llm, llm_bytes = files["qwen3_4b_hf"]
    assert dit_bytes == nbytes(layouts["z_image_turbo"]) and dit_bytes > 12 * 10**9  # 6.15 B params, bf16
    ms = read_model_files({"diffusion_model": [dit], "llm": [llm]})
    arch = ms.architecture
    assert arch.name == "z_image"
    assert any("30 layers + 2 noise / 2 context refiners" in e for e in arch.evidence)
    assert any(e == "text encoder: qwen3, 36 blocks" for e in arch.evidence)
    prof = ms.profile()
    diff, te = prof.modules["diffusion"], prof.modules["te"]
    # Z-Image reads hidden_states[-2] (sd-cli's out layer 35): 35 of the 36 blocks, and the
    # embedding; the last block and the final norm do not load
    qwen = layouts["qwen3_4b_hf"]
    assert len(diff.blocks) == 30 and len(te.blocks) == 35
    assert diff.total == dit_bytes and llm_bytes == nbytes(qwen)
    assert te.total == nbytes(qwen, lambda n: n == "model.embed_tokens.weight" or (
        n.startswith("model.layers.") and int(n.split(".")[2]) < 35))
    assert llm_bytes - te.total == nbytes(qwen, lambda n: n.startswith("model.layers.35.") or n == "model.norm.weight")
    assert diff.blocks[0] == nbytes(layouts["z_image_turbo"], lambda n: n.startswith("layers.0."))
    assert diff.other == nbytes(layouts["z_image_turbo"], lambda n: not n.startswith("layers."))
    assert te.encoders == {"llm": te.total} and te.block_encoder == "llm"
    assert te.other == nbytes(qwen, lambda n: n == "model.embed_tokens.weight")


def test_both_files_as_model_files_and_a_q8_0_gguf_encoder(files, layouts) -> None:
    dit, _ = files["z_image_turbo"]
    gguf, gguf_bytes = files["qwen3_4b_gguf"]
    ms = read_model_files({"model": [dit, gguf]})  # as the GUI opens files of any kind
    assert ms.modules() == ["diffusion", "te"] and ms.architecture.family == "z_image"
    te = ms.profile().modules["te"]
    gg = layouts["qwen3_4b_gguf"]  # GGUF names: blk.35 and output_norm are not read
    unread = sum(q8_bytes(s) if len(s) == 2 else math.prod(s) * 4
                 for n, s in gg.items() if n.startswith("blk.35.") or n == "output_norm.weight")
    assert len(te.blocks) == 35 and te.total == gguf_bytes - unread and unread > 10**8
    assert te.blocks[5] == sum(q8_bytes(s) if len(s) == 2 else math.prod(s) * 4
                               for n, s in layouts["qwen3_4b_gguf"].items() if n.startswith("blk.5."))
    assert ms.dtype_mix("te")["Q8_0"] > 4 * 10**9


def test_plans_on_two_gpus_with_both_modules_split(files) -> None:
    prof = read_model_files({"diffusion_model": [files["z_image_turbo"][0]],
                             "llm": [files["qwen3_4b_hf"][0]]}).profile()
    inv = Inventory.from_json({"devices": [
        {"name": n, "type": "gpu", "registry": "CUDA", "free": 12 * GIB, "total": 12 * GIB}
        for n in ("CUDA0", "CUDA1")] + [
        {"name": "CPU", "type": "cpu", "registry": "CPU", "free": 32 * GIB, "total": 32 * GIB}]})
    plan = resolve(["--backend", "diffusion=CUDA0&CUDA1,te=CUDA0&CUDA1"], inv, prof)
    for module, n in (("diffusion", 30), ("te", 35)):  # the te split covers the 35 read blocks
        ranges = plan.modules[module].ranges
        assert [r.device for r in ranges] == ["CUDA0", "CUDA1"]
        assert ranges[0].first_block == 0 and ranges[-1].last_block == n - 1
        assert ranges[0].last_block + 1 == ranges[1].first_block
        assert sum(r.bytes for r in ranges) == sum(prof.modules[module].blocks)
    fit = estimate_plan(plan, prof, inv, width=1024, height=1024)
    weights = {d: t.weights for d, t in fit.devices.items()}
    assert sum(weights.values()) == prof.modules["diffusion"].total + prof.modules["te"].total
    assert fit.modules["diffusion"].compute["CUDA1"] > 0  # a split module computes on both
