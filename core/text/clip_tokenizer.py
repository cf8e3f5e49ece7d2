"""The CLIP byte-level BPE tokenizer, with sd-cli's prompt weights and 77-token chunks.

The vocabulary is OpenAI CLIP's ``bpe_simple_vocab_16e6.txt`` (MIT, see
``resources/clip_vocab/LICENSE``): ``resources/clip_vocab/merges.txt.gz`` holds its first
48894 merges and the 49408-entry vocabulary is derived at load time the way CLIP's
``simple_tokenizer.py`` builds it: the 256 byte symbols, the same with ``</w>``, one entry per
merge, then ``<|startoftext|>`` (49406) and ``<|endoftext|>`` (49407).

The `tokenizers` library runs it: NFC normalisation, whitespace runs collapsed to one space,
lower-casing, CLIP's pre-tokenisation regex, GPT-2's byte-to-unicode mapping, and BPE with the
``</w>`` end-of-word suffix. (CLIP also runs ``ftfy.fix_text``; sdplan applies only its NFC
step and HTML unescaping.)

Chunking follows sd-cli: tokens go in chunks of 75 between a BOS (49406) and an EOS (49407),
so every chunk is 77 ids; the last chunk is padded after its EOS with the pad id (49407 for
SD 1.x and the first SDXL encoder, 0 for OpenCLIP in SD 2.x). Every token carries the weight
of its prompt segment; BOS, EOS and padding carry 1.0.
"""

from __future__ import annotations

import gzip
import html
import logging
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np
from sdplan.core.errors import SdplanError
from sdplan.core.families import family as registry_family
from sdplan.core.text.prompt import parse_prompt_attention

log = logging.getLogger(__name__)

BOS_ID = 49406
EOS_ID = 49407
VOCAB_SIZE = 49408
CHUNK_LENGTH = 77
N_MERGES = 49152 - 256 - 2
#: Pad token by the family's :attr:`~sdplan.core.families.declaration.Family.clip_pad`: OpenAI's
#: CLIP pads with its end token, OpenCLIP (SD 2.x) with 0.
PAD_ID = {"eos": EOS_ID, "zero": 0}

_CLIP_SPLIT = (
    r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|"""
    r"""[^\s\p{L}\p{N}]+"""
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2/CLIP's reversible map from the 256 byte values to printable characters.

    Printable Latin-1 bytes map to themselves; the other 68 map to U+0100 onwards in order.
    The dict's order (printable bytes first, then the others) is the order of the first 256
    vocabulary entries.
    """
    keep = list(range(ord("!"), ord("~") + 1))
    keep += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out: dict[int, str] = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in out:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def load_merges() -> list[tuple[str, str]]:
    """The 48894 CLIP merges, in priority order, from the packaged resource.

    Raises:
        SdplanError: the resource is missing or truncated (a broken installation).
    """
    ref = resources.files("sdplan.resources").joinpath("clip_vocab/merges.txt.gz")
    try:
        text = gzip.decompress(ref.read_bytes()).decode("utf-8")
    except (OSError, EOFError) as exc:
        raise SdplanError(f"CLIP vocabulary resource {ref}: {exc}") from exc
    lines = [ln for ln in text.split("\n")[1:] if ln]
    if len(lines) != N_MERGES:
        raise SdplanError(
            f"CLIP vocabulary resource {ref}: {len(lines)} merges, expected {N_MERGES}"
        )
    return [tuple(ln.split(" ")) for ln in lines]  # type: ignore[misc]


def build_vocab(merges: list[tuple[str, str]]) -> dict[str, int]:
    """CLIP's token-to-id map (49408 entries) from its merges."""
    symbols = list(bytes_to_unicode().values())
    words = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    words += ["<|startoftext|>", "<|endoftext|>"]
    return {w: i for i, w in enumerate(words)}


@lru_cache(maxsize=1)
def _backend():  # -> tokenizers.Tokenizer
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

    merges = load_merges()
    bpe = models.BPE(
        vocab=build_vocab(merges),
        merges=merges,
        unk_token="<|endoftext|>",
        end_of_word_suffix="</w>",
        continuing_subword_prefix="",
        fuse_unk=False,
    )
    tok = Tokenizer(bpe)
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_CLIP_SPLIT), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.add_special_tokens(["<|startoftext|>", "<|endoftext|>"])
    return tok


def warm() -> None:
    """Build the tokenizer's BPE model now (its vocabulary and 48894 merges: about 0.09 s on a
    2-core Zen 4) rather than at the first :meth:`ClipTokenizer.encode`: an engine child does
    it while the command that started it is still starting (:func:`sdplan.core.cli.engine_preload`)."""
    _backend()


@lru_cache(maxsize=1)
def _inverse_vocab() -> dict[int, str]:
    return {i: w for w, i in build_vocab(load_merges()).items()}


@dataclass(frozen=True)
class TokenizedPrompt:
    """A prompt as the CLIP text encoder takes it.

    Attributes:
        ids: int32 array ``(n_chunks, 77)``: BOS, up to 75 tokens, EOS, padding.
        weights: float32 array ``(n_chunks, 77)``: each token's attention weight.
    """

    ids: np.ndarray
    weights: np.ndarray

    @property
    def n_chunks(self) -> int:
        """Number of 77-token chunks (at least 1)."""
        return int(self.ids.shape[0])


class ClipTokenizer:
    """CLIP BPE tokenizer with sd-cli's weighting and chunking.

    Args:
        pad_id: id written after the last chunk's EOS: 49407 for SD 1.x (OpenAI CLIP),
            0 for SD 2.x (OpenCLIP). :meth:`for_family` picks it by model family.
    """

    def __init__(self, pad_id: int = EOS_ID) -> None:
        if not 0 <= pad_id < VOCAB_SIZE:
            raise SdplanError(f"tokenizer pad id {pad_id} is outside 0..{VOCAB_SIZE - 1}")
        self.pad_id = pad_id

    @classmethod
    def for_family(cls, family: str) -> ClipTokenizer:
        """The tokenizer for ``family`` (``sd1``, ``sd2``, ``sdxl``...), padding as its
        registry entry says (:attr:`~sdplan.core.families.declaration.Family.clip_pad`).

        Raises:
            SdplanError: an unknown family.
        """
        fam = registry_family(family)
        if fam is None:
            raise SdplanError(f"tokenizer: unknown model family {family!r}")
        return cls(PAD_ID[fam.clip_pad])

    def encode(self, text: str) -> list[int]:
        """BPE ids of ``text`` without BOS/EOS and without weighting syntax."""
        text = html.unescape(html.unescape(text)).strip()
        if not text:
            return []
        return list(_backend().encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``: BOS, EOS and (for pad id 0) padding skipped; ``</w>`` ends a word."""
        inv = _inverse_vocab()
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        raw = bytearray()
        for i in ids:
            if i in (BOS_ID, EOS_ID) or (i == 0 and self.pad_id == 0):
                continue
            if not 0 <= i < VOCAB_SIZE:
                raise SdplanError(f"tokenizer: id {i} is outside 0..{VOCAB_SIZE - 1}")
            word = inv[i]
            end = word.endswith("</w>")
            raw += bytes(byte_of[c] for c in (word[:-4] if end else word))
            if end:
                raw += b" "
        return raw.decode("utf-8", errors="replace").strip()

    def tokenize(self, prompt: str, chunk_length: int = CHUNK_LENGTH) -> TokenizedPrompt:
        """Token ids and weights of a prompt with sd-cli's weighting syntax, in chunks.

        Args:
            prompt: the prompt; ``(word:1.2)``, ``(word)``, ``[word]``, escapes and ``BREAK``
                as :func:`sdplan.core.text.prompt.parse_prompt_attention` reads them.
            chunk_length: ids per chunk including BOS and EOS (77 for every CLIP).

        Returns:
            :class:`TokenizedPrompt` with ``ceil(n_tokens / (chunk_length - 2))`` chunks
            (at least one). ``BREAK`` first pads the tokens so far to a multiple of
            ``chunk_length - 2`` with EOS ids of weight 1.0, as sd-cli does.
        """
        if chunk_length < 3:
            raise SdplanError(f"tokenizer chunk length {chunk_length} is below 3")
        body = chunk_length - 2
        tokens: list[int] = []
        weights: list[float] = []
        for seg in parse_prompt_attention(prompt):
            if seg.is_break:
                pad = (body - len(tokens) % body) % body
                tokens += [EOS_ID] * pad
                weights += [1.0] * pad
                continue
            ids = self.encode(seg.text)
            tokens += ids
            weights += [seg.weight] * len(ids)
        n_chunks = max(1, -(-len(tokens) // body))
        out_ids = np.full((n_chunks, chunk_length), self.pad_id, dtype=np.int32)
        out_w = np.ones((n_chunks, chunk_length), dtype=np.float32)
        for c in range(n_chunks):
            part = tokens[c * body : (c + 1) * body]
            out_ids[c, 0] = BOS_ID
            out_ids[c, 1 : 1 + len(part)] = part
            out_ids[c, 1 + len(part)] = EOS_ID
            out_w[c, 1 : 1 + len(part)] = weights[c * body : (c + 1) * body]
        log.debug("tokenized %d tokens into %d chunks", len(tokens), n_chunks)
        return TokenizedPrompt(out_ids, out_w)
