"""``sdplan plan``: resolve sd-cli placement flags for a device inventory and show the plan.

With ``--json`` the output is issue 3's contract: the plan's :meth:`Plan.to_json` (plus
``"fit"`` when a profile and the estimator are available), or on an error exit code 2 and
``{"ok": false, "error": {"code", "message", "span"}}``. Otherwise readable tables.

``--command "sd-cli ..."`` plans a whole pasted sd-cli command (model files, placement,
image size and batch from its flags; :func:`sdplan.core.planning.sdcli.import_sdcli_command`);
its JSON adds ``"command"``: the written command, the arguments kept without being
understood (``kept``: sd-cli options sdplan does not use; ``unknown``: not sd-cli options),
the generation settings, the model files and the runtime flags the estimate of that sd-cli
run takes into account (flash attention, direct convolutions, ``--mmap``,
``--eager-load``: :class:`~sdplan.core.planning.estimate.RuntimeFlags`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shlex
import sys
from typing import Any

from sdplan.core.commands.messages import print_error
from sdplan.core.commands.options import (
    add_source_arguments,
    load_inventory,
    profile_from_args,
    target_from_args,
)
from sdplan.core.commands.time_estimate import add_time_arguments
from sdplan.core.commands.video_flags import video_frames
from sdplan.core.errors import PlanError, SdplanError
from sdplan.core.planning.autofit import RESERVES
from sdplan.core.planning.autofit_newest import TIERS, NewestAutoFit
from sdplan.core.planning.estimate import estimate_plan
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB, MODEL_FLAGS, PLACED_MODULES
from sdplan.core.planning.placement import add_placement_arguments, placement_from_namespace
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.plan_types import Plan, PlanWarning
from sdplan.core.planning.profile import Profile
from sdplan.core.planning.target import Target
from sdplan.core.planning.vae_tiling import vae_scale_factor

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
    p.add_argument("-r", "--ref-image", dest="ref_image", action="append", metavar="PATH", help="a reference "
                   "picture (sd-cli's -r): the fit counts what reads it (Qwen-Image Edit); not read")
    p.add_argument("--video-frames", type=positive_int, default=1,
                   help="a video's frames for the fit (Wan's -M vid_gen; default 1)")
    p.add_argument("--command", dest="sdcli_command", metavar="TEXT",
                   help="plan a whole pasted sd-cli command (its model files, placement, "
                        "size and batch); POSIX, cmd.exe and PowerShell quoting are read")
    p.add_argument("--engine", choices=("sdplan", "sd-cli"), default="sdplan",
                   help="whose memory to estimate: sdplan's own engine (default; with model "
                        "files its graphs are measured by a dry run) or the sd-cli command "
                        "the plan writes")
    p.add_argument("--diffusion-fa", action="store_true",
                   help="with --engine sd-cli: sd-cli runs the diffusion model with flash "
                        "attention (its --diffusion-fa)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_time_arguments(p)
    p.set_defaults(run=run)
    return p


def _from_command(args: argparse.Namespace) -> Any:
    """Take model files, placement and size from ``--command`` into ``args``; returns the
    :class:`~sdplan.core.planning.sdcli.ImportedCommand`.

    Raises:
        PlanError: ``conflicting_model_sources`` when placement or model flags are given as
            well; import errors of the command.
    """
    from sdplan.core.planning.sdcli import import_sdcli_command

    given = [f"--{k.replace('_', '-')}" for k in MODEL_FLAGS if getattr(args, k, None)]
    given += [f for f, k in (("--backend", "backend"), ("--params-backend", "params_backend"),
                             ("--max-vram", "max_vram"), ("--rpc-servers", "rpc_servers"),
                             ("--split-mode", "split_mode")) if getattr(args, k, None)]
    if given:
        raise PlanError("conflicting_model_sources", f"--command carries the whole sd-cli "
                        f"command; drop {', '.join(given)} or put them into it",
                        flag="--command")
    imp = import_sdcli_command(args.sdcli_command)
    imp.vae_tiling(imp.dialect, 8)  # malformed tiling values fail before any file is read
    for key, value in imp.model_files.items():
        setattr(args, key, [value] if isinstance(value, str) else list(value))
    args.placement_override = imp.placement
    gen = imp.generation
    for key in ("width", "height", "batch_count", "steps"):
        if isinstance(gen.get(key), int) and gen[key] >= 1:
            setattr(args, key, gen[key])
    for key, kind in (("cfg_scale", float), ("sampling_method", str)):  # for the time prediction
        if isinstance(gen.get(key), kind):
            setattr(args, key, gen[key])
    return imp


def _command_json(imp: Any, written: Any, scale: int) -> dict[str, object]:
    """The pasted command written for ``written``'s dialect: its kept arguments without the
    options that dialect lacks, tile sizes converted when the command's own dialect is known
    and differs (``scale``: the VAE's image pixels per latent pixel)."""
    from sdplan.core.planning.sdcli import (
        convert_kept_tiles,
        kept_for_dialect,
        sdcli_command_line,
    )

    kept, dropped = kept_for_dialect(imp.extra_args(), written.dialect)
    if imp.dialect is not None and imp.dialect != written.dialect:
        kept = convert_kept_tiles(kept, imp.dialect, written.dialect, scale)
    return {"written": sdcli_command_line(written.placement, imp.model_files, imp.generation,
                                          program=imp.program or "sd-cli", extra=kept,
                                          raw=imp.generation_text, dialect=written.dialect),
            "dialect": written.dialect, "source_dialect": imp.dialect, "notes": written.notes,
            "left_out": dropped, "kept": list(imp.kept), "unknown": list(imp.unknown),
            "generation": dict(imp.generation), "model_files": dict(imp.model_files),
            "module_files": imp.module_files(),
            "vae_tiling": imp.vae_tiling(imp.dialect or written.dialect, scale).to_json()}


def command_cfg(plan: Plan, imp: Any) -> Plan:
    """``plan`` with the pasted command's reasons for sd-cli's sequential CFG path applied to
    its parallel-CFG device (:func:`~sdplan.core.planning.split_policy.cfg_command_reasons`)."""
    from sdplan.core.planning.split_policy import cfg_command_reasons, with_reasons

    if plan.cfg is None:
        return plan
    reasons = cfg_command_reasons(imp.generation, {a.flag for a in imp.arguments},
                                  set(imp.model_files))
    cfg, found = with_reasons(plan.cfg, reasons)
    return dataclasses.replace(plan, cfg=cfg, warnings=[*plan.warnings, *found])


def tiling_warnings(imp: Any, plan_target: Target, scale: int) -> list[PlanWarning]:
    """Check the pasted command's VAE tiling values (spec section 14.7) and flag a
    ``--vae-tile-size`` whose units are unknown (warning ``vae_tile_size_units``: neither
    the command's syntax nor a named dialect says whether it is in image or latent pixels).

    Raises:
        PlanError: ``invalid_vae_tiling`` for a malformed value.
    """
    dialect = imp.dialect or (plan_target.dialect if plan_target.known else None)
    imp.vae_tiling(dialect, scale)
    sizes = [a.values[0] for a in imp.arguments if a.flag == "--vae-tile-size" and a.values]
    if dialect is not None or not sizes:
        return []
    return [PlanWarning("vae_tile_size_units", f"--vae-tile-size {sizes[-1]}: the newest "
                        "sd-cli reads image pixels, the snapshot latent pixels (x"
                        f"{scale} for this VAE); read as image pixels; name the dialect with "
                        "--sdcli-dialect to convert it")]


@dataclasses.dataclass(frozen=True)
class Written:
    """The sd-cli placement flags a plan writes for its target's dialect (spec section 14):
    ``placement`` written with ``dialect``; ``notes`` say what was added or left out,
    ``left_out`` (among them) what the dialect cannot say."""

    dialect: str
    placement: Any
    notes: list[str]
    left_out: list[str]

    def argv(self) -> list[str]:
        from sdplan.core.planning.sdcli_write import placement_argv

        return placement_argv(self.placement, self.dialect)

    def to_json(self) -> dict[str, object]:
        return {"dialect": self.dialect, "flags": self.argv(), "notes": list(self.notes)}


def plan_targets(args: argparse.Namespace, imported: Any) -> tuple[Target, Target]:
    """``(target, plan_target)``: what the plan is written for, and the sd-cli whose reading
    of the flags is planned: a pasted command whose syntax shows another dialect than the
    target's is planned as it runs there and written for the target."""
    target = target_from_args(args, imported.dialect if imported is not None else None,
                              pasted=imported is not None)
    if imported is not None and imported.dialect not in (None, target.dialect):
        return target, Target("sd-cli", imported.dialect, True, "the command's syntax")
    return target, target


def _fit(plan: Plan, profile: Profile | None, inventory: Inventory,
         args: argparse.Namespace, files: dict[str, list[str]] | None = None,
         flags: Any = None, tiling: Any = None, headers: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """The memory estimate and, for the newest sd-cli, its forecast
    (:func:`~sdplan.core.planning.sdcli_estimate.sdcli_estimate`: scratch reserve, graph-cut
    segments, the VAE retry, the CFG copy): for a pasted sd-cli command (``flags``, its
    runtime flags; ``tiling``, its VAE tiling) or an sd-cli target the sd-cli command's;
    else for ``--engine`` (sdplan's own engine measured by a dry run on the model files
    when given, their ``headers`` read before: :func:`measure_files`)."""
    if profile is None:
        return None, None
    if plan.target.sdcli and plan.target.dialect == "newest":
        from sdplan.core.planning.estimate import RuntimeFlags
        from sdplan.core.planning.sdcli_estimate import sdcli_estimate

        if flags is None:
            flags = RuntimeFlags(frozenset({"diffusion"}) if getattr(args, "diffusion_fa", False)
                                 else frozenset())
        return sdcli_estimate(plan, profile, inventory, width=args.width, height=args.height,
                              batch=args.batch_count, flags=flags, tiling=tiling)
    return _plain_fit(plan, profile, inventory, args, files, flags, headers), None


def _plain_fit(plan: Plan, profile: Profile, inventory: Inventory, args: argparse.Namespace,
               files: dict[str, list[str]] | None, flags: Any, headers: dict[str, Any] | None = None) -> Any:
    frames = video_frames(args)
    refs = {"ref_images": len(args.ref_image)} if getattr(args, "ref_image", None) else {}
    if flags is not None:
        return estimate_plan(plan, profile, inventory, width=args.width, height=args.height,
                             batch=args.batch_count, flags=flags, frames=frames, **refs)
    engine = ("sd-cli-fa" if getattr(args, "diffusion_fa", False) else "sd-cli") if plan.target.sdcli else engine_name(args)
    measured = measure_files(files, args, headers) if files and engine == "sdplan" else None
    return estimate_plan(plan, profile, inventory, width=args.width, height=args.height,
                         batch=args.batch_count, engine=engine, measured=measured, frames=frames, **refs)


def _time(plan: Plan, profile: Profile | None, inventory: Inventory, args: argparse.Namespace,
          files: dict[str, list[str]], fit: Any, live: bool, tiling: Any = None,
          headers: dict[str, Any] | None = None) -> Any:
    """The predicted time of sdplan's engine running the plan (:mod:`sdplan.core.commands.time_estimate`),
    or None without a profile or for another engine or an sd-cli target; the devices' profiles
    are the inventory file's, else those measured here."""
    if profile is None or plan.target.sdcli or engine_name(args) != "sdplan":
        return None
    from sdplan.core.commands import time_estimate as te

    return te.predict_plan(plan, inventory, profile, te.settings_of(args, profile.architecture), files, fit,
                           live=live, tiling=tiling, asked_threads=int(getattr(args, "threads", 0) or 0), headers=headers)


def engine_name(args: argparse.Namespace) -> str:
    """The estimate's engine from ``--engine`` and ``--diffusion-fa``."""
    if getattr(args, "engine", "sdplan") == "sd-cli":
        return "sd-cli-fa" if getattr(args, "diffusion_fa", False) else "sd-cli"
    return "sdplan"


def measure_files(files: dict[str, list[str]], args: argparse.Namespace,
                  headers: dict[str, Any] | None = None) -> dict[str, int] | None:
    """Compute bytes per module of sdplan's engine for the model files at the requested
    size, by a dry run in this process on the CPU
    (:func:`sdplan.core.pipelines.compute.measure_compute`, with the files' ``headers`` read
    before); None when the engine is unavailable (the estimate then uses its fitted figures)."""
    try:
        from sdplan.core.pipelines.compute import measure_compute

        refs = len(getattr(args, "ref_image", None) or ())  # not read: pictures of the output's size
        return measure_compute(files, width=args.width, height=args.height, batch=args.batch_count,
                               overrides={"video_frames": video_frames(args), "ref_count": refs}, headers=headers) or None
    except (ImportError, RuntimeError, ValueError, SdplanError) as exc:
        log.info("no dry run of the engine: %s", exc)
        return None


def run(args: argparse.Namespace) -> int:
    """Resolve and print; 0 on success, 2 on any sdplan error (JSON error with ``--json``)."""
    if (getattr(args, "model_profile", None) or "").strip().lower() == "list":
        return _list_builtin(args.json)
    imported = None
    try:
        if getattr(args, "sdcli_command", None):
            imported = _from_command(args)
            placement = args.placement_override
        else:
            placement = placement_from_namespace(args)
        target, plan_target = plan_targets(args, imported)
        inventory, extra = load_inventory(args.devices, placement.rpc_servers)
        files = {k: list(getattr(args, k)) for k in MODEL_FLAGS if getattr(args, k, None)}
        headers: dict[str, Any] = {}  # each file's header, read once: profile, dry run, size check, count
        profile = profile_from_args(args, files, headers)
        plan = resolve(placement, inventory, profile, plan_target)
        if imported is not None:
            plan = command_cfg(plan, imported)
        written = written_flags(plan, target, inventory, profile)
        scale = vae_scale_factor(profile.architecture if profile is not None else None)
        if imported is not None:
            extra = extra + tiling_warnings(imported, plan_target, scale)
        extra = extra + [PlanWarning("not_in_dialect", f"sd-cli ({written.dialect}) has no "
                                     f"{what}; it is left out of the written flags")
                         for what in written.left_out]
        if extra:
            plan = dataclasses.replace(plan, warnings=extra + plan.warnings)
        fit, forecast = _fit(plan, profile, inventory, args, files,
                             imported.runtime_flags() if imported is not None else None,
                             imported.vae_tiling(imported.dialect or plan_target.dialect, scale)
                             if imported is not None else None, headers)
        timing = _time(plan, profile, inventory, args, files, fit, live=not args.devices, headers=headers,
                       tiling=imported.vae_tiling(imported.dialect or plan_target.dialect, scale)
                       if imported is not None else None)
    except SdplanError as exc:
        err = exc.to_json()
        err.setdefault("span", None)
        if args.json:
            print(json.dumps({"ok": False, "error": err}, indent=1))
        else:
            print_error(exc)
        return 2
    advice = advise(plan, profile, inventory, fit, args)
    if args.json:
        out = plan.to_json()
        if fit is not None:
            out["fit"] = fit.to_json()
            if advice:
                out["fit"]["advice"] = advice
            if forecast is not None:
                out["fit"]["sdcli"] = forecast.to_json()
        out["sdcli"] = written.to_json()
        if imported is not None:
            out["command"] = _command_json(imported, written, scale)
            out["command"]["runtime_flags"] = imported.runtime_flags().to_json()
        if timing is not None:
            out["time"] = timing.to_json()
        print(json.dumps(out, indent=1))
    else:
        print_tables(plan, inventory, fit, written)
        if forecast is not None:
            from sdplan.core.planning.sdcli_estimate import forecast_lines

            for line in forecast_lines(forecast):
                print(f"  {line}")
        print_advice(advice)
        if timing is not None:
            from sdplan.core.commands.time_estimate import print_time

            print_time(stdout_console(), timing)
        if imported is not None:
            cmd = _command_json(imported, written, scale)
            console = stdout_console()
            console.print("sd-cli command:", style="bold")
            console.print(f"  {cmd['written']}", highlight=False, markup=False, soft_wrap=True)
            kept = [*imported.kept, *imported.unknown]
            if kept:
                console.print("  kept as given: " + " ".join(kept), highlight=False,
                              markup=False, soft_wrap=True)
    return 0


def written_flags(plan: Plan, target: Target, inventory: Inventory,
                  profile: Profile | None) -> Written:
    """The placement flags for ``target``'s sd-cli dialect that run ``plan`` as planned
    (:func:`~sdplan.core.planning.sdcli_write.written_placement`)."""
    from sdplan.core.planning.sdcli_write import unwritable, written_placement

    placement, notes = written_placement(plan, target.dialect, inventory, profile)
    return Written(target.dialect, placement, notes, unwritable(plan.placement, target.dialect))


def advise(plan: Plan, profile: Profile | None, inventory: Inventory, fit: Any,
           args: argparse.Namespace) -> list[str]:
    """When ``fit`` says the plan does not fit: the smallest change that would, from the
    board's Auto plan search (:func:`sdplan.core.planning.autoplan_review.review_advice`);
    else []."""
    if fit is None or getattr(fit, "fits", True) or profile is None:
        return []
    from sdplan.core.planning.autoplan_review import review_advice

    try:
        return review_advice(plan, profile, inventory, width=fit.width, height=fit.height,
                             batch=fit.batch, engine=fit.engine,
                             measured={m: c for m, e in fit.modules.items() for c in
                                       list(e.compute.values())[:1]
                                       if fit.compute_source.get(m) == "measured"})
    except SdplanError as exc:
        log.info("no auto plan: %s", exc)
        return []


def print_advice(advice: list[str]) -> None:
    """Print :func:`advise`'s lines under ``What would fit:``."""
    if not advice:
        return
    print("What would fit (from the auto plan):")
    for line in advice:
        print(f"  {line}")


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


def stdout_console() -> Any:
    """A rich console on stdout; when stdout is not a terminal (a pipe, a file), 200 columns
    wide instead of rich's 80, so table cells (model names, ranges) are not cut. Tables
    still take only the width their content needs."""
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200)


def print_tables(plan: Plan, inventory: Inventory, fit: Any, written: Written | None = None
                 ) -> None:
    """Print the plan on stdout: its target, modules, devices with budgets, warnings, the fit
    estimate (when given), the canonical flags and the sd-cli flags ``written`` for the
    target's dialect."""
    from rich.markup import escape
    from rich.table import Table

    console = stdout_console()
    console.print(f"Plan for {plan.target.label()}", highlight=False, markup=False)
    mods = Table(title="Modules")
    for col in ("module", "runs on", "weights", "block ranges"):
        mods.add_column(col)
    for m in PLACED_MODULES:
        mp = plan.modules[m]
        weights = {"runtime": "follow runtime", "disk": "disk"}.get(mp.params.mode,
                                                                    str(mp.params.device))
        unit = "stages " if mp.range_unit == "stage" else ""
        ranges = ", ".join(f"{r.device}: {unit}{r.first_block}-{r.last_block} "
                           f"({r.bytes / GIB:.2f} GiB"
                           + (f", {r.streamed / GIB:.2f} streamed" if r.streamed else "") + ")"
                           for r in mp.ranges)
        mods.add_row(m, " & ".join(mp.devices), escape(weights), escape(ranges))
    console.print(mods)
    for ph in plan.phases:  # a two-stage diffusion model: its experts in running order
        console.print(f"diffusion phase {ph.name} ({ph.flag}, {ph.bytes / GIB:.2f} GiB): "
                      + (", ".join(f"{r.device}: {r.first_block}-{r.last_block}" for r in ph.ranges)
                         or " & ".join(plan.modules["diffusion"].devices)), highlight=False, markup=False)
    if plan.split_ratio is not None:
        console.print(f"--split-ratio {plan.split_ratio.text()}", highlight=False, markup=False)
    if plan.cfg is not None:
        state = "parallel" if plan.cfg.active else "sequential: " + "; ".join(plan.cfg.reasons)
        console.print(f"CFG copy of diffusion on {plan.cfg.device} ({state})", highlight=False,
                      markup=False)
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
    if plan.auto_fit is not None:
        _print_auto_fit(console, plan.auto_fit)
    console.print("Canonical flags:" if plan.auto_fit is None else
                  "Canonical flags (pin sd-cli's --auto-fit choice with these):", style="bold")
    for flag, value in (("--backend", plan.backend), ("--params-backend", plan.params_backend),
                        ("--split-mode", plan.split_mode), ("--max-vram", plan.max_vram)):
        if value:
            console.print(f"  {flag} {value}", highlight=False, markup=False)
    if written is not None:
        console.print(f"sd-cli ({written.dialect}) placement flags:", style="bold")
        console.print("  " + (shlex.join(written.argv()) or "(none)"), highlight=False,
                      markup=False, soft_wrap=True)
        for note in written.notes:
            console.print(f"  {note}", highlight=False, markup=False)
    sys.stdout.flush()


def _print_auto_fit(console: Any, fitted: Any) -> None:
    """sd-cli's auto-fit choice (the snapshot's or the newest's): components, sizes,
    reserves, devices, where the weights went, its strings."""
    from rich.table import Table

    newest = isinstance(fitted, NewestAutoFit)
    table = Table(title="sd-cli auto-fit" + (" (newest: keeps --backend, chooses residency)"
                                             if newest else " (time-share: weights load per "
                                             "phase)" if fitted.time_share else ""))
    for col in ("component", "GiB (as counted)", "reserve GiB", "runs on", "weights"):
        table.add_column(col, justify="right" if "GiB" in col else "left")
    for comp, size in fitted.components.items():
        where = fitted.runtime.get(comp) if newest else fitted.placement.get(comp)
        tier = TIERS.get(fitted.tiers.get(comp, 0), "") if newest else (
            "disk" if fitted.time_share and where and where != ["cpu"] else "where it runs")
        table.add_row(comp, f"{size / GIB:.2f}", f"{RESERVES[comp] / GIB:.2f}",
                      " & ".join(where) if where and size else "(not present)",
                      tier if size else "")
    console.print(table)
    budgets = ", ".join(f"{d.name} {d.budget / GIB:.2f} GiB" for d in fitted.devices)
    console.print(f"  budgets: {budgets or 'no GPU'}", highlight=False, markup=False)
    console.print(f"  sd-cli derives --backend \"{fitted.backend}\""
                  + (f" --params-backend \"{fitted.params_backend}\""
                     if fitted.params_backend else ""), highlight=False, markup=False)


def _fit_cell(column: str, value: object) -> str:
    """One cell of the memory estimate table: bytes in GiB; a ``budget`` of 0 bytes (the
    device has none: a CPU, no ``--max-vram`` entry or one that disables it) as ``-``, as
    in the devices table."""
    if column == "budget" and value == 0:
        return "-"
    return f"{value / GIB:.2f}" if isinstance(value, int) else str(value)


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
        table.add_row(escape(name), *(_fit_cell(c, v.get(c, "")) for c in cols))
    console.print(table)
    for module, m in (data.get("modules") or {}).items():
        segs = m.get("segments") if isinstance(m, dict) else None
        if segs:
            console.print(f"{module}: {len(segs)} segments under the --max-vram budget of "
                          f"{m['devices'][0]} (largest {max(segs) / GIB:.2f} GiB)",
                          highlight=False, markup=False)
        if isinstance(m, dict) and m.get("phases"):
            console.print(f"{module}: " + ("both experts resident for the whole run"
                          if m.get("phase_residency") == "both" else "one expert at a time: "
                          "high noise for its steps, then released and the low-noise one loaded"),
                          highlight=False, markup=False)
    verdict = "[green]fits[/]" if data.get("fits") else "[red]does not fit[/]"
    label = fit.engine_label() if hasattr(fit, "engine_label") else None
    console.print(f"Estimate: {verdict}" + (f" · for {escape(label)}" if label else ""))
    for reason in data.get("reasons") or []:
        console.print(f"  {escape(str(reason))}", highlight=False)
