"""``sdplan plan``: resolve sd-cli placement flags for a device inventory and show the plan.

With ``--json`` the output is issue 3's contract: the plan's :meth:`Plan.to_json` (plus
``"fit"`` when a profile and the estimator are available), or on an error exit code 2 and
``{"ok": false, "error": {"code", "message", "span"}}``. Otherwise readable tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from typing import Any

from sdplan.core.commands.options import add_source_arguments, load_inventory, profile_from_args
from sdplan.core.errors import PlanError, SdplanError
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB, MODEL_FLAGS, MODULES
from sdplan.core.planning.placement import add_placement_arguments, placement_from_namespace
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.plan_types import Plan
from sdplan.core.planning.profile import Profile

log = logging.getLogger(__name__)


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse reports anything else with the flag's name)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sdplan plan`` on the dispatcher's subparsers."""
    p = subparsers.add_parser(
        "plan", help="resolve a device placement and show where everything goes",
        description="Resolve --backend/--params-backend/--max-vram (as sd-cli spells them) "
                    "for the live devices or an inventory file, and show the plan.")
    add_source_arguments(p)
    g = p.add_argument_group("model files (as sd-cli spells them)")
    for key, flags in MODEL_FLAGS.items():
        g.add_argument(*reversed(flags), dest=key, action="append", metavar="PATH")
    add_placement_arguments(p)
    p.add_argument("-W", "--width", type=positive_int, default=512, help="image width (px) for the fit")
    p.add_argument("-H", "--height", type=positive_int, default=512, help="image height (px)")
    p.add_argument("-b", "--batch-count", type=positive_int, default=1, help="images per batch")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(run=run)
    return p


def _fit(plan: Plan, profile: Profile | None, inventory: Inventory,
         args: argparse.Namespace) -> Any:
    if profile is None:
        return None
    return estimate_plan(plan, profile, inventory, width=args.width, height=args.height,
                         batch=args.batch_count)


def run(args: argparse.Namespace) -> int:
    """Resolve and print; 0 on success, 2 on any sdplan error (JSON error with ``--json``)."""
    if (getattr(args, "model_profile", None) or "").strip().lower() == "list":
        return _list_builtin(args.json)
    try:
        placement = placement_from_namespace(args)
        inventory, extra = load_inventory(args.devices, placement.rpc_servers)
        files = {k: list(getattr(args, k)) for k in MODEL_FLAGS if getattr(args, k, None)}
        profile = profile_from_args(args, files)
        plan = resolve(placement, inventory, profile)
        if extra:
            plan = dataclasses.replace(plan, warnings=extra + plan.warnings)
        fit = _fit(plan, profile, inventory, args)
    except SdplanError as exc:
        err = exc.to_json()
        err.setdefault("span", None)
        if args.json:
            print(json.dumps({"ok": False, "error": err}, indent=1))
        else:
            print_error(exc)
        return 2
    if args.json:
        out = plan.to_json()
        if fit is not None:
            out["fit"] = fit.to_json()
        print(json.dumps(out, indent=1))
    else:
        print_tables(plan, inventory, fit)
    return 0


def _list_builtin(as_json: bool) -> int:
    """Print the built-in model profiles (a table, or JSON with ``--json``)."""
    from sdplan.core.planning.builtin_profiles import list_profiles

    infos = list_profiles()
    if as_json:
        print(json.dumps([{"name": i.name, "title": i.title, "architecture": i.architecture,
                           "quant": i.quant, "bytes": i.total_bytes,
                           "modules": i.module_bytes} for i in infos], indent=1))
        return 0
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="Built-in model profiles (--model-profile NAME)")
    for col in ("name", "model", "architecture", "diffusion GiB", "te GiB", "vae GiB",
                "total GiB"):
        # The name is what users copy: never wrap or cut it.
        table.add_column(col, justify="right" if "GiB" in col else "left",
                         no_wrap=col == "name", min_width=max(len(i.name) for i in infos)
                         if col == "name" else None)
    for i in infos:
        mb = i.module_bytes
        # titles hold brackets ("FLUX.1 [dev]") that rich would take for markup
        table.add_row(i.name, escape(i.title) + (" *" if i.note else ""), i.architecture,
                      *(f"{mb.get(m, 0) / GIB:.2f}" for m in ("diffusion", "te", "vae")),
                      f"{i.total_bytes / GIB:.2f}")
    console = stdout_console()
    console.print(table)
    for i in infos:
        if i.note:
            console.print(f"* {i.name}: {i.note}", highlight=False, markup=False)
    return 0


def print_error(exc: SdplanError) -> None:
    """Print an sdplan error on stderr (code, message, and the flag text with a caret under
    the span for a PlanError)."""
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=True)
    console.print(f"[bold red]error[/] {escape(f'[{exc.code}]')}: {escape(str(exc))}")
    if isinstance(exc, PlanError) and exc.text is not None and exc.span is not None:
        start, end = exc.span
        console.print(f"  {exc.flag} {escape(exc.text)}", highlight=False)
        pad = " " * (len(exc.flag or "") + 3 + start)
        console.print(pad + "^" * max(end - start, 1), style="red", highlight=False)


def stdout_console() -> Any:
    """A rich console on stdout; when stdout is not a terminal (a pipe, a file), 200 columns
    wide instead of rich's 80, so table cells (model names, ranges) are not cut. Tables
    still take only the width their content needs."""
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)


def print_tables(plan: Plan, inventory: Inventory, fit: Any) -> None:
    """Print the plan on stdout: modules, devices with budgets, warnings, the fit estimate
    (when given) and the canonical flags."""
    from rich.markup import escape
    from rich.table import Table

    console = stdout_console()
    mods = Table(title="Modules")
    for col in ("module", "runs on", "weights", "block ranges"):
        mods.add_column(col)
    for m in MODULES:
        mp = plan.modules[m]
        weights = {"runtime": "follow runtime", "disk": "disk"}.get(mp.params.mode,
                                                                    str(mp.params.device))
        ranges = ", ".join(f"{r.device}: {r.first_block}-{r.last_block} "
                           f"({r.bytes / GIB:.2f} GiB)" for r in mp.ranges)
        mods.add_row(m, " & ".join(mp.devices), escape(weights), escape(ranges))
    console.print(mods)
    devs = Table(title="Devices")
    for col in ("device", "type", "description", "free GiB", "total GiB", "budget GiB"):
        devs.add_column(col, justify="right" if "GiB" in col else "left")
    for d in inventory:
        b = plan.budgets[d.name]
        devs.add_row(escape(d.name), d.type, escape(d.description), f"{d.free / GIB:.2f}",
                     f"{d.total / GIB:.2f}", f"{b / GIB:.2f}" if b else "-")
    console.print(devs)
    for w in plan.warnings:
        console.print(f"[yellow]warning[/] {escape(f'[{w.code}]')}: {escape(w.message)}",
                      highlight=False)
    if fit is not None:
        _print_fit(console, fit)
    console.print("Canonical flags:", style="bold")
    for flag, value in (("--backend", plan.backend), ("--params-backend", plan.params_backend),
                        ("--max-vram", plan.max_vram)):
        if value:
            console.print(f"  {flag} {value}", highlight=False, markup=False)
    sys.stdout.flush()


def _print_fit(console: Any, fit: Any) -> None:
    """The estimator's own rich rendering when it has one, else a table of its JSON form's
    per-device figures (bytes shown in GiB) and its verdict."""
    from rich.markup import escape
    from rich.table import Table

    if hasattr(fit, "__rich__") or hasattr(fit, "__rich_console__"):
        console.print(fit)
        return
    data = fit.to_json()
    rows = data.get("devices") or {}
    cols: list[str] = []
    for v in rows.values():
        cols += [k for k in (v if isinstance(v, dict) else {}) if k not in cols]
    table = Table(title="Memory estimate (GiB)")
    table.add_column("device")
    for c in cols:
        table.add_column(c, justify="right")
    for name, v in rows.items():
        table.add_row(escape(name), *(f"{v.get(c, 0) / GIB:.2f}" if isinstance(v.get(c), int)
                                      else str(v.get(c, "")) for c in cols))
    console.print(table)
    for module, m in (data.get("modules") or {}).items():
        segs = m.get("segments") if isinstance(m, dict) else None
        if segs:
            console.print(f"{module}: {len(segs)} segments under the --max-vram budget of "
                          f"{m['devices'][0]} (largest {max(segs) / GIB:.2f} GiB)",
                          highlight=False, markup=False)
    verdict = "[green]fits[/]" if data.get("fits") else "[red]does not fit[/]"
    console.print(f"Estimate: {verdict}")
    for reason in data.get("reasons") or []:
        console.print(f"  {escape(str(reason))}", highlight=False)
