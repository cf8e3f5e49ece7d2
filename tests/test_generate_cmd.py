"""``sdplan generate`` end to end on the tiny SD1 checkpoint: the PNG matches the reference
image (fixed noise and the discrete 4-step schedule, euler, CFG 7) within 2/255, its text
chunks record the run, and a plan that does not fit is refused without --force."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from generate_util import parse, png  # noqa: E402
from PIL import Image  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from sdplan.core.commands import generate  # noqa: E402
from sdplan.core.pipelines.demo import model as demo  # noqa: E402
from sdplan.core.pipelines.stages.results import image_to_uint8, read_generation  # noqa: E402
from sdplan.core.sampling.noise import PhiloxNoise  # noqa: E402
from sdplan.core.sampling.schedules import get_sigmas  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
MODEL = FIX / "sd1_tiny.safetensors"


def test_generate_matches_reference_png(tmp_path: Path, monkeypatch) -> None:
    ref = load_file(str(FIX / "sd1_ref.safetensors"))
    assert np.allclose(get_sigmas("discrete", 4), ref["run_sigmas"], rtol=1e-4)
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: ref["run_noise"].copy())
    out = tmp_path / "cat.png"
    args = parse(["-m", str(MODEL), "-p", "a photo of a cat", "-W", "16", "-H", "16", "--steps", "4",
                  "--cfg-scale", "7", "-s", "1", "--sampling-method", "euler", "--scheduler",
                  "discrete", "-o", str(out), "--preview-path", str(tmp_path / "prev"),
                  "--clip-heads", "2", "-t", "2", "--params-backend", "vae=disk", "--in-process"])
    assert args.run(args) == 0
    img = Image.open(out)
    got = np.asarray(img.convert("RGB")).astype(int)
    assert np.abs(got - image_to_uint8(ref["run_image"][0]).astype(int)).max() <= 2
    text = img.text
    # sd-cli's "parameters" layout, as A1111-style tools read it
    full = hashlib.sha256(MODEL.read_bytes()).hexdigest()  # web UI's Model hash: its first 10
    assert text["parameters"].startswith(
        "a photo of a cat\nSteps: 4, CFG scale: 7.000000, Guidance: 3.500000, Eta: inf, "
        f"Seed: 1, Size: 16x16, Model hash: {full[:10]}, Model: sd1_tiny.safetensors, RNG: cuda, "
        "Sampler: euler discrete, ")
    assert json.loads(text["sdplan"])["sha256"] == full
    got = read_generation(out)
    assert got.source == "sdplan"
    assert {k: got.settings[k] for k in ("prompt", "seed", "steps", "sampling_method",
                                         "scheduler", "cfg_scale")} == {
        "prompt": "a photo of a cat", "seed": 1, "steps": 4, "sampling_method": "euler",
        "scheduler": "discrete", "cfg_scale": 7.0}
    assert got.model_files == {"model": [MODEL.name]}  # a name: the picture is safe to share
    assert str(MODEL.parent) not in text["sdplan"] + text["parameters"]
    with open(MODEL, "rb") as fh:
        h = hashlib.sha256(fh.read(1 << 20) + str(os.path.getsize(MODEL)).encode()).hexdigest()
    assert json.loads(text["sdplan"])["model_hash"] == h
    assert "vae=disk" in got.placement["params_backend"]
    assert sorted(p.name for p in (tmp_path / "prev").iterdir()) == [f"preview_00{i}.png" for i in range(1, 5)]


def test_generate_refuses_a_plan_that_does_not_fit(tmp_path: Path, capsys, monkeypatch) -> None:
    import dataclasses

    import sdplan.core.planning.estimate as est

    real = est.estimate_plan

    def no_fit(*a, **k):
        return dataclasses.replace(real(*a, **k), fits=False, reasons=["CPU: over budget"])

    monkeypatch.setattr(est, "estimate_plan", no_fit)
    out = tmp_path / "x.png"
    argv = ["-m", str(MODEL), "-p", "cat", "-W", "16", "-H", "16", "--steps", "1",
            "--clip-heads", "2", "-t", "2", "-o", str(out)]
    args = parse(argv)
    assert args.run(args) == 3 and not out.exists()
    assert "--force" in capsys.readouterr().err
    args = parse([*argv, "--force"])
    assert args.run(args) == 0 and out.exists()


BASE = ["-m", str(MODEL), "-p", "a cat", "-W", "16", "-H", "16", "--steps", "3", "--cfg-scale", "5",
        "-s", "11", "--sampling-method", "euler_a", "-t", "2"]


def test_engine_child_process_gives_the_in_process_image(tmp_path: Path) -> None:
    """The default engine lives in a child process; the same seed gives the same pixels."""
    a, b = tmp_path / "child.png", tmp_path / "here.png"
    args = parse([*BASE, "--clip-heads", "2", "-o", str(a), "--preview-path", str(tmp_path / "p")])
    assert args.run(args) == 0
    args = parse([*BASE, "--clip-heads", "2", "-o", str(b), "--in-process"])
    assert args.run(args) == 0
    assert np.array_equal(png(a), png(b))
    assert len(list((tmp_path / "p").iterdir())) == 3


def test_head_counts_from_safetensors_metadata(tmp_path: Path) -> None:
    """``sdplan.clip_heads`` in the file's __metadata__ replaces --clip-heads."""
    from safetensors.numpy import save_file

    meta_model = tmp_path / "sd1_meta.safetensors"
    save_file(load_file(str(MODEL)), str(meta_model), metadata={"sdplan.clip_heads": "2"})
    a, b = tmp_path / "flag.png", tmp_path / "meta.png"
    args = parse([*BASE, "--clip-heads", "2", "-o", str(a), "--in-process"])
    assert args.run(args) == 0
    argv = [*BASE, "-o", str(b), "--in-process"]
    argv[1] = str(meta_model)
    args = parse(argv)
    assert args.run(args) == 0
    assert np.array_equal(png(a), png(b))


def test_dead_engine_process_is_a_clear_error(tmp_path: Path, monkeypatch, capsys) -> None:
    import signal

    from sdplan.core.runtime import process as worker

    class Killed(worker.Engine):
        def result(self, job, on_progress=None, on_preview=None):  # type: ignore[no-untyped-def]
            def progress(info):  # type: ignore[no-untyped-def]
                if info.get("step") == 1:
                    os.kill(self.pid, signal.SIGKILL)
                if on_progress:
                    on_progress(info)
            return super().result(job, progress, on_preview)

    monkeypatch.setattr(worker, "Engine", Killed)
    args = parse([*BASE, "--clip-heads", "2", "--steps", "20", "-o", str(tmp_path / "x.png")])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert "engine process died (signal SIGKILL)" in err and "Traceback" not in err
    assert not (tmp_path / "x.png").exists()


def test_taesd_previews_and_upscaler(tmp_path: Path, monkeypatch) -> None:
    """--taesd previews decode the denoised latent (numpy TAESD decoder of the reference's
    final latent for the last one); --upscale-model doubles the reference image."""
    from pth_writer import compact_weights, save_compact
    from safetensors.numpy import save_file
    from sdplan.core.pipelines.stages.upscale import Upscaler
    from test_models_tae import np_decode, tae_weights

    ref = load_file(str(FIX / "sd1_ref.safetensors"))
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: ref["run_noise"].copy())
    dec = tae_weights(np.random.default_rng(4), "decoder", 4)
    tae = tmp_path / "taesd.safetensors"
    save_file({f"decoder.layers.{k}": v for k, v in dec.items()}, str(tae))
    up = save_compact(tmp_path / "compact_x2.pth", compact_weights())
    out = tmp_path / "up.png"
    args = parse(["-m", str(MODEL), "-p", "a photo of a cat", "-W", "16", "-H", "16", "--steps", "4",
                  "--cfg-scale", "7", "-s", "1", "--sampling-method", "euler", "-o", str(out),
                  "--preview-path", str(tmp_path / "prev"), "--clip-heads", "2", "-t", "2", "--in-process",
                  "--taesd", str(tae), "--taesd-preview-only", "--upscale-model", str(up)])
    assert args.run(args) == 0
    last = png(tmp_path / "prev" / "preview_004.png")
    expect = np.clip(np_decode(dec, ref["run_final_latent"][0]), 0, 1).transpose(1, 2, 0) * 255
    # 5 levels: the pipeline's latent against diffusers', through a random TAE; the vectorised
    # erf of GEGLU (native/kernels/glu.cpp) moves one pixel by one level (4.8; libm's erf: 3.8)
    assert last.shape == (64, 64, 3) and np.abs(last - expect).max() <= 5
    with Upscaler(up, n_threads=2) as u:
        want = u.upscale_image(image_to_uint8(ref["run_image"][0])).astype(int)
    got = png(out)
    assert got.shape == (32, 32, 3) and np.abs(got - want).max() <= 3
    assert json.loads(Image.open(out).text["sdplan"])["upscale"]["model"] == "compact_x2.pth"


def test_taesd_decodes_the_final_image_like_sd_cli(tmp_path: Path, monkeypatch) -> None:
    """Without --taesd-preview-only the TAE decodes the final image (sd-cli's fast decode)."""
    from safetensors.numpy import save_file
    from test_models_tae import np_decode, tae_weights

    ref = load_file(str(FIX / "sd1_ref.safetensors"))
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: ref["run_noise"].copy())
    dec = tae_weights(np.random.default_rng(4), "decoder", 4)
    tae = tmp_path / "taesd.safetensors"
    save_file({f"decoder.layers.{k}": v for k, v in dec.items()}, str(tae))
    out = tmp_path / "fast.png"
    args = parse(["-m", str(MODEL), "-p", "a photo of a cat", "-W", "16", "-H", "16", "--steps", "4",
                  "--cfg-scale", "7", "-s", "1", "--sampling-method", "euler", "-o", str(out),
                  "--clip-heads", "2", "-t", "2", "--in-process", "--taesd", str(tae)])
    assert args.run(args) == 0
    expect = np.clip(np_decode(dec, ref["run_final_latent"][0]), 0, 1).transpose(1, 2, 0) * 255
    got = png(out)
    assert got.shape == (64, 64, 3) and np.abs(got - expect).max() <= 5  # as in the test above


@pytest.mark.parametrize("flags, named", [
    (["-W", "0"], "-W/--width"), (["-H", "-64"], "-H/--height"), (["--steps", "0"], "--steps"),
    (["-b", "0"], "-b/--batch-count"), (["--cfg-scale", "nan"], "--cfg-scale"),
    (["-t", "-1"], "-t/--threads"), (["--sampling-method", "bogus"], "--sampling-method"),
    (["--scheduler", "bogus"], "--scheduler"), (["-o", "out.txt"], "-o/--output")])
def test_bad_generation_flags_fail_before_loading(flags: list[str], named: str, capsys) -> None:
    args = parse(["-m", str(MODEL), "-p", "cat", "--in-process", *flags])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err


def test_unwritable_output_fails_before_loading(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    args = parse(["-m", str(MODEL), "-p", "cat", "--in-process", "-o", str(blocker / "y.png")])
    assert args.run(args) == 2
    err = capsys.readouterr().err
    assert "-o/--output" in err and "cannot create the folder" in err and "Traceback" not in err
    made = tmp_path / "new" / "sub" / "y.png"  # a missing folder is made, as sd-cli users expect
    generate.validate(parse(["-m", str(MODEL), "-p", "cat", "-o", str(made)]))
    assert made.parent.is_dir()


def test_demo_defaults_fill_only_what_is_not_given() -> None:
    if not (Path(__file__).resolve().parent.parent / "resources/demo").is_dir():
        pytest.skip("no demo model in this checkout")
    args = parse(["--demo", "-p", "a red circle on a blue background"])
    generate.apply_demo(args)
    assert (args.width, args.height, args.steps, args.cfg_scale) == (128, 128, 20, 5.0)
    assert args.sampling_method == demo.DEMO_SAMPLER == "euler"
    args = parse(["--demo", "-p", "x", "--sampling-method", "euler_a", "--steps", "7"])
    generate.apply_demo(args)
    assert args.sampling_method == "euler_a" and args.steps == 7
    assert parse(["-p", "x"]).sampling_method == "euler_a"  # sd-cli's default without --demo
    assert demo.demo_caption_known("  An orange Square on a black background ")
    assert not demo.demo_caption_known("a cat")
    assert not demo.demo_caption_known("a red circle on a red background")


FLUX = ["--t5xxl", str(FIX / "t5_tiny.safetensors"), "--clip_l", str(FIX / "clip_l_tiny.safetensors"),
        "--vae", str(FIX / "flux_ae_tiny.safetensors"), "--flux-axes", "4,6,6", "--clip-heads", "2",
        "--t5-length", "16", "-p", "a photo of a cat", "-W", "64", "-H", "64", "--steps", "4",
        "--sampling-method", "euler", "-t", "1"]


def test_flux_files_match_the_reference(tmp_path: Path, monkeypatch) -> None:
    ref = load_file(str(FIX / "flux_ref.safetensors"))
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: ref["run_noise"].copy())
    out = tmp_path / "flux.png"
    args = parse(["--diffusion-model", str(FIX / "flux_dev_tiny.safetensors"), *FLUX, "-o", str(out),
                  "--in-process", "--preview-path", str(tmp_path / "prev")])
    assert args.run(args) == 0
    assert np.abs(png(out) - image_to_uint8(ref["run_image"][0]).astype(int)).max() <= 2
    assert read_generation(out).settings["guidance"] == 3.5
    assert len(list((tmp_path / "prev").iterdir())) == 4


def test_flux_taesd_decodes_the_final_image_unless_preview_only(tmp_path: Path) -> None:
    """FLUX.1 with --taesd runs (it was refused once) and the TAEF1 decodes the final picture,
    as sd-cli does: 64x64 from the 8x8 latent where the toy autoencoder gives 16x16; the
    record says so. With --taesd-preview-only the VAE's picture, bit for bit."""
    from safetensors.numpy import save_file
    from test_models_tae import tae_weights

    tae = tmp_path / "taef1.safetensors"
    save_file(tae_weights(np.random.default_rng(2), "decoder", 16), str(tae))
    base = ["--diffusion-model", str(FIX / "flux_dev_tiny.safetensors"), *FLUX, "--in-process"]
    out = {}
    for name, extra in (("vae", []), ("tae", ["--taesd", str(tae)]),
                        ("preview", ["--taesd", str(tae), "--taesd-preview-only"])):
        out[name] = tmp_path / f"{name}.png"
        args = parse([*base, *extra, "-o", str(out[name])])
        assert args.run(args) == 0
    assert png(out["vae"]).shape == (16, 16, 3) and png(out["tae"]).shape == (64, 64, 3)
    assert np.array_equal(png(out["preview"]), png(out["vae"]))
    assert read_generation(out["tae"]).settings["taesd_decode"] is True
    assert "taesd_decode" not in read_generation(out["preview"]).settings


def test_flux_files_need_every_part(tmp_path: Path, capsys) -> None:
    args = parse(["--diffusion-model", str(FIX / "flux_dev_tiny.safetensors"), *FLUX[2:], "-o",
                  str(tmp_path / "x.png"), "--in-process"])
    assert args.run(args) == 2
    assert "--t5xxl" in capsys.readouterr().err


@pytest.mark.rpc
def test_flux_split_over_two_rpc_servers(tmp_path: Path) -> None:
    """--backend diffusion=RPC0&RPC1,te=RPC0&RPC1 over two loopback servers (registered only in
    the engine child) gives the one-device image."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    dit = ["--diffusion-model", str(FIX / "flux_schnell_tiny.safetensors"), *FLUX, "-s", "5"]
    one = tmp_path / "one.png"
    args = parse([*dit, "-o", str(one)])
    assert args.run(args) == 0
    with rpc_servers(2) as servers:
        split = tmp_path / "split.png"
        args = parse([*dit, "-o", str(split), "--rpc-servers", ",".join(s.endpoint for s in servers),
                      "--backend", "diffusion=RPC0&RPC1,te=RPC0&RPC1"])
        assert args.run(args) == 0
    assert np.abs(png(split) - png(one)).max() <= 1
    assert "RPC0&RPC1" in read_generation(split).placement["backend"]


CHROMA = ["--diffusion-model", str(FIX / "chroma_tiny.safetensors"), "--t5xxl", str(FIX / "t5_tiny.safetensors"),
          "--vae", str(FIX / "flux_ae_tiny.safetensors"), "--flux-axes", "4,6,6", "--t5-length", "16",
          "-p", "a photo of a cat", "-W", "64", "-H", "64", "--steps", "4", "--cfg-scale", "4",
          "--sampling-method", "euler", "-t", "1"]


def test_chroma_files_give_diffusers_latent(tmp_path: Path, monkeypatch) -> None:
    """Chroma's files (no --clip_l) run the Chroma pipeline: the PNG is diffusers'
    ChromaPipeline latent decoded by the autoencoder."""
    from sdplan.core.pipelines.chroma.pipeline import ChromaModels, ChromaPipeline

    ref = load_file(str(FIX / "chroma_ref.safetensors"))
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: ref["run_noise"].copy())
    out = tmp_path / "chroma.png"
    args = parse([*CHROMA, "-o", str(out), "--in-process"])
    assert args.run(args) == 0
    models = ChromaModels(FIX / "chroma_tiny.safetensors", FIX / "t5_tiny.safetensors",
                          FIX / "flux_ae_tiny.safetensors", axes=(4, 6, 6))
    with ChromaPipeline(models, n_threads=1) as pipe:
        want = image_to_uint8(pipe.decode(ref["run_latent"])[0]).astype(int)
    assert np.abs(png(out) - want).max() <= 2
    assert read_generation(out).settings["cfg_scale"] == 4.0


def test_chroma_files_need_t5_and_vae(tmp_path: Path, capsys) -> None:
    args = parse([*CHROMA[:2], *CHROMA[6:], "-o", str(tmp_path / "x.png"), "--in-process"])
    assert args.run(args) == 2
    assert "--vae" in capsys.readouterr().err
