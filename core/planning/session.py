"""The saved plan: sdplan's session and "Export plan" file format.

A saved plan is a JSON object (version key ``sdplan_plan``: 1) holding the canonical
placement strings (and the resolved plan's JSON beside them, for people and other tools),
the model files by sd-cli flag key, the generation settings, the modules added by hand
and, when known, the fit. Reading one needs only the strings: the rest is re-derived from
the files and devices of the machine that opens it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdplan.core.errors import PlanError
from sdplan.core.planning.bounded_json import read_json
from sdplan.core.planning.modules import MODEL_FLAGS, MODULES
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.record_check import checked_settings

#: The format's version, written under this key.
FORMAT_KEY = "sdplan_plan"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class SavedPlan:
    """What a saved plan restores.

    Attributes:
        placement: the placement its strings describe.
        model_files: sd-cli model-file key -> paths (unknown keys dropped).
        generation: generation settings as saved (sd-cli request keys).
        extra_modules: modules the user added to the board by hand.
    """

    placement: Placement
    model_files: dict[str, list[str]] = field(default_factory=dict)
    generation: dict[str, Any] = field(default_factory=dict)
    extra_modules: list[str] = field(default_factory=list)


def plan_document(plan: Any, model_files: Mapping[str, Sequence[str]],
                  generation: Mapping[str, Any], extra_modules: Sequence[str] = (),
                  fit: Any = None) -> dict[str, object]:
    """The saved-plan JSON object of a resolved ``plan`` (:class:`~sdplan.core.planning.plan.Plan`)
    with its files, settings, hand-added modules and ``fit`` (a FitReport, or None)."""
    d: dict[str, object] = {FORMAT_KEY: FORMAT_VERSION, **plan.to_json(),
                            "model_files": {k: list(v) for k, v in model_files.items()},
                            "generation": dict(generation),
                            "extra_modules": list(extra_modules)}
    if fit is not None:
        d["fit"] = fit.to_json()
    return d


def read_plan_document(data: object, source: str = "plan") -> SavedPlan:
    """A :class:`SavedPlan` from saved-plan JSON (``source`` names it in errors).

    Raises:
        PlanError: ``invalid_plan`` when ``data`` is not a saved plan; placement syntax
            errors of its strings (spec section 11).
    """
    if not isinstance(data, dict) or "backend" not in data:
        raise PlanError("invalid_plan", f"{source}: not an sdplan plan (no 'backend')")
    texts = {k: data.get(k) or "" for k in ("backend", "params_backend", "max_vram")}
    servers = data.get("rpc_servers") or []
    if not all(isinstance(v, str) for v in texts.values()) or not isinstance(servers, list) \
            or not all(isinstance(s, str) for s in servers):
        raise PlanError("invalid_plan", f"{source}: the placement strings are not texts")
    placement = Placement.from_strings(
        texts["backend"], texts["params_backend"], texts["max_vram"],
        stream_layers=bool(data.get("stream_layers")), rpc_servers=list(servers))
    files = data.get("model_files") or {}
    model_files: dict[str, list[str]] = {}
    if isinstance(files, dict):
        for key, paths in files.items():
            listed = [paths] if isinstance(paths, str) else paths
            if key in MODEL_FLAGS and isinstance(listed, list) and all(isinstance(p, str) for p in listed):
                model_files[key] = list(listed)
    generation = checked_settings(data.get("generation"))  # each setting of its type
    extra_raw = data.get("extra_modules") or []
    extra = [m for m in extra_raw if isinstance(m, str) and m in MODULES] \
        if isinstance(extra_raw, list) else []
    return SavedPlan(placement, model_files, generation, extra)


def save_plan_file(path: str | Path, document: Mapping[str, object]) -> None:
    """Write a saved-plan document as indented JSON.

    Raises:
        OSError: the file cannot be written.
    """
    Path(path).write_text(json.dumps(document, indent=1), encoding="utf-8")


def load_plan_file(path: str | Path) -> SavedPlan:
    """Read a saved plan from a JSON file.

    Raises:
        PlanError: ``invalid_plan`` for a file that is not JSON or not a saved plan.
    """
    try:
        data = read_json(path, what="plan file")
    except (OSError, ValueError) as exc:  # PathError naming the path, JsonRefused
        raise PlanError("invalid_plan", f"cannot read the plan: {exc}") from None
    return read_plan_document(data, str(path))
