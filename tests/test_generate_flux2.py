"""``sdplan generate`` with FLUX.2 klein files (``--diffusion-model --llm --vae``, the distilled
model's flags as sd-cli's docs give them: ``--cfg-scale 1 --steps 4 --sampling-method euler``):
the PNG is diffusers' decoded latent; a Q8_0 GGUF DiT runs; one prefixed single file (``-m``)
gives the separate files' picture; ``-r`` edits a reference image; a missing encoder or a
broken reference is a one-line error, and so are LoRAs and picture inputs (klein takes none
yet); ``--backend "diffusion=RPC0&RPC1,te=RPC0&RPC1"`` over
two RPC servers gives the one-device image.

The tiny autoencoder halves where FLUX.2's divides by 8, so a 64x64 request samples the
fixture's 4x4 diffusion latent and decodes to 16x16 pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flux2_util import AE, DIT, PROMPT, ref, write_llm
from flux_util import write_gguf

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from generate_util import parse, png  # noqa: E402
from PIL import Image  # noqa: E402
from sdplan.core.pipelines.flux2.pipeline import KleinModels, KleinPipeline, resize_nearest  # noqa: E402
from sdplan.core.pipelines.stages.results import image_to_uint8, read_generation  # noqa: E402
from sdplan.core.sampling.noise import PhiloxNoise  # noqa: E402

R = ref()


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("klein")
    llm = write_llm(d / "qwen_3_tiny.safetensors")
    q8 = d / "flux-2-klein-tiny-Q8_0.gguf"
    write_gguf(DIT, q8, "q8_0")
    from safetensors.numpy import load_file, save_file

    one = {**{"model.diffusion_model." + k: v for k, v in load_file(str(DIT)).items()},
           **{"text_encoders.llm." + k: v for k, v in load_file(str(llm)).items()},
           **{"first_stage_model." + k: v for k, v in load_file(str(AE)).items()}}
    save_file(one, str(d / "klein-aio.safetensors"))
    pic = d / "picture.png"
    Image.fromarray(R["edit.picture"]).save(pic)
    return {"llm": llm, "q8_0": q8, "aio": d / "klein-aio.safetensors", "picture": pic}


def flags(dit: Path, llm: Path, steps: int = 4) -> list[str]:
    return ["--diffusion-model", str(dit), "--llm", str(llm), "--vae", str(AE), "-p", PROMPT,
            "-W", "64", "-H", "64", "--steps", str(steps), "--cfg-scale", "1", "--sampling-method", "euler",
            "-t", "1"]


@pytest.fixture
def fixed_noise(monkeypatch):
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: R["pipe.noise"].copy())


def test_generate_gives_the_diffusers_image(tmp_path: Path, fixed_noise, files) -> None:
    out = tmp_path / "k.png"
    args = parse([*flags(DIT, files["llm"]), "-o", str(out), "--in-process", "--preview-path", str(tmp_path / "prev")])
    assert args.run(args) == 0
    assert np.abs(png(out) - image_to_uint8(R["pipe.image"][0]).astype(int)).max() <= 2
    got = read_generation(out).settings
    assert got["steps"] == 4 and got["cfg_scale"] == 1.0 and got["sampling_method"] == "euler"
    assert len(list((tmp_path / "prev").iterdir())) == 4


def test_q8_0_gguf_dit_and_a_single_file(tmp_path: Path, fixed_noise, files) -> None:
    a, b, c = tmp_path / "f16.png", tmp_path / "q8.png", tmp_path / "aio.png"
    for dit, out in ((DIT, a), (files["q8_0"], b)):
        args = parse([*flags(dit, files["llm"]), "-o", str(out), "--in-process"])
        assert args.run(args) == 0
    diff = np.abs(png(a) - png(b))
    assert 0 < diff.max() <= 24 and diff.mean() < 4  # Q8_0 rounding of a tiny random model
    args = parse(["-m", str(files["aio"]), "-p", PROMPT, "-W", "64", "-H", "64", "--steps", "4", "--cfg-scale", "1",
                  "--sampling-method", "euler",
                  "-t", "1", "-o", str(c), "--in-process"])
    assert args.run(args) == 0
    assert np.abs(png(c) - png(a)).max() <= 1


def test_reference_image_edit(tmp_path: Path, fixed_noise, files) -> None:
    out = tmp_path / "edit.png"
    args = parse([*flags(DIT, files["llm"], 2), "-r", str(files["picture"]), "-o", str(out), "--in-process"])
    assert args.run(args) == 0
    # sd-cli's sizing: a 16x16 reference for a 64x64 request is enlarged (nearest) to 64x64
    big = resize_nearest(R["edit.picture"], 64, 64)
    with KleinPipeline(KleinModels(DIT, files["llm"], AE), n_threads=1) as pipe:
        want = pipe.txt2img(PROMPT, 64, 64, steps=2, noise=R["pipe.noise"], ref_images=[big])
        plain = pipe.txt2img(PROMPT, 64, 64, steps=2, noise=R["pipe.noise"])
    assert np.abs(png(out) - image_to_uint8(want["image"][0]).astype(int)).max() <= 1
    assert np.abs(png(out) - image_to_uint8(plain["image"][0]).astype(int)).max() > 4


def test_missing_encoder_and_a_broken_reference_are_clear_errors(tmp_path: Path, files, capsys) -> None:
    args = parse(["--diffusion-model", str(DIT), "--vae", str(AE), "-p", "x", "-o", str(tmp_path / "x.png"),
                  "--in-process", "-W", "64", "-H", "64"])
    assert args.run(args) == 2
    assert "--llm" in capsys.readouterr().err
    bad = tmp_path / "not-a-picture.png"
    bad.write_text("hello")
    args = parse([*flags(DIT, files["llm"]), "-r", str(bad), "-o", str(tmp_path / "y.png"), "--in-process"])
    assert args.run(args) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert "-r/--ref-image" in err and "not-a-picture.png" in err and "cannot read image" in err


def test_loras_and_picture_inputs_are_refused_in_one_line(tmp_path: Path, files, capsys) -> None:
    """FLUX.2 klein takes no LoRA, -i or --mask yet: each is named in one line before the
    models load, and nothing is written."""
    pic = tmp_path / "start.png"
    Image.fromarray(np.full((64, 64, 3), 128, np.uint8)).save(pic)
    lora = tmp_path / "style.safetensors"
    from safetensors.numpy import save_file

    save_file({"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": np.zeros((1, 8), np.float32)},
              str(lora))
    for extra, named in ((["-p", "x <lora:style:1>", "--lora-model-dir", str(tmp_path)], "<lora:...> prompt tags"),
                         (["-i", str(pic)], "-i/--init-img"),
                         (["-i", str(pic), "--mask", str(pic)], "-i/--init-img, --mask")):
        out = tmp_path / "x.png"
        args = parse([*flags(DIT, files["llm"]), *extra, "-o", str(out), "--in-process"])
        assert args.run(args) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert f"{named}: FLUX.2 klein does not take" in err and err.count("error") == 1, err
        assert not out.exists()


@pytest.mark.rpc
def test_split_over_two_rpc_servers(tmp_path: Path, files) -> None:
    """--backend diffusion=RPC0&RPC1,te=RPC0&RPC1 over two loopback servers (registered only in
    the engine child) gives the one-device image."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    base = [*flags(DIT, files["llm"]), "-s", "5"]
    one = tmp_path / "one.png"
    args = parse([*base, "-o", str(one)])
    assert args.run(args) == 0
    with rpc_servers(2) as servers:
        split = tmp_path / "split.png"
        args = parse([*base, "-o", str(split), "--rpc-servers", ",".join(s.endpoint for s in servers),
                      "--backend", "diffusion=RPC0&RPC1,te=RPC0&RPC1"])
        assert args.run(args) == 0
    assert np.abs(png(split) - png(one)).max() <= 1
    assert "RPC0&RPC1" in read_generation(split).placement["backend"]
