"""LoRA files without the engine: prompt tags, finding files, key formats mapped onto a
model's names (every key of the fixtures lands; unknown keys are named), the LDM <->
diffusers UNet numbering against diffusers' own converter's output names, family guesses."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from sdplan.core.errors import ModelFileError, SdplanError
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.modelfiles.lora import find_lora_file, guess_lora_family, read_lora
from sdplan.core.modelfiles.lora_names import (
    Target,
    aliases_for_family,
    flux_aliases,
    unet_ldm_to_diffusers,
)
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.text.lora_tags import extract_lora_tags, format_lora_tag
from sdplan.core.text.prompt import PromptError

FIX = Path(__file__).parent / "fixtures"


def sd1_table():
    ms = read_model_files({"model": [FIX / "sd1_tiny.safetensors"]})
    names = {m: [t.info.name for t in ms.module_tensors(m)] for m in ("diffusion", "te")}
    return aliases_for_family("sd1", names, {t.info.name: tuple(t.info.shape) for t in ms.tensors})


def flux_table():
    files = {"diffusion": FIX / "flux_dev_tiny.safetensors", "clip_l": FIX / "clip_l_tiny.safetensors",
             "t5xxl": FIX / "t5_tiny.safetensors"}
    heads = {m: read_tensor_file(p).tensors for m, p in files.items()}
    return flux_aliases({m: [t.name for t in ts] for m, ts in heads.items()},
                        {t.name: tuple(t.shape) for ts in heads.values() for t in ts})


# ----------------------------------------------------------------------------- tags

def test_tags_are_removed_and_repeated_names_add_up() -> None:
    text, tags = extract_lora_tags("a cat<lora:style:0.8>, <lora:sub/char:1> and <lora:style:-0.3>")
    assert text == "a cat,  and "
    assert [(t.name, round(t.weight, 6)) for t in tags] == [("style", 0.5), ("sub/char", 1.0)]
    assert extract_lora_tags("no tags (word:1.2)") == ("no tags (word:1.2)", [])
    assert format_lora_tag("style", 1.0) == "<lora:style:1>" and format_lora_tag("x", 0.25) == "<lora:x:0.25>"


@pytest.mark.parametrize("prompt", ["<lora:style:heavy>", "<lora:style:nan>", "<lora:|high_noise|x:1>"])
def test_bad_tags_are_one_line_errors(prompt: str) -> None:
    with pytest.raises(PromptError, match="<lora:"):
        extract_lora_tags(prompt)


def test_files_are_found_as_sd_cli_finds_them(tmp_path: Path) -> None:
    for name in ("a.safetensors", "a.ckpt", "b.pt", "c"):
        (tmp_path / name).write_bytes(b"x")
    assert find_lora_file("a", tmp_path) == tmp_path / "a.safetensors"  # .gguf, .safetensors, .pt, .ckpt
    assert find_lora_file("b", tmp_path) == tmp_path / "b.pt"
    assert find_lora_file("c", tmp_path) == tmp_path / "c"
    assert find_lora_file(str(tmp_path / "a.ckpt"), None) == tmp_path / "a.ckpt"
    with pytest.raises(SdplanError, match="<lora:missing:...>: no LoRA file 'missing'.*--lora-model-dir"):
        find_lora_file("missing", tmp_path)


# ----------------------------------------------------------------------------- mapping

@pytest.mark.parametrize(("name", "fmt", "modules", "parts"), [
    ("lora_sd1_kohya", "kohya", ["diffusion", "te"], 95), ("lora_sd1_peft", "peft", ["diffusion", "te"], 76),
    ("lora_sd1_loha", "original", ["diffusion"], 20), ("lora_sd1_lokr", "original", ["diffusion"], 20)])
def test_every_sd1_fixture_key_lands(name: str, fmt: str, modules: list[str], parts: int) -> None:
    lf = read_lora(FIX / f"{name}.safetensors", sd1_table())
    assert (lf.format, lf.modules(), len(lf.parts), lf.unknown) == (fmt, modules, parts, [])
    used = {k for p in lf.parts for k in p.keys.values()}
    assert used == set(lf.infos)  # every tensor of the file is applied
    assert lf.nbytes() == sum(i.nbytes for i in lf.infos.values())
    assert lf.nbytes("diffusion") + lf.nbytes("te") == lf.nbytes()


def test_flux_fused_rows_and_swapped_halves() -> None:
    table = flux_table()
    u = table["unet"]
    assert u["transformer_blocks.1.attn.to_k"] == Target("diffusion", "double_blocks.1.img_attn.qkv.weight", (32, 64))
    assert u["transformer_blocks.0.attn.add_v_proj"].rows == (64, 96)
    assert u["single_transformer_blocks.0.proj_mlp"] == Target("diffusion", "single_blocks.0.linear1.weight",
                                                                (96, 224))
    assert u["norm_out.linear"] == Target("diffusion", "final_layer.adaLN_modulation.1.weight", None, True)
    assert u["double_blocks.0.img_attn.qkv"].rows is None  # the BFL name patches the whole weight
    lf = read_lora(FIX / "lora_flux_peft.safetensors", table)
    assert lf.unknown == [] and lf.format == "peft"
    assert any(p.target.swap_halves for p in lf.parts)
    lf = read_lora(FIX / "lora_flux_kohya.safetensors", table)
    assert lf.unknown == [] and lf.modules() == ["clip_l", "diffusion"]


def test_unknown_keys_are_named_never_dropped(tmp_path: Path) -> None:
    path = tmp_path / "odd.safetensors"
    down, up = np.zeros((4, 16), np.float16), np.zeros((16, 4), np.float16)
    q = "lora_te_text_model_encoder_layers_0_self_attn_q_proj"
    save_file({f"{q}.lora_down.weight": down, f"{q}.lora_up.weight": up, f"{q}.dora_scale": np.ones((16, 1), np.float16),
               "lora_unet_no_such_layer.lora_down.weight": down, "lora_unet_no_such_layer.lora_up.weight": up,
               "lora_te_text_model_encoder_layers_1_mlp_fc1.lora_down.weight": down,
               "some_optimizer_state": np.zeros(3, np.float32)}, str(path))
    lf = read_lora(path, sd1_table())
    assert [p.target.tensor for p in lf.parts] == [
        "cond_stage_model.transformer.text_model.encoder.layers.0.self_attn.q_proj.weight"]
    assert sorted(lf.unknown) == sorted([
        f"{q}.dora_scale - dora_scale is not applied by sdplan",
        "lora_unet_no_such_layer.lora_down.weight - no layer 'no_such_layer' in this model",
        "lora_unet_no_such_layer.lora_up.weight - no layer 'no_such_layer' in this model",
        "lora_te_text_model_encoder_layers_1_mlp_fc1.lora_down.weight - incomplete patch (roles ['down'])",
        "some_optimizer_state - not a LoRA tensor name"])


def test_a_lora_for_another_family_is_refused() -> None:
    with pytest.raises(ModelFileError, match="not one key patches this model"):
        read_lora(FIX / "lora_flux_peft.safetensors", sd1_table())


def test_unet_numbering_follows_diffusers_converter() -> None:
    """Spot checks of the LDM -> diffusers numbering on the tiny SD1 UNet (levels: cross-attn
    down, plain down; plain up with an upsampler, cross-attn up). That every diffusers name
    of that UNet maps is shown by the kohya fixture, written from diffusers' module names,
    landing whole (above)."""
    cfg = json.loads((FIX / "fixture_configs.json").read_text())["sd1"]["unet"]
    layers = cfg["layers_per_block"]
    ms = read_model_files({"model": [FIX / "sd1_tiny.safetensors"]})
    paths = [t.info.name[len("model.diffusion_model."):-len(".weight")] for t in ms.module_tensors("diffusion")
             if t.info.name.endswith(".weight")]
    attn_out = {int(p.split(".")[1]) for p in paths if p.startswith("output_blocks.") and ".1.proj_in" in p}
    got = {p: unet_ldm_to_diffusers(p, layers, attn_out) for p in paths}
    assert got["input_blocks.1.1.transformer_blocks.0.attn1.to_q"] == \
        "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q"
    assert got["input_blocks.2.0.op"] == "down_blocks.0.downsamplers.0.conv"
    assert got["input_blocks.3.0.in_layers.2"] == "down_blocks.1.resnets.0.conv1"
    assert got["middle_block.1.proj_out"] == "mid_block.attentions.0.proj_out"
    assert got["output_blocks.1.1.conv"] == "up_blocks.0.upsamplers.0.conv"  # UpBlock2D: no attention
    assert got["output_blocks.2.1.proj_in"] == "up_blocks.1.attentions.0.proj_in"
    assert got["output_blocks.3.0.out_layers.3"] == "up_blocks.1.resnets.1.conv2"
    assert got["output_blocks.0.0.skip_connection"] == "up_blocks.0.resnets.0.conv_shortcut"
    assert got["time_embed.2"] == "time_embedding.linear_2" and got["out.2"] == "conv_out"
    assert None not in got.values()


def test_family_guess(tmp_path: Path) -> None:
    assert guess_lora_family(FIX / "lora_flux_peft.safetensors") == "flux"
    assert guess_lora_family(FIX / "lora_flux_kohya.safetensors") == "flux"
    for width, family in ((768, "sd1"), (1024, "sd2"), (2048, "sdxl")):
        path = tmp_path / f"{width}.safetensors"
        save_file({"lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn2_to_k.lora_down.weight":
                   np.zeros((4, width), np.float16)}, str(path))
        assert guess_lora_family(path) == family
    assert guess_lora_family(FIX / "lora_sd1_kohya.safetensors") == "unknown"  # a 16-wide toy context


def test_sd2_text_encoder_lora_lands_on_openclip_rows(tmp_path: Path) -> None:
    """kohya trains SD 2.x's text encoder under transformers' names; the checkpoint holds
    OpenCLIP's fused ``in_proj_weight``: q, k, v are its thirds."""
    ms = read_model_files({"model": [FIX / "sd2_tiny.safetensors"]})
    names = {m: [t.info.name for t in ms.module_tensors(m)] for m in ("diffusion", "te")}
    table = aliases_for_family("sd2", names, {t.info.name: tuple(t.info.shape) for t in ms.tensors})
    path = tmp_path / "te.safetensors"
    down, up = np.zeros((4, 16), np.float16), np.zeros((16, 4), np.float16)
    keys = {}
    for part in ("k_proj", "out_proj"):
        for role, arr in (("lora_down.weight", down), ("lora_up.weight", up)):
            keys[f"lora_te_text_model_encoder_layers_1_self_attn_{part}.{role}"] = arr
    save_file(keys, str(path))
    lf = read_lora(path, table)
    got = sorted((p.target.tensor, p.target.rows) for p in lf.parts)
    assert got == [("cond_stage_model.model.transformer.resblocks.1.attn.in_proj_weight", (16, 32)),
                   ("cond_stage_model.model.transformer.resblocks.1.attn.out_proj.weight", None)]
