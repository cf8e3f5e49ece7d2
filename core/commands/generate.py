"""``sdplan generate``: text-to-image with an SD 1.x / 2.x checkpoint, placed by the plan.

The flags are sd-cli's spellings (``-m -p -n -W -H --steps --cfg-scale -s --sampling-method
--scheduler -b -o --preview-path --clip-skip`` and every placement flag), so a pasted sd-cli
command works. The plan is resolved against the live devices, printed, and refused when the
memory estimate says it does not fit (unless ``--force``). PNG text chunks record the prompt,
negative prompt, seed, steps, sampler, scheduler, cfg scale, clip skip, size, the model hash
(``sha256`` of the first MiB of the file followed by its size in bytes, as decimal text; the
chunk ``model_hash_method`` says so) and the canonical placement strings.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
from pathlib import Path
from typing import Any

from sdplan.core.errors import SdplanError
from sdplan.core.placement import add_placement_arguments, placement_from_namespace

log = logging.getLogger(__name__)
MODEL_HASH_METHOD = "sha256(first 1 MiB + decimal file size)"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sdplan generate`` on the dispatcher's subparsers."""
    p = subparsers.add_parser("generate", help="text to image with an SD 1.x/2.x checkpoint",
                              description="Generate images on sdplan's engine with sd-cli's flags.")
    p.add_argument("-m", "--model", required=True, metavar="PATH", help="single-file checkpoint")
    p.add_argument("-p", "--prompt", required=True)
    p.add_argument("-n", "--negative-prompt", default="")
    p.add_argument("-W", "--width", type=int, default=512, help="image width in pixels")
    p.add_argument("-H", "--height", type=int, default=512, help="image height in pixels")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--cfg-scale", type=float, default=7.0)
    p.add_argument("-s", "--seed", type=int, default=42, help="RNG seed (< 0: random)")
    p.add_argument("--sampling-method", default="euler_a")
    p.add_argument("--scheduler", default="discrete")
    p.add_argument("-b", "--batch-count", type=int, default=1)
    p.add_argument("-o", "--output", default="output.png", help="PNG path (batch: _N suffixes)")
    p.add_argument("--preview-path", metavar="DIR", help="write a latent preview PNG per step")
    p.add_argument("--clip-skip", type=int, default=-1, help="<= 0: the family default")
    p.add_argument("--vae-tile-size", type=int, default=0, metavar="LATENT_PX",
                   help="decode in tiles of this many latent pixels (0: whole)")
    p.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (0: ggml's default)")
    p.add_argument("--force", action="store_true", help="run even when the plan does not fit")
    adv = p.add_argument_group("model hyper-parameters not in the weights (small test models)")
    adv.add_argument("--clip-heads", type=int, help="CLIP attention heads (default width/64)")
    adv.add_argument("--unet-heads", type=int, help="UNet heads (default: 8 for SD 1.x)")
    adv.add_argument("--unet-head-dim", type=int, help="UNet head width (default: 64 for SD 2.x)")
    adv.add_argument("--prediction", choices=("eps", "v"), help="default: eps SD1, v SD2")
    add_placement_arguments(p)
    p.set_defaults(run=run)
    return p


def model_hash(path: str | Path) -> str:
    """Hex sha256 of the file's first MiB followed by its size as decimal ASCII."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        h.update(fh.read(1 << 20))
    h.update(str(os.path.getsize(path)).encode())
    return h.hexdigest()


def _resolve(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from sdplan.core.checkpoint import profile_from_model_flags
    from sdplan.core.commands.plan import _inventory
    from sdplan.core.estimate import estimate_plan
    from sdplan.core.plan import resolve

    placement = placement_from_namespace(args)
    inventory, _ = _inventory(None, placement.rpc_servers)
    profile = profile_from_model_flags({"model": [args.model]})
    plan = resolve(placement, inventory, profile)
    fit = estimate_plan(plan, profile, inventory, width=args.width, height=args.height,
                        batch=args.batch_count)
    return plan, inventory, fit


def _save_png(img: Any, path: Path, text: dict[str, str]) -> None:
    from PIL import Image, PngImagePlugin

    info = PngImagePlugin.PngInfo()
    for k, v in text.items():
        info.add_text(k, v)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(img).save(path, pnginfo=info)


def run(args: argparse.Namespace) -> int:
    """Plan, generate, write PNGs; 0 on success, 2 on an sdplan error, 3 when the plan does
    not fit (without ``--force``)."""
    from rich.console import Console
    from sdplan.core.commands.plan import _print_error, _print_tables

    console = Console(stderr=True)
    try:
        plan, inventory, fit = _resolve(args)
    except SdplanError as exc:
        _print_error(exc)
        return 2
    _print_tables(plan, inventory, fit)
    if fit is not None and not fit.fits:
        if not args.force:
            console.print("[bold red]refused[/]: the plan does not fit "
                          f"({'; '.join(fit.reasons)}); use --force to run anyway")
            return 3
        console.print("[yellow]--force[/]: running a plan that does not fit")
    try:
        return _generate(args, plan, console)
    except (SdplanError, ValueError) as exc:
        console.print(f"[bold red]error[/]: {exc}")
        return 2


def _generate(args: argparse.Namespace, plan: Any, console: Any) -> int:
    import random

    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
    from sdplan.core.pipeline import GenerateParams, StableDiffusion

    seed = args.seed if args.seed >= 0 else random.randrange(2**31)
    params = GenerateParams(args.prompt, args.negative_prompt, args.width, args.height, args.steps,
                            args.cfg_scale, seed, args.sampling_method, args.scheduler,
                            args.batch_count, max(args.clip_skip, 0))
    preview_dir = Path(args.preview_path) if args.preview_path else None
    with StableDiffusion(args.model, plan, n_threads=args.threads, prediction=args.prediction,
                         clip_heads=args.clip_heads, unet_heads=args.unet_heads,
                         unet_head_dim=args.unet_head_dim) as sd, Progress(
            TextColumn("sampling"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=console,
            transient=False) as bar:
        task = bar.add_task("sampling", total=args.steps, rate="")

        def on_step(step: int, total: int, _lat: Any) -> None:
            speed = bar.tasks[0].speed
            bar.update(task, completed=step, total=total,
                       rate=f"{speed:.2f} steps/s" if speed else "")

        def preview(step: int, rgb: Any) -> None:
            if preview_dir is not None:
                _save_png(rgb, preview_dir / f"preview_{step:03d}.png", {})

        images = sd.txt2img(params, on_step, preview if preview_dir else None,
                            vae_tile=args.vae_tile_size or None)
    text = {"prompt": args.prompt, "negative_prompt": args.negative_prompt, "seed": str(seed),
            "steps": str(args.steps), "sampler": args.sampling_method,
            "scheduler": args.scheduler, "cfg_scale": f"{args.cfg_scale:g}",
            "clip_skip": str(args.clip_skip), "size": f"{args.width}x{args.height}",
            "model": os.path.basename(args.model), "model_hash": model_hash(args.model),
            "model_hash_method": MODEL_HASH_METHOD, "software": "sdplan"}
    text.update({k.lstrip("-").replace("-", "_"): v for k, v in _placement_strings(plan).items()})
    out = Path(args.output)
    for i, img in enumerate(images):
        path = out if len(images) == 1 else out.with_name(f"{out.stem}_{i}{out.suffix or '.png'}")
        _save_png(img, path, text | {"batch_index": str(i)})
        print(path, file=sys.stdout)
    return 0


def _placement_strings(plan: Any) -> dict[str, str]:
    return {"backend": plan.backend, "params_backend": plan.params_backend,
            "max_vram": plan.max_vram}
