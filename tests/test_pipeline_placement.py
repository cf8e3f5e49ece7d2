"""The SD pipeline with its modules placed by resolved plans gives the one-device image:
CLIP split over two devices, UNet and VAE staged from CPU params, every module read from
disk, CLIP cut into segments by a small ``--max-vram``; and over two loopback RPC servers in
the engine child process (registration there: a dead server aborts its client).

Non-RPC placements use more CPU backend instances planned as GPU-like devices ``CPU1`` and
``CPU2`` (the kind that takes ``--max-vram`` and layer splits). Tolerances: the final latent within 1e-4 x max
|one device| (measured 0: the same kernels in another order of graphs), pixels within 1/255.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from safetensors.numpy import load_file  # noqa: E402
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags  # noqa: E402
from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.plan import resolve  # noqa: E402
from sdplan.core.runtime.runner import BackendPool  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
MODEL = FIX / "sd1_tiny.safetensors"
GIB = 1 << 30
REF = load_file(str(FIX / "sd1_ref.safetensors"))
PARAMS = GenerateParams("a photo of a cat", "", 16, 16, 4, 7.0, 1, "euler", "discrete")
INVENTORY = Inventory((Device("CPU1", "second CPU backend", "gpu", "TEST", 8 * GIB, 8 * GIB),
                       Device("CPU2", "third CPU backend", "gpu", "TEST", 8 * GIB, 8 * GIB),
                       Device("CPU", "host", "cpu", "CPU", 16 * GIB, 16 * GIB)))
PROFILE = profile_from_model_flags({"model": [MODEL]})


@pytest.fixture(scope="module")
def pool():
    extra = {name: G.init_backend("CPU") for name in ("CPU1", "CPU2")}
    for b in extra.values():
        b.set_n_threads(2)
    p = BackendPool(G.BackendManager(2), extra=extra)
    yield p
    p.manager.close()


def run(pool, argv: list[str]) -> tuple[np.ndarray, np.ndarray, StableDiffusion]:
    plan = resolve(argv, INVENTORY, PROFILE)
    latents: list[np.ndarray] = []
    sd = StableDiffusion(MODEL, plan, pool, n_threads=2, clip_heads=2)
    img = sd.txt2img(PARAMS, on_step=lambda i, n, x: latents.append(x), noise=REF["run_noise"],
                     sigmas=REF["run_sigmas"])[0]
    return latents[-1], img, sd


@pytest.fixture(scope="module")
def one_device(pool) -> tuple[np.ndarray, np.ndarray]:
    lat, img, sd = run(pool, ["--backend", "CPU"])
    sd.close()
    return lat, img


def same(got: tuple[np.ndarray, np.ndarray], want: tuple[np.ndarray, np.ndarray]) -> None:
    assert np.abs(got[0] - want[0]).max() <= 1e-4 * np.abs(want[0]).max()
    assert np.abs(got[1].astype(int) - want[1].astype(int)).max() <= 1


def test_one_device_matches_reference(one_device) -> None:
    err = np.abs(one_device[0] - REF["run_final_latent"]).max() / np.abs(REF["run_final_latent"]).max()
    assert err <= 1e-2


def test_clip_split_and_cpu_params(pool, one_device) -> None:
    lat, img, sd = run(pool, ["--backend", "CPU1,te=CPU1&CPU2", "--params-backend", "diffusion=CPU,vae=CPU"])
    try:
        same((lat, img), one_device)
        te = sd.placements["te"]
        assert te.devices == ("CPU1", "CPU2") and [r.device for r in te.ranges] == ["CPU1", "CPU2"]
        assert sd.runners["te"].memory()["CPU2"].weights > 0  # layer 1 lives on CPU2
        diff = sd.runners["diffusion"]
        assert diff.last_peak["CPU1"].staging > 0 and "CPU1" not in diff.memory()  # staging released
        assert diff.memory()["CPU"].weights > 0  # params stay on CPU
    finally:
        sd.close()


def test_disk_residency_everywhere(pool, one_device) -> None:
    lat, img, sd = run(pool, ["--backend", "CPU1", "--params-backend", "disk"])
    try:
        same((lat, img), one_device)
        for name, r in sd.runners.items():
            assert r.memory() == {} and r.last_peak["CPU1"].weights > 0, name
    finally:
        sd.close()


def test_small_max_vram_cuts_clip_into_segments(pool, one_device) -> None:
    shapes = {"ids": (1, 77), "mask": (77, 77)}
    with StableDiffusion(MODEL, resolve(["--backend", "CPU1"], INVENTORY, PROFILE), pool, clip_heads=2) as sd:
        te = sd._te(1, True)  # measure: embeddings, each layer, the compute buffer (bytes)
        backend = pool.get("CPU1")
        fixed = te.rt.alloc_size(te.model.other_tensors(), backend) + te.measure(shapes)["CPU1"]
        layers = [te.rt.alloc_size(te.model.block_tensors(i), backend) for i in range(2)]
    budget = (fixed + layers[0] + layers[1] // 2) / GIB  # room for one layer at a time
    lat, img, sd = run(pool, ["--backend", "CPU1", "--max-vram", f"CPU1={budget:.12f}"])
    try:
        same((lat, img), one_device)
        te = sd.runners["te"]
        assert te.segmented and len(te.segments({"ids": (1, 77), "mask": (77, 77)})) == 2
    finally:
        sd.close()


@pytest.mark.rpc
def test_modules_over_two_rpc_servers_in_the_engine_process(one_device) -> None:
    """te split over RPC0&RPC1, the UNet on RPC0 with CPU params, the VAE on RPC1 from disk;
    the RPC servers are registered in the engine child only."""
    from conftest import require_or_skip
    from rpc_util import rpc_servers
    from sdplan.core.pipelines.jobs import GENERATE_JOB
    from sdplan.core.runtime.process import Engine
    from sdplan.core.runtime.runner import BlockRange, ModulePlacement

    if not G.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    placements = {"te": ModulePlacement(("RPC0", "RPC1"), (BlockRange("RPC0", 0, 0), BlockRange("RPC1", 1, 1))),
                  "diffusion": ModulePlacement(("RPC0",), params_mode="device", params_device="CPU"),
                  "vae": ModulePlacement(("RPC1",), params_mode="disk")}
    req = {"model_files": {"model": [str(MODEL)]}, "prompt": PARAMS.prompt, "width": 16, "height": 16,
           "steps": 4, "cfg_scale": 7.0, "seed": 1, "sampling_method": "euler", "threads": 1,
           "overrides": {"clip_heads": 2}, "previews": False}
    with Engine() as engine:
        here = engine.call(GENERATE_JOB, {"request": req})["images"][0]
        with rpc_servers(2) as servers:
            rpc = engine.call(GENERATE_JOB, {"request": {**req, "placements": placements,
                                                          "rpc_servers": [s.endpoint for s in servers]}})
    assert np.abs(rpc["images"][0].astype(int) - here.astype(int)).max() <= 1
