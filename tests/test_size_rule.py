"""The size rule read from headers (:mod:`sdplan.core.pipelines.size_rule`) agrees with the
pipelines' own checks, and ``generate`` refuses a bad size before the engine starts.

The expected multiples are worked out here from the published architectures: SD 1.5's UNet
has four levels (channel_mult 1, 2, 4, 4: three downsamplings), SDXL's three (1, 2, 4), each
times the autoencoder's 8; the DiTs patchify 2x2 latent cells (2 * 8).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sdplan.core.cli import main
from sdplan.core.errors import InvalidArgument
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.pipelines.demo.model import demo_model_path
from sdplan.core.pipelines.size_rule import check_size, max_side, size_multiple
from sparse_writer import Layout, write_sparse


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, Layout]:
    return json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())


def _models(tmp_path: Path, name: str, shapes: Layout, flag: str = "model", prefix: str = ""):
    path = tmp_path / f"{name}.safetensors"
    write_sparse(path, shapes, "F16", prefix)
    return read_model_files({flag: [path]})


def test_sd15_single_file_is_64(tmp_path: Path, layouts: dict[str, Layout]) -> None:
    ms = _models(tmp_path, "v1-5", {**layouts["sd15_unet_ldm"], **layouts["sd_vae_ldm"]})
    assert ms.architecture.family == "sd1"
    assert size_multiple(ms) == 64
    check_size(ms, 512, 768)
    with pytest.raises(InvalidArgument, match=r"^-W/-H 512x520: .* multiples of 64 pixels$"):
        check_size(ms, 512, 520)


def test_sdxl_unet_without_vae_is_32(tmp_path: Path, layouts: dict[str, Layout]) -> None:
    ms = _models(tmp_path, "sdxl_unet", layouts["sdxl_unet_ldm"])
    assert ms.architecture.family == "sdxl"
    assert size_multiple(ms) == 32  # no VAE in the set: the SD autoencoder's 8 assumed
    check_size(ms, 1216, 832)
    with pytest.raises(InvalidArgument, match="multiples of 32"):
        check_size(ms, 1000, 1024)


def test_dits_are_16(tmp_path: Path, layouts: dict[str, Layout]) -> None:
    flux = _models(tmp_path, "flux", layouts["flux1_dev_bfl"], "diffusion_model")
    sd3 = _models(tmp_path, "sd3", layouts["sd3_medium_sai"], prefix="model.diffusion_model.")
    assert (flux.architecture.family, sd3.architecture.family) == ("flux", "sd3")
    assert size_multiple(flux) == size_multiple(sd3) == 16
    check_size(flux, 1008, 16)
    with pytest.raises(InvalidArgument, match="multiples of 16"):
        check_size(sd3, 1000, 1024)
    with pytest.raises(InvalidArgument, match="0x1024"):
        check_size(flux, 0, 1024)


def test_demo_matches_its_pipeline() -> None:
    ms = read_model_files({"model": [demo_model_path()]})
    from sdplan.core.pipelines.sd.pipeline import StableDiffusion

    with StableDiffusion(demo_model_path(), n_threads=1) as sd:
        f = sd.vae_cfg.factor * 2 ** (len(sd.unet_cfg.channel_mult) - 1)
    assert size_multiple(ms) == f


def test_unknown_layout_leaves_the_check_to_the_pipeline(tmp_path: Path, layouts: dict[str, Layout]) -> None:
    ms = _models(tmp_path, "clip", layouts["clip_l_hf"], "clip_l", "text_model.")
    assert size_multiple(ms) is None
    check_size(ms, 100, 100)  # nothing to say from the headers


def test_generate_refuses_a_bad_size_before_the_engine_starts(tmp_path: Path, capsys, monkeypatch) -> None:
    from sdplan.core.runtime import process

    def no_engine(*a, **k):
        raise AssertionError("the engine started")

    monkeypatch.setattr(process.Engine, "__init__", no_engine)
    out = tmp_path / "x.png"
    code = main(["generate", "--demo", "-p", "a red circle", "-W", "100", "-H", "64", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].endswith(
        "-W/-H 100x64: this model draws sizes that are positive multiples of 32 pixels"), err
    assert not out.exists()


def test_flux_family_multiple_is_the_pipelines_16_whatever_the_autoencoder(tmp_path: Path, capsys, monkeypatch) -> None:
    """Flux, Chroma, Z-Image and FLUX.2 klein take the latent at 1/8 of the image whatever the
    autoencoder (their pipelines' ``vae_scale`` 8: 16 px per side), so the tiny fixtures' two-level
    autoencoders change nothing; SD3's pipeline scales with its autoencoder's factor (2 x 2 = 4 for
    the tiny one, as its pipeline checks). ``generate -W 36`` with the tiny Flux files is refused
    before the engine starts, not by the pipeline after it."""
    from sdplan.core.runtime import process

    fix = Path(__file__).parent / "fixtures"
    flux = {"diffusion_model": [fix / "flux_dev_tiny.safetensors"], "vae": [fix / "flux_ae_tiny.safetensors"]}
    zimage = {"diffusion_model": [fix / "z_image_tiny.safetensors"], "vae": [fix / "flux_ae_tiny.safetensors"]}
    klein = {"diffusion_model": [fix / "flux2_klein_tiny.safetensors"], "vae": [fix / "flux2_ae_tiny.safetensors"]}
    chroma = {"diffusion_model": [fix / "chroma_tiny.safetensors"], "vae": [fix / "flux_ae_tiny.safetensors"]}
    sd3 = {"model": [fix / "sd3_tiny.safetensors"]}
    for files, family in ((flux, "flux"), (zimage, "z_image"), (klein, "flux2_klein"), (chroma, "chroma")):
        ms = read_model_files(files)
        assert (ms.architecture.family, size_multiple(ms)) == (family, 16)
    ms = read_model_files(sd3)
    assert (ms.architecture.family, size_multiple(ms)) == ("sd3", 4)

    def no_engine(*a, **k):
        raise AssertionError("the engine started")

    monkeypatch.setattr(process.Engine, "__init__", no_engine)
    code = main(["generate", "--diffusion-model", str(fix / "flux_dev_tiny.safetensors"), "--t5xxl",
                 str(fix / "t5_tiny.safetensors"), "--clip_l", str(fix / "clip_l_tiny.safetensors"), "--vae",
                 str(fix / "flux_ae_tiny.safetensors"), "-p", "a cat", "-W", "36", "-H", "64",
                 "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().endswith("-W/-H 36x64: this model draws sizes that are positive "
                                              "multiples of 16 pixels"), err


def test_a_size_taken_from_the_init_picture_is_named_as_such(tmp_path: Path, capsys, monkeypatch) -> None:
    """No -W/-H and an init picture the model cannot draw at: the message names -i and says
    that -W/-H resize it (sd-cli's rule: -W/-H default to the picture's size)."""
    from PIL import Image
    from sdplan.core.runtime import process

    monkeypatch.setattr(process.Engine, "__init__", lambda *a, **k: (_ for _ in ()).throw(AssertionError("engine")))
    tiny = Path(__file__).parent / "fixtures" / "sd1_tiny.safetensors"
    f = size_multiple(read_model_files({"model": [tiny]}))
    assert f and f > 1
    pic = tmp_path / "pic.png"
    Image.new("RGB", (3 * f + 1, 2 * f), (10, 20, 30)).save(pic)
    code = main(["generate", "-m", str(tiny), "-i", str(pic), "-p", "x", "-o", str(tmp_path / "o.png")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.endswith(f"-i/--init-img is {3 * f + 1}x{2 * f} and this model draws sizes that are positive "
                        f"multiples of {f} pixels: give -W/-H (the picture is resized to them)"), err
    code = main(["generate", "-m", str(tiny), "-i", str(pic), "-W", str(3 * f + 1), "-H", str(2 * f),
                 "-p", "x", "-o", str(tmp_path / "o.png")])
    assert code == 2 and capsys.readouterr().err.strip().endswith(f"-W/-H {3 * f + 1}x{2 * f}: this model draws "
                                                                  f"sizes that are positive multiples of {f} pixels")


def test_sd3_sides_are_bounded_by_its_position_table(tmp_path: Path, layouts: dict[str, Layout],
                                                     capsys, monkeypatch) -> None:
    """SD3's DiT embeds positions from a fixed table (SD3-medium: 192 x 192 patches of 2 x 2
    latent cells, 3072 px); ``generate -W 512`` with the tiny model (16 x 16 patches, 4 px each:
    64 px) failed in the pipeline after the text encoders ran ("error [ValueError]: ValueError:
    SD3 latent 256x256 exceeds..."): it is now one line naming -W/-H before the engine starts."""
    from sdplan.core.runtime import process

    sd3 = _models(tmp_path, "sd3", layouts["sd3_medium_sai"], prefix="model.diffusion_model.")
    assert max_side(sd3) == 192 * 16 == 3072
    check_size(sd3, 3072, 1024)
    with pytest.raises(InvalidArgument, match="3088x1024: this model draws sides up to 3072 pixels"):
        check_size(sd3, 3088, 1024)
    fix = Path(__file__).parent / "fixtures"
    tiny = read_model_files({"model": [fix / "sd3_tiny.safetensors"]})
    assert max_side(tiny) == 64 and max_side(read_model_files({"model": [demo_model_path()]})) is None
    check_size(tiny, 64, 64)

    def no_engine(*a, **k):
        raise AssertionError("the engine started")

    monkeypatch.setattr(process.Engine, "__init__", no_engine)
    code = main(["generate", "-m", str(fix / "sd3_tiny.safetensors"), "--clip_l", str(fix / "sd3_clip_l_tiny.safetensors"),
                 "--clip_g", str(fix / "sd3_clip_g_tiny.safetensors"), "--t5xxl", str(fix / "sd3_t5_tiny.safetensors"),
                 "-p", "a cat", "-W", "512", "-H", "64", "-o", str(tmp_path / "x.png")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and err[0].endswith(
        "-W/-H 512x64: this model draws sides up to 64 pixels (the positions its DiT was trained with)"), err
