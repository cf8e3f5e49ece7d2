"""Device inventories: the devices a plan can use, live from ggml or from a JSON file.

The JSON format is ``{"devices": [{"name", "description", "type", "registry", "free",
"total"}, ...]}`` with ``type`` one of ``cpu``/``gpu``/``igpu``/``accel`` and memory in
bytes, devices listed in ggml's enumeration order (RPC devices after local ones). Optional:
a device's ``"profile"`` (its measured speeds, :class:`~sdplan.core.planning.device_profile.DeviceProfile`)
and the inventory's ``"drives"`` (read speeds of drives,
:class:`~sdplan.core.planning.device_profile.DriveProfile`); files without them still read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sdplan.core.errors import InventoryError
from sdplan.core.planning.bounded_json import read_json
from sdplan.core.planning.device_profile import DeviceProfile, DriveProfile

DEVICE_TYPES = ("cpu", "gpu", "igpu", "accel")


@dataclass(frozen=True)
class Device:
    """One ggml backend device as sdplan plans with it.

    Attributes:
        name: ggml's device name (``CPU``, ``CUDA0``, ``RPC1``...).
        description: ggml's description (RPC devices: the ``host:port`` endpoint).
        type: ``cpu``, ``gpu``, ``igpu`` or ``accel`` (RPC devices are ``gpu``).
        registry: the backend registry name (``CPU``, ``CUDA``, ``Vulkan``, ``RPC``...).
        free: free memory in bytes when the inventory was taken.
        total: total memory in bytes.
        device_id: PCI bus id or other id ggml reports, or None.
        caps: capability flags (``async``, ``host_buffer``, ``buffer_from_host_ptr``,
            ``events``), empty when unknown.
        profile: its measured speeds (``sdplan devices --calibrate``), or None.
    """

    name: str
    description: str
    type: str
    registry: str
    free: int
    total: int
    device_id: str | None = None
    caps: dict[str, bool] = field(default_factory=dict, compare=False, hash=False)
    profile: DeviceProfile | None = field(default=None, compare=False, hash=False)

    @property
    def is_gpu_like(self) -> bool:
        """True for ``gpu`` and ``igpu`` devices (the ones that take ``--max-vram``)."""
        return self.type in ("gpu", "igpu")

    def to_json(self) -> dict[str, object]:
        """The inventory-file form of this device (bytes)."""
        d = asdict(self)
        if not d["caps"]:
            d.pop("caps")
        if d["device_id"] is None:
            d.pop("device_id")
        d.pop("profile")
        if self.profile is not None:
            d["profile"] = self.profile.to_json()
        return d


@dataclass(frozen=True)
class Inventory:
    """An ordered, immutable list of devices (ggml's enumeration order), and the measured
    drives of the machine (``drives``, empty when none were measured)."""

    devices: tuple[Device, ...]
    drives: tuple[DriveProfile, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        names = [d.name for d in self.devices]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise InventoryError(f"duplicate device names in inventory: {sorted(dup)}")

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    def names(self) -> list[str]:
        """Device names in order."""
        return [d.name for d in self.devices]

    def get(self, name: str) -> Device:
        """The device with exactly this name; raises KeyError otherwise."""
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    def to_json(self) -> dict[str, object]:
        """The inventory-file form (``{"devices": [...]}``)."""
        out: dict[str, object] = {"devices": [d.to_json() for d in self.devices]}
        if self.drives:
            out["drives"] = [d.to_json() for d in self.drives]
        return out

    @classmethod
    def from_devices(cls, devices: Sequence[Device]) -> Inventory:
        return cls(tuple(devices))

    @classmethod
    def from_json(cls, data: object, *, source: str = "inventory") -> Inventory:
        """Build an inventory from parsed JSON; raises :class:`InventoryError` naming
        ``source`` and the offending entry when a field is missing or has a wrong type."""
        if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
            raise InventoryError(f"{source}: expected an object with a 'devices' list")
        out = []
        for i, raw in enumerate(data["devices"]):
            where = f"{source}: devices[{i}]"
            if not isinstance(raw, dict):
                raise InventoryError(f"{where}: expected an object")
            try:
                name, desc = raw["name"], raw.get("description", raw["name"])
                typ, reg = raw["type"], raw.get("registry", "")
                free, total = raw["free"], raw["total"]
            except KeyError as exc:
                raise InventoryError(f"{where}: missing field {exc.args[0]!r}") from None
            if not isinstance(name, str) or not name.strip():
                raise InventoryError(f"{where}: 'name' must be a non-empty string")
            if typ not in DEVICE_TYPES:
                raise InventoryError(f"{where} ({name}): 'type' must be one of {DEVICE_TYPES}")
            for key, val in (("free", free), ("total", total)):
                if not isinstance(val, int) or isinstance(val, bool) or val < 0:
                    raise InventoryError(f"{where} ({name}): '{key}' must be bytes (int >= 0)")
            caps = raw.get("caps") or {}
            profile = (DeviceProfile.from_json(raw["profile"], source=f"{where} ({name}): profile")
                       if raw.get("profile") is not None else None)
            out.append(Device(name=name, description=str(desc), type=typ, registry=str(reg),
                              free=free, total=total, device_id=raw.get("device_id"),
                              caps=dict(caps), profile=profile))
        drives = data.get("drives") or []
        if not isinstance(drives, list):
            raise InventoryError(f"{source}: 'drives' must be a list")
        return cls(tuple(out), tuple(DriveProfile.from_json(d, source=f"{source}: drives[{i}]")
                                     for i, d in enumerate(drives)))

    @classmethod
    def load(cls, path: str | Path) -> Inventory:
        """Read an inventory JSON file (:func:`sdplan.core.planning.bounded_json.read_json`);
        raises :class:`InventoryError` naming the file."""
        p = Path(path)
        try:
            data = read_json(p, what="inventory")
        except (OSError, ValueError) as exc:  # PathError naming the path, JsonRefused
            raise InventoryError(str(exc)) from None
        return cls.from_json(data, source=str(p))


def merge_rpc_devices(local: Inventory, rpc: Sequence[Device]) -> Inventory:
    """``local``'s devices followed by ``rpc`` (the devices of ``--rpc-servers``). When
    ``rpc`` is not empty, RPC devices already in ``local`` (a saved inventory's) are replaced
    by them.

    Raises:
        InventoryError: two devices share a name.
    """
    if not rpc:
        return local
    kept = [d for d in local if d.registry.upper() != "RPC"]
    return Inventory((*kept, *rpc), local.drives)
