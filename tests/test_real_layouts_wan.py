"""Full-size Wan 2.2 layouts from ``../shared/models`` as sparse F16 files (the released dtype):
``inspect`` names the family and model (TI2V-5B, T2V-A14B) and every module's bytes equal
the layout's, the high-noise expert of ``--high-noise-diffusion-model`` included; ``plan`` over
D1's two GPUs gives 40 blocks for each A14B expert, both experts as two diffusion phases on
the ``diffusion`` module's placement, and the estimate counts the switch between them (one
released, the other loaded) unless both fit; a Q8_0 GGUF expert's blocks are its quantised
bytes.

Expected bytes are computed here from the layouts (elements x 2 for F16; Q8_0 stores 32 values
in 34 bytes), independently of the readers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
from pathlib import Path

import pytest
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import Profile
from sdplan.core.planning.target import Target
from sparse_writer import Layout, write_sparse
from test_real_layouts import nbytes, write_sparse_gguf

#: Parameter counts the layouts' README states (5.00 B, 14.29 B per expert, 5.68 B with the
#: tokenizer blob, 704.7 M, 126.9 M).
PARAMS = {"wan22_ti2v_5b": 4_999_787_712, "wan22_t2v_a14b": 14_288_491_584,
          "umt5_xxl": 5_685_458_649, "wan22_vae": 704_688_668, "wan21_vae": 126_892_531}
GIB = 1 << 30


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, Layout]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


@pytest.fixture(scope="module")
def files(tmp_path_factory, layouts) -> dict[str, tuple[Path, int]]:
    d = tmp_path_factory.mktemp("wan_real")
    return {k: (d / f"{k}.safetensors", write_sparse(d / f"{k}.safetensors", layouts[k], "F16"))
            for k in PARAMS}


def a14b(files, dit: Path | None = None, high: Path | None = None) -> dict[str, list[Path]]:
    return {"diffusion_model": [dit or files["wan22_t2v_a14b"][0]],
            "high_noise_diffusion_model": [high or files["wan22_t2v_a14b"][0]],
            "t5xxl": [files["umt5_xxl"][0]], "vae": [files["wan21_vae"][0]]}


def d1(shared_dir: Path) -> Inventory:
    return Inventory.from_json(json.loads((shared_dir / "cases/devices/D1.json").read_text()))


def test_layout_sizes_are_the_published_ones(layouts) -> None:
    for key, n in PARAMS.items():
        assert sum(math.prod(s) for s in layouts[key].values()) == n, key


def test_ti2v_5b_inspects_as_wan(files, layouts) -> None:
    ms = read_model_files({"diffusion_model": [files["wan22_ti2v_5b"][0]],
                           "t5xxl": [files["umt5_xxl"][0]], "vae": [files["wan22_vae"][0]]})
    arch = ms.architecture
    assert (arch.family, arch.variant, arch.name) == ("wan", "ti2v_5b", "wan-ti2v_5b")
    assert arch.evidence == ("30 blocks with self_attn/cross_attn and cross_attn.norm_k (Wan DiT)",
                             "width 3072, patch_embedding inputs 48",
                             "48 latent channels: Wan 2.2 TI2V-5B (the Wan 2.2 autoencoder)",
                             "text encoder: UMT5-XXL (--t5xxl)")
    prof = ms.profile()
    dl, ul = layouts["wan22_ti2v_5b"], layouts["umt5_xxl"]
    diff, te, ae = prof.modules["diffusion"], prof.modules["te"], prof.modules["vae"]
    assert diff.total == files["wan22_ti2v_5b"][1] == nbytes(dl) and len(diff.blocks) == 30
    assert diff.blocks[3] == nbytes(dl, lambda n: n.startswith("blocks.3."))
    assert diff.other == nbytes(dl, lambda n: not n.startswith("blocks."))
    # UMT5-XXL: 24 blocks split as T5-XXL's are; the shared embedding, final norm and the
    # tokenizer blob (written F16 here, U8 in the real file) are the rest
    assert te.total == files["umt5_xxl"][1] == nbytes(ul) and len(te.blocks) == 24
    assert te.block_encoder == "t5xxl" and te.encoders == {"t5xxl": nbytes(ul)}
    assert te.blocks[0] == nbytes(ul, lambda n: n.startswith("encoder.block.0."))
    assert ae.total == files["wan22_vae"][1] == nbytes(layouts["wan22_vae"]) and not ae.blocks
    assert not prof.phases


def test_a14b_pair_is_two_phases_of_diffusion(files, layouts) -> None:
    ms = read_model_files(a14b(files))
    assert ms.architecture.name == "wan-t2v_a14b"
    prof = ms.profile()
    el = layouts["wan22_t2v_a14b"]
    low, high = prof.modules["diffusion"], prof.phases["high_noise"]
    for expert in (low, high):
        assert expert.total == files["wan22_t2v_a14b"][1] == nbytes(el) and len(expert.blocks) == 40
        assert expert.blocks[39] == nbytes(el, lambda n: n.startswith("blocks.39."))
    assert prof.modules["te"].total == nbytes(layouts["umt5_xxl"])
    assert prof.modules["vae"].total == nbytes(layouts["wan21_vae"])
    # the profile's JSON form keeps the phase
    back = Profile.from_json(json.loads(json.dumps(prof.to_json())))
    assert back.phases["high_noise"].blocks == high.blocks
    with pytest.raises(Exception, match="phases"):
        Profile.from_json({"modules": {}, "phases": {"middle_noise": {"blocks": []}}})


def test_inspect_command_names_the_family_and_both_experts(files) -> None:
    from rpc_util import sdplan_cmd

    args = [a for k, v in a14b(files).items() for a in (f"--{k.replace('_', '-')}", str(v[0]))]
    r = subprocess.run(sdplan_cmd("inspect", *args, "--json"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["architecture"]["name"] == "wan-t2v_a14b"
    mods = doc["modules"]
    expert = files["wan22_t2v_a14b"][1]
    assert (mods["diffusion"]["bytes"], mods["diffusion"]["blocks"]) == (expert, 40)
    assert (mods["diffusion"]["high_noise"]["bytes"], mods["diffusion"]["high_noise"]["blocks"]) == (expert, 40)
    assert mods["diffusion"]["dtypes"] == {"F16": expert}
    assert (mods["te"]["bytes"], mods["te"]["blocks"]) == (files["umt5_xxl"][1], 24)
    assert mods["vae"]["bytes"] == files["wan21_vae"][1]
    assert doc["profile"]["phases"]["high_noise"]["other"] == mods["diffusion"]["other_bytes"]


def test_plan_on_d1s_two_gpus_splits_each_expert(files, shared_dir: Path) -> None:
    """Both GPUs of D1 (RTX 4090 + RTX 3060) under the DiT, UMT5 on the CPU: each expert's 40
    blocks in two contiguous ranges over the same devices, the high-noise expert first. Two
    F16 experts (26.6 GiB each) do not fit 33 GiB of GPUs together, so sdplan's engine loads
    one at a time: the larger per device with the compute buffer is the peak."""
    prof = read_model_files(a14b(files)).profile()
    inv = d1(shared_dir)
    plan = resolve(["--backend", "diffusion=CUDA0&CUDA1,te=CPU,vae=CUDA0"], inv, prof)
    high, low = plan.phases
    assert (high.name, high.flag, low.name, low.flag) == (
        "high_noise", "--high-noise-diffusion-model", "low_noise", "--diffusion-model")
    for phase in plan.phases:
        assert [r.device for r in phase.ranges] == ["CUDA0", "CUDA1"]
        assert phase.ranges[0].first_block == 0 and phase.ranges[-1].last_block == 39
        assert phase.ranges[0].last_block + 1 == phase.ranges[1].first_block
        assert sum(r.bytes for r in phase.ranges) == sum(prof.phases["high_noise"].blocks)
        assert phase.bytes == files["wan22_t2v_a14b"][1]
    assert low.ranges == plan.modules["diffusion"].ranges
    fit = estimate_plan(plan, prof, inv, width=832, height=480)
    d = fit.modules["diffusion"]
    assert d.phase_residency == "switch" and d.weights == {}
    on0 = high.main_other_bytes + high.ranges[0].bytes
    assert d.phases["high_noise"] == {"CUDA0": on0, "CUDA1": high.ranges[1].bytes}
    assert d.staging == d.phases["low_noise"] == d.phases["high_noise"]
    vae = prof.modules["vae"].total
    assert fit.devices["CUDA0"].total == vae + on0 + d.compute["CUDA0"]
    assert fit.fits
    # 81 frames (21 latent frames of 60 x 104 cells, 2x2 patches) and 512 UMT5 tokens attend
    # together: with sd-cli's --diffusion-fa no score matrix, 4 live activations 4 x 5120 wide
    tokens = 21 * (60 * 104 // 4) + 512
    video = estimate_plan(plan, prof, inv, width=832, height=480, engine="sd-cli-fa", frames=81)
    assert video.modules["diffusion"].compute["CUDA1"] == 4 * 4 * tokens * 4 * 5120
    # sd-cli decodes a latent frame (4 frames) at a time: its decoder's activations are 4 frames'
    assert video.modules["vae"].compute["CUDA0"] == 4 * (60 * 104 * 60 * 104 + 4 * 128 * 832 * 480 * 4)


def test_both_experts_stay_when_they_fit(files, shared_dir: Path) -> None:
    """With three times D1's GPU memory both experts stay resident (sd-cli's way, no switch);
    sd-cli's estimate keeps both resident whatever fits (it never releases an expert; with its
    auto-fit off, as its newest auto-fit counts both experts as diffusion and moves them)."""
    prof = read_model_files(a14b(files)).profile()
    big = Inventory(tuple(dataclasses.replace(d, free=d.free * 3, total=d.total * 3) for d in d1(shared_dir)))
    args = ["--backend", "diffusion=CUDA0&CUDA1,te=CPU,vae=CUDA0"]
    plan = resolve(args, big, prof)
    d = estimate_plan(plan, prof, big, width=832, height=480).modules["diffusion"]
    high, low = plan.phases
    assert d.phase_residency == "both" and d.staging == {}
    assert d.weights["CUDA1"] == high.ranges[1].bytes + low.ranges[1].bytes
    small = d1(shared_dir)
    plan = resolve([*args, "--auto-fit", "off"], small, prof, Target("sd-cli", "newest"))
    assert plan.modules["diffusion"].params.mode == "runtime"
    d = estimate_plan(plan, prof, small, width=832, height=480, engine="sd-cli").modules["diffusion"]
    assert d.phase_residency == "both" and d.weights["CUDA0"] > 30 * GIB


def test_params_backend_applies_to_both_experts(files, shared_dir: Path) -> None:
    """``--params-backend diffusion=CPU``: both experts live in RAM and each is staged to the
    GPUs for its phase (sd-cli registers both under the diffusion module's params backend)."""
    prof = read_model_files(a14b(files)).profile()
    inv = d1(shared_dir)
    inv = Inventory(tuple(dataclasses.replace(d, free=d.free * 2) if d.type == "cpu" else d for d in inv))
    plan = resolve(["--backend", "diffusion=CUDA0&CUDA1,te=CPU,vae=CUDA0",
                    "--params-backend", "diffusion=CPU"], inv, prof)
    assert plan.modules["diffusion"].params.mode == "device"
    d = estimate_plan(plan, prof, inv, width=832, height=480).modules["diffusion"]
    assert d.weights == {"CPU": 2 * files["wan22_t2v_a14b"][1]}
    assert d.phase_residency == "switch" and d.staging["CUDA1"] == plan.phases[0].ranges[1].bytes


def test_plan_command_over_d1(files, shared_dir: Path) -> None:
    from rpc_util import sdplan_cmd

    args = [a for k, v in a14b(files).items() for a in (f"--{k.replace('_', '-')}", str(v[0]))]
    r = subprocess.run(sdplan_cmd("plan", "--devices", str(shared_dir / "cases/devices/D1.json"), *args,
                                  "--backend", "diffusion=CUDA0&CUDA1,te=CPU,vae=CUDA0", "--json"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [p["name"] for p in doc["phases"]] == ["high_noise", "low_noise"]
    for phase in doc["phases"]:
        assert [x["device"] for x in phase["ranges"]] == ["CUDA0", "CUDA1"]
        assert phase["ranges"][-1]["last_block"] == 39
    assert doc["fit"]["modules"]["diffusion"]["phase_residency"] == "switch"
    r = subprocess.run(sdplan_cmd("plan", "--devices", str(shared_dir / "cases/devices/D1.json"), *args,
                                  "--backend", "diffusion=CUDA0&CUDA1,te=CPU,vae=CUDA0"),
                       capture_output=True, text=True, timeout=300)
    assert "diffusion phase high_noise (--high-noise-diffusion-model, 26.61 GiB): CUDA0: 0-" in r.stdout
    assert "one expert at a time" in r.stdout


def test_q8_0_gguf_experts(tmp_path: Path, files, layouts, shared_dir: Path) -> None:
    """Q8_0 GGUF experts (the city96/QuantStack files keep the embeddings, head and norms
    unquantised): blocks are their quantised bytes, and two of them (about 14.8 GiB each) fit
    D1's two GPUs together, so both stay resident (the F16 pair switches)."""
    # GGUF holds at most 4 dimensions: the 5-D patch_embedding is stored flattened (city96's
    # files keep the original shape in metadata), the bytes are the same
    el = {n: s if len(s) < 5 else [*s[:3], math.prod(s[3:])] for n, s in layouts["wan22_t2v_a14b"].items()}

    def kind(name: str, shape: list[int]) -> str:
        if len(shape) == 2 and name.startswith("blocks.") and shape[-1] % 32 == 0:
            return "Q8_0"
        return "F32" if len(shape) == 1 else "F16"

    low, high = tmp_path / "low-Q8_0.gguf", tmp_path / "high-Q8_0.gguf"
    total = write_sparse_gguf(low, el, kind)
    write_sparse_gguf(high, el, kind)
    ms = read_model_files(a14b(files, low, high))
    assert ms.architecture.name == "wan-t2v_a14b"
    prof = ms.profile()
    for expert in (prof.modules["diffusion"], prof.phases["high_noise"]):
        assert len(expert.blocks) == 40 and expert.total == total
        assert expert.blocks[7] == sum(math.prod(s) // 32 * 34 if kind(n, s) == "Q8_0" else
                                       math.prod(s) * (4 if len(s) == 1 else 2)
                                       for n, s in el.items() if n.startswith("blocks.7."))
    assert 0.5 < total / nbytes(el) < 0.56
    inv = d1(shared_dir)
    plan = resolve(["--backend", "diffusion=CUDA0&CUDA1,te=CPU,vae=CUDA0"], inv, prof)
    fit = estimate_plan(plan, prof, inv, width=832, height=480)
    d = fit.modules["diffusion"]
    high, low = (d.phases[p] for p in ("high_noise", "low_noise"))
    assert d.phase_residency == "both" and fit.fits
    assert d.weights == {dev: high[dev] + low[dev] for dev in ("CUDA0", "CUDA1")}
    assert all(fit.devices[dev].total <= fit.devices[dev].free for dev in ("CUDA0", "CUDA1"))
