"""LoRA tags in a prompt, as sd-cli reads them: ``<lora:NAME:WEIGHT>``.

sd-cli (``examples/common/common.cpp``, ``extract_and_remove_lora``) finds every match of
``<lora:([^:>]+):([^>]+)>`` in the prompt, removes it from the text the encoder sees, and
adds ``WEIGHT`` to the multiplier of the LoRA file ``NAME`` (a path relative to
``--lora-model-dir``, default the working folder, or an absolute path; without an
extension ``.gguf``, ``.safetensors``, ``.pt`` and ``.ckpt`` are tried in that order). The
same name twice adds the weights. Only the positive prompt is read: a tag in the negative
prompt stays text.

Where sd-cli warns and drops a tag whose weight is not a number, sdplan refuses the prompt
with a one-line error naming the tag (before any model loads); so it does for a weight
outside +-:data:`MAX_LORA_WEIGHT` (sd-cli has no bound: ``<lora:x:1e308>`` overflows every
patched weight into an all-black picture). Trained LoRAs are used between about -2 and 2.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from sdplan.core.text.prompt import PromptError

__all__ = ["LoraTag", "LORA_TAG_RE", "MAX_LORA_WEIGHT", "extract_lora_tags", "format_lora_tag"]

#: Largest LoRA weight (multiplier) accepted, either sign, after a repeated name's weights
#: are summed.
MAX_LORA_WEIGHT = 10.0

#: sd-cli's pattern of one tag.
LORA_TAG_RE = re.compile(r"<lora:([^:>]+):([^>]+)>")
_HIGH_NOISE = "|high_noise|"


class LoraTag(NamedTuple):
    """One LoRA named by a prompt: ``name`` as written (no extension needed) and its summed
    multiplier ``weight``."""

    name: str
    weight: float


def extract_lora_tags(prompt: str) -> tuple[str, list[LoraTag]]:
    """``(prompt without its tags, tags)``: the text the encoder sees and the LoRAs in the
    order of their first tag, weights of a repeated name summed.

    Raises:
        PromptError: a weight that is not a finite number or lies outside
            +-:data:`MAX_LORA_WEIGHT`, or sd-cli's ``|high_noise|`` prefix (only for
            two-model video families, which sdplan does not run).
    """
    tags: dict[str, float] = {}
    for m in LORA_TAG_RE.finditer(prompt):
        name, raw = m.group(1), m.group(2).strip()
        if name.startswith(_HIGH_NOISE):
            raise PromptError(f"{m.group(0)}: the {_HIGH_NOISE} prefix is for two-model video "
                              "families, which sdplan does not run")
        try:
            weight = float(raw)
        except ValueError:
            raise PromptError(f"{m.group(0)}: the weight {raw!r} is not a number "
                              "(write <lora:NAME:0.8>)") from None
        if weight != weight or weight in (float("inf"), float("-inf")):
            raise PromptError(f"{m.group(0)}: the weight must be a finite number")
        tags[name] = tags.get(name, 0.0) + weight
        if abs(tags[name]) > MAX_LORA_WEIGHT:
            raise PromptError(f"{m.group(0)[:120]}: LoRA weights must be between "
                              f"-{MAX_LORA_WEIGHT:g} and {MAX_LORA_WEIGHT:g} (summed over a "
                              f"name's tags), got {tags[name]:g}")
    return LORA_TAG_RE.sub("", prompt), [LoraTag(n, w) for n, w in tags.items()]


def format_lora_tag(name: str, weight: float) -> str:
    """The tag sd-cli reads for ``name`` at ``weight`` (``<lora:name:0.8>``; whole weights
    without a decimal point)."""
    w = f"{weight:g}"
    return f"<lora:{name}:{w}>"
