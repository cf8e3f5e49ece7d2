"""The models a server serves: the one given on its command line, and those of its model
library that a request may name (a model swap).

A :class:`ServedModel` is a complete model set (sd-cli's model-file keys -> paths) with its
headers read once: the family that runs it, the sizes it draws, its defaults (the demo
model's own). :meth:`ModelCatalog.prepare` turns a client's request
(:class:`~sdplan.core.server.apis.ParsedRequest`) into the checked engine settings: the model
it names (by file name or stem, from the library folders given with ``--models-dir``), its
settings over the model's defaults, built with
:meth:`~sdplan.core.pipelines.request.GenerationRequest.from_settings` and checked against
the family (:meth:`~sdplan.core.pipelines.request.GenerationRequest.check`: the refusals of
the command line), the size rule of the model's files, and the server's limits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdplan.core.errors import RequestRefused, SdplanError
from sdplan.core.server.apis import ParsedRequest
from sdplan.core.server.limits import ServerLimits

log = logging.getLogger(__name__)

__all__ = ["ServedModel", "ModelCatalog", "LATE_FILES"]

#: Model files the engine reads late (not part of the model set's headers).
LATE_FILES = ("taesd", "upscale_model")


@dataclass
class ServedModel:
    """One model a server can run.

    Attributes:
        name: what clients call it (the main file's stem).
        files: sd-cli model-file key -> paths.
        defaults: settings taken where a request gives none (sd-cli request keys; the demo
            model's size, steps, CFG and sampler).
        models: the headers (:class:`~sdplan.core.modelfiles.checkpoint.ModelSet`), read on
            first use; None before.
        note: why the model cannot run (a library model without its text encoder...), or None.
    """

    name: str
    files: dict[str, list[str]]
    defaults: dict[str, Any] = field(default_factory=dict)
    models: Any = None
    note: str | None = None

    @property
    def path(self) -> str:
        """The main file (``model`` or ``diffusion_model``)."""
        return (self.files.get("model") or self.files.get("diffusion_model") or [""])[0]

    def headers(self) -> Any:
        """The model set's headers, read once.

        Raises:
            ModelFileError: unreadable files (naming the file).
        """
        if self.models is None:
            from sdplan.core.modelfiles.checkpoint import read_model_files

            self.models = read_model_files({k: v for k, v in self.files.items() if k not in LATE_FILES})
        return self.models

    def family(self) -> tuple[Any, str | None]:
        """The registry family that runs it and its variant."""
        from sdplan.core.pipelines.request import family_for

        return family_for(self.headers().architecture)

    def to_json(self) -> dict[str, Any]:
        """``{"name", "path", "files", "available", "note"}``."""
        return {"name": self.name, "path": self.path, "files": self.files,
                "available": self.note is None, "note": self.note}


def _stem(path: str) -> str:
    name = Path(path).name
    for suffix in (".safetensors", ".sft", ".gguf"):
        if name.lower().endswith(suffix):
            return name[:-len(suffix)]
    return name


class ModelCatalog:
    """The served model and the library's (module docstring).

    Args:
        default: the model of the command line.
        library: other models a request may name.
        limits: the server's limits.
        upscalers: the library's ESRGAN upscaler models (file stem -> path) a request's
            hires fix may name (A1111's ``hr_upscaler``, sd-server's ``hires.upscaler``).
    """

    def __init__(self, default: ServedModel, library: Sequence[ServedModel] = (),
                 limits: ServerLimits | None = None, upscalers: Mapping[str, str] | None = None) -> None:
        self.default = default
        #: The library's upscaler models a hires fix may name: stem -> path.
        self.upscalers: dict[str, str] = dict(upscalers or {})
        self.models: dict[str, ServedModel] = {default.name: default}
        for m in library:
            self.models.setdefault(m.name, m)
        self.limits = limits or ServerLimits()
        self._lock = threading.Lock()  # headers are read once, from the request threads

    @classmethod
    def scan(cls, default: ServedModel, folders: Sequence[str], limits: ServerLimits | None = None
             ) -> ModelCatalog:
        """The catalog of ``default`` and every checkpoint or diffusion model in ``folders``
        (:func:`sdplan.core.modelfiles.library.scan_library`, headers cached), each with
        its companions from the same library; a model whose companions are missing is listed
        with a note and refused when named."""
        if not folders:
            return cls(default, (), limits)
        from sdplan.core.modelfiles.library import DIFFUSION_KINDS, scan_library
        from sdplan.core.modelfiles.library_fit import companions

        entries = list(scan_library(list(folders)).entries)
        found = []
        upscalers = {Path(e.path).stem: str(e.path) for e in entries
                     if e.kind == "upscaler" and e.error is None}
        for e in entries:
            if e.kind not in DIFFUSION_KINDS or e.error is not None:
                continue
            flags, missing = companions(e, entries)
            note = f"missing {', '.join(missing)} in the library" if missing else None
            found.append(ServedModel(_stem(e.path), flags, note=note))
        return cls(default, found, limits, upscalers)

    def get(self, name: str | None) -> ServedModel:
        """The model called ``name`` (file name or stem; None, empty or the default's
        aliases: the default).

        Raises:
            RequestRefused: no such model (``model_not_found``, 404) or one that cannot run.
        """
        if not name or name in ("default", "sd-cpp-local", "sdplan"):
            return self.default
        key = _stem(name.strip())
        model = self.models.get(key) or next((m for m in self.models.values() if Path(m.path).name == name), None)
        if model is None:
            raise RequestRefused(f"model {name[:80]!r} is not served here; the models are: "
                                 f"{', '.join(sorted(self.models))}", "model_not_found", 404)
        if model.note is not None:
            raise RequestRefused(f"model {model.name!r} cannot run: {model.note}", "model_unavailable", 400)
        return model

    def prepare(self, parsed: ParsedRequest, pictures: Mapping[str, Any] | None = None) -> tuple[ServedModel, Any]:
        """The model ``parsed`` names and its checked
        :class:`~sdplan.core.pipelines.request.GenerationRequest` (built with
        ``from_settings`` from the model's defaults under the request's settings and
        ``pictures``' paths; checked against the family, the size rule and the limits).

        Raises:
            RequestRefused: an unknown model, or what the family, the size rule or the
                limits refuse (``invalid_parameter`` / ``too_large``, naming the setting).
        """
        from sdplan.core.pipelines.request import GenerationRequest
        from sdplan.core.pipelines.size_rule import check_size
        from sdplan.core.server.apis import resolve_hires

        model = self.get(parsed.model)
        try:
            with self._lock:
                models = model.headers()
                fam, variant = model.family()
            settings = {**model.defaults, **parsed.settings, **(pictures or {}), "previews": False}
            d = fam.defaults_for(variant)
            resolve_hires(parsed, settings, int(settings.get("width") or d.width or 512),
                          int(settings.get("height") or d.height or 512), self.upscalers)
            req = GenerationRequest.from_settings(settings, model.files).check(fam, variant)
        except RequestRefused:
            raise
        except SdplanError as exc:
            raise RequestRefused(str(exc), "invalid_parameter", 400) from None
        except (TypeError, ValueError) as exc:
            raise RequestRefused(f"invalid settings: {exc}", "invalid_parameter", 400) from None
        self.limits.check_request(req)
        try:
            check_size(models, int(req.width or 0), int(req.height or 0))
        except SdplanError as exc:
            raise RequestRefused(str(exc), "invalid_parameter", 400) from None
        return model, req

    def edit_keys(self, model: ServedModel) -> str:
        """How ``model``'s family edits a picture: ``ref_images`` (FLUX.2 klein's reference
        pictures) or ``init_img`` (image to image).

        Raises:
            RequestRefused: a family that takes neither (``unsupported``).
        """
        from sdplan.core.families import options as o

        fam, variant = model.family()
        if fam.honours(o.REF_IMAGES, variant):
            return "ref_images"
        if fam.honours(o.INIT_IMG, variant):
            return "init_img"
        raise RequestRefused(f"{fam.title} does not edit pictures in sdplan", "unsupported", 400)

    def names(self) -> list[dict[str, Any]]:
        """Every model as :meth:`ServedModel.to_json`, the default first."""
        return [m.to_json() for m in self.models.values()]
