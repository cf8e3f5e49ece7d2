"""The FLUX.2 dev built-in profiles against the layouts' bytes (``tests/fixtures/
flux2_dev_layouts.json``, the FLUX.2 autoencoder's from ``../shared/models``): the bf16 DiT
(64,446,562,304 bytes, the published file's), Mistral-Small-3.2-24B (its text model and its
Pixtral vision tower apart) and the F32 autoencoder to the byte; the Q8_0 GGUF DiT and encoder
by ggml's block sizes (recomputed here from the shapes); 56 DiT blocks and the 30 encoder
layers FLUX.2 dev reads of 40 (its states after layers 10, 20, 30: layers 30..39, the final
norm and the output head never load);
the family detected; ``plan --model-profile`` over D1's two GPUs without any file (too large
for their 33 GiB even at Q4_0: the plan says so and advises the weights in RAM)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from sdplan.core.planning.builtin_profiles import list_profiles, load_builtin_profile

Q8_0 = 34 / 32  # ggml block_q8_0: 32 values in 34 bytes
FIX = Path(__file__).resolve().parent / "fixtures"
KEEP = ("img_in.", "txt_in.", "time_in.", "guidance_in.", "final_layer.")


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, dict[str, list[int]]]:
    shared = json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())
    return {**json.loads((FIX / "flux2_dev_layouts.json").read_text()), "flux2_vae": shared["flux2_vae"]}


def read(name: str) -> bool:
    """A Mistral tensor FLUX.2 dev's graph uses (the vision tower is ``llm_vision``, kept)."""
    if name in ("language_model.model.norm.weight", "language_model.lm_head.weight"):
        return False
    return not name.startswith("language_model.model.layers.") or int(name.split(".")[3]) < 30


def vae_bytes(layout: dict[str, list[int]]) -> int:
    return sum(math.prod(s) * (8 if n == "bn.num_batches_tracked" else 4) for n, s in layout.items())


def test_bf16_files_to_the_byte(layouts) -> None:
    p = load_builtin_profile("flux2-dev-f16")
    assert p.architecture == "flux2-dev"
    dit = sum(math.prod(s) * 2 for s in layouts["flux2_dev_bfl"].values())
    ml = layouts["mistral_small_32_hf"]
    llm = sum(math.prod(s) * 2 for n, s in ml.items() if read(n))
    vision = sum(math.prod(s) * 2 for n, s in ml.items() if not n.startswith("language_model."))
    assert p.modules["diffusion"].total == dit == 64_446_562_304
    assert p.modules["te"].total == llm and p.modules["te"].encoders == {"llm": llm - vision, "llm_vision": vision}
    assert sum(math.prod(s) * 2 for s in ml.values()) - llm == 10 * p.modules["te"].blocks[0] + 2 * (
        5120 + 131072 * 5120)  # ten layers, the final norm and the output head
    assert p.modules["vae"].total == vae_bytes(layouts["flux2_vae"])
    assert (len(p.modules["diffusion"].blocks), len(p.modules["te"].blocks)) == (56, 30)
    info = {i.name: i for i in list_profiles()}["flux2-dev-f16"]
    assert info.files["flux2-dev.safetensors"] == dit


def test_q8_0_by_block_sizes(layouts) -> None:
    p = load_builtin_profile("flux2-dev-q8_0")

    def size(name: str, shape: list[int], kept: tuple[str, ...]) -> float:
        n = math.prod(shape)
        if len(shape) <= 1:
            return n * 4
        return n * 2 if name.startswith(kept) else n * Q8_0

    assert p.modules["diffusion"].total == sum(size(n, s, KEEP) for n, s in layouts["flux2_dev_bfl"].items())
    text = {n: s for n, s in layouts["mistral_small_32_hf"].items() if n.startswith("language_model.") and read(n)}
    assert p.modules["te"].total == sum(size(n, s, ()) for n, s in text.items())
    assert p.modules["te"].encoders.keys() == {"llm"} and len(p.modules["te"].blocks) == 30
    for q in ("q5_k", "q4_k", "q4_0"):
        smaller = load_builtin_profile(f"flux2-dev-{q}")
        assert smaller.architecture == "flux2-dev"
        assert smaller.modules["diffusion"].total < p.modules["diffusion"].total
        assert smaller.modules["te"].total == p.modules["te"].total  # the Q8_0 encoder with every quant


def test_plan_from_the_profile_alone(shared_dir: Path) -> None:
    from rpc_util import sdplan_cmd

    r = subprocess.run(sdplan_cmd("plan", "--devices", str(shared_dir / "cases/devices/D1.json"),
                                  "--model-profile", "flux2-dev-q4_0", "--backend",
                                  "diffusion=CUDA0&CUDA1,te=CUDA0&CUDA1", "-W", "1024", "-H", "1024", "--json"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    for module, n in (("diffusion", 56), ("te", 30)):
        ranges = doc["modules"][module]["ranges"]
        assert [x["device"] for x in ranges] == ["CUDA0", "CUDA1"] and ranges[-1]["last_block"] == n - 1
    p = load_builtin_profile("flux2-dev-q4_0")
    fit = doc["fit"]
    assert sum(d["weights"] for d in fit["devices"].values()) == sum(m.total for m in p.modules.values())
    # a Q4_0 DiT (17.2 GiB) and the Q8_0 encoder's 30 layers read (17.2 GiB) exceed the 4090's and the 3060's
    # 33 GiB: the plan says so and advises keeping the weights in RAM (--params-backend)
    assert not fit["fits"] and any("--params-backend" in a for a in fit["advice"])
