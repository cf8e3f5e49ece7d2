"""The board's controller: owns the current placement, the devices and the model profile.

Every edit (a drop on the board, a residency switch, a budget, an applied flag field, a
pasted command) becomes a new :class:`~sdplan.core.planning.placement.Placement` that is resolved
at once (:func:`sdplan.core.planning.plan.resolve`) and estimated (:func:`estimate_plan`); views
redraw from :attr:`PlanController.plan` and :attr:`PlanController.fit` and never keep a
copy of the placement. Undo/redo keep placement snapshots on a :class:`QUndoStack`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QUndoCommand, QUndoStack
from sdplan.core.errors import PlanError, SdplanError
from sdplan.core.families import generation_defaults
from sdplan.core.modelfiles.flags import files_by_flag
from sdplan.core.planning.inventory import Device, Inventory, merge_rpc_devices
from sdplan.core.planning.modules import MODEL_FLAGS, MODULES, SPLITTABLE
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.plan_types import Plan
from sdplan.core.planning.profile import Profile
from sdplan.core.planning.sdcli import (
    GENERATION_FLAGS,
    import_sdcli_command,
    merge_flags,
    model_file_flags,
    sdcli_command_line,
)
from sdplan.core.planning.session import plan_document, read_plan_document, save_plan_file

log = logging.getLogger(__name__)

#: Undo-merge id for the moves of one budget-marker drag.
_MERGE_BUDGET = 2

#: Generation settings that the estimate and the sd-cli command use by default.
DEFAULT_GENERATION: dict[str, object] = {"width": 1024, "height": 1024, "steps": 20,
                                         "cfg_scale": 1.0, "seed": 42, "batch_count": 1}

#: Where local devices come from (live ggml, or a saved hardware profile). RPC devices are
#: never asked for in this process: see :func:`sdplan.app.rpc.query_rpc_devices`.
InventorySource = Callable[[], Inventory]


class _PlacementCommand(QUndoCommand):
    """One undoable placement change (snapshots before and after)."""

    def __init__(self, ctl: PlanController, old: Placement, new: Placement, text: str,
                 merge: int = -1, source: str = "board") -> None:
        super().__init__(text)
        self._ctl, self.old, self.new, self._merge = ctl, old, new, merge
        self._source = source

    def id(self) -> int:  # noqa: A003 - Qt's name
        return self._merge

    def mergeWith(self, other: QUndoCommand) -> bool:  # noqa: N802 - Qt's name
        if not isinstance(other, _PlacementCommand) or other.id() != self._merge:
            return False
        self.new = other.new
        return True

    def redo(self) -> None:
        self._ctl._apply(self.new, self._source)
        self._source = "undo"

    def undo(self) -> None:
        self._ctl._apply(self.old, "undo")


class PlanController(QObject):
    """Current placement + inventory + profile -> plan and fit, with undo.

    Signals:
        planChanged(str): the plan or fit changed; the argument is the source of the change
            (``board``, ``strings``, ``undo``, ``load``). String fields rewrite themselves
            unless the source is ``strings`` (the user is typing there).
        errorChanged(object): the current :class:`PlanError` of the flag fields, or None.
        inventoryChanged(): devices changed (columns to rebuild).
        modelChanged(): model files or profile changed (cards to rebuild).
        status(str): a short message for the status bar.
    """

    planChanged = Signal(str)
    errorChanged = Signal(object)
    inventoryChanged = Signal()
    modelChanged = Signal()
    status = Signal(str)

    def __init__(self, inventory: Inventory, profile: Profile | None = None,
                 placement: Placement | None = None, *,
                 inventory_source: InventorySource | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.inventory = inventory
        self.profile = profile
        self.inventory_source = inventory_source
        #: Devices of the ``--rpc-servers``, as the last subprocess query returned them.
        self.rpc_devices: list[Device] = [d for d in inventory
                                          if d.registry.upper() == "RPC"]
        self.model_files: dict[str, list[str]] = {}
        #: sd-cli flags the open model files call for (``--prediction v``), see
        #: :func:`sdplan.core.planning.sdcli.model_file_flags`.
        self.model_file_flags: list[str] = []
        #: Pixels each image side must be a multiple of for the open files (None: unknown),
        #: see :func:`sdplan.core.pipelines.size_rule.size_multiple`.
        self.size_multiple: int | None = None
        self.extra_modules: list[str] = []
        self.generation: dict[str, object] = dict(DEFAULT_GENERATION)
        #: Arguments of a pasted command sdplan keeps without understanding (written back
        #: verbatim, after its own flags), and the text each generation value was read from.
        self.kept_args: list[str] = []
        self.generation_text: dict[str, str] = {}
        self.undo_stack = QUndoStack(self)
        self._lora_cache: tuple[object, dict | None] = (None, None)
        self.error: PlanError | None = None
        self.fit = None
        self._effects: dict[str, dict[str, dict[str, int]]] = {}
        pl = placement or Placement()
        self.plan: Plan = resolve(pl, inventory, profile)
        self._estimate()

    # ------------------------------------------------------------------ state
    @property
    def placement(self) -> Placement:
        """The canonical placement of the current plan (what edits start from)."""
        return self.plan.placement

    def modules(self) -> list[str]:
        """Modules shown as cards: the profile's, those the user added, and those the
        placement names explicitly; in :data:`MODULES` order."""
        shown = set(self.profile.modules) if self.profile else set()
        shown |= set(self.extra_modules)
        shown |= set(self.placement.runtime) | set(self.placement.params)
        return [m for m in MODULES if m in shown]

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

    def set_auto_fit(self, on: bool) -> bool:
        """Turn sd-cli's ``--auto-fit`` on (the board shows the placement it would choose) or
        off (back to the default placement). Returns True when the plan changed."""
        return self.edit(self.placement.with_auto_fit(on),
                         "sd-cli auto-fit" if on else "auto-fit off")

    def pin_auto_fit(self) -> bool:
        """Replace ``--auto-fit`` with the explicit strings of its choice (same plan, sd-cli
        no longer decides). False when the plan is not auto-fit's."""
        pinned = self.pinned_auto_fit()
        return pinned is not None and self.edit(pinned, "pin auto-fit's placement")

    def module_bytes(self, module: str) -> int | None:
        """Weight bytes of ``module`` from the profile, or None when unknown."""
        mp = self.profile.get(module) if self.profile else None
        return mp.total if mp is not None else None

    def device(self, name: str):  # noqa: ANN201 - Device
        """The inventory device called ``name``."""
        return next(d for d in self.inventory if d.name == name)

    def residency_effects(self, module: str) -> dict[str, dict[str, int]]:
        """What each other residency of ``module`` would change: mode (``runtime``,
        ``device`` = weights in RAM on the CPU, ``disk``) -> device -> bytes its estimated
        total would drop (negative: grow). Empty without an estimate; cached per plan."""
        key = module  # the cache empties whenever the plan or its estimate changes
        cached = self._effects.get(key)
        if cached is not None:
            return cached
        out: dict[str, dict[str, int]] = {}
        if self.fit is not None and self.profile is not None and module in self.profile.modules:
            from sdplan.core.planning.estimate import estimate_plan

            cpu = next((d.name for d in self.inventory if d.type == "cpu"), None)
            g = self.generation
            current = self.plan.modules[module].params.mode
            runs_on = self.plan.modules[module].devices
            for mode in ("runtime", "device", "disk"):
                if mode == current or (mode == "device" and (cpu is None or cpu in runs_on)):
                    continue  # "in RAM" on the CPU is where it runs already
                try:
                    pl = self.placement.set_residency(module, mode, cpu if mode == "device"
                                                      else None)
                    plan = resolve(pl, self.inventory, self.profile)
                    alt = estimate_plan(plan, self.profile, self.inventory,
                                        width=int(g.get("width") or 1024),
                                        height=int(g.get("height") or 1024),
                                        batch=int(g.get("batch_count") or 1))
                except (PlanError, ValueError):
                    continue
                names = set(self.fit.devices) | set(alt.devices)
                out[mode] = {d: (self.fit.devices[d].total if d in self.fit.devices else 0)
                             - (alt.devices[d].total if d in alt.devices else 0)
                             for d in sorted(names)}
        self._effects[key] = out
        return out

    def peak_module(self, device: str) -> tuple[str, str] | None:
        """``(module, part)`` that sets ``device``'s transient peak (``staging`` or
        ``compute``), or None."""
        fit = self.fit
        if fit is None or device not in fit.devices:
            return None
        best = max(fit.modules.values(), key=lambda e: e.staging.get(device, 0)
                   + e.compute.get(device, 0), default=None)
        if best is None or not (best.staging.get(device, 0) + best.compute.get(device, 0)):
            return None
        part = "compute" if best.compute.get(device, 0) >= best.staging.get(device, 0) \
            else "staging"
        return best.module, part

    # ------------------------------------------------------------------ re-planning
    def _estimate(self) -> None:
        self.fit = None
        self._effects = {}
        if self.profile is None:
            return
        from sdplan.core.planning.estimate import estimate_plan

        g = self.generation
        size = (int(g.get("width") or 1024), int(g.get("height") or 1024),
                int(g.get("batch_count") or 1))
        try:
            self.fit = estimate_plan(self.plan, self.profile, self.inventory,
                                     width=size[0], height=size[1], batch=size[2],
                                     engine="sdplan", measured=self._measured(size),
                                     loras=self._loras())
        except ValueError as exc:
            self.status.emit(f"estimate unavailable: {exc}")

    def _measured(self, size: tuple[int, int, int]) -> dict[str, int] | None:
        """Compute bytes per module of sdplan's engine for the loaded files at ``size``
        (width, height, batch), by a dry run of its graphs on the CPU, cached per files
        and size; None without files or when no dry run is possible."""
        if not self.model_files:
            return None
        key = (repr(sorted(self.model_files.items())), size)
        cache = self.__dict__.setdefault("_compute_cache", {})
        if key not in cache:
            try:
                from sdplan.core.pipelines.compute import measure_compute

                cache[key] = measure_compute(self.model_files, width=size[0], height=size[1],
                                             batch=size[2]) or None
            except Exception as exc:  # noqa: BLE001 - the fitted figures stand in
                log.info("no dry run of the engine: %s", exc)
                cache[key] = None
        return cache[key]

    def _loras(self) -> dict | None:
        """At-runtime LoRA bytes per module for the prompt's tags (None without LoRAs or
        when they cannot be planned: the reason goes to the status bar)."""
        from sdplan.core.pipelines.stages.inputs import plan_loras

        g = self.generation
        prompt = str(g.get("prompt") or "")
        if "<lora:" not in prompt or not self.model_files:
            return None
        key = (prompt, g.get("lora_model_dir"), g.get("lora_apply_mode"), repr(self.model_files), self.plan.placement)
        if self._lora_cache[0] != key:
            try:
                planned = plan_loras(prompt, str(g.get("lora_model_dir") or "."),
                                     str(g.get("lora_apply_mode") or "auto"), self.model_files, self.plan)
                self._lora_cache = (key, planned.profiles)
            except (SdplanError, OSError, ValueError) as exc:
                self.status.emit(f"LoRA not counted in the estimate: {exc}")
                self._lora_cache = (key, None)
        return self._lora_cache[1]

    def _apply(self, placement: Placement, source: str) -> None:
        """Resolve ``placement`` and make it current (called by undo commands)."""
        self.plan = resolve(placement, self.inventory, self.profile)
        self._estimate()
        if self.error is not None and source != "strings":
            self.error = None
            self.errorChanged.emit(None)
        self.planChanged.emit(source)

    def _push(self, new: Placement, text: str, merge: int = -1, source: str = "board") -> bool:
        """Resolve ``new`` (raising PlanError before anything changes) and push it."""
        plan = resolve(new, self.inventory, self.profile)
        if plan.placement == self.placement and source != "strings":
            return False
        self.undo_stack.push(_PlacementCommand(self, self.placement, plan.placement, text,
                                               merge, source))
        return True

    def edit(self, new: Placement, text: str) -> bool:
        """Make ``new`` current as one undoable step named ``text``; a PlanError is shown on
        the status bar and leaves the plan as it was. Returns True when it changed."""
        try:
            return self._push(new, text)
        except PlanError as exc:
            self.status.emit(str(exc))
            return False

    # ------------------------------------------------------------------ board edits
    def assign(self, module: str, device: str) -> bool:
        """Run ``module`` on ``device`` alone."""
        if module not in self.modules():
            self.extra_modules.append(module)
        return self.edit(self.editable().assign(module, device), f"{module} on {device}")

    def follow_default(self, module: str) -> bool:
        """Remove ``module``'s own ``--backend`` entry so it runs on the default (all=)."""
        base = self.editable()
        runtime = {m: v for m, v in base.runtime.items() if m != module}
        return self.edit(dataclasses.replace(base, runtime=runtime),
                         f"{module} follows the default")

    def add_split_device(self, module: str, device: str) -> bool:
        """Add ``device`` to ``module``'s layer split; refuses modules that cannot split
        (status message with the reason). Returns True when the plan changed."""
        if module not in SPLITTABLE:
            self.status.emit(self.split_refusal(module))
            return False
        return self.edit(self.editable().add_split_device(module, device),
                         f"split {module} onto {device}")

    @staticmethod
    def split_refusal(module: str) -> str:
        """Why ``module`` cannot take a second device (spec section 1)."""
        return (f"{module} cannot run on several devices: only the diffusion model and the "
                "text encoders have transformer blocks to split")

    def remove_split_device(self, module: str, device: str) -> bool:
        """Take ``device`` out of ``module``'s split."""
        return self.edit(self.editable().remove_split_device(module, device),
                         f"remove {device} from {module}")

    def set_residency(self, module: str, mode: str, device: str | None = None) -> bool:
        """Residency of ``module``: ``runtime`` (on its device), ``device`` (weights on
        ``device``, staged when used) or ``disk``."""
        try:
            new = self.editable().set_residency(module, mode, device)
        except PlanError as exc:
            self.status.emit(str(exc))
            return False
        return self.edit(new, f"{module} weights: {device or mode}")

    def set_budget(self, device: str | None, gib: float | None, *, merge: bool = False) -> bool:
        """``--max-vram`` of ``device`` (None: the default) in GiB; 0 or None removes it.
        ``merge`` folds consecutive calls (a marker drag) into one undo step."""
        value = None if gib is None or gib == 0 else round(float(gib), 2)
        try:
            new = self.placement.set_budget(device, value)
            return self._push(new, f"budget {device or 'default'}",
                              _MERGE_BUDGET if merge else -1)
        except PlanError as exc:
            self.status.emit(str(exc))
            return False

    def set_default(self, device: str | Sequence[str]) -> bool:
        """The ``--backend`` default device (or device list)."""
        return self.edit(self.editable().set_default(device), "default device")

    def set_rpc_servers(self, servers: Sequence[str], devices: Sequence[Device] = ()) -> None:
        """Set ``--rpc-servers`` to ``servers`` whose devices (``RPC0``, ``RPC1``... as a
        subprocess query named them, see :class:`sdplan.app.rpc.RpcQuery`) are ``devices``;
        they replace the previous RPC columns. This process never registers the servers
        itself: a registered server that dies would abort it."""
        self.rpc_devices = list(devices)
        local = Inventory(tuple(d for d in self.inventory if d.registry.upper() != "RPC"))
        self.set_inventory(Inventory((*local, *self.rpc_devices)))
        self.edit(self.placement.with_rpc_servers(servers), "RPC servers")

    def add_module(self, module: str) -> None:
        """Show a card for ``module`` even though no loaded file contains it."""
        if module not in self.extra_modules:
            self.extra_modules.append(module)
            self.modelChanged.emit()
            self.planChanged.emit("board")

    # ------------------------------------------------------------------ strings
    def _parse_strings(self, backend: str, params_backend: str, max_vram: str):  # noqa: ANN202
        """``(placement, plan)`` of the three flag values, or the PlanError published on
        :attr:`errorChanged` (None when they resolve: a previous error is cleared)."""
        try:
            parsed = Placement.from_strings(
                backend, params_backend, max_vram, stream_layers=self.placement.stream_layers,
                rpc_servers=self.placement.rpc_servers)
            plan = resolve(parsed, self.inventory, self.profile)
        except PlanError as exc:
            self.error = exc
            self.errorChanged.emit(exc)
            return None
        self.clear_string_error()
        return parsed, plan

    def clear_string_error(self) -> None:
        """Forget the flag fields' error (Escape put them back)."""
        if self.error is not None:
            self.error = None
            self.errorChanged.emit(None)

    def check_strings(self, backend: str, params_backend: str, max_vram: str):  # noqa: ANN201
        """Check the three flag values while they are typed, without changing the plan: an
        error is published on :attr:`errorChanged` (flag and span); otherwise returns the
        estimate of the plan they would give (a FitReport, or None without a profile)."""
        parsed = self._parse_strings(backend, params_backend, max_vram)
        if parsed is None or self.profile is None:
            return None
        from sdplan.core.planning.estimate import estimate_plan

        g = self.generation
        try:
            return estimate_plan(parsed[1], self.profile, self.inventory,
                                 width=int(g.get("width") or 1024),
                                 height=int(g.get("height") or 1024),
                                 batch=int(g.get("batch_count") or 1))
        except ValueError:
            return None

    def set_strings(self, backend: str, params_backend: str, max_vram: str) -> bool:
        """Re-plan from the three flag values (an applied edit: Enter or leaving a field),
        one undo step.

        A :class:`PlanError` is published on :attr:`errorChanged` (with its flag and
        span) and the plan stays as it was. Returns True when the strings resolved.
        """
        parsed = self._parse_strings(backend, params_backend, max_vram)
        if parsed is None:
            return False
        self._push(parsed[0], "edit flags", source="strings")
        return True

    def command_line(self) -> str:
        """The full sd-cli command for the model files, placement and generation settings."""
        gen = {k: v for k, v in self.generation.items()
               if v not in (None, "") and k in GENERATION_FLAGS}
        return sdcli_command_line(self.placement, self.model_files, gen,
                                  extra=merge_flags(self.kept_args, self.model_file_flags),
                                  raw=self.generation_text)

    def import_command(self, text: str) -> list[str]:
        """Take model paths, placement and generation settings from a pasted sd-cli
        command (read as its shell reads it: :mod:`sdplan.core.planning.cmdline`); every
        other argument is kept and written back verbatim by :meth:`command_line`. Returns
        the arguments sdplan keeps without understanding.

        Raises:
            PlanError: the command cannot be read or its placement is wrong (the plan
                stays as it was).
        """
        cmd = import_sdcli_command(text)
        resolve(cmd.placement, self.inventory, self.profile)  # raise before changing
        if cmd.model_files:
            files = {k: [v] if isinstance(v, str) else list(v)
                     for k, v in cmd.model_files.items()}
            self.load_model_files(files, strict=False)
        self.generation.update(cmd.generation)
        self.generation_text = dict(cmd.generation_text)
        self.kept_args = cmd.extra_args()
        self._push(cmd.placement, "paste sd-cli command", source="load")
        self.planChanged.emit("load")
        return cmd.unknown_args

    def import_png(self, path: str | Path) -> list[str]:
        """Restore a run from a picture's metadata (sd-cli's ``parameters`` text or sdplan's
        own): prompt and settings, the model files that exist here, and the placement strings.
        Returns what was taken (for the status bar).

        Raises:
            SdplanError: the picture records no generation (nothing changes); PlanError: its
                placement does not resolve on these devices (settings and files are kept).
        """
        from sdplan.core.pipelines.stages.results import read_generation

        try:
            got = read_generation(path)
        except OSError as exc:
            raise SdplanError(f"{path}: {exc.strerror or exc}") from None
        if not got.settings and not got.model_files:
            raise SdplanError(f"{path}: no generation parameters in this picture")
        taken: list[str] = []
        settings = {k: v for k, v in got.settings.items() if k in GENERATION_FLAGS}
        if settings:
            self.generation.update(settings)
            taken.append("settings")
        files = {k: [p for p in v if Path(p).is_file()] for k, v in got.model_files.items()}
        files = {k: v for k, v in files.items() if v and k in MODEL_FLAGS}
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
            self._push(placement, "placement from a picture", source="load")
            taken.append("placement")
        self.planChanged.emit("load")
        return taken

    # ------------------------------------------------------------------ models
    def load_model_files(self, flags: Mapping[str, Sequence[str]], *, strict: bool = True) -> None:
        """Read model files (headers only) into the profile; ``flags`` maps sd-cli model
        keys (``model``, ``diffusion_model``, ``t5xxl``...) to paths.

        Raises:
            SdplanError: a file is unreadable or not a model (only when ``strict``; else
                the paths are kept for the command and the message goes to the status bar).
        """
        from sdplan.core.modelfiles.checkpoint import read_model_files
        from sdplan.core.pipelines.size_rule import size_multiple

        files = {k: list(v) for k, v in flags.items()}
        try:
            ms = read_model_files(files)
            profile = ms.profile()
            files = files_by_flag(ms, files)
            extra = model_file_flags([f.metadata for f in ms.files], ms.architecture.family)
            multiple = size_multiple(ms)
        except (SdplanError, OSError, ValueError) as exc:
            if strict:
                raise  # nothing changed
            self.status.emit(f"model files not read: {exc}")
            self.model_file_flags = []  # unread files: nothing known about them
            self.size_multiple = None
        else:
            self._family_defaults(profile)
            self.profile = profile
            self.model_file_flags = extra
            self.size_multiple = multiple
        self.model_files = files
        self._apply(self.placement, "load")
        self.modelChanged.emit()

    def _family_defaults(self, profile: Profile | None) -> None:
        """Take the new model family's generation settings (Chroma's CFG 4...; see
        :func:`generation_defaults`) when the architecture changes; a pasted command or an
        imported plan applies its own settings after this."""
        arch = profile.architecture if profile is not None else None
        if arch != (self.profile.architecture if self.profile is not None else None):
            self.generation.update(generation_defaults(arch))

    def open_files(self, paths: Sequence[str]) -> None:
        """Open model files of any kind (classified by their tensor names). They join the
        files already open (a VAE or text encoder next to a diffusion model); when they
        clash with those (another whole checkpoint), they replace them.

        Raises:
            SdplanError: a file is unreadable or not a model (nothing changes then).
        """
        new = [str(p) for p in paths]
        flags = {k: list(v) for k, v in self.model_files.items()}
        flags.setdefault("model", []).extend(p for p in new if p not in flags["model"])
        try:
            self.load_model_files(flags)
        except (SdplanError, OSError, ValueError):
            if not self.model_files:
                raise
            self.load_model_files({"model": new})

    def set_profile(self, profile: Profile | None) -> None:
        """Plan with ``profile`` (block sizes) instead of the loaded files."""
        self._family_defaults(profile)
        self.profile = profile
        self._apply(self.placement, "load")
        self.modelChanged.emit()

    def plan_for_builtin(self, name: str) -> None:
        """Plan for the built-in model profile ``name`` (``flux1-dev-q8_0``...; see
        :func:`sdplan.core.planning.builtin_profiles.list_profiles`) without its files: the open
        model files are closed.

        Raises:
            ModelFileError: unknown name or a malformed shipped index.
        """
        from sdplan.core.planning.builtin_profiles import load_builtin_profile

        profile = load_builtin_profile(name)
        self.model_files = {}
        self.model_file_flags = []
        self.size_multiple = None
        self.set_profile(profile)
        self.status.emit(f"planning for the built-in profile {name} (no files needed)")

    # ------------------------------------------------------------------ devices
    def set_inventory(self, inventory: Inventory) -> None:
        """Plan for other devices; keeps the placement when it still resolves, else falls
        back to the default placement (status message says why)."""
        self.inventory = inventory
        try:
            self.plan = resolve(self.placement, inventory, self.profile)
        except PlanError as exc:
            self.status.emit(f"placement reset: {exc}")
            self.plan = resolve(Placement(rpc_servers=self.placement.rpc_servers), inventory,
                                self.profile)
        self._estimate()
        self.inventoryChanged.emit()
        self.planChanged.emit("load")

    def refresh_inventory(self) -> None:
        """Re-read the local devices' free memory from the inventory source (no-op without
        one); the RPC devices stay as last queried.

        Raises:
            SdplanError: the source failed.
        """
        if self.inventory_source is None:
            return
        inv = merge_rpc_devices(self.inventory_source(), self.rpc_devices)
        if inv == self.inventory:
            return
        same_devices = [d.name for d in inv] == [d.name for d in self.inventory]
        if same_devices:
            self.inventory = inv
            self._apply(self.placement, "load")
        else:
            self.set_inventory(inv)

    def set_generation(self, **values: object) -> None:
        """Update generation settings (size and batch change the compute estimate)."""
        changed = {k: v for k, v in values.items() if self.generation.get(k) != v}
        if not changed:
            return
        self.generation.update(changed)
        self._estimate()
        self.planChanged.emit("generation")

    # ------------------------------------------------------------------ plan JSON
    def plan_json(self) -> dict[str, object]:
        """The plan as saved by "Export plan" (:func:`sdplan.core.planning.session.plan_document`)."""
        return plan_document(self.plan, self.model_files, self.generation, self.extra_modules,
                             self.fit)

    def load_plan_json(self, data: object, *, source: str = "plan") -> None:
        """Restore a plan saved by :meth:`plan_json`.

        Raises:
            PlanError: the JSON is not a plan or its strings do not resolve here.
        """
        saved = read_plan_document(data, source)
        resolve(saved.placement, self.inventory, self.profile)
        if saved.model_files and saved.model_files != self.model_files:
            self.load_model_files(saved.model_files, strict=False)
        self.generation.update(saved.generation)
        self.extra_modules = list(saved.extra_modules)
        self._push(saved.placement, "import plan", source="load")
        self.modelChanged.emit()
        self.planChanged.emit("load")

    def reuse_result(self, settings: Mapping[str, object],
                     model_files: Mapping[str, Sequence[str]] | None = None,
                     placement: Mapping[str, str] | None = None,
                     architecture: str | None = None) -> list[str]:
        """Put a result's settings back (the gallery's and the strip's "Reuse settings"):
        its generation settings (sd-cli keys, through
        :func:`~sdplan.core.pipelines.stages.results.reusable_settings`: what the command line's
        ``--from-image`` takes; others are ignored), its model files when
        they all exist here, and its placement strings when they resolve on these devices.
        Returns one note per part left as it was (files not found, a placement that does
        not resolve); the panel reloads on ``planChanged("load")``."""
        notes: list[str] = []
        files = {k: list(v) for k, v in (model_files or {}).items()}
        if files and files != self.model_files:
            missing = [p for v in files.values() for p in v if not Path(p).is_file()]
            if missing:
                notes.append(f"model files not found here: {', '.join(missing)}")
            else:
                self.load_model_files(files, strict=False)
        if placement:
            try:
                new = Placement.from_strings(
                    placement.get("backend", ""), placement.get("params_backend", ""),
                    placement.get("max_vram", ""), stream_layers=self.placement.stream_layers,
                    rpc_servers=self.placement.rpc_servers)
                self._push(new, "reuse settings", source="load")
            except PlanError as exc:
                notes.append(f"placement not restored: {exc}")
        from sdplan.core.pipelines.stages.parameters import ImageParameters
        from sdplan.core.pipelines.stages.results import reusable_settings

        known = set(GENERATION_FLAGS) - {"output"}
        given = reusable_settings(ImageParameters(dict(settings)), architecture)
        self.generation.update({k: v for k, v in given.items() if k in known})
        self._estimate()
        self.planChanged.emit("load")
        return notes

    def save_plan(self, path: str | Path) -> None:
        """Write :meth:`plan_json` to ``path`` (raises OSError)."""
        save_plan_file(path, self.plan_json())
