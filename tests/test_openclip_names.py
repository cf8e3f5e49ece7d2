"""The one OpenCLIP -> transformers CLIP text-tower renaming
(:mod:`sdplan.core.modelfiles.openclip_names`) against the real SDXL layout in
``../shared/models``: every open_clip tensor of SDXL's bigG maps to exactly the names and shapes
of the transformers bigG layout sd-cli loads as SD3's ``clip_g`` (derived from the real CLIP-L
transformers layout, as the SD3 real-size test builds it), which sdplan reads as the same
encoder; the LoRA targets land on the fused rows; split and transpose on arrays."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.modelfiles.lora_names import Target, sd_aliases
from sdplan.core.modelfiles.openclip_names import (
    ClipName,
    convert_openclip,
    openclip_to_transformers,
)
from sdplan.core.models.clip import clip_config
from sparse_writer import write_sparse
from test_real_layouts_sd3 import bigg

BIGG = "conditioner.embedders.1.model."


def _split_shape(s: list[int], n: int) -> list[list[int]]:
    return [[s[0] // n, *s[1:]] for _ in range(n)]


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, dict[str, list[int]]]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


@pytest.fixture(scope="module")
def converted(layouts) -> dict[str, list[int]]:
    return convert_openclip(layouts["sdxl_base_ldm_full"], BIGG, _split_shape, lambda s: s[::-1])


def test_sdxl_bigg_maps_onto_exactly_the_transformers_layout_sd_cli_loads(layouts, converted) -> None:
    sdxl = layouts["sdxl_base_ldm_full"]
    own = [n[len(BIGG):] for n in sdxl if n.startswith(BIGG)]
    assert len(own) == 390
    # SD3's clip_g.safetensors as sd-cli loads it: CLIP-L's real transformers layout widened
    # to bigG (1280 wide, MLP 5120, 32 layers) under text_model., and its 1280 x 1280 projection
    expected = {"text_model." + n: s for n, s in bigg(layouts["clip_l_hf"]).items()}
    expected["text_projection.weight"] = [1280, 1280]
    assert converted == expected
    # each transformers name comes from one open_clip tensor; only logit_scale has none
    renamed = [openclip_to_transformers(n) for n in own]
    assert [n for n, r in zip(own, renamed, strict=True) if r is None] == ["logit_scale"]
    assert sum(len(r.names) for r in renamed if r is not None) == len(expected) == 517


def test_the_renamed_tower_reads_as_the_same_bigg_encoder(layouts, converted, tmp_path) -> None:
    sdxl = layouts["sdxl_base_ldm_full"]
    tower = {n: tuple(s) for n, s in sdxl.items() if n.startswith(BIGG)}
    hf = {n: tuple(s) for n, s in converted.items()}
    a, b = clip_config(tower, prefix=BIGG), clip_config(hf, prefix="text_model.")
    assert (a.layout, b.layout) == ("openclip", "openai")
    assert [(c.vocab, c.n_positions, c.width, c.mlp_width, c.n_layers, c.n_heads, c.activation) for c in (a, b)] \
        == [(49408, 77, 1280, 5120, 32, 20, "gelu_erf")] * 2
    path = tmp_path / "clip_g.safetensors"
    written = write_sparse(path, converted, "F16")
    te = read_model_files({"clip_g": [path]}).profile().modules["te"]
    assert te.encoders == {"clip_g": written} and len(te.blocks) == 32
    # the same parameters as the open_clip tower less its 0-d logit_scale
    assert written == 2 * sum(math.prod(s) for n, s in tower.items() if not n.endswith("logit_scale"))


def test_lora_targets_of_sdxl_bigg_are_the_transformers_names_on_the_fused_rows(layouts, converted) -> None:
    sdxl = layouts["sdxl_base_ldm_full"]
    shapes = {n: tuple(s) for n, s in sdxl.items()}
    table = sd_aliases({"te": [n for n in sdxl if n.startswith("conditioner.")],
                        "diffusion": [n for n in sdxl if n.startswith("model.")]}, shapes)["te2"]
    linear = {n[:-len(".weight")] for n in converted
              if n.endswith(("_proj.weight", "fc1.weight", "fc2.weight", "text_projection.weight"))}
    assert {p for p in table if p.startswith("text_model.")} | {"text_projection"} == linear
    assert len(linear) == 32 * 6 + 1
    for i in (0, 17, 31):
        hf, oc = f"text_model.encoder.layers.{i}.", f"{BIGG}transformer.resblocks.{i}."
        for k, c in enumerate("qkv"):
            target = Target("te", oc + "attn.in_proj_weight", (k * 1280, (k + 1) * 1280))
            assert table[f"{hf}self_attn.{c}_proj"] == table[f"encoder.layers.{i}.self_attn.{c}_proj"] == target
        for a, b in (("self_attn.out_proj", "attn.out_proj"), ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj")):
            assert table[hf + a] == table[f"transformer.resblocks.{i}.{b}"] == Target("te", f"{oc}{b}.weight")
    assert table["text_projection"] == Target("te", BIGG + "text_projection")


def test_fused_qkv_split_in_order_and_projection_transposed_on_arrays() -> None:
    w = np.arange(12, dtype=np.float32).reshape(6, 2)
    b = np.arange(6, dtype=np.float32)
    p = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = convert_openclip({"m.transformer.resblocks.4.attn.in_proj_weight": w,
                            "m.transformer.resblocks.4.attn.in_proj_bias": b, "m.text_projection": p,
                            "m.logit_scale": np.float32(2.6), "other.weight": w},
                           "m.", lambda a, n: np.split(a, n), lambda a: a.T)
    layer = "text_model.encoder.layers.4.self_attn."
    assert list(got) == [f"{layer}{c}_proj.weight" for c in "qkv"] + [f"{layer}{c}_proj.bias" for c in "qkv"] \
        + ["text_projection.weight"]
    assert got[layer + "k_proj.weight"].tolist() == [[4.0, 5.0], [6.0, 7.0]]
    assert got[layer + "v_proj.bias"].tolist() == [4.0, 5.0]
    assert got["text_projection.weight"].tolist() == [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    assert openclip_to_transformers("transformer.resblocks.0.ln_2.bias") == \
        ClipName(("text_model.encoder.layers.0.layer_norm2.bias",))
    assert openclip_to_transformers("text_projection") == ClipName(("text_projection.weight",), True)
    assert openclip_to_transformers("transformer.resblocks.0.attn.rot") is None
    with pytest.raises(ValueError, match=r"m\.visual\.proj: not an OpenCLIP text-tower tensor name"):
        convert_openclip({"m.visual.proj": w}, "m.", lambda a, n: np.split(a, n), lambda a: a.T)
