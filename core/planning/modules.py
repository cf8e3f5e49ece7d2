"""The vocabulary every stage shares: modules, encoders, model-file flags and units.

A *module* (spec section 1) is what the user places on a device; an *encoder* is one part
of the ``te`` module; a *model-file flag* is how sd-cli is told where a module's weights
are. This is the one definition of each; planning, model files, pipelines, the CLI and the
app import it from here.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bytes in one GiB (2^30). Code and JSON speak bytes; people read GiB.
GIB = 1 << 30

#: The canonical module names in their fixed order (spec section 1).
MODULES: tuple[str, ...] = (
    "diffusion", "te", "clip_vision", "vae", "controlnet", "photomaker", "upscaler", "detector",
)
#: Every module a placement names: :data:`MODULES` and the newest sd-cli's ``audio_encoder``
#: (spec section 14.8: a single-device module like ``clip_vision``), written after them.
PLACED_MODULES: tuple[str, ...] = (*MODULES, "audio_encoder")
#: Modules that may run on several devices (layer split; spec section 8).
SPLITTABLE: tuple[str, ...] = ("diffusion", "te")
#: Text encoders of ``te``: CLIP ViT-L, OpenCLIP ViT-bigG, OpenCLIP ViT-H (SD 2.x), T5-XXL,
#: a decoder-only language model (Qwen, Mistral, ...), and the vision tower of such a model
#: (Qwen2.5-VL's, sd-cli's ``--llm_vision`` part: reference pictures; never split).
ENCODERS: tuple[str, ...] = ("clip_l", "clip_g", "clip_h", "t5xxl", "llm", "llm_vision")


@dataclass(frozen=True)
class ModelFileFlag:
    """One of sd-cli's model-file flags.

    Attributes:
        key: the flag with ``-`` written ``_`` and no dashes (``diffusion_model``).
        spellings: sd-cli's spellings, the written one first (``("--model", "-m")``).
        module: the module whose tensors the file holds, or None for a whole checkpoint.
        encoder: for ``te`` files, the encoder it holds; else None.
        role: ``main``, ``preview`` for a tiny autoencoder (``--taesd``), or ``high_noise``
            for the high-noise expert of a two-stage diffusion model (Wan 2.2 A14B's
            ``--high-noise-diffusion-model``: the ``diffusion`` module's first phase).
    """

    key: str
    spellings: tuple[str, ...]
    module: str | None
    encoder: str | None = None
    role: str = "main"


#: sd-cli's model-file flags in written order.
MODEL_FILE_FLAGS: tuple[ModelFileFlag, ...] = (
    ModelFileFlag("model", ("--model", "-m"), None),
    ModelFileFlag("diffusion_model", ("--diffusion-model",), "diffusion"),
    ModelFileFlag("high_noise_diffusion_model", ("--high-noise-diffusion-model",), "diffusion",
                  None, "high_noise"),
    ModelFileFlag("clip_l", ("--clip_l",), "te", "clip_l"),
    ModelFileFlag("clip_g", ("--clip_g",), "te", "clip_g"),
    ModelFileFlag("t5xxl", ("--t5xxl",), "te", "t5xxl"),
    ModelFileFlag("llm", ("--llm",), "te", "llm"),
    ModelFileFlag("vae", ("--vae",), "vae"),
    ModelFileFlag("taesd", ("--taesd",), "vae", None, "preview"),
    ModelFileFlag("control_net", ("--control-net",), "controlnet"),
    ModelFileFlag("upscale_model", ("--upscale-model",), "upscaler"),
    ModelFileFlag("photo_maker", ("--photo-maker",), "photomaker"),
    ModelFileFlag("clip_vision", ("--clip_vision",), "clip_vision"),
)
#: Model-file key -> sd-cli spellings (the written one first), in written order.
MODEL_FLAGS: dict[str, tuple[str, ...]] = {f.key: f.spellings for f in MODEL_FILE_FLAGS}
#: Model-file key -> (module, encoder, role).
FLAG_TARGETS: dict[str, tuple[str | None, str | None, str]] = {
    f.key: (f.module, f.encoder, f.role) for f in MODEL_FILE_FLAGS}


def flag_for(module: str, encoder: str | None = None, role: str = "main") -> str:
    """The model-file key of a file holding only ``module`` (``encoder`` for ``te``; role
    ``preview`` for a tiny autoencoder), or ``model`` when no single flag names it."""
    for f in MODEL_FILE_FLAGS:
        if f.module == module and f.role == role and (module != "te" or f.encoder == encoder):
            return f.key
    return "model"
