"""The Wan 2.1 autoencoder decoding a latent video as one graph, against diffusers'
``AutoencoderKLWan`` decoding frame by frame with its causal cache (the fixture's reference,
before its clamp): two latent frames to five frames, one latent frame to one."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import rel_err
from safetensors.numpy import load_file
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.base import FunctionGraph
from sdplan.core.models.qwen_image_vae import wan_vae_config, weight_file
from sdplan.core.models.wan_vae import latent_frames, video_decode, video_frames
from sparse_writer import FIXTURES

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner  # noqa: E402

VAE = FIXTURES / "wan_vae_tiny.safetensors"
R = load_file(str(FIXTURES / "wan_ref.safetensors"))
TOL = 5e-3



def test_frame_counts() -> None:
    assert [video_frames(t) for t in (1, 2, 21)] == [1, 5, 81]
    assert [latent_frames(f) for f in (1, 5, 6, 8, 9, 81)] == [1, 2, 2, 2, 3, 21]


@pytest.mark.parametrize("key, frames", [("vae.z", 5), ("vae.z1", 1)])
def test_decode_matches_the_cached_decoder(key, frames) -> None:
    shapes = {t.name: tuple(t.shape) for t in read_tensor_file(VAE).tensors}
    cfg = wan_vae_config(shapes)
    assert cfg.factor == 8 and cfg.z == 16
    names = [n for n in shapes if n.startswith(("decoder.", "conv2."))]
    z = R["vae.z"] if key == "vae.z" else R["vae.z"][:, :, :1]
    want = R["vae.decoded"] if key == "vae.z" else R["vae.decoded1"]
    pool = BackendPool(G.BackendManager(1))

    def fn(g, w, ins):
        return {"video": video_decode(g, w, ins["z"], cfg, shapes)}

    runner = ModuleRunner(FunctionGraph(names, {"z": "f32"}, fn), weight_file(VAE, names),
                          ModulePlacement(("CPU",)), pool, n_threads=1)
    frames_first = np.ascontiguousarray(np.transpose(z[0], (1, 0, 2, 3)))  # (T, 16, h, w)
    out = runner.run({"z": frames_first})["video"]
    assert out.shape == (frames, 3, 32, 48)
    got = np.transpose(out, (1, 0, 2, 3))[None]
    assert rel_err(got, want) < TOL
    runner.release()
    pool.manager.close()
