"""Qwen-Image graphs against diffusers and transformers (``make_qwen_image_fixtures.py``): the
MMDiT's velocity on a square and a non-square latent (f16 weights, and f32 weights to 1e-5),
sd-cli's centred position ids, a layer split over two backends, a Q8_0 GGUF DiT; the Wan 2.1
autoencoder's decoder and encoder on one frame with its 5-D kernels folded; the Qwen2.5-VL
encoder's final states under the template, its first 34 tokens dropped."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import rel_err, write_gguf
from qwen_image_util import DIT, LLM, PROMPT, VAE, ref
from sdplan.core.models.base import FunctionGraph, ModelLayoutError
from sdplan.core.models.qwen_image import QwenImageDiT, position_ids, qwen_image_config
from sdplan.core.models.qwen_image_vae import (
    folded_shape,
    vae_decode,
    vae_encode,
    wan_vae_config,
    weight_file,
)

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.models.llm import LLMEncoder, llm_config  # noqa: E402
from sdplan.core.pipelines.qwen_image.pipeline import DROP, TEMPLATE, llm_head_dim  # noqa: E402
from sdplan.core.pipelines.stages.flow_dit import shapes  # noqa: E402
from sdplan.core.runtime.runner import BlockRange, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402
from sdplan.core.text.bpe_tokenizer import BPETokenizer  # noqa: E402

R = ref()
TOL = 5e-3  # f16 matrices and activations in mul_mat against an f32 torch reference (gates of order 1)


@pytest.fixture(scope="module")
def model() -> QwenImageDiT:
    return QwenImageDiT.from_weights(shapes(DIT))


def runner(pool, mod, wf, ranges=None) -> ModuleRunner:
    devices = ("CPU", "CPU1") if ranges else ("CPU",)
    pl = ModulePlacement(devices, tuple(BlockRange(*r) for r in ranges or ()), "runtime")
    return ModuleRunner(mod, wf, pl, pool, n_threads=1)


def velocity(r, mod, case: str) -> np.ndarray:
    lat = R[f"dit_{case}.latent"]
    out = r.run(mod.inputs(lat, R[f"dit_{case}.context"], float(R[f"dit_{case}.sigma"][0])))["out"]
    assert out.shape == (1, lat.shape[2] * lat.shape[3] // 4, 64)
    return mod.velocity(out, *lat.shape[2:])


def test_config_of_the_tiny_dit(model) -> None:
    c = model.cfg
    assert (c.in_channels, c.width, c.heads, c.head_dim, c.context, c.mlp, c.n_blocks) == (64, 64, 2, 32, 16, 256, 2)
    assert c.axes == (4, 14, 14)  # the published (16, 56, 56) scaled to the head width
    names = model.other_tensors() + [n for i in range(model.n_blocks) for n in model.block_tensors(i)]
    assert sorted(names) == sorted(shapes(DIT))  # every tensor used, none twice
    assert qwen_image_config(shapes(DIT), axes=(8, 12, 12)).axes == (8, 12, 12)
    with pytest.raises(ModelLayoutError, match="three even widths summing to the head width 32"):
        qwen_image_config(shapes(DIT), axes=(4, 14, 13))
    layered = dict(shapes(DIT), **{"time_text_embed.addition_t_embedding.weight": (2, 64)})
    with pytest.raises(ModelLayoutError, match="Qwen-Image-Layered"):
        qwen_image_config(layered)
    with pytest.raises(ModelLayoutError, match="no Qwen-Image DiT"):
        qwen_image_config(shapes(VAE))


def test_position_ids_are_sd_clis() -> None:
    """Text at max(h, w) // 2 on every axis; image rows/columns centred as sd-cli's
    ``gen_flux_img_ids`` with ``scale_rope`` (-h//2 ...): for an odd grid that is sd-cli's rule
    (-1, 0, 1), not diffusers' (-2, -1, 0)."""
    ids = position_ids(2, 2, 4)
    assert ids[:2].tolist() == [[2, 2, 2], [3, 3, 3]]
    assert ids[2:].tolist() == [[0, r, c] for r in (-1, 0) for c in (-2, -1, 0, 1)]
    odd = position_ids(1, 3, 1)
    assert odd.tolist() == [[1, 1, 1], [0, -1, 0], [0, 0, 0], [0, 1, 0]]
    ref_ids = position_ids(1, 2, 2, [(2, 2)])
    assert ref_ids[5:].tolist() == [[1, r, c] for r in (-1, 0) for c in (-1, 0)]


@pytest.mark.parametrize("case", ["a", "b"])
def test_velocity_matches_diffusers(cpus, model, case) -> None:
    r = runner(cpus, model, WeightFile(DIT, backend=cpus.get("CPU")))
    f32 = runner(cpus, model, WeightFile(DIT, dtypes={n: "f32" for n in shapes(DIT)}, backend=cpus.get("CPU")))
    try:
        assert rel_err(velocity(r, model, case), R[f"dit_{case}.out"]) < TOL
        assert rel_err(velocity(f32, model, case), R[f"dit_{case}.out"]) < 1e-5
    finally:
        r.release()
        f32.release()


def test_text_and_rope_matter(cpus, model) -> None:
    """The fixture's streams mix: shifting the text or flipping the latent moves the output far
    beyond the tolerance (so the joint attention and the text axis of RoPE are checked)."""
    r = runner(cpus, model, WeightFile(DIT, backend=cpus.get("CPU")))
    try:
        lat, ctx, s = R["dit_b.latent"], R["dit_b.context"], float(R["dit_b.sigma"][0])
        rolled = model.velocity(r.run(model.inputs(lat, np.roll(ctx, 1, axis=1), s))["out"], 4, 8)
        assert rel_err(rolled, R["dit_b.out"]) > 5 * TOL  # the text order alone: RoPE on the text axis
        flipped = model.velocity(r.run(model.inputs(lat[..., ::-1].copy(), ctx, s))["out"], 4, 8)[..., ::-1]
        assert rel_err(flipped, R["dit_b.out"]) > 10 * TOL
    finally:
        r.release()


def test_layer_split_over_two_backends(cpus, model) -> None:
    one = runner(cpus, model, WeightFile(DIT, backend=cpus.get("CPU")))
    split = runner(cpus, model, WeightFile(DIT, backend=cpus.get("CPU")), [("CPU", 0, 0), ("CPU1", 1, 1)])
    try:
        np.testing.assert_allclose(velocity(split, model, "a"), velocity(one, model, "a"), atol=1e-5)
    finally:
        one.release()
        split.release()


def test_q8_0_gguf_dit(cpus, model, tmp_path) -> None:
    path = tmp_path / "qwen-image-tiny-Q8_0.gguf"
    write_gguf(DIT, path, "q8_0")
    gg = QwenImageDiT.from_weights(shapes(path))
    assert gg.cfg == model.cfg
    r = runner(cpus, gg, WeightFile(path, backend=cpus.get("CPU")))
    try:
        err = rel_err(velocity(r, gg, "a"), R["dit_a.out"])
        assert TOL / 10 < err < 3e-2  # Q8_0 rounding, visibly not the f16 file
    finally:
        r.release()


def test_autoencoder_structure_and_folded_weights() -> None:
    cfg = wan_vae_config(shapes(VAE))
    assert cfg.z == 16 and cfg.factor == 8 and cfg.prefix == ""
    assert [k for k, _ in cfg.decoder].count("up") == 3 and [k for k, _ in cfg.encoder].count("down") == 3
    assert cfg.decoder[3] == ("up", 3) and cfg.encoder[2] == ("down", 2)
    assert folded_shape("decoder.conv1.weight", (384, 16, 3, 3, 3)) == (384, 48, 3, 3)
    assert folded_shape("decoder.middle.1.norm.gamma", (384, 1, 1)) == (384,)
    assert folded_shape("decoder.upsamples.3.resample.1.weight", (192, 384, 3, 3)) == (192, 384, 3, 3)
    wf = weight_file(VAE)
    assert wf.infos["decoder.conv1.weight"].shape == (32, 48, 3, 3) and wf.dtypes["decoder.head.0.gamma"] == "f32"
    assert wf.nbytes(wf.infos) == sum(i.nbytes for i in WeightFile(VAE).infos.values())  # the file's bytes
    with pytest.raises(ModelLayoutError, match="no Wan autoencoder"):
        wan_vae_config(shapes(DIT))


@pytest.mark.parametrize("part", ["decoder", "encoder"])
def test_autoencoder_matches_diffusers(cpus, part) -> None:
    """One frame through the causal 3-D autoencoder: the decoder's output before diffusers'
    clamp, and the encoder's mean, against diffusers' ``AutoencoderKLQwenImage`` (f16 kernels as
    the engine holds them; f32 to 1e-5)."""
    sh = shapes(VAE)
    cfg = wan_vae_config(sh)
    if part == "decoder":
        names = [n for n in sh if n.startswith(("decoder.", "conv2."))]
        fg = FunctionGraph(names, {"z": "f32"}, lambda g, w, ins: {"out": vae_decode(g, w, ins["z"], cfg, sh)})
        inputs, want, tol = {"z": R["vae.z"]}, R["vae.decoded"], 3e-3
    else:
        names = [n for n in sh if n.startswith(("encoder.", "conv1."))]
        fg = FunctionGraph(names, {"x": "f32"}, lambda g, w, ins: {"out": vae_encode(g, w, ins["x"], cfg, sh)})
        inputs, want, tol = {"x": R["vae.picture"]}, R["vae.mean"], 3e-3
    r = ModuleRunner(fg, weight_file(VAE, names, cpus.get("CPU")), ModulePlacement(("CPU",)), cpus, n_threads=1)
    wf32 = weight_file(VAE, names, cpus.get("CPU"))
    wf32.dtypes = {n: "f32" for n in names}
    f32 = ModuleRunner(fg, wf32, ModulePlacement(("CPU",)), cpus, n_threads=1)
    try:
        assert rel_err(r.run(inputs)["out"], want) < tol  # f16 kernels
        assert rel_err(f32.run(inputs)["out"], want) < 1e-5
    finally:
        r.release()
        f32.release()


def test_text_encoder_states_match_transformers(cpus) -> None:
    """Qwen2.5-VL's final normed states of sd-cli's template around the prompt, the template's
    34 system tokens dropped; the vision tower and the head width come from the file."""
    tok = BPETokenizer.qwen()
    assert len(tok.encode(TEMPLATE[0])) == DROP
    ids = tok.encode_prompt(PROMPT, *TEMPLATE).ids
    np.testing.assert_array_equal(ids, R["llm.ids"])
    assert llm_head_dim(LLM) == 8
    cfg = llm_config(shapes(LLM), head_dim=llm_head_dim(LLM))
    assert (cfg.arch.name, cfg.vocab, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.n_blocks) == ("qwen2.5", 152064, 16, 2, 1, 3)
    enc = LLMEncoder(cfg)
    names = enc.other_tensors() + [n for i in range(enc.n_blocks) for n in enc.block_tensors(i)]
    assert not [n for n in names if "visual." in n]  # the vision tower is not the text path
    r = runner(cpus, enc, WeightFile(LLM, names, backend=cpus.get("CPU")))
    try:
        for key in ("", "neg_"):
            hidden = r.run(enc.inputs(R[f"llm.{key}ids"]))["hidden"][:, DROP:]
            assert rel_err(hidden, R[f"llm.{key}hidden"]) < 1e-3
    finally:
        r.release()
