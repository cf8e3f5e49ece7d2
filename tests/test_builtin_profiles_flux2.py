"""The FLUX.2 klein built-in profiles against the real layouts' bytes: the bf16 4B DiT, Qwen3-4B
and the f32 FLUX.2 autoencoder to the byte, the Q8_0 GGUF DiT by ggml's block sizes
(recomputed here from the shapes with sd-cli's keep rule), 5 + 20 / 8 + 24 DiT blocks and the
27 encoder blocks klein reads of Qwen3's 36 (its states after blocks 9, 18, 27: the later
blocks and the final norm never load; the file table keeps the files' bytes), the 9B's widths,
the family detected, its GUI defaults, a layer-split plan."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from sdplan.core.cli import main
from sdplan.core.families import generation_defaults
from sdplan.core.planning.builtin_profiles import list_profiles, load_builtin_profile

Q8_0 = 34 / 32  # ggml block_q8_0: 32 values in 34 bytes
QUANTS = ("f16", "q8_0", "q5_k", "q4_k", "q4_0")
READ = 27  # the Qwen3 blocks klein reads


def read(name: str) -> bool:
    """A Qwen3 tensor (transformers or llama.cpp names) klein's graph uses: the token
    embedding and blocks 0..26."""
    if name in ("model.embed_tokens.weight", "token_embd.weight"):
        return True
    m = re.match(r"(?:model\.layers|blk)\.(\d+)\.", name)
    return m is not None and int(m.group(1)) < READ


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, dict[str, list[int]]]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


def test_klein_4b_bf16_files_to_the_byte(layouts) -> None:
    p = load_builtin_profile("flux2-klein-4b-f16")
    assert p.architecture == "flux2_klein-4b"
    dit = sum(math.prod(s) * 2 for s in layouts["flux2_klein_4b"].values())
    qwen = sum(math.prod(s) * 2 for s in layouts["qwen3_4b_hf"].values())
    vae = sum(math.prod(s) * 4 for n, s in layouts["flux2_vae"].items() if n != "bn.num_batches_tracked") + 8
    assert p.modules["diffusion"].total == dit == 7_751_089_152
    qwen_read = sum(math.prod(s) * 2 for n, s in layouts["qwen3_4b_hf"].items() if read(n))
    assert qwen == 8_044_936_192 and p.modules["te"].encoders == {"llm": qwen_read} == {"llm": 6_228_176_384}
    assert p.modules["vae"].total == vae
    assert (len(p.modules["diffusion"].blocks), len(p.modules["te"].blocks)) == (25, READ)
    info = {i.name: i for i in list_profiles()}["flux2-klein-4b-f16"]
    assert info.files == {"flux-2-klein-4b.safetensors": dit, "qwen_3_4b.safetensors": qwen,
                          "flux2-vae.safetensors": vae}
    assert info.title == "FLUX.2 [klein] 4B F16"


def test_klein_4b_q8_0_by_block_sizes(layouts) -> None:
    p = load_builtin_profile("flux2-klein-4b-q8_0")
    keep = ("img_in.", "txt_in.", "time_in.", "final_layer.")

    def size(name: str, shape: list[int]) -> float:
        n = math.prod(shape)
        if len(shape) <= 1:
            return n * 4
        return n * 2 if name.startswith(keep) else n * Q8_0

    assert p.modules["diffusion"].total == sum(size(n, s) for n, s in layouts["flux2_klein_4b"].items())
    qwen = sum(math.prod(s) * (4 if len(s) == 1 else Q8_0) for n, s in layouts["qwen3_4b_gguf"].items() if read(n))
    assert p.modules["te"].total == qwen
    for q in ("q5_k", "q4_k", "q4_0"):
        smaller = load_builtin_profile(f"flux2-klein-4b-{q}")
        assert smaller.modules["diffusion"].total < p.modules["diffusion"].total
        assert smaller.modules["te"].total == qwen  # the Q8_0 encoder with every quant


def test_klein_9b_widths_and_blocks() -> None:
    """9B: width 4096 (32 heads of 128), MLP 3 x 4096, 8 double + 24 single blocks, Qwen3-8B."""
    p = load_builtin_profile("flux2-klein-9b-f16")
    assert p.architecture == "flux2_klein-9b"
    d = p.modules["diffusion"]
    w, f = 4096, 3 * 4096
    double = 2 * (3 * w * w + w * w + 2 * f * w + f * w + 2 * 128)  # img and txt: qkv, proj, mlp, norms
    single = (3 * w + 2 * f) * w + (w + f) * w + 2 * 128
    assert len(d.blocks) == 32 and d.blocks[0] == 2 * double and d.blocks[8] == 2 * single
    shared = 6 * w * w * 2 + 3 * w * w  # double img, double txt, single modulation
    other = 128 * w + 256 * w + w * w + 12288 * w + shared + 128 * w + 2 * w * w  # in, time, text, final
    assert d.other == 2 * other
    assert 9.0e9 < d.total / 2 < 9.2e9  # "9B"
    te = p.modules["te"]
    assert len(te.blocks) == READ and te.block_encoder == "llm"
    assert te.blocks[0] == 2 * (2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 12288 * 4096 + 2 * 4096 + 2 * 128)


def test_block_counts_in_every_quant() -> None:
    for model, dit, arch in (("flux2-klein-4b", 25, "flux2_klein-4b"), ("flux2-klein-9b", 32, "flux2_klein-9b")):
        for q in QUANTS:
            p = load_builtin_profile(f"{model}-{q}")
            assert p.architecture == arch and set(p.modules) == {"diffusion", "te", "vae"}
            assert len(p.modules["diffusion"].blocks) == dit and all(b > 0 for b in p.modules["diffusion"].blocks)
            assert len(p.modules["te"].blocks) == READ


def test_gui_defaults_are_the_distilled_klein() -> None:
    for arch in ("flux2_klein-4b", "flux2_klein-9b", "flux2_klein"):
        assert generation_defaults(arch) == {"cfg_scale": 1.0, "steps": 4, "sampling_method": "euler"}


def test_plan_model_profile_gives_ranges(shared_dir, capsys) -> None:
    rc = main(["plan", "--model-profile", "flux2-klein-9b-q8_0", "--devices",
               str(shared_dir / "cases" / "devices" / "D1.json"), "--backend",
               "diffusion=CUDA0&CUDA1,te=CUDA0&CUDA1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["ok"] is True
    prof = load_builtin_profile("flux2-klein-9b-q8_0")
    for module, n in (("diffusion", 32), ("te", READ)):  # the te split covers the read blocks
        ranges = out["modules"][module]["ranges"]
        assert [r["device"] for r in ranges] == ["CUDA0", "CUDA1"]
        assert ranges[0]["first_block"] == 0 and ranges[-1]["last_block"] == n - 1
        assert sum(r["bytes"] for r in ranges) == sum(prof.modules[module].blocks)
