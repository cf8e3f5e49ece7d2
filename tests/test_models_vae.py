"""AutoencoderKL decode/encode graphs against diffusers for the tiny fixtures, tiled decoding,
and the full-size SD VAE layout.

Tolerance: max abs error <= 5e-3 x max |reference| (measured about 1e-3 relative).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from sdplan.core.models import vae  # noqa: E402
from sdplan.core.runtime import graph as gr  # noqa: E402
from test_models_clip import assert_close, load  # noqa: E402


@pytest.fixture(scope="module")
def cpu():
    mgr = G.BackendManager(2)
    yield mgr.get("CPU")
    mgr.close()



def run_decode(backend, w, z: np.ndarray, cfg=None) -> np.ndarray:
    g = gr.new_graph([backend])
    g.output("img", vae.vae_decode(g, w, g.input("z", z.shape), cfg))
    g.set_input("z", np.ascontiguousarray(z, dtype=np.float32))
    g.compute()
    return g.get_output("img")


@pytest.mark.parametrize("family", ["sd1", "sd2"])
def test_vae_decode_and_encode_match_diffusers(cpu, family) -> None:
    mw, ref = load(cpu, family, "vae")
    cfg = vae.vae_config(mw.tensors)
    assert cfg.channels == ((32, 64) if family == "sd1" else (32, 32))
    assert (cfg.latent_channels, cfg.factor, cfg.decoder_blocks, cfg.encoder_blocks) == (4, 2, 2, 1)
    assert_close(run_decode(cpu, mw.tensors, ref["vae_decode_in"], cfg), ref["vae_decode_out"])
    g = gr.new_graph([cpu])
    g.output("m", vae.vae_encode(g, mw.tensors, g.input("img", (1, 3, 16, 16)), cfg))
    g.set_input("img", ref["vae_encode_in"])
    g.compute()
    assert_close(g.get_output("m"), ref["vae_encode_mean"])
    mw.free()


def test_tiled_decode_blends_exactly_for_a_local_decoder() -> None:
    z = np.random.default_rng(0).standard_normal((1, 4, 20, 28)).astype(np.float32)

    def dec(t: np.ndarray) -> np.ndarray:  # pointwise: tiles must reassemble exactly
        return np.kron(np.tanh(t[:, :3]), np.ones((1, 1, 8, 8), np.float32))

    calls = []
    out = vae.tiled_decode(lambda t: calls.append(t.shape) or dec(t), z, tile=8, overlap=3)
    np.testing.assert_allclose(out, dec(z), atol=1e-6)
    assert len(calls) > 4 and set(calls) == {(1, 4, 8, 8)}
    with pytest.raises(ValueError, match="overlap 8 must be in 0..7"):
        vae.tiled_decode(dec, z, tile=8, overlap=8)


def test_tiled_vae_decode_is_close_to_whole(cpu) -> None:
    mw, ref = load(cpu, "sd1", "vae")
    z = np.tile(ref["vae_decode_in"], (1, 1, 2, 2))  # 16x16 latent
    whole = run_decode(cpu, mw.tensors, z)
    tiled = vae.tiled_decode(lambda t: run_decode(cpu, mw.tensors, t), z, tile=10, overlap=4, factor=2)
    assert tiled.shape == whole.shape == (1, 3, 32, 32)
    # GroupNorm statistics are per tile, so tiles differ slightly from the whole decode.
    assert np.corrcoef(tiled.ravel(), whole.ravel())[0, 1] > 0.9  # measured 0.93 on the random tiny VAE
    mw.free()


def test_full_size_sd_vae(shared_dir: Path, cpu) -> None:
    """The SD VAE's names and shapes: widths 128,256,512,512, 3 decoder / 2 encoder blocks,
    factor 8; decoder and encoder graphs build."""
    layout = json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())["sd_vae_ldm"]
    shapes = {k: tuple(v) for k, v in layout.items()}
    cfg = vae.vae_config(shapes)
    assert (cfg.channels, cfg.decoder_blocks, cfg.encoder_blocks, cfg.factor) == (
        (128, 256, 512, 512), 3, 2, 8)
    store = G.WeightStore([(f"w{i}", "f32" if len(s) == 1 else "f16", list(s))
                           for i, s in enumerate(shapes.values())])
    store.plan([f"w{i}" for i in range(len(shapes))], cpu)
    w = {n: store.tensor(f"w{i}") for i, n in enumerate(shapes)}
    g = gr.new_graph([cpu])
    assert vae.vae_decode(g, w, g.input("z", (1, 4, 8, 8)), cfg).shape == (1, 3, 64, 64)
    assert vae.vae_encode(g, w, g.input("x", (1, 3, 64, 64)), cfg).shape == (1, 4, 8, 8)
