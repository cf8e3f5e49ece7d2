"""The editable placement: the user's intent, as the strings and flags say it or the GUI edits it.

A :class:`Placement` is a frozen value (undo/redo keep snapshots); every edit returns a new
one. It is parsed from flag values with :meth:`Placement.from_strings` (syntax errors raise
:class:`~sdplan.core.errors.PlanError` with spans; device names are checked later by
:func:`sdplan.core.planning.plan.resolve`, which needs an inventory) and written back with
:meth:`Placement.to_strings`. The placement held by a resolved plan is canonical (exact
device names, explicit default); edits on it keep it canonical.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

from sdplan.core.errors import PlanError
from sdplan.core.planning.assignment import (
    ParamsValue,
    Ref,
    RuntimeValue,
    format_gib,
    normalize_module,
    parse_gib,
    split_entries,
)
from sdplan.core.planning.modules import PLACED_MODULES, SPLITTABLE
from sdplan.core.planning.placement_parse import (
    CFG_KEY,
    SPLIT_MODES,
    BudgetEntry,
    last_wins,
    params_not_cfg,
    parse_max_vram,
    parse_split_mode,
    runtime_or_cfg,
)
from sdplan.core.planning.split_ratio import SplitRatio, parse_split_ratio

__all__ = ["BudgetEntry", "Placement", "SPLIT_MODES", "PLACEMENT_VALUE_FLAGS",
           "PLACEMENT_SWITCHES", "scan_placement_args", "add_placement_arguments",
           "placement_from_namespace", "split_flag"]

#: Compatibility flags in the order they are applied, with the ``--backend`` entry each adds.
COMPAT_BACKEND = (("clip_on_cpu", "te=cpu"), ("vae_on_cpu", "vae=cpu"),
                  ("control_net_cpu", "controlnet=cpu"))


@dataclass(frozen=True)
class Placement:
    """Where every module runs, where its weights live, and the memory budgets.

    Attributes:
        default: the ``--backend`` default value, or None (the default device).
        runtime: module -> ``--backend`` value for that module.
        params_default: the ``--params-backend`` default, or None (follow runtime).
        params: module -> residency for that module.
        budget_default: the default ``--max-vram`` in GiB, or None.
        budgets: per-device ``--max-vram`` entries in written order.
        stream_layers: ``--stream-layers``.
        rpc_servers: ``--rpc-servers`` endpoints (``host:port``).
        split_default: the ``--split-mode`` default (``layer``/``row``), or None (layer).
        split_modes: module -> ``--split-mode`` for that module (spec section 12).
        auto_fit: ``--auto-fit`` on: sd-cli derives the placement itself (spec section 13
            for the bare switch, 14.1 for ``--auto-fit on``; :mod:`~sdplan.core.planning.autofit`
            and :mod:`~sdplan.core.planning.autofit_newest` predict it).
        auto_fit_word: how ``--auto-fit`` was written: ``""`` (the bare snapshot switch, or
            absent), ``on`` or ``off`` (the newest sd-cli's values; ``off`` keeps
            ``auto_fit`` False).
        split_ratio: ``--split-ratio`` (spec section 14.4), or None (sd-cli's ``auto``).
        cfg: the ``--backend cfg=DEVICE`` value (spec section 14.5: the device of the second
            diffusion copy for parallel CFG), or None.
        disable_prefetch, disable_segmented_compute: the newest sd-cli's switches (spec
            section 14.2).
        deprecated: compatibility flags used (each gives warning ``deprecated_flag``).
        texts: the joined flag values the spans point into (flag -> text).
        shadowed: overridden entries, still checked at resolution (spec section 11).
    """

    default: RuntimeValue | None = None
    runtime: Mapping[str, RuntimeValue] = field(default_factory=dict)
    params_default: ParamsValue | None = None
    params: Mapping[str, ParamsValue] = field(default_factory=dict)
    budget_default: Decimal | None = None
    budgets: tuple[BudgetEntry, ...] = ()
    stream_layers: bool = False
    rpc_servers: tuple[str, ...] = ()
    split_default: str | None = None
    split_modes: Mapping[str, str] = field(default_factory=dict)
    auto_fit: bool = False
    auto_fit_word: str = ""
    split_ratio: SplitRatio | None = None
    cfg: RuntimeValue | None = None
    disable_prefetch: bool = False
    disable_segmented_compute: bool = False
    deprecated: tuple[str, ...] = field(default=(), compare=False)
    texts: Mapping[str, str] = field(default_factory=dict, compare=False)
    shadowed: tuple[tuple[str, object], ...] = field(default=(), compare=False)

    # ----------------------------------------------------------------- parsing
    @classmethod
    def from_strings(cls, backend: str = "", params_backend: str = "", max_vram: str = "", *,
                     stream_layers: bool = False, rpc_servers: str | Sequence[str] = "",
                     clip_on_cpu: bool = False, vae_on_cpu: bool = False,
                     control_net_cpu: bool = False, offload_to_cpu: bool = False,
                     split_mode: str = "", auto_fit: bool | str = False,
                     split_ratio: str = "", disable_prefetch: bool = False,
                     disable_segmented_compute: bool = False) -> Placement:
        """Parse joined flag values (spec sections 2, 4, 6, 7, 12, 13, 14).

        ``rpc_servers`` is the joined ``host:port,...`` text or a list of endpoints. The
        compatibility flags prepend their entries (span None) as section 6 says.
        ``split_mode`` is the joined ``--split-mode`` value (section 12). ``auto_fit`` is
        True (the bare switch), False (absent) or the word ``on``/``off`` (section 14.1);
        ``split_ratio`` the last ``--split-ratio`` value (section 14.4). A ``cfg=DEVICE``
        entry of ``--backend`` names the parallel-CFG device (section 14.5).

        Raises:
            PlanError: any syntax error of the spec (``unknown_module``,
                ``invalid_assignment``, ``invalid_device_list``, ``default_in_device_list``,
                ``disk_not_runtime``, ``params_device_list``, ``invalid_max_vram``,
                ``invalid_split_mode``, ``invalid_split_ratio``, ``invalid_cfg_device``).
        """
        flags = {"clip_on_cpu": clip_on_cpu, "vae_on_cpu": vae_on_cpu,
                 "control_net_cpu": control_net_cpu}
        deprecated = tuple("--" + k.replace("_", "-") for k, on in flags.items() if on)
        prefix: list[str] = []
        for name, entry in COMPAT_BACKEND:
            if flags[name]:
                prefix.insert(0, entry)
        shadowed: list[tuple[str, object]] = []
        default, runtime = last_wins(
            split_entries(backend, "--backend", prefix=prefix, extra_keys=CFG_KEY),
            lambda e: runtime_or_cfg(e, backend), "--backend", shadowed)
        cfg = runtime.pop("cfg", None)
        p_default, params = last_wins(
            split_entries(params_backend, "--params-backend",
                          prefix=["*=cpu"] if offload_to_cpu else [], extra_keys=CFG_KEY),
            lambda e: params_not_cfg(e, params_backend), "--params-backend", shadowed)
        b_default, budgets = parse_max_vram(max_vram)
        s_default, s_modes = parse_split_mode(split_mode)
        word = auto_fit.strip().lower() if isinstance(auto_fit, str) else ""
        if isinstance(auto_fit, str) and word not in ("on", "off", "switch", ""):
            raise PlanError("invalid_assignment", f"--auto-fit takes on or off, not "
                            f"'{auto_fit}'", flag="--auto-fit")
        if isinstance(rpc_servers, str):
            servers = tuple(s.strip() for s in rpc_servers.split(",") if s.strip())
        else:
            servers = tuple(s.strip() for s in rpc_servers if s.strip())
        return cls(default=default, runtime=runtime, params_default=p_default, params=params,
                   budget_default=b_default, budgets=budgets, stream_layers=stream_layers,
                   rpc_servers=servers, split_default=s_default, split_modes=s_modes,
                   auto_fit=auto_fit is True or word in ("on", "switch"),
                   auto_fit_word=word if word in ("on", "off") else "",
                   split_ratio=parse_split_ratio(split_ratio), cfg=cfg,
                   disable_prefetch=disable_prefetch,
                   disable_segmented_compute=disable_segmented_compute, deprecated=deprecated,
                   texts={"--backend": backend, "--params-backend": params_backend,
                          "--max-vram": max_vram, "--split-mode": split_mode,
                          "--split-ratio": split_ratio},
                   shadowed=tuple(shadowed))

    @classmethod
    def from_args(cls, argv: Sequence[str]) -> Placement:
        """Parse sd-cli placement flags from an argument list (``["--backend", "te=cpu"]``).

        Raises:
            PlanError: as :meth:`from_strings`; ``invalid_assignment`` for an argument that
                is not a placement flag or a flag missing its value.
        """
        placement, rest = scan_placement_args(list(argv))
        if rest:
            raise PlanError("invalid_assignment", f"not a placement flag: {rest[0]!r}")
        return placement

    # ----------------------------------------------------------------- writing
    def to_strings(self) -> dict[str, str]:
        """The flag values ``{"backend", "params_backend", "max_vram"}``: canonical module
        names in :data:`PLACED_MODULES` order, then ``cfg=DEVICE``, entries equal to the
        default omitted, device names as held (exact names in a resolved plan's placement),
        GiB as plain numbers (the ``--split-mode`` value is :meth:`split_mode_text`)."""
        parts = [self.default.text()] if self.default is not None else []
        for m in PLACED_MODULES:
            v = self.runtime.get(m)
            if v is not None and v != self.default:
                parts.append(f"{m}={v.text()}")
        if self.cfg is not None:
            parts.append(f"cfg={self.cfg.text()}")
        pparts = [self.params_default.text()] if self.params_default is not None else []
        for m in PLACED_MODULES:
            pv = self.params.get(m)
            if pv is None or pv == self.params_default:
                continue
            if pv.kind == "runtime":
                if self.params_default is None:
                    continue
                run = self.runtime_of(m)
                if run is None or (len(run.refs) != 1 and m in SPLITTABLE):
                    continue  # not expressible: resolution treats it as the params default
                pv = ParamsValue("device", run.refs[0])
            pparts.append(f"{m}={pv.text()}")
        vparts = [format_gib(self.budget_default)] if self.budget_default is not None else []
        for b in self.budgets:
            if b.gib != self.budget_default:
                vparts.append(f"{b.key.text}={format_gib(b.gib)}")
        return {"backend": ",".join(parts), "params_backend": ",".join(pparts),
                "max_vram": ",".join(vparts)}

    def split_mode_text(self) -> str:
        """The canonical ``--split-mode`` value: the default when it is ``row``, then the
        module entries that differ from it (``""`` when everything is ``layer``)."""
        sdefault = self.split_default or "layer"
        sparts = [sdefault] if sdefault != "layer" else []
        sparts += [f"{m}={self.split_modes[m]}" for m in PLACED_MODULES
                   if m in self.split_modes and self.split_modes[m] != sdefault]
        return ",".join(sparts)

    def split_mode_of(self, module: str) -> str:
        """The ``--split-mode`` written for ``module``: its entry, else the default, else
        ``layer``."""
        return self.split_modes.get(module, self.split_default or "layer")

    def runtime_of(self, module: str) -> RuntimeValue | None:
        """The written runtime value for ``module``: its entry, else the default, else None."""
        return self.runtime.get(module, self.default)

    # ----------------------------------------------------------------- edits
    def _plain(self, **changes: object) -> Placement:
        """A copy with ``changes`` and without parse leftovers (spans, shadowed entries)."""
        return replace(self, shadowed=(), texts={}, deprecated=(), **changes)  # type: ignore[arg-type]

    def assign(self, module: str, device: str) -> Placement:
        """Run ``module`` on the single ``device`` (an exact device name)."""
        m = _module(module)
        runtime = dict(self.runtime)
        runtime[m] = RuntimeValue.of(device)
        return self._plain(runtime=runtime)

    def add_split_device(self, module: str, device: str) -> Placement:
        """Append ``device`` to the device list of ``diffusion`` or ``te`` (no-op if present).

        Raises:
            PlanError: ``split_not_supported`` for a module that cannot be split.
        """
        m = _module(module)
        if m not in SPLITTABLE:
            raise PlanError("split_not_supported", f"module {m} cannot run on several devices "
                            f"(only {', '.join(SPLITTABLE)} can)")
        cur = self.runtime_of(m)
        names = [r.text for r in cur.refs] if cur is not None else []
        if device not in names:
            names.append(device)
        runtime = dict(self.runtime)
        runtime[m] = RuntimeValue.of(*names)
        return self._plain(runtime=runtime)

    def remove_split_device(self, module: str, device: str) -> Placement:
        """Remove ``device`` from ``module``'s device list (no-op if absent or the last one)."""
        m = _module(module)
        cur = self.runtime_of(m)
        if cur is None:
            return self
        names = [r.text for r in cur.refs if r.text != device]
        if not names or len(names) == len(cur.refs):
            return self
        runtime = dict(self.runtime)
        runtime[m] = RuntimeValue.of(*names)
        return self._plain(runtime=runtime)

    def set_residency(self, module: str, mode: str, device: str | None = None) -> Placement:
        """Set where ``module``'s weights live: ``runtime``, ``disk`` or ``device`` (``device``
        names it).

        Raises:
            PlanError: ``invalid_assignment`` for an unknown mode, a ``device`` mode without a
                device, or ``runtime`` for a split module while a params default is set
                (``--params-backend`` cannot express it).
        """
        m = _module(module)
        if mode == "disk":
            value = ParamsValue("disk")
        elif mode == "device":
            if not device:
                raise PlanError("invalid_assignment", "residency 'device' needs a device name")
            value = ParamsValue("device", Ref(device))
        elif mode == "runtime":
            run = self.runtime_of(m)
            if self.params_default is not None and run is not None and len(run.refs) > 1:
                raise PlanError("invalid_assignment", f"{m} runs on several devices; with a "
                                "--params-backend default its weights cannot follow runtime")
            value = ParamsValue("runtime")
        else:
            raise PlanError("invalid_assignment", f"unknown residency {mode!r} "
                            "(use runtime, device or disk)")
        params = dict(self.params)
        if value == self.params_default or (mode == "runtime" and self.params_default is None):
            params.pop(m, None)
        else:
            params[m] = value
        return self._plain(params=params)

    def set_budget(self, device: str | None, gib: float | Decimal | str | None) -> Placement:
        """Set the ``--max-vram`` budget of ``device`` (exact name; None = the default) in GiB
        (negative = spare, 0 = disabled, None = remove the entry).

        Raises:
            PlanError: ``invalid_max_vram`` when ``gib`` is not a finite number.
        """
        value = None if gib is None else parse_gib(str(gib), "--max-vram", str(gib), None)
        if device is None:
            return self._plain(budget_default=value)
        budgets = tuple(b for b in self.budgets if b.key.text != device)
        if value is not None:
            budgets += (BudgetEntry(Ref(device), value),)
        return self._plain(budgets=budgets)

    def set_default(self, device: str | Sequence[str] | None) -> Placement:
        """Set the ``--backend`` default (a device name, a list of names, or None)."""
        if device is None:
            return self._plain(default=None)
        names = [device] if isinstance(device, str) else list(device)
        return self._plain(default=RuntimeValue.of(*names))

    def with_stream_layers(self, on: bool) -> Placement:
        """Turn ``--stream-layers`` on or off."""
        return self._plain(stream_layers=bool(on))

    def with_rpc_servers(self, servers: Sequence[str]) -> Placement:
        """Set the ``--rpc-servers`` endpoints."""
        return self._plain(rpc_servers=tuple(servers))

    def with_split_mode(self, module: str | None, mode: str | None) -> Placement:
        """Set the ``--split-mode`` of ``module`` (None: the default) to ``layer``/``row``
        (None removes the entry).

        Raises:
            PlanError: ``invalid_split_mode`` for another mode or a module that cannot
                be split.
        """
        if mode is not None and mode not in SPLIT_MODES:
            raise PlanError("invalid_split_mode", f"unknown split mode {mode!r} "
                            "(use layer or row)")
        if module is None:
            return self._plain(split_default=mode)
        m = _module(module)
        if m not in SPLITTABLE:
            raise PlanError("invalid_split_mode", f"{m} cannot be split; --split-mode applies "
                            f"to {', '.join(SPLITTABLE)}")
        modes = dict(self.split_modes)
        if mode is None:
            modes.pop(m, None)
        else:
            modes[m] = mode
        return self._plain(split_modes=modes)

    def with_auto_fit(self, on: bool) -> Placement:
        """Turn the ``--auto-fit`` switch on or off (section 13's bare switch)."""
        return self._plain(auto_fit=bool(on), auto_fit_word="")

    @property
    def auto_fit_mode(self) -> str | None:
        """How ``--auto-fit`` is given: ``switch`` (the snapshot's bare switch), ``on``,
        ``off`` (the newest sd-cli's words), or None (absent)."""
        if self.auto_fit_word:
            return self.auto_fit_word
        return "switch" if self.auto_fit else None

    def with_auto_fit_mode(self, mode: str | None) -> Placement:
        """Set ``--auto-fit`` to ``switch``, ``on``, ``off`` or None (absent).

        Raises:
            PlanError: ``invalid_assignment`` for another mode.
        """
        if mode not in ("switch", "on", "off", None):
            raise PlanError("invalid_assignment", f"--auto-fit takes on or off, not {mode!r}")
        return self._plain(auto_fit=mode in ("switch", "on"),
                           auto_fit_word=mode if mode in ("on", "off") else "")

    def with_split_ratio(self, text: str | None) -> Placement:
        """Set ``--split-ratio`` (``auto``, ``vram``, ``r0,r1,...``; None or ``""`` removes it).

        Raises:
            PlanError: ``invalid_split_ratio``.
        """
        return self._plain(split_ratio=parse_split_ratio(text or ""))

    def with_cfg(self, device: str | None) -> Placement:
        """Set the parallel-CFG device (``--backend cfg=DEVICE``; None removes it)."""
        return self._plain(cfg=RuntimeValue.of(device) if device else None)


def _module(key: str) -> str:
    m = normalize_module(key)
    if m is None:
        raise PlanError("unknown_module", f"unknown module {key!r}")
    return m


# --------------------------------------------------------------------- argument lists
#: Placement flags taking a value -> how repeats combine.
PLACEMENT_VALUE_FLAGS = {"--backend": "join", "--params-backend": "join",
                         "--max-vram": "last", "--rpc-servers": "join", "--split-mode": "join",
                         "--split-ratio": "last"}
PLACEMENT_SWITCHES = {"--stream-layers": "stream_layers", "--clip-on-cpu": "clip_on_cpu",
                      "--vae-on-cpu": "vae_on_cpu", "--control-net-cpu": "control_net_cpu",
                      "--offload-to-cpu": "offload_to_cpu", "--auto-fit": "auto_fit",
                      "--disable-prefetch": "disable_prefetch",
                      "--disable-segmented-compute": "disable_segmented_compute"}
#: The values ``--auto-fit`` takes in the newest sd-cli (spec section 14.1).
AUTO_FIT_WORDS = ("on", "off")


def split_flag(arg: str) -> tuple[str, str | None]:
    """``--flag=value`` -> ``("--flag", "value")``; anything else -> ``(arg, None)``."""
    if arg.startswith("--") and "=" in arg:
        flag, value = arg.split("=", 1)
        return flag, value
    return arg, None


def auto_fit_value(args: Sequence[str], i: int) -> str | None:
    """The value of an ``--auto-fit`` at ``args[i]`` (spec section 14.2: both dialects are
    read): ``on``/``off`` when the next argument is that word (any case), else None (the
    snapshot's bare switch; a following word that is not on or off is not its value)."""
    if i + 1 < len(args) and args[i + 1].strip().lower() in AUTO_FIT_WORDS:
        return args[i + 1].strip().lower()
    return None


def scan_placement_args(args: list[str]) -> tuple[Placement, list[str]]:
    """Take sd-cli's placement flags out of ``args``; returns the placement and the rest.

    ``--auto-fit`` is read in both dialects: followed by ``on``/``off`` (or written
    ``--auto-fit=on``) it takes that word, else it is the bare switch (on); the last one
    given wins, as sd-cli keeps an option's last value.

    Raises:
        PlanError: from :meth:`Placement.from_strings`; ``invalid_assignment`` when a
            placement flag has no value or ``--auto-fit=`` a word other than on/off.
    """
    values: dict[str, list[str]] = {f: [] for f in PLACEMENT_VALUE_FLAGS}
    switches: dict[str, bool | str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        flag, inline = split_flag(args[i])
        if flag in PLACEMENT_VALUE_FLAGS:
            if inline is None:
                if i + 1 >= len(args):
                    raise PlanError("invalid_assignment", f"{flag} needs a value", flag=flag)
                inline = args[i + 1]
                i += 1
            values[flag].append(inline)
        elif flag == "--auto-fit":
            word = inline if inline is not None else auto_fit_value(args, i)
            if inline is None and word is not None:
                i += 1
            switches["auto_fit"] = word if word is not None else True
        elif args[i] in PLACEMENT_SWITCHES:
            switches[PLACEMENT_SWITCHES[args[i]]] = True
        else:
            rest.append(args[i])
        i += 1
    vram = values["--max-vram"]
    ratio = values["--split-ratio"]
    placement = Placement.from_strings(
        ",".join(values["--backend"]), ",".join(values["--params-backend"]),
        vram[-1] if vram else "", rpc_servers=",".join(values["--rpc-servers"]),
        split_mode=",".join(values["--split-mode"]), split_ratio=ratio[-1] if ratio else "",
        **switches)  # type: ignore[arg-type]
    return placement, rest


# --------------------------------------------------------------------- argparse glue
def _auto_fit_word(text: str) -> str:
    word = text.strip().lower()
    if word not in AUTO_FIT_WORDS:
        raise argparse.ArgumentTypeError(f"takes on or off, not {text!r}")
    return word


def add_placement_arguments(parser: argparse.ArgumentParser) -> None:
    """Add sd-cli's placement flags to ``parser`` (repeatable ones collect in lists), and the
    target of the plan: ``--sdcli-dialect`` and ``--sdcli`` (spec section 14)."""
    g = parser.add_argument_group("placement (as sd-cli spells it)")
    g.add_argument("--backend", action="append", default=[], metavar="ASSIGN",
                   help="runtime devices: DEVICE,module=DEVICE[&DEVICE...],cfg=DEVICE "
                        "(repeats join)")
    g.add_argument("--params-backend", action="append", default=[], metavar="ASSIGN",
                   help="weight residency: DEVICE|disk,module=DEVICE|disk (repeats join)")
    g.add_argument("--max-vram", action="append", default=[], metavar="GIB",
                   help="budgets in GiB: N,device=N (negative = spare; last one wins; "
                        "write --max-vram=-1,cuda0=4 when the value starts with '-')")
    g.add_argument("--rpc-servers", action="append", default=[], metavar="HOST:PORT,...")
    g.add_argument("--stream-layers", action="store_true",
                   help="snapshot sd-cli only (the newest streams by itself)")
    g.add_argument("--clip-on-cpu", action="store_true", help="deprecated: --backend te=cpu")
    g.add_argument("--vae-on-cpu", action="store_true", help="deprecated: --backend vae=cpu")
    g.add_argument("--control-net-cpu", action="store_true",
                   help="deprecated: --backend controlnet=cpu")
    g.add_argument("--offload-to-cpu", action="store_true", help="--params-backend *=cpu first")
    g.add_argument("--split-mode", action="append", default=[], metavar="MODE",
                   help="how a module on several devices splits: layer (default) or row "
                        "(CUDA), or per module: diffusion=row,te=layer (repeats join)")
    g.add_argument("--auto-fit", nargs="?", const=True, type=_auto_fit_word,
                   metavar="on|off",
                   help="sd-cli chooses the placement: bare, the snapshot's switch "
                        "(ignores --backend/--params-backend); on|off, the newest sd-cli's "
                        "(on keeps --backend; explicit --params-backend entries turn it off)")
    g.add_argument("--split-ratio", action="append", default=[], metavar="auto|vram|R0,R1",
                   help="newest sd-cli: how a layer split places blocks (last one wins)")
    g.add_argument("--disable-prefetch", action="store_true",
                   help="newest sd-cli: no asynchronous next-segment prefetch")
    g.add_argument("--disable-segmented-compute", action="store_true",
                   help="newest sd-cli: run every graph whole (no graph-cut segments)")
    t = parser.add_argument_group("target (which sd-cli the flags are for)")
    t.add_argument("--sdcli-dialect", choices=("snapshot", "newest"),
                   help="plan for sd-cli in this dialect (default: sdplan's engine; with "
                        "--command, the command's own syntax, else newest)")
    t.add_argument("--sdcli", metavar="PATH", dest="sdcli_path",
                   help="plan for this sd-cli binary; its --help text tells the dialect")


def placement_from_namespace(ns: argparse.Namespace) -> Placement:
    """The placement of flags added by :func:`add_placement_arguments` (spec section 2.7:
    ``--backend``, ``--params-backend``, ``--rpc-servers`` join with ``,``; the last
    ``--max-vram`` and ``--split-ratio`` win).

    Raises:
        PlanError: as :meth:`Placement.from_strings`.
    """
    vram = list(getattr(ns, "max_vram", None) or [])
    ratio = list(getattr(ns, "split_ratio", None) or [])
    auto_fit = getattr(ns, "auto_fit", None)
    return Placement.from_strings(
        ",".join(getattr(ns, "backend", None) or []),
        ",".join(getattr(ns, "params_backend", None) or []),
        vram[-1] if vram else "",
        stream_layers=bool(getattr(ns, "stream_layers", False)),
        rpc_servers=",".join(getattr(ns, "rpc_servers", None) or []),
        clip_on_cpu=bool(getattr(ns, "clip_on_cpu", False)),
        vae_on_cpu=bool(getattr(ns, "vae_on_cpu", False)),
        control_net_cpu=bool(getattr(ns, "control_net_cpu", False)),
        offload_to_cpu=bool(getattr(ns, "offload_to_cpu", False)),
        split_mode=",".join(getattr(ns, "split_mode", None) or []),
        auto_fit=auto_fit if isinstance(auto_fit, str) else bool(auto_fit),
        split_ratio=ratio[-1] if ratio else "",
        disable_prefetch=bool(getattr(ns, "disable_prefetch", False)),
        disable_segmented_compute=bool(getattr(ns, "disable_segmented_compute", False)),
    )
