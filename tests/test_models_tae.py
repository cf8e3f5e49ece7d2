"""TAE tiny autoencoders: variant detection from shapes, a random TAESD (prefixed names,
skip convs) against a numpy reference, and the real TAEF2 against its PyTorch reference
(encode, decode, round-trip PSNR) on the CPU, with disk residency and on an RPC device."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import require_or_skip
from rpc_util import PYTHON, rpc_servers
from safetensors.numpy import load_file, save_file
from sdplan.core.errors import ModelFileError
from sdplan.core.models.tae import detect_tae

REF_PSNR = 29.12  # dB, shared/weights/README.md


def _engine() -> None:
    g = pytest.importorskip("sdplan._ggml")
    if not hasattr(g, "Graph"):
        pytest.skip("sdplan._ggml has no Graph (engine not built)")


# ------------------------------------------------------------------------ numpy reference
def np_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int = 1) -> np.ndarray:
    k = w.shape[-1]
    p = k // 2
    xp = np.pad(x, ((0, 0), (p, p), (p, p)))
    h, wd = x.shape[1:]
    cols = np.stack([xp[:, i:i + h, j:j + wd] for i in range(k) for j in range(k)], 1)
    y = np.einsum("ckhw,ock->ohw", cols, w.reshape(w.shape[0], w.shape[1], k * k))
    y = y[:, ::stride, ::stride]
    return y + b[:, None, None] if b is not None else y


def np_group_norm(x: np.ndarray, groups: int, w: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    g = x.reshape(groups, -1)
    g = (g - g.mean(1, keepdims=True)) / np.sqrt(g.var(1, keepdims=True) + eps)
    return g.reshape(x.shape) * w[:, None, None] + b[:, None, None]


def np_block(wt: dict, i: int, x: np.ndarray) -> np.ndarray:
    def conv(n: str, v: np.ndarray) -> np.ndarray:
        return np_conv(v, wt[f"{i}.{n}.weight"], wt.get(f"{i}.{n}.bias"))

    relu = lambda v: np.maximum(v, 0)  # noqa: E731
    if f"{i}.pool.0.weight" in wt:
        p = np_group_norm(conv("pool.0", x), 4, wt[f"{i}.pool.1.weight"], wt[f"{i}.pool.1.bias"])
        x = x + conv("pool.3", relu(p))
    h = conv("conv.4", relu(conv("conv.2", relu(conv("conv.0", x)))))
    return relu(h + (conv("skip", x) if f"{i}.skip.weight" in wt else x))


def np_encode(wt: dict, x: np.ndarray) -> np.ndarray:
    x = np_block(wt, 1, np_conv(x, wt["0.weight"], wt["0.bias"]))
    for d in (2, 6, 10):
        x = np_conv(x, wt[f"{d}.weight"], None, 2)
        for i in range(d + 1, d + 4):
            x = np_block(wt, i, x)
    return np_conv(x, wt["14.weight"], wt["14.bias"])


def np_decode(wt: dict, z: np.ndarray) -> np.ndarray:
    x = np.maximum(np_conv(np.tanh(z / 3) * 3, wt["1.weight"], wt["1.bias"]), 0)
    for i in (3, 4, 5):
        x = np_block(wt, i, x)
    for up, n in ((6, 3), (11, 3), (16, 1)):
        x = np_conv(x.repeat(2, 1).repeat(2, 2), wt[f"{up + 1}.weight"], None)
        for i in range(up + 2, up + 2 + n):
            x = np_block(wt, i, x)
    return np_conv(x, wt["19.weight"], wt["19.bias"])


def tae_weights(rng: np.random.Generator, part: str, latent: int, width: int = 8,
                pool: tuple[int, ...] = (), skip: tuple[int, ...] = ()) -> dict[str, np.ndarray]:
    """Random weights of a TAE half with ``width`` features (the layout of the README)."""
    out: dict[str, np.ndarray] = {}

    def conv(name: str, o: int, i: int, k: int = 3, bias: bool = True) -> None:
        out[f"{name}.weight"] = (rng.standard_normal((o, i, k, k)) / np.sqrt(k * k * i)).astype(np.float32)
        if bias:
            out[f"{name}.bias"] = (rng.standard_normal(o) * 0.1).astype(np.float32)

    def block(i: int) -> None:
        for j in (0, 2, 4):
            conv(f"{i}.conv.{j}", width, width)
        if i in skip:
            conv(f"{i}.skip", width, width, 1, False)
        if i in pool:
            conv(f"{i}.pool.0", 4 * width, width, 1, False)
            out[f"{i}.pool.1.weight"] = rng.uniform(0.5, 1.5, 4 * width).astype(np.float32)
            out[f"{i}.pool.1.bias"] = (rng.standard_normal(4 * width) * 0.1).astype(np.float32)
            conv(f"{i}.pool.3", width, 4 * width, 1, False)

    if part == "encoder":
        conv("0", width, 3)
        block(1)
        for d in (2, 6, 10):
            conv(str(d), width, width, bias=False)
            for i in range(d + 1, d + 4):
                block(i)
        conv("14", latent, width)
    else:
        conv("1", width, latent)
        for i in (3, 4, 5, 8, 9, 10, 13, 14, 15, 18):
            block(i)
        for c in (7, 12, 17):
            conv(str(c), width, width, bias=False)
        conv("19", 3, width)
    return out


# ------------------------------------------------------------------------------ detection
def test_detects_variants_and_prefixes() -> None:
    rng = np.random.default_rng(0)
    shapes = {f"encoder.layers.{k}": v.shape for k, v in tae_weights(rng, "encoder", 4).items()}
    shapes |= {f"decoder.layers.{k}": v.shape for k, v in tae_weights(rng, "decoder", 4).items()}
    found = detect_tae(shapes)
    assert {p: (x.prefix, x.variant, x.latent_channels) for p, x in found.items()} == {
        "encoder": ("encoder.layers.", "taesd", 4), "decoder": ("decoder.layers.", "taesd", 4)}
    dec16 = detect_tae({k: v.shape for k, v in tae_weights(rng, "decoder", 16, pool=(3,)).items()})
    assert (dec16["decoder"].variant, dec16["decoder"].pool_blocks) == ("taef1", (3,))


def test_real_taef2_layout(shared_dir: Path) -> None:
    w = shared_dir / "weights"
    for part, pools in (("encoder", (11, 12, 13)), ("decoder", (3, 4, 5))):
        shapes = {k: v.shape for k, v in load_file(str(w / f"taef2_{part}.safetensors")).items()}
        lay = detect_tae(shapes)[part]
        assert (lay.variant, lay.latent_channels, lay.pool_blocks, lay.prefix) == ("taef2", 32, pools, "")


@pytest.mark.parametrize("shapes,match", [
    ({"a.weight": (3, 3)}, "no TAE"),
    ({f"{i}.conv.0.weight": (8, 8, 3, 3) for i in (1, 2, 3, 4, 5)} | {"0.weight": (8, 3, 3, 3)}, "blocks at"),
])
def test_detect_errors(shapes: dict, match: str) -> None:
    with pytest.raises(ModelFileError, match=match) as exc:
        detect_tae(shapes, "taesd.safetensors")
    assert "taesd.safetensors" in str(exc.value)


# ------------------------------------------------------------------------------- running
def test_random_taesd_matches_numpy(tmp_path: Path) -> None:
    """A 4-channel TAE in one file with diffusers-style prefixes, skip convs and a pool
    branch, against the numpy reference."""
    _engine()
    from sdplan.core.pipelines.stages.tae import Tae

    rng = np.random.default_rng(1)
    enc = tae_weights(rng, "encoder", 4, skip=(3,), pool=(12,))
    dec = tae_weights(rng, "decoder", 4, skip=(9,), pool=(4,))
    path = tmp_path / "taesd.safetensors"
    save_file({**{f"encoder.layers.{k}": v for k, v in enc.items()},
               **{f"decoder.layers.{k}": v for k, v in dec.items()}}, str(path))
    x = rng.random((1, 3, 24, 16), dtype=np.float32)
    z = rng.standard_normal((1, 4, 2, 3)).astype(np.float32) * 2
    tae = Tae(str(path), n_threads=2)
    try:
        assert tae.latent_channels == 4
        np.testing.assert_allclose(tae.encode(x)[0], np_encode(enc, x[0]), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(tae.decode(z)[0], np_decode(dec, z[0]), atol=1e-4, rtol=1e-4)
        prev = tae.preview(z)
        assert prev.shape == (16, 24, 3) and prev.dtype == np.uint8
    finally:
        tae.close()


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(1.0 / np.mean((a - b) ** 2)))


@pytest.fixture(scope="module")
def taef2(shared_dir: Path):  # type: ignore[no-untyped-def]
    w = shared_dir / "weights"
    return ([str(w / "taef2_encoder.safetensors"), str(w / "taef2_decoder.safetensors")],
            load_file(str(w / "reference" / "taef2_roundtrip.safetensors")))


@pytest.mark.parametrize("mode", ["runtime", "disk"])
def test_real_taef2_matches_reference(taef2, mode: str) -> None:  # type: ignore[no-untyped-def]
    _engine()
    from sdplan.core.pipelines.stages.tae import Tae
    from sdplan.core.runtime.runner import ModulePlacement

    paths, ref = taef2
    tae = Tae(*paths, placement=ModulePlacement(("CPU",), params_mode=mode), n_threads=2)
    try:
        latent = tae.encode(ref["image"])
        decoded = tae.decode(ref["latent"])
        roundtrip = tae.decode(latent)
    finally:
        tae.close()
    # f16 weights: errors relative to the values' range stay far below f16's 1e-3
    lat_err = float(np.abs(latent - ref["latent"]).max())
    dec_err = float(np.abs(decoded - ref["decoded"]).max())
    assert lat_err < 1e-3 * float(np.abs(ref["latent"]).max()), lat_err
    assert dec_err < 1e-3, dec_err
    psnr = _psnr(np.clip(roundtrip, 0, 1), ref["image"])
    assert abs(psnr - REF_PSNR) < 0.2, psnr


RPC_SCRIPT = """
import json, sys
import numpy as np
from safetensors.numpy import load_file
from sdplan.core.runtime import devices
from sdplan.core.runtime.runner import BackendPool, ModulePlacement
from sdplan.core.pipelines.stages.tae import Tae

devices.add_rpc_servers([sys.argv[1]])
ref = load_file(sys.argv[3])
out = {}
with devices.BackendManager(cpu_threads=2) as m:
    for name, pl in (("rpc", ModulePlacement(("RPC0",))),
                     ("rpc_params_cpu", ModulePlacement(("RPC0",), params_mode="device", params_device="CPU")),
                     ("rpc_disk", ModulePlacement(("RPC0",), params_mode="disk"))):
        tae = Tae(sys.argv[2], placement=pl, pool=BackendPool(m))
        dec = tae.decode(ref["latent"])
        out[name] = {"err": float(np.abs(dec - ref["decoded"]).max()),
                     "devices": sorted(tae.runners["decoder"].last_peak)}
        tae.close()
print(json.dumps(out))
"""


@pytest.mark.rpc
def test_real_taef2_decoder_on_rpc(taef2) -> None:  # type: ignore[no-untyped-def]
    """The decoder on RPC0 (a loopback server): weights on it, staged from the CPU, and
    read from disk; the client runs in a subprocess (a lost server aborts its client)."""
    _engine()
    from sdplan.core.runtime import devices

    if not devices.rpc_available():
        require_or_skip("the loaded ggml has no RPC backend", "SDPLAN_REQUIRE_RPC")
    paths, _ = taef2
    ref_path = str(Path(paths[0]).parent / "reference" / "taef2_roundtrip.safetensors")
    with rpc_servers(1, threads=2) as (s,):
        res = subprocess.run([PYTHON, "-c", RPC_SCRIPT, s.endpoint, paths[1], ref_path],
                             capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for name, r in out.items():
        assert r["err"] < 1e-3, (name, r)
        assert "RPC0" in r["devices"], (name, r)
    assert "CPU" in out["rpc_params_cpu"]["devices"]
