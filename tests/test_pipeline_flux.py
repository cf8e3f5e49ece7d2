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
from sdplan.core.pipeline_flux import FluxModels, FluxPipeline, FluxPlacement  # noqa: E402

R = ref()
MODELS = FluxModels(DEV, T5, CLIP, AE, axes=AXES, clip_heads=2)
PROMPT = "a photo of a cat"
TOL = 5e-3


def run(placement: FluxPlacement) -> dict[str, np.ndarray]:
    pipe = FluxPipeline(MODELS, placement)
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
def single() -> dict[str, np.ndarray]:
    return run(FluxPlacement([G.init_backend("CPU")], n_threads=1))


def test_one_device_matches_reference(single) -> None:
    np.testing.assert_allclose(single["sigmas"], R["run_sigmas"], atol=1e-7)
    assert rel_err(single["latent"], R["run_latent"]) < TOL
    assert rel_err(single["image"], R["run_image"]) < TOL


def test_split_with_disk_residency_matches_one_device(single) -> None:
    a, b = G.init_backend("CPU"), G.init_backend("CPU")
    out = run(FluxPlacement([a, b], te=[a, b], diffusion_ranges=[(0, 0, 1), (1, 2, 3)],
                            te_ranges=[(0, 0, 0), (1, 1, 2)], diffusion_residency="disk",
                            te_residency="disk", n_threads=1))
    np.testing.assert_allclose(out["latent"], single["latent"], atol=1e-5)
    np.testing.assert_allclose(out["image"], single["image"], atol=1e-5)
    assert out["memory"]["diffusion"] == [0, 0] and out["memory"]["t5xxl"] == [0, 0]


def test_bad_size_is_an_error() -> None:
    from sdplan.core.errors import SdplanError

    pipe = FluxPipeline(MODELS, FluxPlacement([G.init_backend("CPU")], n_threads=1))
    with pytest.raises(SdplanError, match="multiples of 16"):
        pipe.txt2img(PROMPT, 40, 64)
    pipe.close()


RPC_SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from flux_util import AE, AXES, CLIP, DEV, T5
from sdplan.core import devices, plan as P
from sdplan.core.checkpoint import profile_from_model_flags
from sdplan.core.inventory import Inventory
from sdplan.core.pipeline_flux import FluxModels, FluxPipeline, FluxPlacement

devices.add_rpc_servers(sys.argv[1:3])
gib = 1 << 30
inv = Inventory.from_json({{"devices": [
    {{"name": n, "description": n, "type": "gpu", "registry": "RPC", "free": 8 * gib, "total": 8 * gib}}
    for n in ("RPC0", "RPC1")] + [{{"name": "CPU", "description": "host", "type": "cpu",
                                     "registry": "CPU", "free": 16 * gib, "total": 16 * gib}}]}})
def ranges(mp):
    return [(mp.devices.index(r.device), r.first_block, r.last_block) for r in mp.ranges]
prof = profile_from_model_flags({{"diffusion_model": [DEV], "t5xxl": [T5], "clip_l": [CLIP], "vae": [AE]}})
plan = P.resolve(["--backend", "diffusion=RPC0&RPC1,te=RPC0&RPC1"], inv, prof)
te_ranges = ranges(plan.modules["te"]) if {te_split} else None
with devices.BackendManager(cpu_threads=1) as m:
    bs = [m.get("RPC0"), m.get("RPC1")]
    pipe = FluxPipeline(FluxModels(DEV, T5, CLIP, AE, axes=AXES, clip_heads=2),
                        FluxPlacement(bs, te=bs if {te_split} else [m.get("CPU")], vae=m.get("CPU"), diffusion_ranges=ranges(plan.modules["diffusion"]),
                                      te_ranges=te_ranges, n_threads=1))
    noise = np.load(sys.argv[3])
    out = pipe.txt2img("a photo of a cat", 64, 64, steps=4, t5_length=16, noise=noise)
    res = {{"placed": {{"diffusion": pipe.dit_runner.tensor_bytes(), "t5xxl": pipe.t5_runner.tensor_bytes(),
                       "clip_l": pipe.clip_runner.tensor_bytes()}},
           "memory": pipe.memory(), "plan": {{k: plan.modules[k].to_json() for k in ("diffusion", "te")}}}}
    np.save(sys.argv[4], out["image"])
    pipe.close()
print(json.dumps(res))
"""


@pytest.mark.rpc
@pytest.mark.parametrize("te_split", [False, True])
def test_rpc_split_matches_and_memory_follows_the_plan(single, tmp_path, te_split) -> None:
    from rpc_util import rpc_servers

    np.save(tmp_path / "noise.npy", R["run_noise"])
    with rpc_servers(2) as (s0, s1):
        res = subprocess.run([sys.executable, "-c", RPC_SCRIPT.format(tests=str(FIX.parent), te_split=te_split), s0.endpoint,
                              s1.endpoint, str(tmp_path / "noise.npy"), str(tmp_path / "image.npy")],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    image = np.load(tmp_path / "image.npy")
    np.testing.assert_allclose(image, single["image"], atol=1e-4)
    for module, key in (("diffusion", "diffusion"), ("te", "t5xxl"))[: 2 if te_split else 1]:
        p = out["plan"][module]
        placed = out["placed"][key]
        assert [r["device"] for r in p["ranges"]] == ["RPC0", "RPC1"]
        assert placed[1] == p["ranges"][1]["bytes"]
        other = p["main_other_bytes"] - (out["placed"]["clip_l"][0] if module == "te" else 0)
        assert placed[0] == p["ranges"][0]["bytes"] + other
        assert all(m >= b for m, b in zip(out["memory"][key], placed, strict=True))
