"""SD3 medium at full size: the real ``sd3_medium_sai`` MMDiT layout with CLIP-L, a bigG
encoder, T5-XXL and the 16-channel autoencoder written as one sparse single file, as
``sd3_medium_incl_clips_t5xxlfp16.safetensors`` names them; it inspects as SD3 medium with its
three encoders and 24 joint blocks, sizes equal to the layouts' bytes, and plans with a layer
split of the MMDiT and of T5-XXL over two GPUs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.models.mmdit import mmdit_config
from sdplan.core.planning.estimate import compute_bytes
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.plan import resolve
from sparse_writer import Layout, write_sparse

GIB = 1 << 30


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, Layout]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


def nbytes(shapes: Layout, pred=lambda n: True) -> int:
    return sum(math.prod(s) * 2 for n, s in shapes.items() if pred(n))


def bigg(clip_l: Layout) -> Layout:
    """OpenCLIP ViT-bigG/14's text tower in transformers names (SD3's ``clip_g``): CLIP-L's
    layout widened to 1280 (MLP 5120), 32 layers, with its 1280 x 1280 text projection."""
    out: Layout = {}
    for n, s in clip_l.items():
        if n.startswith("encoder.layers.") and int(n.split(".")[2]) > 0:
            continue
        shape = [{768: 1280, 3072: 5120}.get(d, d) for d in s]
        if n.startswith("encoder.layers.0."):
            for i in range(32):
                out[n.replace("layers.0.", f"layers.{i}.")] = shape
        else:
            out[n] = shape
    return out


@pytest.fixture(scope="module")
def single(tmp_path_factory, layouts) -> tuple[Path, dict[str, Layout]]:
    parts = {"model.diffusion_model.": layouts["sd3_medium_sai"],
             "text_encoders.clip_l.transformer.text_model.": layouts["clip_l_hf"],
             "text_encoders.clip_g.transformer.text_model.": bigg(layouts["clip_l_hf"]),
             "text_encoders.t5xxl.transformer.": layouts["t5xxl_hf"],
             "first_stage_model.": layouts["flux1_ae_bfl"]}
    shapes = {p + n: s for p, layout in parts.items() for n, s in layout.items()}
    shapes["text_encoders.clip_l.transformer.text_projection.weight"] = [768, 768]
    shapes["text_encoders.clip_g.transformer.text_projection.weight"] = [1280, 1280]
    path = tmp_path_factory.mktemp("sd3") / "sd3_medium_incl_clips_t5xxlfp16.safetensors"
    assert write_sparse(path, shapes, "F16") == nbytes(shapes)
    return path, {p: {n[len(p):]: s for n, s in shapes.items() if n.startswith(p)} for p in parts}


def test_single_file_inspects_as_sd3_medium(single, layouts) -> None:
    path, parts = single
    ms = read_model_files({"model": [path]})
    assert ms.architecture.name == "sd3-medium"
    prof = ms.profile()
    diff, te, vae = prof.modules["diffusion"], prof.modules["te"], prof.modules["vae"]
    dit = layouts["sd3_medium_sai"]
    assert len(diff.blocks) == 24 and diff.total == nbytes(dit)
    assert diff.blocks[0] == nbytes(dit, lambda n: n.startswith("joint_blocks.0."))
    assert diff.blocks[23] == nbytes(dit, lambda n: n.startswith("joint_blocks.23."))  # context pre-only
    assert diff.blocks[23] < diff.blocks[0]
    assert diff.other == nbytes(dit, lambda n: not n.startswith("joint_blocks."))
    clip_l = nbytes(parts["text_encoders.clip_l.transformer.text_model."]) + 768 * 768 * 2
    clip_g = nbytes(parts["text_encoders.clip_g.transformer.text_model."]) + 1280 * 1280 * 2
    assert te.encoders == {"clip_l": clip_l, "clip_g": clip_g, "t5xxl": nbytes(layouts["t5xxl_hf"])}
    assert te.block_encoder == "t5xxl" and len(te.blocks) == 24
    assert vae.total == nbytes(layouts["flux1_ae_bfl"])
    cfg = mmdit_config({t.info.name: tuple(t.info.shape) for t in ms.module_tensors("diffusion")})
    assert (cfg.depth, cfg.width, cfg.heads, cfg.pos_size, cfg.context, cfg.pooled) == (24, 1536, 24, 192, 4096, 2048)


def test_plans_with_a_layer_split(single) -> None:
    prof = read_model_files({"model": [single[0]]}).profile()
    inv = Inventory.from_json({"devices": [
        {"name": n, "type": "gpu", "registry": "CUDA", "free": 8 * GIB, "total": 8 * GIB} for n in ("CUDA0", "CUDA1")]
        + [{"name": "CPU", "type": "cpu", "registry": "CPU", "free": 32 * GIB, "total": 32 * GIB}]})
    plan = resolve(["--backend", "diffusion=CUDA0&CUDA1,te=CUDA0&CUDA1,vae=CUDA0"], inv, prof)
    for module, n in (("diffusion", 24), ("te", 24)):
        ranges = plan.modules[module].ranges
        assert [r.device for r in ranges] == ["CUDA0", "CUDA1"]
        assert ranges[0].first_block == 0 and ranges[-1].last_block == n - 1
        assert ranges[0].last_block + 1 == ranges[1].first_block
        assert sum(r.bytes for r in ranges) == sum(prof.modules[module].blocks)


def test_compute_formula_is_near_the_engines_dry_run_at_1024(single) -> None:
    """The formula a profile alone gets (sd-cli's path: 4096 image + 154 text tokens, T5 on
    77-token chunks, the plain attention path) against the dry run of sdplan's own graphs of the
    real layout on that path (ggml's products: on a CPU with sdplan's products its attention
    runs as flash attention, without the scores): the MMDiT within 15% above, the text
    encoders' largest (T5-XXL on one chunk) within 25%."""
    pytest.importorskip("sdplan._ggml")
    from rpc_util import ggml_products
    from sdplan.core.pipelines.compute import measure_compute

    files = {"model": [str(single[0])]}
    prof = read_model_files(files).profile()
    with ggml_products():
        measured = measure_compute(files, width=1024, height=1024)
    formula = {m: compute_bytes(m, prof.modules[m], prof.architecture, width=1024, height=1024, batch=1)
               for m in ("diffusion", "te")}
    assert measured["diffusion"] <= formula["diffusion"] <= 1.15 * measured["diffusion"], (measured, formula)
    assert measured["te"] <= formula["te"] <= 1.25 * measured["te"], (measured, formula)
