"""The sd-cli command line: write one for a placement, and read a pasted one back.

:func:`sdcli_argv` is the one pure function that turns model files, a placement, generation
settings and the arguments sdplan keeps without understanding into sd-cli's argument list.
Fixed order: model flags, placement flags (canonical), generation flags, then the kept
arguments in the order they were pasted, so writing, reading and writing again gives the
same line.

:func:`import_sdcli_command` reads a pasted command: the text is split the way its shell
splits it (:mod:`sdplan.core.planning.cmdline`: POSIX, cmd.exe, PowerShell, one argument per
line), then every argument is matched against sd-cli's own argument table
(:mod:`sdplan.core.planning.sdcli_table`), so a flag takes exactly the values sd-cli gives
it. Model files, placement flags and the generation settings sdplan knows are taken apart;
every other sd-cli option is kept verbatim (``kept``), and arguments sd-cli itself would not
accept are kept too and reported (``unknown``).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sdplan.core.errors import PlanError
from sdplan.core.families import family_of
from sdplan.core.planning.cmdline import split_command_line, strip_program
from sdplan.core.planning.estimate import RuntimeFlags
from sdplan.core.planning.modules import MODEL_FLAGS, MODULES
from sdplan.core.planning.placement import (
    PLACEMENT_SWITCHES,
    PLACEMENT_VALUE_FLAGS,
    Placement,
    auto_fit_value,
    scan_placement_args,
)
from sdplan.core.planning.sdcli_table import ALIASES, option
from sdplan.core.planning.sdcli_write import placement_argv
from sdplan.core.planning.target import dialect_of_args, flag_in_dialect
from sdplan.core.planning.vae_tiling import (
    VaeTiling,
    convert_tile_size,
    parse_overlap,
    parse_relative_size,
    parse_tile_size,
)

__all__ = ["GENERATION_FLAGS", "Argument", "ImportedCommand", "sdcli_argv",
           "sdcli_command_line", "model_file_flags", "import_sdcli_command", "parse_sdcli_args",
           "merge_flags", "picture_command", "SDCLI_DEFAULTS"]

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
    "slg_scale": (("--slg-scale",), float),
    "skip_layers": (("--skip-layers",), str),
    "skip_layer_start": (("--skip-layer-start",), float),
    "skip_layer_end": (("--skip-layer-end",), float),
    "eta": (("--eta",), float),
    "sigmas": (("--sigmas",), str),
    "flow_shift": (("--flow-shift",), float),
    "timestep_shift": (("--timestep-shift",), int),
    "rng": (("--rng",), str),
    "sampler_rng": (("--sampler-rng",), str),
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

_MODEL_BY_FLAG = {f: k for k, flags in MODEL_FLAGS.items() for f in flags}
_GEN_BY_FLAG = {f: k for k, (flags, _) in GENERATION_FLAGS.items() for f in flags}
_PLACEMENT = frozenset(PLACEMENT_VALUE_FLAGS) | frozenset(PLACEMENT_SWITCHES)
#: The newest sd-cli's model-file flags that feed a module without holding its weights
#: (spec section 14.8) -> the module they feed.
COMPANION_FLAGS = {"--tokenizer": "te", "--llm_vision": "te", "--embeddings-connectors": "te"}


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        raise TypeError(f"not a number or text: {value!r}")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _typed(key: str, text: str, flag: str) -> object:
    typ = GENERATION_FLAGS[key][1]
    try:
        return typ(text)
    except ValueError:
        raise PlanError("invalid_assignment", f"{flag}: {text!r} is not "
                        f"{'an integer' if typ is int else 'a number'}", flag=flag) from None


def sdcli_argv(placement: Placement, model_files: Mapping[str, str | Sequence[str]],
               generation: Mapping[str, object], kept: Sequence[str] = (),
               raw: Mapping[str, str] | None = None, dialect: str | None = None) -> list[str]:
    """sd-cli's arguments (without the program name) for a placement.

    Order: model flags in :data:`MODEL_FLAGS` order (a list value repeats its flag), then
    the placement flags of :func:`~sdplan.core.planning.sdcli_write.placement_argv`
    (canonical strings, omitted when empty), then generation flags in
    :data:`GENERATION_FLAGS` order (long spellings; whole floats written as integers unless
    ``raw`` holds the text the value was read from), then ``kept`` as given.

    Args:
        raw: generation key -> the text a pasted command gave; written instead of the value
            when it still reads as that value (a pasted ``--cfg-scale 7.0`` stays ``7.0``).
        dialect: ``snapshot`` or ``newest``: write the placement flags as that sd-cli spells
            them (spec section 14); None: as the placement holds them. ``kept`` is written
            as given (:func:`kept_for_dialect` filters it).

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
    argv += placement_argv(placement, dialect)
    for key, (flags, _) in GENERATION_FLAGS.items():
        setting = generation.get(key)
        if setting is None:
            continue
        text = (raw or {}).get(key)
        if text is None or not _same(key, text, setting):
            text = _fmt(setting)
        argv += [flags[0], text]
    return argv + list(kept)


def _same(key: str, text: str, value: object) -> bool:
    try:
        return GENERATION_FLAGS[key][1](text) == value
    except ValueError:
        return False


def sdcli_command_line(placement: Placement, model_files: Mapping[str, str | Sequence[str]],
                       generation: Mapping[str, object], program: str = "sd-cli",
                       extra: Sequence[str] = (), raw: Mapping[str, str] | None = None,
                       dialect: str | None = None) -> str:
    """:func:`sdcli_argv` as one shell-quoted line starting with ``program``, then ``extra``
    (kept arguments of a pasted command and flags the model files call for, e.g.
    :func:`model_file_flags`; merge them with :func:`merge_flags`)."""
    return shlex.join([program, *sdcli_argv(placement, model_files, generation, extra, raw,
                                            dialect)])


def convert_kept_tiles(kept: Sequence[str], from_dialect: str, to_dialect: str, scale: int
                       ) -> list[str]:
    """``kept`` with every ``--vae-tile-size`` value converted from ``from_dialect``'s units
    to ``to_dialect``'s (:func:`~sdplan.core.planning.vae_tiling.convert_tile_size`), the
    rest as written.

    Raises:
        PlanError: ``invalid_vae_tiling`` for a malformed tile size.
    """
    out: list[str] = []
    for a in parse_sdcli_args(list(kept)):
        if a.flag == "--vae-tile-size" and a.values:
            out += [a.spelling, convert_tile_size(a.values[0], from_dialect, to_dialect, scale)]
        else:
            out += a.tokens
    return out


def kept_for_dialect(kept: Sequence[str], dialect: str) -> tuple[list[str], list[str]]:
    """``kept`` arguments split into those sd-cli in ``dialect`` has and those it lacks
    (:func:`~sdplan.core.planning.target.flag_in_dialect`; arguments that are no sd-cli
    option stay kept), each in order as written tokens."""
    out: list[str] = []
    dropped: list[str] = []
    for a in parse_sdcli_args(list(kept)):
        (out if not a.known or flag_in_dialect(a.flag, dialect) else dropped).extend(a.tokens)
    return out, dropped


def merge_flags(kept: Sequence[str], implied: Sequence[str]) -> list[str]:
    """``kept`` arguments followed by the ``implied`` ones whose flag ``kept`` does not
    already give (a pasted ``--prediction eps`` wins over the files' ``--prediction v``)."""
    given = {a.flag for a in parse_sdcli_args(list(kept))}
    out = list(kept)
    for arg in parse_sdcli_args(list(implied)):
        if arg.flag not in given:
            out += arg.tokens
    return out


def model_file_flags(metadata: Sequence[Mapping[str, str]], family: str) -> list[str]:
    """sd-cli flags a model's own files call for, from their metadata.

    sd-cli takes a UNet's prediction type from its family (eps for SD 1.x); a file whose
    ``sdplan.prediction`` metadata says otherwise (sdplan's demo model is an SD 1.x-layout
    v-prediction model) needs ``--prediction v``. ``family`` is the detected architecture
    family (``sd1``, ``sd2``...); its default prediction is the registry's
    (:attr:`sdplan.core.families.declaration.Family.prediction`).
    """
    fam = family_of(family)
    default = fam.prediction if fam is not None else None
    said = {m.get("sdplan.prediction") for m in metadata} - {None}
    if default and len(said) == 1:
        prediction = said.pop()
        if prediction in ("eps", "v") and prediction != default:
            return ["--prediction", prediction]
    return []


#: sd-cli's own values of generation settings, left out of a picture's command when the picture
#: has them (stable-diffusion.cpp ``examples/common/common.h``, ``sd_sample_params_init`` and
#: ``sd_img_gen_params_init``: batch 1, distilled guidance 3.5, SLG off with layers [7,8,9] from
#: 0.01 to 0.2, no timestep shift, the CUDA RNG, the default scheduler, no negative prompt).
SDCLI_DEFAULTS: dict[str, object] = {
    "negative_prompt": "", "scheduler": "default", "batch_count": 1, "guidance": 3.5,
    "slg_scale": 0.0, "skip_layers": "[7,8,9]", "skip_layer_start": 0.01, "skip_layer_end": 0.2,
    "timestep_shift": 0, "rng": "cuda",
}
#: A ``<lora:NAME:WEIGHT>`` prompt tag (the pattern of :mod:`sdplan.core.text.lora_tags`).
_LORA_TAG = re.compile(r"<lora:[^:>]+:[^>]+>")
_LORA_KEYS = ("lora_model_dir", "lora_apply_mode")
_PICTURE_KEYS = ("init_img", "mask", "strength")


def _is_default(key: str, value: object) -> bool:
    if key == "clip_skip":  # sd-cli: <= 0 leaves the layer to the model
        return isinstance(value, (int, float)) and value <= 0
    if key not in SDCLI_DEFAULTS:
        return False
    default = SDCLI_DEFAULTS[key]
    if key == "skip_layers":
        return "".join(str(value).split()) == default
    return bool(value == default)


def picture_command(model_files: Mapping[str, str | Sequence[str]], placement: Mapping[str, str],
                    settings: Mapping[str, object], file_flags: Sequence[str] = (),
                    program: str = "sd-cli") -> str:
    """The sd-cli command that makes a picture again, from what the picture records: the
    one writer of ``sdplan generate``'s recorded command and the gallery's copied one.

    Written: the model-file flags, the placement flags (from the recorded ``backend``,
    ``params_backend``, ``max_vram``, ``split_mode``, ``rpc_servers`` strings), the generation
    settings of :data:`GENERATION_FLAGS` except ``output`` and those equal to sd-cli's own
    values (:data:`SDCLI_DEFAULTS`; a ``clip_skip`` <= 0), the LoRA flags
    (``--lora-model-dir``, ``--lora-apply-mode``) only when the prompt has a
    ``<lora:NAME:WEIGHT>`` tag, the picture flags (``--init-img``, ``--mask``, ``--strength``)
    only with an init image, ``-r PATH`` per reference picture (``ref_images``, in order),
    then ``file_flags``: the flags the model files call for
    (:func:`model_file_flags`, e.g. ``--prediction v``), where the board's command writes them.

    Args:
        model_files: model-file key (:data:`MODEL_FLAGS`) -> path or paths; unknown keys are
            left out.
        placement: the recorded placement strings (empty ones are left out).
        settings: generation settings by request key (unknown keys are ignored).
        file_flags: sd-cli arguments appended as given.

    Raises:
        PlanError: recorded placement strings that no longer parse (spec errors of
            :meth:`Placement.from_strings`).
    """
    pl = Placement.from_strings(placement.get("backend", ""), placement.get("params_backend", ""),
                                placement.get("max_vram", ""), rpc_servers=placement.get("rpc_servers", ""),
                                split_mode=placement.get("split_mode", ""))
    files = {k: v for k, v in model_files.items() if k in MODEL_FLAGS and v}
    loras = bool(_LORA_TAG.search(str(settings.get("prompt") or "")))
    picture = bool(settings.get("init_img"))
    gen: dict[str, object] = {}
    for key in GENERATION_FLAGS:
        value = settings.get(key)
        if key == "output" or value is None or isinstance(value, bool) or _is_default(key, value):
            continue
        if (key in _LORA_KEYS and not loras) or (key in _PICTURE_KEYS and not picture) or value == "":
            continue
        gen[key] = ",".join(repr(float(v)) for v in value) if isinstance(value, (list, tuple)) else value
    refs = settings.get("ref_images")
    refs = [refs] if isinstance(refs, str) else list(refs) if isinstance(refs, (list, tuple)) else []
    extra = [t for r in refs if r for t in ("-r", str(r))]
    return sdcli_command_line(pl, files, gen, program=program, extra=[*extra, *file_flags])


@dataclass(frozen=True)
class Argument:
    """One argument of a command as sd-cli reads it.

    Attributes:
        spelling: the flag as written (``-p``, ``--tae``, ``--steps=4`` becomes ``--steps``).
        flag: the option's long spelling in sd-cli's table with aliases resolved
            (``--prompt``, ``--taesd``), or ``spelling`` when sd-cli has no such option.
        values: the values it took (none for a switch).
        known: whether sd-cli's table has the option.
        tokens: the argument as written back: ``spelling`` and the values as separate words
            (sd-cli has no ``--flag=value`` form).
    """

    spelling: str
    flag: str
    values: tuple[str, ...] = ()
    known: bool = True

    @property
    def tokens(self) -> list[str]:
        return [self.spelling, *self.values]

    @property
    def kind(self) -> str:
        """``model``, ``placement``, ``generation``, ``kept`` (an sd-cli option sdplan
        keeps without understanding) or ``unknown`` (not an sd-cli option)."""
        if not self.known:
            return "unknown"
        if self.flag in _MODEL_BY_FLAG:
            return "model"
        if self.flag in _PLACEMENT:
            return "placement"
        if self.flag in _GEN_BY_FLAG:
            return "generation"
        return "kept"


def parse_sdcli_args(args: list[str]) -> list[Argument]:
    """Split an argument list (without the program) the way sd-cli does.

    Each argument is looked up in sd-cli's table; an option of arity 1 takes the next
    argument whatever it looks like; ``--auto-fit`` takes the next argument only when it
    is ``on`` or ``off`` (spec section 14.2: both dialects read). ``--flag=value`` of a table option is read as
    ``--flag value`` (sdplan's own commands accept it). An argument that is no option of
    the table becomes an unknown :class:`Argument` that takes the next argument as its value
    when that one does not start with ``-``.

    Raises:
        PlanError: ``invalid_assignment`` for an option missing its value (naming it).
    """
    out: list[Argument] = []
    i = 0
    while i < len(args):
        tok = args[i]
        opt = option(tok)
        inline = None
        spelling = tok
        if opt is None and tok.startswith("--") and "=" in tok:
            head, value = tok.split("=", 1)
            if option(head) is not None and (option(head).values  # type: ignore[union-attr]
                                             or head == "--auto-fit"):
                opt, inline, spelling = option(head), value, head
        if opt is None:
            values: tuple[str, ...] = ()
            if tok.startswith("-") and i + 1 < len(args) and not args[i + 1].startswith("-"):
                values = (args[i + 1],)
                i += 1
            out.append(Argument(tok, tok, values, known=False))
            i += 1
            continue
        flag = ALIASES.get(opt.long, opt.long)
        if flag == "--auto-fit":  # the newest sd-cli's on|off, or the snapshot's switch
            word = inline.strip().lower() if inline is not None else auto_fit_value(args, i)
            if word is not None and word not in ("on", "off"):
                raise PlanError("invalid_assignment", f"--auto-fit takes on or off, not "
                                f"'{inline}'", flag="--auto-fit")
            if inline is None and word is not None:
                i += 1
            out.append(Argument(spelling, flag, (word,) if word is not None else ()))
            i += 1
            continue
        if opt.values == 0:
            out.append(Argument(spelling, flag))
            i += 1
            continue
        if inline is None:
            if i + 1 >= len(args):
                raise PlanError("invalid_assignment", f"{spelling} needs a value", flag=flag)
            inline = args[i + 1]
            i += 1
        out.append(Argument(spelling, flag, (inline,)))
        i += 1
    return out


@dataclass(frozen=True)
class ImportedCommand:
    """A pasted sd-cli command split into what sdplan understands and what it keeps.

    Attributes:
        model_files: model key (:data:`MODEL_FLAGS`) -> path (a list when repeated).
        placement: the placement its flags describe.
        generation: generation key (:data:`GENERATION_FLAGS`) -> typed value.
        kept: sd-cli options sdplan does not use, as written (flag, value) in order; the
            written command carries them unchanged.
        unknown: arguments that are not sd-cli options (sd-cli would refuse them), in order.
        generation_text: generation key -> the text it was read from.
        program: the program as written (``.\\bin\\sd.exe``), or None.
        arguments: every argument, in order (:class:`Argument`).
        dialect: the sd-cli dialect the command's own syntax shows (``snapshot``,
            ``newest``; :func:`~sdplan.core.planning.target.dialect_of_args`), or None.
    """

    model_files: dict[str, str | list[str]]
    placement: Placement
    generation: dict[str, object] = field(default_factory=dict)
    kept: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    generation_text: dict[str, str] = field(default_factory=dict)
    program: str | None = None
    arguments: tuple[Argument, ...] = ()
    dialect: str | None = None

    @property
    def unknown_args(self) -> list[str]:
        """Everything sdplan keeps without understanding: ``kept`` then ``unknown``."""
        return [*self.kept, *self.unknown]

    def runtime_flags(self) -> RuntimeFlags:
        """How this command runs, for its memory estimate
        (:class:`~sdplan.core.planning.estimate.RuntimeFlags`): ``--fa`` (every module) and
        ``--diffusion-fa``, ``--diffusion-conv-direct`` and ``--vae-conv-direct``, ``--mmap``,
        ``--eager-load``."""
        given = {a.flag for a in self.arguments}
        fa: set[str] = set(MODULES) if "--fa" in given else set()
        if "--diffusion-fa" in given:
            fa.add("diffusion")
        direct = {m for flag, m in (("--diffusion-conv-direct", "diffusion"),
                                    ("--vae-conv-direct", "vae")) if flag in given}
        return RuntimeFlags(frozenset(fa), frozenset(direct), "--mmap" in given,
                            "--eager-load" in given)

    def module_files(self) -> dict[str, dict[str, str]]:
        """Files of the newest sd-cli's flags that feed a module without being its weights
        file (spec section 14.8): module -> flag -> path (``--tokenizer``, ``--llm_vision``,
        ``--embeddings-connectors`` feed ``te``). They stay kept arguments, written back
        where they were pasted."""
        out: dict[str, dict[str, str]] = {}
        for a in self.arguments:
            if a.flag in COMPANION_FLAGS and a.values:
                out.setdefault(COMPANION_FLAGS[a.flag], {})[a.flag] = a.values[0]
        return out

    def vae_tiling(self, dialect: str | None, scale: int) -> VaeTiling:
        """The command's VAE tiling in the newest sd-cli's units (spec section 14.7):
        ``--vae-tile-size`` read as ``dialect`` writes it (snapshot: latent pixels, times
        ``scale``), the overlap clamped to 0..0.5.

        Raises:
            PlanError: ``invalid_vae_tiling`` for a malformed value (naming the flag).
        """
        tiling = VaeTiling()
        for a in self.arguments:
            if a.flag == "--vae-tiling":
                tiling = dataclasses.replace(tiling, enabled=True)
            elif a.flag == "--vae-tile-size" and a.values:
                text = convert_tile_size(a.values[0], dialect or "newest", "newest", scale)
                tiling = dataclasses.replace(tiling, tile_px=parse_tile_size(text))
            elif a.flag == "--vae-tile-overlap" and a.values:
                tiling = dataclasses.replace(
                    tiling, overlap=min(max(parse_overlap(a.values[0]), 0.0), 0.5))
            elif a.flag == "--vae-relative-tile-size" and a.values:
                tiling = dataclasses.replace(tiling, relative=parse_relative_size(a.values[0]))
        return tiling

    def extra_args(self) -> list[str]:
        """The kept and unknown arguments in the order they were pasted (what the written
        command appends after sdplan's own flags)."""
        out: list[str] = []
        for a in self.arguments:
            if a.kind in ("kept", "unknown"):
                out += a.tokens
        return out


def import_sdcli_command(text: str, dialect: str | None = None) -> ImportedCommand:
    """Read a pasted sd-cli command line (module docstring); a leading ``sd-cli``/``sd``/
    path to the binary is skipped.

    Args:
        text: the command as pasted (one or several lines).
        dialect: ``posix``, ``windows``, ``powershell`` or ``lines``; default: detected.

    Raises:
        PlanError: ``invalid_assignment`` for unbalanced quotes, a flag missing its value or a
            generation value of the wrong type (naming the flag); placement errors as
            :meth:`Placement.from_strings`.
    """
    program, args = strip_program(split_command_line(text, dialect))
    parsed = parse_sdcli_args(args)
    placement_tokens: list[str] = []
    model_files: dict[str, str | list[str]] = {}
    generation: dict[str, object] = {}
    raw: dict[str, str] = {}
    kept: list[str] = []
    unknown: list[str] = []
    for a in parsed:
        kind = a.kind
        if kind == "placement":
            placement_tokens += [a.flag, *a.values]
        elif kind == "model":
            key = _MODEL_BY_FLAG[a.flag]
            old = model_files.get(key)
            value = a.values[0]
            model_files[key] = value if old is None else [
                *([old] if isinstance(old, str) else old), value]
        elif kind == "generation":
            key = _GEN_BY_FLAG[a.flag]
            generation[key] = _typed(key, a.values[0], a.spelling)
            raw[key] = a.values[0]
        elif kind == "kept":
            kept += a.tokens
        else:
            unknown += a.tokens
    placement, rest = scan_placement_args(placement_tokens)
    assert not rest  # every token passed is a placement flag or its value
    return ImportedCommand(model_files, placement, generation, kept, unknown, raw, program,
                           tuple(parsed), dialect_of_args(args))
