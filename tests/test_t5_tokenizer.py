"""T5 unigram tokenizer: known ids, padding, cutting, weights, the shipped vocabulary."""

from __future__ import annotations

import gzip
import json
from importlib import resources

import numpy as np
import pytest

pytest.importorskip("tokenizers")
from sdplan.core.errors import SdplanError  # noqa: E402
from sdplan.core.text.t5_tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE, T5Tokenizer  # noqa: E402

TOK = T5Tokenizer()


def test_hello_world() -> None:
    t = TOK.tokenize("Hello world", max_length=None)
    assert t.ids.tolist() == [[8774, 296, 1]]
    assert t.length == 3


def test_known_pieces_and_round_trip() -> None:
    ids = TOK.encode("a photo of a cat")
    assert ids == [3, 9, 1202, 13, 3, 9, 1712]
    assert TOK.decode(ids + [EOS_ID, PAD_ID]) == "a photo of a cat"
    assert TOK.encode("a   photo") == TOK.encode("a photo")  # runs of spaces collapse


def test_unigram_prefers_high_scoring_segmentation() -> None:
    vocab = json.loads(gzip.decompress(resources.files("sdplan.resources").joinpath(
        "t5_tokenizer/tokenizer.json.gz").read_bytes()))["model"]["vocab"]
    assert len(vocab) == VOCAB_SIZE
    score = {p: s for p, s in vocab}
    ids = TOK.encode("photographs")
    pieces = [vocab[i][0] for i in ids]
    assert "".join(pieces) == "\u2581photographs"
    # The chosen segmentation scores at least as well as the single-character split.
    chars = ["\u2581"] + list("photographs")
    assert sum(score[p] for p in pieces) >= sum(score.get(c, -1e9) for c in chars)


def test_padding_weights_and_cutting() -> None:
    t = TOK.tokenize("a (cat:1.5)", max_length=8)
    assert t.ids.shape == (1, 8) and t.ids.dtype == np.int32
    n = t.length
    assert t.ids[0, n - 1] == EOS_ID and (t.ids[0, n:] == PAD_ID).all()
    cat = TOK.encode(" cat")
    assert t.ids[0, n - 1 - len(cat): n - 1].tolist() == cat
    assert t.weights[0, n - 1 - len(cat): n - 1].tolist() == [1.5] * len(cat)
    assert (t.weights[0, n - 1:] == 1.0).all()
    long = TOK.tokenize("word " * 50, max_length=10)
    assert long.length == 10 and long.ids[0, -1] == EOS_ID


def test_bad_input() -> None:
    with pytest.raises(SdplanError, match="max_length"):
        TOK.tokenize("x", max_length=0)
    with pytest.raises(SdplanError, match="outside"):
        TOK.decode([VOCAB_SIZE])
    assert TOK.tokenize("", max_length=None).ids.tolist() == [[EOS_ID]]
