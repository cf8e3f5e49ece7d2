"""Where a plan warning belongs: on a module's card, in a device's column, or under the
flag fields (warnings are shown next to what they concern, not in the status bar).

:class:`~sdplan.core.planning.plan_types.PlanWarning` messages name their subject first
(``te: a device list with the CPU...``, ``CUDA1: 0.40 GiB free...``, ``--max-vram names
CUDA0 twice``); a warning whose first word is a module goes to that module's card, one
whose first word is a device to that device's column, and every other one to the flags.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from sdplan.core.planning.modules import MODULES

_SUBJECT = re.compile(r"^([\w.:-]+?)(?::|\s)")


def subject(message: str) -> str:
    """The first word of a warning message (without a trailing ``:``)."""
    m = _SUBJECT.match(message)
    return m.group(1) if m else ""


def warning_target(message: str, devices: Iterable[str]) -> tuple[str, str]:
    """``("module", name)``, ``("device", name)`` or ``("flags", "")`` for a message."""
    first = subject(message)
    if first in MODULES:
        return "module", first
    if first in set(devices):
        return "device", first
    return "flags", ""


def _devices(inventory: object) -> list[str]:
    return [d.name for d in inventory]  # type: ignore[attr-defined]


def module_warnings(plan: object, inventory: object, module: str) -> list[str]:
    """Messages of ``plan``'s warnings about ``module``."""
    devs = _devices(inventory)
    return [w.message for w in plan.warnings  # type: ignore[attr-defined]
            if warning_target(w.message, devs) == ("module", module)]


def device_warnings(plan: object, inventory: object, device: str) -> list[str]:
    """Messages of ``plan``'s warnings about ``device``."""
    devs = _devices(inventory)
    return [w.message for w in plan.warnings  # type: ignore[attr-defined]
            if warning_target(w.message, devs) == ("device", device)]


def flag_warnings(plan: object, inventory: object) -> list:
    """``plan``'s warnings that concern neither a module nor a device (the flags)."""
    devs = _devices(inventory)
    return [w for w in plan.warnings  # type: ignore[attr-defined]
            if warning_target(w.message, devs)[0] == "flags"]
