"""An encoder or VAE flag given another kind of model file is refused before the engine starts,
naming the flag, the file and what it holds (it failed inside the engine as "no language
model", naming neither); every fixture given to its own flag passes, and files whose names do
not tell their kind are left to the pipeline."""

from __future__ import annotations

from pathlib import Path

import pytest
from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.file_roles import check_file_roles, kind_of

FIX = Path(__file__).resolve().parent / "fixtures"


@pytest.mark.parametrize("key,name,holds", [
    ("llm", "clip_l_tiny.safetensors", "a CLIP text encoder"),
    ("vae", "clip_l_tiny.safetensors", "a CLIP text encoder"),
    ("t5xxl", "qwen_image_vae_tiny.safetensors", "an autoencoder"),
    ("clip_l", "umt5_tiny.safetensors", "a T5 encoder"),
    ("vae", "wan_tiny.safetensors", "a diffusion model"),
])
def test_a_file_of_another_kind_is_named_with_its_flag(key: str, name: str, holds: str) -> None:
    flag = {"llm": "--llm", "vae": "--vae", "t5xxl": "--t5xxl", "clip_l": "--clip_l"}[key]
    with pytest.raises(ModelFileError, match=f"{name}: {flag} takes .*; this file holds {holds}$"):
        check_file_roles({key: [str(FIX / name)]})


def test_the_fixtures_pass_under_their_own_flags() -> None:
    check_file_roles({"llm": [str(FIX / "qwen3_tiny_parts.safetensors")], "t5xxl": [str(FIX / "umt5_tiny.safetensors")],
                      "clip_l": [str(FIX / "clip_l_tiny.safetensors")], "vae": [str(FIX / "wan_vae_tiny.safetensors")]})
    check_file_roles({"vae": [str(FIX / "qwen_image_vae_tiny.safetensors")], "t5xxl": [str(FIX / "t5_tiny.safetensors")]})
    assert kind_of(FIX / "wan_tiny.safetensors") == "a diffusion model"


def test_generate_refuses_before_the_engine(tmp_path: Path, capsys) -> None:
    from sdplan.core import cli

    out = tmp_path / "x.png"
    rc = cli.main(["generate", "--diffusion-model", str(FIX / "qwen_image_tiny.safetensors"), "--llm",
                   str(FIX / "clip_l_tiny.safetensors"), "--vae", str(FIX / "qwen_image_vae_tiny.safetensors"),
                   "-p", "x", "-o", str(out), "--steps", "1", "-t", "1"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "--llm takes a language model; this file holds a CLIP text encoder" in err, err
    assert "sampling" not in err and not out.exists()
