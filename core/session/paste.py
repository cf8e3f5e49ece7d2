"""A pasted sd-cli command, before and as it is applied.

:func:`preview_command` says what a command would bring (each model file found or missing
here, the placement strings, the settings a run would use, the arguments kept verbatim or not
understood, where the model's sizes would come from) without changing anything;
:func:`import_command` applies it to a session as a whole: the command's files, its settings
over sd-cli's defaults for that model (never the previous model's), its placement and kept
arguments. Files that are not on this machine keep their paths for the command; the sizes
then come from the built-in profile their name matches
(:func:`~sdplan.core.planning.builtin_profiles.match_builtin_profile`), or stay unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdplan.core.errors import ModelFileError, SdplanError
from sdplan.core.planning.profile import Profile
from sdplan.core.session.state import sdcli_defaults

if TYPE_CHECKING:  # the session module imports this one
    from sdplan.core.session.board import BoardSession


@dataclass(frozen=True)
class CommandPreview:
    """What a pasted command would bring.

    Attributes:
        files: ``(key, path, on this machine)`` per model file, in the command's order.
        placement: ``--backend``, ``--params-backend``, ``--max-vram`` as given (empty: not).
        settings: the generation settings a run would use (sd-cli's request keys): the
            command's values over sd-cli's defaults for the model.
        given: the setting keys the command names itself.
        kept: sd-cli options sdplan keeps verbatim; unknown: arguments sd-cli would refuse.
        sizes: where the model's sizes would come from (``the model files``, ``the built-in
            profile NAME``, ``unknown: ...``).
        architecture: the model's architecture when known (``z_image``, ``sd1``...).
        error: why the command cannot be imported (nothing else is set then), or None.
    """

    files: tuple[tuple[str, str, bool], ...] = ()
    placement: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    given: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    sizes: str = ""
    architecture: str | None = None
    error: str | None = None

    @property
    def missing(self) -> list[str]:
        """Paths of the model files that are not on this machine."""
        return [p for _, p, here in self.files if not here]


@dataclass(frozen=True)
class PastedCommand:
    """What an applied command left to say: the arguments sdplan keeps without understanding
    (``unknown``) and one note per thing people should know (files missing, where the sizes
    came from)."""

    unknown: list[str]
    notes: list[str]


def _files(cmd: Any) -> dict[str, list[str]]:
    return {k: [v] if isinstance(v, str) else list(v) for k, v in cmd.model_files.items()}


def _main(files: dict[str, list[str]]) -> str | None:
    paths = files.get("diffusion_model") or files.get("model") or []
    return paths[0] if paths else None


@dataclass(frozen=True)
class _Model:
    """What a command's files make of the model: the files by flag, the profile (None:
    sizes unknown), where the sizes come from, the architecture, the files' own sd-cli flags
    and the pixels each side must be a multiple of."""

    files: dict[str, list[str]]
    profile: Profile | None
    sizes: str
    architecture: str | None = None
    flags: list[str] = field(default_factory=list)
    multiple: int | None = None


def _model(session: BoardSession, files: dict[str, list[str]]) -> _Model:
    """The model ``files`` describe: read when all are here; else the built-in profile the
    main file's name matches; else unknown. No files: the session's own model."""
    from sdplan.core.planning.builtin_profiles import load_builtin_profile, match_builtin_profile

    if not files:
        prof = session.profile
        return _Model(session.model_files, prof, "the open model",
                      prof.architecture if prof else None, list(session.model_file_flags),
                      session.size_multiple)
    missing = [p for v in files.values() for p in v if not Path(p).is_file()]
    if not missing:
        from sdplan.core.modelfiles.file_roles import read_checked
        from sdplan.core.modelfiles.flags import files_by_flag
        from sdplan.core.pipelines.size_rule import size_multiple
        from sdplan.core.planning.sdcli import model_file_flags

        try:
            ms = read_checked(files)
            prof = ms.profile()
            flags = model_file_flags([f.metadata for f in ms.files], ms.architecture.family)
            return _Model(files_by_flag(ms, files), prof, "the model files", prof.architecture,
                          flags, size_multiple(ms))
        except (SdplanError, OSError, ValueError) as exc:
            return _Model(files, None, f"unknown: the model files could not be read ({exc})")
    main = _main(files)
    name = None
    try:
        name = match_builtin_profile(main) if main else None
        prof = load_builtin_profile(name) if name else None
    except ModelFileError:
        prof = None
    if prof is not None:
        return _Model(files, prof, f"the built-in profile {name}", prof.architecture)
    what = Path(main).name if main else "the files"
    return _Model(files, None, f"unknown: no built-in profile matches {what}")


def _lifted(cmd: Any, model: _Model, args: list[str]
            ) -> tuple[dict[str, Any], list[str], dict[str, list[str]]]:
    """The hires fix, VAE tiling and ControlNet of ``args`` (the command's kept arguments) as
    the generation panel's settings (:func:`~sdplan.core.session.modules.lift_module_args`),
    the arguments still kept, and the model files without the command's ControlNet file (a
    setting from now on)."""
    from sdplan.core.planning.vae_tiling import vae_scale_factor
    from sdplan.core.session.modules import lift_module_args, takes_high_noise

    files = {k: list(v) for k, v in model.files.items()}
    net = next(iter(_files(cmd).get("control_net") or ()), None)
    lifted, kept = lift_module_args(args, net, cmd.dialect, vae_scale_factor(model.architecture),
                                    high_noise=takes_high_noise(model.architecture))
    if "control_net" in lifted:
        files.pop("control_net", None)
    return lifted, kept, files


def preview_command(session: BoardSession, text: str) -> CommandPreview:
    """What ``text`` (an sd-cli command) would bring to ``session``, nothing changed (see
    :class:`CommandPreview`; a command that cannot be read gives its error)."""
    from sdplan.core.planning.sdcli import import_sdcli_command

    try:
        cmd = import_sdcli_command(text)
        session.resolve(cmd.placement)
    except SdplanError as exc:
        return CommandPreview(error=str(exc))
    files = _files(cmd)
    model = _model(session, files)
    lifted, _, _ = _lifted(cmd, model, cmd.extra_args())
    kept = _lifted(cmd, model, list(cmd.kept))[1]
    strings = cmd.placement.to_strings()
    return CommandPreview(
        files=tuple((k, p, Path(p).is_file()) for k, v in files.items() for p in v),
        placement={k: strings.get(k, "") for k in ("backend", "params_backend", "max_vram")},
        settings={**sdcli_defaults(model.architecture), "prompt": "", **cmd.generation, **lifted},
        given=(*cmd.generation, *lifted),
        kept=tuple(kept), unknown=tuple(cmd.unknown),
        sizes=model.sizes, architecture=model.architecture)


def import_command(session: BoardSession, text: str) -> PastedCommand:
    """Apply ``text`` (an sd-cli command) to ``session`` as a whole (module docstring); on
    any error the session is put back as it was.

    Raises:
        PlanError: the command cannot be read or its placement does not resolve here.
    """
    from sdplan.core.planning.sdcli import import_sdcli_command

    cmd = import_sdcli_command(text)
    session.resolve(cmd.placement)  # raise before changing
    before = session.snapshot()
    try:
        files = _files(cmd)
        model = _model(session, files)
        lifted, kept, lifted_files = _lifted(cmd, model, cmd.extra_args())
        notes: list[str] = []
        if files:
            session.model_files = lifted_files
            session.missing_files = [p for v in files.values() for p in v if not Path(p).is_file()]
            session.profile, session.model_file_flags = model.profile, model.flags
            session.size_multiple = model.multiple
            session.profile_source = (model.sizes if session.missing_files
                                      and model.profile is not None else None)
            sizes = (f"sizes from {model.sizes}" if model.profile is not None
                     else f"sizes {model.sizes}")
            if session.missing_files:
                names = ", ".join(Path(p).name for p in session.missing_files)
                notes.append(f"model files not on this machine: {names}; {sizes}")
            elif model.profile is None:
                notes.append(sizes)
        tiles = (lifted.get("vae_tiling") or {}).get("tile_px") or [0, 0]
        if any(tiles) and cmd.dialect is None:  # spec section 14.7: said, not guessed silently
            notes.append("--vae-tile-size read in image pixels (the newest sd-cli's); the "
                         "command does not show whether it was written for the snapshot, "
                         "whose tiles are latent pixels")
        session.generation = {**sdcli_defaults(model.architecture), "prompt": "",
                              **cmd.generation, **lifted}
        session.generation_text = dict(cmd.generation_text)
        session.kept_args = kept
        session.apply(cmd.placement)
    except BaseException:
        session.restore(before)
        raise
    return PastedCommand(cmd.unknown_args, notes)
