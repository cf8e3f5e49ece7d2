"""sd-cli's hires fix on sdplan's engine (SD 1.x/2.x, SDXL, and the flow families with image to image).

``--hires --hires-scale 2`` doubles the picture; the first pass is the plain run's, step for
step; the second pass runs sd-cli's truncated schedule (``N = int(steps / strength)``
scheduler steps, the last ``int(N * strength) + 1`` of them; checked against the schedule
computed here from the scheduler); sd-cli's interpolation (PyTorch's bilinear and bicubic
weights, Lanczos normalised, nearest by ``o * in // out``); an ESRGAN model named in
``--hires-upscalers-dir`` upscales on the ``upscaler`` module's planned device, which the
plan, the estimate and the record name; the flags give the request and bad values are one
line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from sdplan.core.errors import InvalidArgument  # noqa: E402
from sdplan.core.pipelines.request_parts import HiresFix  # noqa: E402
from sdplan.core.pipelines.stages.hires import hires_sigmas, interpolate  # noqa: E402
from sdplan.core.runtime.runner import ModulePlacement  # noqa: E402
from sdplan.core.sampling.schedules import DiscreteSchedule, get_sigmas  # noqa: E402

GIB = 1 << 30
PROMPT = "a red circle on a blue background"


def _demo() -> str:
    from sdplan.core.pipelines.demo.model import demo_model_path

    return str(demo_model_path())


def test_interpolation_is_sd_clis() -> None:
    x = np.array([0.0, 1.0], np.float32).reshape(1, 1, 1, 2)
    # PyTorch's bilinear (align_corners=False) of [0, 1] to 4: the half-pixel centres
    np.testing.assert_allclose(interpolate(x, 1, 4, "bilinear")[0, 0, 0], [0, 0.25, 0.75, 1], atol=1e-6)
    np.testing.assert_allclose(interpolate(x, 1, 4, "nearest")[0, 0, 0], [0, 0, 1, 1])
    np.testing.assert_allclose(interpolate(x, 1, 3, "nearest-exact")[0, 0, 0], [0, 1, 1])  # floor((o + .5) 2/3)
    ramp = np.arange(8, dtype=np.float32).reshape(1, 1, 1, 8).repeat(3, 2)
    up = interpolate(ramp, 6, 16, "bicubic")  # PyTorch 2.13's bicubic of the same ramp (a = -0.75)
    np.testing.assert_allclose(up[0, 0, 0, 3:13], [1.296875, 1.703125, 2.296875, 2.703125, 3.296875, 3.703125,
                                                   4.296875, 4.703125, 5.296875, 5.703125], atol=1e-6)
    r = np.random.default_rng(0).standard_normal((1, 2, 5, 7)).astype(np.float32)
    # torch.nn.functional.interpolate's first values and sums (PyTorch 2.13, CPU, float32)
    for mode, size, first, total in (
            ("bilinear", (9, 12), [0.12573, 0.029042, -0.121362, 0.286348, 0.573482, 0.261094], 15.964912),
            ("bicubic", (9, 12), [0.054415, -0.059173, -0.096686, 0.477506, 0.837234, 0.480803], 16.930700),
            ("nearest-exact", (9, 4), [0.12573, 0.640423, -0.535669, 1.304, 0.12573, 0.640423], 14.713657)):
        y = interpolate(r, *size, mode)
        np.testing.assert_allclose(y.ravel()[:6], first, atol=2e-6)
        assert abs(float(y.sum()) - total) < 1e-4
    const = np.full((1, 2, 5, 7), 0.3, np.float32)
    for mode in ("bilinear", "bicubic", "lanczos"):
        for aa in (False, True):
            np.testing.assert_allclose(interpolate(const, 3, 13, mode, aa), 0.3, atol=1e-6)


def test_the_second_pass_schedule_is_sd_clis() -> None:
    sched = DiscreteSchedule()

    def sigmas_for(n: int) -> np.ndarray:
        return get_sigmas("discrete", n, sched)

    # 20 steps at 0.7: 28 scheduler steps, the last 20 of them
    got = hires_sigmas(sigmas_for, 20, HiresFix(True))
    assert len(got) == 21 and np.array_equal(got, sigmas_for(28)[8:])
    # --hires-steps 4 at 0.5: 8 scheduler steps; t_enc 4: the last 5
    got = hires_sigmas(sigmas_for, 20, HiresFix(True, steps=4, denoising_strength=0.5))
    assert np.array_equal(got, sigmas_for(8)[3:])
    # strength 1: every step of the pass's own schedule but the first sigma's (t_enc = N - 1)
    got = hires_sigmas(sigmas_for, 6, HiresFix(True, denoising_strength=1.0))
    assert np.array_equal(got, sigmas_for(6))


def test_the_target_and_the_checks() -> None:
    assert HiresFix(True).target(64, 48, 64) == (128, 128)  # 96 aligned up to 64
    assert HiresFix(True, scale=1.5).target(100, 100, 8) == (152, 152)  # 150 -> 152
    assert HiresFix(True, width=200).target(64, 64, 8) == (200, 200)
    assert HiresFix(True, width=200, height=104).target(64, 64, 8) == (200, 104)
    assert not HiresFix(True, "None").active
    for bad, flag in ((HiresFix(True, denoising_strength=0.0), "--hires-denoising-strength"),
                      (HiresFix(True, steps=-1), "--hires-steps"),
                      (HiresFix(True, "x4.pth", upscalers_dir="."), "--hires-upscaler"),
                      (HiresFix(True, "x4"), "--hires-upscalers-dir")):
        with pytest.raises(InvalidArgument, match=flag):
            bad.check()


def test_two_passes_double_the_picture() -> None:
    """The demo at 64 px with ``--hires-scale 2``: a 128 px picture; the first pass is the
    plain run's latent for latent; the second runs at the hires latent size with the
    truncated schedule; Lanczos (decode, interpolate, encode) gives another picture."""
    from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion

    sd = StableDiffusion({"model": [_demo()]}, None, None, 1)
    try:
        p = GenerateParams(PROMPT, "", 64, 64, steps=4, cfg_scale=5.0, seed=3, sampler="euler")
        plain: list[np.ndarray] = []
        base = sd.txt2img(p, on_step=lambda i, n, x: plain.append(x.copy()))
        steps: list[tuple[int, int, tuple[int, ...]]] = []
        lat: list[np.ndarray] = []

        def on_step(i: int, n: int, x: np.ndarray) -> None:
            steps.append((i, n, x.shape))
            lat.append(x.copy())

        fix = HiresFix(True, steps=3, denoising_strength=0.5)
        img = sd.txt2img(p, on_step=on_step, hires=fix)
        second = hires_sigmas(lambda n: get_sigmas("discrete", n, sd.schedule), 4, fix)
        assert np.array_equal(sd.hires_sigmas, second)
        assert base[0].shape == (64, 64, 3) and img[0].shape == (128, 128, 3)
        assert steps[:4] == [(i, 4, (1, 4, 8, 8)) for i in range(1, 5)]
        for a, b in zip(lat[:4], plain, strict=True):
            np.testing.assert_array_equal(a, b)
        assert steps[4:] == [(i, len(second) - 1, (1, 4, 16, 16)) for i in range(1, len(second))]
        lanczos = sd.txt2img(p, hires=HiresFix(True, "Lanczos", steps=3, denoising_strength=0.5))
        assert lanczos[0].shape == (128, 128, 3) and not np.array_equal(lanczos[0], img[0])
    finally:
        sd.close()


@pytest.fixture(scope="module")
def upscalers(tmp_path_factory) -> Path:
    from pth_writer import compact_weights
    from safetensors.numpy import save_file

    d = tmp_path_factory.mktemp("upscalers")
    save_file(compact_weights(feat=8, n_conv=2), str(d / "compact_x2.safetensors"))
    return d


def test_a_model_upscaler_on_its_planned_device(upscalers: Path) -> None:
    """The ESRGAN named by ``--hires-upscaler`` is the ``upscaler`` module: the plan puts it on
    the second GPU with its weights counted there, the run's plan carries it, and an engine
    run (its weights read from disk per use) records where it ran."""
    from sdplan.core.commands.generate_modules import with_late_modules
    from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
    from sdplan.core.pipelines import jobs
    from sdplan.core.pipelines.request import GenerationRequest, planned_request
    from sdplan.core.planning.estimate import estimate_plan
    from sdplan.core.planning.inventory import Device, Inventory
    from sdplan.core.planning.plan import resolve
    from sdplan.core.runtime.process import JobContext
    from sdplan.core.runtime.runner import CancelToken

    hires = {"enabled": True, "upscaler": "compact_x2", "upscalers_dir": str(upscalers), "steps": 2,
             "denoising_strength": 0.5}
    settings: dict[str, Any] = {"prompt": PROMPT, "width": 64, "height": 64, "steps": 2, "seed": 1,
                                "threads": 1, "previews": False, "hires": hires}
    files = {"model": [_demo()]}
    req = GenerationRequest.from_settings(settings, files)
    model = str(upscalers / "compact_x2.safetensors")
    assert req.hires_model() == model and req.modules() == ("te", "diffusion", "vae", "upscaler")
    inv = Inventory((Device("CUDA0", "first", "gpu", "CUDA", 8 * GIB, 8 * GIB),
                     Device("CUDA1", "second", "gpu", "CUDA", 8 * GIB, 8 * GIB),
                     Device("CPU", "host", "cpu", "CPU", 16 * GIB, 16 * GIB)))
    profile = with_late_modules(profile_from_model_flags(files), files, model)
    plan = resolve(["--backend", "CUDA0,upscaler=CUDA1"], inv, profile)
    fit = estimate_plan(plan, profile, inv, width=128, height=128)
    assert fit.modules["upscaler"].weights == {"CUDA1": profile.modules["upscaler"].total}
    assert fit.devices["CUDA1"].total > profile.modules["upscaler"].total  # and its compute
    run = planned_request(settings, files, plan, fit, inv)
    assert run.plan is not None and run.plan.placements["upscaler"].devices == ("CUDA1",)
    cpu = ModulePlacement(("CPU",))
    res = jobs.generate_job(JobContext(lambda *a: None, CancelToken()), {
        **settings, "model_files": files,
        "placements": {"te": cpu, "diffusion": cpu, "vae": cpu, "upscaler": ModulePlacement(("CPU",), params_mode="disk")}})
    assert res["images"][0].shape == (128, 128, 3)
    assert res["placements"]["upscaler"] == {"devices": ["CPU"], "params": "disk"}
    assert res["params"]["hires"]["upscaler"] == "compact_x2" and res["params"]["hires_size"] == [128, 128]
    with pytest.raises(InvalidArgument, match="no .* file of that name"):
        GenerationRequest.from_settings({**settings, "hires": {**hires, "upscaler": "x8"}}, files).hires_model()


def test_the_flags() -> None:
    from generate_util import parse
    from sdplan.core.commands.generate_modules import hires_size, module_request

    args = parse(["-m", "m", "-p", "x", "-W", "64", "-H", "48", "--hires", "--hires-scale", "1.5",
                  "--hires-upscaler", "Latent (bicubic)", "--hires-steps", "6", "--hires-denoising-strength", "0.4"])
    got = module_request(args)["hires"]
    assert got == {"enabled": True, "upscaler": "Latent (bicubic)", "scale": 1.5, "width": 0, "height": 0,
                   "steps": 6, "denoising_strength": 0.4, "upscalers_dir": None}
    assert hires_size(args) == (96, 72)
    args.hires_multiple = 64  # a UNet family's, as the checked request sets it (sd-cli's VAE x 8)
    assert hires_size(args) == (128, 128)
    assert "hires" not in module_request(parse(["-m", "m", "-p", "x"]))
    for bad, flag in ((["--hires-denoising-strength", "0"], "--hires-denoising-strength"),
                      (["--hires-width", "-3"], "--hires-width"), (["--hires-scale", "100"], "--hires-scale"),
                      (["--hires-upscaler", "RealESRGAN_x4.pth", "--hires-upscalers-dir", "."], "--hires-upscaler")):
        with pytest.raises(InvalidArgument) as exc:
            module_request(parse(["-m", "m", "-p", "x", "--hires", *bad]))
        assert flag in str(exc.value) and "\n" not in str(exc.value)


def test_a_flow_family_runs_the_second_pass(tmp_path: Path) -> None:
    """FLUX.1 dev (tiny) at 32 px with ``--hires-scale 2``: a 64 px picture; the second pass
    runs FLUX.1's own schedule for the hires picture's tokens, truncated as sd-cli does; the
    first pass is the plain run's (same seed, same first-pass latent shape)."""
    import flux_util
    from sdplan.core.pipelines import jobs
    from sdplan.core.runtime.process import JobContext
    from sdplan.core.runtime.runner import CancelToken
    from sdplan.core.sampling.flow import flux_sigmas
    from test_request_options import _autoencoder_x8

    ae = _autoencoder_x8(flux_util.AE, tmp_path / "ae_x8.safetensors")
    req: dict[str, Any] = {"model_files": {"diffusion_model": [str(flux_util.DEV)], "t5xxl": [str(flux_util.T5)],
                                           "clip_l": [str(flux_util.CLIP)], "vae": [ae]},
                           "prompt": "a photo of a cat", "width": 32, "height": 32, "steps": 4, "seed": 1,
                           "threads": 1, "previews": False,
                           "overrides": {"clip_heads": 2, "flux_axes": [4, 6, 6], "t5_length": 16}}
    ctx = JobContext(lambda *a: None, CancelToken())
    plain = jobs.generate_job(ctx, req)
    fix = HiresFix(True, steps=3, denoising_strength=0.5)
    got = jobs.generate_job(ctx, {**req, "hires": fix.to_json()})
    assert plain["images"][0].shape == (32, 32, 3) and got["images"][0].shape == (64, 64, 3)
    pipe = jobs.loaded_pipeline()
    tokens = (64 // 16) * (64 // 16)
    want = hires_sigmas(lambda n: flux_sigmas(n, tokens, shift=True), 4, fix)
    np.testing.assert_array_equal(pipe.hires_sigmas, want)
    assert len(want) - 1 == 3 + 1  # int(6 * 0.5) + 1 steps of the 6-step schedule
    assert got["params"]["hires"]["denoising_strength"] == 0.5


def test_the_estimate_holds_the_second_pass() -> None:
    """The command's estimate is for the largest pass (``hires_size``): the UNet's and the
    VAE's dry runs at the hires size plus their weights against what their runners allocated
    in the second pass and the final decode of a demo run, within 10%."""
    from generate_util import parse
    from sdplan.core.commands.generate_modules import hires_size
    from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
    from sdplan.core.pipelines.compute import measure_compute
    from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion
    from sdplan.core.planning.estimate import estimate_plan
    from sdplan.core.planning.inventory import Device, Inventory
    from sdplan.core.planning.plan import resolve

    args = parse(["-m", _demo(), "-p", PROMPT, "-W", "64", "-H", "64", "--hires"])
    assert hires_size(args) == (128, 128)
    files = {"model": [_demo()]}
    inv = Inventory((Device("CPU", "host", "cpu", "CPU", 16 * GIB, 16 * GIB),))
    prof = profile_from_model_flags(files)
    fit = estimate_plan(resolve(["--backend", "CPU"], inv, prof), prof, inv, width=128, height=128,
                        measured=measure_compute(files, width=128, height=128))
    sd = StableDiffusion(files, None, None, 1)
    try:
        sd.txt2img(GenerateParams(PROMPT, "", 64, 64, steps=2, cfg_scale=5.0, sampler="euler"),
                   hires=HiresFix(True, steps=1))
        for module in ("diffusion", "vae"):
            own = sd.runners[module].last_peak["CPU"]
            peak = own.weights + own.staging + own.compute
            est = fit.modules[module]
            estimate = est.weights["CPU"] + est.compute["CPU"]
            assert 0.9 * peak <= estimate <= 1.1 * peak, (module, estimate, peak)
    finally:
        sd.close()


@pytest.mark.rpc
def test_the_hires_model_upscaler_on_an_rpc_device(upscalers: Path) -> None:
    """The hires fix's ESRGAN on RPC0 (weights on the CPU, staged per use), the rest on the
    CPU, in the engine child: the picture equals the one-device picture within 1/255 and the
    record names RPC0 for the upscaler."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers
    from sdplan.core.pipelines.jobs import GENERATE_JOB
    from sdplan.core.runtime.process import Engine
    from sdplan.core.runtime.run_plan import RunPlan

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    cpu = ModulePlacement(("CPU",))
    req: dict[str, Any] = {"model_files": {"model": [_demo()]}, "prompt": PROMPT, "width": 64, "height": 64,
                           "steps": 2, "seed": 1, "threads": 1, "previews": False,
                           "hires": {"enabled": True, "upscaler": "compact_x2", "upscalers_dir": str(upscalers),
                                     "steps": 2, "denoising_strength": 0.5}}
    with Engine() as engine:
        here = engine.call(GENERATE_JOB, {"request": {**req, "plan": RunPlan(
            {"te": cpu, "diffusion": cpu, "vae": cpu, "upscaler": cpu}).to_json()}})
        with rpc_servers(1) as (server,):
            far = RunPlan({"te": cpu, "diffusion": cpu, "vae": cpu,
                           "upscaler": ModulePlacement(("RPC0",), params_mode="device", params_device="CPU")},
                          (server.endpoint,))
            rpc = engine.call(GENERATE_JOB, {"request": {**req, "plan": far.to_json()}})
    assert rpc["placements"]["upscaler"] == {"devices": ["RPC0"], "params": "device", "params_device": "CPU"}
    assert rpc["images"][0].shape == (128, 128, 3)
    assert np.abs(rpc["images"][0].astype(int) - here["images"][0].astype(int)).max() <= 1


@pytest.mark.parametrize("scale", ["nan", "inf"])
def test_a_scale_that_is_no_number_is_one_line(scale: str, tmp_path: Path, capsys) -> None:
    """``--hires-scale nan`` (or an infinite one) is refused by name before anything loads;
    it was a Python traceback from the output check's picture size."""
    from sdplan.core.cli import main

    out = tmp_path / "h.png"
    rc = main(["generate", "--demo", "-p", PROMPT, "--steps", "2", "-t", "1", "--hires", "--hires-scale", scale,
               "-o", str(out), "--in-process"])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists() and "Traceback" not in err
    assert err.strip().splitlines() == [f"error [invalid_argument]: --hires-scale {float(scale)}: must be a "
                                         "finite number, at most 16"], err
