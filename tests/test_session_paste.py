"""Pasted commands and typing help without Qt: a command's preview (files found or missing,
where the sizes come from, the settings a run uses), its import over sd-cli's defaults for
its model (never the previous model's sizes or settings), the built-in profile a file name
matches, and the hints for ``diffusion=CUDA0,CUDA1`` and ``cuda:1``."""

from __future__ import annotations

from pathlib import Path

import pytest
from sdplan.core.errors import PlanError
from sdplan.core.planning.builtin_profiles import load_builtin_profile, match_builtin_profile
from sdplan.core.planning.hints import comma_split_hints, device_suggestion
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.session.session import Session

GIB = 1 << 30
FIXTURES = Path(__file__).parent / "fixtures"


def inventory() -> Inventory:
    return Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB),
                      Device("CUDA1", "RTX 3060", "gpu", "CUDA", 11 * GIB, 12 * GIB),
                      Device("Vulkan0", "iGPU", "gpu", "Vulkan", 2 * GIB, 4 * GIB),
                      Device("CPU", "Ryzen", "cpu", "CPU", 48 * GIB, 64 * GIB)))


def flux() -> Profile:
    return Profile({"diffusion": ModuleProfile((600 << 20,) * 38, 100 << 20),
                    "te": ModuleProfile((200 << 20,) * 24, 300 << 20), "vae": ModuleProfile((), 160 << 20)},
                   "flux1-dev.safetensors", "flux-dev")


@pytest.mark.parametrize(("name", "want"), [
    ("z_image_turbo-Q8_0.gguf", "z-image-turbo-q8_0"),
    ("/models/z-image-turbo-Q4_K_M.gguf", "z-image-turbo-q4_k"),
    ("C:\\models\\flux1-dev-Q5_K_S.gguf", "flux1-dev-q5_k"),
    ("flux1-dev.safetensors", "flux1-dev-f16"),
    ("flux1-schnell-fp16.safetensors", "flux1-schnell-f16"),
    ("v1-5-pruned-emaonly.safetensors", "sd15-f16"),
    ("sd_xl_base_1.0.safetensors", "sdxl-base-f16"),
    ("sd3.5_large.safetensors", "sd35-large-f16"),
    ("Chroma1-HD-Q4_0.gguf", "chroma1-hd-q4_0"),
    ("my-own-finetune.safetensors", None),
    ("flux1-dev-Q6_K.gguf", None),  # no built-in Q6_K
    ("flux1-dev.gguf", None),  # a GGUF without a quantisation in its name
])
def test_a_file_name_matches_the_builtin_profile_of_its_model_and_quantisation(name, want):
    assert match_builtin_profile(name) == want


def test_hints_for_a_comma_list_and_devices_named_the_way_other_tools_do():
    assert comma_split_hints("diffusion=CUDA0,CUDA1") == [
        "diffusion=CUDA0,CUDA1 runs diffusion on CUDA0 alone and makes CUDA1 the default for "
        "every other module; did you mean diffusion=CUDA0&CUDA1? (& lists the devices of one "
        "module, a comma starts the next entry)"]
    assert "did you mean te=CUDA1&CPU?" in comma_split_hints("CUDA0,te=CUDA1,CPU")[0]
    assert comma_split_hints("vae=CUDA0,CUDA1") == []  # a VAE cannot split
    assert comma_split_hints("CUDA1,diffusion=CUDA0") == []
    assert comma_split_hints("diffusion=CUDA0&CUDA1,vae=CPU") == []
    devs = [(d.name, d.registry, d.is_gpu_like) for d in inventory()]
    names = [d.name for d in inventory()]
    assert device_suggestion("cuda:1", names, devs) == "CUDA1"
    assert device_suggestion("CUDA 0", names, devs) == "CUDA0"
    assert device_suggestion("gpu2", names, devs) == "Vulkan0"  # the third GPU
    assert device_suggestion("vulkan:0", names, devs) == "Vulkan0"
    assert device_suggestion("cuda:7", names, devs) is None
    assert device_suggestion("tpu", names, devs) is None


def test_a_wrong_device_in_the_strings_names_the_device_meant():
    s = Session(inventory(), flux())
    with pytest.raises(PlanError) as err:
        s.parse_strings("diffusion=cuda:1", "", "")
    assert str(err.value) == ("--backend: no device 'cuda:1' (available: CUDA0, CUDA1, "
                              "Vulkan0, CPU); did you mean CUDA1?")
    assert err.value.span == (10, 16) and err.value.flag == "--backend"
    with pytest.raises(PlanError) as err:
        s.parse_strings("", "te=gpu:0", "")
    assert str(err.value).endswith("did you mean CUDA0?") and err.value.flag == "--params-backend"


def test_preview_changes_nothing_and_import_replaces_the_settings(tmp_path: Path):
    s = Session(inventory(), flux())
    s.set_generation(prompt="mine", cfg_scale=3.5, width=1344, guidance=4.0, clip_skip=2)
    before = s.snapshot()
    vae = FIXTURES / "flux_ae_tiny.safetensors"
    text = (f"sd-cli --diffusion-model {tmp_path}/z_image_turbo-Q8_0.gguf --vae {vae} "
            "-p 'a harbour' --steps 6 -s 7 --backend CUDA1 --vae-tiling --bogus")
    preview = s.preview_command(text)
    assert s.snapshot() == before
    assert preview.files == (("diffusion_model", f"{tmp_path}/z_image_turbo-Q8_0.gguf", False),
                             ("vae", str(vae), True))
    assert preview.missing == [f"{tmp_path}/z_image_turbo-Q8_0.gguf"]
    assert preview.sizes == "the built-in profile z-image-turbo-q8_0"
    assert preview.architecture == "z_image"
    assert preview.placement == {"backend": "CUDA1", "params_backend": "", "max_vram": ""}
    assert preview.settings == {"width": 512, "height": 512, "steps": 6, "cfg_scale": 1.0,
                                "sampling_method": "euler", "scheduler": "default", "seed": 7,
                                "batch_count": 1, "prompt": "a harbour"}
    assert preview.given == ("prompt", "steps", "seed")
    assert preview.kept == ("--vae-tiling",) and preview.unknown == ("--bogus",)
    assert s.preview_command("sd-cli --backend 'x").error is not None
    pasted = s.import_command(text)
    assert s.generation == preview.settings  # the previous CFG, size, guidance, clip skip gone
    assert s.profile == load_builtin_profile("z-image-turbo-q8_0")
    assert s.profile_source == "the built-in profile z-image-turbo-q8_0"
    assert s.missing_files == [f"{tmp_path}/z_image_turbo-Q8_0.gguf"]
    assert pasted.notes == ["model files not on this machine: z_image_turbo-Q8_0.gguf; sizes "
                            "from the built-in profile z-image-turbo-q8_0"]
    assert pasted.unknown == ["--vae-tiling", "--bogus"]
    assert s.fit is not None and s.fit.devices["CUDA1"].total > 8 * GIB  # Z-Image's, not FLUX.1's
    s.restore(before)
    assert s.snapshot() == before and s.profile == flux()


def test_a_command_with_its_files_here_reads_them(tmp_path: Path):
    from sdplan.core.pipelines.demo.model import demo_model_path

    s = Session(inventory(), flux())
    pasted = s.import_command(f"sd-cli -m {demo_model_path()} -p 'a cat'")
    assert pasted.notes == [] and s.missing_files == [] and s.profile_source is None
    assert s.profile is not None and s.profile.architecture == "sd1"
    assert (s.generation["width"], s.generation["cfg_scale"], s.generation["sampling_method"]) == (
        512, 7.0, "euler_a")
    assert s.file_modules() == {"diffusion", "te", "vae"}


def test_an_import_that_fails_halfway_puts_the_session_back(tmp_path: Path, monkeypatch):
    s = Session(inventory(), flux())
    before = s.snapshot()
    from sdplan.core.session import board

    def boom(self, placement):  # noqa: ARG001 - the placement is refused late
        raise PlanError("device_not_found", "gone")

    monkeypatch.setattr(board.BoardSession, "apply", boom)
    with pytest.raises(PlanError, match="gone"):
        s.import_command("sd-cli --diffusion-model /x/flux1-dev-Q8_0.gguf -p y")
    monkeypatch.undo()
    assert s.snapshot() == before
