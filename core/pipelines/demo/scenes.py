"""Procedural scenes for sdplan's demo model, and the measurement that checks its pictures.

A scene is one coloured shape (circle, square or triangle) on a plain coloured background,
described by a caption such as ``"a red circle on a blue background"``. The colours come from
a small fixed :data:`PALETTE` of clearly distinct colours and the shape never has the
background's colour, so there are ``8 * 7 * 3 = 168`` captions (:func:`all_captions`).
Pictures are 128x128 RGB ``uint8`` arrays, drawn with Pillow at 4x and box-filtered down so
edges are anti-aliased. The shape's size and position are jittered; it always stays at least
:data:`MARGIN` pixels away from the picture's edge, so the border is pure background.

The measurement (:func:`measure`, :func:`caption_matches`) needs nothing but the picture:

- background colour: the per-channel median of the border pixels (the outer
  :data:`BORDER` pixels on every side), named by the nearest palette colour;
- shape region: pixels whose RGB distance from that background exceeds
  :data:`DIFF_THRESHOLD`; shape colour: the per-channel median of the region, named likewise;
- shape kind: the region's fill ratio inside its bounding box (a circle fills pi/4 of it, a
  square all of it, the upright triangle half of it).

Only numpy and Pillow are used: the training script and the tests share this module.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw
from sdplan.core.errors import SdplanError
from sdplan.core.pipelines.demo.captions import COLORS, PALETTE, SHAPES, caption_for, parse_caption

log = logging.getLogger(__name__)

SIZE = 128  #: picture side in pixels
MARGIN = 8  #: minimum distance in pixels between the shape and the picture's edge
RADIUS_RANGE = (22, 40)  #: half-size of the shape in pixels (inclusive range)
BORDER = 4  #: width in pixels of the frame whose median is the background colour
DIFF_THRESHOLD = 60.0  #: RGB distance from the background that marks a shape pixel
MIN_SHAPE_FRACTION = 0.01  #: below this share of the picture no shape is found
#: Fill-ratio limits triangle/circle and circle/square. Ideal fills are 1/2, pi/4 and 1; the
#: percentile box and the anti-aliased edge raise them to about 0.62, 0.85 and 0.98 on
#: rendered scenes, and the limits sit half way between those.
FILL_THRESHOLDS = (0.73, 0.92)
_SUPERSAMPLE = 4
_PALETTE_ARRAY = np.array([PALETTE[c] for c in COLORS], dtype=np.float64)


@dataclass(frozen=True)
class Scene:
    """One shape on a background.

    Attributes:
        shape: one of :data:`SHAPES`.
        color: the shape's colour, a :data:`PALETTE` name.
        background: the background's colour, a different :data:`PALETTE` name.
        cx, cy: the shape's centre in pixels of the ``SIZE``-pixel picture.
        radius: half the shape's width (and height) in pixels.
    """

    shape: str
    color: str
    background: str
    cx: float
    cy: float
    radius: float

    @property
    def caption(self) -> str:
        """The caption, e.g. ``"a red circle on a blue background"``."""
        return caption_for(self.color, self.shape, self.background)


def all_captions() -> list[str]:
    """All 168 captions, in palette order (shape colour, then shape, then background)."""
    return [caption_for(c, s, b) for c in COLORS for s in SHAPES for b in COLORS if b != c]


def random_scene(rng: np.random.Generator, caption: str | None = None) -> Scene:
    """A scene with random placement; random attributes too unless ``caption`` fixes them.

    Args:
        rng: the random source (``np.random.default_rng(seed)``); draws are made in a fixed
            order, so the same generator state gives the same scene.
        caption: a caption :func:`parse_caption` reads, or ``None`` for random attributes.
    """
    if caption is None:
        color = COLORS[int(rng.integers(len(COLORS)))]
        others = [c for c in COLORS if c != color]
        background = others[int(rng.integers(len(others)))]
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
    else:
        color, shape, background = parse_caption(caption)
    radius = float(rng.integers(RADIUS_RANGE[0], RADIUS_RANGE[1] + 1))
    lo, hi = MARGIN + radius, SIZE - MARGIN - radius
    cx, cy = (float(v) for v in rng.uniform(lo, hi, size=2))
    return Scene(shape, color, background, cx, cy, radius)


def render(scene: Scene, size: int = SIZE) -> np.ndarray:
    """The scene as an RGB ``uint8`` array ``(size, size, 3)``.

    Drawn at 4x resolution and box-filtered down (anti-aliased edges). The triangle is
    isosceles and upright: apex at the top centre, base along the bottom of its square.
    Coordinates scale with ``size / SIZE``.
    """
    s = _SUPERSAMPLE * size / SIZE
    img = Image.new("RGB", (size * _SUPERSAMPLE,) * 2, PALETTE[scene.background])
    draw = ImageDraw.Draw(img)
    x0, y0 = (scene.cx - scene.radius) * s, (scene.cy - scene.radius) * s
    x1, y1 = (scene.cx + scene.radius) * s, (scene.cy + scene.radius) * s
    fill = PALETTE[scene.color]
    if scene.shape == "circle":
        draw.ellipse((x0, y0, x1, y1), fill=fill)
    elif scene.shape == "square":
        draw.rectangle((x0, y0, x1, y1), fill=fill)
    else:
        draw.polygon([(scene.cx * s, y0), (x1, y1), (x0, y1)], fill=fill)
    return np.asarray(img.resize((size, size), Image.Resampling.BOX), dtype=np.uint8)


def make_scenes(
    n: int, seed: int, captions: list[str] | None = None
) -> tuple[np.ndarray, list[str]]:
    """``n`` seeded scenes: images ``uint8 (n, 128, 128, 3)`` and their captions.

    Args:
        n: number of scenes (>= 0).
        seed: seed of ``np.random.default_rng``; the same seed gives the same scenes.
        captions: if given, scene ``i`` shows ``captions[i % len(captions)]``.

    Raises:
        SdplanError: ``n`` is negative or ``captions`` is empty.
    """
    if n < 0:
        raise SdplanError(f"demo scenes: count {n} is negative")
    if captions is not None and not captions:
        raise SdplanError("demo scenes: the caption list is empty")
    rng = np.random.default_rng(seed)
    images = np.empty((n, SIZE, SIZE, 3), dtype=np.uint8)
    out: list[str] = []
    for i in range(n):
        scene = random_scene(rng, None if captions is None else captions[i % len(captions)])
        images[i] = render(scene)
        out.append(scene.caption)
    return images, out


def nearest_color(rgb: np.ndarray) -> str:
    """Name of the :data:`PALETTE` colour nearest (Euclidean RGB) to ``rgb`` (3 values, 0..255)."""
    d = np.linalg.norm(_PALETTE_ARRAY - np.asarray(rgb, dtype=np.float64), axis=1)
    return COLORS[int(np.argmin(d))]


def _check_image(image: np.ndarray) -> np.ndarray:
    a = np.asarray(image)
    if a.ndim != 3 or a.shape[2] != 3 or min(a.shape[:2]) <= 4 * BORDER:
        raise SdplanError(f"demo measurement: image shape {a.shape} is not (H, W, 3) RGB")
    if a.dtype != np.uint8:
        if not np.issubdtype(a.dtype, np.number):
            raise SdplanError(f"demo measurement: image dtype {a.dtype} is not numeric")
        a = np.clip(a, 0, 255)
    return a.astype(np.float64)


def measure(image: np.ndarray) -> dict[str, object]:
    """Estimate a picture's background colour, shape colour and shape kind.

    Args:
        image: RGB array ``(H, W, 3)``, ``uint8`` or numbers in 0..255.

    Returns:
        ``background`` (palette name), ``color`` (palette name or ``None`` when no shape is
        found), ``shape`` (one of :data:`SHAPES` or ``None``), ``shape_fraction`` (share of
        pixels in the shape region), ``fill_ratio`` (region pixels / bounding-box pixels),
        ``background_rgb`` and ``color_rgb`` (the median colours, floats).

    Raises:
        SdplanError: the image is not an ``(H, W, 3)`` numeric array.
    """
    a = _check_image(image)
    h, w, _ = a.shape
    frame = np.ones((h, w), dtype=bool)
    frame[BORDER : h - BORDER, BORDER : w - BORDER] = False
    bg_rgb = np.median(a[frame], axis=0)
    mask = np.linalg.norm(a - bg_rgb, axis=2) > DIFF_THRESHOLD
    out: dict[str, object] = {
        "background": nearest_color(bg_rgb),
        "background_rgb": bg_rgb,
        "color": None,
        "color_rgb": None,
        "shape": None,
        "shape_fraction": float(mask.mean()),
        "fill_ratio": 0.0,
    }
    if mask.mean() < MIN_SHAPE_FRACTION:
        return out
    color_rgb = np.median(a[mask], axis=0)
    ys, xs = np.nonzero(mask)
    # Percentile box: a few stray pixels must not inflate the bounding box.
    y0, y1 = np.percentile(ys, [1, 99])
    x0, x1 = np.percentile(xs, [1, 99])
    box = max((y1 - y0 + 1) * (x1 - x0 + 1), 1.0)
    fill = float(mask.sum()) / box
    if fill < FILL_THRESHOLDS[0]:
        shape = "triangle"
    elif fill < FILL_THRESHOLDS[1]:
        shape = "circle"
    else:
        shape = "square"
    out.update(color=nearest_color(color_rgb), color_rgb=color_rgb, shape=shape, fill_ratio=fill)
    return out


def is_outlined(image: np.ndarray, shape: str) -> bool:
    """Is the picture's shape drawn as an outline (the demo's ``outline`` LoRA)? True when the
    5x5 pixels at the middle of the shape region's bounding box (62% of the way down for a
    triangle, whose middle is low) all have the background's colour while a shape region
    exists around them (:func:`measure`'s background and threshold).

    Raises:
        SdplanError: an image that is not ``(H, W, 3)`` or an unknown shape.
    """
    if shape not in SHAPES:
        raise SdplanError(f"demo scene: unknown shape {shape!r} (known: {', '.join(SHAPES)})")
    a = _check_image(image)
    m = measure(image)
    mask = np.linalg.norm(a - np.asarray(m["background_rgb"]), axis=2) > DIFF_THRESHOLD
    if mask.mean() < MIN_SHAPE_FRACTION:
        return False
    ys, xs = np.nonzero(mask)
    y0, y1 = np.percentile(ys, [1, 99])
    x0, x1 = np.percentile(xs, [1, 99])
    cy = int(y0 + (0.62 if shape == "triangle" else 0.5) * (y1 - y0))
    cx = int((x0 + x1) / 2)
    return not mask[cy - 2:cy + 3, cx - 2:cx + 3].any()


def caption_matches(image: np.ndarray, caption: str) -> dict[str, bool]:
    """Does the picture show what the caption says? One boolean per attribute.

    Args:
        image: RGB array ``(H, W, 3)``, ``uint8`` or numbers in 0..255.
        caption: a caption :func:`parse_caption` reads.

    Returns:
        ``background`` (background colour right), ``color`` (a shape was found and its colour
        is right), ``shape`` (a shape was found and its kind is right), ``all`` (all three).

    Raises:
        SdplanError: a caption of the wrong form or an image that is not ``(H, W, 3)``.
    """
    color, shape, background = parse_caption(caption)
    m = measure(image)
    out = {
        "background": m["background"] == background,
        "color": m["color"] == color,
        "shape": m["shape"] == shape,
    }
    out["all"] = all(out.values())
    return out


def caption_match_rates(images, captions: list[str]) -> dict[str, float]:
    """Share of pictures that match their captions, per attribute of :func:`caption_matches`.

    Args:
        images: RGB pictures ``(H, W, 3)`` (a list or an ``(N, H, W, 3)`` array), one per caption.
        captions: captions :func:`parse_caption` reads.

    Returns:
        ``background``, ``color``, ``shape`` and ``all``, each in 0..1.

    Raises:
        SdplanError: no pictures, a count that differs from the captions', or a bad picture or
            caption (see :func:`caption_matches`).
    """
    if len(images) != len(captions) or not captions:
        raise SdplanError(f"demo measurement: {len(images)} pictures for {len(captions)} captions")
    hits = dict.fromkeys(("background", "color", "shape", "all"), 0)
    for image, caption in zip(images, captions, strict=True):
        for key, ok in caption_matches(image, caption).items():
            hits[key] += int(ok)
    return {key: n / len(captions) for key, n in hits.items()}
