"""The Qwen-Image built-in profiles against the real layouts' bytes: the bf16 DiT, Qwen2.5-VL-7B
(its LLM and its vision tower apart) and the VAE to the byte, the Q8_0 GGUF DiT and encoder by
ggml's block sizes (recomputed here from the shapes), 60 DiT blocks and 28 encoder blocks, the
family detected, and ``plan --model-profile`` over D1's two GPUs without any file."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from sdplan.core.planning.builtin_profiles import list_profiles, load_builtin_profile

Q8_0 = 34 / 32  # ggml block_q8_0: 32 values in 34 bytes


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, dict[str, list[int]]]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


def test_bf16_files_to_the_byte(layouts) -> None:
    p = load_builtin_profile("qwen-image-f16")
    assert p.architecture == "qwen_image"
    dit, llm, vae = (sum(math.prod(s) * 2 for s in layouts[k].values())
                     for k in ("qwen_image_dit", "qwen25vl_7b_llm", "qwen_image_vae"))
    vision = sum(math.prod(s) * 2 for n, s in layouts["qwen25vl_7b_llm"].items() if n.startswith("visual."))
    assert p.modules["diffusion"].total == dit == 40_860_802_176
    assert p.modules["te"].total == llm and p.modules["te"].encoders == {"llm": llm - vision, "llm_vision": vision}
    assert p.modules["vae"].total == vae
    assert (len(p.modules["diffusion"].blocks), len(p.modules["te"].blocks)) == (60, 28)
    info = {i.name: i for i in list_profiles()}["qwen-image-f16"]
    assert info.files == {"qwen_image_bf16.safetensors": dit, "qwen_2.5_vl_7b.safetensors": llm,
                          "qwen_image_vae.safetensors": vae}


def test_q8_0_by_block_sizes(layouts) -> None:
    p = load_builtin_profile("qwen-image-q8_0")
    keep = ("img_in.", "txt_in.", "time_text_embed.", "norm_out.", "proj_out.")

    def size(name: str, shape: list[int], kept: tuple[str, ...]) -> float:
        n = math.prod(shape)
        if len(shape) <= 1:
            return n * 4
        return n * 2 if name.startswith(kept) else n * Q8_0

    assert p.modules["diffusion"].total == sum(size(n, s, keep) for n, s in layouts["qwen_image_dit"].items())
    text = {n: s for n, s in layouts["qwen25vl_7b_llm"].items() if not n.startswith("visual.")}
    assert p.modules["te"].total == sum(size(n, s, ()) for n, s in text.items())
    assert p.modules["te"].encoders.keys() == {"llm"} and len(p.modules["te"].blocks) == 28
    for q in ("q5_k", "q4_k", "q4_0"):
        smaller = load_builtin_profile(f"qwen-image-{q}")
        assert smaller.modules["diffusion"].total < p.modules["diffusion"].total
        assert smaller.modules["te"].total == p.modules["te"].total  # the Q8_0 encoder with every quant


def test_plan_from_the_profile_alone(shared_dir: Path) -> None:
    from rpc_util import sdplan_cmd

    r = subprocess.run(sdplan_cmd("plan", "--devices", str(shared_dir / "cases/devices/D1.json"),
                                  "--model-profile", "qwen-image-q4_0", "--backend",
                                  "diffusion=CUDA0&CUDA1,te=CUDA0&CUDA1", "-W", "1024", "-H", "1024", "--json"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    for module, n in (("diffusion", 60), ("te", 28)):
        ranges = doc["modules"][module]["ranges"]
        assert [x["device"] for x in ranges] == ["CUDA0", "CUDA1"] and ranges[-1]["last_block"] == n - 1
    assert doc["fit"]["fits"]  # a Q4_0 DiT and the Q8_0 encoder over the 4090 and the 3060
