"""UMT5 (Wan's text encoder) against transformers' ``UMT5EncoderModel`` (the fixture's
reference): its SentencePiece blob read from the file and tokenized as the fixture spelled the
prompt out word by word, a relative-position table per block, the padding masked out of the
attention; one device, blocks split over two backends, disk residency."""

from __future__ import annotations

import numpy as np
import pytest
from flux_util import rel_err
from safetensors.numpy import load_file
from sdplan.core.errors import ModelFileError
from sdplan.core.models.t5 import T5Encoder, t5_config
from sdplan.core.text.umt5_tokenizer import UMT5Tokenizer, spiece_pieces

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402
from sparse_writer import FIXTURES  # noqa: E402

UMT5 = FIXTURES / "umt5_tiny.safetensors"
R = load_file(str(FIXTURES / "wan_ref.safetensors"))
TOL = 5e-3  # f16 matrices, ggml's f16 GELU table



def test_tokenizer_reads_the_files_blob() -> None:
    tok = UMT5Tokenizer.from_file(UMT5)
    pieces = spiece_pieces(tok.blob)
    assert pieces[:3] == [("<pad>", 0.0, 3), ("</s>", 0.0, 3), ("<unk>", 0.0, 2)]
    assert pieces[3] == ("\u2581a", -5.0, 1) and tok.vocab == 44
    t = tok.tokenize("a lovely cat walking on the beach", 16)
    np.testing.assert_array_equal(t.ids, R["te.ids"])
    np.testing.assert_array_equal(t.mask, R["te.mask"])
    assert t.length == 8 and tok.tokenize("", 4).ids.tolist() == [[1, 0, 0, 0]]
    # an unknown word falls to its letters; weights follow sd-cli's syntax
    assert tok.encode("a cats") == [3, pieces.index(("\u2581cat", -5.0, 1)), 36]
    w = tok.tokenize("(cat:1.5) dog", 8)
    assert w.weights[0, :3].tolist() == [1.5, 1.0, 1.0]


def test_tokenizer_refuses_a_file_without_a_blob() -> None:
    with pytest.raises(ModelFileError, match="spiece_model"):
        UMT5Tokenizer.from_file(FIXTURES / "wan_vae_tiny.safetensors")


def test_umt5_one_device_split_and_disk() -> None:
    shapes = {k: tuple(v.shape) for k, v in load_file(str(UMT5)).items()}
    cfg = t5_config(shapes)
    assert cfg.per_block_bias and (cfg.width, cfg.heads, cfg.n_blocks, cfg.vocab) == (32, 4, 2, 44)
    enc = T5Encoder(cfg)
    assert enc.block_tensors(1)[-1] == "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"
    ins = enc.inputs(R["te.ids"], R["te.mask"])
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    pool = BackendPool(G.BackendManager(1), extra={"CPU1": second})

    def runner(ranges: tuple[BlockRange, ...] = (), mode: str = "runtime") -> ModuleRunner:
        pl = ModulePlacement(("CPU", "CPU1") if ranges else ("CPU",), ranges, mode)
        return ModuleRunner(enc, WeightFile(UMT5, enc.other_tensors() + [n for i in range(2) for n in enc.block_tensors(i)]),
                            pl, pool, n_threads=1)

    one = runner().run(ins)["hidden"]
    n = int(R["te.mask"].sum())  # the padded rows are zeroed by the pipeline; compare the tokens'
    assert rel_err(one[:, :n], R["te.hidden"][:, :n]) < TOL
    split = runner((BlockRange("CPU", 0, 0), BlockRange("CPU1", 1, 1)))
    np.testing.assert_allclose(split.run(ins)["hidden"], one, atol=1e-6)
    disk = runner((BlockRange("CPU", 0, 0), BlockRange("CPU1", 1, 1)), "disk")
    np.testing.assert_allclose(disk.run(ins)["hidden"], one, atol=1e-6)
    # without the mask the padding changes the tokens' states
    free = runner().run(enc.inputs(R["te.ids"]))["hidden"]
    assert rel_err(free[:, :n], R["te.hidden"][:, :n]) > 10 * TOL
    pool.manager.close()
