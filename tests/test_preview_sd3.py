"""Live previews of an SD3 generation: the 16-channel latent projection without a TAE, and a
TAESD3 decoder (TAEF1's layout with 16 latent channels) run by the engine's TAE graph, whose last
preview is the numpy reference decode of the final latent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from sd3_util import CLIP_G, CLIP_HEADS, CLIP_L, PROMPT, SD3, T5, ref

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.pipelines.sd3.pipeline import SCALE, SHIFT, Sd3Pipeline  # noqa: E402
from sdplan.core.sampling.preview import latent_to_rgb  # noqa: E402
from test_models_tae import np_decode, tae_weights  # noqa: E402

R = ref()
FILES = {"diffusion_model": [SD3], "clip_l": [CLIP_L], "clip_g": [CLIP_G], "t5xxl": [T5], "vae": [SD3]}


def generate(files: dict, steps: int = 4) -> tuple[dict[str, np.ndarray], list[tuple[int, np.ndarray]], list[str]]:
    frames: list[tuple[int, np.ndarray]] = []
    with Sd3Pipeline(files, n_threads=1, clip_heads=CLIP_HEADS) as pipe:
        out = pipe.txt2img(PROMPT, 16, 16, steps=steps, cfg_scale=4.5, noise=R["run_noise"],
                           preview=lambda i, rgb: frames.append((i, rgb)))
        return out, frames, sorted(pipe.runners)


def test_latent_projection_previews_every_step() -> None:
    out, frames, runners = generate(FILES)
    assert [i for i, _ in frames] == [0, 1, 2, 3] and "preview" not in runners
    for _, rgb in frames:
        assert rgb.shape == (8, 8, 3) and rgb.dtype == np.uint8
    # euler's last denoised prediction is the final latent: the last frame is its projection
    np.testing.assert_array_equal(frames[-1][1], latent_to_rgb(out["latent"], "sd3"))
    assert not np.array_equal(frames[0][1], frames[-1][1])  # the picture changes as it denoises


def test_taesd3_previews(tmp_path: Path) -> None:
    """TAESD3 decodes the diffusion latent as it is (sd-cli's TinyAutoEncoder maps diffusion
    latents to its own unchanged; the SD3 autoencoder's scale and shift are the VAE's)."""
    rng = np.random.default_rng(3)
    dec = tae_weights(rng, "decoder", 16)
    path = tmp_path / "taesd3_decoder.safetensors"
    save_file(dec, str(path))
    out, frames, runners = generate({**FILES, "taesd": [path]})
    assert "preview" in runners and len(frames) == 4
    assert all(f.shape == (64, 64, 3) and f.dtype == np.uint8 for _, f in frames)  # TAE: 8x the latent
    want = np_decode(dec, out["latent"][0].astype(np.float64))
    want = (np.clip(want.transpose(1, 2, 0), 0, 1) * 255).round()
    assert np.abs(frames[-1][1].astype(int) - want.astype(int)).max() <= 1
    vae_space = np_decode(dec, (out["latent"][0] / SCALE + SHIFT).astype(np.float64))
    assert np.abs(frames[-1][1].astype(int) - (np.clip(vae_space.transpose(1, 2, 0), 0, 1) * 255).round()).max() > 8
