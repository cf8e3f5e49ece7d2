"""Cheap latent previews: a fixed per-channel linear map from latent to RGB, every step.

The coefficients are the fitted latent-to-RGB factors sd-cli uses for its previews (the
ComfyUI ``latent_formats`` factors for SD 1.x/2.x, SDXL, Flux and FLUX.2; the SD 3.5 reference
code's factors for SD3; stable-diffusion.cpp ``latent-preview.h``'s Wan 2.1 factors for
Qwen-Image and its Wan 2.2 factors for TI2V-5B's 48 channels, on its normalised diffusion latent as sd-cli previews it). FLUX.2's apply per channel of its 32-channel latent: sd-cli unpatchifies
the 128 diffusion channels 2x2 first, so one latent cell is 2x2 pixels. Per latent cell: ``rgb = latent @ P + b``, then ``rgb * 0.5 + 0.5``
clamped to [0, 1] and scaled to 0..255 with truncation, as sd-cli writes it. One latent cell
becomes one pixel (``scale`` repeats it for display).
"""

from __future__ import annotations

import numpy as np
from sdplan.core.errors import SdplanError
from sdplan.core.families import family as registry_family

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

_FLUX2 = (  # per channel of the 32-channel FLUX.2 latent (the 128 diffusion channels unpatchified)
    [[0.000736, -0.008385, -0.019710], [-0.001352, -0.016392, 0.020693],
     [-0.006376, 0.002428, 0.036736], [0.039384, 0.074167, 0.119789],
     [0.007464, -0.005705, -0.004734], [-0.004086, 0.005287, -0.000409],
     [-0.032835, 0.050802, -0.028120], [-0.003158, -0.000835, 0.000406],
     [-0.112840, -0.084337, -0.023083], [0.001462, -0.006656, 0.000549],
     [-0.009980, -0.007480, 0.009702], [0.032540, 0.000214, -0.061388],
     [0.011023, 0.000694, 0.007143], [-0.001468, -0.006723, -0.001678],
     [-0.005921, -0.010320, -0.003907], [-0.028434, 0.027584, 0.018457],
     [0.014349, 0.011523, 0.000441], [0.009874, 0.003081, 0.001507],
     [0.002218, 0.005712, 0.001563], [0.053010, -0.019844, 0.008683],
     [-0.002507, 0.005384, 0.000938], [-0.002177, -0.011366, 0.003559],
     [-0.000261, 0.015121, -0.003240], [-0.003944, -0.002083, 0.005043],
     [-0.009138, 0.011336, 0.003781], [0.011429, 0.003985, -0.003855],
     [0.010518, -0.005586, 0.010131], [0.007883, 0.002912, -0.001473],
     [-0.003318, -0.003160, 0.003684], [-0.034560, -0.008740, 0.012996],
     [0.000166, 0.001079, -0.012153], [0.017772, 0.000937, -0.011953]],
    [-0.028738, -0.098463, -0.107619],
)  # fmt: skip

_WAN21 = (  # the Wan 2.1 autoencoder's 16 channels (Qwen-Image's): sd-cli's wan_21_latent_rgb_proj
    [[0.015123, -0.148418, 0.479828], [0.003652, -0.010680, -0.037142],
     [0.212264, 0.063033, 0.016779], [0.232999, 0.406476, 0.220125],
     [-0.051864, -0.082384, -0.069396], [0.085005, -0.161492, 0.010689],
     [-0.245369, -0.506846, -0.117010], [-0.151145, 0.017721, 0.007207],
     [-0.293239, -0.207936, -0.421135], [-0.187721, 0.050783, 0.177649],
     [-0.013067, 0.265964, 0.166578], [0.028327, 0.109329, 0.108642],
     [-0.205343, 0.043991, 0.148914], [0.014307, -0.048647, -0.007219],
     [0.217150, 0.053074, 0.319923], [0.155357, 0.083156, 0.064780]],
    [-0.270270, -0.234976, -0.456853],
)  # fmt: skip

_WAN22 = (  # the Wan 2.2 autoencoder's 48 channels (TI2V-5B's): sd-cli's wan_22_latent_rgb_proj
    [[0.017126, -0.027230, -0.019257], [-0.113739, -0.028715, -0.022885],
     [-0.000106, 0.021494, 0.004629], [-0.013273, -0.107137, -0.033638],
     [-0.000381, 0.000279, 0.025877], [-0.014216, -0.003975, 0.040528],
     [0.001638, -0.000748, 0.011022], [0.029238, -0.006697, 0.035933],
     [0.021641, -0.015874, 0.040531], [-0.101984, -0.070160, -0.028855],
     [0.033207, -0.021068, 0.002663], [-0.104711, 0.121673, 0.102981],
     [0.082647, -0.004991, 0.057237], [-0.027375, 0.031581, 0.006868],
     [-0.045434, 0.029444, 0.019287], [-0.046572, -0.012537, 0.006675],
     [0.074709, 0.033690, 0.025289], [-0.008251, -0.002745, -0.006999],
     [0.012685, -0.061856, -0.048658], [0.042304, -0.007039, 0.000295],
     [-0.007644, -0.060843, -0.033142], [0.159909, 0.045628, 0.367541],
     [0.095171, 0.086438, 0.010271], [0.006812, 0.019643, 0.029637],
     [0.003467, -0.010705, 0.014252], [-0.099681, -0.066272, -0.006243],
     [0.047357, 0.037040, 0.000185], [-0.041797, -0.089225, -0.032257],
     [0.008928, 0.017028, 0.018684], [-0.042255, 0.016045, 0.006849],
     [0.011268, 0.036462, 0.037387], [0.011553, -0.016375, -0.048589],
     [0.046266, -0.027189, 0.056979], [0.009640, -0.017576, 0.030324],
     [-0.045794, -0.036083, -0.010616], [0.022418, 0.039783, -0.032939],
     [-0.052714, -0.015525, 0.007438], [0.193004, 0.223541, 0.264175],
     [-0.059406, -0.008188, 0.022867], [-0.156742, -0.263791, -0.007385],
     [-0.015717, 0.016570, 0.033969], [0.037969, 0.109835, 0.200449],
     [-0.000782, -0.009566, -0.008058], [0.010709, 0.052960, -0.044195],
     [0.017271, 0.045839, 0.034569], [0.009424, 0.013088, -0.001714],
     [-0.024805, -0.059378, -0.033756], [-0.078293, 0.029070, 0.026129]],
    [0.013160, -0.096492, -0.071323],
)  # fmt: skip

#: Latent format (a family's :attr:`~sdplan.core.families.declaration.Family.latent_format`)
#: -> ``(P, b)``: the SD 1.x/2.x VAE, SDXL's, the 16-channel FLUX.1 autoencoder (also
#: Chroma's and Z-Image's), SD3's, FLUX.2's 32-channel one, Wan 2.1's (Qwen-Image's) and Wan 2.2's 48-channel one.
PROJECTIONS: dict[str, tuple[list[list[float]], list[float]]] = {
    "sd_vae": _SD,
    "sdxl_vae": _SDXL,
    "flux_ae": _FLUX,
    "sd3_ae": _SD3,
    "flux2_ae": _FLUX2,
    "wan21_vae": _WAN21,
    "wan22_vae": _WAN22,
}


def _format(name: str) -> str:
    """A latent format name, or the format of the family called ``name`` (``sd1``...)."""
    if name in PROJECTIONS:
        return name
    fam = registry_family(name)
    return fam.latent_format if fam is not None else name


def projection(family: str, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """``(P, b)``: float32 ``(channels, 3)`` matrix and ``(3,)`` bias for a latent format
    (:data:`PROJECTIONS`) or a family's name (its format).

    Raises:
        SdplanError: unknown format or family, or a format whose latents do not have
            ``channels``.
    """
    fmt = _format(family)
    if fmt not in PROJECTIONS:
        raise SdplanError(
            f"preview: unknown model family {family!r} (known: {sorted(PROJECTIONS)})"
        )
    proj, bias = PROJECTIONS[fmt]
    if len(proj) != channels:
        raise SdplanError(
            f"preview: {family} latents have {len(proj)} channels, this latent has {channels}"
        )
    return np.asarray(proj, np.float32), np.asarray(bias, np.float32)


def latent_to_rgb(latent: np.ndarray, family: str, scale: int = 1) -> np.ndarray:
    """Project a latent to an RGB preview image.

    Args:
        latent: float array ``(C, H, W)`` or ``(1, C, H, W)``; C = 4 for sd1/sd2/sdxl,
            16 for flux/sd3, 32 for flux2 (unpatchified). A 3-channel latent is taken as RGB
            already.
        family: a latent format of :data:`PROJECTIONS` (``sd_vae``, ``flux_ae``...) or a
            family's name (``sd1``, ``sdxl``, ``flux``, ``sd3``...: its format).
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
