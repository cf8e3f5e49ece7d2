"""Which Wan autoencoder a ``--vae`` file is, and what the pipeline needs of it: the Wan 2.1 one
(16 latent channels, 8x spatial: Wan 2.1, Wan 2.2 A14B) or the Wan 2.2 one (48 channels, 16x
spatial: Wan 2.2 TI2V-5B), told apart by the Wan 2.2 layout's nested levels
(:func:`sdplan.core.models.wan22_vae.is_wan22_vae`), as sd-cli picks its ``WanVAE`` version
from the file (stable-diffusion.cpp ``wan_vae.hpp``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from sdplan.core.models import wan22_vae, wan_vae, wan_vae_encode
from sdplan.core.models.qwen_image_vae import LATENT_MEAN, LATENT_STD, wan_vae_config

__all__ = ["WanAutoencoder", "wan_autoencoder"]


@dataclass(frozen=True)
class WanAutoencoder:
    """A Wan autoencoder file's reading.

    Attributes:
        name: ``"Wan 2.1"`` or ``"Wan 2.2"`` (for messages).
        cfg: its :class:`~sdplan.core.models.qwen_image_vae.WanVaeConfig` or
            :class:`~sdplan.core.models.wan22_vae.Wan22VaeConfig`.
        z: latent channels (16 or 48).
        factor: image pixels per latent pixel (8 or 16).
        latent_format: the previews' latent format (``wan21_vae`` or ``wan22_vae``).
        mean, std: float32 ``(1, z, 1, 1, 1)``: the published per-channel statistics
            (the DiT's latent is ``(z - mean) / std``).
        has_decoder: the file holds a decoder.
    """

    name: str
    cfg: Any
    z: int
    factor: int
    latent_format: str
    mean: np.ndarray
    std: np.ndarray
    has_decoder: bool

    def decoder_names(self, shapes: Mapping[str, Any]) -> list[str]:
        """The file's tensors the decoder reads (``decoder.*`` and ``conv2.*`` under its prefix)."""
        p = self.cfg.prefix
        return [n for n in shapes if n.startswith((p + "decoder.", p + "conv2."))]

    def encoder_names(self, shapes: Mapping[str, Any]) -> list[str]:
        """The file's tensors the encoder reads (``encoder.*`` and ``conv1.*`` under its prefix;
        empty for a decoder-only file)."""
        p = self.cfg.prefix
        return [n for n in shapes if n.startswith((p + "encoder.", p + "conv1."))]

    def has_encoder(self, shapes: Mapping[str, Any]) -> bool:
        """Whether the file holds the encoder's levels."""
        if self.name == "Wan 2.2":
            return bool(wan22_vae.encoder_levels(shapes, self.cfg.prefix))
        return bool(self.cfg.encoder)

    def encode(self, g: Any, weights: Mapping[str, Any], video: Any, shapes: Mapping[str, tuple[int, ...]]) -> Any:
        """The encoder's graph (its mean, sd-cli's encode) over a video ``video`` f32 ``(1 + 4 k, 3,
        H, W)`` in [-1, 1]: f32 ``(1 + k, z, H / factor, W / factor)`` in the autoencoder's own
        space (:func:`sdplan.core.models.wan22_vae.video_encode`,
        :func:`sdplan.core.models.wan_vae_encode.video_encode`).

        Raises:
            ModelLayoutError: a file without an encoder.
        """
        if self.name == "Wan 2.2":
            return wan22_vae.video_encode(g, weights, video, self.cfg, shapes)
        return wan_vae_encode.video_encode(g, weights, video, self.cfg, shapes)

    def decode(self, g: Any, weights: Mapping[str, Any], z: Any, shapes: Mapping[str, tuple[int, ...]]) -> Any:
        """The decoder's graph over latent frames ``z`` f32 ``(T, z, h, w)`` of the
        autoencoder's own space: f32 ``(1 + 4 (T - 1), 3, h * factor, w * factor)``, unclamped."""
        if self.name == "Wan 2.2":
            return wan22_vae.video_decode(g, weights, z, self.cfg, shapes)
        return wan_vae.video_decode(g, weights, z, self.cfg, shapes)


def _stats(values: tuple[float, ...]) -> np.ndarray:
    return np.asarray(values, np.float32).reshape(1, -1, 1, 1, 1)


def wan_autoencoder(shapes: Mapping[str, tuple[int, ...]]) -> WanAutoencoder:
    """Read a Wan autoencoder file's ``shapes`` (module docstring).

    Raises:
        ModelLayoutError: neither layout.
    """
    if wan22_vae.is_wan22_vae(shapes):
        c2 = wan22_vae.wan22_vae_config(shapes)
        return WanAutoencoder("Wan 2.2", c2, c2.z, c2.factor, "wan22_vae", _stats(wan22_vae.LATENT_MEAN),
                              _stats(wan22_vae.LATENT_STD), True)
    c1 = wan_vae_config(shapes)
    return WanAutoencoder("Wan 2.1", c1, c1.z, c1.factor, "wan21_vae", _stats(LATENT_MEAN), _stats(LATENT_STD),
                          bool(c1.decoder))
