"""The Z-Image Turbo built-in profiles against the real layouts' bytes: the bf16 DiT and
Qwen3-4B to the byte, the Q8_0 GGUF files by ggml's block sizes (recomputed here from the
shapes), 30 + 35 splittable blocks (Z-Image reads the state after 35 of Qwen3-4B's 36 blocks:
the last block and the final norm never load; the file table keeps the files' bytes), the
family detected."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from sdplan.core.planning.builtin_profiles import list_profiles, load_builtin_profile

Q8_0 = 34 / 32  # ggml block_q8_0: 32 values in 34 bytes


def read(name: str) -> bool:
    """A Qwen3 tensor Z-Image's graph uses: all but block 35 and the final norm."""
    return not name.startswith(("model.layers.35.", "blk.35.")) and name not in ("model.norm.weight",
                                                                                 "output_norm.weight")


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, dict[str, list[int]]]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


def test_bf16_files_to_the_byte(layouts) -> None:
    p = load_builtin_profile("z-image-turbo-f16")
    assert p.architecture == "z_image"
    dit = sum(math.prod(s) * 2 for s in layouts["z_image_turbo"].values())
    qwen = sum(math.prod(s) * 2 for s in layouts["qwen3_4b_hf"].values())
    assert p.modules["diffusion"].total == dit == 12_309_817_472
    qwen_read = sum(math.prod(s) * 2 for n, s in layouts["qwen3_4b_hf"].items() if read(n))
    assert qwen == 8_044_936_192 and p.modules["te"].encoders == {"llm": qwen_read}
    assert qwen - qwen_read == p.modules["te"].blocks[0] + 2 * 2560  # one block and the final norm
    assert (len(p.modules["diffusion"].blocks), len(p.modules["te"].blocks)) == (30, 35)
    assert p.modules["te"].block_encoder == "llm"
    info = {i.name: i for i in list_profiles()}["z-image-turbo-f16"]
    assert info.files["qwen_3_4b.safetensors"] == qwen and info.title == "Z-Image Turbo F16"


def test_q8_0_files_by_block_sizes(layouts) -> None:
    p = load_builtin_profile("z-image-turbo-q8_0")
    qwen = sum(math.prod(s) * (4 if len(s) == 1 else Q8_0) for n, s in layouts["qwen3_4b_gguf"].items() if read(n))
    assert p.modules["te"].total == qwen
    keep = ("x_embedder.", "t_embedder.", "final_layer.")

    def size(name: str, shape: list[int]) -> float:
        n = math.prod(shape)
        if len(shape) <= 1 or n <= 1024:
            return n * 4
        if not name.endswith("weight") or name.startswith(keep) or shape[-1] % 32:
            return n * 2
        return n * Q8_0

    assert p.modules["diffusion"].total == sum(size(n, s) for n, s in layouts["z_image_turbo"].items())
    for q in ("q5_k", "q4_k", "q4_0"):
        smaller = load_builtin_profile(f"z-image-turbo-{q}")
        assert smaller.modules["diffusion"].total < p.modules["diffusion"].total
        assert len(smaller.modules["diffusion"].blocks) == 30
        assert smaller.modules["te"].total == qwen  # the Q8_0 encoder with every quant
