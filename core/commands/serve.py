"""``sdplan serve``: sdplan's engine behind the HTTP APIs image clients already speak.

The model and placement flags are ``generate``'s (``-m``, ``--demo``, ``--diffusion-model``,
``--clip_l``... and ``--backend``, ``--params-backend``, ``--max-vram``, ``--rpc-servers``...);
``-W -H --steps --cfg-scale --sampling-method --scheduler -t`` set the defaults of requests
that leave them open. The server listens on 127.0.0.1 (``--host`` another address only with
``--allow-remote``), with an optional ``--api-key`` (or ``SDPLAN_API_KEY``), and serves
A1111's ``/sdapi/v1/txt2img`` and ``img2img``, OpenAI's ``/v1/images/generations`` and
``edits``, sd-server's ``/sdcpp/v1`` jobs and capabilities, and ``/metrics``
(:mod:`sdplan.core.server.http`). The planned modules stay loaded between requests; a
request naming another model of the ``--models-dir`` library swaps it in, the previous one
released first. ``--device-group`` (repeated) runs one engine per group with the plan
replicated, two requests at once on two groups (:mod:`sdplan.core.server.groups`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from sdplan.core.errors import InvalidArgument, SdplanError
from sdplan.core.planning.placement import add_placement_arguments, placement_from_namespace

#: Model-file flags -> request keys (``generate``'s).
FILE_FLAGS = {"model": "model", "diffusion_model": "diffusion_model", "t5xxl": "t5xxl", "clip_l": "clip_l",
              "clip_g": "clip_g", "llm": "llm", "vae": "vae", "taesd": "taesd", "upscale_model": "upscale_model"}
#: Request defaults the flags may set -> their request keys.
DEFAULT_FLAGS = ("width", "height", "steps", "cfg_scale", "sampling_method", "scheduler", "threads",
                 "lora_model_dir")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sdplan serve`` on the dispatcher's subparsers."""
    p = subparsers.add_parser(
        "serve", help="serve the plan over HTTP: A1111, OpenAI and sd-server's APIs, /metrics",
        description="Keep the planned model loaded on sdplan's engine and serve A1111's, OpenAI's "
                    "and sd-server's image APIs (loopback only unless --allow-remote).",
        allow_abbrev=False)
    p.add_argument("-m", "--model", metavar="PATH", help="single-file checkpoint")
    p.add_argument("--demo", action="store_true", help="serve the packaged demo model")
    p.add_argument("--diffusion-model", metavar="PATH", help="diffusion model (Flux, Chroma, Z-Image, FLUX.2, SDXL UNet)")
    p.add_argument("--t5xxl", metavar="PATH", help="T5-XXL text encoder")
    p.add_argument("--clip_l", metavar="PATH", help="CLIP-L text encoder")
    p.add_argument("--clip_g", metavar="PATH", help="OpenCLIP bigG text encoder")
    p.add_argument("--llm", metavar="PATH", help="language-model text encoder (Qwen3)")
    p.add_argument("--vae", metavar="PATH", help="VAE / autoencoder file")
    p.add_argument("--taesd", metavar="PATH", help="TAE for previews")
    p.add_argument("--upscale-model", metavar="PATH", help="ESRGAN upscaler applied after decoding")
    p.add_argument("-W", "--width", type=int, help="default image width (px; default: the family's)")
    p.add_argument("-H", "--height", type=int, help="default image height (px)")
    p.add_argument("--steps", type=int, help="default sampling steps")
    p.add_argument("--cfg-scale", type=float, help="default CFG scale")
    p.add_argument("--sampling-method", help="default sampler")
    p.add_argument("--scheduler", help="default sigma schedule")
    p.add_argument("--lora-model-dir", metavar="DIR", help="folder of the LoRAs prompts name")
    p.add_argument("-t", "--threads", type=int, help="CPU threads per engine (0: the engine's choice)")
    p.add_argument("--force", action="store_true", help="serve even when a plan does not fit")
    srv = p.add_argument_group("server")
    srv.add_argument("--host", "--listen-ip", dest="host", default="127.0.0.1",
                     help="address to listen on (default 127.0.0.1; others need --allow-remote)")
    srv.add_argument("--port", "--listen-port", dest="port", type=int, default=7860, help="TCP port (default 7860)")
    srv.add_argument("--allow-remote", action="store_true", help="allow listening on a non-loopback address")
    srv.add_argument("--api-key", metavar="KEY", help="clients must send this key (default: $SDPLAN_API_KEY; none)")
    srv.add_argument("--models-dir", action="append", default=[], metavar="DIR",
                     help="a model library folder: requests may name its models (a model swap); repeatable")
    srv.add_argument("--device-group", action="append", default=[], metavar="SPEC",
                     help="one engine per group, the plan replicated: local, local:NAME=VALUE "
                          "(CUDA_VISIBLE_DEVICES=1) or rpc:HOST:PORT[,HOST:PORT]; repeatable")
    srv.add_argument("--queue-file", metavar="FILE",
                     help="record the queue in this file (the app's format); the app's queue view shows "
                          "the jobs of sdplan-server-queue.json beside its own queue file")
    srv.add_argument("--max-body-mb", type=float, default=32.0, help="largest request body, MiB (default 32)")
    srv.add_argument("--max-pixels", type=int, default=2048 * 2048, help="largest width x height (default 2048x2048)")
    srv.add_argument("--max-batch", type=int, default=8, help="most images per request (default 8)")
    srv.add_argument("--max-steps", type=int, default=150, help="most steps per request (default 150)")
    srv.add_argument("--max-queue", type=int, default=64, help="most jobs queued or running (default 64)")
    add_placement_arguments(p)
    p.set_defaults(run=run)
    return p


def served_model(args: argparse.Namespace) -> Any:
    """The model the flags name, with the request defaults they set
    (:class:`~sdplan.core.server.models.ServedModel`).

    Raises:
        InvalidArgument: no model, or ``--demo`` with ``-m``/``--diffusion-model``.
        ModelFileError: unreadable model files.
    """
    from sdplan.core.server.models import ServedModel

    defaults: dict[str, Any] = {}
    if args.demo:
        from sdplan.core.pipelines.demo.model import (
            DEMO_DEFAULTS,
            DEMO_SAMPLER,
            demo_lora_dir,
            demo_model_path,
        )

        if args.model or args.diffusion_model:
            raise InvalidArgument("--demo replaces -m/--diffusion-model: give one or the other")
        args.model = str(demo_model_path())
        defaults = {**DEMO_DEFAULTS, "sampling_method": DEMO_SAMPLER, "lora_model_dir": str(demo_lora_dir())}
    files = {key: [str(getattr(args, attr))] for attr, key in FILE_FLAGS.items() if getattr(args, attr, None)}
    if "model" not in files and "diffusion_model" not in files:
        raise InvalidArgument("serve needs -m MODEL, --diffusion-model PATH or --demo")
    for key in DEFAULT_FLAGS:
        if getattr(args, key, None) is not None:
            defaults[key] = getattr(args, key)
    main = (files.get("model") or files["diffusion_model"])[0]
    model = ServedModel(os.path.splitext(os.path.basename(main))[0], files, defaults)
    model.headers()  # unreadable files: a one-line error now
    return model


def limits_of(args: argparse.Namespace) -> Any:
    """The server's limits from the flags.

    Raises:
        InvalidArgument: a limit that is not positive.
    """
    from sdplan.core.server.limits import MIB, ServerLimits

    for name in ("max_body_mb", "max_pixels", "max_batch", "max_steps", "max_queue"):
        if getattr(args, name) <= 0:
            raise InvalidArgument(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    return ServerLimits(max_body_bytes=int(args.max_body_mb * MIB), max_pixels=args.max_pixels,
                        max_batch=args.max_batch, max_steps=args.max_steps, max_queue=args.max_queue)


def run(args: argparse.Namespace) -> int:
    """Start the server and serve until interrupted; 0 after a clean stop, 2 on an sdplan
    error before serving."""
    from sdplan.core.commands.messages import print_error
    from sdplan.core.server.groups import groups_of
    from sdplan.core.server.models import ModelCatalog
    from sdplan.core.server.service import Server, ServerConfig, check_bind

    try:
        check_bind(args.host, args.allow_remote)
        if not 0 < args.port < 65536:
            raise InvalidArgument(f"--port {args.port}: a TCP port is 1..65535")
        limits = limits_of(args)
        groups = groups_of(args.device_group)
        placement = placement_from_namespace(args)
        if len(groups) > 1 and placement.rpc_servers:
            raise InvalidArgument("--rpc-servers with several --device-group: give each group its RPC servers")
        model = served_model(args)
        catalog = ModelCatalog.scan(model, args.models_dir, limits)
        config = ServerConfig(args.host, args.port, args.api_key or os.environ.get("SDPLAN_API_KEY") or None,
                              args.allow_remote, limits, args.queue_file, args.force)
        server = Server(catalog, placement, groups, config)
        print(f"sdplan serve: planning {model.name} on {len(groups)} device group(s)...", file=sys.stderr, flush=True)
        server.start()
    except SdplanError as exc:
        print_error(exc)
        return 2
    try:
        for w in server.workers:
            m = w.metrics()
            print(f"  {w.group.name}: {m['plan']['command'] if m['plan'] else ''}".rstrip(), file=sys.stderr)
        return serve_http(server)
    finally:
        server.close()


def serve_http(server: Any) -> int:
    """Serve ``server``'s application with uvicorn until SIGINT/SIGTERM; returns 0."""
    import uvicorn
    from sdplan.core.server.http import create_app

    cfg = server.config
    print(f"sdplan serve: listening on http://{cfg.host}:{cfg.port} "
          f"({'API key required' if cfg.api_key else 'no API key'})", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(create_app(server), host=cfg.host, port=cfg.port, log_level="warning",
                                  lifespan="off", timeout_graceful_shutdown=5)).run()
    return 0
