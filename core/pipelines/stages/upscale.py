"""Upscaling images with ESRGAN-family networks on the engine: image in, image out.

:class:`Upscaler` opens an upscaler file (safetensors, or a ``.pth``/``.ckpt`` read by the
restricted reader of :mod:`sdplan.core.modelfiles.pth`, its arrays held in memory and written into the
engine's buffers like a file's tensors), finds its
architecture from the tensor shapes (:func:`sdplan.core.models.esrgan.detect_esrgan`) and
runs it as the ``upscaler`` module of a placement (runtime device, residency, budget) with
:class:`sdplan.core.runtime.runner.ModuleRunner`.

Large images are cut into tiles (:func:`sdplan.core.models.esrgan.tile_grid`) whose core
is at most ``tile`` input pixels with ``overlap`` pixels of context; every tile has one
padded size, so one graph serves them all. With a placement budget (``--max-vram``) the
tile is the largest of :data:`TILE_SIZES` whose measured compute buffer plus weights fit.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.modelfiles.pth import is_pth, load_pth_tensors
from sdplan.core.modelfiles.readers import check_model_file, read_tensor_file
from sdplan.core.models.esrgan import UpscalerGraph, canonical_rrdb_names, detect_esrgan, tile_grid
from sdplan.core.pipelines.stages.base import Pipeline
from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner, holds_bf16
from sdplan.core.runtime.weights import WeightFile
from sdplan.core.sampling.finite import check_finite

__all__ = ["Upscaler", "to_array", "to_image", "TILE_SIZES", "DEFAULT_TILE", "measure_upscaler"]

log = logging.getLogger(__name__)

#: Candidate tile cores (input pixels), largest first, when a budget decides.
TILE_SIZES = (1024, 768, 512, 384, 256, 192, 128, 96, 64, 48, 32)
#: Tile core without a budget (input pixels): about 0.3 GiB of compute for the compact x4.
DEFAULT_TILE = 256


def to_array(image: np.ndarray) -> np.ndarray:
    """uint8 ``(H, W, 3)`` (or ``(H, W)`` grey) -> float32 ``(1, 3, H, W)`` in [0, 1]."""
    a = np.asarray(image)
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise ValueError(f"image must be (H, W, 3), got {a.shape}")
    return np.ascontiguousarray(a[:, :, :3].transpose(2, 0, 1)[None], np.float32) / np.float32(255.0)


def to_image(x: np.ndarray) -> np.ndarray:
    """float ``(1, 3, H, W)`` (clamped to [0, 1]) -> uint8 ``(H, W, 3)``, rounded.

    Raises:
        NonFiniteError: a NaN or infinity in ``x`` (the upscaler's weights overflowed).
    """
    check_finite(x, "upscaled picture")
    return (np.clip(x[0], 0.0, 1.0).transpose(1, 2, 0) * 255.0 + 0.5).astype(np.uint8)


def _weight_file(path: Path) -> tuple[dict[str, tuple[int, ...]], Any]:
    """``(shapes, make)``: the tensor shapes of an upscaler file and ``make(names, dtypes)``
    building its :class:`~sdplan.core.runtime.weights.WeightFile`: read from the file itself for
    safetensors/GGUF, from the arrays of the restricted reader for a .pth/.ckpt."""
    check_model_file(path)
    if is_pth(path):
        arrays = load_pth_tensors(path)
        return ({k: tuple(v.shape) for k, v in arrays.items()},
                lambda names, dtypes: WeightFile.from_arrays(arrays, path, names, dtypes))
    shapes = {t.name: tuple(t.shape) for t in read_tensor_file(path).tensors}
    return shapes, lambda names, dtypes: WeightFile(path, names, dtypes)


class Upscaler(Pipeline):
    """An upscaler model file ready to run (see the module docstring).

    Args:
        path: ``.safetensors`` or ``.pth``/``.ckpt`` upscaler.
        placement: ``sdplan.core.runtime.runner.ModulePlacement`` (default: CPU, resident weights).
        pool: ``sdplan.core.runtime.runner.BackendPool`` (default: a new one).
        tile: tile core in input pixels (None: from the budget, else :data:`DEFAULT_TILE`).
        overlap: context pixels per tile side (None: the network's receptive radius).
        n_threads: CPU threads (0: the backend's setting).

    Raises:
        ModelFileError: unreadable, hostile or non-upscaler file.
    """

    def __init__(self, path: str | Path, placement: ModulePlacement | None = None,
                 pool: BackendPool | None = None, tile: int | None = None,
                 overlap: int | None = None, n_threads: int = 0) -> None:
        self.path = Path(path)
        shapes, make = _weight_file(self.path)
        names = canonical_rrdb_names(list(shapes))
        self.cfg = detect_esrgan({k: shapes[v] for k, v in names.items()}, str(self.path))
        model = UpscalerGraph(self.cfg, names)
        files = model.other_tensors()
        super().__init__(pool, n_threads)
        self.placement = placement or ModulePlacement(("CPU",))
        # f32 (these networks are small and f16 im2col is slower on CPUs), but the convolution
        # kernels in bf16 where every device of the placement runs a CPU bf16 kernel the graph
        # lists (UpscalerGraph.cpu_bf16_kernels)
        conv = "bf16" if holds_bf16(model, self.placement, self.pool) else "f32"
        wf = make(files, {n: conv if len(shapes[n]) == 4 else "f32" for n in files})
        self.runners["upscaler"] = self.new_runner("upscaler", model, wf, self.placement)
        self.overlap = self.cfg.receptive_radius if overlap is None else overlap
        self.tile = tile
        self._tiles: dict[tuple[int, int, int], int] = {}
        log.info("%s: %s x%d, %d features, %d convs/blocks", self.path, self.cfg.kind, self.cfg.scale,
                 self.cfg.features, self.cfg.n_conv)

    @property
    def runner(self) -> ModuleRunner:
        """The network's module runner."""
        return self.runners["upscaler"]

    @property
    def scale(self) -> int:
        """Output size / input size."""
        return self.cfg.scale

    def _align(self, n: int) -> int:
        k = self.cfg.unshuffle
        return -(-n // k) * k

    def choose_tile(self, h: int, w: int) -> int:
        """The tile core (input pixels) for an ``h`` x ``w`` image: ``tile`` when given,
        else the largest of :data:`TILE_SIZES` whose measured compute buffer plus weights
        fit the placement's budget (bytes), else :data:`DEFAULT_TILE`."""
        if self.tile is not None:
            return self._align(self.tile)
        key = (h, w, self.placement.budget)
        if key in self._tiles:
            return self._tiles[key]
        self._tiles[key] = self._measure_tile(h, w)
        return self._tiles[key]

    def _measure_tile(self, h: int, w: int) -> int:
        budget = self.placement.budget
        if not budget:
            return self._align(DEFAULT_TILE)
        weights = self.runner.wf.nbytes(self.runner.wf.infos)
        overlap, seen = self._align(self.overlap), set()
        for t in (self._align(t) for t in TILE_SIZES):
            region, _ = tile_grid(h, w, t, overlap, self.cfg.unshuffle)
            if region in seen:
                continue
            seen.add(region)
            need = sum(self.runner.measure({"image": (1, self.cfg.in_channels, *region)}).values())
            if need + weights <= budget:
                return t
        return self._align(TILE_SIZES[-1])

    def tile_compute(self, h: int, w: int) -> int:
        """Compute-buffer bytes (all devices) of the tile graph an ``h`` x ``w`` picture runs
        (:meth:`choose_tile`'s tile with its context), measured by the scheduler's dry-run
        reserve without loading a weight."""
        hh, ww = self._align(h), self._align(w)
        region, _ = tile_grid(hh, ww, self.choose_tile(hh, ww), self._align(self.overlap), self.cfg.unshuffle)
        return sum(self.runner.measure({"image": (1, self.cfg.in_channels, *region)}).values())

    def upscale_array(self, x: np.ndarray, repeats: int = 1) -> np.ndarray:
        """float32 ``(1, C, H, W)`` in [0, 1] -> ``(1, C, H*s^r, W*s^r)``; between repeats
        the image is clamped to [0, 1]; the final result is not. Raises ValueError for a
        bad shape, EngineError when a device fails."""
        x = np.asarray(x, np.float32)
        if x.ndim != 4 or x.shape[0] != 1 or x.shape[1] != self.cfg.in_channels:
            raise ValueError(f"upscale: image must be (1, {self.cfg.in_channels}, H, W), got {x.shape}")
        if repeats < 1:
            raise ValueError(f"upscale: repeats must be >= 1, got {repeats}")
        s, h, w = self.cfg.scale, x.shape[2], x.shape[3]
        # Tiles are measured before the weights load (placeholders of their planned device).
        tiles = [self.choose_tile(self._align(h * s ** r), self._align(w * s ** r)) for r in range(repeats)]
        with self.runner.session():
            for r in range(repeats):
                if r:
                    x = np.clip(x, 0.0, 1.0)
                x = self._tiled(x, tiles[r])
        return x

    def _tiled(self, x: np.ndarray, tile: int) -> np.ndarray:
        _, c, h, w = x.shape
        k, s = self.cfg.unshuffle, self.cfg.scale
        ph, pw = (-h) % k, (-w) % k
        if ph or pw:  # RRDB with pixel-unshuffle: pad to a multiple, crop after
            x = np.pad(x, ((0, 0), (0, 0), (0, ph), (0, pw)), mode="reflect")
        hh, ww = x.shape[2:]
        region, tiles = tile_grid(hh, ww, tile, self._align(self.overlap), k)
        out = np.empty((1, c, hh * s, ww * s), np.float32)
        log.debug("upscale %dx%d: %d tiles of %s", hh, ww, len(tiles), region)
        for t in tiles:
            part = np.ascontiguousarray(x[:, :, t.y0:t.y0 + region[0], t.x0:t.x0 + region[1]])
            y = self.runner.run({"image": part})["image"]
            oy, ox = (t.cy0 - t.y0) * s, (t.cx0 - t.x0) * s
            out[:, :, t.cy0 * s:t.cy1 * s, t.cx0 * s:t.cx1 * s] = \
                y[:, :, oy:oy + (t.cy1 - t.cy0) * s, ox:ox + (t.cx1 - t.cx0) * s]
        return out[:, :, :h * s, :w * s]

    def upscale_image(self, image: np.ndarray, repeats: int = 1) -> np.ndarray:
        """uint8 ``(H, W, 3)`` -> uint8 ``(H*s^r, W*s^r, 3)``."""
        return to_image(self.upscale_array(to_array(image), repeats))



def measure_upscaler(path: str | Path, width: int, height: int, placement: ModulePlacement | None,
                     pool: BackendPool) -> int:
    """Compute-buffer bytes of upscaling a ``width`` x ``height`` picture once with the
    upscaler file on ``placement`` (its budget chooses the tile, :meth:`Upscaler.choose_tile`),
    by a dry-run reserve: no weight loads.

    Raises:
        ModelFileError: not an upscaler file; EngineError: a device without a backend.
    """
    up = Upscaler(path, placement=placement, pool=pool)
    try:
        return up.tile_compute(height, width)
    finally:
        up.close()
