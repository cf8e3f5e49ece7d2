"""The UMT5 SentencePiece unigram tokenizer of Wan (UMT5-XXL's 256k pieces), read from the
tokenizer blob the text encoder's file carries.

Comfy's ``umt5_xxl_fp16.safetensors`` holds ``spiece_model``: the ``google/umt5-xxl``
``spiece.model`` as U8 bytes, a protobuf ``ModelProto`` whose field 1 repeats the pieces
(``SentencePiece``: field 1 the piece, field 2 its log-probability score as a float, field 3
its type: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte; sentencepiece's
``sentencepiece_model.proto``). :func:`spiece_pieces` reads them with a few lines of protobuf
wire format (varints and length-delimited fields); the `tokenizers` library runs the unigram
model over them as over T5's (:mod:`sdplan.core.text.t5_tokenizer`: NFKC, runs of spaces
collapsed, Metaspace with a prefix space, Viterbi over the scores). ``<pad>`` is 0, ``</s>`` 1,
``<unk>`` 2.

As sd-cli tokenizes Wan's prompt (``T5CLIPEmbedder`` with ``is_umt5``): the pieces, ``</s>``,
then ``<pad>`` up to 512 with a mask that is 1 for the pieces and ``</s>`` (the encoder masks
the padding out of its attention, the pipeline zeroes the padded rows); a longer prompt is
cut to 511 pieces and ``</s>``. Prompt weights use sd-cli's syntax.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from sdplan.core.errors import ModelFileError, SdplanError
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.text.prompt import parse_prompt_attention

__all__ = ["spiece_pieces", "read_spiece_blob", "UMT5Tokenizer", "UMT5Tokens", "WAN_MAX_LENGTH"]

log = logging.getLogger(__name__)

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
#: sd-cli's Wan text length (``T5CLIPEmbedder::chunk_len``; the DiT's ``text_len``).
WAN_MAX_LENGTH = 512
#: The tensor holding the blob (with or without a prefix).
BLOB = "spiece_model"
_MAX_BLOB = 64 << 20


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out, shift = 0, 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return out, i


def _fields(buf: bytes) -> list[tuple[int, int, object]]:
    """``(field, wire type, value)`` of a protobuf message: ints for varints, bytes for
    length-delimited fields, raw bytes for fixed 32/64-bit ones."""
    out: list[tuple[int, int, object]] = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
            out.append((field, wire, v))
        elif wire == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ValueError("truncated field")
            out.append((field, wire, buf[i:i + n]))
            i += n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            if i + n > len(buf):
                raise ValueError("truncated field")
            out.append((field, wire, buf[i:i + n]))
            i += n
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def spiece_pieces(blob: bytes) -> list[tuple[str, float, int]]:
    """The pieces of a SentencePiece model blob in id order: ``(piece, score, type)``.

    Raises:
        ValueError: not a SentencePiece model (malformed protobuf, or no pieces).
    """
    pieces: list[tuple[str, float, int]] = []
    for field, wire, value in _fields(blob):
        if field != 1 or wire != 2:
            continue  # trainer, normalizer and other specs
        piece, score, kind = "", 0.0, 1
        assert isinstance(value, bytes)
        for f, w, v in _fields(value):
            if f == 1 and isinstance(v, bytes):
                piece = v.decode("utf-8")
            elif f == 2 and w == 5 and isinstance(v, bytes):
                score = struct.unpack("<f", v)[0]
            elif f == 3 and isinstance(v, int):
                kind = v
        pieces.append((piece, float(score), kind))
    if len(pieces) < 3:
        raise ValueError("no SentencePiece pieces in the blob")
    return pieces


def read_spiece_blob(path: str | Path) -> bytes:
    """The ``spiece_model`` blob of a UMT5 file (any prefix in front of the name).

    Raises:
        ModelFileError: the file has no such tensor (a GGUF UMT5 keeps its tokenizer in
            metadata sdplan does not read), or it is too large.
    """
    tf = read_tensor_file(path)
    info = next((t for t in tf.tensors if t.name == BLOB or t.name.endswith("." + BLOB)), None)
    if info is None:
        raise ModelFileError(path, f"no '{BLOB}' tensor: the UMT5 tokenizer is read from the blob Comfy's "
                                   "umt5_xxl safetensors files carry")
    if info.nbytes > _MAX_BLOB:
        raise ModelFileError(path, f"'{BLOB}' is {info.nbytes} bytes, over {_MAX_BLOB}")
    with open(path, "rb") as fh:
        fh.seek(info.offset)
        data = fh.read(info.nbytes)
    if info.dtype != "U8":  # a blob written as a wider type keeps its bytes as values
        raise ModelFileError(path, f"'{BLOB}' is {info.dtype}, not the U8 bytes of a SentencePiece model")
    return data


@lru_cache(maxsize=4)
def _backend(blob: bytes):  # -> tokenizers.Tokenizer
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    vocab = [(p, s) for p, s, _ in spiece_pieces(blob)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=UNK_ID, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    return tok


@dataclass(frozen=True)
class UMT5Tokens:
    """A prompt as the UMT5 encoder takes it: ``ids`` int32 ``(1, T)`` (pieces, ``</s>``,
    ``<pad>``), ``weights`` float32 ``(1, T)``, ``mask`` int32 ``(1, T)`` (1 up to ``length``),
    ``length`` the pieces and ``</s>``."""

    ids: np.ndarray
    weights: np.ndarray
    mask: np.ndarray
    length: int


class UMT5Tokenizer:
    """The unigram tokenizer of a SentencePiece blob (module docstring)."""

    def __init__(self, blob: bytes) -> None:
        self.blob = bytes(blob)
        self.vocab = len(spiece_pieces(self.blob))

    @classmethod
    def from_file(cls, path: str | Path) -> UMT5Tokenizer:
        """The tokenizer of a UMT5 file's blob (:func:`read_spiece_blob`; its errors, and
        :class:`ModelFileError` for a malformed blob)."""
        blob = read_spiece_blob(path)
        try:
            return cls(blob)
        except ValueError as exc:
            raise ModelFileError(path, f"'{BLOB}' is not a SentencePiece model: {exc}") from None

    def encode(self, text: str) -> list[int]:
        """Piece ids of ``text`` (no ``</s>``, no weighting syntax); empty text gives []."""
        if not text.strip():
            return []
        return list(_backend(self.blob).encode(text, add_special_tokens=False).ids)

    def tokenize(self, prompt: str, max_length: int = WAN_MAX_LENGTH) -> UMT5Tokens:
        """Ids, weights and mask of ``prompt`` padded to ``max_length`` (module docstring).

        Raises:
            SdplanError: ``max_length`` below 1.
        """
        if max_length < 1:
            raise SdplanError(f"UMT5 tokenizer: max_length {max_length} is below 1")
        tokens: list[int] = []
        weights: list[float] = []
        for seg in parse_prompt_attention(prompt):
            if seg.is_break:
                continue
            piece = self.encode(seg.text)
            tokens += piece
            weights += [seg.weight] * len(piece)
        if len(tokens) > max_length - 1:
            log.warning("UMT5 prompt has %d tokens; cut to %d", len(tokens), max_length - 1)
            tokens, weights = tokens[: max_length - 1], weights[: max_length - 1]
        tokens.append(EOS_ID)
        weights.append(1.0)
        n = len(tokens)
        ids = np.full((1, max_length), PAD_ID, dtype=np.int32)
        w = np.ones((1, max_length), dtype=np.float32)
        mask = np.zeros((1, max_length), dtype=np.int32)
        ids[0, :n], w[0, :n], mask[0, :n] = tokens, weights, 1
        return UMT5Tokens(ids, w, mask, n)
