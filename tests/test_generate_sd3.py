"""``sdplan generate`` with the tiny SD3.5-medium-like model: the single file with its encoders
(``-m``) gives diffusers' latent decoded (diffusers' sigmas through ``--sigmas``), a Q8_0 GGUF
MMDiT with the encoders and VAE as separate files stays close to it, and ``--backend
"diffusion=RPC0&RPC1,te=RPC0&RPC1"`` over two RPC servers gives the one-device image."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sd3_util import CLIP_G, CLIP_L, PROMPT, SD3, T5, ref, write_single_file

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from generate_util import parse, png  # noqa: E402
from PIL import Image  # noqa: E402
from sdplan.core.pipelines.sd3.pipeline import Sd3Pipeline  # noqa: E402
from sdplan.core.pipelines.stages.results import image_to_uint8, read_generation  # noqa: E402
from sdplan.core.sampling.noise import PhiloxNoise  # noqa: E402

R = ref()
SIGMAS = ",".join(f"{float(s):.9g}" for s in R["run_sigmas"][:-1])


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The single file, and a Q8_0 GGUF of the MMDiT alone (no prefix, as GGUF SD3 files)."""
    import gguf
    from safetensors.numpy import load_file

    d = tmp_path_factory.mktemp("sd3")
    q8 = d / "sd3-tiny-Q8_0.gguf"
    w = gguf.GGUFWriter(str(q8), "sd3")
    for name, arr in load_file(str(SD3)).items():
        if not name.startswith("model.diffusion_model."):
            continue
        a = arr.astype(np.float32)
        name = name.removeprefix("model.diffusion_model.")
        if a.ndim != 2:
            w.add_tensor(name, a)
        elif a.shape[1] % 32:  # rows too short to quantise
            w.add_tensor(name, a.astype(np.float16))
        else:
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {"single": write_single_file(d / "sd3_tiny_all.safetensors"), "q8_0": q8}


def flags(*model: str) -> list[str]:
    return [*model, "--clip-heads", "2", "-p", PROMPT, "-W", "16", "-H", "16", "--steps", "4", "--cfg-scale", "4.5",
            "--sampling-method", "euler", "-t", "1"]


def test_single_file_gives_the_diffusers_latent_decoded(tmp_path: Path, monkeypatch, files) -> None:
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: R["run_noise"].copy())
    out = tmp_path / "sd3.png"
    args = parse([*flags("-m", str(files["single"])), "--sigmas", SIGMAS, "-o", str(out), "--in-process",
                  "--preview-path", str(tmp_path / "prev")])
    assert args.run(args) == 0
    with Sd3Pipeline({"model": [files["single"]]}, n_threads=1, clip_heads=2) as pipe:
        expected = image_to_uint8(pipe.decode(R["run_latent"])[0]).astype(int)
    assert np.abs(png(out) - expected).max() <= 2
    assert len(list((tmp_path / "prev").iterdir())) == 4  # a live preview per step
    params = Image.open(out).text["parameters"]
    assert params.startswith(PROMPT + "\n") and "Steps: 4" in params and "CFG scale: 4.5" in params


def test_q8_0_gguf_mmdit_stays_close(tmp_path: Path, files) -> None:
    """The GGUF MMDiT with --clip_l --clip_g --t5xxl --vae files against the f16 single file:
    Q8_0 rounding of a tiny random model moves pixels by at most 24 of 255, 4 on average."""
    a, b = tmp_path / "f16.png", tmp_path / "q8.png"
    sep = ["--diffusion-model", str(files["q8_0"]), "--clip_l", str(CLIP_L), "--clip_g", str(CLIP_G),
           "--t5xxl", str(T5), "--vae", str(SD3)]
    for model, out in ((["-m", str(files["single"])], a), (sep, b)):
        args = parse([*flags(*model), "-s", "3", "-o", str(out), "--in-process"])
        assert args.run(args) == 0
    diff = np.abs(png(a) - png(b))
    assert diff.max() <= 24 and diff.mean() < 4
    assert diff.max() > 0  # the quantised weights were used


@pytest.mark.rpc
def test_split_over_two_rpc_servers(tmp_path: Path, files) -> None:
    """--backend diffusion=RPC0&RPC1,te=RPC0&RPC1 over two loopback servers (registered only in
    the engine child) gives the one-device image."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    base = [*flags("-m", str(files["single"])), "-s", "5"]
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


def test_skip_layer_guidance_flags(tmp_path: Path, monkeypatch, files, capsys) -> None:
    """--slg-scale 2.5 --skip-layers [1] --skip-layer-start 0.2 --skip-layer-end 0.8 give
    diffusers' skip_guidance_layers latent decoded; the picture's parameters carry sd-cli's SLG
    pairs and its record the flags; a non-SD3 model refuses SLG in one line."""
    from sdplan.core.pipelines.demo.model import demo_model_path

    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: R["run_noise"].copy())
    out = tmp_path / "slg.png"
    slg = ["--slg-scale", "2.5", "--skip-layers", "[1]", "--skip-layer-start", "0.2", "--skip-layer-end", "0.8"]
    args = parse([*flags("-m", str(files["single"])), "--sigmas", SIGMAS, *slg, "-o", str(out), "--in-process"])
    assert args.run(args) == 0
    with Sd3Pipeline({"model": [files["single"]]}, n_threads=1, clip_heads=2) as pipe:
        expected = image_to_uint8(pipe.decode(R["run_slg_latent"])[0]).astype(int)
        plain = image_to_uint8(pipe.decode(R["run_latent"])[0]).astype(int)
    assert np.abs(png(out) - expected).max() <= 2 < np.abs(png(out) - plain).max()
    params = Image.open(out).text["parameters"]
    assert ("CFG scale: 4.500000, SLG scale: 2.500000, Skip layers: [1, ], Skip layer start: 0.200000, "
            "Skip layer end: 0.800000, Guidance:") in params
    got = read_generation(out)
    assert {k: got.settings[k] for k in ("slg_scale", "skip_layers", "skip_layer_start", "skip_layer_end")} == \
        {"slg_scale": 2.5, "skip_layers": "[1]", "skip_layer_start": 0.2, "skip_layer_end": 0.8}
    import json

    command = json.loads(Image.open(out).text["sdplan"])["command"]
    assert "--slg-scale 2.5 --skip-layers '[1]' --skip-layer-start 0.2 --skip-layer-end 0.8" in command
    capsys.readouterr()
    args = parse(["-m", str(demo_model_path()), "-p", "x", "-W", "64", "-H", "64", "--steps", "1", "--slg-scale", "2.5",
                  "-o", str(tmp_path / "sd1.png"), "--in-process"])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert "--slg-scale 2.5: SD 1.x does not take it in sdplan; remove it" in err
    assert not (tmp_path / "sd1.png").exists()


def test_image_to_image_runs_and_loras_are_refused(tmp_path: Path, files, capsys) -> None:
    """-i with --strength 0.5 runs SD3 from the picture (the record keeps the strength; the
    image differs from text to image with the same seed); a <lora:...> tag is refused in one
    line naming SD3 and the LoRA before the models load, and nothing is written."""
    pic = tmp_path / "start.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(pic)
    txt, i2i = tmp_path / "txt.png", tmp_path / "i2i.png"
    for extra, out in (([], txt), (["-i", str(pic), "--strength", "0.5"], i2i)):
        args = parse([*flags("-m", str(files["single"])), "-s", "3", *extra, "-o", str(out), "--in-process"])
        assert args.run(args) == 0
    assert read_generation(i2i).settings["strength"] == 0.5
    assert np.abs(png(i2i) - png(txt)).max() > 0
    from safetensors.numpy import save_file

    save_file({"lora_unet_joint_blocks_0_x_block_attn_qkv.lora_down.weight": np.zeros((1, 8), np.float32)},
              str(tmp_path / "style.safetensors"))
    capsys.readouterr()
    out = tmp_path / "lora.png"
    args = parse([*flags("-m", str(files["single"])), "-p", "x <lora:style:1>", "--lora-model-dir", str(tmp_path),
                  "-o", str(out), "--in-process"])
    assert args.run(args) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "<lora:...> prompt tags: SD3 / SD3.5 does not take it in sdplan; remove it" in err, err
    assert not out.exists()
