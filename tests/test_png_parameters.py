"""The "parameters" text of pictures: sd-cli's own (examples from pictures sd-cli wrote, in
``tests/cases/sdcli_png_parameters.json``), A1111-style, and sdplan's, written and read back
through PNG files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from sdplan.core.pipelines.stages.parameters import format_parameters, parse_parameters
from sdplan.core.pipelines.stages.results import (
    generation_text,
    read_generation,
    read_png_text,
    save_png,
)

CASES = Path(__file__).parent / "cases" / "sdcli_png_parameters.json"


def examples() -> dict[str, str]:
    doc = json.loads(CASES.read_text(encoding="utf-8"))
    assert doc["commit"].startswith("97d2990")
    return {e["file"]: e["parameters"] for e in doc["examples"]}


def test_sd_cli_parameters_with_its_json() -> None:
    got = parse_parameters(examples()["assets/hidream-o1/dev_example.png"])
    assert got.source == "sd-cli"
    assert got.settings == {
        "prompt": "a lovely cat holding a sign says 'hidream o1 cpp'", "steps": 20,
        "cfg_scale": 1.0, "guidance": 3.5, "seed": 42, "width": 1024, "height": 1024,
        "rng": "cuda", "sampling_method": "euler", "scheduler": "discrete"}
    assert got.model_files == {"model": ["hidream_o1_image_dev_bf16.safetensors"]}


def test_sd_cli_parameters_with_its_files_and_no_json() -> None:
    ex = examples()
    got = parse_parameters(ex["assets/flux2/flux2-klein-4b.png"])
    assert got.settings["prompt"] == "a lovely cat" and got.settings["steps"] == 4
    assert got.settings["eta"] == 0.0 and got.settings["sampling_method"] == "euler"
    assert got.settings["scheduler"] == "discrete"
    assert got.model_files == {"te": ["qwen_3_4b.safetensors"],
                               "diffusion_model": ["flux-2-klein-4b.safetensors"],
                               "vae": ["flux2_ae.safetensors"]}
    old = parse_parameters(ex["assets/cat_with_sd_cpp_42.png"])
    assert old.settings["prompt"] == 'a lovely cat holding a sign says "Stable Diffusion CPP"'
    assert old.settings["sampling_method"] == "euler" and "scheduler" not in old.settings
    assert old.settings["cfg_scale"] == 4.5 and old.settings["width"] == 1024
    logo = parse_parameters(ex["assets/logo.png"])
    assert logo.settings["prompt"].startswith("纯白的背景") and logo.settings["height"] == 768


def test_a1111_parameters() -> None:
    text = ("a cat, (masterpiece:1.2)\nin a box\nNegative prompt: ugly, blurry\n"
            "Steps: 30, Sampler: DPM++ 2M Karras, CFG scale: 7, Seed: 123, Size: 512x768, "
            'Model hash: abcd, Model: v1-5, Clip skip: 2, Lora hashes: "a: 1, b: 2", '
            "Version: v1.10.1")
    got = parse_parameters(text)
    assert got.source == "a1111"
    assert got.settings == {"prompt": "a cat, (masterpiece:1.2)\nin a box",
                            "negative_prompt": "ugly, blurry", "steps": 30, "cfg_scale": 7.0,
                            "seed": 123, "clip_skip": 2, "width": 512, "height": 768,
                            "sampling_method": "dpm++2m", "scheduler": "karras"}
    assert parse_parameters("x\nSteps: 5, Sampler: Euler a, Schedule type: Exponential"
                            ).settings["scheduler"] == "exponential"
    assert parse_parameters("just a caption").settings == {"prompt": "just a caption"}


def test_written_in_sd_clis_layout_and_read_back() -> None:
    params = {"prompt": "a cat, on a mat", "negative_prompt": "dog", "steps": 8, "cfg_scale": 5.5,
              "guidance": 3.5, "eta": 0.5, "seed": 7, "width": 768, "height": 512,
              "sampling_method": "dpm++2m", "scheduler": "karras", "clip_skip": 2,
              "rng": "cpu", "sampler_rng": "cuda"}
    files = {"diffusion_model": ["/m/flux.gguf"], "t5xxl": ["/m/t5.safetensors"],
             "vae": ["/m/ae.sft"]}
    text = format_parameters(params, files, "sdplan 1.0")
    assert text.startswith(
        "a cat, on a mat\nNegative prompt: dog\nSteps: 8, CFG scale: 5.500000, Guidance: "
        "3.500000, Eta: 0.500000, Seed: 7, Size: 768x512, Model: , RNG: cpu, Sampler RNG: "
        "cuda, Sampler: dpm++2m karras, TE: t5.safetensors, Unet: flux.gguf, VAE: ae.sft, "
        "Clip skip: 2, Version: sdplan 1.0, SDCPP: {")
    got = parse_parameters(text)
    assert got.source == "sdplan" and got.settings == params
    custom = format_parameters({**params, "sigmas": [14.6, 3.0, 0.0]}, {})
    assert "Sampler: dpm++2m, Custom Sigmas: [14.6000, 3.0000, 0.0000]" in custom
    assert parse_parameters(custom).settings["sigmas"] == "14.6,3.0,0.0"


def test_png_round_trip(tmp_path: Path) -> None:
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"\0" * 100)
    params = {"prompt": "ein Kätzchen 猫", "steps": 3, "cfg_scale": 7.0, "seed": 9,
              "width": 16, "height": 16, "sampling_method": "euler", "scheduler": "default"}
    placement = {"backend": "CPU,vae=CUDA0", "params_backend": "vae=disk", "max_vram": "",
                 "split_mode": "row"}
    path = save_png(np.zeros((16, 16, 3), np.uint8), tmp_path / "x.png",
                    generation_text(params, {"model": [str(model)]}, placement, "sd-cli -m x"))
    got = read_generation(path)
    assert got.source == "sdplan" and {k: got.settings[k] for k in params} == params
    assert got.settings["guidance"] == 3.5 and got.settings["rng"] == "cuda"  # as written
    assert got.model_files == {"model": ["model.safetensors"]}  # its name, not its folder
    assert str(tmp_path) not in "".join(read_png_text(path).values())
    assert got.model_hash == hashlib.sha256(model.read_bytes()).hexdigest()
    assert got.placement == {"backend": "CPU,vae=CUDA0", "params_backend": "vae=disk",
                             "split_mode": "row"}
    # what other tools read: the parameters text alone
    from PIL import Image

    text = Image.open(path).text["parameters"]
    assert parse_parameters(text).settings["prompt"] == "ein Kätzchen 猫"
    assert "Sampler: euler, " in text  # the model's default scheduler is not named


def test_skip_layer_guidance_in_both_layouts_and_the_sd_cli_command() -> None:
    """SLG as sd-cli writes it: the text pairs only when on, the JSON's guidance.slg always
    (float32 values); both read back; an sd-cli command with the flags imports and is written
    back with them."""
    from sdplan.core.planning.placement import Placement
    from sdplan.core.planning.sdcli import import_sdcli_command, sdcli_argv

    on = {"prompt": "p", "steps": 20, "cfg_scale": 4.5, "slg_scale": 2.5, "skip_layers": "[7,8,9]",
          "skip_layer_start": 0.01, "skip_layer_end": 0.2}
    text = format_parameters(on, {"model": "sd3.5_medium.safetensors"})
    assert ("CFG scale: 4.500000, SLG scale: 2.500000, Skip layers: [7, 8, 9, ], Skip layer start: 0.010000, "
            "Skip layer end: 0.200000, Guidance: 3.500000") in text
    slg = {"slg_scale": 2.5, "skip_layers": "[7,8,9]", "skip_layer_start": 0.01, "skip_layer_end": 0.2}
    assert {k: parse_parameters(text).settings[k] for k in slg} == slg
    no_json = text.partition(", SDCPP: ")[0]
    assert {k: parse_parameters(no_json).settings[k] for k in slg} == slg
    sdcpp = json.loads(text.partition(", SDCPP: ")[2])
    assert sdcpp["sampling"]["guidance"]["slg"] == {"scale": 2.5, "layers": [7, 8, 9], "start": 0.01, "end": 0.2}
    sdcpp["sampling"]["guidance"]["slg"] = {"scale": 3.0, "layers": [8], "start": 0.009999999776482582,
                                            "end": 0.20000000298023224}
    got = parse_parameters("p\nSteps: 20, SDCPP: " + json.dumps(sdcpp)).settings
    assert {k: got[k] for k in slg} == {"slg_scale": 3.0, "skip_layers": "[8]", "skip_layer_start": 0.01,
                                        "skip_layer_end": 0.2}
    off = format_parameters({**on, "slg_scale": 0.0}, {})
    assert "SLG scale" not in off and "slg_scale" not in parse_parameters(off).settings
    imp = import_sdcli_command("sd-cli -m sd3.5_medium.safetensors -p cat --slg-scale 2.5 --skip-layers [7,8] "
                               "--skip-layer-start 0.01 --skip-layer-end 0.2")
    assert {k: imp.generation[k] for k in slg} == {**slg, "skip_layers": "[7,8]"}
    argv = sdcli_argv(Placement(), imp.model_files, imp.generation)
    assert argv[argv.index("--slg-scale"):argv.index("--slg-scale") + 8] == [
        "--slg-scale", "2.5", "--skip-layers", "[7,8]", "--skip-layer-start", "0.01", "--skip-layer-end", "0.2"]
