"""Latent-to-RGB previews: shapes, an explicit per-pixel check, families and errors."""

from __future__ import annotations

import numpy as np
import pytest
from sdplan.core.errors import SdplanError
from sdplan.core.families import family_of
from sdplan.core.sampling.preview import PROJECTIONS, latent_to_rgb, projection


def reference_pixel(values: np.ndarray, family: str) -> list[int]:
    """One pixel computed the slow way: sum over channels, bias, range change, truncation."""
    proj, bias = PROJECTIONS[family_of(family).latent_format]  # type: ignore[union-attr]
    out = []
    for k in range(3):
        v = sum(float(values[c]) * proj[c][k] for c in range(len(values))) + bias[k]
        v = min(1.0, max(0.0, v * 0.5 + 0.5))
        out.append(int(v * 255))
    return out


@pytest.mark.parametrize(
    ("family", "channels"), [("sd1", 4), ("sd2", 4), ("sdxl", 4), ("flux", 16), ("sd3", 16)]
)
def test_projection_matches_per_pixel_formula(family: str, channels: int) -> None:
    rng = np.random.default_rng(3)
    lat = rng.normal(0, 1.5, size=(1, channels, 5, 7)).astype(np.float32)
    img = latent_to_rgb(lat, family)
    assert img.shape == (5, 7, 3) and img.dtype == np.uint8
    for y, x in [(0, 0), (2, 3), (4, 6)]:
        got = img[y, x].tolist()
        want = reference_pixel(lat[0, :, y, x], family)
        assert all(abs(g - w) <= 1 for g, w in zip(got, want, strict=True)), (got, want)


def test_saturation_and_zero_latent() -> None:
    big = np.full((4, 2, 2), 100.0, np.float32)
    img = latent_to_rgb(big, "sd1")
    # column sums of the SD factors: R and G positive, B negative
    assert img[0, 0].tolist() == [255, 255, 0]
    zero = latent_to_rgb(np.zeros((4, 1, 1), np.float32), "sd1")
    assert zero[0, 0].tolist() == [int((b * 0.5 + 0.5) * 255) for b in PROJECTIONS["sd_vae"][1]]


def test_scale_repeats_pixels() -> None:
    lat = np.random.default_rng(0).normal(size=(4, 3, 2)).astype(np.float32)
    small = latent_to_rgb(lat, "sdxl")
    big = latent_to_rgb(lat, "sdxl", scale=8)
    assert big.shape == (24, 16, 3)
    np.testing.assert_array_equal(big[::8, ::8], small)
    np.testing.assert_array_equal(big[7::8, 7::8], small)


def test_rgb_latent_passes_through() -> None:
    lat = np.array([[[1.0]], [[-1.0]], [[0.0]]], np.float32)
    assert latent_to_rgb(lat, "sd1")[0, 0].tolist() == [255, 0, 127]


def test_errors_name_the_problem() -> None:
    with pytest.raises(SdplanError, match="channels"):
        latent_to_rgb(np.zeros((16, 2, 2)), "sd1")
    with pytest.raises(SdplanError, match="family"):
        projection("sd9", 4)
    with pytest.raises(SdplanError, match="latent must be"):
        latent_to_rgb(np.zeros((2, 2)), "sd1")
    with pytest.raises(SdplanError, match="scale"):
        latent_to_rgb(np.zeros((4, 2, 2)), "sd1", scale=0)
