"""The board's session: devices, model files, profile, placement -> plan and fit, and the
generation settings, without Qt.

Every edit of the board is a method that returns the new
:class:`~sdplan.core.planning.placement.Placement` without applying it (the caller decides
whether it becomes an undo step); :meth:`Session.resolve` checks one and :meth:`Session.apply`
makes it current, re-estimating at once (:func:`~sdplan.core.planning.estimate.estimate_plan`
with the engine's dry-run compute and the prompt's LoRAs, both cached). Loading files, devices
and settings change the session in place. :meth:`Session.snapshot` and :meth:`Session.restore`
take and put back everything a paste or an import changes, as one value.

Short messages for people (an estimate that cannot be made, files that could not be read) go
to :attr:`Session.notify`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sdplan.core.errors import PlanError, SdplanError
from sdplan.core.families import generation_defaults
from sdplan.core.planning.inventory import Device, Inventory, merge_rpc_devices
from sdplan.core.planning.modules import MODULES, SPLITTABLE
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.plan_types import Plan
from sdplan.core.planning.profile import Profile
from sdplan.core.planning.session import plan_document, save_plan_file
from sdplan.core.session.estimates import Estimates
from sdplan.core.session.state import DEFAULT_GENERATION, SessionState

log = logging.getLogger(__name__)

#: Where local devices come from (live ggml, or a saved hardware profile).
InventorySource = Callable[[], Inventory]


class BoardSession(Estimates):
    """Current placement + inventory + profile -> plan and fit, with the model files and the
    generation settings (see module docstring).

    Attributes:
        inventory: the devices planned for.
        profile: the model profile (None: sizes unknown).
        plan: the resolved plan of the current placement.
        fit: its estimate (a FitReport), or None without a profile.
        model_files: sd-cli model-file key -> paths.
        model_file_flags: sd-cli flags the open files call for (``--prediction v``).
        size_multiple: pixels each image side must be a multiple of (None: unknown).
        extra_modules: modules shown as cards though no file holds them.
        generation: generation settings by sd-cli's request keys.
        kept_args: a pasted command's arguments sdplan keeps without understanding.
        generation_text: the text each pasted generation value was read from.
        rpc_devices: devices of the ``--rpc-servers`` as last queried.
        inventory_source: where local devices are read again from (None: fixed).
        error: the flag fields' current PlanError, or None.
        notify: receives short messages for the status bar.
    """

    def __init__(self, inventory: Inventory, profile: Profile | None = None,
                 placement: Placement | None = None, *,
                 inventory_source: InventorySource | None = None,
                 notify: Callable[[str], None] | None = None) -> None:
        self.inventory = inventory
        self._profile = profile
        self._late: tuple[object, Profile | None] = (None, None)
        #: The sd-cli dialect the written command is for (``newest``, ``snapshot``; None:
        #: the placement's flags as held, a pasted command's own spelling).
        self.sdcli_dialect: str | None = None
        self.inventory_source = inventory_source
        self.notify: Callable[[str], None] = notify or (lambda text: None)
        self.rpc_devices: list[Device] = [d for d in inventory if d.registry.upper() == "RPC"]
        self.model_files: dict[str, list[str]] = {}
        self.model_file_flags: list[str] = []
        self.size_multiple: int | None = None
        self.extra_modules: list[str] = []
        self.missing_files: list[str] = []
        self.profile_source: str | None = None
        self.generation: dict[str, Any] = dict(DEFAULT_GENERATION)
        self.kept_args: list[str] = []
        self.generation_text: dict[str, str] = {}
        self.error: PlanError | None = None
        self.fit: Any = None
        self._effects: dict[str, dict[str, dict[str, int]]] = {}
        self._lora_cache = (None, None)
        self._compute_cache: dict[object, dict[str, int] | None] = {}
        self._work_cache: dict[object, dict[str, list[Any]] | None] = {}
        self.plan: Plan = resolve(placement or Placement(), inventory, profile)
        self.estimate()

    # ------------------------------------------------------------------ state
    @property
    def profile(self) -> Profile | None:
        """The profile planned with: the files' (or a built-in one) with the ``upscaler`` and
        ``controlnet`` modules the generation settings run
        (:func:`~sdplan.core.session.modules.with_late_modules`, read once per file)."""
        from sdplan.core.session.modules import late_modules, with_late_modules

        late = late_modules(self.generation, self.model_files) if self._profile is not None else {}
        key = (self._profile, tuple(sorted(late.items())))
        if self._late[0] != key:
            notes: list[str] = []
            self._late = (key, with_late_modules(self._profile, late, notes))
            for note in notes:
                self.notify(note)
        return self._late[1]

    @profile.setter
    def profile(self, profile: Profile | None) -> None:
        self._profile = profile

    def modules(self) -> list[str]:
        """Modules shown as cards: the profile's, those the user added, and those the
        placement names explicitly; in :data:`MODULES` order."""
        shown = set(self.profile.modules) if self.profile else self.file_modules()
        shown |= set(self.extra_modules)
        shown |= set(self.placement.runtime) | set(self.placement.params)
        return [m for m in MODULES if m in shown]

    def file_modules(self) -> set[str]:
        """The modules the model files' flags stand for (``--diffusion-model``: diffusion;
        ``-m``: diffusion, te and vae), read or not."""
        from sdplan.core.planning.modules import FLAG_TARGETS

        out: set[str] = set()
        for key in self.model_files:
            module = FLAG_TARGETS.get(key, (None, None, ""))[0]
            out |= {module} if module else ({"diffusion", "te", "vae"} if key == "model" else set())
        return out

    def missing_by_module(self) -> dict[str, list[str]]:
        """Module -> names of its model files that are not on this machine (a pasted
        command's); empty when every file is here."""
        from sdplan.core.planning.modules import FLAG_TARGETS

        out: dict[str, list[str]] = {}
        missing = set(self.missing_files)
        for key, paths in self.model_files.items():
            module = FLAG_TARGETS.get(key, (None, None, ""))[0]
            for mod in [module] if module else (["diffusion", "te", "vae"] if key == "model" else []):
                out.setdefault(mod, []).extend(Path(p).name for p in paths if p in missing)
        return {m: v for m, v in out.items() if v}

    def module_bytes(self, module: str) -> int | None:
        """Weight bytes of ``module`` from the profile, or None when unknown."""
        mp = self.profile.get(module) if self.profile else None
        return mp.total if mp is not None else None

    def device(self, name: str) -> Device:
        """The inventory device called ``name`` (StopIteration when there is none)."""
        return next(d for d in self.inventory if d.name == name)

    def snapshot(self) -> SessionState:
        """Everything a paste or an import changes, as one value (:meth:`restore` puts it back)."""
        return SessionState(self.placement, {k: list(v) for k, v in self.model_files.items()},
                            self._profile, tuple(self.model_file_flags), self.size_multiple,
                            dict(self.generation), dict(self.generation_text),
                            tuple(self.kept_args), tuple(self.extra_modules),
                            tuple(self.missing_files), self.profile_source)

    def restore(self, state: SessionState) -> None:
        """Make ``state`` current (no file is read again); the placement falls back to the
        default when it no longer resolves on these devices (``notify`` says why)."""
        self.model_files = {k: list(v) for k, v in state.model_files.items()}
        self.profile = state.profile
        self.model_file_flags = list(state.model_file_flags)
        self.size_multiple = state.size_multiple
        self.generation = dict(state.generation)
        self.generation_text = dict(state.generation_text)
        self.kept_args = list(state.kept_args)
        self.extra_modules = list(state.extra_modules)
        self.missing_files = list(state.missing_files)
        self.profile_source = state.profile_source
        self._replan(state.placement)

    def title(self) -> tuple[str, str | None]:
        """The board's header: the main model file's name (a pasted command's, even when it
        could not be read here), else the profile's name, else ``No model loaded``; and the
        architecture (None when unknown)."""
        files = self.model_files
        paths = (files.get("model") or files.get("diffusion_model")
                 or [p for v in files.values() for p in v])
        main = paths[0] if paths else None
        prof = self.profile
        name = Path(main).name if main else (prof.name if prof and prof.name else None)
        return name or "No model loaded", (prof.architecture if prof else None)

    # ------------------------------------------------------------------ the plan
    def resolve(self, placement: Placement) -> Plan:
        """``placement`` resolved on these devices with this profile (nothing changes).

        Raises:
            PlanError: it does not resolve.
        """
        return resolve(placement, self.inventory, self.profile)

    def apply(self, placement: Placement) -> None:
        """Make ``placement`` current and estimate it.

        Raises:
            PlanError: it does not resolve (nothing changes).
        """
        self.plan = self.resolve(placement)
        self.estimate()

    def _replan(self, placement: Placement) -> str | None:
        """Apply ``placement``, or the default placement (same RPC servers) when it no longer
        resolves; returns why it was reset (also sent to ``notify``), else None."""
        try:
            self.plan = self.resolve(placement)
            note = None
        except PlanError as exc:
            note = f"placement reset: {exc}"
            self.notify(note)
            self.plan = self.resolve(Placement(rpc_servers=placement.rpc_servers))
        self.estimate()
        return note

    # ------------------------------------------------------------------ edits
    def editable(self) -> Placement:
        """The placement a runtime or residency edit starts from: the current one, or, under
        ``--auto-fit``, sd-cli's choice pinned as explicit strings (moving a card ends
        auto-fit; budgets and RPC servers keep it)."""
        return self.pinned_auto_fit() or self.placement

    def pinned_auto_fit(self) -> Placement | None:
        """sd-cli's ``--auto-fit`` choice as an explicit placement (``--auto-fit`` off), or
        None when the plan is not auto-fit's."""
        if self.plan.auto_fit is None:
            return None
        pl = self.placement
        return Placement.from_strings(self.plan.backend, self.plan.params_backend,
                                      self.plan.max_vram, stream_layers=pl.stream_layers,
                                      rpc_servers=pl.rpc_servers, split_mode=self.plan.split_mode)

    def assign(self, module: str, device: str) -> Placement:
        """Run ``module`` on ``device`` alone (its card shows from now on)."""
        if module not in self.modules():
            self.extra_modules.append(module)
        return self.editable().assign(module, device)

    def follow_default(self, module: str) -> Placement:
        """Without ``module``'s own ``--backend`` entry: it runs on the default (all=)."""
        base = self.editable()
        return dataclasses.replace(base, runtime={m: v for m, v in base.runtime.items()
                                                  if m != module})

    @staticmethod
    def split_refusal(module: str) -> str:
        """Why ``module`` cannot take a second device (spec section 1)."""
        return (f"{module} cannot run on several devices: only the diffusion model and the "
                "text encoders have transformer blocks to split")

    def add_split_device(self, module: str, device: str) -> Placement:
        """``device`` added to ``module``'s layer split.

        Raises:
            PlanError: ``not_splittable`` for a module without blocks
                (:meth:`split_refusal`).
        """
        if module not in SPLITTABLE:
            raise PlanError("not_splittable", self.split_refusal(module))
        return self.editable().add_split_device(module, device)

    def remove_split_device(self, module: str, device: str) -> Placement:
        """``device`` taken out of ``module``'s split."""
        return self.editable().remove_split_device(module, device)

    def set_residency(self, module: str, mode: str, device: str | None = None) -> Placement:
        """Residency of ``module``: ``runtime`` (on its device), ``device`` (weights on
        ``device``, staged when used) or ``disk`` (raises PlanError)."""
        return self.editable().set_residency(module, mode, device)

    def set_budget(self, device: str | None, gib: float | None) -> Placement:
        """``--max-vram`` of ``device`` (None: the default) in GiB, rounded to 0.01; 0 or
        None removes it (raises PlanError)."""
        value = None if gib is None or gib == 0 else round(float(gib), 2)
        return self.placement.set_budget(device, value)

    def set_default(self, device: str | Sequence[str]) -> Placement:
        """The ``--backend`` default device (or device list)."""
        return self.editable().set_default(device)

    def add_module(self, module: str) -> bool:
        """Show a card for ``module`` though no open file holds it; False when it shows."""
        if module in self.extra_modules:
            return False
        self.extra_modules.append(module)
        return True

    # ------------------------------------------------------------------ flag strings
    def parse_strings(self, backend: str, params_backend: str, max_vram: str) -> tuple[Placement, Plan]:
        """``(placement, plan)`` of the three flag values (RPC servers and streaming kept).

        Raises:
            PlanError: they do not parse or resolve; a device no device here is called
                (``cuda:1``) is followed by the name it most likely means
                (:func:`~sdplan.core.planning.hints.device_suggestion`).
        """
        try:
            parsed = Placement.from_strings(backend, params_backend, max_vram,
                                            stream_layers=self.placement.stream_layers,
                                            rpc_servers=self.placement.rpc_servers)
            return parsed, self.resolve(parsed)
        except PlanError as exc:
            raise self._suggested(exc) from None

    def _suggested(self, exc: PlanError) -> PlanError:
        """``exc`` with "did you mean CUDA1?" when it names a device written another way."""
        from sdplan.core.planning.hints import device_suggestion

        if exc.code != "device_not_found" or not exc.text or exc.span is None:
            return exc
        written = exc.text[exc.span[0]:exc.span[1]]
        name = device_suggestion(written, [d.name for d in self.inventory],
                                 [(d.name, d.registry, d.is_gpu_like) for d in self.inventory])
        if name is None:
            return exc
        return PlanError(exc.code, f"{exc}; did you mean {name}?", flag=exc.flag,
                         text=exc.text, span=exc.span)

    @staticmethod
    def string_hints(backend: str) -> list[str]:
        """What a valid ``--backend`` value probably meant otherwise
        (:func:`~sdplan.core.planning.hints.comma_split_hints`)."""
        from sdplan.core.planning.hints import comma_split_hints

        return comma_split_hints(backend)

    def command_line(self) -> str:
        """The full sd-cli command for the model files, placement and generation settings
        (with the hires fix, ControlNet and VAE tiling flags), written for
        :attr:`sdcli_dialect` (:meth:`written_command`)."""
        return self.written_command()[0]

    def written_command(self, dialect: str | None = None) -> tuple[str, list[str]]:
        """``(command, notes)``: the sd-cli command for ``dialect`` (default
        :attr:`sdcli_dialect`; None writes the placement as held) and what writing it for that
        dialect added or left out (:func:`~sdplan.core.planning.sdcli_write.written_placement`:
        ``--auto-fit off`` where the newest sd-cli's auto-fit would move weights; kept options
        the dialect lacks).

        Raises:
            nothing: a placement the dialect cannot write as planned is written as held, its
            PlanError in the notes.
        """
        from sdplan.core.planning.sdcli import (
            GENERATION_FLAGS,
            kept_for_dialect,
            merge_flags,
            sdcli_command_line,
        )
        from sdplan.core.planning.sdcli_write import written_placement
        from sdplan.core.planning.vae_tiling import vae_scale_factor
        from sdplan.core.session.modules import module_flags

        dialect = self.sdcli_dialect if dialect is None else dialect
        gen = {k: v for k, v in self.generation.items()
               if v not in (None, "") and k in GENERATION_FLAGS}
        placement, notes, kept = self.placement, [], list(self.kept_args)
        arch = self.profile.architecture if self.profile is not None else None
        if dialect is not None:
            try:
                placement, notes = written_placement(self.plan, dialect, self.inventory,
                                                     self.profile)
            except PlanError as exc:
                notes = [f"placement written as held: {exc}"]
            kept, dropped = kept_for_dialect(kept, dialect)
            notes += [f"{a} left out (sd-cli {dialect} has no such option)" for a in dropped
                      if a.startswith("-")]
        try:
            modules = module_flags(self.generation, dialect, vae_scale_factor(arch))
        except SdplanError as exc:
            modules, notes = [], [*notes, f"hires, ControlNet and tiling flags left out: {exc}"]
        line = sdcli_command_line(placement, self.model_files, gen,
                                  extra=merge_flags([*modules, *kept], self.model_file_flags),
                                  raw=self.generation_text, dialect=dialect)
        return line, notes

    def set_sdcli_dialect(self, dialect: str | None) -> None:
        """Write the sd-cli command for ``dialect`` (``newest``, ``snapshot``; None: as held).

        Raises:
            PlanError: ``invalid_dialect`` for another name.
        """
        from sdplan.core.planning.target import DIALECTS

        if dialect is not None and dialect not in DIALECTS:
            raise PlanError("invalid_dialect", f"sd-cli dialect {dialect!r}: one of "
                            f"{', '.join(DIALECTS)}")
        self.sdcli_dialect = dialect

    # ------------------------------------------------------------------ models
    def load_model_files(self, flags: Mapping[str, Sequence[str]], *, strict: bool = True) -> str | None:
        """Read model files (headers only) into the profile; ``flags`` maps sd-cli model
        keys (``model``, ``diffusion_model``, ``t5xxl``...) to paths. A new architecture
        brings its family's generation settings. Returns why the files could not be read
        (only when not ``strict``: the paths are kept for the command and the sizes are
        unknown, never the previous model's), else None.

        Raises:
            SdplanError, OSError, ValueError: a file is unreadable or not a model, or the set
                does not fit together (:func:`~sdplan.core.modelfiles.file_roles.check_files`:
                a FLUX.1 autoencoder beside a FLUX.2 DiT...); only when ``strict``, and
                nothing changes then.
        """
        from sdplan.core.modelfiles.checkpoint import read_model_files
        from sdplan.core.modelfiles.file_roles import check_files
        from sdplan.core.modelfiles.flags import files_by_flag
        from sdplan.core.pipelines.size_rule import size_multiple
        from sdplan.core.planning.sdcli import model_file_flags

        files = {k: list(v) for k, v in flags.items()}
        note = None
        try:
            ms = read_model_files(files)
            profile = ms.profile()
            files = files_by_flag(ms, files)
            # as plan and generate check a set: a VAE or LLM the family cannot take is refused
            check_files(ms, files)
            extra = model_file_flags([f.metadata for f in ms.files], ms.architecture.family)
            multiple = size_multiple(ms)
        except (SdplanError, OSError, ValueError) as exc:
            if strict:
                raise  # nothing changed
            note = f"model files not read: {exc}"
            self.notify(note)
            self.model_file_flags = []  # unread files: nothing known about them, and
            self.size_multiple = None  # never the previous model's sizes
            self.profile = None
        else:
            self._family_defaults(profile)
            self.profile = profile
            self.model_file_flags = extra
            self.size_multiple = multiple
        self.model_files = files
        self.missing_files = [p for v in files.values() for p in v if not Path(p).exists()]
        self.profile_source = None
        self.apply(self.placement)
        return note

    def _family_defaults(self, profile: Profile | None) -> None:
        """Take the new model family's generation settings (Chroma's CFG 4...; see
        :func:`generation_defaults`) when the architecture changes."""
        arch = profile.architecture if profile is not None else None
        if arch != (self.profile.architecture if self.profile is not None else None):
            self.generation.update(generation_defaults(arch))

    def open_files(self, paths: Sequence[str]) -> None:
        """Open model files of any kind (classified by their tensor names). They join the
        files already open (a VAE or text encoder next to a diffusion model); another whole
        model (a diffusion model of another family, or files that clash with the open ones)
        replaces them.

        Raises:
            SdplanError, OSError, ValueError: a file is unreadable or not a model, or files
                without a diffusion model of their own do not fit the open ones (a FLUX.1
                autoencoder beside FLUX.2 klein); nothing changes then.
        """
        from sdplan.core.modelfiles.file_roles import holds_diffusion_model, of_another_family

        new = [str(p) for p in paths]
        if of_another_family(self.model_files, new):  # another whole model: it never joins the set
            self.load_model_files({"model": new})
            return
        flags = {k: list(v) for k, v in self.model_files.items()}
        flags.setdefault("model", []).extend(p for p in new if p not in flags["model"])
        try:
            self.load_model_files(flags)
        except (SdplanError, OSError, ValueError):
            if not self.model_files or not holds_diffusion_model(new):
                raise  # a VAE or encoder the open model cannot take: refused, the set kept
            self.load_model_files({"model": new})

    def set_profile(self, profile: Profile | None) -> None:
        """Plan with ``profile`` (block sizes) instead of the open files' own."""
        self._family_defaults(profile)
        self.profile = profile
        self.profile_source = None
        self.apply(self.placement)

    def plan_for_builtin(self, name: str) -> None:
        """Plan for the built-in model profile ``name`` (``flux1-dev-q8_0``...; see
        :func:`sdplan.core.planning.builtin_profiles.list_profiles`) without its files: the
        open model files are closed.

        Raises:
            ModelFileError: unknown name or a malformed shipped index.
        """
        from sdplan.core.planning.builtin_profiles import load_builtin_profile

        profile = load_builtin_profile(name)
        self.model_files = {}
        self.missing_files = []
        self.model_file_flags = []
        self.size_multiple = None
        self.set_profile(profile)
        self.notify(f"planning for the built-in profile {name} (no files needed)")

    # ------------------------------------------------------------------ devices
    def set_inventory(self, inventory: Inventory) -> str | None:
        """Plan for other devices; keeps the placement when it still resolves, else falls
        back to the default placement. Returns why it was reset, else None."""
        self.inventory = inventory
        return self._replan(self.placement)

    def refresh_inventory(self) -> str:
        """Re-read the local devices' free memory from the inventory source (the RPC devices
        stay as last queried). Returns ``same`` (nothing changed or no source), ``memory``
        (free memory changed) or ``devices`` (devices came or went: see
        :meth:`set_inventory`).

        Raises:
            SdplanError: the source failed.
        """
        if self.inventory_source is None:
            return "same"
        inv = merge_rpc_devices(self.inventory_source(), self.rpc_devices)
        if inv == self.inventory:
            return "same"
        if [d.name for d in inv] == [d.name for d in self.inventory]:
            self.inventory = inv
            self.apply(self.placement)
            return "memory"
        self.set_inventory(inv)
        return "devices"

    def set_rpc_devices(self, devices: Sequence[Device]) -> None:
        """The RPC servers' devices (``RPC0``...) replace the previous ones in the inventory."""
        self.rpc_devices = list(devices)
        local = Inventory(tuple(d for d in self.inventory if d.registry.upper() != "RPC"))
        self.set_inventory(Inventory((*local, *self.rpc_devices)))

    def load_hardware(self, path: str | Path) -> None:
        """Plan for the devices of a saved inventory (a hardware profile); refreshes stop
        (the devices are not this machine's).

        Raises:
            InventoryError: the file is not an inventory.
        """
        inv = Inventory.load(path)
        self.inventory_source = None
        self.rpc_devices = [d for d in inv if d.registry.upper() == "RPC"]
        self.set_inventory(inv)

    def hardware_json(self) -> dict[str, object]:
        """The devices (with their free memory now) as the inventory JSON that
        ``sdplan plan --devices`` and :meth:`load_hardware` read back."""
        return {"devices": [d.to_json() for d in self.inventory]}

    # ------------------------------------------------------------------ settings
    def set_generation(self, **values: object) -> bool:
        """Update generation settings (size and batch change the compute estimate); False
        when nothing changed."""
        changed = {k: v for k, v in values.items() if self.generation.get(k) != v}
        if not changed:
            return False
        before = self.profile
        self.generation.update(changed)
        if self.profile is not before:  # an upscaler or ControlNet came or went: placed anew
            self._replan(self.placement)
        else:
            self.estimate()
        return True

    def auto_plan_review(self) -> Any:
        """The Auto plan's proposal for these files, devices and budgets at the settings'
        size, with its alternatives, the fastest that fits where the devices' speeds are
        measured and the predicted times of the current plan and the proposal
        (:func:`~sdplan.core.planning.autoplan_review.review_auto_plan`).

        Raises:
            PlanError: no profile (open model files first), or no plan fits at all.
        """
        from sdplan.core.planning.autoplan_review import review_auto_plan

        if self.profile is None:
            raise PlanError("no_profile", "Auto plan needs model sizes: open model files first")
        w, h, b = self.size()
        return review_auto_plan(self.profiled_inventory(), self.profile, self.placement,
                                width=w, height=h, batch=b, run=self.time_settings())

    # ------------------------------------------------------------------ plan JSON
    def plan_json(self) -> dict[str, object]:
        """The plan as saved by "Export plan"
        (:func:`sdplan.core.planning.session.plan_document`)."""
        doc = plan_document(self.plan, self.model_files, self.generation, self.extra_modules,
                            self.fit)
        if self.sdcli_dialect is not None:
            doc["sdcli_dialect"] = self.sdcli_dialect
        return doc

    def save_plan(self, path: str | Path) -> None:
        """Write :meth:`plan_json` to ``path`` (raises OSError)."""
        save_plan_file(path, self.plan_json())
