"""Pictures on screen and on disk: engine arrays as QImages, and a run's pictures saved as
PNGs with the record ``sdplan generate`` writes
(:func:`sdplan.core.pipelines.stages.results.picture_text`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtGui import QImage
from sdplan.core.pipelines.stages.outputs import atomic_write


def to_qimage(array: Any) -> QImage:
    """An (H, W, 3|4) uint8 or float [0, 1] array (or (H, W) grey) as a QImage copy.

    Raises:
        ValueError: any other shape.
    """
    a = np.asarray(array)
    if a.dtype != np.uint8:
        a = (np.clip(a.astype(np.float32), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    if a.ndim == 2:
        a = np.repeat(a[:, :, None], 3, axis=2)
    if a.ndim != 3 or a.shape[2] not in (3, 4):
        raise ValueError(f"an image must be (H, W, 3) or (H, W, 4), not {a.shape}")
    a = np.ascontiguousarray(a)
    h, w, c = a.shape
    fmt = QImage.Format.Format_RGB888 if c == 3 else QImage.Format.Format_RGBA8888
    return QImage(a.data, w, h, w * c, fmt).copy()


def uint8_picture(img: Any) -> np.ndarray:
    """An engine picture as uint8 ``(H, W, 3)`` (float pictures in [0, 1] are scaled)."""
    a = np.asarray(img)
    if a.dtype != np.uint8:
        a = (np.clip(a.astype(np.float32), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
    return a


def _png_writer(img: QImage) -> Callable[[Path], None]:
    """A writer of ``img`` as PNG to a temporary path (for :func:`atomic_write`)."""
    def write(tmp: Path) -> None:
        if not img.save(str(tmp), "PNG"):
            raise OSError(f"Qt could not write {tmp.name}")
    return write


def write_pictures(folder: Path, images: Sequence[Any], record: Mapping[str, Any],
                   model_files: Mapping[str, Any],
                   saved: Callable[[Path], None] = lambda path: None) -> list[Path]:
    """Save a run's pictures (uint8 ``(H, W, 3)`` arrays, or QImages) in ``folder`` as
    ``<date-time>-<i>.png`` (never over an existing file), each carrying the record's text
    chunks (:func:`~sdplan.core.pipelines.stages.results.picture_text`: file names, never
    folders; ``batch_index`` for a batch) and, beside it, the gallery's index of it with the
    full paths (:func:`~sdplan.core.pipelines.stages.results.index_record`), atomically. ``saved`` is called with each
    path written. Returns the paths.

    Raises:
        OSError: the folder or a file cannot be written (the pictures written so far stay).
    """
    from sdplan.core.pipelines.stages.results import index_record, picture_text, save_png

    folder.mkdir(parents=True, exist_ok=True)
    text = picture_text(record, model_files)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    index = json.dumps(index_record(record["params"], model_files), indent=1, default=str)
    paths = []
    for i, img in enumerate(images):
        path = folder / f"{stamp}-{i}.png"
        n = 1
        while path.exists():  # a queue can finish two jobs within a second
            path, n = folder / f"{stamp}-{i}-{n}.png", n + 1
        chunks = text | ({"batch_index": str(i)} if len(images) > 1 else {})
        if isinstance(img, QImage):
            for key, value in chunks.items():
                img.setText(key, value)
            atomic_write(path, _png_writer(img))
        else:
            save_png(uint8_picture(img), path, chunks)
        atomic_write(path.with_suffix(".json"), lambda tmp: tmp.write_text(index))
        paths.append(path)
        saved(path)
    return paths
