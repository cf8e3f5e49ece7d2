"""VAE tiling as the newest sd-cli runs it (spec sections 14.6 and 14.7), on sdplan's engine.

sd-cli's tile grid and blend (``sd_tiling_calc_tiles``, ``process_tiles_2d``): a decoder
that maps each latent pixel to its own block of pixels is reproduced exactly by the tiled run
(the smootherstep weights sum to one); the demo model's VAE decoding a picture of its world (a
red disc on blue) in 96-pixel tiles of a 128-pixel picture is within 12/255 mean and 96/255
at most of the whole decode (measured 10.4 and 79: this small VAE leans on its GroupNorm
statistics over the whole picture and on far context, which tiles do not see; a local decoder
is exact, above); a decode whose graph does not fit
the VAE's ``--max-vram`` budget is retried in tiles (also over RPC, in the engine child); the
estimate of a tiled decode (weights plus the dry run of one tile) is within 10% of the
engine's peak; the request's old latent-pixel tile reads as the newest tiling; generate's
flags give the request and refuse bad values in one line.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from sdplan.core.errors import InvalidArgument  # noqa: E402
from sdplan.core.pipelines.stages.vae_tiles import (  # noqa: E402
    calc_tiles,
    decode_tiled,
    process_tiles,
    retry_tiles,
)
from sdplan.core.planning.vae_tiling import VaeTiling  # noqa: E402
from sdplan.core.runtime.runner import ModulePlacement  # noqa: E402

GIB = 1 << 30


def _demo() -> str:
    from sdplan.core.pipelines.demo.model import demo_model_path

    return str(demo_model_path())


def test_the_grid_is_sd_clis() -> None:
    # 128 latent pixels in 32-pixel tiles overlapping by half: 7 tiles, exactly half
    assert calc_tiles(128, 32, 0.5) == (7, 0.5)
    # 100: 5 tiles whose overlap is 60 / 128 of a tile
    assert calc_tiles(100, 32, 0.5) == (5, 60 / 128)
    assert calc_tiles(20, 32, 0.5) == (1, 0.0)  # one tile holds it
    assert calc_tiles(40, 32, 0.5) == (2, 24 / 32)  # two tiles: what they must overlap
    assert calc_tiles(64, 16, 0.0) == (4, 0.0)
    # the retry: 256 px, halved to 4 latent pixels
    assert retry_tiles(64, 48, None, 8) == [(32, 32), (16, 16), (8, 8), (4, 4)]
    assert retry_tiles(64, 48, VaeTiling(False, (128, 64)), 8) == [(16, 8), (8, 4), (4, 4)]


@pytest.mark.parametrize("overlap", [0.0, 0.25, 0.5])
@pytest.mark.parametrize("size", [(13, 21), (32, 32), (9, 40)])
def test_tiles_blend_to_the_whole_for_a_local_decoder(size: tuple[int, int], overlap: float) -> None:
    """Each latent pixel decodes to its own 8x8 block (nearest upsampling of a channel mix):
    tiled and whole agree to rounding, for decode and for encode (a block mean)."""
    rng = np.random.default_rng(0)
    z = rng.standard_normal((2, 4, *size)).astype(np.float32)
    mix = rng.standard_normal((3, 4)).astype(np.float32)

    def dec(t: np.ndarray) -> np.ndarray:
        return np.einsum("oc,nchw->nohw", mix, t).repeat(8, 2).repeat(8, 3)

    def enc(img: np.ndarray) -> np.ndarray:
        n, c, h, w = img.shape
        return img.reshape(n, c, h // 8, 8, w // 8, 8).mean((3, 5))

    whole = dec(z)
    tiled = process_tiles(dec, z, (8, 6), overlap, 8, True)
    np.testing.assert_allclose(tiled, whole, atol=1e-5)
    np.testing.assert_allclose(process_tiles(enc, whole, (8, 6), overlap, 8, False), enc(whole), atol=1e-5)


@pytest.fixture(scope="module")
def demo():
    from sdplan.core.pipelines.sd.pipeline import StableDiffusion
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    manager = BackendManager(1)
    extra = {"CPU1": G.init_backend("CPU")}
    extra["CPU1"].set_n_threads(1)
    pool = BackendPool(manager, extra=extra)
    sd = StableDiffusion({"model": [_demo()]}, None, pool)
    yy, xx = np.mgrid[0:128, 0:128]
    disc = (yy - 60) ** 2 + (xx - 70) ** 2 < 35 ** 2
    img = np.zeros((1, 3, 128, 128), np.float32)
    img[0, 0] = np.where(disc, 0.9, -0.8)
    img[0, 2] = np.where(disc, -0.7, 0.6)
    z = sd.encode_image(img) * np.float32(0.18215)
    yield sd, z, sd.decode(z)
    sd.close()
    manager.close()


def _u8(img: np.ndarray) -> np.ndarray:
    return np.clip((img + 1.0) * 127.5, 0, 255)


def test_a_tiled_decode_is_close_to_the_whole_one(demo) -> None:
    sd, z, whole = demo
    tiled = sd.decode(z, VaeTiling(True, (96, 96)))
    assert sd.last_decode.tile == (96, 96) and not sd.last_decode.retried
    d = np.abs(_u8(tiled) - _u8(whole))
    assert tiled.shape == whole.shape == (1, 3, 128, 128)
    assert d.mean() <= 12 and d.max() <= 96, (d.mean(), d.max())
    assert d.max() > 0  # tiles, not the whole graph
    rel = sd.decode(z, VaeTiling(True, relative=(1.5, 1.5)))  # 1.5 tiles a side: 16 / 1.25 latent
    assert np.abs(_u8(rel) - _u8(whole)).mean() <= 12
    assert sd.run_info() == {"vae_tiles": {"tile": [104, 104], "overlap": 0.5, "retried": False}}


def test_a_decode_over_its_budget_is_retried_in_tiles(demo) -> None:
    """The VAE on a second CPU device with a budget below its whole decode (weights plus the
    compute buffer) but above a 64-pixel tile's: the retry's tiles, equal to asking for them."""
    from sdplan.core.pipelines.stages.vae_tiles import fits_budget

    sd, z, whole = demo
    runner = sd.runners["vae"]
    weights = runner.wf.nbytes(runner.wf.infos)
    need = {t: weights + sum(runner.measure({"z": (1, 4, t, t)}).values()) for t in (16, 8)}
    assert need[8] < need[16]
    budget = (need[8] + need[16]) // 2
    old = sd.placements["vae"]
    sd.runners["vae"].pl = ModulePlacement(("CPU1",), budget=budget)
    try:
        assert fits_budget(runner)((1, 4, 16, 16)) is False
        got = sd.decode(z)
        assert sd.last_decode.retried and sd.last_decode.tile == (64, 64)
        np.testing.assert_array_equal(got, sd.decode(z, VaeTiling(True, (64, 64))))
    finally:
        sd.runners["vae"].pl = old


def test_an_allocation_failure_is_retried(demo) -> None:
    """A whole decode whose compute buffer cannot be allocated (the engine's error) is run
    again in tiles; another error is not."""
    from sdplan.core.errors import EngineError

    sd, z, whole = demo
    calls: list[tuple[int, ...]] = []

    def run(t: np.ndarray) -> np.ndarray:
        calls.append(t.shape)
        if t.shape[-1] > 8:
            raise EngineError("vae: Graph: could not allocate the compute buffers (out of device memory?)")
        return t.repeat(8, 2).repeat(8, 3)[:, :3]

    out, how = decode_tiled(run, z, None, 8)
    assert how.retried and how.tile == (64, 64) and calls[0] == (1, 4, 16, 16)
    assert out.shape == (1, 3, 128, 128)

    def broken(t: np.ndarray) -> np.ndarray:
        raise EngineError("vae: RPC0 is gone")

    with pytest.raises(EngineError, match="gone"):
        decode_tiled(broken, z, None, 8)


def test_the_tiled_estimate_is_the_engine_peak(demo) -> None:
    """Weights plus the dry run of one tile against what the VAE's runner allocated while it
    decoded in those tiles: within 10%; and the estimate of a whole decode over its budget is
    the retry's tile's."""
    from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
    from sdplan.core.pipelines.compute import measure_compute
    from sdplan.core.planning.estimate import estimate_plan
    from sdplan.core.planning.inventory import Device, Inventory
    from sdplan.core.planning.plan import resolve

    sd, z, _ = demo
    files = {"model": [_demo()]}
    inv = Inventory((Device("CPU", "host", "cpu", "CPU", 16 * GIB, 16 * GIB),))
    prof = profile_from_model_flags(files)
    plan = resolve(["--backend", "CPU"], inv, prof)
    tiling = VaeTiling(True, (64, 64))
    measured = measure_compute(files, width=128, height=128, vae_tiling=tiling.to_json())
    whole = measure_compute(files, width=128, height=128)
    assert measured["vae"] < whole["vae"]
    fit = estimate_plan(plan, prof, inv, width=128, height=128, measured=measured)
    est = fit.modules["vae"]
    sd.decode(z, tiling)
    own = sd.runners["vae"].last_peak["CPU"]
    peak = own.weights + own.staging + own.compute
    estimate = est.weights["CPU"] + est.compute["CPU"]
    assert 0.9 * peak <= estimate <= 1.1 * peak, (estimate, peak)
    # a budget under the whole decode: the estimate is the retry's tiles'
    weights = prof.modules["vae"].total
    budget = weights + (measured["vae"] + whole["vae"]) // 2
    retried = measure_compute(files, width=128, height=128,
                              placements={"vae": ModulePlacement(("CPU",), budget=budget)})
    assert retried["vae"] == measured["vae"]


def test_old_requests_and_the_flags() -> None:
    from generate_util import parse
    from sdplan.core.commands.generate_modules import module_request
    from sdplan.core.families import family
    from sdplan.core.pipelines.request import GenerationRequest

    old = GenerationRequest.from_settings({"prompt": "x", "vae_tile_size": 8, "model_files": {"model": ["m"]}})
    fam = family("sd1")
    assert fam is not None
    checked = old.check(fam)
    assert checked.vae_tiling == VaeTiling(True, (64, 64)) and checked.vae_tile_size == 0
    assert checked.settings(fam)["vae_tiling"] == {"enabled": True, "tile_px": [64, 64], "overlap": 0.5,
                                                   "relative": None}
    again = GenerationRequest.from_dict(checked.to_dict())
    assert again.vae_tiling == checked.vae_tiling
    args = parse(["-m", "m", "-p", "x", "--vae-tiling", "--vae-tile-size", "64x32", "--vae-tile-overlap", "0.25",
                  "--vae-relative-tile-size", "2"])
    assert module_request(args)["vae_tiling"] == {"enabled": True, "tile_px": [64, 32], "overlap": 0.25,
                                                  "relative": [2.0, 2.0]}
    assert module_request(parse(["-m", "m", "-p", "x"]))["vae_tiling"] is None
    for bad, flag in ((["--vae-tile-size", "64y"], "--vae-tile-size"), (["--vae-tile-size", "100000"], "--vae-tile-size"),
                      (["--vae-tile-overlap", "x"], "--vae-tile-overlap"),
                      (["--vae-relative-tile-size", "0"], "--vae-relative-tile-size")):
        with pytest.raises(InvalidArgument) as exc:
            module_request(parse(["-m", "m", "-p", "x", *bad]))
        assert flag in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.rpc
def test_a_decode_over_its_budget_on_an_rpc_device_succeeds_by_the_retry() -> None:
    """The demo at 128 px with its VAE on RPC0 under a budget its whole decode does not fit: the
    engine child retries in tiles, says so in the record, and the picture is the CPU's tiled
    one within 1/255."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers
    from sdplan.core.pipelines.jobs import GENERATE_JOB
    from sdplan.core.runtime.process import Engine
    from sdplan.core.runtime.run_plan import RunPlan

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    from sdplan.core.pipelines.compute import measure_compute

    files = {"model": [_demo()]}
    whole = measure_compute(files, width=128, height=128)["vae"]
    tile = measure_compute(files, width=128, height=128, vae_tiling=VaeTiling(True, (64, 64)).to_json())["vae"]
    from sdplan.core.modelfiles.checkpoint import profile_from_model_flags

    budget = profile_from_model_flags(files).modules["vae"].total + (whole + tile) // 2
    req: dict[str, Any] = {"model_files": files, "prompt": "a red circle on a blue background", "width": 128,
                           "height": 128, "steps": 2, "seed": 1, "threads": 1, "previews": False}
    cpu = ModulePlacement(("CPU",))
    with Engine() as engine:
        here = engine.call(GENERATE_JOB, {"request": {**req, "vae_tiling": {"enabled": True, "tile_px": [64, 64]},
                                                       "plan": RunPlan({"te": cpu, "diffusion": cpu, "vae": cpu}).to_json()}})
        with rpc_servers(1) as (server,):
            far = RunPlan({"te": cpu, "diffusion": cpu, "vae": ModulePlacement(("RPC0",), budget=budget)},
                          (server.endpoint,))
            rpc = engine.call(GENERATE_JOB, {"request": {**req, "plan": far.to_json()}})
    assert rpc["params"]["vae_tiles"] == {"tile": [64, 64], "overlap": 0.5, "retried": True}
    assert rpc["placements"]["vae"] == {"devices": ["RPC0"], "params": "runtime", "budget": budget}
    assert np.abs(rpc["images"][0].astype(int) - here["images"][0].astype(int)).max() <= 1
