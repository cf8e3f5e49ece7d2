"""Full-size FLUX.2 klein 4B, Qwen3-4B and FLUX.2 autoencoder layouts from ``../shared/models``
as sparse files: the separate files (bf16 DiT and encoder, f32 autoencoder with its int64
batch counter), a Q8_0 GGUF DiT, the diffusers folder's transformer, and one prefixed
single file inspect as FLUX.2 klein 4B with a Qwen3 encoder, 5 + 20 and 27 splittable
blocks (klein reads Qwen3-4B's states after blocks 9, 18, 27: blocks 27..35 and the final norm
never load, in sd-cli as in sdplan's engine) and sizes equal to the layouts' bytes (the
encoder's: its read blocks and token embedding), and plan on two GPUs with both modules split.

Expected bytes are computed here from the layouts (elements x 2 for bf16, x 4 for f32, 8 for
the int64 scalar; Q8_0 stores 32 values in 34 bytes), independently of the readers.
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
from test_real_layouts import nbytes, write_sparse, write_sparse_gguf

Layout = dict[str, list[int]]
GIB = 1 << 30
#: Qwen3-4B blocks FLUX.2 klein reads: up to its last state, after block 27 (sd-cli's out layers 9, 18, 27)
READ = 27
KLEIN_4B_PARAMS = 3_875_544_576  # the layout's elements ("3.88 B" in shared/models/README.md)


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, Layout]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


def write_typed(path: Path, shapes: Layout, dtype_of) -> int:
    """A sparse safetensors file with each tensor in ``dtype_of(name, shape)``; returns data bytes."""
    size = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8}
    header, off = {}, 0
    for name, shape in shapes.items():
        dt = dtype_of(name, shape)
        n = math.prod(shape) * size[dt]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        fh.seek(off - 1, 1)
        fh.write(b"\0")
    return off


def vae_dtype(name: str, shape: list[int]) -> str:
    return "I64" if name == "bn.num_batches_tracked" else "F32"


def vae_bytes(layout: Layout) -> int:
    return nbytes(layout, lambda n: n != "bn.num_batches_tracked", 4) + 8


_TOP = {"img_in": "x_embedder", "txt_in": "context_embedder", "final_layer.linear": "proj_out",
        "final_layer.adaLN_modulation.1": "norm_out.linear",
        "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
        "time_in.out_layer": "time_guidance_embed.timestep_embedder.linear_2"}
_DOUBLE = {"img_attn.norm.query_norm.scale": "attn.norm_q.weight", "img_attn.norm.key_norm.scale": "attn.norm_k.weight",
           "img_attn.proj.weight": "attn.to_out.0.weight", "img_mlp.0.weight": "ff.linear_in.weight",
           "img_mlp.2.weight": "ff.linear_out.weight", "txt_attn.norm.query_norm.scale": "attn.norm_added_q.weight",
           "txt_attn.norm.key_norm.scale": "attn.norm_added_k.weight", "txt_attn.proj.weight": "attn.to_add_out.weight",
           "txt_mlp.0.weight": "ff_context.linear_in.weight", "txt_mlp.2.weight": "ff_context.linear_out.weight"}
_SINGLE = {"linear1.weight": "attn.to_qkv_mlp_proj.weight", "linear2.weight": "attn.to_out.weight",
           "norm.query_norm.scale": "attn.norm_q.weight", "norm.key_norm.scale": "attn.norm_k.weight"}


def diffusers_names(layout: Layout) -> Layout:
    """The BFL klein layout in diffusers ``Flux2Transformer2DModel`` names (the inverse of
    diffusers' ``convert_flux2_transformer_checkpoint_to_diffusers``: fused qkv split in three)."""
    out: Layout = {}
    for name, shape in layout.items():
        if name.startswith("double_blocks."):
            _, i, rest = name.split(".", 2)
            if rest.endswith("attn.qkv.weight"):
                parts = ("to_q", "to_k", "to_v") if rest.startswith("img") else ("add_q_proj", "add_k_proj", "add_v_proj")
                out |= {f"transformer_blocks.{i}.attn.{p}.weight": [shape[0] // 3, shape[1]] for p in parts}
            else:
                out[f"transformer_blocks.{i}.{_DOUBLE[rest]}"] = shape
        elif name.startswith("single_blocks."):
            _, i, rest = name.split(".", 2)
            out[f"single_transformer_blocks.{i}.{_SINGLE[rest]}"] = shape
        else:
            stem = name.removesuffix(".weight")
            out[_TOP.get(stem, stem.replace(".lin", ".linear")) + ".weight"] = shape
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory, layouts) -> dict[str, tuple[Path, int]]:
    d = tmp_path_factory.mktemp("flux2_real")
    out = {"dit": (d / "flux-2-klein-4b.safetensors", 0), "llm": (d / "qwen_3_4b.safetensors", 0),
           "vae": (d / "flux2-vae.safetensors", 0)}
    out["dit"] = (out["dit"][0], write_sparse(out["dit"][0], layouts["flux2_klein_4b"]))
    out["llm"] = (out["llm"][0], write_sparse(out["llm"][0], layouts["qwen3_4b_hf"]))
    out["vae"] = (out["vae"][0], write_typed(out["vae"][0], layouts["flux2_vae"], vae_dtype))
    return out


def read_te(layout: Layout, prefix: str = "") -> int:
    """BF16 bytes of the Qwen3-4B tensors klein's graph uses, from the layout's names alone:
    ``model.layers.0..26`` and the token embedding (not ``model.norm``: the final state is not
    read); 298 of the 398 tensors, as sd-cli loads them."""
    layout = {n.removeprefix(prefix): s for n, s in layout.items() if n.startswith(prefix)}

    def used(n: str) -> bool:
        return n == "model.embed_tokens.weight" or (
            n.startswith("model.layers.") and int(n.split(".")[2]) < READ)
    assert sum(map(used, layout)) == 298 and len(layout) == 398
    return nbytes(layout, used)


def test_separate_files_inspect_as_klein_4b(files, layouts) -> None:
    kl = layouts["flux2_klein_4b"]
    assert len(kl) == 149 and sum(math.prod(s) for s in kl.values()) == KLEIN_4B_PARAMS
    (dit, dit_bytes), (llm, llm_bytes), (vae, vbytes) = files["dit"], files["llm"], files["vae"]
    assert dit_bytes == nbytes(kl) and vbytes == vae_bytes(layouts["flux2_vae"])
    ms = read_model_files({"diffusion_model": [dit], "llm": [llm], "vae": [vae]})
    arch = ms.architecture
    assert arch.name == "flux2_klein-4b"
    assert any("5 double + 20 single blocks with shared modulation" in e for e in arch.evidence)
    assert any("width 3072, text width 7680" in e for e in arch.evidence)
    assert "text encoder: qwen3, 36 blocks" in arch.evidence
    prof = ms.profile()
    diff, te, ae = prof.modules["diffusion"], prof.modules["te"], prof.modules["vae"]
    assert len(diff.blocks) == 25 and len(te.blocks) == READ and not ae.blocks
    # the plan's te holds the 27 read blocks and the embedding: the file less 9 blocks and the final norm
    qwen = layouts["qwen3_4b_hf"]
    assert llm_bytes == nbytes(qwen) and diff.total == dit_bytes and te.total == read_te(qwen)
    assert llm_bytes - te.total == nbytes(qwen, lambda n: n == "model.norm.weight" or (
        n.startswith("model.layers.") and int(n.split(".")[2]) >= READ)) == 9 * te.blocks[0] + 2 * 2560
    assert te.blocks == tuple(nbytes(qwen, lambda n, i=i: n.startswith(f"model.layers.{i}.")) for i in range(READ))
    assert te.other == nbytes(qwen, lambda n: n == "model.embed_tokens.weight")
    assert ae.total == vbytes
    assert diff.blocks[0] == nbytes(kl, lambda n: n.startswith("double_blocks.0."))
    assert diff.blocks[5] == nbytes(kl, lambda n: n.startswith("single_blocks.0."))
    shared = nbytes(kl, lambda n: "stream_modulation" in n)
    assert diff.other == nbytes(kl, lambda n: "_blocks." not in n) and diff.other > shared > 0.2e9
    assert te.encoders == {"llm": te.total} and te.block_encoder == "llm"
    # sd-cli's --auto-fit still counts every tensor of the file (backend_fit.cpp estimate_components)
    assert prof.autofit["te"] == llm_bytes + 64 * 398


def test_plans_on_two_gpus_with_both_modules_split(files) -> None:
    prof = read_model_files({"diffusion_model": [files["dit"][0]], "llm": [files["llm"][0]],
                             "vae": [files["vae"][0]]}).profile()
    inv = Inventory.from_json({"devices": [
        {"name": n, "type": "gpu", "registry": "CUDA", "free": 12 * GIB, "total": 12 * GIB}
        for n in ("CUDA0", "CUDA1")] + [
        {"name": "CPU", "type": "cpu", "registry": "CPU", "free": 32 * GIB, "total": 32 * GIB}]})
    plan = resolve(["--backend", "diffusion=CUDA0&CUDA1,te=CUDA0&CUDA1,vae=CUDA0"], inv, prof)
    # the te split covers only the 27 blocks klein reads
    for module, n in (("diffusion", 25), ("te", READ)):
        ranges = plan.modules[module].ranges
        assert [r.device for r in ranges] == ["CUDA0", "CUDA1"]
        assert ranges[0].first_block == 0 and ranges[-1].last_block == n - 1
        assert ranges[0].last_block + 1 == ranges[1].first_block
        assert sum(r.bytes for r in ranges) == sum(prof.modules[module].blocks)
    fit = estimate_plan(plan, prof, inv, width=1024, height=1024)
    assert sum(t.weights for t in fit.devices.values()) == sum(m.total for m in prof.modules.values())
    # the DiT attends over 64 x 64 latent cells plus 512 text tokens, 24 heads
    tokens = 64 * 64 + 512
    assert fit.modules["diffusion"].compute["CUDA1"] == 4 * (24 * tokens**2 + 4 * tokens * 4 * 3072)
    assert fit.fits


def test_q8_0_gguf_dit(tmp_path: Path, files, layouts) -> None:
    kl = layouts["flux2_klein_4b"]
    keep = ("img_in.", "txt_in.", "time_in.", "final_layer.")

    def kind(name: str, shape: list[int]) -> str:
        if len(shape) == 2 and not name.startswith(keep):
            return "Q8_0"
        return "F32" if len(shape) == 1 else "BF16"

    path = tmp_path / "flux-2-klein-4b-Q8_0.gguf"
    total = write_sparse_gguf(path, kl, kind)
    ms = read_model_files({"diffusion_model": [path], "llm": [files["llm"][0]]})
    assert ms.architecture.name == "flux2_klein-4b"
    diff = ms.profile().modules["diffusion"]
    assert len(diff.blocks) == 25 and diff.total == total
    assert diff.blocks[7] == sum(math.prod(s) // 32 * 34 if len(s) == 2 else math.prod(s) * 4
                                 for n, s in kl.items() if n.startswith("single_blocks.2."))
    assert 0.5 < total / nbytes(kl) < 0.6


def test_diffusers_folder_transformer(tmp_path: Path, layouts) -> None:
    folder = tmp_path / "FLUX.2-klein-4B"
    (folder / "transformer").mkdir(parents=True)
    (folder / "text_encoder").mkdir()
    dl = diffusers_names(layouts["flux2_klein_4b"])
    assert len(dl) == 149 + 4 * 5  # two fused qkv per double block split in three
    data = write_sparse(folder / "transformer" / "diffusion_pytorch_model.safetensors", dl)
    write_sparse(folder / "text_encoder" / "model.safetensors", layouts["qwen3_4b_hf"])
    ms = read_model_files({"model": [folder]})
    assert ms.architecture.name == "flux2_klein-4b"
    diff = ms.profile().modules["diffusion"]
    assert len(diff.blocks) == 25 and diff.total == data == nbytes(layouts["flux2_klein_4b"])
    assert diff.blocks[0] == nbytes(dl, lambda n: n.startswith("transformer_blocks.0."))
    assert ms.profile().modules["te"].block_encoder == "llm"


def test_one_prefixed_single_file(tmp_path: Path, layouts) -> None:
    shapes = {**{"model.diffusion_model." + n: s for n, s in layouts["flux2_klein_4b"].items()},
              **{"text_encoders.llm." + n: s for n, s in layouts["qwen3_4b_hf"].items()},
              **{"first_stage_model." + n: s for n, s in layouts["flux2_vae"].items()}}
    path = tmp_path / "flux2-klein-4b-aio.safetensors"
    data = write_typed(path, shapes, lambda n, s: vae_dtype(n.removeprefix("first_stage_model."), s)
                       if n.startswith("first_stage_model.") else "BF16")
    ms = read_model_files({"model": [path]})
    assert ms.architecture.name == "flux2_klein-4b" and ms.modules() == ["diffusion", "te", "vae"]
    prof = ms.profile()
    assert (len(prof.modules["diffusion"].blocks), len(prof.modules["te"].blocks)) == (25, READ)
    assert prof.modules["te"].total == read_te(shapes, "text_encoders.llm.")
    assert sum(m.total for m in prof.modules.values()) == data - (
        nbytes(layouts["qwen3_4b_hf"]) - read_te(layouts["qwen3_4b_hf"]))
    assert prof.modules["vae"].total == vae_bytes(layouts["flux2_vae"])


def test_flux2_dev_is_told_apart(tmp_path: Path, layouts) -> None:
    kl = layouts["flux2_klein_4b"]
    dev = dict(kl)
    for i in range(20, 48):  # FLUX.2 [dev]'s 48 single blocks (widths left as klein's)
        dev |= {n.replace("single_blocks.0.", f"single_blocks.{i}."): s for n, s in kl.items()
                if n.startswith("single_blocks.0.")}
    path = tmp_path / "flux2-dev-like.safetensors"
    write_sparse(path, dev)
    arch = read_model_files({"diffusion_model": [path]}).architecture
    assert arch.name == "flux2-dev" and any("Mistral" in e for e in arch.evidence)


def test_library_pairs_klein_with_qwen3_and_the_32_channel_autoencoder(tmp_path: Path, layouts) -> None:
    """A model folder with klein, Qwen3-4B, the FLUX.2 autoencoder and FLUX.1's 16-channel one:
    the library runs klein with the LLM and the 32-channel VAE."""
    from sdplan.core.modelfiles.library import LibraryCache, scan_library
    from sdplan.core.modelfiles.library_fit import companions

    write_sparse(tmp_path / "flux-2-klein-4b.safetensors", layouts["flux2_klein_4b"])
    write_sparse(tmp_path / "qwen_3_4b.safetensors", layouts["qwen3_4b_hf"])
    write_typed(tmp_path / "flux2-vae.safetensors", layouts["flux2_vae"], vae_dtype)
    write_sparse(tmp_path / "ae.safetensors", layouts["flux1_ae_bfl"], "F32")
    entries = scan_library([tmp_path], LibraryCache(tmp_path / "cache.json")).entries
    by_name = {e.name: e for e in entries}
    klein = by_name["flux-2-klein-4b.safetensors"]
    assert (klein.family, klein.variant) == ("flux2_klein", "4b")
    assert by_name["flux2-vae.safetensors"].latent_channels == 32
    flags, missing = companions(klein, entries)
    assert {k: Path(v[0]).name for k, v in flags.items()} == {
        "diffusion_model": "flux-2-klein-4b.safetensors", "llm": "qwen_3_4b.safetensors",
        "vae": "flux2-vae.safetensors"} and missing == ()
