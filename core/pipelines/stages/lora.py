"""LoRAs of a pipeline: from the prompt's tags to patches on every module runner.

:func:`prompt_loras` reads a prompt's ``<lora:NAME:WEIGHT>`` tags
(:func:`sdplan.core.text.lora_tags.extract_lora_tags`), finds each file under the LoRA
folder and maps its keys onto the pipeline's weights (the pipeline's
:meth:`~sdplan.core.pipelines.stages.base.Pipeline.lora_aliases`). :class:`LoraState` keeps a
pipeline's current LoRAs and mode and gives every runner, present or created later (SD's
text encoder is rebuilt when the clip skip changes), its
:class:`~sdplan.core.runtime.lora.ModuleLora`; a request with the same LoRAs changes
nothing, other LoRAs re-read the weights they patched.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdplan.core.errors import SdplanError
from sdplan.core.modelfiles.lora_names import AliasTable
from sdplan.core.runtime.placement import CFG_RUNNER
from sdplan.core.text.lora_tags import extract_lora_tags

if TYPE_CHECKING:  # the LoRA file reader and patches load with a first LoRA
    from sdplan.core.modelfiles.lora import LoraFile

__all__ = ["LoraState", "AppliedLora", "prompt_loras", "apply_request_loras", "QUANTIZED_EXCLUDED"]

log = logging.getLogger(__name__)

#: File dtypes that are not quantized (sd-cli's ``auto`` looks for any other).
QUANTIZED_EXCLUDED = frozenset({"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"})


@dataclass(frozen=True)
class AppliedLora:
    """A LoRA of one request: its tag ``name``, summed ``weight`` and the mapped file."""

    name: str
    weight: float
    file: LoraFile


def prompt_loras(prompt: str, lora_dir: str | Path | None, table: AliasTable) -> tuple[str, list[AppliedLora]]:
    """``(the prompt without its tags, the LoRAs it names)``, each file found under
    ``lora_dir`` (:func:`~sdplan.core.modelfiles.lora.find_lora_file`) and mapped onto the
    model ``table`` describes.

    Raises:
        PromptError: a tag with a bad weight; SdplanError: a missing file;
        ModelFileError: a file that patches nothing of this model.
    """
    text, tags = extract_lora_tags(prompt)
    if not tags:
        return text, []
    from sdplan.core.modelfiles.lora import find_lora_file, read_lora

    out = [AppliedLora(t.name, t.weight, read_lora(find_lora_file(t.name, lora_dir), table)) for t in tags]
    return text, out


def apply_request_loras(pipe: Any, request: Any) -> tuple[str, Any, dict[str, Any]]:
    """Patch ``pipe`` with the LoRAs of a checked request's prompt (none: the previous ones
    are removed) and read its image input: ``(the prompt without its LoRA tags, the
    ImageInput or None, what they applied)``; what applied is the strength and pictures of
    an image input, and with LoRAs their names, weights, the mode in use and their keys that
    patch nothing. A family that takes no LoRA gets the prompt as it is (the request check
    refused its tags already).

    Raises:
        PromptError / SdplanError / ModelFileError: a bad tag, a missing or unfitting LoRA file;
        SdplanError: an unreadable picture.
    """
    from sdplan.core.pipelines.stages.img2img import request_image_input

    prompt, loras, mode = request.prompt, list[AppliedLora](), None
    try:
        table = pipe.lora_aliases()
    except SdplanError:
        table = None
    if table is not None:
        prompt, loras = prompt_loras(request.prompt, request.lora_model_dir, table)
        mode = pipe.set_loras(loras, request.lora_apply_mode or "auto")
    init = request_image_input({"init_img": request.init_img, "mask": request.mask,
                                "strength": request.strength}, int(request.width), int(request.height))
    info: dict[str, Any] = {}
    if init is not None:
        info = {"strength": init.strength, "init_img": request.init_img, "mask": request.mask}
    if loras:
        info.update(loras=pipe.loras.describe(), lora_apply_mode=mode, lora_unknown_keys=pipe.loras.unknown())
    return prompt, init, info


@dataclass
class LoraState:
    """A pipeline's LoRAs (see the module docstring): ``applied`` and the ``mode`` in use
    (``immediately`` or ``at_runtime``; None without LoRAs)."""

    applied: list[AppliedLora] = field(default_factory=list)
    mode: str | None = None
    _key: tuple = ()

    def set(self, loras: Sequence[AppliedLora], requested: str, runners: Mapping[str, Any],
            placements: Mapping[str, Any]) -> str | None:
        """Use ``loras`` with ``requested`` mode (``auto`` chosen by
        :func:`~sdplan.core.runtime.lora.choose_mode` from the runners' file dtypes and the
        ``placements``) on ``runners``; returns the mode in use (None without LoRAs).

        Raises:
            SdplanError: an unknown mode or a patch that does not fit its weight.
        """
        mode = None
        if loras:
            from sdplan.core.runtime.lora import choose_mode

            quantized = any(i.dtype.upper() not in QUANTIZED_EXCLUDED for r in runners.values()
                            for i in r.wf.infos.values())
            split = any(len(p.devices) > 1 for p in placements.values())
            mode = choose_mode(requested, quantized, placements.get("diffusion"), split)
        key = (tuple((a.file.path, a.weight) for a in loras), mode)
        if key == self._key:
            return mode
        self.applied, self.mode, self._key = list(loras), mode, key
        for name, runner in runners.items():  # a parallel-CFG copy is patched as the diffusion model
            self.attach("diffusion" if name == CFG_RUNNER else name, runner)
        return mode

    def attach(self, name: str, runner: Any) -> None:
        """Give ``runner`` (module ``name``) its patches of the current LoRAs (none: clears)."""
        parts = [(a.file, p, a.weight) for a in self.applied for p in a.file.parts if p.target.module == name]
        lora = None
        if parts:
            from sdplan.core.runtime.lora import build_module_lora

            shapes = {n: tuple(i.shape) for n, i in runner.wf.infos.items()}
            lora = build_module_lora(name, parts, shapes, self.mode == "at_runtime")
        if lora is not None or runner.lora is not None:
            runner.set_lora(lora)
            if lora is not None:
                log.info("%s: %d weights patched by LoRA (%s)", name, len(lora.patches), self.mode)

    def unknown(self) -> list[str]:
        """Every key of the applied files that patches nothing, ``file: key - reason``."""
        return [f"{Path(a.file.path).name}: {u}" for a in self.applied for u in a.file.unknown]

    def describe(self) -> list[dict[str, object]]:
        """``[{"name", "weight", "mode", "patched"}]`` of the applied LoRAs."""
        return [{"name": a.name, "weight": a.weight, "mode": self.mode, "patched": len(a.file.parts)}
                for a in self.applied]
