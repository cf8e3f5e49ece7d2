"""Wan's model files checked against each other from their headers, before anything loads
(the registry's :attr:`~sdplan.core.families.declaration.Family.file_check`): the autoencoder
of the DiT's latent channels (16: Wan 2.1's, for Wan 2.1 and the Wan 2.2 A14B experts; 48:
Wan 2.2's, for TI2V-5B), and a high-noise expert of the low-noise one's layout. The pipeline
checks the same when it loads (:class:`~sdplan.core.pipelines.wan.pipeline.WanPipeline`); here
a mismatch is one line naming the flag and the file before the plan is printed or the engine
started.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sdplan.core.errors import ModelFileError
from sdplan.core.models.base import ModelLayoutError

__all__ = ["check_files", "latent_channels"]

#: A Wan 2.2 I2V DiT's inputs: the noise (16), the picture's mask (4) and its latent (16).
I2V_INPUTS = 36


def latent_channels(in_channels: int) -> int:
    """The latent channels of a Wan DiT with ``in_channels`` inputs (an image-to-video DiT's
    36 carry 16 of noise, then the mask and the picture's latent)."""
    return 16 if in_channels == I2V_INPUTS else in_channels


def check_files(files: Mapping[str, Sequence[str]]) -> None:
    """Refuse Wan files that do not fit together (module docstring); files that are not
    Wan's, or that the pipeline's own checks cover (the encoder), pass here.

    Raises:
        ModelFileError: naming the file and its flag, e.g. ``"--vae FILE: the Wan 2.2
            autoencoder (48 latent channels) does not fit this DiT's 16 latent channels
            (Wan 2.1 and Wan 2.2 A14B take the Wan 2.1 autoencoder)"``.
    """
    from sdplan.core.modelfiles.readers import read_tensor_file
    from sdplan.core.models.wan import WanConfig, head_dim_of, wan_config
    from sdplan.core.pipelines.wan.autoencoder import wan_autoencoder

    def shapes(path: str) -> dict[str, tuple[int, ...]]:
        return {t.name: tuple(t.shape) for t in read_tensor_file(path).tensors}

    def config(path: str) -> WanConfig:
        return wan_config(shapes(path), head_dim_of(read_tensor_file(path).metadata))

    dit_path = next(iter(files.get("diffusion_model") or ()), None)
    if dit_path is None:
        return
    try:
        dit = config(dit_path)
    except ModelLayoutError:
        return  # not a Wan DiT file: the family's detection and the pipeline say what it is
    for high_path in files.get("high_noise_diffusion_model") or ():
        try:
            high = config(high_path)
        except ModelLayoutError as exc:
            raise ModelFileError(high_path, f"--high-noise-diffusion-model is not a Wan DiT ({exc})") from None
        if (high.in_channels, high.width, high.n_blocks) != (dit.in_channels, dit.width, dit.n_blocks):
            raise ModelFileError(high_path, f"--high-noise-diffusion-model: its layout ({high.in_channels} inputs, "
                                 f"width {high.width}, {high.n_blocks} blocks) is not the --diffusion-model's "
                                 f"({dit.in_channels} inputs, width {dit.width}, {dit.n_blocks} blocks); the two "
                                 "experts of Wan 2.2 A14B share one layout")
    latent = latent_channels(dit.in_channels)
    for vae_path in files.get("vae") or ():
        try:
            ae = wan_autoencoder(shapes(vae_path))
        except ModelLayoutError:
            continue  # not a Wan autoencoder: the file-role check and the pipeline name it
        if ae.z != latent:
            want = ("Wan 2.2 TI2V-5B takes the Wan 2.2 autoencoder" if latent == 48 else
                    "Wan 2.1 and Wan 2.2 A14B take the Wan 2.1 autoencoder")
            raise ModelFileError(vae_path, f"--vae: the {ae.name} autoencoder ({ae.z} latent channels) does not "
                                 f"fit this DiT's {latent} latent channels ({want})")
