"""One full Chroma run (T5 only with sd-cli's padding mask, CFG 4 with the empty negative
prompt, 4 euler steps on the shifted schedule) against diffusers' ChromaPipeline: one device,
the DiT and T5 split over two backends with disk residency, a Q8_0 GGUF DiT, and over two
loopback RPC servers with the plan's ranges (client in a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from flux_util import AE, AXES, CHROMA, CHROMA_REF, FIX, T5, ref, rel_err, write_gguf

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
pytest.importorskip("sdplan.core.models.vae")
from sdplan.core.errors import SdplanError  # noqa: E402
from sdplan.core.pipelines.chroma.pipeline import ChromaModels, ChromaPipeline  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement  # noqa: E402

R = ref(CHROMA_REF)
MODELS = ChromaModels(CHROMA, T5, AE, axes=AXES)
PROMPT = "a photo of a cat"
TOL = 5e-3


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


def run(pool: BackendPool, placements: dict[str, ModulePlacement] | None = None,
        models: ChromaModels = MODELS) -> dict[str, np.ndarray]:
    pipe = ChromaPipeline(models, pool=pool, placements=placements, n_threads=1)
    try:
        frames: list[np.ndarray] = []
        out = pipe.txt2img(PROMPT, 64, 64, steps=4, cfg_scale=4.0, t5_length=16, noise=R["run_noise"],
                           preview=lambda i, rgb: frames.append(rgb))
        assert len(frames) == 4 and frames[0].dtype == np.uint8 and frames[0].shape[2] == 3
        out["memory"] = pipe.memory()  # type: ignore[assignment]
        return out
    finally:
        pipe.close()


@pytest.fixture(scope="module")
def single(pool) -> dict[str, np.ndarray]:
    return run(pool)


def test_conditioning_keeps_the_prompt_and_one_padding_token(pool) -> None:
    with ChromaPipeline(MODELS, pool=pool, n_threads=1) as pipe:
        cond = pipe.encode_prompt(PROMPT, 16)
        uncond = pipe.encode_prompt("", 16)
        full = pipe.encode_prompt(PROMPT, 16, dit_mask=False)
        padded = pipe.encode_prompt(PROMPT, 16, mask_pad=3)
    assert cond.shape == (1, 9, 16) and uncond.shape == (1, 2, 16)  # 8 tokens + 1 pad; </s> + 1 pad
    assert rel_err(cond, R["t5_cond"][:, :9]) < TOL
    assert rel_err(uncond, R["t5_uncond"][:, :2]) < TOL
    assert full.shape == (1, 16, 16) and padded.shape == (1, 11, 16)
    np.testing.assert_allclose(full[:, :9], cond, atol=1e-6)


def test_one_device_matches_diffusers(single) -> None:
    np.testing.assert_allclose(single["sigmas"], R["run_sigmas"], atol=1e-6)
    assert rel_err(single["latent"], R["run_latent"]) < TOL
    assert single["image"].shape == (1, 3, 16, 16) and np.isfinite(single["image"]).all()  # tiny AE: 2x


def test_split_with_disk_residency_matches_one_device(single, pool) -> None:
    split = {"diffusion": (BlockRange("CPU", 0, 1), BlockRange("CPU1", 2, 3)),
             "te": (BlockRange("CPU", 0, 0), BlockRange("CPU1", 1, 2))}
    out = run(pool, {m: ModulePlacement(("CPU", "CPU1"), r, "disk") for m, r in split.items()})
    np.testing.assert_allclose(out["latent"], single["latent"], atol=1e-5)
    np.testing.assert_allclose(out["image"], single["image"], atol=1e-5)
    for runner in ("diffusion", "t5xxl"):
        mem = out["memory"][runner]
        assert set(mem) == {"CPU", "CPU1"}
        assert all(m["now"] is None or m["now"].weights == 0 for m in mem.values())
        assert all(m["peak"].weights > 0 for m in mem.values())


def test_q8_0_gguf_dit(single, pool, tmp_path) -> None:
    pytest.importorskip("gguf")
    path = tmp_path / "chroma-Q8_0.gguf"
    write_gguf(CHROMA, path, "q8_0")
    out = run(pool, models=ChromaModels(path, T5, AE, axes=AXES))
    err = rel_err(out["latent"], single["latent"])
    assert 0 < err < 3e-2  # quantised, and close
    assert rel_err(out["latent"], R["run_latent"]) < 3e-2 + TOL


def test_taef1_previews_and_final_decode(pool, single, tmp_path) -> None:
    """With a TAEF1 (random weights), previews are its decoding of each step's x0 estimate:
    the last one is the final latent's, as a numpy reference of the TAE decodes it. The TAE
    takes the diffusion latent as it is (sd-cli's TinyAutoEncoder: no autoencoder scaling).
    With ``tae_decode`` the TAE also decodes the final picture (sd-cli's ``--taesd`` without
    ``--taesd-preview-only``): the same numpy decode, mapped to [-1, 1]."""
    from safetensors.numpy import save_file
    from test_models_tae import np_decode, tae_weights

    wt = tae_weights(np.random.default_rng(3), "decoder", 16, pool=(3,))
    save_file(wt, str(tmp_path / "taef1.safetensors"))
    models = ChromaModels(CHROMA, T5, AE, taesd=tmp_path / "taef1.safetensors", axes=AXES)
    frames: list[np.ndarray] = []
    with ChromaPipeline(models, pool=pool, n_threads=1) as pipe:
        out = pipe.txt2img(PROMPT, 64, 64, steps=4, cfg_scale=4.0, t5_length=16, noise=R["run_noise"],
                           preview=lambda i, rgb: frames.append(rgb))
        fast = pipe.txt2img(PROMPT, 64, 64, steps=4, cfg_scale=4.0, t5_length=16, noise=R["run_noise"],
                            tae_decode=True)
    np.testing.assert_allclose(out["latent"], single["latent"], atol=1e-6)
    assert len(frames) == 4 and frames[-1].shape == (64, 64, 3)
    decoded = np_decode(wt, single["latent"][0].astype(np.float64))
    want = (np.clip(decoded.transpose(1, 2, 0), 0, 1) * 255).round()
    assert np.abs(frames[-1].astype(int) - want.astype(int)).max() <= 2
    assert fast["image"].shape == (1, 3, 64, 64)
    np.testing.assert_allclose(fast["image"][0], decoded * 2 - 1, atol=2e-2)
    assert out["image"].shape == (1, 3, 16, 16)  # the VAE's picture: the toy autoencoder halves


def test_vae_tiles(pool, single) -> None:
    """``--vae-tile-size`` on the FLUX.1 autoencoder: a latent no larger than a tile decodes
    whole, bit for bit; 4-pixel tiles of the 8x8 latent (overlap 1) give the whole picture
    within the per-tile GroupNorm statistics' difference (the UNet families' tiling,
    test_models_vae), not the same pixels."""
    with ChromaPipeline(MODELS, pool=pool, n_threads=1) as pipe:
        whole = pipe.decode(single["latent"])
        np.testing.assert_array_equal(pipe.decode(single["latent"], 8), whole)
        tiled = pipe.decode(single["latent"], 4)
        out = pipe.txt2img(PROMPT, 64, 64, steps=4, cfg_scale=4.0, t5_length=16, noise=R["run_noise"], vae_tile=4)
    assert tiled.shape == whole.shape == (1, 3, 16, 16)
    np.testing.assert_allclose(out["image"], tiled, atol=1e-5)
    assert np.abs(tiled - whole).max() > 1e-3
    assert np.corrcoef(tiled.ravel(), whole.ravel())[0, 1] > 0.8  # measured 0.87: a random 2-level VAE


def test_bad_inputs_are_errors(pool, tmp_path) -> None:
    from flux_util import DEV
    from sdplan.core.models.base import ModelLayoutError

    with ChromaPipeline(MODELS, pool=pool, n_threads=1) as pipe, pytest.raises(SdplanError, match="multiples of 16"):
        pipe.txt2img(PROMPT, 40, 64)
    with pytest.raises(ModelLayoutError, match="not a Chroma DiT"):
        ChromaPipeline(ChromaModels(DEV, T5, AE, axes=AXES), pool=pool)


RPC_SCRIPT = """
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from flux_util import AE, AXES, T5
from sdplan.core.runtime import devices
from sdplan.core.planning import plan as P
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
from sdplan.core.runtime.runner import BackendPool, ModulePlacement
from sdplan.core.planning.inventory import Inventory
from sdplan.core.pipelines.chroma.pipeline import ChromaModels, ChromaPipeline

dit = sys.argv[5]
devices.add_rpc_servers(sys.argv[1:3])
gib = 1 << 30
inv = Inventory.from_json({{"devices": [
    {{"name": n, "description": n, "type": "gpu", "registry": "RPC", "free": 8 * gib, "total": 8 * gib}}
    for n in ("RPC0", "RPC1")] + [{{"name": "CPU", "description": "host", "type": "cpu",
                                     "registry": "CPU", "free": 16 * gib, "total": 16 * gib}}]}})
prof = profile_from_model_flags({{"diffusion_model": [dit], "t5xxl": [T5], "vae": [AE]}})
assert prof.architecture == "chroma", prof.architecture
plan = P.resolve(["--backend", "diffusion=RPC0&RPC1,te=RPC0&RPC1"], inv, prof)
cpu = ModulePlacement(("CPU",))
placements = {{"diffusion": ModulePlacement.from_plan(plan, "diffusion"),
               "te": ModulePlacement.from_plan(plan, "te"), "vae": cpu}}
with devices.BackendManager(cpu_threads=1) as m:
    pipe = ChromaPipeline(ChromaModels(dit, T5, AE, axes=AXES), pool=BackendPool(m), placements=placements,
                          n_threads=1)
    noise = np.load(sys.argv[3])
    out = pipe.txt2img("a photo of a cat", 64, 64, steps=4, cfg_scale=4.0, t5_length=16, noise=noise)
    res = {{"placed": pipe.placed(),
           "memory": {{k: {{d: v["peak"].weights for d, v in mem.items()}} for k, mem in pipe.memory().items()}},
           "plan": {{k: plan.modules[k].to_json() for k in ("diffusion", "te")}}}}
    np.save(sys.argv[4], out["latent"])
    pipe.close()
print(json.dumps(res))
"""


@pytest.mark.rpc
@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
def test_rpc_split_matches_one_device_and_memory_follows_the_plan(single, pool, tmp_path, dtype) -> None:
    from rpc_util import GGML_PRODUCTS_ENV, ggml_products, rpc_servers

    dit = CHROMA
    if dtype == "q8_0":
        pytest.importorskip("gguf")
        dit = tmp_path / "chroma-Q8_0.gguf"
        write_gguf(CHROMA, dit, "q8_0")
    with ggml_products():  # what the RPC devices multiply with
        one = run(pool, models=ChromaModels(dit, T5, AE, axes=AXES))["latent"]
    np.save(tmp_path / "noise.npy", R["run_noise"])
    with rpc_servers(2) as (s0, s1):
        res = subprocess.run([sys.executable, "-c", RPC_SCRIPT.format(tests=str(FIX.parent)), s0.endpoint,
                              s1.endpoint, str(tmp_path / "noise.npy"), str(tmp_path / "latent.npy"), str(dit)],
                             capture_output=True, text=True, timeout=300, env=GGML_PRODUCTS_ENV)
        assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(np.load(tmp_path / "latent.npy"), one, atol=1e-4)
    for module, key in (("diffusion", "diffusion"), ("te", "t5xxl")):
        p = out["plan"][module]
        placed = out["placed"][key]
        assert [r["device"] for r in p["ranges"]] == ["RPC0", "RPC1"]
        assert placed["RPC1"] == p["ranges"][1]["bytes"]
        assert placed["RPC0"] == p["ranges"][0]["bytes"] + p["main_other_bytes"]
        assert all(out["memory"][key][d] >= b for d, b in placed.items())
