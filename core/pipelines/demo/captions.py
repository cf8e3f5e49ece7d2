"""The demo model's captions: its colour palette, its shapes, and the caption syntax.

A caption names one coloured shape on a plain coloured background, such as
``"a red circle on a blue background"``; :mod:`sdplan.core.pipelines.demo.scenes` draws and
measures such scenes. Kept apart from that module (numpy, Pillow) so the command line can
check a prompt against the demo's captions without loading either.
"""

from __future__ import annotations

import re

from sdplan.core.errors import SdplanError

__all__ = ["PALETTE", "COLORS", "SHAPES", "caption_for", "parse_caption"]

#: Colour names and their sRGB values (0..255); pairwise RGB distances are at least 110.
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (200, 20, 20),
    "green": (30, 170, 50),
    "blue": (30, 60, 220),
    "yellow": (245, 235, 40),
    "white": (245, 245, 245),
    "black": (15, 15, 15),
    "orange": (250, 125, 0),
    "purple": (140, 40, 180),
}
COLORS: tuple[str, ...] = tuple(PALETTE)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
_CAPTION_RE = re.compile(r"^\s*an? (\w+) (\w+) on an? (\w+) background\s*$")


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def caption_for(color: str, shape: str, background: str) -> str:
    """The caption of a scene: ``"a {color} {shape} on a {background} background"``.

    The article is ``an`` before a vowel (``"an orange square on a black background"``).

    Raises:
        SdplanError: an unknown colour or shape, or the same colour for shape and background.
    """
    for what, value, known in (
        ("shape colour", color, COLORS),
        ("shape", shape, SHAPES),
        ("background colour", background, COLORS),
    ):
        if value not in known:
            raise SdplanError(f"demo scene: unknown {what} {value!r} (known: {', '.join(known)})")
    if color == background:
        raise SdplanError(f"demo scene: shape and background are both {color!r}")
    return f"{_article(color)} {color} {shape} on {_article(background)} {background} background"


def parse_caption(caption: str) -> tuple[str, str, str]:
    """``(color, shape, background)`` of a caption written as :func:`caption_for` writes it.

    Case and surrounding whitespace are ignored.

    Raises:
        SdplanError: the caption does not have that form or names an unknown colour or shape.
    """
    m = _CAPTION_RE.match(caption.lower())
    if not m:
        raise SdplanError(
            f"demo caption {caption!r} is not of the form 'a COLOR SHAPE on a COLOR background'"
        )
    color, shape, background = m.groups()
    caption_for(color, shape, background)  # validates the names
    return color, shape, background
