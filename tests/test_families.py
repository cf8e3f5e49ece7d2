"""The family registry: every declaration is complete and consistent, lookups by family and
architecture name, detection order, and no family name compared outside the registry and the
families' own pipeline folders (the check finds a planted comparison)."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import pytest
from sdplan.core.families import (
    FAMILIES,
    DiffusionTensors,
    detect_family,
    family,
    family_of,
    generation_defaults,
    lora_family,
    recommended_sizes,
    variant_of,
)
from sdplan.core.families.options import OPTIONS
from sdplan.core.sampling.names import samplers_for, schedulers_for

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
import familycheck  # noqa: E402


def test_every_declaration_is_complete() -> None:
    names = [f.name for f in FAMILIES]
    assert len(names) == len(set(names)) == 11
    for fam in FAMILIES:
        assert fam.options <= set(OPTIONS), (fam.name, fam.options - set(OPTIONS))
        assert fam.sampling in ("discrete", "flow")
        assert fam.defaults.sampling_method in samplers_for(fam.sampling)
        assert fam.defaults.scheduler in schedulers_for(fam.sampling)
        assert fam.size_rule in ("unet", "patch", "patch8")
        assert fam.files and all(keys for keys in fam.files)
        assert fam.runs == (fam.pipeline is not None) and (fam.runs or fam.refusal)
        step = 64 if fam.size_rule == "unet" else 16  # Wan's 832x480 is 16-pixel patches
        for w, h in fam.sizes:
            assert w % step == 0 and h % step == 0, (fam.name, w, h)


@pytest.mark.parametrize("fam", [f for f in FAMILIES if f.runs], ids=lambda f: f.name)
def test_pipelines_and_dry_runs_resolve(fam) -> None:
    for target in (fam.pipeline, fam.dry_run):
        if target:
            module, _, func = target.partition(":")
            assert callable(getattr(importlib.import_module(module), func))


def test_lookups_by_family_and_architecture_name() -> None:
    assert family("flux").title == "FLUX.1" and family("nope") is None and family(None) is None
    assert family_of("flux-schnell").name == "flux" and variant_of("flux-schnell") == "schnell"
    assert family_of("flux2_klein-9b").name == "flux2_klein" and variant_of("flux2_klein-9b") == "9b"
    assert family_of("sdxl").name == "sdxl" and variant_of("sdxl") is None
    assert family_of("unknown") is None and variant_of("unknown") is None
    assert generation_defaults("flux-schnell")["steps"] == 4 and generation_defaults("flux-dev")["steps"] == 20
    assert generation_defaults("sd2") == {"cfg_scale": 7.0, "steps": 20, "sampling_method": "euler_a",
                                          "width": 512, "height": 512}
    assert generation_defaults(None) == {} and recommended_sizes("sdxl-refiner")[0] == (1024, 1024)
    assert family_of("flux2_klein-4b").compute_for("4b").width == 3072
    assert family_of("flux2_klein-9b").compute_for("9b").width == 4096
    assert family("sdxl").companions_for("refiner").encoders == ("clip_g",)


def test_detection_by_layout() -> None:
    unet = {"input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight": (320, 768)}
    assert detect_family(DiffusionTensors(unet))[:2] == ("sd1", None)
    xl = {"input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight": (640, 2048), "label_emb.0.0.weight": (1280, 2816)}
    assert detect_family(DiffusionTensors(xl))[:2] == ("sdxl", None)
    refiner = {"input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight": (768, 1280), "label_emb.0.0.weight": (1, 2)}
    assert detect_family(DiffusionTensors(refiner))[:2] == ("sdxl", "refiner")
    small = {"input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight": (32, 16)}
    assert detect_family(DiffusionTensors(small, metadata_families=("sd2",)))[:2] == ("sd2", None)
    assert detect_family(DiffusionTensors(small))[0] == "unknown"
    flux = {"double_blocks.0.img_attn.qkv.weight": (9, 3), "single_blocks.0.linear1.weight": (1, 1),
            "guidance_in.in_layer.weight": (1, 1)}
    assert detect_family(DiffusionTensors(flux))[:2] == ("flux", "dev")
    chroma = dict(flux, **{"distilled_guidance_layer.in_proj.weight": (1, 1)})
    assert detect_family(DiffusionTensors(chroma))[:2] == ("chroma", None)
    klein = {"double_stream_modulation_img.lin.weight": (1, 1), "img_in.weight": (3072, 128),
             **{f"single_blocks.{i}.linear1.weight": (1, 1) for i in range(20)}}
    assert detect_family(DiffusionTensors(klein))[:2] == ("flux2_klein", "4b")
    dev = dict(klein, **{f"single_blocks.{i}.linear1.weight": (1, 1) for i in range(48)})
    assert detect_family(DiffusionTensors(dev))[:2] == ("flux2", "dev")
    qwen = {"transformer_blocks.0.img_mod.1.weight": (18432, 3072), "txt_norm.weight": (3584,),
            "img_in.weight": (3072, 64), "txt_in.weight": (3072, 3584)}
    llm = ("model.layers.0.self_attn.q_proj.bias", "model.layers.1.input_layernorm.weight", "visual.blocks.0.attn.qkv.weight")
    fam, variant, evidence = detect_family(DiffusionTensors(qwen, llm))
    assert (fam, variant) == ("qwen_image", None)
    assert evidence[1:] == ("width 3072, text width 3584: a Qwen2.5-VL-7B text encoder", "text encoder: qwen2.5, 2 blocks",
                            "vision tower: 1 blocks (reference pictures; stays on the main device)")
    layered = dict(qwen, **{"time_text_embed.addition_t_embedding.weight": (2, 3072)})
    assert detect_family(DiffusionTensors(layered))[:2] == ("qwen_image", "layered")
    mage = dict(qwen, **{"img_in.weight": (3072, 128)})  # MageFlow's 128 inputs (sd-cli's test): not Qwen-Image
    assert detect_family(DiffusionTensors(mage))[0] == "unknown"
    assert generation_defaults("qwen_image") == {"cfg_scale": 2.5, "steps": 20, "sampling_method": "euler"}
    assert detect_family(DiffusionTensors({}))[0] == "unknown"


def test_lora_family_rules() -> None:
    assert lora_family(["lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight"], {}) == "flux"
    assert lora_family(["lora_unet_joint_blocks_0_x_block_attn_qkv.lora_down.weight"], {}) == "sd3"
    assert lora_family(["lora_te2_text_model_encoder_layers_0_mlp_fc1.lora_down.weight"], {}) == "sdxl"
    key = "lora_unet_input_blocks_1_1_transformer_blocks_0_attn2_to_k.lora_down.weight"
    assert lora_family([key], {key: (4, 768)}) == "sd1"
    assert lora_family([key], {key: (4, 1024)}) == "sd2"
    assert lora_family([key], {key: (4, 16)}) == "unknown"


def test_no_family_name_is_compared_outside_the_registry() -> None:
    assert familycheck.check_tree(REPO) == []


def test_the_check_finds_a_planted_comparison(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    shutil.copytree(REPO / "core", root / "core", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "app").mkdir()
    (root / "core" / "planning" / "planted.py").write_text(
        "def f(arch):\n    return arch.family == 'sdxl' or arch.startswith('flux')\n"
        "TABLE = {'sd1': 1, 'sd2': 2}\n")
    found = familycheck.check_tree(root)
    assert len(found) == 3 and all(f.startswith("core/planning/planted.py:") for f in found), found
    # scheduler names equal to a family's pass; a family's own pipeline folder may compare
    assert familycheck.comparisons("if scheduler == 'flux':\n    pass\n") == []
    assert familycheck.allowed(Path("core/pipelines/sd/pipeline.py"))
    assert not familycheck.allowed(Path("core/pipelines/stages/flow_dit.py"))
