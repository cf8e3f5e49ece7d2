"""LoRA in the plan: which apply mode sd-cli's ``auto`` picks, and the bytes a LoRA keeps on
each device.

With ``--lora-apply-mode immediately`` the engine merges each patch into its weight where the
weight is read (host round trip, :mod:`sdplan.core.runtime.lora`): no device memory beyond the
weights themselves. With ``at_runtime`` the LoRA's tensors stay beside the weights they patch:
on the device running each block (each range of a layer split holds its own blocks' part),
the non-block part on the module's main device, all of it resident between uses (also with
``device``/``disk`` residency and ``--max-vram`` segments). A :class:`LoraProfile` gives those
bytes per block of the module, aligned with its :class:`~sdplan.core.planning.profile.ModuleProfile`.

Host copies of the patches (float32, about twice the file) are not counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sdplan.core.errors import SdplanError

__all__ = ["APPLY_MODES", "LoraProfile", "lora_apply_mode", "lora_device_bytes", "PLAN_MODULE"]

#: ``--lora-apply-mode`` values.
APPLY_MODES = ("auto", "immediately", "at_runtime")
#: Engine module of a LoRA target -> the plan module it belongs to.
PLAN_MODULE = {"diffusion": "diffusion", "te": "te", "clip_l": "te", "t5xxl": "te", "vae": "vae"}


@dataclass(frozen=True)
class LoraProfile:
    """Bytes of a module's at-runtime LoRA tensors: per block index of the module's profile
    (``blocks``) and outside every block (``other``)."""

    blocks: Mapping[int, int] = field(default_factory=dict)
    other: int = 0

    @property
    def total(self) -> int:
        return self.other + sum(self.blocks.values())


def lora_apply_mode(requested: str, *, quantized: bool, offloaded: bool, streaming: bool,
                    split: bool) -> str:
    """The mode in use for ``requested``: ``auto`` is ``at_runtime`` when a weight of the model
    is quantized, the diffusion model's weights live off its runtime device (``offloaded``:
    ``device``/``disk`` residency), layers stream, or a module runs over several devices
    (``split``); ``immediately`` otherwise (sd-cli's rule in ``src/stable-diffusion.cpp``, its
    row split read as sdplan's layer split).

    Raises:
        SdplanError: an unknown mode.
    """
    if requested not in APPLY_MODES:
        raise SdplanError(f"--lora-apply-mode {requested!r}: choose one of {', '.join(APPLY_MODES)}")
    if requested != "auto":
        return requested
    return "at_runtime" if quantized or offloaded or streaming or split else "immediately"


def lora_device_bytes(module_plan: object, lp: LoraProfile) -> dict[str, int]:
    """Where a module's at-runtime LoRA bytes live under ``module_plan`` (a
    :class:`~sdplan.core.planning.plan_types.ModulePlan`): each block's on the device of the
    range holding it, everything else on the main device."""
    devices = list(module_plan.devices)  # type: ignore[attr-defined]
    main = devices[0]
    out = {main: lp.other}
    for i, n in lp.blocks.items():
        dev = next((r.device for r in module_plan.ranges  # type: ignore[attr-defined]
                    if r.first_block <= i <= r.last_block), main)
        out[dev] = out.get(dev, 0) + n
    return {d: n for d, n in out.items() if n}


def plan_lora_mode(requested: str, plan: object, quantized: bool) -> str:
    """:func:`lora_apply_mode` for a resolved plan: the diffusion model's residency and the
    plan's ``--stream-layers``, and whether any module runs over several devices.

    Raises:
        SdplanError: an unknown mode.
    """
    modules = getattr(plan, "modules", {})
    diff = modules.get("diffusion")
    return lora_apply_mode(requested, quantized=quantized,
                           offloaded=diff is not None and diff.params.mode != "runtime",
                           streaming=bool(getattr(plan, "stream_layers", False)),
                           split=any(len(m.devices) > 1 for m in modules.values()))
