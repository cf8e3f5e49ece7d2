"""``sdplan library FOLDER...``: every model file in the folders with its kind, family,
size, quantisation and, for each diffusion model, whether it fits on the devices.

Headers are read once and cached (:mod:`sdplan.core.modelfiles.library`); the fit verdict
(:mod:`sdplan.core.modelfiles.library_fit`) is the planner's answer for the model with
its text encoders and VAE found in the same folders, at the family's native size unless
``-W``/``-H`` are given. ``sdplan plan`` with the ``files`` and flags a verdict lists
gives the same fit. A verdict that fits says how long a picture takes on its plan at that
size with the family's default steps (the devices' profiles measured here by ``sdplan
devices --calibrate`` or the inventory file's, else stated defaults: marked ``*``).
``--json`` prints::

    {"folders": [...], "missing_folders": [...], "headers_read": int, "cached": int,
     "devices": [device JSON...],
     "files": [{"path", "name", "kind", "family", "variant", "architecture", "group",
                "quant", "size", "weight_bytes", "modules", "encoders",
                "latent_channels", "error", "fit": {verdict JSON} | null}, ...]}

where a verdict's ``"time"`` is ``{"step_s", "image_s", "load_s", "steps", "sampler", "cfg",
"measured"}`` (seconds; ``measured`` false: default speeds) or null when it does not fit.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from sdplan.core.commands.options import load_inventory
from sdplan.core.commands.plan import positive_int, stdout_console
from sdplan.core.errors import SdplanError
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.placement import add_placement_arguments, placement_from_namespace

if TYPE_CHECKING:  # the library's readers load when the command runs, not with the parser
    from sdplan.core.modelfiles.library import LibraryEntry
    from sdplan.core.modelfiles.library_fit import FitVerdict


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sdplan library`` on the dispatcher's subparsers."""
    p = subparsers.add_parser(
        "library", help="list the model files in folders and whether each model fits",
        description="List every checkpoint, diffusion model, text encoder, VAE, LoRA and "
                    "upscaler in the folders (headers only, cached by size and modification "
                    "time) with, for each diffusion model, whether it fits on the devices: "
                    "resident, with a split, with offload, or not at all.")
    p.add_argument("folders", nargs="+", metavar="FOLDER", help="folders to list (recursively)")
    p.add_argument("--devices", metavar="FILE", help="plan for the devices in this inventory "
                   "JSON file instead of the live ones")
    p.add_argument("-W", "--width", type=positive_int, help="image width (px) for the fit "
                   "(default: the family's native size)")
    p.add_argument("-H", "--height", type=positive_int, help="image height (px) for the fit")
    p.add_argument("-b", "--batch-count", type=positive_int, default=1, help="images per batch")
    p.add_argument("--cache", metavar="FILE", help="the header cache file (default: "
                   "library-v1.json in the user's cache folder)")
    p.add_argument("--json", action="store_true", help="print the library as JSON")
    add_placement_arguments(p)
    p.set_defaults(run=run)
    return p


def entry_json(e: LibraryEntry, fit: FitVerdict | None) -> dict[str, object]:
    """One file of the ``--json`` output (the entry without its profile, and its fit)."""
    d = e.to_json()
    d.pop("profile", None)
    d.pop("mtime_ns", None)
    return {"name": e.name, **d, "architecture": e.architecture, "group": e.group,
            "fit": fit.to_json() if fit is not None else None}


def run(args: argparse.Namespace) -> int:
    """Scan, judge and print; 0 on success, 2 when no folder exists or the placement or
    inventory is wrong (one line on stderr)."""
    from sdplan.core.commands.time_estimate import with_profiles
    from sdplan.core.modelfiles.library import DIFFUSION_KINDS, LibraryCache, scan_library
    from sdplan.core.modelfiles.library_fit import fit_verdict

    placement = placement_from_namespace(args)
    inventory, warnings = load_inventory(args.devices, placement.rpc_servers)
    result = scan_library(args.folders, LibraryCache(args.cache) if args.cache else None)
    if len(result.missing_folders) == len(args.folders):
        raise SdplanError(f"no such folder: {', '.join(result.missing_folders)}")
    fits: dict[str, FitVerdict] = {}
    timed = with_profiles(inventory)  # the profiles only price the time: memory is the same
    for e in result.entries:
        if e.kind in DIFFUSION_KINDS and e.error is None and e.profile:
            fits[e.path] = fit_verdict(e, result.entries, timed, placement,
                                       width=args.width, height=args.height,
                                       batch=args.batch_count)
    if args.json:
        print(json.dumps({
            "folders": list(args.folders), "missing_folders": result.missing_folders,
            "headers_read": result.headers_read, "cached": result.cached,
            "devices": [d.to_json() for d in inventory],
            "warnings": [w.message for w in warnings],
            "files": [entry_json(e, fits.get(e.path)) for e in result.entries]}, indent=1))
        return 0
    _print_table(result.entries, fits, result.headers_read, result.cached)
    for folder in result.missing_folders:
        print(f"sdplan library: no such folder: {folder}", file=sys.stderr)
    for w in warnings:
        print(f"warning: {w.message}", file=sys.stderr)
    return 0


def _print_table(entries: list[LibraryEntry], fits: dict[str, FitVerdict], read: int,
                 cached: int) -> None:
    from rich.markup import escape
    from rich.table import Table
    from sdplan.core.modelfiles.library import KIND_TITLES, grouped

    console = stdout_console()
    groups = grouped(entries)
    colour = {"resident": "green", "split": "cyan", "offload": "yellow", "none": "red"}
    for group, items in groups.items():
        table = Table(title=escape(group), title_justify="left")
        for col in ("file", "kind", "GiB", "quant", "fit", "time", "flags"):
            table.add_column(col, justify="right" if col in ("GiB", "time") else "left",
                             no_wrap=col == "file")
        for e in items:
            fit = fits.get(e.path)
            kind = KIND_TITLES.get(e.kind, e.kind)
            if e.encoders and e.kind == "encoder":
                kind += f" ({', '.join(e.encoders)})"
            if e.latent_channels and e.kind == "vae":
                kind += f" ({e.latent_channels} ch)"
            if e.variant:
                kind += f" {e.variant}"
            error = e.error or ""
            verdict = (f"[{colour[fit.verdict]}]{fit.title}[/]" if fit else
                       escape(error if len(error) < 60 else error[:57] + "..."))
            flags = " ".join(fit.flags()) if fit else ""
            if fit and fit.missing:
                flags += f" (without {', '.join(fit.missing)})"
            table.add_row(escape(e.name), escape(kind), f"{e.size / GIB:.2f}",
                          e.quant or "", verdict, escape(fit.time_text()) if fit else "", escape(flags))
        console.print(table)
    times = [f.time for f in fits.values() if f.time]
    if times:
        console.print("time: predicted seconds per picture at the fit's size with each family's "
                      "default steps and sampler"
                      + ("; * default speeds (sdplan devices --calibrate measures them)"
                         if any(not x["measured"] for x in times) else ""), highlight=False, markup=False)
    console.print(f"{len(entries)} files: {read} headers read, {cached} from the cache",
                  highlight=False)
