"""``sdplan generate`` on the tiny SDXL fixture: diffusers' picture on one device (fixed
noise, the 4-step discrete schedule, euler, CFG 5), then the same picture from every
placement the planner writes: params read from disk for each use, te on an RPC device, the
UNet cut into at least three ``--max-vram`` segments on an RPC device, separate
``--diffusion-model/--clip_l/--clip_g/--vae`` files, a Q8_0 GGUF UNet written as sd-cli
writes it, and TAESDXL decoding.

Tolerances per channel: against diffusers 2/255; placements against the one-device picture
1/255 (the same kernels; RPC runs them in another process); the Q8_0 UNet 8/255 (8-bit
weights); the TAE decode 4/255 against a numpy TAE decoder of the reference's final latent.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from generate_util import parse, png  # noqa: E402
from PIL import Image  # noqa: E402
from sdplan.core.pipelines.stages.results import image_to_uint8  # noqa: E402
from sdplan.core.sampling.noise import PhiloxNoise  # noqa: E402
from sdplan.core.sampling.schedules import get_sigmas  # noqa: E402
from sdxl_util import BASE, ref, split_files, write_unet_gguf  # noqa: E402

RUN = ["-p", "a photo of a cat", "-n", "blurry, low quality", "-W", "16", "-H", "24", "--steps", "4",
       "--cfg-scale", "5", "-s", "1", "--sampling-method", "euler", "--scheduler", "discrete", "-t", "2"]


def gen(argv: list[str], out: Path) -> np.ndarray:
    args = parse([*RUN, *argv, "-o", str(out)])
    assert args.run(args) == 0
    return png(out)


@pytest.fixture
def ref_noise(monkeypatch):
    """The reference run's noise for the in-process engine."""
    r = ref()
    assert np.allclose(get_sigmas("discrete", 4), r["run_sigmas"], rtol=1e-4)
    monkeypatch.setattr(PhiloxNoise, "randn", lambda self, shape: r["run_noise"].copy())
    return r


def test_generate_matches_diffusers_and_from_disk(tmp_path: Path, ref_noise) -> None:
    want = image_to_uint8(ref_noise["run_image"][0]).astype(int)
    out = tmp_path / "cat.png"
    got = gen(["-m", str(BASE), "--in-process"], out)
    assert got.shape == (24, 16, 3) and np.abs(got - want).max() <= 2
    text = Image.open(out).text
    assert text["parameters"].startswith("a photo of a cat\nNegative prompt: blurry, low quality\n")
    assert json.loads(text["sdplan"])["settings"]["prompt"] == "a photo of a cat"
    disk = gen(["-m", str(BASE), "--in-process", "--params-backend", "disk"], tmp_path / "disk.png")
    assert np.abs(disk - got).max() <= 1


def test_separate_files_q8_0_gguf_and_taesdxl(tmp_path: Path, ref_noise) -> None:
    from safetensors.numpy import save_file
    from test_models_tae import np_decode, tae_weights

    want = image_to_uint8(ref_noise["run_image"][0]).astype(int)
    flags = split_files(tmp_path)
    parts = ["--clip_l", flags["clip_l"][0], "--clip_g", flags["clip_g"][0], "--vae", flags["vae"][0]]
    got = gen(["--diffusion-model", flags["diffusion_model"][0], *parts, "--in-process"], tmp_path / "parts.png")
    assert np.abs(got - want).max() <= 2
    q8 = tmp_path / "sdxl_unet-Q8_0.gguf"
    write_unet_gguf(BASE, q8, "q8_0")
    quant = gen(["--diffusion-model", str(q8), *parts, "--in-process"], tmp_path / "q8.png")
    assert np.abs(quant - want).max() <= 8
    dec = tae_weights(np.random.default_rng(5), "decoder", 4)
    tae = tmp_path / "taesdxl.safetensors"
    save_file({f"decoder.layers.{k}": v for k, v in dec.items()}, str(tae))
    fast = gen(["-m", str(BASE), "--in-process", "--taesd", str(tae)], tmp_path / "fast.png")
    expect = np.clip(np_decode(dec, ref_noise["run_final_latent"][0]), 0, 1).transpose(1, 2, 0) * 255
    assert fast.shape == (96, 64, 3) and np.abs(fast - expect).max() <= 4


def test_a_lora_patches_a_separate_unet_file_as_the_single_file(tmp_path: Path) -> None:
    """A kohya LoRA of the UNet (``input_blocks.3.1.proj_out`` in the LDM names) patches the
    ``--diffusion-model`` file, whose names have no ``model.diffusion_model.`` prefix, as it
    patches the single file: the same picture, another than without it."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(6)
    key = "lora_unet_input_blocks_3_1_proj_out"
    save_file({f"{key}.lora_down.weight": rng.standard_normal((2, 32)).astype(np.float32),
               f"{key}.lora_up.weight": 3 * rng.standard_normal((32, 2)).astype(np.float32)},
              str(tmp_path / "style.safetensors"))
    flags = split_files(tmp_path)
    parts = ["--diffusion-model", flags["diffusion_model"][0], "--clip_l", flags["clip_l"][0], "--clip_g",
             flags["clip_g"][0], "--vae", flags["vae"][0]]
    lora = ["-p", "a photo of a cat<lora:style:1>", "--lora-model-dir", str(tmp_path), "--in-process"]
    one = gen(["-m", str(BASE), *lora], tmp_path / "one.png")
    sep = gen([*parts, *lora], tmp_path / "sep.png")
    plain = gen([*parts, "--in-process"], tmp_path / "plain.png")
    assert np.abs(sep - one).max() <= 2 and np.abs(sep - plain).max() > 8


def _stage_budget() -> float:
    """GiB for the UNet's fixed weights, its compute buffer and its largest stage: the
    runner packs two or more smaller stages per segment and the largest alone."""
    from sdplan.core.pipelines.sdxl.pipeline import StableDiffusionXL

    with StableDiffusionXL(BASE, n_threads=2) as sd:
        r = sd.runners["diffusion"]
        cpu = sd.pool.get("CPU")
        shapes = {"x": (2, 4, 12, 8), "t": (2,), "c": (2, 77, 48), "vec": (2, 128)}
        fixed = r.rt.alloc_size(r.model.other_tensors(), cpu) + r.measure(shapes)["CPU"]
        largest = max(r.rt.alloc_size(r.model.block_tensors(i), cpu) for i in range(r.model.n_blocks))
    return (fixed + largest + 4096) / (1 << 30)


@pytest.mark.rpc
def test_te_on_rpc_and_unet_segments_under_max_vram(tmp_path: Path, capsys) -> None:
    """In the engine child (no noise patch): one device, te on RPC0, and the UNet on RPC0 under a
    budget that cuts it into at least three segments, all the same picture."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    budget = _stage_budget()
    one = gen(["-m", str(BASE), "--backend", "CPU"], tmp_path / "one.png")
    with rpc_servers(1, threads=2) as (server,):
        rpc = ["--rpc-servers", server.endpoint]
        te = gen(["-m", str(BASE), *rpc, "--backend", "CPU,te=RPC0"], tmp_path / "te.png")
        capsys.readouterr()
        cut = gen(["-m", str(BASE), *rpc, "--backend", "CPU,diffusion=RPC0", "--max-vram",
                   f"RPC0={budget:.12f}"], tmp_path / "cut.png")
    err = capsys.readouterr().err
    found = re.search(r"diffusion: ran in (\d+) segments", err)
    assert found and int(found.group(1)) >= 3, err
    assert np.abs(te - one).max() <= 1 and np.abs(cut - one).max() <= 1
