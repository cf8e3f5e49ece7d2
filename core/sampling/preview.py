"""Cheap latent previews: a fixed per-channel linear map from latent to RGB, every step.

The coefficients are the fitted latent-to-RGB factors sd-cli uses for its previews (the
ComfyUI ``latent_formats`` factors for SD 1.x/2.x, SDXL and Flux; the SD 3.5 reference code's
factors for SD3). Per latent cell: ``rgb = latent @ P + b``, then ``rgb * 0.5 + 0.5``
clamped to [0, 1] and scaled to 0..255 with truncation, as sd-cli writes it. One latent cell
becomes one pixel (``scale`` repeats it for display).
"""

from __future__ import annotations

import numpy as np
from sdplan.core.errors import SdplanError

_SD = (
    [[0.337366, 0.216344, 0.257386],
     [0.165636, 0.386828, 0.046994],
     [-0.267803, 0.237036, 0.223517],
     [-0.178022, -0.200862, -0.678514]],
    [-0.017478, -0.055834, -0.105825],
)  # fmt: skip
_SDXL = (
    [[0.258303, 0.277640, 0.329699],
     [-0.299701, 0.105446, 0.014194],
     [0.050522, 0.186163, -0.143257],
     [-0.211938, -0.149892, -0.080036]],
    [0.144381, -0.033313, 0.007061],
)  # fmt: skip
_FLUX = (
    [[-0.041168, 0.019917, 0.097253], [0.028096, 0.026730, 0.129576],
     [0.065618, -0.067950, -0.014651], [-0.012998, -0.014762, 0.081251],
     [0.078567, 0.059296, -0.024687], [-0.015987, -0.003697, 0.005012],
     [0.033605, 0.138999, 0.068517], [-0.024450, -0.063567, -0.030101],
     [-0.040194, -0.016710, 0.127185], [0.112681, 0.088764, -0.041940],
     [-0.023498, 0.093664, 0.025543], [0.082899, 0.048320, 0.007491],
     [0.075712, 0.074139, 0.081965], [-0.143501, 0.018263, -0.136138],
     [-0.025767, -0.082035, -0.040023], [-0.111849, -0.055589, -0.032361]],
    [0.024600, -0.006937, -0.008089],
)  # fmt: skip
_SD3 = (
    [[-0.0645, 0.0177, 0.1052], [0.0028, 0.0312, 0.0650], [0.1848, 0.0762, 0.0360],
     [0.0944, 0.0360, 0.0889], [0.0897, 0.0506, -0.0364], [-0.0020, 0.1203, 0.0284],
     [0.0855, 0.0118, 0.0283], [-0.0539, 0.0658, 0.1047], [-0.0057, 0.0116, 0.0700],
     [-0.0412, 0.0281, -0.0039], [0.1106, 0.1171, 0.1220], [-0.0248, 0.0682, -0.0481],
     [0.0815, 0.0846, 0.1207], [-0.0120, -0.0055, -0.0867], [-0.0749, -0.0634, -0.0456],
     [-0.1418, -0.1457, -0.1259]],
    [0.0, 0.0, 0.0],
)  # fmt: skip

PROJECTIONS: dict[str, tuple[list[list[float]], list[float]]] = {
    "sd1": _SD,
    "sd2": _SD,
    "sdxl": _SDXL,
    "flux": _FLUX,
    "sd3": _SD3,
}


def projection(family: str, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """``(P, b)``: float32 ``(channels, 3)`` matrix and ``(3,)`` bias for ``family``.

    Raises:
        SdplanError: unknown family, or a family whose latents do not have ``channels``.
    """
    if family not in PROJECTIONS:
        raise SdplanError(
            f"preview: unknown model family {family!r} (known: {sorted(PROJECTIONS)})"
        )
    proj, bias = PROJECTIONS[family]
    if len(proj) != channels:
        raise SdplanError(
            f"preview: {family} latents have {len(proj)} channels, this latent has {channels}"
        )
    return np.asarray(proj, np.float32), np.asarray(bias, np.float32)


def latent_to_rgb(latent: np.ndarray, family: str, scale: int = 1) -> np.ndarray:
    """Project a latent to an RGB preview image.

    Args:
        latent: float array ``(C, H, W)`` or ``(1, C, H, W)``; C = 4 for sd1/sd2/sdxl,
            16 for flux/sd3. A 3-channel latent is taken as RGB already.
        family: ``sd1``, ``sd2``, ``sdxl``, ``flux`` or ``sd3``.
        scale: integer upscaling (nearest neighbour) for display, >= 1.

    Returns:
        uint8 array ``(H * scale, W * scale, 3)``.

    Raises:
        SdplanError: wrong shape, unknown family, or a channel count the family does not have.
    """
    arr = np.asarray(latent, dtype=np.float32)
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 3:
        raise SdplanError(
            f"preview: latent must be (C, H, W) or (1, C, H, W), got {np.shape(latent)}"
        )
    if not isinstance(scale, int) or scale < 1:
        raise SdplanError(f"preview: scale must be a positive integer, got {scale!r}")
    c = arr.shape[0]
    if c == 3:
        rgb = np.moveaxis(arr, 0, -1)
    else:
        proj, bias = projection(family, c)
        rgb = np.einsum("chw,ck->hwk", arr, proj) + bias
    img = (np.clip(rgb * np.float32(0.5) + np.float32(0.5), 0.0, 1.0) * np.float32(255)).astype(
        np.uint8
    )
    if scale > 1:
        img = np.repeat(np.repeat(img, scale, axis=0), scale, axis=1)
    return np.ascontiguousarray(img)
