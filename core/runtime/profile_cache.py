"""Measured device and drive profiles, kept between runs.

Profiles are kept per device identity (registry, name or RPC endpoint, description, total
memory) and CPU thread count, drives per folder, in
``$XDG_CACHE_HOME/sdplan/device-profiles.json`` (default ``~/.cache``), written atomically;
:func:`with_cached_profiles` puts them on an inventory's devices. Standard library only:
the command line reads them without loading the engine.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from sdplan.core.planning.device_profile import DeviceProfile, DriveProfile
from sdplan.core.planning.inventory import Device, Inventory

log = logging.getLogger(__name__)


def cache_path() -> Path:
    """Where measured profiles are kept (``$XDG_CACHE_HOME/sdplan/device-profiles.json``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sdplan" / "device-profiles.json"


def identity(device: Device) -> str:
    """The key a device's profile is kept under: registry, the RPC endpoint or the name,
    description and total memory (bytes)."""
    where = device.description if device.registry.upper() == "RPC" else device.name
    return f"{device.registry}|{where}|{device.description}|{device.total}"


def _read_cache() -> dict[str, Any]:
    try:
        data = json.loads(cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def store(device: Device | None, profile: DeviceProfile | DriveProfile) -> None:
    """Keep ``profile`` in the cache file (a device's under its :func:`identity` and thread
    count; a drive's under its path). Written atomically."""
    data = _read_cache()
    if isinstance(profile, DriveProfile):
        data.setdefault("drives", {})[profile.path] = profile.to_json()
    else:
        assert device is not None
        data.setdefault("devices", {}).setdefault(identity(device), {})[str(profile.threads)] = profile.to_json()
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def cached_profile(device: Device, threads: int = 0) -> DeviceProfile | None:
    """The kept profile of ``device``: the one measured with ``threads`` CPU threads, else
    the one with the most threads; None when none was kept (or the entry is unreadable)."""
    entries = _read_cache().get("devices", {}).get(identity(device), {})
    if not isinstance(entries, dict) or not entries:
        return None
    key = str(threads) if str(threads) in entries else max(entries, key=lambda k: int(k) if k.isdigit() else -1)
    try:
        return DeviceProfile.from_json(entries[key], source=str(cache_path()))
    except Exception:  # a damaged cache entry is ignored, not fatal
        log.info("ignoring the kept profile of %s", device.name, exc_info=True)
        return None


def cached_drives() -> tuple[DriveProfile, ...]:
    """Every kept drive profile."""
    out = []
    for path, raw in (_read_cache().get("drives") or {}).items():
        try:
            out.append(DriveProfile.from_json(raw, source=str(cache_path())))
        except Exception:
            log.info("ignoring the kept drive profile of %s", path, exc_info=True)
    return tuple(out)


def with_cached_profiles(inventory: Inventory, threads: int = 0) -> Inventory:
    """``inventory`` with each device's kept profile (devices that already carry one, from
    an inventory file, keep theirs) and the kept drives when it has none."""
    devices = tuple(d if d.profile is not None else replace(d, profile=cached_profile(d, threads))
                    for d in inventory)
    return Inventory(devices, inventory.drives or cached_drives())
