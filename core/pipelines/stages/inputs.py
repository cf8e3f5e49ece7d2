"""A generation's LoRAs planned before anything loads: the command line and the app read the
prompt's tags, find and map each file onto the model's names (headers only), pick the apply
mode for the plan, and hand the estimate the bytes at-runtime LoRAs keep on each device.
The engine job repeats the tag reading on its side (:func:`sdplan.core.pipelines.stages.lora.prompt_loras`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the LoRA readers (numpy) load only for a prompt with LoRA tags
    from sdplan.core.pipelines.stages.lora import AppliedLora
    from sdplan.core.planning.adapters import LoraProfile

__all__ = ["PlannedLoras", "plan_loras"]


@dataclass
class PlannedLoras:
    """The LoRAs of one generation: ``prompt`` without its tags, the ``loras``, the ``mode``
    in use (None without LoRAs) and, for ``at_runtime``, the per-module bytes
    (``profiles``) :func:`~sdplan.core.planning.estimate.estimate_plan` takes."""

    prompt: str
    loras: list[AppliedLora] = field(default_factory=list)
    mode: str | None = None
    profiles: dict[str, LoraProfile] = field(default_factory=dict)

    def unknown(self) -> list[str]:
        """Keys of the files that patch nothing, ``file: key - reason``."""
        return [f"{Path(a.file.path).name}: {u}" for a in self.loras for u in a.file.unknown]

    def summary(self) -> str:
        """One line: ``name x weight`` of each LoRA and the mode (empty without LoRAs)."""
        if not self.loras:
            return ""
        names = ", ".join(f"{a.name} x {a.weight:g}" for a in self.loras)
        return f"LoRA {names} ({self.mode})"


def plan_loras(prompt: str, lora_dir: str | Path | None, requested: str,
               model_files: Mapping[str, Sequence[str | Path]], plan: object) -> PlannedLoras:
    """Read ``prompt``'s LoRA tags against the model ``model_files`` name (sd-cli flag keys;
    ``taesd``/``upscale_model`` ignored) under ``plan``.

    Raises:
        PromptError / SdplanError / ModelFileError: a bad tag, a missing LoRA file, a file
        that patches nothing of this model, an unknown mode; InvalidArgument: LoRAs for a
        family whose pipeline takes none (its registry entry).
    """
    if "<lora:" not in prompt:
        return PlannedLoras(prompt)
    from sdplan.core.errors import InvalidArgument
    from sdplan.core.families import family as registry_family
    from sdplan.core.families.options import LORA, OPTIONS
    from sdplan.core.modelfiles.checkpoint import read_model_files
    from sdplan.core.modelfiles.lora import lora_profiles, model_aliases, quantized
    from sdplan.core.pipelines.stages.lora import prompt_loras
    from sdplan.core.planning.adapters import plan_lora_mode

    core = {k: list(v) for k, v in model_files.items() if k not in ("taesd", "upscale_model")}
    ms = read_model_files(core)
    fam = registry_family(ms.architecture.family)
    if fam is not None and not fam.honours(LORA):
        raise InvalidArgument(f"{OPTIONS[LORA]}: {fam.title} does not take it in sdplan; remove it")
    text, loras = prompt_loras(prompt, lora_dir, model_aliases(ms))
    if not loras:
        return PlannedLoras(text)
    mode = plan_lora_mode(requested, plan, quantized(ms))
    profiles = lora_profiles([a.file for a in loras], ms) if mode == "at_runtime" else {}
    return PlannedLoras(text, loras, mode, profiles)
