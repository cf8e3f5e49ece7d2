"""The LLM text encoder (tiny Qwen3) against transformers: hidden_states[-2] (Z-Image's), the
final normed state and two layers concatenated (FLUX.2 klein's form); transformers and
llama.cpp GGUF names (f32, Q8_0); blocks split over two backends, segmented, disk residency;
configuration of the Qwen2.5 and Mistral variants from shapes."""

from __future__ import annotations

import numpy as np
import pytest
from sdplan.core.models.base import ModelLayoutError
from sdplan.core.models.llm import ARCHS, LLMEncoder, causal_mask, find_layout, llm_config
from zimage_util import qwen3_hf, ref, rel_err, write_qwen3

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.pipelines.stages.flow_dit import shapes as _shapes  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402

R = ref()
TOL = 2e-3  # f16 matrices in f32 arithmetic
SHAPES = {k: tuple(v.shape) for k, v in qwen3_hf().items()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3")
    return {"hf": write_qwen3(d / "qwen_3_tiny.safetensors"),
            "f32": write_qwen3(d / "qwen3-tiny-f32.gguf", "gguf", "f32"),
            "q8_0": write_qwen3(d / "qwen3-tiny-Q8_0.gguf", "gguf", "q8_0")}


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


def run(pool, path, out_layers=None, ranges=(), mode="runtime", budget=0) -> tuple[np.ndarray, ModuleRunner]:
    enc = LLMEncoder.from_weights(_shapes(path), out_layers)
    pl = ModulePlacement(("CPU", "CPU1") if ranges else ("CPU",), ranges, mode, budget=budget)
    r = ModuleRunner(enc, WeightFile(path), pl, pool, n_threads=1)
    try:
        return r.run(enc.inputs(R["llm.ids"]))["hidden"], r
    finally:
        r.release()


def test_config_from_shapes() -> None:
    c = llm_config(SHAPES)
    assert (c.layout, c.prefix, c.arch.name) == ("hf", "model.", "qwen3")
    assert (c.vocab, c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, c.n_blocks) == (151936, 32, 4, 2, 16, 64, 4)
    assert find_layout({"token_embd.weight": (1,), "blk.0.attn_norm.weight": (1,)}) == ("gguf", "")
    assert find_layout({"text_encoders.llm.model.layers.0.input_layernorm.weight": (1,)}) == \
        ("hf", "text_encoders.llm.model.")
    with pytest.raises(ModelLayoutError, match="no language model"):
        llm_config({"x.weight": (1,)})


def test_variants_are_configurations() -> None:
    """Qwen2.5 (q/k/v biases, no q/k norms) and Mistral (neither) from the same names."""
    no_norm = {k: v for k, v in SHAPES.items() if "_norm." not in k or "layernorm" in k}
    with pytest.raises(ModelLayoutError, match="do not divide into heads of 128"):
        llm_config(no_norm)  # without q-norms the head width is the preset's 128
    mistral = llm_config(no_norm, head_dim=16)
    assert mistral.arch == ARCHS["mistral"] and mistral.rope == "neox" and mistral.heads == 4
    biased = dict(no_norm)
    for i in range(4):
        for r in ("q", "k", "v"):
            biased[f"model.layers.{i}.self_attn.{r}_proj.bias"] = (SHAPES[f"model.layers.{i}.self_attn.{r}_proj.weight"][0],)
    enc = LLMEncoder.from_weights(biased, head_dim=16)
    assert enc.cfg.arch == ARCHS["qwen2.5"] and enc.cfg.kv_heads == 2
    assert enc.block_tensors(1)[-3:] == [f"model.layers.1.self_attn.{r}_proj.bias" for r in "qkv"]
    assert LLMEncoder(llm_config(SHAPES)).block_tensors(2)[-2:] == [
        "model.layers.2.self_attn.q_norm.weight", "model.layers.2.self_attn.k_norm.weight"]
    assert llm_config(biased, "qwen3", 16).arch.qkv_bias is False  # an explicit family wins
    with pytest.raises(ModelLayoutError, match="unknown language-model family 'gemma'"):
        llm_config(SHAPES, "gemma")


def test_bad_inputs_and_out_layers() -> None:
    enc = LLMEncoder(llm_config(SHAPES))
    with pytest.raises(ValueError, match=r"0..151935"):
        enc.inputs(np.array([[151936]]))
    with pytest.raises(ValueError, match=r"\(1, T\)"):
        enc.inputs(np.array([1, 2]))
    with pytest.raises(ValueError, match=r"out layers \[6\] outside 1..5"):
        LLMEncoder(llm_config(SHAPES), (6,))
    m = causal_mask(3)
    assert m[0, 1] == -np.inf and m[1, 0] == 0 and m[2, 2] == 0


def test_hidden_states_match_transformers(pool, files) -> None:
    m2, _ = run(pool, files["hf"], (3,))
    assert m2.shape == R["llm.hidden_m2"].shape
    assert rel_err(m2, R["llm.hidden_m2"]) < TOL
    final, _ = run(pool, files["hf"])
    assert rel_err(final, R["llm.hidden_final"]) < TOL
    multi, _ = run(pool, files["hf"], (1, 3))
    assert multi.shape[-1] == 64 and rel_err(multi, R["llm.hidden_1_3"]) < TOL


def test_gguf_names_f32_and_q8_0(pool, files) -> None:
    f32, _ = run(pool, files["f32"], (3,))
    assert rel_err(f32, R["llm.hidden_m2"]) < TOL
    q8, runner = run(pool, files["q8_0"], (3,))
    assert 0 < rel_err(q8, R["llm.hidden_m2"]) < 3e-2  # Q8_0 rounding, not equal to f32
    assert runner.wf.dtypes["blk.0.attn_q.weight"] == "q8_0"
    assert runner.wf.dtypes["token_embd.weight"] == "q8_0"


def test_split_segmented_and_disk_equal_one_device(pool, files) -> None:
    one, _ = run(pool, files["hf"], (3,))
    split, r = run(pool, files["hf"], (3,), (BlockRange("CPU", 0, 1), BlockRange("CPU1", 2, 3)))
    np.testing.assert_allclose(split, one, atol=1e-6)
    enc = r.model
    # block 3 comes after the state asked for: listed, neither loaded nor placed
    assert r.placed_bytes()["CPU1"] == sum(r.rt.nbytes(n) for n in enc.block_tensors(2)) > 0
    disk, r = run(pool, files["q8_0"], (3,), (BlockRange("CPU", 0, 0), BlockRange("CPU1", 1, 3)), "disk")
    q8, _ = run(pool, files["q8_0"], (3,))
    np.testing.assert_allclose(disk, q8, atol=1e-6)
    seg, r = run(pool, files["hf"], (3,), budget=r.rt.alloc_size(r.model.other_tensors(), pool.get("CPU")) + 600_000)
    assert len(r.segments({k: v.shape for k, v in r.model.inputs(R["llm.ids"]).items()})) > 1
    np.testing.assert_allclose(seg, one, atol=1e-6)


def test_blocks_after_the_last_state_asked_for_are_not_loaded(pool, files) -> None:
    """States after blocks 1 and 3 of 4 (klein's form): block index 3 is listed, as the file
    has it, but its weights are neither loaded nor placed, whole or segmented (sd-cli loads
    only the tensors its graph uses); the final norm (non-block) stays."""
    enc = LLMEncoder.from_weights(_shapes(files["hf"]), (1, 3))
    assert (enc.n_blocks, enc.blocks_read) == (4, 3) and enc.block_tensors(3)
    late = enc.block_tensors(3)
    r = ModuleRunner(enc, WeightFile(files["hf"]), ModulePlacement(("CPU",)), pool, n_threads=1)
    try:
        with r.session():
            out = r.run(enc.inputs(R["llm.ids"]))["hidden"]
            assert not any(r.rt.resident(n) for n in late)
            used = enc.other_tensors() + [n for i in range(3) for n in enc.block_tensors(i)]
            assert all(r.rt.resident(n) for n in used)
            need = sum(int(r.rt.nbytes(n)) for n in used)
            assert need <= r.memory()["CPU"].weights < need + sum(int(r.rt.nbytes(n)) for n in late)
        assert r.placed_bytes() == {"CPU": need}
        budget = r.rt.alloc_size(enc.other_tensors(), pool.get("CPU")) + 1  # one segment per block
    finally:
        r.release()
    assert rel_err(out, R["llm.hidden_1_3"]) < TOL
    seg, r = run(pool, files["hf"], (1, 3), budget=budget)
    assert r.last_segments == 4
    np.testing.assert_allclose(seg, out, atol=1e-6)


def _variant(tmp_path, name: str, gguf: bool = False):
    """One model of ``llm_variants_tiny.safetensors`` as a file of its own: transformers names,
    or llama.cpp names (f32) with q/k rows permuted as llama.cpp's converter stores
    Llama-architecture models (``LlamaModel.permute``: each head's two halves interleaved)."""
    import gguf as gg
    from safetensors.numpy import load_file, save_file
    from zimage_util import FIX, gguf_name

    w = {k[len(name) + 1:]: v for k, v in load_file(str(FIX / "llm_variants_tiny.safetensors")).items()
         if k.startswith(name + ".")}
    if not gguf:
        save_file(w, str(tmp_path / f"{name}.safetensors"))
        return tmp_path / f"{name}.safetensors"

    def permute(a, heads):
        return a.reshape(heads, 2, a.shape[0] // heads // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)

    out = gg.GGUFWriter(str(tmp_path / f"{name}.gguf"), "llama")
    for k, v in w.items():
        a = v.astype(np.float32)
        if k.endswith("q_proj.weight"):
            a = permute(a, 4)
        elif k.endswith("k_proj.weight"):
            a = permute(a, 2)
        out.add_tensor(gguf_name(k), a)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return tmp_path / f"{name}.gguf"


@pytest.mark.parametrize("name,gguf,arch", [("qwen2", False, "qwen2.5"), ("mistral", False, "mistral"),
                                            ("mistral", True, "mistral")])
def test_qwen2_and_mistral_match_transformers(pool, tmp_path, name, gguf, arch) -> None:
    from safetensors.numpy import load_file
    from zimage_util import FIX

    path = _variant(tmp_path, name, gguf)
    enc = LLMEncoder.from_weights(_shapes(path), head_dim=8)
    assert enc.cfg.arch.name == arch and enc.cfg.rope == ("normal" if gguf else "neox")
    r = ModuleRunner(enc, WeightFile(path), ModulePlacement(("CPU",)), pool, n_threads=1)
    ref_ = load_file(str(FIX / "llm_variants_tiny.safetensors"))
    try:
        out = r.run(enc.inputs(ref_[f"ref.{name}.ids"]))["hidden"]
    finally:
        r.release()
    assert rel_err(out, ref_[f"ref.{name}.hidden"]) < TOL
