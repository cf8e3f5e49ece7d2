"""Full-size Qwen-Image, Qwen2.5-VL-7B and Qwen-Image VAE layouts from ``../shared/models`` as
sparse BF16 files (the released dtypes): ``inspect`` names the family and every module's bytes
equal the layout's; the encoder splits its 28 LLM layers only (its vision tower and projector
are no blocks); ``plan`` over D1's two GPUs (``../shared/cases/devices``) gives 60 diffusion
blocks and 28 LLM layers, keeps the vision tower on the main device and counts it only for a
run with reference pictures; a Q8_0 GGUF DiT's blocks are its quantised bytes.

Expected bytes are computed here from the layouts (elements x 2 for BF16; Q8_0 stores 32
values in 34 bytes), independently of the readers.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.plan import resolve
from sparse_writer import Layout, write_sparse
from test_real_layouts import nbytes, write_sparse_gguf

#: The published files' sizes (``shared/models/README.md``) less their safetensors headers are
#: the layouts' BF16 bytes; these are the parameter counts the README states.
DIT_PARAMS, LLM_PARAMS, VAE_PARAMS = 20_430_401_088, 8_292_166_656, 126_892_531


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, Layout]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


@pytest.fixture(scope="module")
def files(tmp_path_factory, layouts) -> dict[str, tuple[Path, int]]:
    d = tmp_path_factory.mktemp("qwen_real")
    out = {}
    for key, name, layout in (("dit", "qwen_image_bf16.safetensors", "qwen_image_dit"),
                              ("llm", "qwen_2.5_vl_7b.safetensors", "qwen25vl_7b_llm"),
                              ("vae", "qwen_image_vae.safetensors", "qwen_image_vae")):
        out[key] = (d / name, write_sparse(d / name, layouts[layout]))
    return out


def flags(files: dict[str, tuple[Path, int]], dit: Path | None = None) -> dict[str, list[Path]]:
    return {"diffusion_model": [dit or files["dit"][0]], "llm": [files["llm"][0]], "vae": [files["vae"][0]]}


def test_separate_files_inspect_as_qwen_image(files, layouts) -> None:
    dl, ll, vl = layouts["qwen_image_dit"], layouts["qwen25vl_7b_llm"], layouts["qwen_image_vae"]
    assert [sum(math.prod(s) for s in x.values()) for x in (dl, ll, vl)] == [DIT_PARAMS, LLM_PARAMS, VAE_PARAMS]
    ms = read_model_files(flags(files))
    arch = ms.architecture
    assert arch.name == "qwen_image" and arch.family == "qwen_image" and arch.variant is None
    assert arch.evidence[:2] == ("60 transformer blocks with img_mod/txt_mod (Qwen-Image MMDiT)",
                                 "width 3072, text width 3584: a Qwen2.5-VL-7B text encoder")
    assert "text encoder: qwen2.5, 28 blocks" in arch.evidence
    assert "vision tower: 32 blocks (reference pictures; stays on the main device)" in arch.evidence
    prof = ms.profile()
    diff, te, ae = prof.modules["diffusion"], prof.modules["te"], prof.modules["vae"]
    assert diff.total == files["dit"][1] == nbytes(dl) and te.total == files["llm"][1] == nbytes(ll)
    assert ae.total == files["vae"][1] == nbytes(vl) and not ae.blocks
    assert len(diff.blocks) == 60 and diff.blocks[0] == nbytes(dl, lambda n: n.startswith("transformer_blocks.0."))
    assert diff.other == nbytes(dl, lambda n: not n.startswith("transformer_blocks."))
    # the LLM's 28 layers are the blocks; the vision tower (32 blocks, merger) is its own encoder
    assert len(te.blocks) == 28 and te.block_encoder == "llm"
    assert te.blocks[5] == nbytes(ll, lambda n: n.startswith("model.layers.5."))
    vision = nbytes(ll, lambda n: n.startswith("visual."))
    assert te.encoders == {"llm": nbytes(ll) - vision, "llm_vision": vision} and 1.3e9 < vision < 1.4e9


def test_inspect_command_names_the_family(files) -> None:
    from rpc_util import sdplan_cmd

    args = [a for k, v in flags(files).items() for a in (f"--{k.replace('_', '-')}", str(v[0]))]
    r = subprocess.run(sdplan_cmd("inspect", *args, "--json"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["architecture"]["name"] == "qwen_image"
    mods = doc["modules"]
    assert (mods["diffusion"]["blocks"], mods["te"]["blocks"]) == (60, 28)
    assert [mods[m]["bytes"] for m in ("diffusion", "te", "vae")] == [files[k][1] for k in ("dit", "llm", "vae")]


def test_plan_on_d1s_two_gpus(files, shared_dir: Path) -> None:
    """Both GPUs of D1 (RTX 4090 + RTX 3060) under the DiT and the encoder: 60 DiT blocks and 28
    LLM layers in two contiguous ranges each; the vision tower's bytes on the main device only
    for a run with a reference picture (sd-cli's rule: it is never split)."""
    prof = read_model_files(flags(files)).profile()
    inv = Inventory.from_json(json.loads((shared_dir / "cases/devices/D1.json").read_text()))
    plan = resolve(["--backend", "diffusion=CUDA0&CUDA1,te=CUDA0&CUDA1,vae=CUDA0"], inv, prof)
    for module, n in (("diffusion", 60), ("te", 28)):
        ranges = plan.modules[module].ranges
        assert [r.device for r in ranges] == ["CUDA0", "CUDA1"]
        assert ranges[0].first_block == 0 and ranges[-1].last_block == n - 1
        assert ranges[0].last_block + 1 == ranges[1].first_block
        assert sum(r.bytes for r in ranges) == sum(prof.modules[module].blocks)
    te = prof.modules["te"]
    vision = te.encoders["llm_vision"]
    plain = estimate_plan(plan, prof, inv, width=1024, height=1024)
    edit = estimate_plan(plan, prof, inv, width=1024, height=1024, ref_images=1)
    w0, w1 = plain.modules["te"].weights, edit.modules["te"].weights
    assert w1["CUDA0"] - w0["CUDA0"] == vision and w1["CUDA1"] == w0["CUDA1"]
    assert w1["CUDA0"] == te.other + plan.modules["te"].ranges[0].bytes
    # the DiT attends over 64 x 64 latent cells (2x2 patches) plus 256 text tokens, 24 heads
    tokens = 64 * 64 + 256
    assert estimate_plan(plan, prof, inv, width=1024, height=1024, engine="sd-cli").modules[
        "diffusion"].compute["CUDA1"] == 4 * (24 * tokens**2 + 4 * tokens * 4 * 3072)


def test_plan_command_over_d1(files, shared_dir: Path) -> None:
    from rpc_util import sdplan_cmd

    args = [a for k, v in flags(files).items() for a in (f"--{k.replace('_', '-')}", str(v[0]))]
    r = subprocess.run(sdplan_cmd("plan", "--devices", str(shared_dir / "cases/devices/D1.json"), *args,
                                  "--backend", "diffusion=CUDA0&CUDA1,te=CUDA0&CUDA1", "--json"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    mods = json.loads(r.stdout)["modules"]
    for module, n in (("diffusion", 60), ("te", 28)):
        ranges = mods[module]["ranges"]
        assert [x["device"] for x in ranges] == ["CUDA0", "CUDA1"] and ranges[-1]["last_block"] == n - 1


def test_q8_0_gguf_dit(tmp_path: Path, files, layouts) -> None:
    dl = layouts["qwen_image_dit"]
    keep = ("img_in.", "txt_in.", "time_text_embed.", "norm_out.", "proj_out.")

    def kind(name: str, shape: list[int]) -> str:
        if len(shape) == 2 and not name.startswith(keep):
            return "Q8_0"
        return "F32" if len(shape) == 1 else "BF16"

    path = tmp_path / "qwen-image-Q8_0.gguf"
    total = write_sparse_gguf(path, dl, kind)
    ms = read_model_files(flags(files, path))
    assert ms.architecture.name == "qwen_image"
    diff = ms.profile().modules["diffusion"]
    assert len(diff.blocks) == 60 and diff.total == total
    assert diff.blocks[7] == sum(math.prod(s) // 32 * 34 if len(s) == 2 else math.prod(s) * 4
                                 for n, s in dl.items() if n.startswith("transformer_blocks.7."))
    assert 0.5 < total / nbytes(dl) < 0.56


def test_vision_tower_of_the_published_encoder(layouts) -> None:
    """The vision tower's graph reads Qwen2.5-VL-7B's ``visual.*`` layout with the published
    sizes it does not find in the shapes (80-wide heads, full attention in blocks 7, 15, 23, 31,
    112-pixel windows): every tensor listed once, none left out."""
    from sdplan.core.models.qwen25vl_vision import VisionTower

    shapes = {n: tuple(s) for n, s in layouts["qwen25vl_7b_llm"].items()}
    tower = VisionTower.from_weights(shapes)
    c = tower.cfg
    assert (c.width, c.heads, c.head_dim, c.ffn, c.n_blocks, c.out_width) == (1280, 16, 80, 3420, 32, 3584)
    assert c.full_blocks == (7, 15, 23, 31) and c.window == 112
    names = tower.other_tensors() + [n for i in range(tower.n_blocks) for n in tower.block_tensors(i)]
    assert sorted(names) == sorted(n for n in shapes if n.startswith("visual."))
    specs = tower.input_specs({"patches": (1024, 1176)})  # a 448 x 448 picture: 32 x 32 patches
    assert specs["mask"] == ((1024, 1024), "f32") and specs["order"] == ((256,), "i32")
