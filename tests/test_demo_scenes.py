"""The demo model's scene generator and the caption measurement.

The measurement must accept every ground-truth scene, reject a scene against a caption that
differs in an attribute, and stay near chance on noise. Areas are checked against the
analytic areas of the drawn shapes (pi r^2, 4 r^2, 2 r^2).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from sdplan.core.errors import SdplanError
from sdplan.core.pipelines.demo import scenes as ds


@pytest.fixture(scope="module")
def scenes() -> list[ds.Scene]:
    rng = np.random.default_rng(2024)
    return [ds.random_scene(rng) for _ in range(300)]


def test_palette_is_clearly_distinct() -> None:
    rgb = np.array(list(ds.PALETTE.values()), dtype=float)
    d = np.linalg.norm(rgb[:, None] - rgb[None], axis=2)
    assert d[~np.eye(len(rgb), dtype=bool)].min() >= 110
    for name, value in ds.PALETTE.items():
        assert ds.nearest_color(np.array(value) + 25) == name


def test_captions() -> None:
    caps = ds.all_captions()
    assert len(caps) == len(set(caps)) == 8 * 7 * 3
    assert "a red circle on a blue background" in caps
    assert "an orange square on an orange background" not in caps
    assert ds.caption_for("orange", "triangle", "white") == (
        "an orange triangle on a white background"
    )
    for cap in caps:
        color, shape, bg = ds.parse_caption(cap)
        assert ds.caption_for(color, shape, bg) == cap
        assert color != bg
    assert ds.parse_caption("  A Yellow Triangle on a Green background ") == (
        "yellow",
        "triangle",
        "green",
    )


@pytest.mark.parametrize(
    "bad",
    [
        "a red circle",
        "a red circle on a red background",
        "a pink circle on a blue background",
        "a red hexagon on a blue background",
        "",
    ],
)
def test_bad_captions_are_named(bad: str) -> None:
    with pytest.raises(SdplanError, match="demo"):
        ds.parse_caption(bad)


def test_scenes_are_seeded() -> None:
    a, ca = ds.make_scenes(12, seed=5)
    b, cb = ds.make_scenes(12, seed=5)
    c, _ = ds.make_scenes(12, seed=6)
    assert a.shape == (12, 128, 128, 3) and a.dtype == np.uint8
    assert ca == cb and np.array_equal(a, b)
    assert not np.array_equal(a, c)
    fixed, caps = ds.make_scenes(4, seed=1, captions=["a black square on a white background"])
    assert set(caps) == {"a black square on a white background"}
    assert all((fixed[i, 0, 0] == ds.PALETTE["white"]).all() for i in range(4))
    with pytest.raises(SdplanError, match="negative"):
        ds.make_scenes(-1, seed=0)


def test_render_geometry(scenes: list[ds.Scene]) -> None:
    """Border is pure background, the centre is the shape, areas match the analytic ones."""
    area = {"circle": math.pi, "square": 4.0, "triangle": 2.0}
    for sc in scenes[:120]:
        img = ds.render(sc)
        bg = np.array(ds.PALETTE[sc.background])
        frame = np.concatenate([img[: ds.MARGIN].reshape(-1, 3), img[-ds.MARGIN :].reshape(-1, 3)])
        assert (frame == bg).all()
        assert (img[round(sc.cy), round(sc.cx)] == ds.PALETTE[sc.color]).all()
        # Coverage from the anti-aliased pixels: the share of the way from bg to the colour.
        col = np.array(ds.PALETTE[sc.color], dtype=float)
        t = ((img - bg) @ (col - bg)) / ((col - bg) @ (col - bg))
        expected = area[sc.shape] * sc.radius**2
        assert abs(t.sum() - expected) / expected < 0.03, (sc, t.sum(), expected)


def test_shape_never_takes_background_colour(scenes: list[ds.Scene]) -> None:
    assert all(s.color != s.background for s in scenes)
    counts = Counter(s.shape for s in scenes)
    assert set(counts) == set(ds.SHAPES) and min(counts.values()) > 60
    assert len({s.color for s in scenes}) == len({s.background for s in scenes}) == 8


def test_measurement_accepts_ground_truth(scenes: list[ds.Scene]) -> None:
    for sc in scenes:
        img = ds.render(sc)
        got = ds.caption_matches(img, sc.caption)
        assert got == {"background": True, "color": True, "shape": True, "all": True}, sc
        m = ds.measure(img)
        true_area = {"circle": math.pi, "square": 4.0, "triangle": 2.0}[sc.shape] * sc.radius**2
        # the thresholded region gains or loses part of the anti-aliased edge
        assert abs(m["shape_fraction"] * 128 * 128 - true_area) / true_area < 0.1


def test_measurement_rejects_other_captions(scenes: list[ds.Scene]) -> None:
    """Scene i against caption i+1: each attribute matches exactly when the two agree."""
    for a, b in zip(scenes, scenes[1:] + scenes[:1], strict=True):
        got = ds.caption_matches(ds.render(a), b.caption)
        want = {
            "background": a.background == b.background,
            "color": a.color == b.color,
            "shape": a.shape == b.shape,
        }
        want["all"] = all(want.values())
        assert got == want, (a, b)


def test_measurement_is_near_chance_on_noise() -> None:
    rng = np.random.default_rng(0)
    caps = ds.all_captions()
    hits: Counter[str] = Counter()
    for cap in caps:
        noise = rng.integers(0, 256, (128, 128, 3), dtype=np.uint8)
        for key, ok in ds.caption_matches(noise, cap).items():
            hits[key] += ok
    n = len(caps)
    assert hits["background"] / n < 0.25  # chance 1/8
    assert hits["color"] / n < 0.25  # chance 1/7
    assert hits["shape"] / n < 0.5  # chance 1/3
    assert hits["all"] / n < 0.05  # chance 1/168


def test_blank_picture_has_no_shape() -> None:
    img = np.zeros((128, 128, 3), dtype=np.uint8) + np.array(ds.PALETTE["green"], np.uint8)
    m = ds.measure(img)
    assert m["background"] == "green" and m["color"] is None and m["shape"] is None
    got = ds.caption_matches(img, "a red circle on a green background")
    assert got == {"background": True, "color": False, "shape": False, "all": False}
    # float input in 0..255 works the same
    assert ds.measure(img.astype(np.float32))["background"] == "green"


@pytest.mark.parametrize("shape", [(128, 128), (128, 128, 4), (6, 6, 3)])
def test_bad_images_are_named(shape: tuple[int, ...]) -> None:
    with pytest.raises(SdplanError, match="image shape"):
        ds.measure(np.zeros(shape, dtype=np.uint8))


def test_caption_match_rates_count_each_attribute() -> None:
    imgs, caps = ds.make_scenes(4, seed=3, captions=["a red circle on a blue background",
                                                     "a white square on a black background"])
    assert ds.caption_match_rates(imgs, caps) == {"background": 1.0, "color": 1.0, "shape": 1.0,
                                                  "all": 1.0}
    # the first two pictures told the other caption: every attribute differs for them
    swapped = [caps[1], caps[0], caps[2], caps[3]]
    assert ds.caption_match_rates(imgs, swapped) == {"background": 0.5, "color": 0.5,
                                                     "shape": 0.5, "all": 0.5}
    with pytest.raises(SdplanError, match="3 pictures for 4 captions"):
        ds.caption_match_rates(imgs[:3], caps)
    with pytest.raises(SdplanError, match="0 pictures for 0 captions"):
        ds.caption_match_rates([], [])
