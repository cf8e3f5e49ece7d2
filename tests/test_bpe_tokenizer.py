"""The Qwen byte-level BPE tokenizer against llama.cpp's own test: every line of
``ggml-vocab-qwen2.gguf.inp`` gives the ids of ``.out`` (llama.cpp ``test-tokenizer-0``, no
special-token parsing), from the shipped vocabulary and from a GGUF file's tokenizer
metadata; special tokens, templates, prompt weights and bad vocabularies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sdplan.core.errors import ModelFileError
from sdplan.core.text.bpe_tokenizer import QWEN_ADDED_TOKENS, BPETokenizer, byte_alphabet
from zimage_util import FIX, qwen_merges

TEMPLATE = ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n")


def vocab_tests() -> list[tuple[str, list[int]]]:
    """llama.cpp's split: inputs separated by ``\\n__ggml_vocab_test__\\n``, one output line each."""
    raw = (FIX / "qwen2_vocab_test.inp").read_bytes().decode("utf-8")
    sep = "\n__ggml_vocab_test__\n"
    inputs, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(sep, pos)
        if nxt < 0:
            inputs.append(raw[pos:])
            break
        inputs.append(raw[pos:nxt])
        pos = nxt + len(sep)
    outputs = (FIX / "qwen2_vocab_test.out").read_text(encoding="utf-8").split("\n")[: len(inputs)]
    return [(s, [int(t) for t in o.split()]) for s, o in zip(inputs, outputs, strict=True)]


TESTS = vocab_tests()


@pytest.fixture(scope="module")
def qwen() -> BPETokenizer:
    return BPETokenizer.qwen()


def test_the_test_file_is_whole() -> None:
    assert len(TESTS) == 46
    assert TESTS[0] == ("ied 4 ½ months", [1122, 220, 19, 220, 26062, 3951])
    assert ("", []) in TESTS and ("\n\n\n", [1406]) in TESTS


def test_every_llama_cpp_line_from_the_shipped_vocabulary(qwen: BPETokenizer) -> None:
    wrong = [(s, ids, qwen.encode(s, special=False)) for s, ids in TESTS if qwen.encode(s, special=False) != ids]
    assert not wrong, wrong[:3]
    for s, ids in TESTS:
        assert qwen.decode(ids) == s


@pytest.fixture(scope="module")
def gguf_tokenizer(tmp_path_factory) -> BPETokenizer:
    """A GGUF file holding only tokenizer metadata (as llama.cpp's vocabulary files do)."""
    import gguf

    qwen = BPETokenizer.qwen()
    path = tmp_path_factory.mktemp("vocab") / "vocab.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3")
    tokens = qwen.tokens + [f"[PAD{i}]" for i in range(qwen.vocab_size, 151936)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 151643 + [3] * 3 + [4] * (len(tokens) - 151646))
    w.add_token_merges(qwen_merges())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return BPETokenizer.from_gguf(path)


def test_every_llama_cpp_line_from_gguf_metadata(gguf_tokenizer: BPETokenizer) -> None:
    assert gguf_tokenizer.vocab_size == 151936
    assert gguf_tokenizer.token_id("<|im_start|>") == 151644
    for s, ids in TESTS:
        assert gguf_tokenizer.encode(s, special=False) == ids, s


def test_vocabulary_layout(qwen: BPETokenizer) -> None:
    assert qwen.vocab_size == 151669
    assert qwen.tokens[:256] == byte_alphabet() and qwen.tokens[0] == "!" and qwen.tokens[188] == "Ā"
    assert [qwen.token_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")] \
        == [151643, 151644, 151645, 151667, 151668]
    assert len(QWEN_ADDED_TOKENS) == 26


def test_special_tokens_and_the_z_image_template(qwen: BPETokenizer) -> None:
    text = "<|im_start|>user\nhi<|im_end|>"
    assert qwen.encode(text) == [151644, 872, 198, 6023, 151645]
    assert 151644 not in qwen.encode(text, special=False)  # parse_special=false: plain text
    tok = qwen.encode_prompt("a photo of a cat", *TEMPLATE)
    assert tok.ids.dtype == np.int32 and tok.ids.shape == (1, tok.length)
    assert tok.ids[0].tolist() == [151644, 872, 198, 64, 6548, 315, 264, 8251, 151645, 198, 151644, 77091, 198]
    assert qwen.decode(tok.ids[0]) == TEMPLATE[0] + "a photo of a cat" + TEMPLATE[1]
    assert np.all(tok.weights == 1.0)


def test_prompt_weights_cover_only_the_prompt(qwen: BPETokenizer) -> None:
    tok = qwen.encode_prompt("a (red:1.5) cat", *TEMPLATE)
    ids, w = tok.ids[0].tolist(), tok.weights[0].tolist()
    red = ids.index(qwen.encode("red")[0])
    assert w[red] == 1.5 and w.count(1.5) == 1
    assert w[:3] == [1.0] * 3 and w[-5:] == [1.0] * 5  # template tokens keep weight 1
    # each weighted piece is tokenised on its own, as sd-cli does
    assert ids[3:-5] == qwen.encode("a ") + qwen.encode("red") + qwen.encode(" cat")


def test_bad_vocabularies_are_clear_errors(tmp_path: Path) -> None:
    import gguf

    alphabet = byte_alphabet()
    with pytest.raises(ModelFileError, match="pre-type 'llama-bpe'"):
        BPETokenizer(alphabet, [], [], pre="llama-bpe")
    with pytest.raises(ModelFileError, match="merge 'a zz'"):
        BPETokenizer(alphabet + ["az"], ["a zz"], [])
    path = tmp_path / "no_tokenizer.gguf"
    w = gguf.GGUFWriter(str(path), "qwen3")
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="no byte-level BPE tokenizer"):
        BPETokenizer.from_gguf(path)


def test_mistral_tekken_vocabulary_matches_mistral_common() -> None:
    """The shipped Tekken merges rebuild mistral-common's ids (``mistral_vocab_test.json``, made
    by its Tekkenizer in ``make_flux2_dev_fixtures.py``) for cased words, digits, accents, CJK,
    emoji, newlines, space runs and punctuation; special tokens keep sd-cli's ids and decode
    back to the text."""
    import json

    tok = BPETokenizer.mistral()
    cases = json.loads((FIX / "mistral_vocab_test.json").read_text(encoding="utf-8"))
    assert len(cases) == 9
    for text, ids in cases.items():
        assert tok.encode(text) == ids, text
        assert tok.decode(ids) == text
    assert tok.vocab_size == 131072
    assert [tok.token_id(t) for t in ("<unk>", "<s>", "</s>", "[INST]", "[SYSTEM_PROMPT]", "<pad>")] == [0, 1, 2, 3, 17, 11]
    ids = tok.encode("[INST]a cat[/INST]")
    assert ids[0] == 3 and ids[-1] == 4 and tok.decode(ids) == "[INST]a cat[/INST]"
    assert tok.encode("[INST]", special=False) != [3]  # parsed as text when asked
