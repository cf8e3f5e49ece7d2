"""Qwen-Image Edit (``-r`` reference pictures) against transformers and diffusers
(``tools/make_qwen_edit_fixtures.py``): sd-cli's picture sizes for the vision tower and the
autoencoder, the Edit prompt's states with the picture's embeddings (transformers' M-RoPE
positions, and sd-cli's counting positions), a 4-step run against diffusers'
``QwenImageEditPipeline`` with the picture as its reference latent."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import rel_err
from qwen_image_util import DIT, FIX, LLM, VAE

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.pipelines.qwen_image.edit import edit_prefix, vae_size, vl_picture, vl_size  # noqa: E402
from sdplan.core.pipelines.qwen_image.pipeline import QwenImageModels, QwenImagePipeline  # noqa: E402
from sdplan.core.runtime.runner import BackendPool  # noqa: E402
from sdplan.core.text.bpe_tokenizer import BPETokenizer  # noqa: E402

MODELS = QwenImageModels(DIT, LLM, VAE)
SIZE = 64
PROMPT = "make the cat blue"  # the fixture script's


def ref() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(FIX / "qwen_edit_ref.safetensors"))


R = ref()


@pytest.fixture(scope="module")
def pool():
    p = BackendPool(G.BackendManager(1))
    yield p
    p.manager.close()


def test_vision_picture_sizes_are_sd_clis() -> None:
    # sides rounded to 28; below 384^2 scaled up (ceil), above 560^2 down (floor), area kept
    assert vl_size(64, 64) == (392, 392)  # 56^2 < 384^2: 64 * 6 / 28 = 13.7 -> 14 x 28
    assert vl_size(1024, 1024) == (560, 560)  # 1036^2 > 560^2: 1024 / (1024 / 560) / 28 = 20
    assert vl_size(448, 420) == (448, 420)  # within the bounds: only rounded
    assert vl_size(1920, 1080) == (728, 392)  # 1920 / 2.58 / 28 = 26.6 -> 26; 1080 / 2.58 / 28 = 14.9 -> 14
    patches, grid = vl_picture(R["edit.picture"])
    assert grid == (1, 28, 28) and patches.shape == (784, 1176)


def test_reference_latent_sizes_are_sd_clis() -> None:
    # the output's area (at most 1024^2) at the picture's aspect, sides rounded to 32
    assert vae_size(64, 64, 64, 64) == (64, 64)
    assert vae_size(1024, 1024, 1920, 1080) == (1376, 768)  # sqrt(1024^2 * 1920 // 1080) = 1365.3
    assert vae_size(2048, 2048, 500, 500) == (1024, 1024)  # capped at 1024^2
    assert vae_size(256, 256, 100, 5000) == (32, 1824)  # at least 32 a side


def test_edit_prompt_is_sd_clis() -> None:
    tok = BPETokenizer.qwen()
    prefix = edit_prefix([(1, 4, 6), (1, 2, 2)])
    assert prefix.endswith("<|im_start|>user\nPicture 1: <|vision_start|>" + "<|image_pad|>" * 6
                           + "<|vision_end|>Picture 2: <|vision_start|><|image_pad|><|vision_end|>")
    assert len(tok.encode(prefix.split("Picture 1")[0])) == 64  # the dropped system part


def test_states_with_the_picture_match_transformers(pool) -> None:
    with QwenImagePipeline(MODELS, pool=pool, n_threads=1) as pipe:
        assert pipe.vision is not None and pipe.vision.cfg.full_blocks == (1,)  # from the file's metadata
        pictures = pipe.picture_embeddings([R["edit.picture"]])
        assert [g for _, g in pictures] == [(1, 28, 28)] and pictures[0][0].shape == (196, 16)
        pipe.positions = "mrope"
        mrope = pipe.encode_prompt(PROMPT, pictures)
        pipe.positions = "sd-cli"
        counting = pipe.encode_prompt(PROMPT, pictures)
        plain = pipe.encode_prompt(PROMPT)
    want = R["edit.context"]
    assert mrope.shape == counting.shape == want.shape == (1, 212, 16)  # 6 + 196 + 1 picture tokens, prompt, suffix
    assert rel_err(mrope, want) < 1e-4  # seen: 3e-7
    assert rel_err(counting, want) > 1e-2  # sd-cli's positions are not transformers'
    assert plain.shape[1] < 20


@pytest.fixture(scope="module")
def edit(pool) -> dict:
    with QwenImagePipeline(MODELS, pool=pool, n_threads=1) as pipe:
        pipe.positions = "mrope"
        out = pipe.txt2img(PROMPT, SIZE, SIZE, steps=4, cfg_scale=1.0, noise=R["edit.noise"],
                           ref_images=[R["edit.picture"]])
        out["plain"] = pipe.txt2img(PROMPT, SIZE, SIZE, steps=4, cfg_scale=1.0, noise=R["edit.noise"])["latent"]
        out["runners"] = sorted(pipe.runners)
        return out


def test_edit_run_matches_diffusers(edit) -> None:
    assert edit["latent"].shape == R["edit.latent"].shape == (1, 16, 8, 8)
    assert rel_err(edit["latent"], R["edit.latent"]) < 1e-3  # seen: 4e-5
    assert rel_err(edit["plain"], R["edit.latent"]) > 0.05  # the picture matters
    assert {"llm_vision", "vae_encoder"} <= set(edit["runners"])


@pytest.mark.parametrize("flag", [True, False])
def test_zero_cond_t_dit_matches_diffusers(pool, flag) -> None:
    """Qwen-Image-Edit-2511's ``zero_cond_t``: the reference tokens modulated at ``t = 0``
    (diffusers' ``QwenImageTransformer2DModel(zero_cond_t=True)``), and without it the Edit DiT."""
    from sdplan.core.models.qwen_image import ZERO_COND_MARKER, QwenImageDiT
    from sdplan.core.pipelines.stages.flow_dit import shapes
    from sdplan.core.runtime.runner import ModulePlacement, ModuleRunner
    from sdplan.core.runtime.weights import WeightFile

    dit = QwenImageDiT.from_weights(shapes(DIT), zero_cond_t=flag)
    assert QwenImageDiT.from_weights(shapes(DIT)).zero_cond_t is False
    assert QwenImageDiT.from_weights({**shapes(DIT), ZERO_COND_MARKER: (0,)}).zero_cond_t is True  # sd-cli's marker
    names = dit.other_tensors() + [n for i in range(dit.n_blocks) for n in dit.block_tensors(i)]
    r = ModuleRunner(dit, WeightFile(DIT, names, backend=pool.get("CPU")), ModulePlacement(("CPU",)), pool, n_threads=1)
    try:
        lat = R["zero.latent"]
        ins = dit.inputs(lat, R["zero.context"], float(R["zero.sigma"][0]), [R["zero.ref"]])
        assert ("mod_index" in ins) is flag
        v = dit.velocity(r.run(ins)["out"], 8, 8)
    finally:
        r.release()
    want, other = (R["zero.out"], R["zero.plain"]) if flag else (R["zero.plain"], R["zero.out"])
    assert rel_err(v, want) < 1e-3
    assert rel_err(v, other) > 1e-2
