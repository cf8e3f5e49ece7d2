"""Where one module runs: :class:`ModulePlacement` and its :class:`BlockRange` items.

The caller's resolved plan travels to the engine process as one placement per module
(pickled), so this module imports neither numpy nor the native module: the command line
builds placements before the engine starts. :mod:`sdplan.core.runtime.runner` runs them
(and re-exports these names).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MODES", "CFG", "CFG_RUNNER", "BlockRange", "ModulePlacement", "cfg_placement", "block_weights"]

#: Params residencies (spec section 5): weights on the runtime device, on a params device
#: (staged per use), or read from disk per use.
MODES = ("runtime", "device", "disk")

#: The key of the parallel-CFG copy of the diffusion model among a run's placements (spec
#: section 14.5: ``--backend cfg=DEVICE``); not a module of its own.
CFG = "cfg"
#: The parallel-CFG copy's key among a pipeline's runners (its memory is reported under it).
CFG_RUNNER = "diffusion_cfg"


@dataclass(frozen=True)
class BlockRange:
    """Blocks ``first_block``..``last_block`` (inclusive) run on ``device``."""

    device: str
    first_block: int
    last_block: int


@dataclass(frozen=True)
class ModulePlacement:
    """Where one module runs and where its weights live.

    ``devices``: runtime devices, main device first. ``ranges``: block ranges per device
    for a split (blocks outside every range run on the main device). ``params_mode``:
    ``runtime``, ``device`` (weights on ``params_device``) or ``disk``. ``budget``: bytes
    for graph-cut segmentation on a single device (0: none). ``stream_layers``: keep
    leading segments resident (only with ``params_mode="device"`` and a budget).
    """

    devices: tuple[str, ...]
    ranges: tuple[BlockRange, ...] = ()
    params_mode: str = "runtime"
    params_device: str | None = None
    budget: int = 0
    stream_layers: bool = False

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("ModulePlacement: devices must not be empty")
        if self.params_mode not in MODES:
            raise ValueError(f"ModulePlacement: params_mode must be one of {MODES}, got {self.params_mode!r}")
        if (self.params_mode == "device") != (self.params_device is not None):
            raise ValueError("ModulePlacement: params_device is required exactly for params_mode 'device'")
        if self.budget < 0:
            raise ValueError("ModulePlacement: budget must be >= 0 bytes")

    @classmethod
    def from_plan(cls, plan: Any, module: str) -> ModulePlacement:
        """The placement of ``module`` in a resolved ``sdplan.core.planning.plan_types.Plan``: its devices,
        ranges, params; the main device's budget for a single-device module (spec section
        8 disables segmentation for a split); stream layers for diffusion only."""
        mp = plan.modules[module]
        devices = tuple(mp.devices)
        budget = int(plan.budgets.get(devices[0], 0)) if len(devices) == 1 else 0
        return cls(devices, tuple(BlockRange(r.device, r.first_block, r.last_block) for r in mp.ranges),
                   mp.params.mode, mp.params.device, budget,
                   bool(getattr(plan, "stream_layers", False)) and module == "diffusion")


def cfg_placement(plan: Any) -> ModulePlacement | None:
    """The placement of the parallel-CFG copy of a resolved plan's diffusion model (spec
    section 14.5): its weights on the ``cfg=`` device with the diffusion model's residency
    (resident there, staged from the same params device, or read from disk per use), or
    None when the plan has no active parallel CFG."""
    cfg = getattr(plan, "cfg", None)
    if cfg is None or not cfg.active or "diffusion" not in plan.modules:
        return None
    params = plan.modules["diffusion"].params
    device = params.device if params.mode == "device" and params.device != cfg.device else None
    mode = params.mode if params.mode != "device" or device is not None else "runtime"
    return ModulePlacement((cfg.device,), (), mode, device, 0)


def block_weights(model: Any, i: int) -> list[str]:
    """The weight names of block ``i`` a runner loads and places: ``model.block_tensors(i)``,
    or none for a block at or after the model's optional ``blocks_read`` (a block it lists,
    as the file has it, but does not compute: an LLM's blocks after the last hidden state
    asked for; sd-cli loads only the tensors its graph uses). IndexError as
    ``block_tensors``."""
    names = model.block_tensors(i)
    return [] if i >= getattr(model, "blocks_read", model.n_blocks) else list(names)
