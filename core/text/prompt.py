"""Prompt weighting syntax as sd-cli reads it: ``(word:1.2)``, ``(word)``, ``[word]``, ``BREAK``.

The grammar (sd-cli's ``parse_prompt_attention``, itself the AUTOMATIC1111 webui rule):

- ``(text)`` multiplies the weight of ``text`` by 1.1; nesting multiplies again.
- ``(text:w)`` multiplies it by ``w`` (a decimal such as ``1.3``, ``-0.5``, ``.8``).
- ``[text]`` divides it by 1.1.
- ``\\(``, ``\\)``, ``\\[``, ``\\]`` and ``\\\\`` are the literal characters ``( ) [ ] \\``.
- An unclosed ``(`` or ``[`` applies to the end of the prompt; a stray ``)`` or ``]`` is
  dropped.
- ``BREAK`` (upper case, as a whole word) ends the current 75-token chunk: the tokenizer pads
  the tokens so far to a multiple of 75 with the end-of-text token (see
  :func:`sdplan.core.text.clip_tokenizer.ClipTokenizer.tokenize`).
- Neighbouring segments of equal weight are joined.

Two details differ from sd-cli's C++ on purpose, both documented intentions of the grammar that
sd-cli's regex misses: every escape above is unescaped (sd-cli only unescapes ``\\(``), and an
upper-case ``B`` inside a word is kept (sd-cli's regex skips it).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

from sdplan.core.errors import SdplanError

if TYPE_CHECKING:  # numpy loads where weights apply, not to read a prompt's syntax
    import numpy as np

ROUND_MULTIPLIER = 1.1
SQUARE_MULTIPLIER = 1.0 / 1.1

_RE_ATTENTION = re.compile(
    r"""
    \\\( | \\\) | \\\[ | \\\] | \\\\ | \\      # escapes and a lone backslash
    | \( | \[                                 # openers
    | :([+-]?[.\d]+)\)                        # explicit weight closing a round bracket
    | \) | \]                                 # closers
    | \bBREAK\b                               # chunk break
    | [^\\()\[\]:B]+                          # plain text (B handled below)
    | : | B
    """,
    re.VERBOSE,
)
_RE_FLOAT_PREFIX = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)")


class PromptError(SdplanError):
    """A prompt cannot be parsed (an explicit weight that is not a number)."""

    code = "invalid_prompt"


class PromptSegment(NamedTuple):
    """A run of prompt text with one attention weight.

    ``text`` is the literal text (escapes removed); ``weight`` the multiplier applied to the
    text encoder's hidden states of its tokens. A chunk break is ``PromptSegment("BREAK", -1.0)``
    (:data:`BREAK_SEGMENT`), as sd-cli represents it.
    """

    text: str
    weight: float

    @property
    def is_break(self) -> bool:
        """True for the ``BREAK`` marker segment."""
        return self.text == "BREAK" and self.weight == -1.0


BREAK_SEGMENT = PromptSegment("BREAK", -1.0)


def _parse_weight(raw: str, prompt: str, pos: int) -> float:
    """The leading decimal of ``raw`` (as C's ``stof`` reads it) or a :class:`PromptError`."""
    m = _RE_FLOAT_PREFIX.match(raw)
    if m is None:
        raise PromptError(
            f"prompt: weight {raw!r} at character {pos} of {prompt!r} is not a number"
        )
    return float(m.group(0))


def parse_prompt_attention(text: str) -> list[PromptSegment]:
    """Split a prompt into weighted segments, as sd-cli's attention parser does.

    Args:
        text: the prompt as typed.

    Returns:
        Segments in prompt order; never empty (an empty prompt gives ``[("", 1.0)]``).
        Weights are Python floats (products of 1.1, 1/1.1 and explicit weights).

    Raises:
        PromptError: an explicit weight such as ``(x:.)`` has no digits.

    Example: ``"a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).`` gives
    ``a `` 1.0, ``house`` 1.573, `` `` 1.1, ``on`` 1.0, `` a `` 1.1, ``hill`` 0.55,
    ``, sun, `` 1.1, ``sky`` 1.4641, ``.`` 1.1.
    """
    if not isinstance(text, str):
        raise PromptError(f"prompt: expected text, got {type(text).__name__}")
    texts: list[str] = []
    weights: list[float] = []
    round_open: list[int] = []
    square_open: list[int] = []

    def multiply(start: int, factor: float) -> None:
        for p in range(start, len(weights)):
            if not (texts[p] == "BREAK" and weights[p] == -1.0):
                weights[p] *= factor

    for m in _RE_ATTENTION.finditer(text):
        tok = m.group(0)
        weight = m.group(1)
        if tok == "(":
            round_open.append(len(texts))
        elif tok == "[":
            square_open.append(len(texts))
        elif weight is not None:
            value = _parse_weight(weight, text, m.start(1))
            if round_open:
                multiply(round_open.pop(), value)
        elif tok == ")":
            if round_open:
                multiply(round_open.pop(), ROUND_MULTIPLIER)
        elif tok == "]":
            if square_open:
                multiply(square_open.pop(), SQUARE_MULTIPLIER)
        elif tok == "BREAK":
            texts.append("BREAK")
            weights.append(-1.0)
        elif len(tok) == 2 and tok[0] == "\\":
            texts.append(tok[1])
            weights.append(1.0)
        else:
            texts.append(tok)
            weights.append(1.0)

    for pos in round_open:
        multiply(pos, ROUND_MULTIPLIER)
    for pos in square_open:
        multiply(pos, SQUARE_MULTIPLIER)

    segments = [PromptSegment(t, w) for t, w in zip(texts, weights, strict=True)]
    if not segments:
        return [PromptSegment("", 1.0)]
    merged: list[PromptSegment] = [segments[0]]
    for seg in segments[1:]:
        last = merged[-1]
        if seg.weight == last.weight and not seg.is_break and not last.is_break:
            merged[-1] = PromptSegment(last.text + seg.text, last.weight)
        else:
            merged.append(seg)
    return merged


def apply_prompt_weights(hidden: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Scale text-encoder hidden states by per-token weights, keeping each chunk's mean.

    sd-cli's rule (and the webui's): per 77-token chunk, multiply every token's hidden state by
    its weight, then rescale the whole chunk so its mean equals the unweighted chunk's mean.

    Args:
        hidden: float array ``(n_chunks, n_tokens, width)`` from the CLIP encoder.
        weights: float array ``(n_chunks, n_tokens)`` from the tokenizer.

    Returns:
        float32 array of ``hidden``'s shape.

    Raises:
        ValueError: the shapes do not match.
    """
    import numpy as np

    hidden = np.asarray(hidden, dtype=np.float32)
    weights = np.asarray(weights, dtype=np.float32)
    if hidden.ndim != 3 or weights.shape != hidden.shape[:2]:
        raise ValueError(
            f"prompt weights of shape {weights.shape} do not fit hidden states of shape {hidden.shape}"
        )
    out = hidden * weights[:, :, None]
    old_mean = hidden.mean(axis=(1, 2), dtype=np.float64)
    new_mean = out.mean(axis=(1, 2), dtype=np.float64)
    safe = np.where(new_mean == 0.0, 1.0, new_mean)
    factor = np.where(new_mean == 0.0, 1.0, old_mean / safe).astype(np.float32)
    return out * factor[:, None, None]
