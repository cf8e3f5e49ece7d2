"""CLIP BPE tokenizer: known ids, sd-cli chunking and padding, weights, and the reference ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sdplan.core.errors import SdplanError
from sdplan.core.text.clip_tokenizer import (
    BOS_ID,
    EOS_ID,
    VOCAB_SIZE,
    ClipTokenizer,
    build_vocab,
    bytes_to_unicode,
    load_merges,
)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def tok() -> ClipTokenizer:
    return ClipTokenizer.for_family("sd1")


def test_vocab_has_clip_layout() -> None:
    vocab = build_vocab(load_merges())
    assert len(vocab) == VOCAB_SIZE
    assert vocab["!"] == 0 and vocab["a</w>"] == 320
    assert vocab["<|startoftext|>"] == BOS_ID and vocab["<|endoftext|>"] == EOS_ID
    assert len(set(bytes_to_unicode().values())) == 256


def test_a_photo_of_a_cat(tok: ClipTokenizer) -> None:
    out = tok.tokenize("a photo of a cat")
    assert out.ids.shape == (1, 77) and out.ids.dtype == np.int32
    assert out.ids[0, :7].tolist() == [49406, 320, 1125, 539, 320, 2368, 49407]
    assert (out.ids[0, 7:] == EOS_ID).all()
    assert (out.weights == 1.0).all()


def test_case_and_whitespace_are_normalised(tok: ClipTokenizer) -> None:
    assert tok.encode("  A   PHOTO\tof a\n cat ") == [320, 1125, 539, 320, 2368]


def test_sd2_pads_with_zero() -> None:
    out = ClipTokenizer.for_family("sd2").tokenize("a photo of a cat")
    assert out.ids[0, :7].tolist() == [49406, 320, 1125, 539, 320, 2368, 49407]
    assert (out.ids[0, 7:] == 0).all()


def test_unknown_family_is_an_error() -> None:
    with pytest.raises(SdplanError, match="family"):
        ClipTokenizer.for_family("sd9")


def test_empty_prompt_is_bos_eos_padding(tok: ClipTokenizer) -> None:
    out = tok.tokenize("")
    assert out.ids[0, :2].tolist() == [BOS_ID, EOS_ID] and out.n_chunks == 1


def test_weights_follow_segments(tok: ClipTokenizer) -> None:
    out = tok.tokenize("a (cat:1.5) [dog]")
    ids = out.ids[0].tolist()
    assert ids[:5] == [BOS_ID, 320, 2368, 1929, EOS_ID]
    np.testing.assert_allclose(out.weights[0, :5], [1.0, 1.0, 1.5, 1 / 1.1, 1.0], rtol=1e-6)


def test_long_prompt_is_chunked_by_75(tok: ClipTokenizer) -> None:
    words = " ".join(["cat"] * 80)  # 80 tokens
    out = tok.tokenize(words)
    assert out.ids.shape == (2, 77)
    first, second = out.ids.tolist()
    assert first[0] == BOS_ID and first[1:76] == [2368] * 75 and first[76] == EOS_ID
    assert second[0] == BOS_ID and second[1:6] == [2368] * 5 and second[6] == EOS_ID
    assert second[7:] == [EOS_ID] * 70


def test_exactly_75_tokens_is_one_chunk(tok: ClipTokenizer) -> None:
    out = tok.tokenize(" ".join(["cat"] * 75))
    assert out.n_chunks == 1 and out.ids[0, 76] == EOS_ID and out.ids[0, 75] == 2368


def test_break_pads_the_chunk_with_eos(tok: ClipTokenizer) -> None:
    out = tok.tokenize("a cat BREAK a dog")
    assert out.n_chunks == 2
    assert out.ids[0, :4].tolist() == [BOS_ID, 320, 2368, EOS_ID]
    assert (out.ids[0, 3:] == EOS_ID).all()
    assert out.ids[1, :4].tolist() == [BOS_ID, 320, 1929, EOS_ID]


def test_decode_round_trip(tok: ClipTokenizer) -> None:
    text = "hello, world! café 東京"
    assert tok.decode(tok.encode(text)) == "hello , world ! café 東京"


def test_matches_reference_tokenizer_ids(tok: ClipTokenizer) -> None:
    """Ids from transformers' CLIPTokenizer (the fixture script) on assorted prompts."""
    ref = json.loads((FIXTURES / "tokenizer_reference.json").read_text())
    assert len(ref["cases"]) >= 10
    for case in ref["cases"]:
        assert tok.encode(case["text"]) == case["ids"], case["text"]
