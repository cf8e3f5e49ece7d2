"""The session as the app and tests use it: :class:`~sdplan.core.session.board.BoardSession`
(the board's state, estimates and edits) with what comes from outside it: a pasted sd-cli
command, a picture's metadata, a saved plan and a result's "Reuse settings".

Each import changes the session in place and makes its placement current; a caller that
keeps undo steps takes :meth:`~sdplan.core.session.board.BoardSession.snapshot` before and
after and restores the first to undo the whole import.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sdplan.core.errors import PlanError, SdplanError
from sdplan.core.planning.modules import MODEL_FLAGS
from sdplan.core.planning.placement import Placement
from sdplan.core.session.board import BoardSession
from sdplan.core.session.paste import CommandPreview, PastedCommand, import_command, preview_command


class Session(BoardSession):
    """A board session that also imports commands, pictures, saved plans and results (see
    module docstring)."""

    def preview_command(self, text: str) -> CommandPreview:
        """What a pasted sd-cli command would bring, nothing changed
        (:func:`~sdplan.core.session.paste.preview_command`)."""
        return preview_command(self, text)

    def import_command(self, text: str) -> PastedCommand:
        """Take model files, placement and generation settings from a pasted sd-cli command
        (read as its shell reads it: :mod:`sdplan.core.planning.cmdline`): the settings are
        the command's over sd-cli's defaults for that model, files not on this machine plan
        from the built-in profile their name matches; every other argument is kept and
        written back verbatim by :meth:`command_line`
        (:func:`~sdplan.core.session.paste.import_command`).

        Raises:
            PlanError: the command cannot be read or its placement is wrong (nothing
                changes).
        """
        return import_command(self, text)

    def import_png(self, path: str | Path) -> list[str]:
        """Restore a run from a picture's metadata (sd-cli's ``parameters`` text or sdplan's
        own; a video's from its container, its frames and frame rate too): prompt and
        settings (its reference pictures, or none), the model files that exist here, and the
        placement strings. The picture names its files by name: they are looked for beside it, in the current folder and
        among the model library's files. Returns what was taken (for the status bar).

        Raises:
            SdplanError: the picture records no generation (nothing changes); PlanError: its
                placement does not resolve on these devices (settings and files are kept).
        """
        from sdplan.core.pipelines.stages.results import (
            locate_inputs,
            locate_model_files,
            read_generation,
            read_result,
        )
        from sdplan.core.planning.sdcli import GENERATION_FLAGS
        from sdplan.core.session.runs import VIDEO_KEYS

        try:
            got = read_generation(path)
            mine = read_result(path)  # the app's index beside its own pictures: full paths
        except OSError as exc:
            raise SdplanError(f"{path}: {exc.strerror or exc}") from None
        if not got.settings and not got.model_files:
            raise SdplanError(f"{path}: no generation parameters in this picture")
        taken: list[str] = []
        recorded = {**got.settings, **{k: v for k, v in mine.settings.items() if k in got.settings}}
        settings = {k: v for k, v in locate_inputs(recorded, path).items()
                    if k in GENERATION_FLAGS or k in VIDEO_KEYS or k == "ref_images"}
        if settings:  # the run's reference pictures, or none: never an earlier run's
            settings.setdefault("ref_images", None)
        if settings:
            self.generation.update(settings)
            taken.append("settings")
        found = locate_model_files(mine.model_files or got.model_files, path,
                                   sha256=got.model_hash)
        files = {k: v for k, v in found.items() if k in MODEL_FLAGS}
        if files:
            self.load_model_files(files, strict=False)
            taken.append("model files")
        elif got.model_files:
            names = ", ".join(Path(p).name for v in got.model_files.values() for p in v)
            taken.append(f"model names only ({names}: open those files)")
        pl = got.placement
        if pl.get("backend") or pl.get("params_backend") or pl.get("max_vram"):
            placement = Placement.from_strings(
                pl.get("backend", ""), pl.get("params_backend", ""), pl.get("max_vram", ""),
                rpc_servers=pl.get("rpc_servers", ""), split_mode=pl.get("split_mode", ""))
            self.apply(placement)
            taken.append("placement")
        else:
            self.estimate()
        return taken

    def load_plan_json(self, data: object, *, source: str = "plan") -> None:
        """Restore a plan saved by :meth:`plan_json`.

        Raises:
            PlanError: the JSON is not a plan or its strings do not resolve here (nothing
                changes).
        """
        from sdplan.core.planning.session import read_plan_document

        saved = read_plan_document(data, source)
        self.resolve(saved.placement)
        if saved.model_files and saved.model_files != self.model_files:
            self.load_model_files(saved.model_files, strict=False)
        self.generation.update(saved.generation)
        self.extra_modules = list(saved.extra_modules)
        dialect = data.get("sdcli_dialect") if isinstance(data, dict) else None
        self.sdcli_dialect = dialect if dialect in ("newest", "snapshot") else None
        self.apply(saved.placement)

    def reuse_result(self, settings: Mapping[str, object],
                     model_files: Mapping[str, Sequence[str]] | None = None,
                     placement: Mapping[str, str] | None = None,
                     architecture: str | None = None) -> list[str]:
        """Put a result's settings back (the gallery's and the strip's "Reuse settings"):
        its generation settings (sd-cli keys, a video's frames and frame rate and the reference
        pictures (none when it had none) included, through
        :func:`~sdplan.core.pipelines.stages.results.reusable_settings`: what the command
        line's ``--from-image`` takes; others are ignored), its model files when they all
        exist here, and its placement strings when they resolve on these devices. Returns one
        note per part left as it was (files not found, a placement that does not resolve)."""
        from sdplan.core.pipelines.stages.parameters import ImageParameters
        from sdplan.core.pipelines.stages.results import reusable_settings
        from sdplan.core.planning.sdcli import GENERATION_FLAGS
        from sdplan.core.session.runs import VIDEO_KEYS

        notes: list[str] = []
        files = {k: list(v) for k, v in (model_files or {}).items()}
        if files and files != self.model_files:
            missing = [p for v in files.values() for p in v if not Path(p).is_file()]
            if missing:
                notes.append(f"model files not found here: {', '.join(missing)}")
            else:
                self.load_model_files(files, strict=False)
        new: Placement | None = None
        if placement:
            try:
                new = Placement.from_strings(
                    placement.get("backend", ""), placement.get("params_backend", ""),
                    placement.get("max_vram", ""), stream_layers=self.placement.stream_layers,
                    rpc_servers=self.placement.rpc_servers)
                self.resolve(new)
            except PlanError as exc:
                notes.append(f"placement not restored: {exc}")
                new = None
        known = (set(GENERATION_FLAGS) - {"output"}) | set(VIDEO_KEYS) | {"ref_images"}
        given = {"ref_images": None, **reusable_settings(ImageParameters(dict(settings)), architecture)}
        self.generation.update({k: v for k, v in given.items() if k in known})
        self.apply(new if new is not None else self.placement)
        return notes

    # ------------------------------------------------------------------ runs
    def request(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """``settings`` (sd-cli's request keys) as the engine request of the open files and
        the resolved plan on the board, in JSON form
        (:func:`sdplan.core.pipelines.request.planned_request`; the engine checks the plan's
        devices against its own before it loads anything).

        Raises:
            SdplanError: a malformed setting.
        """
        from sdplan.core.pipelines.request import planned_request

        files = {k: list(v) for k, v in self.model_files.items()}
        return planned_request(settings, files, self.plan, self.fit, self.inventory).to_dict()

    def refusal(self, settings: Mapping[str, Any]) -> str | None:
        """Why the open family would refuse ``settings`` (a sampler, scheduler or option it
        does not take; :meth:`~sdplan.core.pipelines.request.GenerationRequest.check`), or
        None: the check the engine makes, before anything loads."""
        from sdplan.core.families import family_of, variant_of
        from sdplan.core.pipelines.request import FALLBACK, GenerationRequest

        arch = self.profile.architecture if self.profile is not None else None
        fam = family_of(arch) or family_of(FALLBACK)
        if fam is None:
            return None
        try:
            GenerationRequest.from_settings(settings, self.model_files).check(fam, variant_of(arch))
        except SdplanError as exc:
            return str(exc)
        return None

    def unavailable_reason(self, settings: Mapping[str, Any]) -> str | None:
        """Why ``settings`` cannot be generated with the open files now (no files, a size
        the model cannot draw, an option the family refuses), or None."""
        if not self.model_files:
            prof = self.profile
            if prof is not None and prof.name:
                return (f"Planning for {prof.name} without its files. Load a model to "
                        "generate (File → Open model files, or drop files here)")
            return "Load a model to generate (File → Open model files, or drop files here)"
        f = self.size_multiple
        w, h = int(settings.get("width") or 0), int(settings.get("height") or 0)
        if f and (w % f or h % f):
            return f"Size {w} × {h} px: this model draws sizes that are multiples of {f} px"
        return self.refusal(settings)

    def lora_table(self) -> Any:
        """The open model's LoRA alias table (headers only;
        :func:`~sdplan.core.modelfiles.lora.model_aliases`), or None without readable files."""
        from sdplan.core.modelfiles.checkpoint import read_model_files
        from sdplan.core.modelfiles.lora import model_aliases

        files = {k: v for k, v in self.model_files.items() if k not in ("taesd", "upscale_model")}
        if not files:
            return None
        try:
            return model_aliases(read_model_files(files))
        except (SdplanError, OSError, ValueError):
            return None

    def is_demo(self) -> bool:
        """Whether the open files are the built-in demo model's."""
        from sdplan.core.pipelines.demo.model import demo_lora_dir

        home = demo_lora_dir().parent
        return any(Path(p).parent == home for v in self.model_files.values() for p in v)

    def own_lora_folder(self) -> Path | None:
        """The LoRA folder the open files bring (the demo model's own), or None."""
        from sdplan.core.pipelines.demo.model import demo_lora_dir

        return demo_lora_dir() if self.is_demo() else None

    def trained_sizes(self) -> tuple[tuple[int, int], ...]:
        """The picture sizes ``(width, height)`` in pixels the open model was trained for:
        the demo model's 128 x 128, else its family's
        (:func:`~sdplan.core.families.recommended_sizes`); empty when unknown."""
        from sdplan.core.families import recommended_sizes
        from sdplan.core.pipelines.demo.model import DEMO_DEFAULTS

        if self.is_demo():
            return ((int(DEMO_DEFAULTS["width"]), int(DEMO_DEFAULTS["height"])),)
        return recommended_sizes(self.profile.architecture if self.profile else None)

    def size_note(self, width: int, height: int) -> str | None:
        """A line for a picture size far from what the model was trained for (a side over
        1.5 times its largest trained side, or under half its smallest), else None: such
        pictures repeat or break their shapes. Nothing is refused."""
        sizes = self.trained_sizes()
        if not sizes or (width, height) in sizes:
            return None
        big = max(max(w, h) for w, h in sizes)
        small = min(min(w, h) for w, h in sizes)
        if max(width, height) <= big * 1.5 and min(width, height) >= small / 2:
            return None
        tw, th = sizes[0]
        return (f"{self.title()[0]} was trained at {tw} × {th} px: at {width} × {height} px "
                "its pictures may repeat or break their shapes")
