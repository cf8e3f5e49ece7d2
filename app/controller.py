"""The board's controller: a :class:`~sdplan.core.session.session.Session` (the board's
state and operations, without Qt) wrapped in Qt signals and an undo stack.

Every edit (a drop on the board, a residency switch, a budget, an applied flag field) is a
new placement the session returns; it becomes one step on the :class:`QUndoStack`, is
resolved and estimated at once, and views redraw from :attr:`PlanController.plan` and
:attr:`PlanController.fit` (never a copy of the placement). An import (a pasted command, a
picture, a saved plan, "Reuse settings") is one step that restores the whole session state
before it (:meth:`~sdplan.core.session.board.BoardSession.snapshot`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QUndoCommand, QUndoStack
from sdplan.core.errors import PlanError
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan_types import Plan
from sdplan.core.planning.profile import Profile
from sdplan.core.session.board import InventorySource
from sdplan.core.session.paste import PastedCommand
from sdplan.core.session.session import Session
from sdplan.core.session.state import DEFAULT_GENERATION, SessionState

__all__ = ["DEFAULT_GENERATION", "InventorySource", "PlanController"]

#: Undo-merge id for the moves of one budget-marker drag.
_MERGE_BUDGET = 2


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


class _StateCommand(QUndoCommand):
    """One undoable import: the whole session state before and after it. The first redo
    (when pushed) finds the import already applied."""

    def __init__(self, ctl: PlanController, old: SessionState, new: SessionState,
                 text: str) -> None:
        super().__init__(text)
        self._ctl, self.old, self.new = ctl, old, new
        self._done = True

    def redo(self) -> None:
        if self._done:
            self._done = False
            return
        self._ctl._restore(self.new)

    def undo(self) -> None:
        self._ctl._restore(self.old)


class PlanController(QObject):
    """Current placement + inventory + profile -> plan and fit, with undo (see module
    docstring). The session is :attr:`session`; its state reads through this object.

    Signals:
        planChanged(str): the plan or fit changed; the argument is the source of the change
            (``board``, ``strings``, ``undo``, ``load``, ``generation``, ``dialect``: the
            sd-cli dialect of the written command). String fields
            rewrite themselves unless the source is ``strings`` (the user is typing there).
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
        self.undo_stack = QUndoStack(self)
        self.session = Session(inventory, profile, placement, inventory_source=inventory_source,
                               notify=self.status.emit)

    # ------------------------------------------------------------------ the session's state
    inventory = property(lambda self: self.session.inventory,
                         doc="The devices planned for.")
    profile = property(lambda self: self.session.profile, doc="The model profile, or None.")
    plan = property(lambda self: self.session.plan, doc="The resolved plan.")
    fit = property(lambda self: self.session.fit, doc="The plan's estimate, or None.")
    placement = property(lambda self: self.session.placement, doc="The current placement.")
    model_files = property(lambda self: self.session.model_files,
                           doc="sd-cli model-file key -> paths.")
    model_file_flags = property(lambda self: self.session.model_file_flags,
                                doc="sd-cli flags the open files call for.")
    size_multiple = property(lambda self: self.session.size_multiple,
                             doc="Pixels each side must be a multiple of (None: unknown).")
    extra_modules = property(lambda self: self.session.extra_modules,
                             doc="Modules added to the board by hand.")
    generation = property(lambda self: self.session.generation,
                          doc="Generation settings by sd-cli's request keys.")
    kept_args = property(lambda self: self.session.kept_args,
                         doc="A pasted command's arguments kept verbatim.")
    error = property(lambda self: self.session.error, doc="The flag fields' PlanError, or None.")

    @property
    def inventory_source(self) -> InventorySource | None:
        """Where local devices are read again from (None: a fixed inventory)."""
        return self.session.inventory_source

    @inventory_source.setter
    def inventory_source(self, source: InventorySource | None) -> None:
        self.session.inventory_source = source

    @property
    def rpc_devices(self) -> list[Device]:
        """Devices of the ``--rpc-servers``, as the last subprocess query returned them."""
        return self.session.rpc_devices

    @rpc_devices.setter
    def rpc_devices(self, devices: list[Device]) -> None:
        self.session.rpc_devices = list(devices)

    def modules(self) -> list[str]:
        """Modules shown as cards (:meth:`~sdplan.core.session.board.BoardSession.modules`)."""
        return self.session.modules()

    def module_bytes(self, module: str) -> int | None:
        """Weight bytes of ``module`` from the profile, or None when unknown."""
        return self.session.module_bytes(module)

    def device(self, name: str) -> Device:
        """The inventory device called ``name``."""
        return self.session.device(name)

    def residency_effects(self, module: str) -> dict[str, dict[str, int]]:
        """What each other residency of ``module`` would change, per device in bytes
        (:meth:`~sdplan.core.session.board.BoardSession.residency_effects`)."""
        return self.session.residency_effects(module)

    def peak_module(self, device: str) -> tuple[str, str] | None:
        """``(module, part)`` that sets ``device``'s transient peak, or None."""
        return self.session.peak_module(device)

    def predicted_time(self) -> Any:
        """The plan's predicted seconds (a :class:`~sdplan.core.planning.timing.TimeReport`),
        or None (:meth:`~sdplan.core.session.estimates.Estimates.predicted_time`)."""
        return self.session.predicted_time()

    split_refusal = staticmethod(Session.split_refusal)

    # ------------------------------------------------------------------ applying, undo
    def _apply(self, placement: Placement, source: str) -> None:
        """Make ``placement`` current (called by undo commands)."""
        self.session.apply(placement)
        if self.session.error is not None and source != "strings":
            self.session.error = None
            self.errorChanged.emit(None)
        self.planChanged.emit(source)

    def _restore(self, state: SessionState) -> None:
        """Put a whole session state back (undo and redo of an import)."""
        self.session.restore(state)
        self.modelChanged.emit()
        self.planChanged.emit("load")

    def _push(self, new: Placement, text: str, merge: int = -1, source: str = "board") -> bool:
        """Resolve ``new`` (raising PlanError before anything changes) and push it."""
        plan = self.session.resolve(new)
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

    def _edit_by(self, make: Callable[[], Placement], text: str | Callable[[], str]) -> bool:
        """:meth:`edit` with the placement ``make`` returns (its PlanError to the status bar)."""
        try:
            new = make()
        except PlanError as exc:
            self.status.emit(str(exc))
            return False
        return self.edit(new, text if isinstance(text, str) else text())

    def _import(self, text: str, run: Callable[[], Any]) -> Any:
        """Run an import on the session as one undo step restoring everything before it;
        nothing is pushed when ``run`` raises before changing anything."""
        before = self.session.snapshot()
        try:
            out = run()
        finally:
            after = self.session.snapshot()
            if after != before:
                self.undo_stack.push(_StateCommand(self, before, after, text))
            self.modelChanged.emit()
            self.planChanged.emit("load")
        return out

    # ------------------------------------------------------------------ board edits
    def set_auto_fit(self, on: bool) -> bool:
        """Turn sd-cli's ``--auto-fit`` on (the board shows the placement it would choose) or
        off. Returns True when the plan changed."""
        return self.edit(self.placement.with_auto_fit(on),
                         "sd-cli auto-fit" if on else "auto-fit off")

    def pin_auto_fit(self) -> bool:
        """Replace ``--auto-fit`` with the explicit strings of its choice. False when the
        plan is not auto-fit's."""
        pinned = self.session.pinned_auto_fit()
        return pinned is not None and self.edit(pinned, "pin auto-fit's placement")

    def assign(self, module: str, device: str) -> bool:
        """Run ``module`` on ``device`` alone."""
        return self.edit(self.session.assign(module, device), f"{module} on {device}")

    def follow_default(self, module: str) -> bool:
        """Remove ``module``'s own ``--backend`` entry so it runs on the default (all=)."""
        return self.edit(self.session.follow_default(module), f"{module} follows the default")

    def add_split_device(self, module: str, device: str) -> bool:
        """Add ``device`` to ``module``'s layer split; refuses modules that cannot split
        (status message with the reason). Returns True when the plan changed."""
        return self._edit_by(lambda: self.session.add_split_device(module, device),
                             f"split {module} onto {device}")

    def remove_split_device(self, module: str, device: str) -> bool:
        """Take ``device`` out of ``module``'s split."""
        return self.edit(self.session.remove_split_device(module, device),
                         f"remove {device} from {module}")

    def set_residency(self, module: str, mode: str, device: str | None = None) -> bool:
        """Residency of ``module``: ``runtime``, ``device`` (weights on ``device``) or
        ``disk``."""
        return self._edit_by(lambda: self.session.set_residency(module, mode, device),
                             f"{module} weights: {device or mode}")

    def set_budget(self, device: str | None, gib: float | None, *, merge: bool = False) -> bool:
        """``--max-vram`` of ``device`` (None: the default) in GiB; 0 or None removes it.
        ``merge`` folds consecutive calls (a marker drag) into one undo step."""
        try:
            return self._push(self.session.set_budget(device, gib), f"budget {device or 'default'}",
                              _MERGE_BUDGET if merge else -1)
        except PlanError as exc:
            self.status.emit(str(exc))
            return False

    def set_default(self, device: str | Sequence[str]) -> bool:
        """The ``--backend`` default device (or device list)."""
        return self.edit(self.session.set_default(device), "default device")

    def set_rpc_servers(self, servers: Sequence[str], devices: Sequence[Device] = ()) -> None:
        """Set ``--rpc-servers`` to ``servers`` whose devices (``RPC0``... as a subprocess
        query named them, see :class:`sdplan.app.rpc.RpcQuery`) are ``devices``; they replace
        the previous RPC columns. This process never registers the servers itself."""
        self.set_rpc_devices(devices)
        self.edit(self.placement.with_rpc_servers(servers), "RPC servers")

    def set_rpc_devices(self, devices: Sequence[Device]) -> None:
        """The RPC servers' devices replace the previous ones (columns rebuilt)."""
        self.session.set_rpc_devices(devices)
        self.inventoryChanged.emit()
        self.planChanged.emit("load")

    def add_module(self, module: str) -> None:
        """Show a card for ``module`` even though no loaded file contains it."""
        if self.session.add_module(module):
            self.modelChanged.emit()
            self.planChanged.emit("board")

    # ------------------------------------------------------------------ strings
    def _parse_strings(self, backend: str, params_backend: str,
                       max_vram: str) -> tuple[Placement, Plan] | None:
        """``(placement, plan)`` of the three flag values, or None with the PlanError
        published on :attr:`errorChanged` (a previous error is cleared when they resolve)."""
        try:
            parsed = self.session.parse_strings(backend, params_backend, max_vram)
        except PlanError as exc:
            self.session.error = exc
            self.errorChanged.emit(exc)
            return None
        self.clear_string_error()
        return parsed

    def clear_string_error(self) -> None:
        """Forget the flag fields' error (Escape put them back)."""
        if self.session.error is not None:
            self.session.error = None
            self.errorChanged.emit(None)

    def check_strings(self, backend: str, params_backend: str, max_vram: str) -> Any:
        """Check the three flag values while they are typed, without changing the plan: an
        error is published on :attr:`errorChanged` (flag and span); otherwise returns the
        estimate of the plan they would give (a FitReport, or None without a profile)."""
        parsed = self._parse_strings(backend, params_backend, max_vram)
        return None if parsed is None else self.session.estimate_of(parsed[1])

    def set_strings(self, backend: str, params_backend: str, max_vram: str) -> bool:
        """Re-plan from the three flag values (an applied edit: Enter or leaving a field),
        one undo step; a PlanError is published on :attr:`errorChanged` and the plan stays.
        Returns True when the strings resolved."""
        parsed = self._parse_strings(backend, params_backend, max_vram)
        if parsed is None:
            return False
        self._push(parsed[0], "edit flags", source="strings")
        return True

    def command_line(self) -> str:
        """The full sd-cli command for the model files, placement and generation settings,
        written for :attr:`sdcli_dialect`."""
        return self.session.command_line()

    @property
    def sdcli_dialect(self) -> str | None:
        """The sd-cli dialect the command is written for (``newest``, ``snapshot``; None: the
        placement as held)."""
        return self.session.sdcli_dialect

    def set_sdcli_dialect(self, dialect: str | None) -> None:
        """Write the command for ``dialect`` from now on (kept in the saved plan); views
        redraw (``planChanged("dialect")``).

        Raises:
            PlanError: an unknown dialect.
        """
        if dialect != self.session.sdcli_dialect:
            self.session.set_sdcli_dialect(dialect)
            self.planChanged.emit("dialect")

    def dialect_changes(self) -> list[str]:
        """What the command for the chosen dialect changes of the one for the other dialect
        (``+ --auto-fit off``...; :func:`~sdplan.core.session.modules.command_changes`), then
        the notes on what writing it added or left out; empty with no dialect chosen."""
        from sdplan.core.session.modules import command_changes

        dialect = self.session.sdcli_dialect
        if dialect is None:
            return []
        other = "snapshot" if dialect == "newest" else "newest"
        line, notes = self.session.written_command(dialect)
        return [*command_changes(self.session.written_command(other)[0], line), *notes]

    # ------------------------------------------------------------------ imports
    def import_command(self, text: str) -> PastedCommand:
        """Take files, placement and settings from a pasted sd-cli command, as one undo step
        restoring everything it changed
        (:meth:`~sdplan.core.session.session.Session.import_command`). Returns the arguments
        sdplan keeps without understanding and the notes (files not on this machine...).

        Raises:
            PlanError: the command cannot be read or its placement is wrong (nothing changes).
        """
        return self._import("paste sd-cli command", lambda: self.session.import_command(text))

    def import_png(self, path: str | Path) -> list[str]:
        """Restore a run from a picture's metadata as one undo step
        (:meth:`~sdplan.core.session.session.Session.import_png`). Returns what was taken.

        Raises:
            SdplanError: the picture records no generation; PlanError: its placement does
                not resolve here (settings and files are kept).
        """
        return self._import("settings from a picture", lambda: self.session.import_png(path))

    def load_plan_json(self, data: object, *, source: str = "plan") -> None:
        """Restore a plan saved by :meth:`plan_json`, as one undo step.

        Raises:
            PlanError: the JSON is not a plan or its strings do not resolve here.
        """
        self._import("import plan", lambda: self.session.load_plan_json(data, source=source))

    def reuse_result(self, settings: Mapping[str, object],
                     model_files: Mapping[str, Sequence[str]] | None = None,
                     placement: Mapping[str, str] | None = None,
                     architecture: str | None = None) -> list[str]:
        """Put a result's settings back (the gallery's and the strip's "Reuse settings") as
        one undo step (:meth:`~sdplan.core.session.session.Session.reuse_result`). Returns
        one note per part left as it was."""
        return self._import("reuse settings", lambda: self.session.reuse_result(
            settings, model_files, placement, architecture))

    # ------------------------------------------------------------------ models
    def _reloaded(self) -> None:
        self.planChanged.emit("load")
        self.modelChanged.emit()

    def load_model_files(self, flags: Mapping[str, Sequence[str]], *, strict: bool = True) -> None:
        """Read model files (headers only) into the profile
        (:meth:`~sdplan.core.session.board.BoardSession.load_model_files`).

        Raises:
            SdplanError: a file is unreadable or not a model (only when ``strict``).
        """
        self.session.load_model_files(flags, strict=strict)
        self._reloaded()

    def open_files(self, paths: Sequence[str]) -> None:
        """Open model files of any kind; they join or replace the open ones.

        Raises:
            SdplanError: a file is unreadable or not a model (nothing changes then).
        """
        self.session.open_files(paths)
        self._reloaded()

    def set_profile(self, profile: Profile | None) -> None:
        """Plan with ``profile`` (block sizes) instead of the loaded files."""
        self.session.set_profile(profile)
        self._reloaded()

    def plan_for_builtin(self, name: str) -> None:
        """Plan for the built-in model profile ``name`` without its files.

        Raises:
            ModelFileError: unknown name or a malformed shipped index.
        """
        self.session.plan_for_builtin(name)
        self._reloaded()

    # ------------------------------------------------------------------ devices
    def set_inventory(self, inventory: Inventory) -> None:
        """Plan for other devices; keeps the placement when it still resolves, else falls
        back to the default placement (status message says why)."""
        self.session.set_inventory(inventory)
        self.inventoryChanged.emit()
        self.planChanged.emit("load")

    def refresh_inventory(self) -> None:
        """Re-read the local devices' free memory (no-op without a source).

        Raises:
            SdplanError: the source failed.
        """
        changed = self.session.refresh_inventory()
        if changed == "devices":
            self.inventoryChanged.emit()
        if changed != "same":
            self.planChanged.emit("load")

    def load_hardware(self, path: str | Path) -> None:
        """Plan for the devices of a saved inventory (refreshes stop).

        Raises:
            InventoryError: the file is not an inventory.
        """
        self.session.load_hardware(path)
        self.inventoryChanged.emit()
        self.planChanged.emit("load")

    def set_generation(self, **values: object) -> None:
        """Update generation settings (size and batch change the compute estimate)."""
        if self.session.set_generation(**values):
            self.planChanged.emit("generation")

    # ------------------------------------------------------------------ plan JSON
    def plan_json(self) -> dict[str, object]:
        """The plan as saved by "Export plan"."""
        return self.session.plan_json()

    def save_plan(self, path: str | Path) -> None:
        """Write :meth:`plan_json` to ``path`` (raises OSError)."""
        self.session.save_plan(path)
