"""One full Flux dev run (T5 + CLIP-L pooled, 4 euler steps, 16-channel VAE) against the
reference: one device, diffusion and T5 split over two backends with disk residency, and
over two loopback RPC servers with the plan's ranges (client in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from flux_util import AE, AXES, CLIP, DEV, FIX, T5, ref, rel_err

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
pytest.importorskip("sdplan.core.models.vae")
from sdplan.core.pipelines.flux.pipeline import FluxModels, FluxPipeline  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement  # noqa: E402

R = ref()
MODELS = FluxModels(DEV, T5, CLIP, AE, axes=AXES, clip_heads=2)
PROMPT = "a photo of a cat"
TOL = 5e-3


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


def run(pool: BackendPool, placements: dict[str, ModulePlacement] | None = None) -> dict[str, np.ndarray]:
    pipe = FluxPipeline(MODELS, pool=pool, placements=placements, n_threads=1)
    try:
        ctx, pooled = pipe.encode_prompt(PROMPT, 16)
        assert rel_err(ctx, R["t5_hidden"]) < TOL
        assert rel_err(pooled, R["clip_pooled"]) < TOL
        frames: list[np.ndarray] = []
        out = pipe.txt2img(PROMPT, 64, 64, steps=4, t5_length=16, noise=R["run_noise"],
                           preview=lambda i, rgb: frames.append(rgb))
        assert len(frames) == 4 and frames[0].dtype == np.uint8 and frames[0].shape[2] == 3
        out["memory"] = pipe.memory()  # type: ignore[assignment]
        return out
    finally:
        pipe.close()


@pytest.fixture(scope="module")
def single(pool) -> dict[str, np.ndarray]:
    return run(pool)


@pytest.fixture(scope="module")
def single_ggml(pool) -> dict[str, np.ndarray]:
    """One device with ggml's products, what RPC devices multiply with (rpc_util.ggml_products)."""
    from rpc_util import ggml_products

    with ggml_products():
        return run(pool)


def test_one_device_matches_reference(single) -> None:
    np.testing.assert_allclose(single["sigmas"], R["run_sigmas"], atol=1e-7)
    assert rel_err(single["latent"], R["run_latent"]) < TOL
    assert rel_err(single["image"], R["run_image"]) < TOL


def test_split_with_disk_residency_matches_one_device(single, pool) -> None:
    split = {"diffusion": (BlockRange("CPU", 0, 1), BlockRange("CPU1", 2, 3)),
             "te": (BlockRange("CPU", 0, 0), BlockRange("CPU1", 1, 2))}
    out = run(pool, {m: ModulePlacement(("CPU", "CPU1"), r, "disk") for m, r in split.items()})
    np.testing.assert_allclose(out["latent"], single["latent"], atol=1e-5)
    np.testing.assert_allclose(out["image"], single["image"], atol=1e-5)
    for runner in ("diffusion", "t5xxl"):
        mem = out["memory"][runner]
        assert set(mem) == {"CPU", "CPU1"}
        assert all(m["now"] is None or m["now"].weights == 0 for m in mem.values())  # disk: all released
        assert all(m["peak"].weights > 0 for m in mem.values())


def test_real_cfg_with_the_negative_prompt(pool, single) -> None:
    """``--cfg-scale`` other than 1 runs sd-cli's real CFG on FLUX.1: each step the DiT on the
    prompt and on the negative prompt (both with the distilled guidance), ``u + cfg (c - u)``;
    the final latents equal a numpy Euler loop over the pipeline's own velocities, and the
    CFG++ sampler's equal its loop on the unconditional estimate. At CFG 1 the negative prompt
    is not read: the reference run's latent."""
    neg, cfg = "a photo", 3.0
    with FluxPipeline(MODELS, pool=pool, n_threads=1) as pipe:
        same = pipe.txt2img(PROMPT, 64, 64, steps=4, t5_length=16, noise=R["run_noise"], negative_prompt=neg)
        out = pipe.txt2img(PROMPT, 64, 64, steps=4, t5_length=16, noise=R["run_noise"], negative_prompt=neg,
                           cfg_scale=cfg)
        pp = pipe.txt2img(PROMPT, 64, 64, steps=4, t5_length=16, noise=R["run_noise"], negative_prompt=neg,
                          cfg_scale=cfg, sampler="euler_cfg_pp")
        c, u = pipe.encode_prompt(PROMPT, 16), pipe.encode_prompt(neg, 16)
        sig = [float(s) for s in out["sigmas"]]
        x = R["run_noise"].astype(np.float32) * np.float32(sig[0])
        y = x.copy()
        for s, s2 in zip(sig, sig[1:], strict=False):
            vc, vu = pipe.velocity(x, s, *c, 3.5), pipe.velocity(x, s, *u, 3.5)
            x = x + np.float32(s2 - s) * (vu + np.float32(cfg) * (vc - vu))
            yc, yu = pipe.velocity(y, s, *c, 3.5), pipe.velocity(y, s, *u, 3.5)
            den, den_u = y - np.float32(s) * (yu + np.float32(cfg) * (yc - yu)), y - np.float32(s) * yu
            y = den + np.float32(s2 / s) * (y - den_u) if s2 > 0 else den
    np.testing.assert_array_equal(same["latent"], single["latent"])
    np.testing.assert_allclose(out["latent"], x, atol=1e-4)
    np.testing.assert_allclose(pp["latent"], y, atol=1e-4)
    assert np.abs(out["latent"] - single["latent"]).max() > 0.01  # the tiny random DiT moves little
    assert np.abs(pp["latent"] - out["latent"]).max() > 0.01


def test_bad_size_is_an_error() -> None:  # a private pool of the CPU
    from sdplan.core.errors import SdplanError

    with FluxPipeline(MODELS, n_threads=1) as pipe, pytest.raises(SdplanError, match="multiples of 16"):
        pipe.txt2img(PROMPT, 40, 64)


RPC_SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from flux_util import AE, AXES, CLIP, DEV, T5
from sdplan.core.runtime import devices
from sdplan.core.planning import plan as P
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
from sdplan.core.runtime.runner import BackendPool, ModulePlacement
from sdplan.core.planning.inventory import Inventory
from sdplan.core.pipelines.flux.pipeline import FluxModels, FluxPipeline

devices.add_rpc_servers(sys.argv[1:3])
gib = 1 << 30
inv = Inventory.from_json({{"devices": [
    {{"name": n, "description": n, "type": "gpu", "registry": "RPC", "free": 8 * gib, "total": 8 * gib}}
    for n in ("RPC0", "RPC1")] + [{{"name": "CPU", "description": "host", "type": "cpu",
                                     "registry": "CPU", "free": 16 * gib, "total": 16 * gib}}]}})
prof = profile_from_model_flags({{"diffusion_model": [DEV], "t5xxl": [T5], "clip_l": [CLIP], "vae": [AE]}})
plan = P.resolve(["--backend", "diffusion=RPC0&RPC1,te=RPC0&RPC1"], inv, prof)
cpu = ModulePlacement(("CPU",))
placements = {{"diffusion": ModulePlacement.from_plan(plan, "diffusion"),
               "te": ModulePlacement.from_plan(plan, "te") if {te_split} else cpu, "vae": cpu}}
with devices.BackendManager(cpu_threads=1) as m:
    pipe = FluxPipeline(FluxModels(DEV, T5, CLIP, AE, axes=AXES, clip_heads=2), pool=BackendPool(m),
                        placements=placements, n_threads=1)
    noise = np.load(sys.argv[3])
    out = pipe.txt2img("a photo of a cat", 64, 64, steps=4, t5_length=16, noise=noise)
    res = {{"placed": pipe.placed(),
           "memory": {{k: {{d: v["peak"].weights for d, v in mem.items()}} for k, mem in pipe.memory().items()}},
           "plan": {{k: plan.modules[k].to_json() for k in ("diffusion", "te")}}}}
    np.save(sys.argv[4], out["image"])
    pipe.close()
print(json.dumps(res))
"""


@pytest.mark.rpc
@pytest.mark.parametrize("te_split", [False, True])
def test_rpc_split_matches_and_memory_follows_the_plan(single_ggml, tmp_path, te_split) -> None:
    from rpc_util import GGML_PRODUCTS_ENV, rpc_servers

    np.save(tmp_path / "noise.npy", R["run_noise"])
    with rpc_servers(2) as (s0, s1):
        res = subprocess.run([sys.executable, "-c", RPC_SCRIPT.format(tests=str(FIX.parent), te_split=te_split), s0.endpoint,
                              s1.endpoint, str(tmp_path / "noise.npy"), str(tmp_path / "image.npy")],
                             capture_output=True, text=True, timeout=300, env=GGML_PRODUCTS_ENV)
        assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    image = np.load(tmp_path / "image.npy")
    np.testing.assert_allclose(image, single_ggml["image"], atol=1e-4)
    for module, key in (("diffusion", "diffusion"), ("te", "t5xxl"))[: 2 if te_split else 1]:
        p = out["plan"][module]
        placed = out["placed"][key]
        assert [r["device"] for r in p["ranges"]] == ["RPC0", "RPC1"]
        assert placed["RPC1"] == p["ranges"][1]["bytes"]
        other = p["main_other_bytes"] - (out["placed"]["clip_l"]["RPC0"] if module == "te" else 0)
        assert placed["RPC0"] == p["ranges"][0]["bytes"] + other
        assert all(out["memory"][key][d] >= b for d, b in placed.items())  # buffers hold what the plan says
