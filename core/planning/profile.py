"""Model profiles: what the planner needs to know of a model without its weights.

A profile gives, per module, the byte size of each numbered block (spec section 8) and the
bytes of everything else, plus, for ``te``, a breakdown per encoder. JSON form (the
format of ``shared/cases/profiles``)::

    {"modules": {"diffusion": {"blocks": [bytes, ...], "other": bytes,
                               "block_names": [...]?, "stages": [bytes, ...]?},
                 "te": {"blocks": [...], "other": bytes,
                        "encoders": {"clip_l": bytes, "t5xxl": bytes}?, "tail": bytes?},
                 ...},
     "architecture": str?, "name": str?,
     "autofit": {"diffusion": bytes, "te": bytes, "vae": bytes}?,
     "phases": {"high_noise": {"blocks": [...], "other": bytes}}?}

``phases`` holds the other diffusion models of a two-stage model, each run for its own
part of the sigma schedule on the ``diffusion`` module's placement (Wan 2.2 A14B: the
high-noise expert of ``--high-noise-diffusion-model`` runs first; ``modules["diffusion"]``
is the low-noise expert of ``--diffusion-model``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sdplan.core.errors import ModelFileError
from sdplan.core.planning.bounded_json import read_json


@dataclass(frozen=True)
class ModuleProfile:
    """Sizes of one module's weights.

    Attributes:
        blocks: byte size of block 0, 1, ... (empty when the module has no splittable
            blocks, as UNets: a split then gets warning ``no_blocks``).
        other: bytes of every non-block tensor.
        encoders: for ``te``: bytes per encoder (``clip_l``, ``clip_g``, ``t5xxl``,
            ``llm``); empty otherwise.
        block_encoder: for ``te``: the encoder whose blocks are listed in ``blocks``
            (the dominant one, split across devices), or None.
        stages: for a module without blocks whose graph the engine can still cut (a
            UNet's input blocks, middle block and output blocks, in execution order): the
            bytes of each stage, a breakdown of part of ``other``. ``--max-vram`` segments
            pack stages; a layer split never uses them (spec section 8).
        tail: for ``te``: the bytes of the LLM encoder's final norm and output head (part of
            ``other``), which a family reading an earlier state never loads
            (:mod:`sdplan.core.modelfiles.te_read`); 0 when they are not there.
    """

    blocks: tuple[int, ...] = ()
    other: int = 0
    encoders: Mapping[str, int] = field(default_factory=dict)
    block_encoder: str | None = None
    stages: tuple[int, ...] = ()
    tail: int = 0

    @property
    def total(self) -> int:
        """All weight bytes of the module."""
        return sum(self.blocks) + self.other

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"blocks": list(self.blocks), "other": self.other}
        if self.encoders:
            d["encoders"] = dict(self.encoders)
        if self.block_encoder:
            d["block_encoder"] = self.block_encoder
        if self.stages:
            d["stages"] = list(self.stages)
        if self.tail:
            d["tail"] = self.tail
        return d


@dataclass(frozen=True)
class Profile:
    """Per-module sizes of a model (see module docstring for the JSON form).

    ``autofit`` holds the ``diffusion``/``te``/``vae`` sizes as sd-cli's ``--auto-fit``
    counts them (file types plus 64 bytes per tensor, upstream's unused tensors left out;
    :mod:`sdplan.core.planning.autofit`), and ``autofit_loaded`` the same components as
    sd-cli allocates them (token embeddings it loads as F32), when known from the files.
    ``phases``: phase name (``high_noise``) -> the sizes of that diffusion phase's model
    (module docstring); empty for a one-stage model.
    """

    modules: Mapping[str, ModuleProfile]
    name: str | None = None
    architecture: str | None = None
    autofit: Mapping[str, int] = field(default_factory=dict)
    autofit_loaded: Mapping[str, int] = field(default_factory=dict)
    phases: Mapping[str, ModuleProfile] = field(default_factory=dict)

    def get(self, module: str) -> ModuleProfile | None:
        return self.modules.get(module)

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"modules": {k: v.to_json() for k, v in self.modules.items()}}
        if self.name:
            d["name"] = self.name
        if self.architecture:
            d["architecture"] = self.architecture
        if self.autofit:
            d["autofit"] = dict(self.autofit)
        if self.autofit_loaded:
            d["autofit_loaded"] = dict(self.autofit_loaded)
        if self.phases:
            d["phases"] = {k: v.to_json() for k, v in self.phases.items()}
        return d

    @classmethod
    def from_json(cls, data: object, *, source: str = "profile") -> Profile:
        """Parse the JSON form; raises :class:`ModelFileError` naming ``source``."""
        if not isinstance(data, dict) or not isinstance(data.get("modules"), dict):
            raise ModelFileError(source, "a profile must be an object with a 'modules' object")
        mods = _module_profiles(data["modules"], source)
        raw_phases = data.get("phases") or {}
        if not isinstance(raw_phases, dict) or not set(raw_phases) <= {"high_noise"}:
            raise ModelFileError(source, "'phases' must be an object with only 'high_noise'")
        phases = _module_profiles(raw_phases, source)
        sizes: dict[str, dict[str, int]] = {}
        for key in ("autofit", "autofit_loaded"):
            raw_sizes = data.get(key) or {}
            if not isinstance(raw_sizes, dict) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 0
                    for v in raw_sizes.values()):
                raise ModelFileError(source, f"'{key}' must map components to bytes")
            sizes[key] = {str(k): int(v) for k, v in raw_sizes.items()}
        return cls(modules=mods, name=data.get("name"), architecture=data.get("architecture"),
                   autofit=sizes["autofit"], autofit_loaded=sizes["autofit_loaded"], phases=phases)

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """Read a profile JSON file (:func:`sdplan.core.planning.bounded_json.read_json`);
        raises :class:`ModelFileError` naming the file."""
        p = Path(path)
        try:
            data = read_json(p, what="profile")
        except (OSError, ValueError) as exc:  # PathError naming the path, JsonRefused
            raise ModelFileError(p, f"cannot read profile: {str(exc).removeprefix(f'{p}: ')}") from None
        return cls.from_json(data, source=str(p))


def _module_profiles(modules: dict[str, object], source: str) -> dict[str, ModuleProfile]:
    """Parse ``{"name": {"blocks": [...], "other": ..., ...}}``; :class:`ModelFileError`
    naming ``source`` and the module for a malformed entry."""
    mods: dict[str, ModuleProfile] = {}
    for name, raw in modules.items():
        if not isinstance(raw, dict):
            raise ModelFileError(source, f"module {name!r}: expected an object")
        blocks = raw.get("blocks", [])
        other = raw.get("other", 0)
        if not isinstance(blocks, list) or not all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks
        ):
            raise ModelFileError(source, f"module {name!r}: 'blocks' must be a list of bytes")
        if not isinstance(other, int) or isinstance(other, bool) or other < 0:
            raise ModelFileError(source, f"module {name!r}: 'other' must be bytes")
        stages = raw.get("stages", []) or []
        if not isinstance(stages, list) or not all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in stages
        ) or sum(stages) > other:
            raise ModelFileError(source, f"module {name!r}: 'stages' must be a list of bytes "
                                         "within 'other'")
        tail = raw.get("tail", 0)
        if not isinstance(tail, int) or isinstance(tail, bool) or not 0 <= tail <= other:
            raise ModelFileError(source, f"module {name!r}: 'tail' must be bytes within 'other'")
        enc = raw.get("encoders", {}) or {}
        if not isinstance(enc, dict):
            raise ModelFileError(source, f"module {name!r}: 'encoders' must be an object")
        mods[name] = ModuleProfile(
            blocks=tuple(blocks),
            other=other,
            encoders={str(k): int(v) for k, v in enc.items()},
            block_encoder=raw.get("block_encoder"),
            stages=tuple(stages),
            tail=tail,
        )
    return mods
