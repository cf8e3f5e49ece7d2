"""A TAE tiny autoencoder (TAESD, TAEF1, TAEF2) ready to run: fast previews, and final
images when sd-cli's ``--taesd`` decodes them. The graphs are :mod:`sdplan.core.models.tae`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.tae import TaeGraph, TaeLayout, detect_tae
from sdplan.core.pipelines.stages.base import Pipeline
from sdplan.core.runtime.runner import BackendPool, ModulePlacement
from sdplan.core.runtime.weights import WeightFile


class Tae(Pipeline):
    """A TAE model file (or an encoder file and a decoder file) ready to run on the engine.

    ``paths``: one or two safetensors files; their halves are found by :func:`detect_tae`.
    ``placement``: a ``sdplan.core.runtime.runner.ModulePlacement`` (default: CPU, weights
    resident); ``pool``: a ``BackendPool`` (default: a new one). Weights are held in f32
    (the files' f16 kernels are widened once at load: exact, and faster on CPUs than f16
    im2col). Raises ModelFileError for files without a TAE half.
    """

    def __init__(self, *paths: str, placement: ModulePlacement | None = None,
                 pool: BackendPool | None = None, n_threads: int = 0) -> None:
        super().__init__(pool, n_threads)
        self.placement = placement or ModulePlacement(("CPU",))
        self.layouts: dict[str, TaeLayout] = {}
        for path in paths:
            tf = read_tensor_file(path)
            shapes = {t.name: tuple(t.shape) for t in tf.tensors}
            for part, lay in detect_tae(shapes, str(path)).items():
                if part in self.layouts:
                    raise ModelFileError(path, f"a second TAE {part}")
                model = TaeGraph(lay, list(shapes))
                names = model.other_tensors()
                wf = WeightFile(path, names, dtypes=dict.fromkeys(names, "f32"))
                self.layouts[part] = lay
                self.runners[part] = self.new_runner("vae", model, wf, self.placement)

    @property
    def latent_channels(self) -> int:
        return next(iter(self.layouts.values())).latent_channels

    def _runner(self, part: str) -> Any:
        if part not in self.runners:
            raise ModelFileError("<tae>", f"no TAE {part} was loaded")
        return self.runners[part]

    def encode(self, image: Any) -> Any:
        """``image`` float32 ``(1, 3, H, W)`` in [0, 1] -> latent float32 ``(1, C, H/8, W/8)``."""
        return self._runner("encoder").run({"image": np.asarray(image, np.float32)})["latent"]

    def decode(self, latent: Any) -> Any:
        """``latent`` float32 ``(1, C, h, w)`` -> image float32 ``(1, 3, 8h, 8w)``, unclamped
        (about [0, 1])."""
        return self._runner("decoder").run({"latent": np.asarray(latent, np.float32)})["image"]

    def preview(self, latent: Any) -> Any:
        """A sampling preview: uint8 ``(8h, 8w, 3)`` of the decoded latent."""
        img = np.clip(self.decode(latent)[0], 0.0, 1.0).transpose(1, 2, 0)
        return (img * 255.0 + 0.5).astype(np.uint8)
