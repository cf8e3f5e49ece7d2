"""sd-cli's VAE tiling flags (spec section 14.7), read, checked and converted between dialects.

``--vae-tiling`` turns spatial tiling on. ``--vae-tile-size`` is one size or ``WxH``: in
the newest sd-cli in **image pixels** (0 = the 256-pixel default; rounded down to a multiple
of the VAE's scale factor; at least 4 latent pixels per axis), in the snapshot in latent
pixels. ``--vae-tile-overlap`` (default 0.5) is clamped to 0..0.5 by the newest sd-cli.
``--vae-relative-tile-size`` (one value or ``WxH``; up to 1 a fraction of the input, above 1
tiles per axis) overrides the absolute size. A tile size pasted from one dialect is converted
for the other when the dialect it was written for is known (:func:`convert_tile_size`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from sdplan.core.errors import PlanError
from sdplan.core.families import family_of, variant_of

__all__ = ["VaeTiling", "parse_tile_size", "parse_relative_size", "parse_overlap",
           "convert_tile_size", "vae_scale_factor", "DEFAULT_TILE_PX", "MIN_TILE_LATENT"]

#: The newest sd-cli's default tile in image pixels (its ``docs/performance.md``).
DEFAULT_TILE_PX = 256
#: Smallest tile the newest sd-cli accepts, in latent pixels per axis.
MIN_TILE_LATENT = 4
_INT = re.compile(r"\d+")
_FLOAT = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def vae_scale_factor(architecture: str | None) -> int:
    """Image pixels per latent pixel of a family's VAE (its registry entry's ``vae_scale``, or
    its variant's compute ``scale`` where that autoencoder differs): 16 for FLUX.2 (its
    autoencoder packs 2x2 latents) and Wan 2.2 TI2V-5B (the Wan 2.2 autoencoder), 8 for every
    other family sdplan reads (SD, SDXL, SD3, FLUX.1, Z-Image, Wan 2.1) and for an unknown
    architecture."""
    fam = family_of(architecture)
    if fam is None:
        return 8
    return fam.compute_for(variant_of(architecture)).scale or fam.vae_scale


def _pair(text: str, pattern: re.Pattern[str], flag: str, what: str) -> tuple[str, str]:
    parts = text.strip().lower().split("x")
    if len(parts) == 1:
        parts = [parts[0], parts[0]]
    if len(parts) != 2 or not all(pattern.fullmatch(p.strip()) for p in parts):
        raise PlanError("invalid_vae_tiling", f"{flag}: '{text}' is not {what} (write one "
                        "value or WxH)", flag=flag, text=text)
    return parts[0].strip(), parts[1].strip()


def parse_tile_size(text: str) -> tuple[int, int]:
    """``--vae-tile-size``: ``(w, h)`` from ``N`` or ``WxH`` (whole numbers >= 0).

    Raises:
        PlanError: ``invalid_vae_tiling`` for anything else.
    """
    w, h = _pair(text, _INT, "--vae-tile-size", "a tile size")
    return int(w), int(h)


def parse_relative_size(text: str) -> tuple[float, float]:
    """``--vae-relative-tile-size``: ``(w, h)`` from ``A`` or ``AxB`` (positive numbers).

    Raises:
        PlanError: ``invalid_vae_tiling`` for anything else, or a zero value.
    """
    w, h = _pair(text, _FLOAT, "--vae-relative-tile-size", "a relative tile size")
    out = float(w), float(h)
    if not all(v > 0 and math.isfinite(v) for v in out):
        raise PlanError("invalid_vae_tiling", f"--vae-relative-tile-size: '{text}' must be "
                        "positive", flag="--vae-relative-tile-size", text=text)
    return out


def parse_overlap(text: str) -> float:
    """``--vae-tile-overlap`` as given (the newest sd-cli clamps it to 0..0.5).

    Raises:
        PlanError: ``invalid_vae_tiling`` for a value that is not a plain number.
    """
    if not _FLOAT.fullmatch(text.strip().lstrip("+-")) or not math.isfinite(float(text)):
        raise PlanError("invalid_vae_tiling", f"--vae-tile-overlap: '{text}' is not a number",
                        flag="--vae-tile-overlap", text=text)
    return float(text)


def convert_tile_size(text: str, from_dialect: str, to_dialect: str, scale: int) -> str:
    """A ``--vae-tile-size`` value written for ``from_dialect`` as ``to_dialect`` reads it:
    snapshot latent pixels times ``scale`` give newest image pixels, image pixels divided by
    ``scale`` (rounded down, at least 1) give latent pixels; 0 (the default) stays 0; the
    written form (one size or ``WxH``) is kept.

    Raises:
        PlanError: ``invalid_vae_tiling`` for a value :func:`parse_tile_size` refuses.
    """
    w, h = parse_tile_size(text)
    if from_dialect == to_dialect:
        return text

    def one(v: int) -> int:
        if v == 0:
            return 0
        return v * scale if to_dialect == "newest" else max(v // scale, 1)

    cw, ch = one(w), one(h)
    return str(cw) if "x" not in text.lower() else f"{cw}x{ch}"


@dataclass(frozen=True)
class VaeTiling:
    """VAE tiling as a command asks for it (newest sd-cli's units).

    Attributes:
        enabled: ``--vae-tiling``.
        tile_px: tile ``(w, h)`` in image pixels (0 = the default).
        overlap: the overlap after the newest sd-cli's clamp to 0..0.5.
        relative: ``--vae-relative-tile-size`` ``(w, h)``, or None.
    """

    enabled: bool = False
    tile_px: tuple[int, int] = (0, 0)
    overlap: float = 0.5
    relative: tuple[float, float] | None = None

    @property
    def clamped_overlap(self) -> float:
        """The overlap factor as the newest sd-cli uses it: clamped to 0..0.5."""
        return min(max(self.overlap, 0.0), 0.5)

    def tile_latent(self, width: int, height: int, scale: int, factor: float = 1.0) -> tuple[int, int]:
        """The tile in latent pixels for a ``width`` x ``height`` image, as sd-cli's
        ``VAE::get_tile_sizes`` computes it: a relative size up to 1 is that fraction of the
        latent; above 1 it is that many tiles per axis, overlapping by :attr:`clamped_overlap`
        (the fraction ``1 / (r - r * overlap + overlap)``, rounded); else the pixel size (0:
        256) over ``scale``; then times ``factor`` (2 for encoding), at most the latent and
        at least :data:`MIN_TILE_LATENT`."""
        lat = (max(width // scale, 1), max(height // scale, 1))
        ov = self.clamped_overlap
        out = []
        for i, axis in enumerate(lat):
            if self.relative is not None:
                r = self.relative[i]
                r = 1.0 / (r - r * ov + ov) if r > 1 else r
                t = int(math.floor(axis * r + 0.5))  # C++ std::round: halves away from 0
            else:
                px = self.tile_px[i] or DEFAULT_TILE_PX
                t = px // scale
            t = int(t * factor)
            out.append(max(min(t, axis), MIN_TILE_LATENT))
        return out[0], out[1]

    @classmethod
    def from_json(cls, data: object) -> VaeTiling:
        """The inverse of :meth:`to_json` (a mapping; absent keys keep their defaults).

        Raises:
            PlanError: ``invalid_vae_tiling`` for values of the wrong kind.
        """
        if isinstance(data, VaeTiling):
            return data
        if not isinstance(data, dict):
            raise PlanError("invalid_vae_tiling", f"VAE tiling must be a mapping, got {type(data).__name__}")
        try:
            px = data.get("tile_px") or (0, 0)
            rel = data.get("relative")
            out = cls(bool(data.get("enabled")), (int(px[0]), int(px[1])),
                      float(data["overlap"]) if data.get("overlap") is not None else 0.5,
                      (float(rel[0]), float(rel[1])) if rel else None)
        except (TypeError, ValueError, IndexError) as exc:
            raise PlanError("invalid_vae_tiling", f"VAE tiling {data!r}: {exc}") from None
        if min(out.tile_px) < 0 or not math.isfinite(out.overlap) or (
                out.relative is not None and not all(v > 0 and math.isfinite(v) for v in out.relative)):
            raise PlanError("invalid_vae_tiling", f"VAE tiling {data!r}: sizes must be positive")
        return out

    @property
    def customised(self) -> bool:
        """Any setting away from sd-cli's defaults (a tile size, overlap or relative size)."""
        return bool(any(self.tile_px) or self.overlap != 0.5 or self.relative is not None)

    def to_json(self) -> dict[str, object]:
        """JSON form (:meth:`from_json` reads it back)."""
        return {"enabled": self.enabled, "tile_px": list(self.tile_px), "overlap": self.overlap,
                "relative": list(self.relative) if self.relative is not None else None}
