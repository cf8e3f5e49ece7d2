"""What a session holds, as a value: :class:`SessionState` (a snapshot that an undo step
restores whole), and the generation settings a session starts from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sdplan.core.families import generation_defaults
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.profile import Profile

#: Generation settings that the estimate and the sd-cli command use before any model is open
#: (sd-cli request keys; pixels for the size).
DEFAULT_GENERATION: dict[str, object] = {"width": 1024, "height": 1024, "steps": 20,
                                         "cfg_scale": 1.0, "seed": 42, "batch_count": 1}

#: sd-cli's own defaults for a run that names no setting (``examples/cli/main.cpp`` of
#: stable-diffusion.cpp: 512x512, 20 steps, CFG 7, euler_a, seed 42, one picture); a family's
#: declared defaults replace them (:func:`sdplan.core.families.generation_defaults`).
SDCLI_DEFAULTS: dict[str, object] = {"width": 512, "height": 512, "steps": 20, "cfg_scale": 7.0,
                                     "sampling_method": "euler_a", "scheduler": "default",
                                     "seed": 42, "batch_count": 1}


def sdcli_defaults(architecture: str | None) -> dict[str, object]:
    """The settings sd-cli runs ``architecture`` (``sd1``, ``flux-dev``... or None: unknown)
    with when its command names none: :data:`SDCLI_DEFAULTS` under the family's own (a new
    dict each call)."""
    return {**SDCLI_DEFAULTS, **generation_defaults(architecture)}


@dataclass(frozen=True)
class SessionState:
    """Everything a paste, a picture or a saved plan can change, as one value.

    Attributes:
        placement: the placement the plan resolves from.
        model_files: sd-cli model-file key -> paths.
        profile: the model profile planned with (None: sizes unknown).
        model_file_flags: sd-cli flags the files call for (``--prediction v``).
        size_multiple: pixels each image side must be a multiple of (None: unknown).
        generation: generation settings by sd-cli's request keys.
        generation_text: the text each pasted generation value was read from.
        kept_args: a pasted command's arguments written back verbatim.
        extra_modules: modules added to the board by hand.
        missing_files: model files named (a pasted command's) that are not on this machine.
        profile_source: where the sizes come from when the files are not here (``built-in
            profile NAME``), or None.
    """

    placement: Placement
    model_files: dict[str, list[str]] = field(default_factory=dict)
    profile: Profile | None = None
    model_file_flags: tuple[str, ...] = ()
    size_multiple: int | None = None
    generation: dict[str, Any] = field(default_factory=dict)
    generation_text: dict[str, str] = field(default_factory=dict)
    kept_args: tuple[str, ...] = ()
    extra_modules: tuple[str, ...] = ()
    missing_files: tuple[str, ...] = ()
    profile_source: str | None = None
