"""Full-size FLUX.2 dev and Mistral-Small-3.2-24B layouts (``tests/fixtures/flux2_dev_layouts.json``,
built by ``make_flux2_dev_fixtures.py`` from the published configurations: ``../shared/models``
holds neither) with the FLUX.2 autoencoder's from ``../shared/models``, as sparse files in the
released dtypes: ``inspect`` names FLUX.2 dev and every module's bytes equal the layout's; the
encoder splits the 30 Mistral layers FLUX.2 dev reads only (its states after layers 10, 20,
30: layers 30..39, the final norm and the output head never load) (the Pixtral vision tower and projector of the
published checkpoint are its ``llm_vision`` part, no blocks); ``plan`` over D1's two GPUs
(``../shared/cases/devices``) splits 8 + 48 DiT blocks and the 30 LLM layers read with the right
sizes; the llama.cpp GGUF encoder (Q8_0) and a Q8_0 GGUF DiT are their quantised bytes.

Expected bytes are computed here from the layouts (elements x 2 for BF16, x 4 for F32; Q8_0
stores 32 values in 34 bytes), independently of the readers.
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
from test_real_layouts_flux2 import vae_bytes, vae_dtype, write_typed

FIX = Path(__file__).resolve().parent / "fixtures"
#: Parameters of the layouts: FLUX.2 dev's 32.22 B (64,446,562,304 bytes in bf16: the published
#: 64.4 GB), Mistral-Small-3.2-24B-Instruct-2506's 24.01 B (the vision tower's 0.44 B included).
DIT_PARAMS, MISTRAL_PARAMS = 32_223_281_152, 24_011_361_280
GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, Layout]:
    shared = json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())
    return {**json.loads((FIX / "flux2_dev_layouts.json").read_text()), "flux2_vae": shared["flux2_vae"]}


def gguf_layout(hf: Layout) -> Layout:
    """The text model of the checkpoint in llama.cpp names (``token_embd``, ``blk.N.attn_q``...,
    ``output_norm``, ``output``), as llama.cpp's converter writes Mistral-Small-3.2's GGUF."""
    out: Layout = {}
    for name, shape in hf.items():
        if not name.startswith("language_model."):
            continue
        rest = name.removeprefix("language_model.")
        if rest == "model.embed_tokens.weight":
            out["token_embd.weight"] = shape
        elif rest == "model.norm.weight":
            out["output_norm.weight"] = shape
        elif rest == "lm_head.weight":
            out["output.weight"] = shape
        else:
            _, _, i, role = rest.split(".", 3)
            stem = role.removesuffix(".weight")
            out[f"blk.{i}.{GGUF_NAMES[stem]}.weight"] = shape
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory, layouts) -> dict[str, tuple[Path, int]]:
    d = tmp_path_factory.mktemp("flux2_dev_real")
    return {"dit": (d / "flux2-dev.safetensors", write_sparse(d / "flux2-dev.safetensors", layouts["flux2_dev_bfl"])),
            "llm": (d / "mistral-small-3.2.safetensors",
                    write_sparse(d / "mistral-small-3.2.safetensors", layouts["mistral_small_32_hf"])),
            "vae": (d / "flux2-vae.safetensors", write_typed(d / "flux2-vae.safetensors", layouts["flux2_vae"],
                                                             vae_dtype))}


def flags(files: dict[str, tuple[Path, int]], dit: Path | None = None, llm: Path | None = None) -> dict[str, list[Path]]:
    return {"diffusion_model": [dit or files["dit"][0]], "llm": [llm or files["llm"][0]], "vae": [files["vae"][0]]}


def test_separate_files_inspect_as_flux2_dev(files, layouts) -> None:
    dl, ml = layouts["flux2_dev_bfl"], layouts["mistral_small_32_hf"]
    assert [sum(math.prod(s) for s in x.values()) for x in (dl, ml)] == [DIT_PARAMS, MISTRAL_PARAMS]
    assert files["dit"][1] == nbytes(dl) == 64_446_562_304
    ms = read_model_files(flags(files))
    arch = ms.architecture
    assert (arch.name, arch.family, arch.variant) == ("flux2-dev", "flux2", "dev")
    assert arch.evidence[:3] == ("8 double + 48 single blocks with shared modulation (double_stream_modulation_img: "
                                 "FLUX.2 DiT)", "width 6144, text width 15360",
                                 "48 single blocks: FLUX.2 [dev] (Mistral Small 3.2 text encoder)")
    assert "text encoder: llm, 40 blocks" in arch.evidence
    prof = ms.profile()
    diff, te, ae = prof.modules["diffusion"], prof.modules["te"], prof.modules["vae"]
    # FLUX.2 dev reads the states after blocks 10, 20, 30: layers 30..39, the final norm and the
    # output head never load (sd-cli's graph does not use them); the vision tower stays listed
    assert diff.total == files["dit"][1] and files["llm"][1] == nbytes(ml)
    assert te.total == nbytes(ml) - nbytes(ml, unread_hf)
    assert ae.total == files["vae"][1] == vae_bytes(layouts["flux2_vae"]) and not ae.blocks
    assert len(diff.blocks) == 56
    assert diff.blocks[0] == nbytes(dl, lambda n: n.startswith("double_blocks.0."))
    assert diff.blocks[8] == nbytes(dl, lambda n: n.startswith("single_blocks.0."))
    assert diff.other == nbytes(dl, lambda n: "_blocks." not in n)
    # the 40 Mistral layers are the blocks; the Pixtral tower and projector are llm_vision
    assert len(te.blocks) == 30 and te.block_encoder == "llm"
    assert te.blocks[7] == nbytes(ml, lambda n: n.startswith("language_model.model.layers.7."))
    vision = nbytes(ml, lambda n: n.startswith(("vision_tower.", "multi_modal_projector.")))
    assert te.encoders == {"llm": nbytes(ml) - vision - nbytes(ml, unread_hf), "llm_vision": vision}
    assert 0.8e9 < vision < 0.9e9 and nbytes(ml, unread_hf) == 10 * te.blocks[0] + 2 * (5120 + 131072 * 5120)


def test_inspect_command_names_the_family(files, layouts) -> None:
    from rpc_util import sdplan_cmd

    args = [a for k, v in flags(files).items() for a in (f"--{k.replace('_', '-')}", str(v[0]))]
    r = subprocess.run(sdplan_cmd("inspect", *args, "--json"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["architecture"]["name"] == "flux2-dev"
    mods = doc["modules"]
    assert (mods["diffusion"]["blocks"], mods["te"]["blocks"]) == (56, 30)
    assert [mods[m]["bytes"] for m in ("diffusion", "vae")] == [files[k][1] for k in ("dit", "vae")]
    assert mods["te"]["bytes"] == files["llm"][1] - nbytes(layouts["mistral_small_32_hf"], unread_hf)


def test_plan_on_d1s_two_gpus(files, shared_dir: Path) -> None:
    """Both GPUs of D1 (RTX 4090 + RTX 3060) under the DiT and the encoder: 56 DiT blocks and 30
    LLM layers (of 40; the rest are never read) in two contiguous ranges each, their bytes the blocks'; the weights of the plan
    are the files' less the vision tower, which FLUX.2 dev never loads (its reference pictures go
through the autoencoder); in bf16 the pair
    (60 GiB + 45 GiB) cannot fit 33 GiB of GPU memory, and the estimate says so."""
    prof = read_model_files(flags(files)).profile()
    inv = Inventory.from_json(json.loads((shared_dir / "cases/devices/D1.json").read_text()))
    plan = resolve(["--backend", "diffusion=CUDA0&CUDA1,te=CUDA0&CUDA1,vae=CUDA0"], inv, prof)
    for module, n in (("diffusion", 56), ("te", 30)):  # the te split: the 30 layers read
        ranges = plan.modules[module].ranges
        assert [r.device for r in ranges] == ["CUDA0", "CUDA1"]
        assert ranges[0].first_block == 0 and ranges[-1].last_block == n - 1
        assert ranges[0].last_block + 1 == ranges[1].first_block
        assert sum(r.bytes for r in ranges) == sum(prof.modules[module].blocks)
    te = prof.modules["te"]
    fit = estimate_plan(plan, prof, inv, width=1024, height=1024)
    assert sum(t.weights for t in fit.devices.values()) == sum(m.total for m in prof.modules.values()) - \
        te.encoders["llm_vision"]
    assert not fit.fits
    # reference pictures go through the autoencoder: sd-cli never loads the vision tower
    edit = estimate_plan(plan, prof, inv, width=1024, height=1024, ref_images=1)
    assert edit.modules["te"].weights == fit.modules["te"].weights
    # the DiT attends over 64 x 64 latent cells plus 512 text rows, 48 heads of width 6144
    tokens = 64 * 64 + 512
    assert estimate_plan(plan, prof, inv, width=1024, height=1024, engine="sd-cli").modules[
        "diffusion"].compute["CUDA1"] == 4 * (48 * tokens**2 + 4 * tokens * 4 * 6144)


def test_plan_command_over_d1(files, shared_dir: Path) -> None:
    from rpc_util import sdplan_cmd

    args = [a for k, v in flags(files).items() for a in (f"--{k.replace('_', '-')}", str(v[0]))]
    r = subprocess.run(sdplan_cmd("plan", "--devices", str(shared_dir / "cases/devices/D1.json"), *args,
                                  "--backend", "diffusion=CUDA0&CUDA1,te=CUDA0&CUDA1", "--json"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    mods = json.loads(r.stdout)["modules"]
    for module, n in (("diffusion", 56), ("te", 30)):
        ranges = mods[module]["ranges"]
        assert [x["device"] for x in ranges] == ["CUDA0", "CUDA1"] and ranges[-1]["last_block"] == n - 1


def unread_hf(name: str) -> bool:
    """A Mistral tensor FLUX.2 dev's graph never reads: layers 30..39, the final norm, the head."""
    if name in ("language_model.model.norm.weight", "language_model.lm_head.weight"):
        return True
    return name.startswith("language_model.model.layers.") and int(name.split(".")[3]) >= 30


def q8(keep: tuple[str, ...]):
    def kind(name: str, shape: list[int]) -> str:
        if len(shape) == 2 and not name.startswith(keep):
            return "Q8_0"
        return "F32" if len(shape) == 1 else "BF16"
    return kind


def q8_bytes(layout: Layout, pred) -> int:
    return sum(math.prod(s) // 32 * 34 if len(s) == 2 else math.prod(s) * 4 for n, s in layout.items() if pred(n))


def test_q8_0_gguf_dit_and_encoder(tmp_path: Path, files, layouts) -> None:
    dl = layouts["flux2_dev_bfl"]
    dit = tmp_path / "flux2-dev-Q8_0.gguf"
    dit_total = write_sparse_gguf(dit, dl, q8(("img_in.", "txt_in.", "time_in.", "guidance_in.", "final_layer.")))
    gl = gguf_layout(layouts["mistral_small_32_hf"])
    assert len(gl) == 40 * 9 + 3
    llm = tmp_path / "Mistral-Small-3.2-24B-Instruct-2506-Q8_0.gguf"
    llm_total = write_sparse_gguf(llm, gl, q8(("token_embd.",)))
    ms = read_model_files(flags(files, dit, llm))
    assert ms.architecture.name == "flux2-dev" and "text encoder: llm, 40 blocks" in ms.architecture.evidence
    prof = ms.profile()
    diff, te = prof.modules["diffusion"], prof.modules["te"]
    assert len(diff.blocks) == 56 and diff.total == dit_total
    assert diff.blocks[10] == q8_bytes(dl, lambda n: n.startswith("single_blocks.2."))
    assert 0.5 < dit_total / nbytes(dl) < 0.6
    unread = q8_bytes(gl, lambda n: n in ("output_norm.weight", "output.weight") or (
        n.startswith("blk.") and int(n.split(".")[1]) >= 30))
    assert len(te.blocks) == 30 and te.total == llm_total - unread and te.encoders == {"llm": te.total}
    assert te.blocks[29] == q8_bytes(gl, lambda n: n.startswith("blk.29."))


def test_library_pairs_dev_with_mistral_and_klein_with_qwen3(tmp_path: Path, layouts, shared_dir: Path) -> None:
    """A folder with FLUX.2 dev, klein 4B, the Mistral GGUF, Qwen3-4B and the FLUX.2
    autoencoder: each DiT runs with its own encoder and the 32-channel VAE."""
    from sdplan.core.modelfiles.library import LibraryCache, scan_library
    from sdplan.core.modelfiles.library_fit import combined_profile, companions

    shared = json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())
    write_sparse(tmp_path / "flux2-dev.safetensors", layouts["flux2_dev_bfl"])
    write_sparse(tmp_path / "flux-2-klein-4b.safetensors", shared["flux2_klein_4b"])
    write_sparse_gguf(tmp_path / "Mistral-Small-3.2-24B-Instruct-2506-Q8_0.gguf",
                      gguf_layout(layouts["mistral_small_32_hf"]), q8(("token_embd.",)))
    write_sparse(tmp_path / "qwen_3_4b.safetensors", shared["qwen3_4b_hf"])
    write_typed(tmp_path / "flux2-vae.safetensors", layouts["flux2_vae"], vae_dtype)
    entries = scan_library([tmp_path], LibraryCache(tmp_path / "cache.json")).entries
    by_name = {e.name: e for e in entries}
    assert (by_name["flux2-dev.safetensors"].family, by_name["flux2-dev.safetensors"].variant) == ("flux2", "dev")
    for dit, llm in (("flux2-dev.safetensors", "Mistral-Small-3.2-24B-Instruct-2506-Q8_0.gguf"),
                     ("flux-2-klein-4b.safetensors", "qwen_3_4b.safetensors")):
        flags, missing = companions(by_name[dit], entries)
        assert {k: Path(v[0]).name for k, v in flags.items()} == {
            "diffusion_model": dit, "llm": llm, "vae": "flux2-vae.safetensors"} and missing == ()
        # the library's profile from the files' cached ones is the files read together: the
        # encoder less the blocks, final norm and head the family never reads (30 of 40, 27 of 36)
        together = read_model_files(flags).profile()
        assert combined_profile([by_name[Path(v[0]).name] for v in flags.values()]) == together
        assert len(together.modules["te"].blocks) == (30 if "dev" in dit else 27)
        assert together.modules["te"].total < by_name[llm].weight_bytes
