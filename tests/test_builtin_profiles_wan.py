"""The Wan 2.2 built-in profiles against the real layouts' bytes: the F16 TI2V-5B DiT, both
A14B experts, UMT5-XXL (with its tokenizer blob, one byte per value as the real file stores it)
and the two VAEs to the byte; the Q8_0 GGUF experts and encoder by ggml's block sizes
(recomputed here from the shapes); 30 / 40 DiT blocks and 24 encoder blocks; the family
detected; and ``plan --model-profile`` over D1's two GPUs without any file, both A14B experts
planned as the diffusion module's two phases."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from sdplan.core.planning.builtin_profiles import list_profiles, load_builtin_profile

Q8_0 = 34 / 32  # ggml block_q8_0: 32 values in 34 bytes
#: the published files' sizes less the bytes of their safetensors headers (``shared/models``)
UMT5_FILE, TI2V_FILE, A14B_FILE = 11_366_399_385, 9_999_658_848, 28_577_095_592


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, dict[str, list[int]]]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


def f16(layout: dict[str, list[int]]) -> int:
    return sum(math.prod(s) * 2 for s in layout.values())


def test_f16_files_to_the_byte(layouts) -> None:
    umt5 = layouts["umt5_xxl"]
    te = f16({n: s for n, s in umt5.items() if n != "spiece_model"}) + math.prod(umt5["spiece_model"])
    p = load_builtin_profile("wan22-ti2v-5b-f16")
    assert p.architecture == "wan-ti2v_5b" and not p.phases
    assert p.modules["diffusion"].total == f16(layouts["wan22_ti2v_5b"]) and len(p.modules["diffusion"].blocks) == 30
    assert p.modules["te"].total == te and len(p.modules["te"].blocks) == 24
    assert p.modules["te"].encoders == {"t5xxl": te}
    assert p.modules["vae"].total == f16(layouts["wan22_vae"])
    a = load_builtin_profile("wan22-t2v-a14b-f16")
    assert a.architecture == "wan-t2v_a14b"
    expert = f16(layouts["wan22_t2v_a14b"])
    assert a.modules["diffusion"].total == a.phases["high_noise"].total == expert
    assert len(a.modules["diffusion"].blocks) == len(a.phases["high_noise"].blocks) == 40
    assert a.modules["vae"].total == f16(layouts["wan21_vae"])
    info = {i.name: i for i in list_profiles()}["wan22-t2v-a14b-f16"]
    assert info.files == {"wan2.2_t2v_low_noise_14B_fp16.safetensors": expert,
                          "wan2.2_t2v_high_noise_14B_fp16.safetensors": expert,
                          "umt5_xxl_fp16.safetensors": te, "wan_2.1_vae.safetensors": f16(layouts["wan21_vae"])}
    # each published file is its tensors plus a header of a few tens of KB
    for data, published in ((te, UMT5_FILE), (expert, A14B_FILE),
                            (f16(layouts["wan22_ti2v_5b"]), TI2V_FILE)):
        assert 0 < published - data < 200_000


def test_q8_0_by_block_sizes(layouts) -> None:
    keep = ("patch_embedding.", "text_embedding.", "time_embedding.", "time_projection.", "head.")

    def size(name: str, shape: list[int]) -> float:
        n = math.prod(shape)
        if len(shape) == 1:
            return n * 2  # the F16 release's vectors stay F16 in a DiT GGUF
        return n * 2 if name.startswith(keep) or len(shape) != 2 else n * Q8_0

    a = load_builtin_profile("wan22-t2v-a14b-q8_0")
    want = sum(size(n, s) for n, s in layouts["wan22_t2v_a14b"].items())
    assert a.modules["diffusion"].total == a.phases["high_noise"].total == want

    def t5(name: str, shape: list[int]) -> float:
        n = math.prod(shape)
        return n * 4 if len(shape) == 1 else n * 2 if "relative_attention_bias" in name else n * Q8_0

    assert a.modules["te"].total == sum(t5(n, s) for n, s in layouts["umt5_xxl"].items() if n != "spiece_model")
    for q in ("q5_k", "q4_k", "q4_0"):
        smaller = load_builtin_profile(f"wan22-t2v-a14b-{q}")
        assert smaller.modules["diffusion"].total < a.modules["diffusion"].total
        assert smaller.phases["high_noise"].total == smaller.modules["diffusion"].total
        assert smaller.modules["te"].total == a.modules["te"].total  # the Q8_0 encoder with every quant


def test_plan_from_the_profile_alone(shared_dir: Path) -> None:
    from rpc_util import sdplan_cmd

    r = subprocess.run(sdplan_cmd("plan", "--devices", str(shared_dir / "cases/devices/D1.json"),
                                  "--model-profile", "wan22-t2v-a14b-q4_0", "--backend",
                                  "diffusion=CUDA0&CUDA1,te=CPU", "-W", "832", "-H", "480", "--json"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [p["name"] for p in doc["phases"]] == ["high_noise", "low_noise"]
    for phase in doc["phases"]:
        assert [x["device"] for x in phase["ranges"]] == ["CUDA0", "CUDA1"] and phase["ranges"][-1]["last_block"] == 39
    assert doc["fit"]["fits"] and doc["fit"]["modules"]["diffusion"]["phase_residency"] == "both"


def test_i2v_a14b_is_the_t2v_expert_with_36_inputs(layouts) -> None:
    """Wan 2.2 I2V-A14B's built-in profile: two experts of the T2V-A14B layout whose patch
    embedding takes 36 inputs (20 more channels of 5120 x 1 x 2 x 2 in F16), planned as two
    40-block diffusion phases with the Wan 2.1 autoencoder and UMT5."""
    t2v, i2v = load_builtin_profile("wan22-t2v-a14b-f16"), load_builtin_profile("wan22-i2v-a14b-f16")
    assert i2v.architecture == "wan-i2v_a14b"
    extra = 20 * 5120 * 1 * 2 * 2 * 2
    assert i2v.modules["diffusion"].total == i2v.phases["high_noise"].total == t2v.modules["diffusion"].total + extra
    assert len(i2v.modules["diffusion"].blocks) == len(i2v.phases["high_noise"].blocks) == 40
    assert i2v.modules["diffusion"].blocks == t2v.modules["diffusion"].blocks  # the inputs are outside the blocks
    for m in ("te", "vae"):
        assert i2v.modules[m].total == t2v.modules[m].total
    info = {i.name: i for i in list_profiles()}
    i2v_q8, t2v_q8 = info["wan22-i2v-a14b-q8_0"].files, info["wan22-t2v-a14b-q8_0"].files
    # a DiT GGUF keeps the patch embedding in F16: the same 819,200 bytes more in each expert
    assert i2v_q8["wan2.2_i2v_high_noise_14B-Q8_0.gguf"] == t2v_q8["wan2.2_t2v_high_noise_14B-Q8_0.gguf"] + extra
    assert i2v_q8["wan22-i2v-a14b-Q8_0.gguf"] == t2v_q8["wan22-t2v-a14b-Q8_0.gguf"] + extra
