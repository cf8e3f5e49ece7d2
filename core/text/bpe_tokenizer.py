"""The byte-level BPE tokenizer of the language-model text encoders (Qwen2, Qwen2.5, Qwen3,
Mistral's Tekken), with special tokens, chat templates and prompt weights.

A vocabulary is a token list (id = position) whose first 256 entries are the GPT-2 byte
alphabet (:func:`byte_alphabet`), the BPE merges in rank order, and the special tokens
(``<|im_start|>``...). It comes from either

* a GGUF encoder's own metadata (``tokenizer.ggml.tokens``, ``.merges``, ``.token_type``,
  ``.pre``), read by :func:`sdplan.core.modelfiles.readers.read_gguf_arrays`
  (:meth:`BPETokenizer.from_gguf`); or
* the Qwen vocabulary shipped in ``resources/qwen_vocab/`` for safetensors encoders
  (:meth:`BPETokenizer.qwen`): the 151387 merges of llama.cpp's vocabulary test file
  ``models/ggml-vocab-qwen2.gguf`` (MIT; the vocabulary is Qwen's, Apache-2.0), from which
  ids 0..151642 follow (256 byte symbols, then one token per merge), and the 26 added tokens
  of Qwen2.5 / Qwen3 from 151643 (``<|endoftext|>`` ... ``</think>``), in the order Qwen's
  ``tokenizer_config.json`` and stable-diffusion.cpp's ``qwen2_tokenizer.cpp`` list them;
* the Tekken vocabulary shipped in ``resources/mistral_vocab/`` (:meth:`BPETokenizer.mistral`,
  Mistral-Small-3.2): its 129816 merges (``tools/make_mistral_vocab.py``, from
  ``mistral-common``'s ``tekken_240911.json``, Apache-2.0), ids 0..999 the special tokens of
  stable-diffusion.cpp's ``mistral_tokenizer.cpp`` (:data:`MISTRAL_SPECIAL_TOKENS`), then the
  256 bytes in byte order and one token per merge; split by Tekken's pattern
  (:data:`TEKKEN_PATTERN`, llama.cpp pre type ``tekken``).

Encoding (llama.cpp's ``LLAMA_VOCAB_PRE_TYPE_QWEN2``, the same as Qwen's ``tokenizer.json``
without its NFC normaliser, which llama.cpp does not apply): the text is split at special
tokens (when ``special`` is True, as sd-cli does for its prompt templates), each remaining
piece is split by the Qwen2 pre-tokenizer regex (:data:`QWEN2_PATTERN`), mapped byte by byte
to the alphabet and merged by rank. The `tokenizers` library runs the BPE.

Prompt weights: sd-cli parses ``(word:1.2)`` only inside the user's prompt, not in the
template around it (:meth:`BPETokenizer.encode_prompt`); the LLM's hidden states are scaled by
them with the mean-keeping rule of :func:`sdplan.core.text.prompt.apply_prompt_weights`.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import numpy as np
from sdplan.core.errors import ModelFileError
from sdplan.core.text.prompt import parse_prompt_attention

__all__ = ["BPETokenizer", "PromptTokens", "byte_alphabet", "QWEN2_PATTERN", "QWEN_ADDED_TOKENS", "TEKKEN_PATTERN",
           "MISTRAL_SPECIAL_TOKENS"]

#: The Qwen2 pre-tokenizer split (llama.cpp ``llama-vocab.cpp``, pre type ``qwen2``; Qwen's
#: ``tokenizer.json``): contractions, letters with one leading non-letter, single digits,
#: punctuation runs, newlines, whitespace.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
#: Mistral's Tekken split (``tekken.json`` ``config.pattern``; llama.cpp pre type ``tekken``):
#: words with their case runs, single digits, punctuation runs, newlines, whitespace.
TEKKEN_PATTERN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                  r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                  r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
#: Pre-tokenizer regex by GGUF ``tokenizer.ggml.pre`` name.
PRE_PATTERNS = {"qwen2": QWEN2_PATTERN, "tekken": TEKKEN_PATTERN}
#: Mistral-Small-3.x's special tokens, ids 0..999 (stable-diffusion.cpp ``mistral_tokenizer.cpp``).
MISTRAL_SPECIAL_TOKENS = (
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
    "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]",
    *(f"<SPECIAL_{i}>" for i in range(20, 1000)))
#: Qwen2.5 / Qwen3 added tokens, ids 151643.. in this order.
QWEN_ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
#: GGUF token types that are special tokens (llama.cpp ``LLAMA_TOKEN_TYPE_CONTROL`` 3 and
#: ``USER_DEFINED`` 4).
SPECIAL_TYPES = (3, 4)
_RESOURCE = "qwen_vocab/merges.txt.gz"
_MISTRAL_RESOURCE = "mistral_vocab/merges.txt.gz"


def byte_alphabet() -> list[str]:
    """The 256 symbols standing for bytes 0..255 in byte-level BPE (GPT-2's
    ``bytes_to_unicode``): printable Latin-1 bytes map to themselves, the rest to U+0100...
    Returned in vocabulary order (the printable ones first)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in keep] + [symbols[b] for b in range(256) if b not in keep]


@dataclass(frozen=True)
class PromptTokens:
    """A templated prompt as the LLM takes it.

    Attributes:
        ids: int32 ``(1, T)`` token ids (template and prompt).
        weights: float32 ``(1, T)``: the prompt-weight of each token (1.0 in the template).
    """

    ids: np.ndarray
    weights: np.ndarray

    @property
    def length(self) -> int:
        return int(self.ids.shape[1])


class BPETokenizer:
    """Byte-level BPE over a vocabulary (see the module docstring).

    Args:
        tokens: every token, id = position (byte symbols, merged tokens, specials).
        merges: ``"left right"`` pairs in rank order.
        specials: ids of the special tokens (split out of the text before BPE).
        pre: the pre-tokenizer (:data:`PRE_PATTERNS` key).
        source: where the vocabulary came from (for errors).

    Raises:
        ModelFileError: an unknown pre-tokenizer, or merges whose parts or results are not
            tokens of the vocabulary.
    """

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], specials: Iterable[int],
                 pre: str = "qwen2", source: str = "<vocabulary>") -> None:
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

        if pre not in PRE_PATTERNS:
            raise ModelFileError(source, f"tokenizer pre-type {pre!r} is not supported "
                                         f"(known: {', '.join(PRE_PATTERNS)})")
        self.tokens = list(tokens)
        self.source = source
        special_ids = sorted(set(specials))
        self.special = {self.tokens[i]: i for i in special_ids}
        vocab = {t: i for i, t in enumerate(self.tokens) if i not in set(special_ids)}
        pairs = []
        for m in merges:
            left, _, right = m.partition(" ")
            if left not in vocab or right not in vocab or left + right not in vocab:
                raise ModelFileError(source, f"tokenizer merge {m!r} is not made of vocabulary tokens")
            pairs.append((left, right))
        tk = Tokenizer(models.BPE(vocab, pairs))
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(PRE_PATTERNS[pre]), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tk.decoder = decoders.ByteLevel()
        self._tk = tk
        self._split = (re.compile("(" + "|".join(re.escape(s) for s in sorted(self.special, key=len, reverse=True))
                                  + ")") if self.special else None)

    # ------------------------------------------------------------------ sources
    @classmethod
    def from_gguf(cls, path: str | Path) -> BPETokenizer:
        """The tokenizer in a GGUF file's metadata (llama.cpp ``gpt2`` model).

        Raises:
            ModelFileError: the file has no (or another kind of) tokenizer metadata.
        """
        from sdplan.core.modelfiles.readers import read_gguf_arrays, read_tensor_file

        keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")
        arrays = read_gguf_arrays(path, keys)
        meta = read_tensor_file(path).metadata
        model = meta.get("tokenizer.ggml.model")
        if model != "gpt2" or not all(k in arrays for k in keys):
            raise ModelFileError(path, "no byte-level BPE tokenizer in the GGUF metadata "
                                       f"(tokenizer.ggml.model {model!r}; needs tokens, merges, token_type)")
        types = arrays["tokenizer.ggml.token_type"]
        specials = [i for i, t in enumerate(types) if t in SPECIAL_TYPES]
        return cls(arrays["tokenizer.ggml.tokens"], arrays["tokenizer.ggml.merges"], specials,
                   meta.get("tokenizer.ggml.pre", "qwen2"), str(path))

    @classmethod
    def qwen(cls) -> BPETokenizer:
        """The shipped Qwen2 / Qwen2.5 / Qwen3 vocabulary (shared, built once)."""
        return _qwen()

    @classmethod
    def mistral(cls) -> BPETokenizer:
        """The shipped Tekken vocabulary of Mistral-Small-3.2 (shared, built once)."""
        return _mistral()

    # ------------------------------------------------------------------ encoding
    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def token_id(self, token: str) -> int:
        """The id of a special token such as ``<|im_start|>``. Raises KeyError."""
        return self.special[token]

    def encode(self, text: str, special: bool = True) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added). ``special``: special-token strings in the
        text become their ids (else they are BPE-encoded like any text, as llama.cpp's
        ``parse_special=false``)."""
        parts = self._split.split(text) if (special and self._split is not None) else [text]
        ids: list[int] = []
        for k, part in enumerate(parts):
            if not part:
                continue
            if special and k % 2 == 1:
                ids.append(self.special[part])
            else:
                ids.extend(self._tk.encode(part, add_special_tokens=False).ids)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (special tokens written out)."""
        out: list[str] = []
        run: list[int] = []
        for i in ids:
            tok = self.tokens[int(i)]
            if tok in self.special:
                out.append(self._tk.decode(run))
                out.append(tok)
                run = []
            else:
                run.append(int(i))
        out.append(self._tk.decode(run))
        return "".join(out)

    def encode_prompt(self, prompt: str, prefix: str = "", suffix: str = "") -> PromptTokens:
        """``prefix + prompt + suffix`` tokenised as sd-cli does: the template parts verbatim
        (special tokens parsed, weight 1), the prompt split by its ``(text:weight)`` syntax,
        each piece tokenised on its own and carrying its weight.

        Raises:
            PromptError: a malformed weight in the prompt.
        """
        ids: list[int] = self.encode(prefix) if prefix else []
        weights: list[float] = [1.0] * len(ids)
        for seg in parse_prompt_attention(prompt):
            if seg.is_break:
                continue
            piece = self.encode(seg.text)
            ids.extend(piece)
            weights.extend([seg.weight] * len(piece))
        tail = self.encode(suffix) if suffix else []
        ids.extend(tail)
        weights.extend([1.0] * len(tail))
        return PromptTokens(np.array([ids], dtype=np.int32), np.array([weights], dtype=np.float32))


def _merges(resource: str) -> list[str]:
    raw = resources.files("sdplan.resources").joinpath(resource).read_bytes()
    return [m for m in gzip.decompress(raw).decode("utf-8").split("\n") if m]


@lru_cache(maxsize=1)
def _qwen() -> BPETokenizer:
    merges = _merges(_RESOURCE)
    tokens = byte_alphabet() + [m.replace(" ", "", 1) for m in merges] + list(QWEN_ADDED_TOKENS)
    n = len(tokens) - len(QWEN_ADDED_TOKENS)
    return BPETokenizer(tokens, merges, range(n, len(tokens)), "qwen2", "sdplan.resources/" + _RESOURCE)



@lru_cache(maxsize=1)
def _mistral() -> BPETokenizer:
    merges = _merges(_MISTRAL_RESOURCE)
    alphabet = byte_alphabet()  # printable bytes first, then the rest from U+0100 in byte order
    printable = [ord(sym) for sym in alphabet if ord(sym) < 256]
    rest = iter(alphabet[len(printable):])
    by_byte = [chr(b) if b in set(printable) else next(rest) for b in range(256)]
    tokens = [*MISTRAL_SPECIAL_TOKENS, *by_byte, *(m.replace(" ", "", 1) for m in merges)]
    return BPETokenizer(tokens, merges, range(len(MISTRAL_SPECIAL_TOKENS)), "tekken",
                        "sdplan.resources/" + _MISTRAL_RESOURCE)
