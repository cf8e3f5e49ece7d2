"""The server without its HTTP layer: the models, the queue, the device groups, what
``/metrics`` and ``capabilities`` report, and how a client's request becomes a job.

:class:`Server` is what :mod:`sdplan.core.server.http` serves and ``sdplan serve`` starts:
:meth:`Server.start` starts each device group's engine, plans the served model on it and
refuses to start when a group's plan does not fit (unless ``force``); :meth:`Server.submit`
turns a :class:`~sdplan.core.server.apis.ParsedRequest` into a checked, queued
:class:`~sdplan.core.server.queue.ServerJob` (every refusal before the job is queued);
:meth:`Server.metrics` is sd-server's ``/metrics`` shape with sdplan's plan and memory.
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdplan.core.errors import InvalidArgument, RequestRefused
from sdplan.core.server.apis import ParsedRequest
from sdplan.core.server.groups import DeviceGroup, GroupWorker
from sdplan.core.server.limits import ServerLimits
from sdplan.core.server.models import ModelCatalog
from sdplan.core.server.queue import ServerJob, ServerQueue

log = logging.getLogger(__name__)

__all__ = ["ServerConfig", "Server", "check_bind"]


@dataclass(frozen=True)
class ServerConfig:
    """How a server listens and what it takes.

    Attributes:
        host, port: where it listens (127.0.0.1 unless ``allow_remote``).
        api_key: the key clients send (``Authorization: Bearer KEY``, ``X-API-Key`` or HTTP
            basic auth's password); None: no key.
        allow_remote: listening on an address other than loopback is allowed.
        limits: the request limits.
        queue_file: where the queue is recorded (None: in memory).
        force: run plans that do not fit.
    """

    host: str = "127.0.0.1"
    port: int = 7860
    api_key: str | None = None
    allow_remote: bool = False
    limits: ServerLimits = field(default_factory=ServerLimits)
    queue_file: str | None = None
    force: bool = False


def check_bind(host: str, allow_remote: bool) -> None:
    """Refuse a listening address that is not loopback (127.0.0.0/8, ::1, ``localhost``)
    unless ``allow_remote``.

    Raises:
        InvalidArgument: naming the address and the flag.
    """
    if host == "localhost":
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not allow_remote:
        raise InvalidArgument(f"--host {host}: sdplan serves other machines only with --allow-remote "
                              "(and an --api-key is advised)")


class Server:
    """A server (module docstring).

    Args:
        catalog: the models it serves.
        placement: the placement flags (one plan, replicated per group).
        groups: the device groups.
        config: how it listens and its limits.
        engine_factory: makes each group's engine (tests); default an isolated engine.
    """

    def __init__(self, catalog: ModelCatalog, placement: Any, groups: Sequence[DeviceGroup],
                 config: ServerConfig, engine_factory: Callable[[DeviceGroup], Any] | None = None) -> None:
        self.catalog = catalog
        self.config = config
        self.limits = config.limits
        self.queue = ServerQueue(config.limits.max_queue, config.queue_file)
        self.workers = [GroupWorker(g, self.queue, placement, self._encode, force=config.force,
                                    engine_factory=engine_factory) for g in groups]
        self.started = time.time()

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        """Start every group's engine and plan the served model on it at its default size;
        then the groups take jobs.

        Raises:
            SdplanError / EngineError / PlanError: a group's engine or devices cannot be
                reached, the placement does not resolve there, or its plan does not fit.
        """
        model = self.catalog.default
        fam, variant = model.family()
        d = fam.defaults_for(variant)
        w = int(model.defaults.get("width") or d.width or 512)
        h = int(model.defaults.get("height") or d.height or 512)
        try:
            for worker in self.workers:
                worker.start_engine()
                worker.check_fits(model, w, h)
        except BaseException:
            self.close()
            raise
        for worker in self.workers:
            worker.start()

    def close(self) -> None:
        """Cancel the queued jobs and stop every engine."""
        self.queue.close()
        for worker in self.workers:
            worker.close()

    # ------------------------------------------------------------------ jobs
    def submit(self, parsed: ParsedRequest) -> ServerJob:
        """Check ``parsed`` (model, settings against the family, pictures, limits) and queue
        it. The pictures are written to a temporary folder the job removes when it ends.

        Raises:
            RequestRefused: anything refused, before the job is queued.
        """
        model = self.catalog.get(parsed.model)
        pictures = dict(parsed.pictures)
        if "edit" in pictures:
            edits = pictures.pop("edit")
            key = self.catalog.edit_keys(model)
            if key == "init_img":
                if len(edits) > 1:
                    raise RequestRefused("image: this model edits one picture at a time", "invalid_parameter", 400)
                pictures["init_img"] = edits[0]
                parsed.settings.setdefault("strength", 0.75)
            else:
                pictures["ref_images"] = edits
        folder = Path(tempfile.mkdtemp(prefix="sdplan-serve-")) if pictures else None
        try:
            from sdplan.core.server.pictures import write_pictures

            paths = write_pictures(pictures, folder, max_pixels=self.limits.max_pixels,
                                   mask_invert=parsed.mask_invert, names=parsed.fields) if folder is not None else {}
            model, req = self.catalog.prepare(parsed, paths)
            settings = {**model.defaults, **parsed.settings, **paths, "previews": False}
            return self.queue.submit(ServerJob("", parsed, model, req, settings, folder))
        except BaseException:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
            raise

    def _encode(self, job: ServerJob, result: dict[str, Any]) -> list[bytes]:
        from sdplan.core.pipelines.stages.results import picture_text
        from sdplan.core.server.pictures import encode_image

        text = picture_text(result, job.model.files)
        return [encode_image(img, job.parsed.output_format, job.parsed.output_compression,
                             {**text, "batch_index": str(i)}) for i, img in enumerate(result["images"])]

    def info(self, job: ServerJob) -> dict[str, Any]:
        """What a finished job ran: the settings (``params``), seeds, the device group, the
        engine's timings, whether the model was loaded for it."""
        params = dict(job.record.get("params") or {})
        seed = int(params.get("seed", job.request.seed))
        n = len(job.images)
        serving = job.record.get("serving") or {}
        return {"seed": seed, "all_seeds": [seed + i for i in range(n)], "width": params.get("width"),
                "height": params.get("height"), "steps": params.get("steps"), "cfg_scale": params.get("cfg_scale"),
                "sampler_name": params.get("sampling_method"), "prompt": params.get("prompt"),
                "negative_prompt": params.get("negative_prompt", ""), "sd_model_name": job.model.name,
                "job": job.id, "device_group": job.group, "timings": job.record.get("timings"),
                "loaded": serving.get("loaded"), "params": params}

    # ------------------------------------------------------------------ reports
    def metrics(self) -> dict[str, Any]:
        """``/metrics``: sd-server's ``server``, ``processing``, ``generation_speed`` and
        ``model_memory`` (bytes per module kind, device and RAM) with sdplan's ``groups``
        (each group's plan in effect, its estimate per device and module, and the loaded
        pipeline's memory per module and device: ``cache`` kept between requests, ``peak`` of
        the last run) and the ``queue``."""
        counts = self.queue.counts()
        groups = [w.metrics() for w in self.workers]
        done = counts["done"]
        busy = sum(float(g["last_job"].get("seconds") or 0.0) for g in groups)
        per_image = max(busy / max(sum(w.jobs_run for w in self.workers), 1), 0.001) if done else None
        return {
            "server": {"uptime_seconds": time.time() - self.started, "timestamp": int(time.time())},
            "processing": {"total_completed": done, "total_failed": counts["failed"],
                           "total_cancelled": counts["cancelled"],
                           "active": {"queued": counts["queued"], "generating": counts["running"]}},
            "generation_speed": {"avg_seconds_per_image": per_image,
                                 "images_per_second": (1.0 / per_image) if per_image else None},
            "model_memory": model_memory(groups),
            "groups": groups,
            "limits": self.limits.to_json(),
        }

    def capabilities(self) -> dict[str, Any]:
        """sd-server's ``GET /sdcpp/v1/capabilities`` for the served model."""
        from sdplan.core.pipelines.request_parts import HIRES_UPSCALERS
        from sdplan.core.sampling.names import samplers_for, schedulers_for

        model = self.catalog.default
        fam, variant = model.family()
        d = fam.defaults_for(variant)
        defaults = {"prompt": "", "negative_prompt": "", "clip_skip": -1,
                    "width": model.defaults.get("width") or d.width or 512,
                    "height": model.defaults.get("height") or d.height or 512, "strength": 0.75, "seed": -1,
                    "batch_count": 1,
                    "sample_params": {"scheduler": "default",
                                      "sample_method": model.defaults.get("sampling_method") or d.sampling_method,
                                      "sample_steps": model.defaults.get("steps") or d.steps,
                                      "guidance": {"txt_cfg": model.defaults.get("cfg_scale") or d.cfg_scale,
                                                   "distilled_guidance": d.guidance}},
                    "output_format": "png", "output_compression": 100}
        from sdplan.core.families import options as o

        features = {"init_image": fam.honours(o.INIT_IMG, variant), "mask_image": fam.honours(o.MASK, variant),
                    "control_image": False, "ip_adapter_image": False,
                    "ref_images": fam.honours(o.REF_IMAGES, variant), "lora": fam.honours(o.LORA, variant),
                    "vae_tiling": fam.honours(o.VAE_TILING, variant), "hires": fam.honours(o.HIRES, variant), "cache": False,
                    "cancel_queued": True, "cancel_generating": True}
        return {"model": {"name": Path(model.path).name, "stem": model.name, "path": model.path},
                "current_mode": "img_gen", "supported_modes": ["img_gen"],
                "defaults": defaults, "output_formats": ["png", "jpeg", "webp"], "features": features,
                "defaults_by_mode": {"img_gen": defaults},
                "output_formats_by_mode": {"img_gen": ["png", "jpeg", "webp"]},
                "features_by_mode": {"img_gen": features},
                "samplers": list(samplers_for(fam.sampling)), "schedulers": list(schedulers_for(fam.sampling)),
                "loras": [], "upscalers": [{"name": n} for n in (*HIRES_UPSCALERS, *sorted(self.catalog.upscalers))], "limits": self.limits.to_json(),
                "models": self.catalog.names()}


#: Module names of the engine's runners -> sd-server's ``model_memory`` kinds.
_KINDS = {"te": "text_encoders_bytes", "clip": "text_encoders_bytes", "clip_l": "text_encoders_bytes",
          "clip_g": "text_encoders_bytes", "t5xxl": "text_encoders_bytes", "llm": "text_encoders_bytes",
          "diffusion": "diffusion_model_bytes", "unet": "diffusion_model_bytes",
          "vae": "vae_bytes", "vae_encoder": "vae_bytes"}


def model_memory(groups: Sequence[dict[str, Any]]) -> dict[str, int] | None:
    """sd-server's ``model_memory`` over every group: weight bytes held between requests
    (``cache`` weights) by kind, on devices (``vram_bytes``: any device but the CPU) and in
    RAM; None when no model is loaded."""
    if not any(g.get("memory") for g in groups):
        return None
    out = dict.fromkeys(("total_bytes", "vram_bytes", "ram_bytes", "text_encoders_bytes",
                         "diffusion_model_bytes", "vae_bytes", "control_net_bytes", "extensions_bytes"), 0)
    for g in groups:
        for module, devices in (g.get("memory") or {}).items():
            for dev, mem in devices.items():
                n = int(mem["cache"]["weights"]) + int(mem["cache"]["staging"])
                out["total_bytes"] += n
                out["ram_bytes" if dev == "CPU" else "vram_bytes"] += n
                out[_KINDS.get(module, "extensions_bytes")] += n
    return out
