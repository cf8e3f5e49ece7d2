"""ControlNet for the UNet families as sd-cli runs it.

Against diffusers (``tests/fixtures/make_controlnet_fixtures.py``): one ControlNet call's
residuals, and the tiny SD1 model's whole CFG run with the ControlNet steering it (the residuals
from the conditional prompt added, times the strength, to both passes, as sd-cli does) within
1% of the largest value of the final latent, the tolerance the SD families' runs hold. A
demo-size ControlNet (the demo UNet's encoder, seeded hint encoder and zero convolutions)
steers the picture where its control picture differs; the Canny preprocessor draws a square's
outline; the published SD 1.5 ControlNet's real-size layout inspects as the ``controlnet``
module at its size and configures the graph; the estimate of the ControlNet and of the UNet
taking its residuals is the engine's peak within 10%; on an RPC device the picture equals the
one-device picture within 1/255.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from safetensors.numpy import load_file  # noqa: E402
from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion  # noqa: E402
from sdplan.core.pipelines.stages.control import ControlNetStage, canny, controlled  # noqa: E402
from sdplan.core.runtime.runner import ModulePlacement  # noqa: E402
from test_models_clip import assert_close  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
GIB = 1 << 30
CPU = ModulePlacement(("CPU",))


def _demo() -> str:
    from sdplan.core.pipelines.demo.model import demo_model_path

    return str(demo_model_path())


@pytest.fixture(scope="module")
def tiny():
    sd = StableDiffusion(FIX / "sd1_tiny.safetensors", None, n_threads=2, clip_heads=2)
    stage = ControlNetStage(sd, FIX / "sd1_controlnet_tiny.safetensors", CPU)
    sd.runners["controlnet"] = stage.runner
    yield sd, stage, load_file(str(FIX / "sd1_controlnet_ref.safetensors")), load_file(str(FIX / "sd1_ref.safetensors"))
    sd.close()


def test_one_call_matches_diffusers(tiny) -> None:
    sd, stage, r, base = tiny
    out = stage.residuals(r["cn_x"], float(r["cn_t"][0]), {"c": base["context_cond"]}, r["control_hint"], 1.0)
    names = stage.graph.outputs()
    assert len(names) == len([k for k in r if k.startswith("cn_down_")]) + 1
    for i, name in enumerate(names[:-1]):
        assert_close(out[name], r[f"cn_down_{i}"], 2e-3)
    assert_close(out["ctl.mid"], r["cn_mid"], 2e-3)


def test_a_controlled_run_matches_the_reference(tiny) -> None:
    """The tiny SD1 reference run (fixed noise, 4 discrete sigmas, euler, CFG 7) with the
    ControlNet at strength 0.8: the final latent within 1% of its largest value, and not the
    run without it."""
    sd, stage, r, base = tiny
    # the tiny VAE halves: a 16 px picture of the 8x8 latent; the hint is 8 pixels per latent pixel
    p = GenerateParams("a photo of a cat", "", 16, 16, 4, float(base["run_cfg_scale"][0]), 1, "euler", "discrete")
    latents: list[np.ndarray] = []
    sd.txt2img(p, on_step=lambda i, n, x: latents.append(x), noise=base["run_noise"], sigmas=base["run_sigmas"],
               control=(stage, r["control_hint"], float(r["run_strength"][0])))
    assert_close(latents[-1], r["run_final_latent"], 1e-2)
    assert np.abs(r["run_final_latent"] - base["run_final_latent"]).max() > 0.1  # the ControlNet matters


def test_the_residuals_reach_the_unet_once_per_cfg_batch(tiny) -> None:
    """The conditional prompt's residuals for both halves of a CFG batch, computed once."""
    sd, stage, r, base = tiny
    calls: list[dict[str, Any]] = []

    def unet(x: np.ndarray, t: Any, cond: dict[str, np.ndarray]) -> np.ndarray:
        calls.append(cond)
        return x

    x = np.concatenate([r["cn_x"], r["cn_x"]])
    run = controlled(unet, stage, r["control_hint"], 0.5, {"c": base["context_cond"]}, 4)
    run(x, np.float32(500.0), {"c": np.concatenate([base["context_cond"], base["context_uncond"]])})
    one = stage.residuals(r["cn_x"], 500.0, {"c": base["context_cond"]}, r["control_hint"], 0.5)
    got = calls[0]
    for name, v in one.items():
        np.testing.assert_array_equal(got[name][:1], v)
        np.testing.assert_array_equal(got[name][1:], v)
    assert_close(one["ctl.mid"], r["cn_mid"] * 0.5, 2e-3)


def _canny_loops(rgb: np.ndarray) -> np.ndarray:
    """sd-cli's ``preprocess_canny`` transcribed loop for loop (pixel by pixel, its direction
    tests as written): the reference of the vectorised :func:`canny`."""
    h, w = rgb.shape[:2]
    gray = (np.float32(0.2989) * rgb[..., 0] + np.float32(0.5870) * rgb[..., 1]
            + np.float32(0.1140) * rgb[..., 2]).astype(np.float32)

    def conv(img: np.ndarray, k: np.ndarray, pad: int) -> np.ndarray:
        out = np.zeros_like(img)
        for y in range(h):
            for x in range(w):
                acc = np.float32(0)
                for ky in range(k.shape[0]):
                    for kx in range(k.shape[1]):
                        iy, ix = y + ky - pad, x + kx - pad
                        if 0 <= iy < h and 0 <= ix < w:
                            acc += img[iy, ix] * k[ky, kx]
                out[y, x] = acc
        return out

    s2 = np.float32(1.4) ** 2
    gk = np.array([[np.exp(-((a - 2) ** 2 + (b - 2) ** 2) / (2 * s2)) / (2 * np.float32(np.pi) * s2)
                    for b in range(5)] for a in range(5)], np.float32)
    gray = conv(gray, gk, 2)
    ix = conv(gray, np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], np.float32), 1)
    iy = conv(gray, np.array([[1, 2, 1], [0, 0, 0], [-1, -2, -1]], np.float32), 1)
    g = np.sqrt(ix * ix + iy * iy)
    g = g / g.max()
    d = np.arctan2(iy, ix)
    res = np.zeros_like(g)
    for y in range(1, h - 1):
        for x in range(1, w - 1):
            a = d[y, x] * 180.0 / np.pi
            a = a + 180.0 if a < 0 else a
            q = r = 1.0
            if (0 >= a and a < 22.5) or (157.5 >= a and a <= 180):
                q, r = g[y + 1, x], g[y - 1, x]
            elif 22.5 >= a and a < 67.5:
                q, r = g[y - 1, x + 1], g[y + 1, x - 1]
            elif 67.5 >= a and a < 112.5:
                q, r = g[y, x + 1], g[y, x - 1]
            elif 112.5 >= a and a < 157.5:
                q, r = g[y - 1, x - 1], g[y + 1, x + 1]
            res[y, x] = g[y, x] if g[y, x] >= q and g[y, x] >= r else 0.0
    ht = res.max() * np.float32(0.08)
    lt = ht * np.float32(0.08)
    for y in range(h):
        for x in range(w):
            v = res[y, x]
            if v >= ht:
                res[y, x] = 1.0
            elif lt <= v <= ht:
                res[y, x] = 0.8
            if not (3 <= x <= w - 3 and 3 <= y <= h - 3):
                res[y, x] = 0.0
    for y in range(1, h - 1):
        for x in range(1, w - 1):
            if res[y, x] == np.float32(0.8):
                strong = any(res[yy, xx] == 1.0 for yy, xx in ((y - 1, x + 1), (y, x + 1), (y - 1, x),
                                                                (y + 1, x), (y - 1, x - 1), (y, x - 1)))
                res[y, x] = 1.0 if strong else 0.0
    return res


def test_canny_is_sd_clis_loops() -> None:
    rng = np.random.default_rng(4)
    img = np.zeros((24, 28, 3), np.float32)
    img[6:18, 5:20] = rng.uniform(0.4, 1.0, 3)
    img += rng.uniform(0, 0.15, img.shape).astype(np.float32)
    want = _canny_loops(img)
    got = canny(img)
    assert (want == 1.0).sum() > 10
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_canny_draws_a_squares_outline() -> None:
    img = np.zeros((48, 48, 3), np.float32)
    img[14:34, 14:34] = 1.0
    edges = canny(img)
    on = edges == 1.0
    # sd-cli leaves values under the low threshold as they are (not zeroed): faint, not edges
    assert edges.shape == (48, 48) and edges[~on].max() < 0.08
    assert on[14:34, 13:15].any() and on[14:34, 33:35].any()  # the left and right sides
    assert not on[20:28, 20:28].any() and not on[:8].any() and not on[:, :3].any()  # inside, outside, border


@pytest.fixture(scope="module")
def demo_net(tmp_path_factory) -> str:
    from controlnet_util import controlnet_from_unet

    return controlnet_from_unet(_demo(), tmp_path_factory.mktemp("cn") / "demo_controlnet.safetensors")


def _control_png(path: Path, left: bool) -> str:
    from PIL import Image

    a = np.zeros((64, 64, 3), np.uint8)
    a[:, 32:] = 255  # the right half: the same in both pictures
    if left:
        a[16:48, 4:28] = 255
    Image.fromarray(a).save(path)
    return str(path)


def test_the_control_picture_steers_a_demo_run(demo_net: str, tmp_path: Path) -> None:
    """The demo at 64 px with a demo-size ControlNet (random, not trained: its effect has no
    meaning, only a size): strength 0 is the plain picture exactly (residuals of zero); the
    picture moves away from it as the strength grows (measured 13, 25, 47 levels of 255 on
    average at 0.5, 1, 2); another control picture gives another picture; ``--canny`` too."""
    from sdplan.core.pipelines import jobs
    from sdplan.core.runtime.process import JobContext
    from sdplan.core.runtime.runner import CancelToken

    req: dict[str, Any] = {"model_files": {"model": [_demo()]}, "prompt": "a red circle on a blue background",
                           "width": 64, "height": 64, "steps": 6, "seed": 2, "threads": 1, "previews": False}
    ctx = JobContext(lambda *a: None, CancelToken())
    plain = jobs.generate_job(ctx, req)["images"][0].astype(int)
    a_png = _control_png(tmp_path / "a.png", True)

    def run(strength: float, picture: str = a_png, **more: Any) -> dict[str, Any]:
        return jobs.generate_job(ctx, {**req, "control_net": demo_net, "control_image": picture,
                                       "control_strength": strength, **more})

    moved = []
    for strength in (0.0, 0.5, 1.0, 2.0):
        got = run(strength)
        moved.append(float(np.abs(got["images"][0].astype(int) - plain).mean()))
    assert moved[0] == 0.0 and 8 < moved[1] < moved[2] < moved[3], moved
    assert got["placements"]["controlnet"]["devices"] == ["CPU"]
    assert got["params"]["control"]["control_strength"] == 2.0 and got["params"]["control_net"] == demo_net
    a = run(1.0)["images"][0].astype(int)
    b = run(1.0, _control_png(tmp_path / "b.png", False))["images"][0].astype(int)
    assert np.abs(a - b).mean() > 1.0
    edges = run(1.0, canny=True)["images"][0].astype(int)
    assert np.abs(edges - a).mean() > 1.0


def _sparse(path: Path, shapes: dict[str, list[int]]) -> Path:
    header, off = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape) * 2
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        fh.seek(off - 1, 1)
        fh.write(b"\0")
    return path


def test_the_sd15_controlnet_at_real_size(tmp_path: Path) -> None:
    """lllyasviel's SD 1.5 ControlNet layout (derived from diffusers' ControlNetModel with SD
    1.5's config): 361,279,120 parameters, the ``controlnet`` module of 722,558,240 bytes in
    f16, SD 1.5's widths and CLIP-L context; it fits SD 1.5's UNet layout."""
    from sdplan.core.commands.generate_modules import late_module_profile
    from sdplan.core.modelfiles.checkpoint import read_model_files
    from sdplan.core.modelfiles.readers import read_tensor_file
    from sdplan.core.models.controlnet import controlnet_config

    layout = json.loads((FIX / "sd15_controlnet_layout.json").read_text())
    assert sum(math.prod(s) for s in layout.values()) == 361_279_120 and len(layout) == 340
    path = _sparse(tmp_path / "control_v11p_sd15_canny_fp16.safetensors", layout)
    ms = read_model_files({"control_net": [str(path)]})
    assert ms.modules() == ["controlnet"]
    assert ms.module_profile("controlnet").total == 722_558_240
    assert late_module_profile("controlnet", str(path)).total == 722_558_240
    from sdplan.core.modelfiles.checkpoint import detect_standalone

    assert detect_standalone(read_tensor_file(path)) == ("controlnet", None)
    cfg = controlnet_config(layout, 8, None)
    assert (cfg.prefix, cfg.model_channels, cfg.channel_mult, cfg.context_dim) == ("control_model.", 320, (1, 2, 4, 4), 768)
    assert cfg.attention_levels == (0, 1, 2) and cfg.num_res_blocks == 2
    shared = json.loads((Path(__file__).resolve().parents[2] / "shared/models/real_size_key_layouts.json")
                        .read_text())["sd15_unet_ldm"] if (Path(__file__).resolve().parents[2] / "shared").exists() else None
    if shared is not None:  # the ControlNet's encoder is the UNet's, tensor for tensor
        for name, shape in layout.items():
            local = name[len("control_model."):]
            if local.startswith(("input_blocks.", "middle_block.", "time_embed.")):
                assert shared["model.diffusion_model." + local] == shape, name


def test_the_controlnet_estimate_is_the_engine_peak(demo_net: str, tmp_path: Path) -> None:
    """Weights plus the dry run of the ControlNet (and of the UNet with its residuals as
    inputs) against what their runners allocated during a controlled demo run: within 10%."""
    from sdplan.core.commands.generate_modules import with_late_modules
    from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
    from sdplan.core.pipelines.compute import measure_compute
    from sdplan.core.pipelines.stages.control import control_picture
    from sdplan.core.planning.estimate import estimate_plan
    from sdplan.core.planning.inventory import Device, Inventory
    from sdplan.core.planning.plan import resolve

    inv = Inventory((Device("CPU", "host", "cpu", "CPU", 16 * GIB, 16 * GIB),))
    files = {"model": [_demo()], "control_net": [demo_net]}
    prof = with_late_modules(profile_from_model_flags({"model": files["model"]}), files)
    plan = resolve(["--backend", "CPU"], inv, prof)
    measured = measure_compute(files, width=128, height=128)
    assert measured["controlnet"] > 0
    fit = estimate_plan(plan, prof, inv, width=128, height=128, measured=measured)
    sd = StableDiffusion({"model": files["model"]}, None, None, 1)
    try:
        stage = ControlNetStage(sd, demo_net, CPU)
        sd.runners["controlnet"] = stage.runner
        hint = control_picture(_control_png(tmp_path / "c.png", True), 128, 128)
        sd.txt2img(GenerateParams("a red circle", "", 128, 128, steps=1, cfg_scale=5.0, sampler="euler"),
                   control=(stage, hint, 1.0))
        for module in ("controlnet", "diffusion"):
            own = sd.runners[module].last_peak["CPU"]
            peak = own.weights + own.staging + own.compute
            est = fit.modules[module]
            estimate = est.weights.get("CPU", 0) + est.compute["CPU"]
            assert 0.9 * peak <= estimate <= 1.1 * peak, (module, estimate, peak)
    finally:
        sd.close()


@pytest.mark.rpc
def test_controlnet_on_an_rpc_device(demo_net: str, tmp_path: Path) -> None:
    """The ControlNet on RPC0 (the rest on the CPU) in the engine child: the picture equals the
    one-device picture within 1/255, and the record names RPC0."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers
    from sdplan.core.pipelines.jobs import GENERATE_JOB
    from sdplan.core.runtime.process import Engine
    from sdplan.core.runtime.run_plan import RunPlan

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    req: dict[str, Any] = {"model_files": {"model": [_demo()]}, "prompt": "a red circle on a blue background",
                           "width": 64, "height": 64, "steps": 3, "seed": 2, "threads": 1, "previews": False,
                           "control_net": demo_net, "control_image": _control_png(tmp_path / "a.png", True)}
    here = RunPlan({"te": CPU, "diffusion": CPU, "vae": CPU, "controlnet": CPU})
    with Engine() as engine:
        one = engine.call(GENERATE_JOB, {"request": {**req, "plan": here.to_json()}})
        with rpc_servers(1) as (server,):
            far = RunPlan({"te": CPU, "diffusion": CPU, "vae": CPU,
                           "controlnet": ModulePlacement(("RPC0",), params_mode="device", params_device="CPU")},
                          (server.endpoint,))
            rpc = engine.call(GENERATE_JOB, {"request": {**req, "plan": far.to_json()}})
    assert rpc["placements"]["controlnet"] == {"devices": ["RPC0"], "params": "device", "params_device": "CPU"}
    assert np.abs(rpc["images"][0].astype(int) - one["images"][0].astype(int)).max() <= 1


def test_an_unreadable_control_picture_is_named_before_anything_loads(demo_net: str, tmp_path: Path,
                                                                     capsys) -> None:
    """A control picture that is no picture (or a folder) is one line naming
    ``--control-image`` (it named ``-i/--init-img``), before the engine starts."""
    from sdplan.core.cli import main

    not_png = tmp_path / "c.png"
    not_png.write_bytes(b"not a picture")
    for bad in (not_png, tmp_path):
        out = tmp_path / "o.png"
        argv = ["generate", "--demo", "-p", "a red circle on a blue background", "--steps", "2", "-t", "1",
                "--control-net", demo_net, "--control-image", str(bad),
                "-o", str(out), "--in-process"]
        assert main(argv) == 2 and not out.exists()
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error [invalid_argument]: --control-image {str(bad)!r}: "
                                                   "not a readable picture"), err  # no "CPU threads" line: no engine ran
