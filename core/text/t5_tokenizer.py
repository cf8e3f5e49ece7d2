"""The T5 SentencePiece unigram tokenizer (T5-XXL text encoder of Flux), with prompt weights.

The vocabulary (32100 pieces with log-probability scores; ``<pad>`` 0, ``</s>`` 1, ``<unk>``
2, ``<extra_id_N>`` at the end) ships as ``resources/t5_tokenizer/tokenizer.json.gz``, derived
by ``tools/make_t5_tokenizer.py`` from the MIT-licensed stable-diffusion-cpp-python source
distribution (see ``resources/t5_tokenizer/LICENSE``). The `tokenizers` library runs it:
NFKC normalisation (SentencePiece's ``nmt_nfkc`` rule without its control-character table),
runs of spaces collapsed, Metaspace pre-tokenisation (``▁`` and a prefix space) and Viterbi
segmentation over the unigram scores. Every sequence ends with ``</s>`` (id 1).

Prompt weights use sd-cli's syntax (:func:`sdplan.core.text.prompt.parse_prompt_attention`); each
piece carries its segment's weight, ``</s>`` and padding carry 1.0. Unlike CLIP there are no
chunks: Flux pads (or cuts) one sequence to ``max_length`` (256 for Flux dev/schnell in sd-cli),
``</s>`` kept as the last id when cut.
"""

from __future__ import annotations

import gzip
import logging
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np
from sdplan.core.errors import SdplanError
from sdplan.core.text.prompt import parse_prompt_attention

log = logging.getLogger(__name__)

PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
VOCAB_SIZE = 32100
FLUX_MAX_LENGTH = 256


@lru_cache(maxsize=1)
def _backend():  # -> tokenizers.Tokenizer
    from tokenizers import Tokenizer

    raw = resources.files("sdplan.resources").joinpath("t5_tokenizer/tokenizer.json.gz").read_bytes()
    return Tokenizer.from_str(gzip.decompress(raw).decode("utf-8"))


@dataclass(frozen=True)
class T5Tokens:
    """A prompt as the T5 encoder takes it.

    Attributes:
        ids: int32 array ``(1, T)``: pieces, ``</s>``, then ``<pad>`` up to ``T``.
        weights: float32 array ``(1, T)``: each piece's weight (1.0 for ``</s>`` and padding).
        length: number of ids before the padding (pieces + ``</s>``).
    """

    ids: np.ndarray
    weights: np.ndarray
    length: int


class T5Tokenizer:
    """T5 unigram tokenizer; ``encode`` gives ids without ``</s>``, ``tokenize`` the padded,
    weighted sequence."""

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text`` (no ``</s>``, no weighting syntax); empty text gives []."""
        if not text.strip():
            return []
        return list(_backend().encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` with ``<pad>`` and ``</s>`` skipped.

        Raises:
            SdplanError: an id outside the vocabulary.
        """
        for i in ids:
            if not 0 <= i < VOCAB_SIZE:
                raise SdplanError(f"T5 tokenizer: id {i} is outside 0..{VOCAB_SIZE - 1}")
        return _backend().decode([i for i in ids if i not in (PAD_ID, EOS_ID)], skip_special_tokens=True)

    def tokenize(self, prompt: str, max_length: int | None = FLUX_MAX_LENGTH) -> T5Tokens:
        """Ids and weights of ``prompt`` (sd-cli weighting syntax; ``BREAK`` is ignored).

        Args:
            prompt: the prompt text.
            max_length: pad with ``<pad>`` (or cut, keeping ``</s>`` last) to this many ids;
                None keeps the natural length (pieces + ``</s>``).

        Raises:
            SdplanError: ``max_length`` below 1.
        """
        if max_length is not None and max_length < 1:
            raise SdplanError(f"T5 tokenizer: max_length {max_length} is below 1")
        tokens: list[int] = []
        weights: list[float] = []
        for seg in parse_prompt_attention(prompt):
            if seg.is_break:
                continue
            piece = self.encode(seg.text)
            tokens += piece
            weights += [seg.weight] * len(piece)
        if max_length is not None and len(tokens) > max_length - 1:
            log.warning("T5 prompt has %d tokens; cut to %d", len(tokens), max_length - 1)
            tokens, weights = tokens[: max_length - 1], weights[: max_length - 1]
        tokens.append(EOS_ID)
        weights.append(1.0)
        n = len(tokens)
        total = n if max_length is None else max_length
        ids = np.full((1, total), PAD_ID, dtype=np.int32)
        w = np.ones((1, total), dtype=np.float32)
        ids[0, :n] = tokens
        w[0, :n] = weights
        return T5Tokens(ids, w, n)
