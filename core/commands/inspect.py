"""``sdplan inspect``: what model files hold, read from their headers only.

``sdplan inspect FILE... [--json] [--write-profile OUT.json]``, also with sd-cli's model
flags (``--diffusion-model F --t5xxl T ...``). Positional files are classified by their
tensor names, as ``-m`` files are. Prints modules, encoders, architecture with evidence,
dtype mix and sizes in GiB; ``--json`` prints :meth:`ModelSet.to_json` (bytes); a bad file
prints one line and exits with code 2 (``--json``: ``{"ok": false, "error": {...}}``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from sdplan.core.commands.messages import print_error
from sdplan.core.errors import InvalidArgument, OutputError, SdplanError
from sdplan.core.modelfiles.checkpoint import ModelSet, read_model_files
from sdplan.core.planning.modules import GIB, MODEL_FLAGS


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sdplan inspect`` on the dispatcher's subparsers."""
    p = subparsers.add_parser(
        "inspect", help="show the modules, blocks and sizes of model files",
        description="Read safetensors/GGUF headers (no weights) and show modules, text "
                    "encoders, architecture, dtypes and sizes; optionally write a profile.")
    p.add_argument("files", nargs="*", metavar="FILE",
                   help="model files or diffusers folders, classified by their tensor names")
    g = p.add_argument_group("model files (as sd-cli spells them)")
    for key, flags in MODEL_FLAGS.items():
        g.add_argument(*reversed(flags), dest=key, action="append", metavar="PATH")
    p.add_argument("--json", action="store_true", help="print JSON (bytes)")
    p.add_argument("--write-profile", metavar="OUT.json",
                   help="write the planner profile (block sizes) to this file")
    p.set_defaults(run=run)
    return p


def flags_from_args(args: argparse.Namespace) -> dict[str, list[str]]:
    """The model-file flags of parsed arguments; positional files go to ``model``."""
    flags: dict[str, list[str]] = {}
    for key in MODEL_FLAGS:
        vals = getattr(args, key, None)
        if vals:
            flags[key] = list(vals)
    if getattr(args, "files", None):
        flags.setdefault("model", []).extend(args.files)
    return flags


def run(args: argparse.Namespace) -> int:
    """Inspect the files; 0 on success, 2 on a bad file or no file."""
    flags = flags_from_args(args)
    try:
        if not flags:
            raise InvalidArgument("no model file given (FILE... or --diffusion-model, --t5xxl ...)")
        if args.write_profile:
            from sdplan.core.commands.same_file import check_files

            check_files([("--write-profile", args.write_profile)],
                        [(MODEL_FLAGS[k][0], p) for k, v in flags.items() for p in v])
        ms = read_model_files(flags)
        if args.write_profile:
            out = Path(args.write_profile)
            try:
                out.write_text(json.dumps(ms.profile().to_json(), indent=1) + "\n",
                               encoding="utf-8")
            except OSError as exc:
                raise OutputError(f"{out}: cannot write profile: {exc.strerror}") from None
    except SdplanError as exc:
        if args.json:
            print(json.dumps({"ok": False, "error": exc.to_json()}))
        else:
            print_error(exc)
        return 2
    if args.json:
        print(json.dumps({"ok": True, **ms.to_json()}, indent=1))
    else:
        show(ms)
        if args.write_profile:
            print(f"profile written to {args.write_profile}")
    return 0


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def show(ms: ModelSet) -> None:
    """Print rich tables of a model set (sizes in GiB)."""
    from rich.console import Console
    from rich.table import Table

    con = Console()
    arch = ms.architecture
    con.print(f"[bold]architecture[/]: {arch.name}")
    for ev in arch.evidence:
        con.print(f"  - {ev}")
    files = Table(title="files")
    for col in ("file", "format", "tensors", "GiB"):
        files.add_column(col, justify="right" if col in ("tensors", "GiB") else "left")
    for f in ms.files:
        files.add_row(f.path, f.format, str(len(f.tensors)), _gib(f.nbytes))
    con.print(files)
    mods = Table(title="modules")
    for col in ("module", "GiB", "blocks", "block GiB", "other GiB", "dtypes"):
        mods.add_column(col, justify="left" if col in ("module", "dtypes") else "right")
    rows = [(m, m, "main") for m in ms.modules()]
    if ms.module_tensors("diffusion", "high_noise"):  # a two-stage model's first expert
        rows.insert(1, ("diffusion (high noise)", "diffusion", "high_noise"))
    for label, m, role in rows:
        mp = ms.module_profile(m, role)
        mix = ", ".join(f"{d} {_gib(b)}" for d, b in ms.dtype_mix(m, role).items())
        mods.add_row(label, _gib(mp.total), str(len(mp.blocks)), _gib(sum(mp.blocks)),
                     _gib(mp.other), mix)
    con.print(mods)
    enc = ms.encoder_bytes()
    if enc:
        te = Table(title="text encoders (te)")
        te.add_column("encoder")
        te.add_column("GiB", justify="right")
        te.add_column("split", justify="left")
        dom = ms.block_encoder()
        for e, b in enc.items():
            te.add_row(e, _gib(b), "blocks" if e == dom else "main device")
        con.print(te)
    if ms.preview_bytes():
        role = ("not counted as the VAE" if ms.module_tensors("vae")
                else "the only decoder, so module vae is this TAE")
        con.print(f"preview decoder (--taesd): {_gib(ms.preview_bytes())} GiB, {role}")
    if ms.ignored:
        con.print(f"{len(ms.ignored)} tensors not loaded "
                  f"({_gib(sum(t.nbytes for t, _ in ms.ignored))} GiB: "
                  f"{', '.join(sorted({r for _, r in ms.ignored}))})")
