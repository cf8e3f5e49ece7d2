"""The plan a run carries to the engine: the resolved placements the user saw, and what each
device was expected to hold, checked against the engine's live devices before anything loads.

:class:`RunPlan` is made where the plan was resolved (the command line, the app) from the
:class:`~sdplan.core.planning.plan_types.Plan` and its :class:`~sdplan.core.planning.estimate.FitReport`,
and travels with the generation request. The engine process does not resolve placement
strings again: it compares the plan's devices with its own (:meth:`RunPlan.differences`)
and refuses in one line when a device is gone or holds less free memory than the plan needs
(it had enough when the plan was made). No numpy, no native module (the command line
builds it before the engine starts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sdplan.core.errors import EngineError
from sdplan.core.runtime.placement import CFG, BlockRange, ModulePlacement, cfg_placement

__all__ = ["DeviceNeed", "RunPlan", "PLAN_STRINGS"]

GIB = 1 << 30
#: The placement strings a run records (sd-cli's flags, canonical).
PLAN_STRINGS = ("backend", "params_backend", "max_vram", "split_mode", "rpc_servers")


@dataclass(frozen=True)
class DeviceNeed:
    """What the plan expects of one device.

    Attributes:
        name: ggml's device name (``CPU``, ``CUDA0``, ``RPC0``).
        description: ggml's description when planned (RPC: the ``host:port`` endpoint).
        needed: bytes the estimate puts on it (weights, staging, compute).
        free: its free bytes when the plan was made.
    """

    name: str
    description: str
    needed: int
    free: int


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class RunPlan:
    """A resolved plan as the engine runs it (module docstring).

    Attributes:
        placements: module -> :class:`~sdplan.core.runtime.placement.ModulePlacement`.
        rpc_servers: RPC endpoints the engine adds before it runs.
        strings: the canonical placement strings (:data:`PLAN_STRINGS`) the picture records.
        devices: what each device the plan uses was expected to hold.
        check_memory: refuse a device whose free memory fell below its need (False for a
            plan run with ``--force``, which did not fit anyway).
    """

    placements: Mapping[str, ModulePlacement]
    rpc_servers: tuple[str, ...] = ()
    strings: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[DeviceNeed, ...] = ()
    check_memory: bool = True

    @classmethod
    def from_plan(cls, plan: Any, fit: Any = None, inventory: Any = None, *,
                  modules: tuple[str, ...] = ("diffusion", "te", "vae"),
                  check_memory: bool = True) -> RunPlan:
        """The run plan of a resolved ``plan`` for ``modules``, with each used device's
        need from ``fit`` (a FitReport; none without) and its description and free memory
        from ``inventory`` (the one the plan was resolved against); with an active parallel
        CFG (``--backend cfg=DEVICE``) the diffusion model's copy under :data:`CFG`
        (:func:`~sdplan.core.runtime.placement.cfg_placement`)."""
        placements = {m: ModulePlacement.from_plan(plan, m) for m in modules if m in plan.modules}
        cfg = cfg_placement(plan) if "diffusion" in placements else None
        if cfg is not None:  # the diffusion model's copy for the unconditional pass
            placements[CFG] = cfg
        strings = {"backend": plan.backend, "params_backend": plan.params_backend,
                   "max_vram": plan.max_vram, "split_mode": getattr(plan, "split_mode", ""),
                   "rpc_servers": ",".join(plan.rpc_servers)}
        used: list[str] = []
        for mp in placements.values():
            for d in (*mp.devices, *([mp.params_device] if mp.params_device else [])):
                if d not in used:
                    used.append(d)
        needs = []
        if fit is not None and inventory is not None:
            for name in used:
                dev = _device(inventory, name)
                totals = fit.devices.get(name)
                if dev is not None and totals is not None:
                    needs.append(DeviceNeed(name, dev.description, int(totals.total), int(dev.free)))
        return cls(MappingProxyType(placements), tuple(plan.rpc_servers),
                   MappingProxyType({k: v for k, v in strings.items() if v}), tuple(needs),
                   check_memory and (fit is None or bool(fit.fits)))

    def used_devices(self) -> list[str]:
        """Every device the placements name (runtime devices, then params devices), once."""
        out: list[str] = []
        for mp in self.placements.values():
            for d in (*mp.devices, *(r.device for r in mp.ranges),
                      *([mp.params_device] if mp.params_device else [])):
                if d not in out:
                    out.append(d)
        return out

    def differences(self, live: Any) -> list[str]:
        """How the live inventory (:class:`~sdplan.core.planning.inventory.Inventory`)
        differs from what the plan expects, one phrase each: a device the placements name
        that is gone (or, for RPC, now another server), or whose free memory fell below the
        plan's need when it had enough at planning time. Empty when the plan still holds."""
        out: list[str] = []
        needs = {n.name: n for n in self.devices}
        for name in self.used_devices():
            dev = _device(live, name)
            need = needs.get(name)
            where = f" ({need.description})" if need is not None and need.description else ""
            if dev is None:
                out.append(f"{name}{where} is gone")
                continue
            if need is not None and need.description and dev.description != need.description \
                    and dev.registry == "RPC":
                out.append(f"{name} is now {dev.description}, not {need.description}")
                continue
            if self.check_memory and need is not None and need.needed <= need.free and dev.free < need.needed:
                out.append(f"{name}{where} has {_gib(dev.free)} free, the plan needs {_gib(need.needed)} "
                           f"(it had {_gib(need.free)} when planned)")
        return out

    def check(self, live: Any) -> None:
        """Raise when the live devices differ from the plan's (:meth:`differences`).

        Raises:
            EngineError: one line naming every difference and what to do.
        """
        diff = self.differences(live)
        if diff:
            raise EngineError("the devices changed since the plan was made: " + "; ".join(diff)
                              + ". Plan again on the devices there are now (or free the memory)")

    def unreachable(self, reason: str) -> EngineError:
        """The one-line error for RPC servers of the plan that cannot be reached now: each
        device of the plan on such a server is named as gone, with ``reason`` (the
        connection error, naming the endpoint)."""
        gone = [n for n in self.devices if n.description and n.description in reason] or \
            [n for n in self.devices if n.name.startswith("RPC")]
        names = ", ".join(f"{n.name} ({n.description})" for n in gone) or ", ".join(self.rpc_servers)
        return EngineError(f"the devices changed since the plan was made: {names} is gone ({reason}). "
                           "Start the RPC server again, or plan again on the devices there are now")

    def to_json(self) -> dict[str, object]:
        """JSON form (a queued job keeps its plan)."""
        return {"placements": {m: _placement_json(p) for m, p in self.placements.items()},
                "rpc_servers": list(self.rpc_servers), "strings": dict(self.strings),
                "devices": [vars(n) | {} for n in self.devices], "check_memory": self.check_memory}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunPlan:
        """The inverse of :meth:`to_json`.

        Raises:
            ValueError: malformed data.
        """
        try:
            placements = {str(m): _placement(p) for m, p in dict(data["placements"]).items()}
            needs = tuple(DeviceNeed(str(n["name"]), str(n.get("description") or ""), int(n["needed"]),
                                     int(n["free"])) for n in data.get("devices") or ())
            return cls(MappingProxyType(placements), tuple(str(s) for s in data.get("rpc_servers") or ()),
                       MappingProxyType({str(k): str(v) for k, v in dict(data.get("strings") or {}).items()}),
                       needs, bool(data.get("check_memory", True)))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a run plan: {exc}") from None

    def __reduce__(self) -> Any:  # MappingProxyType does not pickle: travel as JSON
        return (RunPlan.from_json, (self.to_json(),))


def _device(inventory: Any, name: str) -> Any:
    """The inventory's device called ``name``, or None."""
    try:
        return inventory.get(name)
    except KeyError:
        return None


def _placement_json(p: ModulePlacement) -> dict[str, object]:
    return {"devices": list(p.devices), "ranges": [[r.device, r.first_block, r.last_block] for r in p.ranges],
            "params_mode": p.params_mode, "params_device": p.params_device, "budget": p.budget,
            "stream_layers": p.stream_layers}


def _placement(d: Mapping[str, Any]) -> ModulePlacement:
    return ModulePlacement(tuple(str(x) for x in d["devices"]),
                           tuple(BlockRange(str(r[0]), int(r[1]), int(r[2])) for r in d.get("ranges") or ()),
                           str(d.get("params_mode") or "runtime"), d.get("params_device"),
                           int(d.get("budget") or 0), bool(d.get("stream_layers")))
