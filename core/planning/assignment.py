"""Parsing of ``--backend``, ``--params-backend`` and ``--max-vram`` values (spec sections 1-4, 7).

Everything here is syntax and naming, independent of a model: splitting a flag's value into
entries while keeping half-open character spans into that value, normalising module keys
(with a "did you mean" hint), parsing device lists and GiB numbers, and resolving a device
name against an :class:`~sdplan.core.planning.inventory.Inventory` (spec section 3).

Spans are ``(start, end)`` offsets into the flag's value *after* repeated flags are joined
with ``,``; entries added by a compatibility flag carry the span ``None``.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Context, Decimal

from sdplan.core.errors import PlanError
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.modules import GIB

Span = tuple[int, int]


_ALIASES: dict[str, tuple[str, ...]] = {
    "diffusion": ("diffusion", "model", "unet", "dit"),
    "te": ("te", "clip", "text", "textencoder", "textencoders", "conditioner", "cond", "llm",
           "t5", "t5xxl"),
    "clip_vision": ("clipvision", "vision"),
    "vae": ("vae", "firststage", "autoencoder", "tae"),
    "controlnet": ("controlnet", "control"),
    "photomaker": ("photomaker", "photomakerid", "pmid", "photo"),
    "upscaler": ("upscaler", "esrgan", "hires"),
    "detector": ("detector", "adetailer", "yolo"),
    "audio_encoder": ("audioencoder",),
}
#: Normalised key -> canonical module name.
MODULE_KEYS: dict[str, str] = {k: m for m, keys in _ALIASES.items() for k in keys}
#: Keys that set the default instead of a module (compared lower-case, before deleting -/_).
DEFAULT_KEYS = frozenset({"all", "default", "*"})
#: Values meaning "the default device" (spec section 3, step 1; ``""`` is rejected earlier).
DEFAULT_TOKENS = frozenset({"", "auto", "default"})

#: Budgets are clamped to this many bytes so absurd numbers (``1e99999``) stay cheap.
MAX_BUDGET_BYTES = 1 << 62
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def normalize_module(key: str) -> str | None:
    """The canonical module for ``key`` (trim, lower-case, delete ``-``/``_``), or None.

    ``all``/``default``/``*`` are not modules (they set the default) and give None.
    """
    return MODULE_KEYS.get(key.strip().lower().replace("-", "").replace("_", ""))


def module_hint(key: str) -> str:
    """A " (did you mean X?)" suffix for an unknown module key, or ``""`` (difflib)."""
    norm = key.strip().lower().replace("-", "").replace("_", "")
    close = difflib.get_close_matches(norm, list(MODULE_KEYS), n=1, cutoff=0.6)
    return f" (did you mean {MODULE_KEYS[close[0]]}?)" if close else ""


@dataclass(frozen=True)
class Ref:
    """One written device value (trimmed) and where it was written.

    ``span`` is excluded from equality so a placement parsed from text equals the same
    placement built by edits.
    """

    text: str
    span: Span | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RuntimeValue:
    """A ``--backend`` value: one device (``refs`` of length 1) or a ``&`` list."""

    refs: tuple[Ref, ...]
    is_list: bool = False
    span: Span | None = field(default=None, compare=False)

    @classmethod
    def of(cls, *names: str) -> RuntimeValue:
        """A value naming ``names`` (a list when more than one)."""
        return cls(tuple(Ref(n) for n in names), len(names) > 1)

    def text(self) -> str:
        return "&".join(r.text for r in self.refs)


@dataclass(frozen=True)
class ParamsValue:
    """A ``--params-backend`` value: ``kind`` is ``device`` (``ref`` names it), ``disk``, or
    ``runtime`` (follow the runtime device; only created by edits, never written as text)."""

    kind: str
    ref: Ref | None = None
    span: Span | None = field(default=None, compare=False)

    def text(self) -> str:
        if self.kind == "device" and self.ref is not None:
            return self.ref.text
        return self.kind


@dataclass(frozen=True)
class Entry:
    """One parsed entry of a flag: ``module`` is None for the default."""

    module: str | None
    key: Ref | None
    value: str
    value_span: Span | None
    span: Span | None


def _parts(text: str, prefix: Sequence[str]) -> list[tuple[str, Span | None]]:
    """Split compatibility prefixes (span None) and ``text`` on ``,``; trimmed, non-empty."""
    out: list[tuple[str, Span | None]] = [(p, None) for p in prefix]
    pos = 0
    for raw in text.split(","):
        stripped = raw.strip()
        if stripped:
            start = pos + (len(raw) - len(raw.lstrip()))
            out.append((stripped, (start, start + len(stripped))))
        pos += len(raw) + 1
    return out


def _sub(span: Span | None, raw: str, offset: int) -> Span | None:
    """The span of the trimmed ``raw`` found at ``offset`` inside an entry at ``span``."""
    if span is None:
        return None
    lead = len(raw) - len(raw.lstrip())
    start = span[0] + offset + lead
    return (start, start + len(raw.strip()))


def split_entries(text: str, flag: str, *, prefix: Sequence[str] = (),
                  error_code: str = "invalid_assignment", modules: bool = True,
                  extra_keys: frozenset[str] = frozenset()) -> list[Entry]:
    """Split a flag's joined value into entries (spec section 2, steps 1-4).

    Args:
        text: the flag's value after repeated flags are joined with ``,``.
        flag: the flag name, for messages (``--backend``).
        prefix: entries a compatibility flag prepends (``te=cpu``); their spans are None.
        error_code: code for an empty key or value.
        modules: when True keys are module names (``unknown_module`` on others);
            when False keys are kept as written (``--max-vram`` device keys).
        extra_keys: normalised keys accepted besides the modules (``--backend``'s ``cfg``,
            spec section 14.5); such an entry's ``module`` is the key.

    Raises:
        PlanError: ``error_code`` for an empty key or value, ``unknown_module``.
    """
    entries = []
    for part, span in _parts(text, prefix):
        if "=" not in part:
            entries.append(Entry(None, None, part, span, span))
            continue
        raw_key, raw_val = part.split("=", 1)
        key, val = raw_key.strip(), raw_val.strip()
        key_span = _sub(span, raw_key, 0)
        val_span = _sub(span, raw_val, len(raw_key) + 1)
        if not key or not val:
            what = "key" if not key else "value"
            raise PlanError(error_code, f"{flag}: empty {what} in '{part}'"
                            + (" (write GiB as a plain number)" if error_code == "invalid_max_vram"
                               else ""), flag=flag, text=text, span=span)
        if key.lower() in DEFAULT_KEYS:
            entries.append(Entry(None, Ref(key, key_span), val, val_span, span))
            continue
        module = normalize_module(key) if modules else None
        norm = key.lower().replace("-", "").replace("_", "")
        if modules and module is None and norm in extra_keys:
            module = norm
        if modules and module is None:
            raise PlanError("unknown_module", f"{flag}: unknown module '{key}'{module_hint(key)}",
                            flag=flag, text=text, span=key_span)
        entries.append(Entry(module, Ref(key, key_span), val, val_span, span))
    return entries


def parse_runtime_value(entry: Entry, flag: str, text: str) -> RuntimeValue:
    """The device value of a ``--backend`` entry (spec section 4).

    Raises:
        PlanError: ``invalid_device_list`` (a list with no entries), ``default_in_device_list``,
            ``disk_not_runtime``.
    """
    value, vspan = entry.value, entry.value_span
    if "&" not in value:
        if value.lower() == "disk":
            raise PlanError("disk_not_runtime", f"{flag}: 'disk' is not a device a module can "
                            "run on (use --params-backend for weights on disk)",
                            flag=flag, text=text, span=vspan)
        return RuntimeValue((Ref(value, vspan),), False, vspan)
    refs = []
    pos = 0
    for raw in value.split("&"):
        name = raw.strip()
        if name:
            rspan = _sub(vspan, raw, pos)
            if name.lower() in ("auto", "default"):
                raise PlanError("default_in_device_list", f"{flag}: '{name}' cannot appear in a "
                                "device list; name the devices", flag=flag, text=text, span=rspan)
            if name.lower() == "disk":
                raise PlanError("disk_not_runtime", f"{flag}: 'disk' is not a device a module "
                                "can run on", flag=flag, text=text, span=rspan)
            refs.append(Ref(name, rspan))
        pos += len(raw) + 1
    if not refs:
        raise PlanError("invalid_device_list", f"{flag}: device list '{value}' names no device",
                        flag=flag, text=text, span=vspan)
    return RuntimeValue(tuple(refs), True, vspan)


def parse_params_value(entry: Entry, flag: str, text: str) -> ParamsValue:
    """The residency of a ``--params-backend`` entry: ``disk`` or a device (spec section 4).

    Raises:
        PlanError: ``params_device_list`` for any value containing ``&``.
    """
    if "&" in entry.value:
        raise PlanError("params_device_list", f"{flag}: '{entry.value}' is a device list; weights "
                        "live on one device (or disk)", flag=flag, text=text, span=entry.value_span)
    if entry.value.lower() == "disk":
        return ParamsValue("disk", None, entry.value_span)
    return ParamsValue("device", Ref(entry.value, entry.value_span), entry.value_span)


def parse_gib(value: str, flag: str, text: str, span: Span | None) -> Decimal:
    """A ``--max-vram`` number in GiB as an exact Decimal (spec section 7).

    Raises:
        PlanError: ``invalid_max_vram`` for anything but a plain decimal number, and for a
            magnitude above 2^32 GiB (an overflow such as ``1e400`` is an error, not a
            budget silently cut to the largest one).
    """
    if not _NUMBER.fullmatch(value):
        raise PlanError("invalid_max_vram", f"{flag}: '{value}' is not a number of GiB "
                        "(write GiB as a plain number, e.g. 6.5)", flag=flag, text=text, span=span)
    gib = Decimal(value)
    if gib.copy_abs() > _GIB_MAX:
        raise PlanError("invalid_max_vram", f"{flag}: '{short_text(value)}' GiB is out of range "
                        f"(at most {_GIB_MAX:f} GiB)", flag=flag, text=text, span=span)
    return clamp_gib(gib)


def short_text(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters with an ellipsis and the full length, for
    messages that quote user input (a 100,000-character flag must not fill the terminal)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit - 1]}… ({len(text)} characters)"


#: Largest and smallest magnitudes kept; beyond them budgets are clamped (still exact bytes).
_GIB_MAX = Decimal(MAX_BUDGET_BYTES) / GIB
_GIB_MIN = Decimal("1e-20")
_CTX = Context(prec=28)  # fixed, so a caller's decimal context cannot change budgets


def clamp_gib(gib: Decimal) -> Decimal:
    """``gib`` rounded to 28 digits with its magnitude clamped into [1e-20, 2^32] GiB (zero
    stays zero), so absurd exponents cannot overflow later arithmetic."""
    if gib == 0:
        return Decimal(0)
    mag = gib.copy_abs()
    if _GIB_MIN <= mag <= _GIB_MAX:
        return _CTX.plus(gib)  # rounds to 28 digits, so writing it back is exact
    bound = _GIB_MAX if mag > _GIB_MAX else _GIB_MIN
    return bound.copy_negate() if gib < 0 else bound


def gib_to_bytes(gib: Decimal) -> int:
    """``gib`` * 2^30 bytes rounded toward zero, clamped to +-:data:`MAX_BUDGET_BYTES`."""
    gib = clamp_gib(gib)
    return max(-MAX_BUDGET_BYTES, min(MAX_BUDGET_BYTES, int(_CTX.multiply(gib, GIB))))


def format_gib(gib: Decimal) -> str:
    """Canonical text of a GiB number: plain decimal, no ``+``, no trailing zeros."""
    if gib == 0:
        return "0"
    norm = gib.normalize(_CTX)
    exp = norm.as_tuple().exponent
    if isinstance(exp, int) and -20 <= exp <= 20:
        return format(norm, "f")
    return str(norm)


class DeviceIndex:
    """Fast, case-insensitive device-name resolution over an inventory (spec section 3)."""

    def __init__(self, inventory: Inventory) -> None:
        self.inventory = inventory
        self.devices: dict[str, Device] = {d.name: d for d in inventory}
        self._lower = [(d.name.lower(), d.name) for d in inventory]
        self._exact = {low: name for low, name in reversed(self._lower)}
        self._registry: dict[str, str] = {}
        for d in reversed(inventory.devices):
            if d.registry:
                self._registry[d.registry.lower()] = d.name
        if "metal" not in self._registry and "mtl" in self._registry:
            self._registry["metal"] = self._registry["mtl"]
        self.first_gpu = self._first("gpu") or self._first("igpu")
        cpu = self._first("cpu")
        self.default = self.first_gpu or cpu or (inventory.devices[0].name if len(inventory)
                                                 else None)
        self._cache: dict[str, str | tuple[str, list[str]]] = {}

    def _first(self, typ: str) -> str | None:
        return next((d.name for d in self.inventory if d.type == typ), None)

    def lookup(self, value: str) -> str | tuple[str, list[str]]:
        """The device name ``value`` resolves to, or ``(code, candidates)`` on failure."""
        key = value.strip().lower()
        hit = self._cache.get(key)
        if hit is None:
            hit = self._lookup(key)
            self._cache[key] = hit
        return hit

    def _lookup(self, key: str) -> str | tuple[str, list[str]]:
        if key in DEFAULT_TOKENS:
            return self.default if self.default else ("device_not_found", [])
        if key == "gpu":
            return self.first_gpu if self.first_gpu else ("device_not_found", [])
        if key in self._registry:
            return self._registry[key]
        if key in self._exact:
            return self._exact[key]
        matches = [name for low, name in self._lower if low.startswith(key)]
        if len(matches) == 1:
            return matches[0]
        return ("ambiguous_device", matches) if matches else ("device_not_found", [])

    def resolve(self, ref: Ref, flag: str, text: str | None, *,
                not_found: str = "device_not_found") -> str:
        """The exact device name ``ref`` names.

        Raises:
            PlanError: ``ambiguous_device`` (listing candidates) or ``not_found`` (listing
                the available names), with ``ref``'s span.
        """
        hit = self.lookup(ref.text)
        if isinstance(hit, str):
            return hit
        code, matches = hit
        if code == "ambiguous_device":
            raise PlanError(code, f"{flag}: '{ref.text}' is ambiguous: it could be "
                            f"{', '.join(matches)}; write the full name",
                            flag=flag, text=text, span=ref.span)
        what = "no GPU device" if ref.text.strip().lower() == "gpu" else f"no device '{ref.text}'"
        available = ", ".join(self.devices) or "none"
        raise PlanError(not_found, f"{flag}: {what} (available: {available})",
                        flag=flag, text=text, span=ref.span)
