"""The HTTP side of ``sdplan serve``: a Starlette application over a
:class:`~sdplan.core.server.service.Server`.

Routes (sd-server's, ``examples/server/api.md``, with sdplan's own under ``/sdplan``):

- A1111: ``POST /sdapi/v1/txt2img``, ``/sdapi/v1/img2img``; ``GET /sdapi/v1/sd-models``,
  ``samplers``, ``schedulers``, ``loras``, ``upscalers`` (the library's upscaler models a
  hires fix may name), ``latent-upscale-modes``, ``options`` (``POST options`` with
  ``sd_model_checkpoint`` swaps the served model);
- OpenAI: ``POST /v1/images/generations``, ``/v1/images/edits`` (multipart), ``GET /v1/models``;
- sd-server's native: ``GET /sdcpp/v1/capabilities``, ``POST /sdcpp/v1/img_gen`` (202, then
  ``GET /sdcpp/v1/jobs/{id}``, ``POST /sdcpp/v1/jobs/{id}/cancel``);
- ``GET /metrics`` (:meth:`~sdplan.core.server.service.Server.metrics`), ``GET /health``,
  ``GET /sdplan/v1/queue`` (the queue's record, the app's queue format).

Every error is JSON ``{"error": {"code", "message", "type"}}`` (A1111's routes add
``detail``) with its status; an unexpected exception is a 500 ``server_error``, never a
dropped connection. A body over the size limit is refused (413) from its
``Content-Length`` or as it streams, before it is parsed. With an API key every route but
``/health`` needs it. The synchronous routes wait for their job and cancel it when the
client disconnects.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sdplan.core.errors import RequestRefused
from sdplan.core.server import apis
from sdplan.core.server.pictures import b64
from sdplan.core.server.queue import ServerJob
from sdplan.core.server.service import Server

log = logging.getLogger(__name__)

__all__ = ["create_app", "POLL_SECONDS"]

#: How often a waiting request looks at its job and its connection, in seconds.
POLL_SECONDS = 0.05


def _error(code: str, message: str, status: int, *, sdapi: bool = False) -> Any:
    from starlette.responses import JSONResponse

    body: dict[str, Any] = {"error": {"code": code, "message": message, "type": "invalid_request_error"
                                      if status < 500 else "server_error"}}
    if sdapi:
        body["detail"] = message
    return JSONResponse(body, status_code=status)


async def _body(request: Any, server: Server) -> bytes:
    """The request body, refused (413) past the limit from its length or as it streams."""
    limits = server.limits
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise RequestRefused("Content-Length is not a number", "invalid_request", 400)
        limits.check_body(int(length))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        limits.check_body(size)
        chunks.append(chunk)
    body = b"".join(chunks)
    request._body = body  # form() reads it again
    return body


async def _json(request: Any, server: Server) -> dict[str, Any]:
    body = await _body(request, server)
    if not body.strip():
        raise RequestRefused("the request body is empty; send a JSON object", "invalid_json", 400)
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestRefused(f"the request body is not JSON ({exc})", "invalid_json", 400) from None
    if not isinstance(data, dict):
        raise RequestRefused("the request body must be a JSON object", "invalid_json", 400)
    apis.check_finite(data)
    return data


async def _wait(request: Any, server: Server, job: ServerJob) -> bool:
    """Wait for ``job``; True when it ended, False when the client went away (the job is
    cancelled then)."""
    while not job.done.is_set():
        if await request.is_disconnected():
            try:
                server.queue.cancel(job.id)
            except RequestRefused:
                pass
            log.info("client gone: job %s cancelled", job.id)
            return False
        await asyncio.sleep(POLL_SECONDS)
    return True


def _failed(job: ServerJob, sdapi: bool = False) -> Any:
    code, message = job.error or ("generation_failed", "the job failed")
    status = 499 if code == "cancelled" else 400 if code in ("invalid_argument", "plan_does_not_fit",
                                                             "invalid_model_file") else 500
    return _error(code, message, status, sdapi=sdapi)


def create_app(server: Server) -> Any:
    """The Starlette application of ``server`` (module docstring)."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def run_sync(request: Request, parsed: apis.ParsedRequest) -> ServerJob | None:
        job = await asyncio.to_thread(server.submit, parsed)
        if not await _wait(request, server, job):
            server.queue.delivered(job)
            return None
        return job

    async def txt2img(request: Request, img2img: bool = False) -> Any:
        body = await _json(request, server)
        job = await run_sync(request, apis.from_sdapi(body, img2img=img2img))
        if job is None:
            return _error("cancelled", "the client disconnected", 499, sdapi=True)
        try:
            if job.state != "done":
                return _failed(job, sdapi=True)
            return JSONResponse({"images": [b64(i) for i in job.images], "parameters": job.parsed.echo,
                                 "info": json.dumps(server.info(job))})
        finally:
            server.queue.delivered(job)

    async def img2img(request: Request) -> Any:
        return await txt2img(request, img2img=True)

    async def openai_generate(request: Request) -> Any:
        return await _openai(request, apis.from_openai(await _json(request, server)))

    async def openai_edit(request: Request) -> Any:
        await _body(request, server)
        try:
            form = await request.form(max_files=16, max_fields=64)
        except (AssertionError, HTTPException, ValueError) as exc:
            raise RequestRefused(f"the edit is not a multipart form ({exc})", "invalid_request", 400) from None
        fields: dict[str, Any] = {}
        files: dict[str, list[bytes]] = {}
        for key, value in form.multi_items():
            if hasattr(value, "read"):
                files.setdefault(key, []).append(await value.read())
            else:
                fields[key] = value
        return await _openai(request, apis.from_openai(fields, files))

    async def _openai(request: Request, parsed: apis.ParsedRequest) -> Any:
        job = await run_sync(request, parsed)
        if job is None:
            return _error("cancelled", "the client disconnected", 499)
        try:
            if job.state != "done":
                return _failed(job)
            return JSONResponse({"created": int(job.created), "output_format": job.parsed.output_format,
                                 "data": [{"b64_json": b64(i), "revised_prompt": job.parsed.settings.get("prompt")}
                                          for i in job.images]})
        finally:
            server.queue.delivered(job)

    async def models(request: Request) -> Any:
        return JSONResponse({"object": "list", "data": [
            {"id": m["name"], "object": "model", "created": int(server.started), "owned_by": "local"}
            for m in server.catalog.names()]})

    async def sd_models(request: Request) -> Any:
        return JSONResponse([{"title": m["name"], "model_name": m["name"], "filename": m["path"],
                              "hash": None, "sha256": None, "config": None} for m in server.catalog.names()])

    async def samplers(request: Request) -> Any:
        names = server.capabilities()["samplers"]
        return JSONResponse([{"name": n, "aliases": [n], "options": {}} for n in names])

    async def schedulers(request: Request) -> Any:
        return JSONResponse([{"name": n, "label": n} for n in server.capabilities()["schedulers"]])

    async def empty_list(request: Request) -> Any:
        return JSONResponse([])

    async def upscalers(request: Request) -> Any:
        built_in = [{"name": n, "model_name": None, "model_path": None, "model_url": None, "scale": 1}
                    for n in ("None", "Lanczos", "Nearest")]
        return JSONResponse(built_in + [{"name": stem, "model_name": "ESRGAN", "model_path": path, "model_url": None,
                                         "scale": 4} for stem, path in sorted(server.catalog.upscalers.items())])

    async def latent_modes(request: Request) -> Any:
        from sdplan.core.pipelines.request_parts import LATENT_UPSCALERS

        return JSONResponse([{"name": n} for n in LATENT_UPSCALERS])

    async def options(request: Request) -> Any:
        if request.method == "POST":
            body = await _json(request, server)
            name = body.get("sd_model_checkpoint")
            if name is not None:
                if not isinstance(name, str):
                    raise RequestRefused("sd_model_checkpoint: must be text", "invalid_parameter", 400)
                server.catalog.default = server.catalog.get(name)
        return JSONResponse({"samples_format": "png", "sd_model_checkpoint": server.catalog.default.name})

    async def capabilities(request: Request) -> Any:
        return JSONResponse(server.capabilities())

    async def img_gen(request: Request) -> Any:
        parsed = apis.from_sdcpp(await _json(request, server))
        job = await asyncio.to_thread(server.submit, parsed)
        return JSONResponse({"id": job.id, "kind": job.kind, "status": "queued", "created": int(job.created),
                             "poll_url": f"/sdcpp/v1/jobs/{job.id}"}, status_code=202)

    async def vid_gen(request: Request) -> Any:
        raise RequestRefused("sdplan's server makes pictures, not videos", "unsupported", 400)

    async def job_status(request: Request) -> Any:
        return JSONResponse(_job_json(server, server.queue.get(request.path_params["job_id"])))

    async def job_cancel(request: Request) -> Any:
        job_id = request.path_params["job_id"]
        server.queue.cancel(job_id)
        return JSONResponse(_job_json(server, server.queue.get(job_id)))

    async def metrics(request: Request) -> Any:
        return JSONResponse(server.metrics())

    async def queue(request: Request) -> Any:
        return JSONResponse({"sdplan_queue": 1, "paused": False,
                             "jobs": [j.to_json() for j in server.queue.record.jobs]})

    async def health(request: Request) -> Any:
        return JSONResponse({"status": "ok", "model": server.catalog.default.name})

    async def index(request: Request) -> Any:
        return JSONResponse({"name": "sdplan", "model": server.catalog.default.name,
                             "routes": sorted({str(getattr(r, "path", "")) for r in app.routes})})

    def guarded(handler: Callable[[Request], Awaitable[Any]], sdapi: bool = False) -> Callable[[Request], Awaitable[Any]]:
        async def wrapped(request: Request) -> Any:
            try:
                if server.config.api_key and not _authorised(request, server.config.api_key):
                    return _error("unauthorized", "this server needs its API key (Authorization: Bearer KEY)",
                                  401, sdapi=sdapi)
                return await handler(request)
            except RequestRefused as exc:
                return _error(exc.code, str(exc), exc.status, sdapi=sdapi)
            except Exception as exc:  # noqa: BLE001 - a JSON error, never a dropped connection
                log.exception("request %s failed", request.url.path)
                return _error("server_error", f"{type(exc).__name__}: {exc}", 500, sdapi=sdapi)
        return wrapped

    routes = [
        Route("/sdapi/v1/txt2img", guarded(txt2img, True), methods=["POST"]),
        Route("/sdapi/v1/img2img", guarded(img2img, True), methods=["POST"]),
        Route("/sdapi/v1/sd-models", guarded(sd_models, True), methods=["GET"]),
        Route("/sdapi/v1/samplers", guarded(samplers, True), methods=["GET"]),
        Route("/sdapi/v1/schedulers", guarded(schedulers, True), methods=["GET"]),
        Route("/sdapi/v1/loras", guarded(empty_list, True), methods=["GET"]),
        Route("/sdapi/v1/upscalers", guarded(upscalers, True), methods=["GET"]),
        Route("/sdapi/v1/latent-upscale-modes", guarded(latent_modes, True), methods=["GET"]),
        Route("/sdapi/v1/options", guarded(options, True), methods=["GET", "POST"]),
        Route("/v1/images/generations", guarded(openai_generate), methods=["POST"]),
        Route("/v1/images/edits", guarded(openai_edit), methods=["POST"]),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/sdcpp/v1/capabilities", guarded(capabilities), methods=["GET"]),
        Route("/sdcpp/v1/img_gen", guarded(img_gen), methods=["POST"]),
        Route("/sdcpp/v1/vid_gen", guarded(vid_gen), methods=["POST"]),
        Route("/sdcpp/v1/jobs/{job_id}", guarded(job_status), methods=["GET"]),
        Route("/sdcpp/v1/jobs/{job_id}/cancel", guarded(job_cancel), methods=["POST"]),
        Route("/metrics", guarded(metrics), methods=["GET"]),
        Route("/sdplan/v1/queue", guarded(queue), methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/", guarded(index), methods=["GET"]),
    ]

    async def http_error(request: Request, exc: Any) -> Any:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _error(code, f"{request.method} {request.url.path}: {exc.detail}", exc.status_code)

    async def crash(request: Request, exc: Exception) -> Any:
        log.exception("request %s failed", request.url.path)
        return _error("server_error", f"{type(exc).__name__}: {exc}", 500)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error, Exception: crash})
    return app


def _authorised(request: Any, key: str) -> bool:
    """Whether ``request`` carries ``key`` (bearer token, ``X-API-Key`` or basic auth's password)."""
    given = request.headers.get("x-api-key") or ""
    auth = request.headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        given = auth[7:].strip()
    elif auth.lower().startswith("basic "):
        try:
            given = base64.b64decode(auth[6:].strip(), validate=True).decode("utf-8", "replace").partition(":")[2]
        except (binascii.Error, ValueError):
            given = ""
    return hmac.compare_digest(given.encode(), key.encode())


def _job_json(server: Server, job: ServerJob) -> dict[str, Any]:
    """sd-server's job shape (``id``, ``kind``, ``status``, ``created``... ``result``,
    ``error``) with sdplan's ``device_group`` and ``predicted_seconds``."""
    status = {"running": "generating", "done": "completed"}.get(job.state, job.state)
    result = None
    if job.state == "done":
        result = {"output_format": job.parsed.output_format,
                  "images": [{"index": i, "b64_json": b64(d)} for i, d in enumerate(job.images)]}
    error = {"code": job.error[0], "message": job.error[1]} if job.error else None
    return {"id": job.id, "kind": job.kind, "status": status, "created": int(job.created),
            "started": int(job.started) if job.started else None,
            "completed": int(job.finished) if job.finished else None,
            "queue_position": server.queue.position(job), "result": result, "error": error,
            "device_group": job.group, "predicted_seconds": server.queue.predicted(job),
            "age_seconds": time.time() - job.created}
