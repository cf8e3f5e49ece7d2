"""``sdplan rpc-server``: serve one local device to other machines over ggml RPC.

ggml RPC has no authentication or encryption: anyone who reaches the port can allocate
memory, read and write buffers and run graphs on the device. So the server binds loopback
only unless ``--allow-remote`` is given.

The blocking ggml server call runs in a daemon thread with the GIL released; the main
thread waits for SIGINT/SIGTERM (or the server thread failing) and then ends the process
with ``os._exit``, since ggml's accept loop has no way to be stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
from typing import Any

from sdplan.core.errors import SdplanError
from sdplan.core.runtime.native import native

DEFAULT_PORT = 50052


def add_parser(subparsers: Any) -> None:
    """Register the ``rpc-server`` subcommand."""
    p = subparsers.add_parser(
        "rpc-server",
        help="serve a local device to other sdplan/stable-diffusion.cpp processes over ggml RPC",
        description="Start a ggml RPC server exposing one local device. ggml RPC has no "
        "authentication: bind loopback only, unless --allow-remote on a trusted network.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"TCP port (default {DEFAULT_PORT})")
    p.add_argument("--device", default="CPU", help="local ggml device to serve (default CPU)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads of the served backend (default: all cores)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow binding a non-loopback address (unauthenticated access!)")
    p.set_defaults(run=run)


def _resolve_device(name: str) -> str:
    """The local ggml device named ``name`` (case-insensitive); raises ValueError listing
    the available names otherwise."""
    names = native().device_names()
    for n in names:
        if n.lower() == name.strip().lower():
            return str(n)
    raise ValueError(f"no local device named {name!r}; available: {', '.join(names)}")


def _fail(msg: str) -> int:
    print(f"sdplan rpc-server: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Start the server and block until SIGINT/SIGTERM (exit 0) or a server failure
    (exit 1); exit 2 on bad arguments or a ggml without RPC."""
    from sdplan.core.runtime import devices

    if not 0 < args.port < 65536:
        return _fail(f"--port {args.port} is not in 1-65535")
    if args.threads is not None and args.threads < 1:
        return _fail(f"--threads {args.threads} must be at least 1")
    if not devices.is_loopback_host(args.host) and not args.allow_remote:
        return _fail(
            f"refusing to bind non-loopback address {args.host!r}: ggml RPC has no "
            "authentication, so anyone who can reach the port can read and write the "
            "device's memory and run work on it. Pass --allow-remote to do it anyway on a "
            "trusted network."
        )
    if ":" in args.host.strip("[]"):
        return _fail(f"--host {args.host}: ggml's RPC server listens on IPv4 only; use "
                     "127.0.0.1 (or an IPv4 address with --allow-remote)")
    try:
        devices.require_rpc()
        device = _resolve_device(args.device)
    except (SdplanError, ValueError) as exc:
        return _fail(str(exc))
    # ggml's server parses numeric addresses only: give it the address a name stands for.
    try:
        addr = str(socket.getaddrinfo(args.host, args.port, type=socket.SOCK_STREAM)[0][4][0])
    except OSError as exc:
        return _fail(f"cannot resolve host {args.host!r}: {exc.strerror or exc}")
    host = f"[{addr}]" if ":" in addr else addr
    endpoint = f"{host}:{args.port}"
    threads = args.threads or os.cpu_count() or 1
    stop = threading.Event()
    failed = threading.Event()

    def serve() -> None:
        try:
            native().rpc_start_server(endpoint, [device], threads)
        except Exception as exc:  # reported by the main thread
            print(f"sdplan rpc-server: {exc}", file=sys.stderr)
        failed.set()
        stop.set()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    protocol, max_name = devices.local_rpc_speaks()
    print(f"sdplan rpc-server: serving device {device} at {endpoint} "
          f"({threads} threads; ggml RPC {'.'.join(map(str, protocol))}, tensor names of "
          f"{max_name} bytes); Ctrl+C stops", flush=True)
    if args.allow_remote and not devices.is_loopback_host(args.host):
        print("sdplan rpc-server: WARNING: reachable from the network without "
              "authentication", file=sys.stderr, flush=True)
    threading.Thread(target=serve, name="ggml-rpc-server", daemon=True).start()
    while not stop.wait(0.2):
        pass
    code = 1 if failed.is_set() else 0
    if failed.is_set():
        print(f"sdplan rpc-server: the server at {endpoint} stopped "
              "(is the port already in use?)", file=sys.stderr, flush=True)
    else:
        print("sdplan rpc-server: stopped", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    _flush_c_stdio()
    os._exit(code)


def _flush_c_stdio() -> None:
    """Flush C stdio, where ggml's server prints its banner (lost on ``os._exit``
    otherwise when stdout is a file or pipe)."""
    import ctypes
    import ctypes.util

    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        libc.fflush(None)
