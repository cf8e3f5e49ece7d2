"""The Wan 2.2 autoencoder (TI2V-5B's: 48 channels, residual levels, 2x2 patches) decoding a
latent video as one graph, against diffusers' ``AutoencoderKLWan(is_residual=True)`` decoding
frame by frame with its causal cache and ``first_chunk`` (the fixture's reference, unpatchified,
before its clamp): three latent frames to nine frames, two to five, one to one; the encoder's
mean of nine frames (three latent frames) and of one against ``AutoencoderKLWan._encode`` (the
first frame alone, then four at a time with the cache); its structure read from the tiny file
and from the real-size layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flux_util import rel_err
from safetensors.numpy import load_file
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.base import FunctionGraph, ModelLayoutError
from sdplan.core.models.qwen_image_vae import wan_vae_config, weight_file
from sdplan.core.models.wan22_vae import (
    LATENT_MEAN,
    LATENT_STD,
    encoder_levels,
    is_wan22_vae,
    video_decode,
    video_encode,
    wan22_vae_config,
)
from sparse_writer import FIXTURES

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner  # noqa: E402

VAE = FIXTURES / "wan22_vae_tiny.safetensors"
R = load_file(str(FIXTURES / "wan22_ref.safetensors"))
TOL = 5e-3
SHAPES = {t.name: tuple(t.shape) for t in read_tensor_file(VAE).tensors}



def test_tiny_structure() -> None:
    cfg = wan22_vae_config(SHAPES)
    assert (cfg.z, cfg.patch, cfg.factor, cfg.temporal) == (48, 2, 16, 2)
    assert [(lv.blocks, lv.width_in, lv.width_out, lv.up, lv.temporal) for lv in cfg.levels] == [
        (3, 32, 32, True, True), (3, 32, 32, True, True), (3, 32, 16, True, False), (3, 16, 8, False, False)]
    assert is_wan22_vae(SHAPES) and is_wan22_vae({"vae." + k: v for k, v in SHAPES.items()})
    with pytest.raises(ModelLayoutError):  # the Wan 2.1 reading refuses the nested levels
        wan_vae_config(SHAPES)


def test_real_size_structure(shared_dir) -> None:
    data = json.loads((shared_dir / "models" / "real_size_key_layouts.json").read_text())
    real = {k: tuple(v) for k, v in data["wan22_vae"].items()}
    cfg = wan22_vae_config(real)
    assert (cfg.z, cfg.patch, cfg.factor, cfg.temporal) == (48, 2, 16, 2)
    assert [(lv.width_in, lv.width_out, lv.temporal) for lv in cfg.levels] == [
        (1024, 1024, True), (1024, 1024, True), (1024, 512, False), (512, 256, False)]
    assert not is_wan22_vae({k: tuple(v) for k, v in data["wan21_vae"].items()})
    assert [(lv.width_in, lv.width_out, lv.up, lv.temporal) for lv in encoder_levels(real)] == [
        (160, 160, True, False), (160, 320, True, True), (320, 640, True, True), (640, 640, False, False)]
    assert len(LATENT_MEAN) == len(LATENT_STD) == 48


@pytest.mark.parametrize("frames_in, frames_out, key", [(3, 9, "vae.decoded3"), (2, 5, "vae.decoded2"),
                                                        (1, 1, "vae.decoded1")])
def test_decode_matches_the_cached_decoder(frames_in, frames_out, key) -> None:
    cfg = wan22_vae_config(SHAPES)
    names = [n for n in SHAPES if n.startswith(("decoder.", "conv2."))]
    z = R["vae.z"][:, :, :frames_in]
    want = R[key]
    pool = BackendPool(G.BackendManager(1))

    def fn(g, w, ins):
        return {"video": video_decode(g, w, ins["z"], cfg, SHAPES)}

    runner = ModuleRunner(FunctionGraph(names, {"z": "f32"}, fn), weight_file(VAE, names),
                          ModulePlacement(("CPU",)), pool, n_threads=1)
    out = runner.run({"z": np.ascontiguousarray(np.transpose(z[0], (1, 0, 2, 3)))})["video"]
    assert out.shape == (frames_out, 3, 64, 96)
    got = np.transpose(out, (1, 0, 2, 3))[None]
    assert rel_err(got, want) < TOL
    runner.release()
    pool.manager.close()


@pytest.mark.parametrize("frames, latent", [(9, 3), (1, 1)])
def test_encode_matches_the_cached_encoder(frames, latent) -> None:
    cfg = wan22_vae_config(SHAPES)
    names = [n for n in SHAPES if n.startswith(("encoder.", "conv1."))]
    video = R["enc.video"][:, :, :frames]
    want = R[f"enc.mean{frames}"]
    pool = BackendPool(G.BackendManager(1))

    def fn(g, w, ins):
        return {"mean": video_encode(g, w, ins["video"], cfg, SHAPES)}

    runner = ModuleRunner(FunctionGraph(names, {"video": "f32"}, fn), weight_file(VAE, names),
                          ModulePlacement(("CPU",)), pool, n_threads=1)
    out = runner.run({"video": np.ascontiguousarray(np.transpose(video[0], (1, 0, 2, 3)))})["mean"]
    assert out.shape == (latent, 48, 4, 6)
    assert rel_err(np.transpose(out, (1, 0, 2, 3))[None], want) < TOL
    runner.release()
    pool.manager.close()


def test_encode_refuses_a_decoder_only_file() -> None:
    dec = {k: v for k, v in SHAPES.items() if not k.startswith("encoder.")}
    with pytest.raises(ModelLayoutError, match="no encoder"):
        video_encode(None, {}, None, wan22_vae_config(dec), dec)
