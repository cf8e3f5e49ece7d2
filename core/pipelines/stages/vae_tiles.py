"""VAE decode and encode in tiles as sd-cli runs them, and the retry with smaller tiles when a
whole decode does not fit its device.

Tile sizes follow the newest sd-cli (spec section 14.7, :class:`~sdplan.core.planning.vae_tiling.VaeTiling`:
image pixels, ``WxH``, overlap clamped to 0..0.5, relative sizes). The grid and the blend are
sd-cli's ``sd_tiling_calc_tiles``, ``process_tiles_2d`` and ``sd_tensor_merge_2d``
(``src/core/ggml_extend.hpp``; read, not copied): the number of tiles per axis is chosen so
that the realised overlap stays near the target, the last tile is moved back to end at the
border (its columns already covered are skipped), and overlapping pixels are added with
smootherstep weights ``t^3 (6t^2 - 15t + 10)`` that sum to one across each overlap. Encoding
uses tiles twice as large (sd-cli's ``encode_tile_factor`` for image VAEs).

A decode whose graph does not fit its device (its compute buffer measured by a dry run plus
the VAE's weights over the placement's ``--max-vram`` budget, or a compute-buffer allocation
that fails) is retried in tiles of at most 256 image pixels, halved until it fits or the
tiles reach 4 latent pixels (spec section 14.6).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sdplan.core.errors import EngineError
from sdplan.core.planning.vae_tiling import DEFAULT_TILE_PX, MIN_TILE_LATENT, VaeTiling

__all__ = ["calc_tiles", "process_tiles", "TileRun", "decode_tiled", "encode_tiled", "fits_budget", "retry_tiles",
           "as_tiling", "ENCODE_TILE_FACTOR", "RETRY_TILE_PX"]

log = logging.getLogger(__name__)

#: sd-cli's tile factor for image VAE encodes (``VAE::encode``'s ``encode_tile_factor``).
ENCODE_TILE_FACTOR = 2.0
#: The largest tile of the retry after a failed decode, image pixels (spec section 14.6).
RETRY_TILE_PX = DEFAULT_TILE_PX
_OOM = re.compile(r"alloc|out of (device )?memory", re.IGNORECASE)


def as_tiling(tile: VaeTiling | int | None, scale: int) -> VaeTiling | None:
    """A pipeline's tiling argument: a :class:`VaeTiling`, or an int (tiles of that many
    latent pixels, the snapshot's ``--vae-tile-size``; 0 or None: no tiling)."""
    if tile is None or isinstance(tile, VaeTiling):
        return tile
    return VaeTiling(True, (int(tile) * scale, int(tile) * scale)) if tile else None


def calc_tiles(small: int, tile: int, overlap: float) -> tuple[int, float]:
    """``(tiles, realised overlap factor)`` along one axis of ``small`` latent pixels cut in
    tiles of ``tile`` with target overlap factor ``overlap`` (sd-cli's
    ``sd_tiling_calc_tiles``, not circular)."""
    ov = int(tile * overlap)
    step = tile - ov
    n = (small - ov) // step
    overshoot = ((n + 1) * step + ov) % small
    if overshoot != step and overshoot <= n * (tile // 2 - ov):
        n += 1  # room for one more tile without the overlap passing one half
    factor = (tile * n - small) / (tile * (n - 1)) if n > 1 else 0.0
    if n <= 2:
        if small <= tile:
            return 1, 0.0
        return 2, (2 * tile - small) / tile
    return n, factor


def _smootherstep(t: np.ndarray) -> np.ndarray:
    return t * t * t * (t * (6.0 * t - 15.0) + 10.0)


def _weights(length: int, pos: int, total: int, overlap: int, skip: int) -> np.ndarray:
    """sd-cli's merge weight along one axis of a tile of ``length`` output pixels at ``pos``
    of ``total``: ramps over ``overlap`` pixels at inner edges, 0 before ``skip``."""
    i = np.arange(length, dtype=np.float32)
    f = np.ones(length, np.float32)
    if overlap > 0 and pos > 0:
        f = np.minimum(f, (i - skip) / np.float32(overlap))
    if overlap > 0 and pos < total - length:
        f = np.minimum(f, (length - i) / np.float32(overlap))
    w = _smootherstep(np.clip(f, 0.0, 1.0)).astype(np.float32)
    w[:skip] = 0.0
    return w


def process_tiles(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray, tile: tuple[int, int],
                  overlap: float, scale: int, decode: bool) -> np.ndarray:
    """Run ``fn`` over overlapping tiles of ``x`` and blend (module docstring).

    Args:
        fn: one tile ``(N, C, th, tw)`` -> its output (``scale`` times larger when
            ``decode``, smaller when encoding); every tile has one shape (one graph).
        x: ``(N, C, H, W)`` float32: a latent to decode or a picture to encode.
        tile: ``(tile_w, tile_h)`` in latent pixels.
        overlap: the target overlap factor (0..0.5).
        scale: image pixels per latent pixel.
        decode: latent to picture (else picture to latent).

    Returns:
        float32 ``(N, C_out, H*scale, W*scale)`` (decode) or ``(N, C_out, H/scale, W/scale)``.
    """
    n, _, h, w = x.shape
    small_w, small_h = (w, h) if decode else (w // scale, h // scale)
    nx, fx = calc_tiles(small_w, tile[0], overlap)
    ny, fy = calc_tiles(small_h, tile[1], overlap)
    ov_x, ov_y = int(tile[0] * fx), int(tile[1] * fy)
    step_x, step_y = tile[0] - ov_x, tile[1] - ov_y
    tw, th = min(tile[0], small_w), min(tile[1], small_h)
    k_in, k_out = (1, scale) if decode else (scale, 1)
    out_w, out_h = small_w * k_out, small_h * k_out
    out: np.ndarray | None = None
    y, last_y = 0, False
    while y < small_h and not last_y:
        dy = 0
        if y + th >= small_h:
            dy, y, last_y = (y - (small_h - th)) * k_out, small_h - th, True
        x0, last_x = 0, False
        while x0 < small_w and not last_x:
            dx = 0
            if x0 + tw >= small_w:
                dx, x0, last_x = (x0 - (small_w - tw)) * k_out, small_w - tw, True
            part = np.ascontiguousarray(x[:, :, y * k_in:(y + th) * k_in, x0 * k_in:(x0 + tw) * k_in])
            res = np.asarray(fn(part), np.float32)
            if out is None:
                out = np.zeros((n, res.shape[1], out_h, out_w), np.float32)
            oy, ox = y * k_out, x0 * k_out
            rh, rw = res.shape[2], res.shape[3]
            ovx, ovy = ov_x * k_out, ov_y * k_out
            region = out[:, :, oy:oy + rh, ox:ox + rw]
            if ovx > 0 or ovy > 0:
                wgt = np.outer(_weights(rh, oy, out_h, ovy, dy), _weights(rw, ox, out_w, ovx, dx))
                region += res * wgt
            else:
                region[:, :, dy:, dx:] = res[:, :, dy:, dx:]
            x0 += step_x
        y += step_y
    assert out is not None
    return out


@dataclass
class TileRun:
    """How a decode or encode ran, for the picture's record.

    Attributes:
        tile: ``(w, h)`` of the tiles in image pixels, or None (whole).
        overlap: the target overlap factor.
        retried: tiles after a whole decode did not fit its device.
    """

    tile: tuple[int, int] | None = None
    overlap: float = 0.0
    retried: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"tile": list(self.tile) if self.tile else None, "overlap": self.overlap, "retried": self.retried}


def fits_budget(runner: Any, key: str = "z") -> Callable[[tuple[int, ...]], bool] | None:
    """For a VAE runner placed with a ``--max-vram`` budget: ``fits(shape)``, whether its
    graph for an input of ``shape`` fits the budget (the dry-run reserve of the compute
    buffer plus the weights it loads, bytes); None without a budget."""
    budget = int(getattr(runner.pl, "budget", 0) or 0)
    if not budget:
        return None
    weights = int(runner.wf.nbytes(runner.wf.infos))

    def fits(shape: tuple[int, ...]) -> bool:
        return weights + sum(runner.measure({key: shape}).values()) <= budget
    return fits


def _oom(exc: EngineError) -> bool:
    return bool(_OOM.search(str(exc)))


def decode_tiled(run: Callable[[np.ndarray], np.ndarray], z: np.ndarray, tiling: VaeTiling | None,
                 scale: int, fits: Callable[[tuple[int, ...]], bool] | None = None) -> tuple[np.ndarray, TileRun]:
    """Decode latent ``z`` ``(N, C, h, w)`` with ``run`` (one latent tile -> picture): in the
    tiles of ``tiling`` when it is enabled, else whole; a whole decode that does not fit
    (``fits`` says no, or ``run`` fails to allocate) is retried in tiles of at most 256 image
    pixels (or ``tiling``'s size when one was given), halved until they fit or reach 4 latent
    pixels (module docstring). Returns the picture ``(N, 3, h*scale, w*scale)`` and how it ran.

    Raises:
        EngineError: the decode failed with the smallest tiles too, or for another reason.
    """
    h, w = z.shape[-2:]
    if tiling is not None and tiling.enabled:
        tw, th = tiling.tile_latent(w * scale, h * scale, scale)
        ov = tiling.clamped_overlap
        return process_tiles(run, z, (tw, th), ov, scale, True), TileRun((tw * scale, th * scale), ov)
    if fits is None or fits(tuple(z.shape)):
        try:
            return run(z), TileRun()
        except EngineError as exc:
            if not _oom(exc):
                raise
            log.warning("VAE decode did not fit (%s); retrying in tiles", exc)
    ov = tiling.clamped_overlap if tiling is not None else 0.5
    tiles = retry_tiles(w, h, tiling, scale)
    for i, (tw, th) in enumerate(tiles):
        smallest = i == len(tiles) - 1
        if fits is None or fits((z.shape[0], z.shape[1], th, tw)) or smallest:
            try:
                return process_tiles(run, z, (tw, th), ov, scale, True), TileRun((tw * scale, th * scale), ov, True)
            except EngineError as exc:
                if smallest or not _oom(exc):
                    raise
    raise AssertionError("unreachable: the last retry tile runs or raises")


def retry_tiles(w: int, h: int, tiling: VaeTiling | None, scale: int) -> list[tuple[int, int]]:
    """The latent tiles ``(w, h)`` a failed whole decode of a ``w`` x ``h`` latent is retried
    with, in order: ``tiling``'s size when it gives one, else :data:`RETRY_TILE_PX` image
    pixels (at most the latent), halved down to :data:`MIN_TILE_LATENT` (spec section 14.6)."""
    given = tiling.tile_px if tiling is not None and any(tiling.tile_px) else (RETRY_TILE_PX, RETRY_TILE_PX)
    tw = min(max((given[0] or RETRY_TILE_PX) // scale, MIN_TILE_LATENT), w)
    th = min(max((given[1] or RETRY_TILE_PX) // scale, MIN_TILE_LATENT), h)
    out = [(tw, th)]
    while tw > MIN_TILE_LATENT or th > MIN_TILE_LATENT:
        tw, th = max(tw // 2, MIN_TILE_LATENT), max(th // 2, MIN_TILE_LATENT)
        out.append((tw, th))
    return out


def encode_tiled(run: Callable[[np.ndarray], np.ndarray], image: np.ndarray, tiling: VaeTiling | None,
                 scale: int) -> np.ndarray:
    """Encode picture ``image`` ``(N, 3, H, W)`` with ``run`` (one picture tile -> its latent
    moments or mean, channels first): in tiles of ``tiling`` times :data:`ENCODE_TILE_FACTOR`
    when it is enabled (sd-cli's encode tiles), else whole."""
    if tiling is None or not tiling.enabled:
        return run(image)
    h, w = image.shape[-2:]
    tw, th = tiling.tile_latent(w, h, scale, ENCODE_TILE_FACTOR)
    return process_tiles(run, image, (tw, th), tiling.clamped_overlap, scale, False)
