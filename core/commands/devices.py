"""``sdplan devices``: the live device inventory as a table or as JSON.

The table shows name, type, registry, description and free/total memory in GiB, then each
device's measured speed (products in GFLOP/s, memory in GB/s, attention in ns per score:
:func:`profile_line`, :func:`attention_lines`) and each measured drive, then one
line on the loaded ggml (version, RPC, llamafile, CPU features) and any warnings. ``--json``
prints the inventory-file format of :mod:`sdplan.core.planning.inventory` (bytes) plus a
``features`` object (see :func:`sdplan.core.runtime.devices.features`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any

from sdplan.core.commands.messages import print_error
from sdplan.core.errors import SdplanError
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB


def add_parser(subparsers: Any) -> None:
    """Register the ``devices`` subcommand."""
    p = subparsers.add_parser(
        "devices",
        help="list the ggml devices of this machine (and of RPC servers)",
        description="List the ggml devices sdplan can place modules on, with free and total "
        "memory, and what the loaded ggml supports.",
    )
    p.add_argument("--rpc-servers", action="append", default=[], metavar="HOST:PORT[,...]",
                   help="add the devices of these ggml RPC servers (RPC0, RPC1, ...)")
    p.add_argument("--json", action="store_true",
                   help="print JSON (memory in bytes) instead of a table")
    p.add_argument("--calibrate", action="store_true",
                   help="measure each device's speed (products, copies; a few seconds each) and "
                        "keep it for time predictions")
    p.add_argument("--drive", action="append", default=[], metavar="FOLDER",
                   help="with --calibrate: also measure the drive holding FOLDER (where model "
                        "files are; repeatable)")
    p.add_argument("-t", "--threads", type=int, default=0, metavar="N",
                   help="CPU threads for --calibrate (default: as generate chooses them)")
    p.set_defaults(run=run)


def _avx512_line(wino: str | None = None) -> str:
    """What runs in bf16 with AVX512_BF16 alone: the UNets and CLIP always (their 3x3
    convolutions from 32 pixels wide in f32 by the Winograd convolution when ``wino``, its
    build, is avx512: conv_2d's rule), the DiTs and their text encoders where the kernel
    measured fast here (sdplan.core.runtime.bf16_rule)."""
    from sdplan.core.runtime.bf16_rule import avx512_bf16_speedup
    from sdplan.core.runtime.native import cpu_kernels

    s = avx512_bf16_speedup()
    fast = cpu_kernels().avx512_fast(lambda: s)
    rest = "DiTs and their text encoders too" if fast else "DiTs and their text encoders in f16"
    convs = " (3x3 convolutions from 32 px wide: f32 Winograd)" if wino == "avx512" else ""
    return (f"avx512 (UNets and CLIP in bf16{convs}, {rest}: bf16 products measured {s:.1f}x the f16 ones "
            "here; f16 weights rounded as used; VAEs f16)")


def _feature_line(feat: dict[str, Any]) -> str:
    yes_no = {True: "[green]yes[/]", False: "[red]no[/]"}
    cpu = " ".join(k for k, v in feat["cpu_features"].items() if v not in ("", "0")
                   and k != "LLAMAFILE")
    bf16 = feat.get("bf16_kernel", "off")
    f16 = "sdplan's FMA products" if feat.get("fma_gemm") else "ggml's products"
    kernel = _avx512_line(feat.get("wino_kernel")) if bf16 == "avx512" else {
        "off": f"off (f16 weights, {f16})", "amx": "amx (UNets, DiTs, VAEs, text encoders, upscalers in bf16)"}.get(bf16, bf16)
    # with the bf16 kernel off its parenthesis already names the products
    fma = f" · sdplan FMA products {yes_no[bool(feat['fma_gemm'])]}" if "fma_gemm" in feat and bf16 != "off" else ""
    wino = f" · sdplan Winograd {feat['wino_kernel']}" if "wino_kernel" in feat else ""
    return (f"ggml {feat['ggml_version']} · RPC {yes_no[feat['rpc']]} · "
            f"llamafile {yes_no[feat['llamafile']]} · CPU {cpu or '-'} · sdplan bf16 kernel {kernel}{fma}{wino}")


def render_table(inv: Inventory, feat: dict[str, Any],
                 servers: list[dict[str, Any]] | None = None) -> None:
    """Print ``inv`` as a rich table followed by the feature line and warnings."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="ggml devices", title_justify="left")
    table.add_column("Name", style="bold cyan", no_wrap=True)
    table.add_column("Type")
    table.add_column("Registry")
    table.add_column("Description")
    table.add_column("Free GiB", justify="right")
    table.add_column("Total GiB", justify="right")
    for d in inv:
        table.add_row(d.name, d.type, d.registry, d.description,
                      f"{d.free / GIB:.1f}", f"{d.total / GIB:.1f}")
    console.print(table)
    for d in inv:
        console.print(f"{d.name} speed: {profile_line(d)}", highlight=False, markup=False)
        for line in attention_lines(d):
            console.print(f"{d.name} attention {line}", highlight=False, markup=False, soft_wrap=True)
    for dr in inv.drives:
        console.print(f"drive of {dr.path}: read {dr.read_bps / 1e9:.2f} GB/s, cached "
                      f"{dr.cached_bps / 1e9:.2f} GB/s, mapped {dr.map_bps / 1e9:.2f} GB/s",
                      highlight=False, markup=False)
    console.print(_feature_line(feat), highlight=False)
    for srv in servers or []:
        console.print(f"RPC server {srv['endpoint']}: {srv['speaks']}", highlight=False,
                      markup=False)
    th = feat.get("cpu_threads")
    if th:
        console.print(f"CPU threads: {th['default']} ({th['reason']}; generate uses fewer "
                      "while other programs keep cores busy)", highlight=False, soft_wrap=True)
    for w in feat["warnings"]:
        console.print(f"[yellow]warning:[/] {w}", highlight=False, soft_wrap=True)


def run(args: argparse.Namespace) -> int:
    """List the devices; exit code 2 with a one-line message on an sdplan error."""
    from sdplan.core.runtime import devices, profile_cache

    try:
        if getattr(args, "threads", 0) < 0:
            raise SdplanError(f"-t/--threads must be >= 0, got {args.threads}")
        args.threads = _capped_threads(int(getattr(args, "threads", 0) or 0))
        if getattr(args, "drive", None) and not getattr(args, "calibrate", False):
            raise SdplanError(f"--drive {args.drive[0]!r}: a drive is measured with --calibrate; add it")
        for folder in getattr(args, "drive", None) or []:
            if not os.path.isdir(folder):
                raise SdplanError(f"--drive {folder!r}: not a folder")
        endpoints = devices.split_endpoints(args.rpc_servers)
        inv = devices.live_inventory(endpoints)
        feat = devices.features()
        servers = _servers(endpoints)
        threads = getattr(args, "threads", 0) or feat.get("cpu_threads", {}).get("default", 0)
        if getattr(args, "calibrate", False):
            inv = _calibrate(inv, int(threads), args.drive, quiet=args.json)
        else:
            inv = profile_cache.with_cached_profiles(inv, int(threads))
    except SdplanError as exc:
        print_error(exc)
        return 2
    if args.json:
        data = inv.to_json()
        data["features"] = feat
        data["rpc_servers"] = servers
        print(json.dumps(data, indent=2))
    else:
        render_table(inv, feat, servers)
    return 0


def _capped_threads(requested: int) -> int:
    """``-t`` capped at the CPUs this process may use (its affinity mask), as generate caps it
    (:mod:`sdplan.core.runtime.threads`: ggml's threads busy-wait, so a calibration with more
    threads than cores measures threads stalling each other, and takes minutes); a note on
    stderr says so. 0 (the default count) is returned as is."""
    import sys

    from sdplan.core.runtime.threads import usable_cpus

    cpus = len(usable_cpus())
    if requested <= cpus:
        return requested
    print(f"note: -t {requested} is capped at the {cpus} CPUs this process may use (ggml's threads busy-wait, "
          "so more threads than cores stall each other)", file=sys.stderr)
    return cpus


def _calibrate(inv: Inventory, threads: int, drives: list[str], quiet: bool) -> Inventory:
    """Measure every device of ``inv`` and the ``drives`` (progress on stderr unless
    ``quiet``); the measured inventory."""
    import sys

    from sdplan.core.runtime import calibrate
    from sdplan.core.runtime.devices import BackendManager

    def say(text: str) -> None:
        if not quiet:
            print(f"calibrating {text}", file=sys.stderr, flush=True)

    with BackendManager(cpu_threads=threads or None) as manager:
        return calibrate.calibrate_inventory(manager, inv, threads, drives, say)


def profile_line(d: Any) -> str:
    """One line on a device's profile: f16 product rate at its largest size (and, where
    measured, with f16 weights in sdplan's bf16 kernel, ``mm/bf16_gemm:f16``), bf16 product
    rate (``mm:bf16``), memory and link bandwidth, or that it has none. Rates in GFLOP/s,
    bandwidths in GB/s (1e9 bytes per second)."""
    p = d.profile
    if p is None:
        return "no profile (sdplan devices --calibrate): time predictions use stated defaults"
    mm = p.rates.get("mm:f16") or next(iter(p.rates.values()))
    in_bf16 = p.rates.get("mm/bf16_gemm:f16")
    f16 = f"f16 products {mm[-1][1] / 1e9:.0f} GFLOP/s" + (
        f" ({in_bf16[-1][1] / 1e9:.0f} in sdplan's bf16 kernel)" if in_bf16 else "")
    bf16 = p.rates.get("mm:bf16")
    bf16_text = f", bf16 products {bf16[-1][1] / 1e9:.0f} GFLOP/s" if bf16 else ""
    link = (f" · to device {p.h2d.bps / 1e9:.2f} GB/s, back {p.d2h.bps / 1e9:.2f} GB/s "
            f"({p.d2h.latency_s * 1e3:.2f} ms)" if d.type != "cpu" else "")
    threads = f" with {p.threads} threads" if p.threads else ""
    return (f"{f16}{bf16_text}, memory {p.mem_bps / 1e9:.1f} GB/s{link} "
            f"(measured {p.measured}{threads})")


_ATTENTION_KEY = re.compile(r"^attn/(?P<kernel>[^@/:]+)@d(?P<width>[0-9]+)(?:k(?P<keys>[0-9]+))?:(?P<dtype>[^:]+)$")


def _ns(value: float) -> str:
    """``value`` (nanoseconds) as people read it: whole from 10, one decimal from 1, else two
    significant digits."""
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def attention_lines(d: Any) -> list[str]:
    """Lines on a device's measured attention, one per attention kernel (and key dtype where a
    kernel has several): nanoseconds per score (one query-key pair) at each head width measured,
    self-attention first, then each cross-attention key count (``over 77 keys``), e.g.
    ``by FLASH_ATTN_EXT: width 8 2.5 ns/score, 12 58, 40 3.1, 64 5.5; over 77 keys: width 8 4.4,
    40 7.6, 64 11``. From the profile's tagged kernel points (``attn/FLASH_ATTN_EXT@d40k77:f16``,
    :mod:`sdplan.core.planning.device_profile`), each at its largest size measured (as the
    product rate of :func:`profile_line`); a score costs ``4 * width`` FLOP (score and value
    products, 2 FLOP per multiply-add each: :func:`sdplan.core.runtime.work_count.classify`
    with equal key and value widths), so ns/score = ``4 * width / rate * 1e9``. Empty for no
    profile or one without tagged attention kernels."""
    p = d.profile
    if p is None:
        return []
    groups: dict[tuple[str, str], dict[int, dict[int, float]]] = {}
    for key, pts in p.rates.items():
        m = _ATTENTION_KEY.match(key)
        if m is None or not pts:
            continue
        width = int(m["width"])
        widths = groups.setdefault((m["kernel"], m["dtype"]), {}).setdefault(int(m["keys"] or 0), {})
        widths[width] = 4.0 * width / pts[-1][1] * 1e9
    kernels = [k for k, _ in groups]
    lines = []
    for (kernel, dtype), by_keys in sorted(groups.items()):
        label = kernel if kernels.count(kernel) == 1 else f"{kernel} ({dtype})"
        parts: list[str] = []
        for keys in sorted(by_keys):
            text = ", ".join(f"{w} {_ns(ns)}" + (" ns/score" if i == 0 and not parts else "")
                             for i, (w, ns) in enumerate(sorted(by_keys[keys].items())))
            parts.append(f"over {keys} keys: width {text}" if keys else f"width {text}")
        lines.append(f"by {label}: " + "; ".join(parts))
    return lines


def _servers(endpoints: list[str]) -> list[dict[str, Any]]:
    """What each RPC server speaks (protocol, tensor-name length), asked over the wire."""
    from sdplan.core.runtime.rpc_wire import probe_server

    out = []
    for ep in endpoints:
        info = probe_server(ep)
        out.append({"endpoint": ep, "protocol": list(info.protocol),
                    "max_name": info.max_name, "speaks": info.describe()})
    return out
