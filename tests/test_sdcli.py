"""sd-cli flags that a model's own files call for (:func:`sdplan.core.planning.sdcli.model_file_flags`)."""

from __future__ import annotations

import pytest
from sdplan.core.planning.sdcli import model_file_flags


@pytest.mark.parametrize(("metadata", "family", "flags"), [
    ([{"sdplan.prediction": "v"}], "sd1", ["--prediction", "v"]),
    ([{"sdplan.prediction": "eps"}], "sd1", []),  # the family's own
    ([{"sdplan.prediction": "eps"}], "sd2", ["--prediction", "eps"]),
    ([{}], "sd1", []),
    ([{"sdplan.prediction": "v"}, {"sdplan.prediction": "eps"}], "sd1", []),  # files disagree
    ([{"sdplan.prediction": "v"}], "flux", []),  # not a UNet family
    ([{"sdplan.prediction": "x0"}], "sd1", []),  # unknown value: nothing written
])
def test_model_file_flags(metadata, family, flags) -> None:
    assert model_file_flags(metadata, family) == flags


RECORD = {"prompt": "a cat", "negative_prompt": "", "width": 128, "height": 96, "steps": 20, "cfg_scale": 5.0,
          "guidance": 3.5, "seed": 42, "sampling_method": "euler", "scheduler": "default", "batch_count": 1,
          "clip_skip": -1, "vae_tile_size": 0, "timestep_shift": 0, "rng": "cuda", "extra_sample_args": {},
          "slg_scale": 0.0, "skip_layers": "[7, 8, 9]", "skip_layer_start": 0.01, "skip_layer_end": 0.2,
          "lora_model_dir": "/l", "lora_apply_mode": "auto", "strength": 0.75}


def test_picture_command_leaves_out_sd_clis_own_values_and_unused_inputs() -> None:
    """A text-to-image record: sd-cli's own values (default scheduler, batch 1, guidance 3.5,
    SLG off, clip skip -1, the CUDA RNG...) and the LoRA / picture flags of a prompt without
    tags and no init image are not written; the files' flags come last."""
    from sdplan.core.planning.sdcli import picture_command

    cmd = picture_command({"model": ["/m/demo.safetensors"], "taesd": []}, {"backend": "CUDA0,te=CPU"}, RECORD,
                          ["--prediction", "v"])
    assert cmd == ("sd-cli --model /m/demo.safetensors --backend CUDA0,te=CPU --prompt 'a cat' --width 128 "
                   "--height 96 --steps 20 --cfg-scale 5 --seed 42 --sampling-method euler --prediction v")


def test_picture_command_writes_what_differs_and_the_inputs_used() -> None:
    """A LoRA tag brings the LoRA folder and mode, an init image the mask and strength (even
    sd-cli's 0.75); other values than sd-cli's are written; sigmas as sd-cli's list text."""
    from sdplan.core.planning.sdcli import import_sdcli_command, picture_command

    rec = {**RECORD, "prompt": "a cat<lora:outline:0.8>", "init_img": "/p/a.png", "mask": "/p/m.png",
           "scheduler": "karras", "batch_count": 2, "clip_skip": 2, "slg_scale": 2.5, "rng": "cpu",
           "sigmas": [14.5, 0.25, 0.0]}
    cmd = picture_command({"model": "/m/x.gguf"}, {"backend": "CPU", "max_vram": "CUDA0=6", "split_mode": "",
                                                   "rpc_servers": "h:1"}, rec)
    assert cmd == ("sd-cli --model /m/x.gguf --backend CPU --max-vram CUDA0=6 --rpc-servers h:1 "
                   "--prompt 'a cat<lora:outline:0.8>' --width 128 --height 96 --steps 20 --cfg-scale 5 --seed 42 "
                   "--sampling-method euler --scheduler karras --batch-count 2 --clip-skip 2 --slg-scale 2.5 "
                   "--sigmas 14.5,0.25,0.0 --rng cpu --lora-model-dir /l --lora-apply-mode auto --init-img /p/a.png "
                   "--mask /p/m.png --strength 0.75")
    back = import_sdcli_command(cmd)
    assert back.generation["lora_model_dir"] == "/l" and back.generation["strength"] == 0.75
    assert back.placement.to_strings()["max_vram"] == "CUDA0=6" and back.placement.rpc_servers == ("h:1",)
