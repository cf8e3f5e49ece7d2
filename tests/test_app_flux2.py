"""FLUX.2 klein in the app: the full-size klein 4B, Qwen3-4B and FLUX.2 autoencoder files
(sparse, from ../shared/models) opened together land on the board as ``diffusion``, ``te``
and ``vae`` with their sd-cli flags, the DiT and the encoder split over two GPUs; the
generation panel takes the distilled klein's settings (4 steps, CFG 1, euler)."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

pytest.importorskip("pytestqt")

from sdplan.core.planning.placement import Placement  # noqa: E402
from test_app_zimage import win  # noqa: E402,F401  (the two-GPU window fixture)
from test_real_layouts import write_sparse  # noqa: E402
from test_real_layouts_flux2 import vae_dtype, write_typed  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory, shared_dir: Path) -> tuple[Path, Path, Path]:
    layouts = json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())
    d = tmp_path_factory.mktemp("klein_app")
    dit, llm, vae = d / "flux-2-klein-4b.safetensors", d / "qwen_3_4b.safetensors", d / "flux2-vae.safetensors"
    write_sparse(dit, layouts["flux2_klein_4b"])
    write_sparse(llm, layouts["qwen3_4b_hf"])
    write_typed(vae, layouts["flux2_vae"], vae_dtype)
    return dit, llm, vae


def test_klein_files_open_with_its_flags_and_settings(win, files) -> None:  # noqa: F811
    dit, llm, vae = files
    panel = win.generation
    panel.steps.setValue(30)
    panel.cfg.setValue(6.0)
    assert win.open_files([str(dit), str(llm), str(vae)])
    ctl = win.ctl
    assert ctl.model_files == {"diffusion_model": [str(dit)], "llm": [str(llm)], "vae": [str(vae)]}
    assert ctl.profile.architecture == "flux2_klein-4b"
    assert (panel.steps.value(), panel.cfg.value(), panel.sampler.currentText()) == (4, 1.0, "euler")
    cmd = win.strings.command.toPlainText()
    assert f"--diffusion-model {dit}" in cmd and f"--llm {llm}" in cmd and f"--vae {vae}" in cmd
    assert ctl.edit(Placement.from_strings("diffusion=CUDA0&CUDA1,te=CUDA0&CUDA1", "", ""), "split both")
    for module, n in (("diffusion", 25), ("te", 27)):  # klein reads 27 of the 36 encoder blocks
        ranges = ctl.plan.modules[module].ranges
        assert [r.device for r in ranges] == ["CUDA0", "CUDA1"] and ranges[-1].last_block == n - 1


def test_a_flux1_autoencoder_dropped_beside_klein_is_refused_and_the_set_kept(win, files, tmp_path,  # noqa: F811
                                                                            shared_dir: Path) -> None:
    """A FLUX.1 ``ae`` (16 latent channels) opened beside klein's DiT and encoder is refused with
    the line ``sdplan plan`` and ``generate`` print for it, and the open klein files stay as they
    were (the board does not take the autoencoder for another whole model and replace them);
    the FLUX.2 autoencoder then joins them."""
    from sdplan.core.errors import ModelFileError

    dit, llm, vae = files
    layouts = json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())
    ae = tmp_path / "ae.safetensors"
    write_sparse(ae, layouts["flux1_ae_bfl"])
    assert win.open_files([str(dit), str(llm)])  # the autoencoder not chosen yet
    before = dict(win.ctl.model_files)
    with pytest.raises(ModelFileError) as got:
        win.ctl.open_files([str(ae)])
    assert str(got.value) == (f"{ae}: --vae: a FLUX.1 or SD3 autoencoder (16 latent channels); "
                              "FLUX.2 klein needs the FLUX.2 autoencoder (32 latent channels)")
    assert win.ctl.model_files == before
    assert win.ctl.profile.architecture == "flux2_klein-4b"
    win.ctl.open_files([str(vae)])
    assert win.ctl.model_files == {**before, "vae": [str(vae)]}


def test_a_whole_checkpoint_of_another_family_replaces_the_klein_set(win, files, tmp_path,  # noqa: F811
                                                                   shared_dir: Path) -> None:
    """A whole SDXL checkpoint (UNet, both CLIP encoders and autoencoder in one file) opened while
    klein's three files are open replaces them: it shares no tensor name with them, so joining
    them raised nothing, and the board planned klein with the checkpoint beside it as ``-m``.
    klein's DiT opened after it replaces the checkpoint in turn, and its encoder then joins it."""
    dit, llm, vae = files
    layouts = json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())
    ckpt = tmp_path / "sd_xl_base_1.0.safetensors"
    write_sparse(ckpt, layouts["sdxl_base_ldm_full"])
    assert win.open_files([str(dit), str(llm), str(vae)])
    assert win.open_files([str(ckpt)])
    assert win.ctl.model_files == {"model": [str(ckpt)]}
    assert win.ctl.profile.architecture == "sdxl"
    cmd = win.strings.command.toPlainText()
    assert f"--model {ckpt}" in cmd and str(dit) not in cmd and "--llm" not in cmd and "--vae" not in cmd
    assert win.open_files([str(dit)])
    assert win.ctl.model_files == {"diffusion_model": [str(dit)]}
    win.ctl.open_files([str(llm)])
    assert win.ctl.model_files == {"diffusion_model": [str(dit)], "llm": [str(llm)]}
    assert win.ctl.profile.architecture == "flux2_klein-4b"
