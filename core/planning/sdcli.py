"""The sd-cli command line: write one for a placement, and read a pasted one back.

:func:`sdcli_argv` is the one pure function that turns model files, a placement and
generation settings into sd-cli's argument list (fixed order: model flags, placement flags,
generation flags). :func:`import_sdcli_command` parses a pasted command (``shlex``) into the
same three parts plus the arguments sdplan does not know.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sdplan.core.errors import PlanError
from sdplan.core.planning.modules import MODEL_FLAGS
from sdplan.core.planning.placement import Placement, scan_placement_args, split_flag

#: Generation keys in written order -> (flags, value type).
GENERATION_FLAGS: dict[str, tuple[tuple[str, ...], type]] = {
    "prompt": (("--prompt", "-p"), str),
    "negative_prompt": (("--negative-prompt", "-n"), str),
    "width": (("--width", "-W"), int),
    "height": (("--height", "-H"), int),
    "steps": (("--steps",), int),
    "cfg_scale": (("--cfg-scale",), float),
    "seed": (("--seed", "-s"), int),
    "sampling_method": (("--sampling-method",), str),
    "scheduler": (("--scheduler",), str),
    "batch_count": (("--batch-count", "-b"), int),
    "output": (("--output", "-o"), str),
    "clip_skip": (("--clip-skip",), int),
    "guidance": (("--guidance",), float),
}
#: LoRA and picture-input flags, written after the generation flags above.
INPUT_FLAGS: dict[str, tuple[tuple[str, ...], type]] = {
    "lora_model_dir": (("--lora-model-dir",), str),
    "lora_apply_mode": (("--lora-apply-mode",), str),
    "init_img": (("--init-img", "-i"), str),
    "mask": (("--mask",), str),
    "strength": (("--strength",), float),
}
GENERATION_FLAGS.update(INPUT_FLAGS)
BINARY_NAMES = frozenset({"sd-cli", "sd", "sd-cli.exe", "sd.exe"})

_MODEL_BY_FLAG = {f: k for k, flags in MODEL_FLAGS.items() for f in flags}
_GEN_BY_FLAG = {f: k for k, (flags, _) in GENERATION_FLAGS.items() for f in flags}


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        raise TypeError(f"not a number or text: {value!r}")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def sdcli_argv(placement: Placement, model_files: Mapping[str, str | Sequence[str]],
               generation: Mapping[str, object]) -> list[str]:
    """sd-cli's arguments (without the program name) for a placement.

    Order: model flags in :data:`MODEL_FLAGS` order (a list value repeats its flag), then
    ``--backend``, ``--params-backend``, ``--max-vram`` (canonical strings, omitted when
    empty), ``--rpc-servers`` (joined with ``,``), ``--stream-layers``, then generation flags
    in :data:`GENERATION_FLAGS` order (long spellings; whole floats written as integers).

    Raises:
        ValueError: a key of ``model_files`` or ``generation`` that sd-cli has no flag for.
    """
    argv: list[str] = []
    for key in model_files:
        if key not in MODEL_FLAGS:
            raise ValueError(f"unknown model file key {key!r} (known: {', '.join(MODEL_FLAGS)})")
    for key in generation:
        if key not in GENERATION_FLAGS:
            raise ValueError(f"unknown generation key {key!r} "
                             f"(known: {', '.join(GENERATION_FLAGS)})")
    for key, flags in MODEL_FLAGS.items():
        value = model_files.get(key)
        if value is None:
            continue
        for path in [value] if isinstance(value, str) else list(value):
            argv += [flags[0], str(path)]
    strings = placement.to_strings()
    for flag, key in (("--backend", "backend"), ("--params-backend", "params_backend"),
                      ("--max-vram", "max_vram")):
        if strings[key]:
            argv += [flag, strings[key]]
    if placement.rpc_servers:
        argv += ["--rpc-servers", ",".join(placement.rpc_servers)]
    if placement.stream_layers:
        argv.append("--stream-layers")
    for key, (flags, _) in GENERATION_FLAGS.items():
        if generation.get(key) is not None:
            argv += [flags[0], _fmt(generation[key])]
    return argv


def sdcli_command_line(placement: Placement, model_files: Mapping[str, str | Sequence[str]],
                       generation: Mapping[str, object], program: str = "sd-cli",
                       extra: Sequence[str] = ()) -> str:
    """:func:`sdcli_argv` as one shell-quoted line starting with ``program``, then ``extra``
    (flags the model files call for, e.g. :func:`model_file_flags`)."""
    return shlex.join([program, *sdcli_argv(placement, model_files, generation), *extra])


def model_file_flags(metadata: Sequence[Mapping[str, str]], family: str) -> list[str]:
    """sd-cli flags a model's own files call for, from their metadata.

    sd-cli takes a UNet's prediction type from its family (eps for SD 1.x); a file whose
    ``sdplan.prediction`` metadata says otherwise (sdplan's demo model is an SD 1.x-layout
    v-prediction model) needs ``--prediction v``. ``family`` is the detected architecture
    family (``sd1``, ``sd2``...).
    """
    default = {"sd1": "eps", "sd2": "v"}.get(family)
    said = {m.get("sdplan.prediction") for m in metadata} - {None}
    if default and len(said) == 1:
        prediction = said.pop()
        if prediction in ("eps", "v") and prediction != default:
            return ["--prediction", prediction]
    return []


@dataclass(frozen=True)
class ImportedCommand:
    """A pasted sd-cli command split into what sdplan understands.

    Attributes:
        model_files: model key (:data:`MODEL_FLAGS`) -> path (a list when repeated).
        placement: the placement its flags describe.
        generation: generation key (:data:`GENERATION_FLAGS`) -> typed value.
        unknown_args: arguments sdplan does not know, in order (a flag and, when the next
            argument does not start with ``-``, its value).
    """

    model_files: dict[str, str | list[str]]
    placement: Placement
    generation: dict[str, object] = field(default_factory=dict)
    unknown_args: list[str] = field(default_factory=list)


def import_sdcli_command(text: str) -> ImportedCommand:
    """Parse a pasted sd-cli command line (``shlex``; backslash-newline continuations allowed;
    a leading ``sd-cli``/``sd``/path to the binary is skipped).

    Raises:
        PlanError: ``invalid_assignment`` for unbalanced quotes, a flag missing its value or a
            generation value of the wrong type (naming the flag); placement errors as
            :meth:`Placement.from_strings`.
    """
    try:
        args = shlex.split(text.replace("\\\r\n", " ").replace("\\\n", " "))
    except ValueError as exc:
        raise PlanError("invalid_assignment", f"cannot read the command line: {exc}") from None
    if args and not args[0].startswith("-") and (
            os.path.basename(args[0]).lower() in BINARY_NAMES or "/" in args[0]
            or "\\" in args[0]):
        args = args[1:]
    placement, rest = scan_placement_args(args)
    model_files: dict[str, str | list[str]] = {}
    generation: dict[str, object] = {}
    unknown: list[str] = []
    i = 0
    while i < len(rest):
        flag, inline = split_flag(rest[i])
        key = _MODEL_BY_FLAG.get(flag) or _GEN_BY_FLAG.get(flag)
        if key is None:
            unknown.append(rest[i])
            if inline is None and i + 1 < len(rest) and not rest[i + 1].startswith("-"):
                unknown.append(rest[i + 1])
                i += 1
            i += 1
            continue
        if inline is None:
            if i + 1 >= len(rest):
                raise PlanError("invalid_assignment", f"{flag} needs a value", flag=flag)
            inline = rest[i + 1]
            i += 1
        i += 1
        if flag in _MODEL_BY_FLAG:
            old = model_files.get(key)
            if old is None:
                model_files[key] = inline
            else:
                model_files[key] = [*([old] if isinstance(old, str) else old), inline]
            continue
        typ = GENERATION_FLAGS[key][1]
        try:
            generation[key] = typ(inline)
        except ValueError:
            raise PlanError("invalid_assignment", f"{flag}: {inline!r} is not "
                            f"{'an integer' if typ is int else 'a number'}", flag=flag) from None
    return ImportedCommand(model_files, placement, generation, unknown)
