"""The Wan 2.1 autoencoder encoding a whole video as one graph, against diffusers'
``AutoencoderKLWan.encode`` (first frame alone, then chunks of four with its causal cache; the
fixture's reference mean): nine frames to three latent frames (both temporal downsamplings and
the cache across chunks) and one frame to one."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import rel_err
from safetensors.numpy import load_file
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.base import FunctionGraph
from sdplan.core.models.qwen_image_vae import wan_vae_config, weight_file
from sdplan.core.models.wan_vae_encode import encoded_frames, video_encode
from sparse_writer import FIXTURES

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner  # noqa: E402

VAE = FIXTURES / "wan_vae_tiny.safetensors"
R = load_file(str(FIXTURES / "wan_i2v_ref.safetensors"))
TOL = 5e-3



@pytest.fixture(scope="module")
def runner():
    shapes = {t.name: tuple(t.shape) for t in read_tensor_file(VAE).tensors}
    cfg = wan_vae_config(shapes)
    names = [n for n in shapes if n.startswith(("encoder.", "conv1."))]
    pool = BackendPool(G.BackendManager(1))

    def fn(g, w, ins):
        return {"z": video_encode(g, w, ins["video"], cfg, shapes)}

    r = ModuleRunner(FunctionGraph(names, {"video": "f32"}, fn), weight_file(VAE, names),
                     ModulePlacement(("CPU",)), pool, n_threads=1)
    yield r
    r.release()
    pool.manager.close()


def test_frame_counts() -> None:
    assert [encoded_frames(f) for f in (1, 5, 9, 81)] == [1, 2, 3, 21]


@pytest.mark.parametrize("frames, key", [(9, "enc.mean"), (1, "enc.mean1")])
def test_encode_matches_the_cached_encoder(runner, frames, key) -> None:
    video = np.ascontiguousarray(np.transpose(R["enc.video"][0, :, :frames], (1, 0, 2, 3)))  # (F, 3, H, W)
    out = runner.run({"video": video})["z"]
    want = R[key]
    assert out.shape == (encoded_frames(frames), 16, 4, 6)
    got = np.transpose(out, (1, 0, 2, 3))[None]
    assert rel_err(got, want) < TOL
    # every latent frame is its own (the chunks after the first see the earlier frames)
    if frames == 9:
        assert rel_err(got[:, :, 2], want[:, :, 2]) < TOL and np.abs(want[:, :, 1] - want[:, :, 2]).max() > 0.1


def test_a_frame_count_the_downsampling_cannot_take(runner) -> None:
    with pytest.raises(ValueError, match="1 \\+ 4 k"):
        runner.run({"video": np.zeros((3, 3, 32, 48), np.float32)})
