"""``sdplan generate``: text to image (and video) on sdplan's engine, placed by the plan.

Every family of :mod:`sdplan.core.families.registry` that runs, from its files (``-m`` or
``--diffusion-model`` with its encoders and ``--vae``; Wan with ``-M vid_gen``); the
architecture comes from :func:`sdplan.core.modelfiles.checkpoint.read_model_files`. The flags
are sd-cli's spellings (``-m -p -n -W -H --steps --cfg-scale --guidance -s --sampling-method --scheduler -b -o --preview-path
--clip-skip --taesd --upscale-model --upscale-repeats``, the LoRA and picture inputs
``--lora-model-dir --lora-apply-mode -i --strength --mask`` with ``<lora:NAME:WEIGHT>`` prompt
tags, and every placement flag), so a pasted sd-cli command works.

The engine runs in a child process (:class:`sdplan.core.runtime.process.Engine`; ``--in-process`` keeps
it here for debugging): the live devices (RPC servers included) are asked of the engine
process, so a lost RPC server can only end that child. The plan is resolved here, printed,
and refused when the memory estimate says it does not fit (unless ``--force``); the module
placements travel to the engine. Progress messages drive a bar with steps/s and ETA;
previews (latent projection, or TAESD with ``--taesd``) are written to ``--preview-path``.
A dead engine process is a one-line error naming the signal and ggml's last message.

PNG text chunks record the prompt, negative prompt, seed, steps, sampler, scheduler, cfg
scale, clip skip, size, the model hashes (``model_hash``: ``sha256`` of the first MiB of the
file followed by its size in bytes, as decimal text, the chunk ``model_hash_method`` says so;
``sha256`` of the whole file, computed once and cached with the model library, whose first 10
hex digits are web UI's ``Model hash`` in ``parameters``), the canonical placement strings,
and the LoRAs (``loras``, ``lora_apply_mode``) and picture inputs (``init_img``, ``mask``,
``strength``) when given. Files and folders are named by their names only, so a picture is
safe to share; ``--from-image`` finds them again beside the picture, in the current folder or
in the model library.

Hyper-parameters small test models do not carry in their shapes (head counts, prediction,
Flux RoPE axes) come from the flags below or from ``sdplan.*`` keys of the safetensors
``__metadata__`` (:data:`sdplan.core.pipelines.sd.pipeline.METADATA_KEYS`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from sdplan.core.commands.generate_modules import add_module_arguments, hires_size, module_request
from sdplan.core.commands.messages import print_error
from sdplan.core.commands.options import add_input_arguments, input_request, validate_inputs
from sdplan.core.commands.sdcli_flags import (
    add_sampling_arguments,
    apply_from_image,
    refuse_unsupported,
    sampling_request,
)
from sdplan.core.commands.video_flags import (
    add_video_arguments,
    check_video_output,
    video_frames,
    video_notes,
    video_output,
    video_request,
    write_video,
)
from sdplan.core.errors import InvalidArgument, SdplanError
from sdplan.core.planning.placement import add_placement_arguments, placement_from_namespace

log = logging.getLogger(__name__)
#: Model-file flags -> request keys.
FILE_FLAGS = {"model": "model", "diffusion_model": "diffusion_model", "t5xxl": "t5xxl", "clip_l": "clip_l",
              "clip_g": "clip_g", "llm": "llm", "vae": "vae", "taesd": "taesd", "upscale_model": "upscale_model",
              "high_noise_diffusion_model": "high_noise_diffusion_model"}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``sdplan generate`` on the dispatcher's subparsers."""
    p = subparsers.add_parser("generate", help="text to image on sdplan's engine (SD 1.x/2.x, SDXL, SD3, FLUX.1, Chroma, Z-Image, FLUX.2 klein and dev, Qwen-Image), and text to video with -M vid_gen (Wan 2.x)",
                              description="Generate images (or a Wan video with -M vid_gen) on sdplan's engine with sd-cli's flags.",
                              allow_abbrev=False)
    p.add_argument("-m", "--model", metavar="PATH", help="single-file SD checkpoint")
    p.add_argument("--demo", action="store_true",
                   help="use the packaged demo model (-m of the file in sdplan.resources; "
                        "default 128x128, 20 steps, CFG 5, euler)")
    p.add_argument("--diffusion-model", metavar="PATH",
                   help="Flux, Chroma, Z-Image or FLUX.2 klein diffusion model, or an SDXL UNet")
    p.add_argument("--t5xxl", metavar="PATH", help="T5-XXL text encoder (Flux, Chroma)")
    p.add_argument("--clip_l", metavar="PATH", help="CLIP-L text encoder (Flux, SDXL)")
    p.add_argument("--clip_g", metavar="PATH", help="OpenCLIP bigG text encoder (SDXL)")
    p.add_argument("--llm", metavar="PATH", help="language-model text encoder (Z-Image, FLUX.2 klein: Qwen3; FLUX.2 dev: Mistral-Small-3.2)")
    p.add_argument("-r", "--ref-image", action="append", default=[], metavar="PATH",
                   help="reference image to edit (FLUX.2 klein and dev; repeat for several)")
    p.add_argument("--vae", metavar="PATH", help="VAE / autoencoder file")
    p.add_argument("--force-sdxl-vae-conv-scale", action="store_true",
                   help="SDXL: scale the VAE's convolution inputs by 1/32 also with --vae (sd-cli's "
                        "f16 overflow guard, applied anyway to the checkpoint's own VAE)")
    p.add_argument("--taesd", metavar="PATH",
                   help="TAE (tiny autoencoder): decodes the final image fast, as sd-cli does, and "
                        "the previews during sampling")
    p.add_argument("--taesd-preview-only", action="store_true",
                   help="use --taesd for previews only; the VAE decodes the final image")
    p.add_argument("--upscale-model", metavar="PATH", help="ESRGAN upscaler applied after decoding")
    p.add_argument("--upscale-repeats", type=int, default=1, help="times to run the upscaler")
    p.add_argument("-p", "--prompt", help="the prompt (required unless --from-image gives one)")
    p.add_argument("-n", "--negative-prompt", default="")
    p.add_argument("-W", "--width", type=int, default=_DefaultInt(512),
                   help="image width in pixels (default: the family's, else 512)")
    p.add_argument("-H", "--height", type=int, default=_DefaultInt(512),
                   help="image height in pixels (default: the family's, else 512)")
    p.add_argument("--steps", type=int, default=_DefaultInt(20),
                   help="sampling steps (default: the family's: 20; FLUX.1 schnell and FLUX.2 klein 4, Z-Image 8)")
    p.add_argument("--cfg-scale", type=float, default=_DefaultFloat(7.0),
                   help="classifier-free guidance (default: the family's: SD 7, SD3 4.5, Chroma 4, the distilled DiTs 1)")
    p.add_argument("--guidance", type=float, help="FLUX.1 dev distilled guidance (default 3.5)")
    p.add_argument("-s", "--seed", type=int, default=42, help="RNG seed (< 0: random)")
    p.add_argument("--sampling-method", default=_DefaultStr("euler_a"),
                   help="sampler (default: the family's: euler_a for the UNets, euler for the DiTs)")
    p.add_argument("--scheduler", default="default",
                   help="sigma schedule (default: the model's, as sd-cli: discrete for SD, "
                        "Flux's own for Flux)")
    p.add_argument("-b", "--batch-count", type=int, default=1)
    p.add_argument("-o", "--output", default="output.png",
                   help="PNG path (batch: _N suffixes); -M vid_gen: .webm (default), .mp4, .avi, or PNG "
                        "frames for a .png or printf-style name (frames_%%03d.png)")
    add_video_arguments(p)
    p.add_argument("--preview-path", metavar="DIR", help="write a preview PNG per step")
    p.add_argument("--clip-skip", type=int, default=-1, help="<= 0: the family default")
    p.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (0: ggml's default)")
    p.add_argument("--force", action="store_true", help="run even when the plan does not fit")
    p.add_argument("--in-process", action="store_true",
                   help="run the engine in this process (debugging; a ggml abort ends sdplan)")
    adv = p.add_argument_group("model hyper-parameters not in the weights (small test models; "
                               "also read from sdplan.* safetensors metadata)")
    adv.add_argument("--clip-heads", type=int, help="CLIP attention heads (default width/64)")
    adv.add_argument("--unet-heads", type=int, help="UNet heads (default: 8 for SD 1.x)")
    adv.add_argument("--unet-head-dim", type=int, help="UNet head width (default: 64 for SD 2.x)")
    adv.add_argument("--prediction", choices=("eps", "v"), help="default: eps SD1, v SD2")
    adv.add_argument("--flux-heads", type=int, help="Flux DiT heads (default from the q-norm width)")
    adv.add_argument("--flux-axes", metavar="I,R,C", help="Flux RoPE axes widths (default hd/8 and halves)")
    adv.add_argument("--t5-length", type=int, help="T5 tokens after padding (default: Flux 256, Chroma 512)")
    add_input_arguments(p)
    add_module_arguments(p)
    add_placement_arguments(p)
    add_sampling_arguments(p)
    p.set_defaults(run=run, parser_defaults=_defaults(p))
    p.error = _one_line_error  # type: ignore[method-assign]
    return p


def _one_line_error(message: str) -> None:
    """argparse's error for generate: one line (the dispatcher prints it), no usage dump."""
    raise SdplanError(f"{message} (see sdplan generate --help)")


def _defaults(p: argparse.ArgumentParser) -> dict[str, Any]:
    return {a.dest: a.default for a in p._actions if a.dest != "help"}


class _DefaultInt(int):
    """An int default argparse keeps as given: ``--demo`` replaces only these."""


class _DefaultFloat(float):
    """A float default argparse keeps as given: ``--demo`` replaces only these."""


class _DefaultStr(str):
    """A text default argparse keeps as given: ``--demo`` replaces only these."""


def apply_demo(args: argparse.Namespace) -> None:
    """With ``--demo``: ``-m`` the demo model, the demo's defaults
    (:mod:`sdplan.core.pipelines.demo.model`) for each of width, height, steps, CFG scale and the
    sampler, where the command line left them at their defaults, and its LoRA folder
    without ``--lora-model-dir``.

    Raises:
        SdplanError: ``--demo`` together with ``-m`` or ``--diffusion-model``, or no demo file.
    """
    if not getattr(args, "demo", False):
        return
    from sdplan.core.pipelines.demo.model import (
        DEMO_DEFAULTS,
        DEMO_SAMPLER,
        demo_lora_dir,
        demo_model_path,
    )

    if args.model or args.diffusion_model:
        raise InvalidArgument("--demo replaces -m/--diffusion-model: give one or the other")
    args.model = str(demo_model_path())
    if getattr(args, "lora_model_dir", "") is None:
        args.lora_model_dir = str(demo_lora_dir())
    for key, value in DEMO_DEFAULTS.items():
        if isinstance(getattr(args, key), (_DefaultInt, _DefaultFloat)):
            setattr(args, key, value)
    if isinstance(args.sampling_method, _DefaultStr):
        args.sampling_method = DEMO_SAMPLER


def model_files(args: argparse.Namespace) -> dict[str, list[str]]:
    """The request's model files (sd-cli flag keys -> paths). Raises SdplanError when neither
    ``-m`` nor ``--diffusion-model`` is given."""
    files = {key: [str(getattr(args, attr))] for attr, key in FILE_FLAGS.items() if getattr(args, attr, None)}
    if "model" not in files and "diffusion_model" not in files:
        raise InvalidArgument("generate needs -m MODEL (SD checkpoint) or --diffusion-model (Flux, Chroma, Z-Image or "
                              "FLUX.2 klein files)")
    return files


def _resolve(args: argparse.Namespace, engine: Any, files: dict[str, list[str]], placement: Any,
             profile: Any) -> tuple[Any, Any, Any, Any]:
    from sdplan.core.pipelines.job_names import INVENTORY_JOB
    from sdplan.core.pipelines.stages.inputs import plan_loras
    from sdplan.core.planning.estimate import estimate_plan
    from sdplan.core.planning.inventory import Inventory
    from sdplan.core.planning.plan import resolve

    inventory = Inventory.from_json(engine.call(INVENTORY_JOB, {"rpc_servers": list(placement.rpc_servers)}))
    plan = resolve(placement, inventory, profile)
    loras = plan_loras(args.prompt, args.lora_model_dir or ".", args.lora_apply_mode, files, plan)
    measured = engine_compute(args, engine, files, plan)
    width, height = hires_size(args)  # the second pass of a hires fix is the largest
    fit = estimate_plan(plan, profile, inventory, width=width, height=height, batch=args.batch_count,
                        engine="sdplan", measured=measured, loras=loras.profiles,
                        ref_images=len(getattr(args, "ref_image", None) or ()), frames=video_frames(args))
    return plan, inventory, fit, loras


def read_models(files: dict[str, list[str]]) -> Any:
    """The model files' headers (:func:`sdplan.core.modelfiles.checkpoint.read_model_files`
    of every file but ``--taesd``/``--upscale-model``, which the engine reads later: here
    they are only checked to be regular files): the family, the profile, the metadata.
    Raises ModelFileError as it does and as ``sdplan plan``'s check of the files does
    (:func:`sdplan.core.modelfiles.file_roles.read_checked`)."""
    from sdplan.core.modelfiles.file_roles import read_checked
    from sdplan.core.modelfiles.readers import check_model_file

    late = ("taesd", "upscale_model")
    for path in (p for key in late for p in files.get(key, ())):
        check_model_file(path)
    return read_checked({k: v for k, v in files.items() if k not in late})


def _profile(files: dict[str, list[str]]) -> Any:
    return read_models(files).profile()


def engine_compute(args: argparse.Namespace, engine: Any, files: dict[str, list[str]], plan: Any) -> dict[str, int]:
    """Compute bytes per module of this run, measured by a dry run of the engine's graphs in
    the engine process on the planned devices (:mod:`sdplan.core.pipelines.compute`); {}
    when the family has no dry run or it fails (the estimate then uses its fitted figures)."""
    from sdplan.core.pipelines.job_names import COMPUTE_JOB
    from sdplan.core.runtime.placement import ModulePlacement

    width, height = hires_size(args)
    try:
        return dict(engine.call(COMPUTE_JOB, {
            "model_files": files, "width": width, "height": height, "batch": args.batch_count,
            "cfg": args.cfg_scale != 1.0, "overrides": {"clip_heads": getattr(args, "clip_heads", None),
                                                        "video_frames": video_frames(args), "ref_images": getattr(args, "ref_image", None)},
            "vae_tiling": module_request(args)["vae_tiling"],
            "placements": {m: ModulePlacement.from_plan(plan, m)
                           for m in ("diffusion", "te", "vae", "controlnet", "upscaler") if m in plan.modules}}))
    except SdplanError as exc:
        log.info("no dry run of the engine: %s", exc)
        return {}


def run(args: argparse.Namespace) -> int:
    """Plan, generate, write PNGs; 0 on success, 2 on an sdplan error (a dead engine
    process included), 3 when the plan does not fit (without ``--force``)."""
    from sdplan.core.commands.plan import print_tables
    from sdplan.core.pipelines.demo.model import demo_caption_known
    from sdplan.core.pipelines.size_rule import check_size
    from sdplan.core.runtime.process import Engine

    extras = list(getattr(args, "extra_argv", None) or [])
    if any(x in ("-v", "--verbose") for x in extras):  # sd-cli's -v: print predicted beside measured
        args.verbose = True
        extras = [x for x in extras if x not in ("-v", "--verbose")]
    try:
        notes = refuse_unsupported(args, extras)
        taken = apply_from_image(args, getattr(args, "parser_defaults", {}))
    except SdplanError as exc:
        print(f"sdplan generate: {exc}", file=sys.stderr)
        return 2
    for note in [*notes, *([taken] if taken else [])]:
        _stderr_console().print(f"[yellow]note[/]: {note}", highlight=False, markup=False)
    try:  # everything the flags and the files' headers can refuse, before the engine starts
        apply_demo(args)
        if not args.prompt:
            raise SdplanError("generate needs -p PROMPT (or --from-image with a prompt)")
        validate(args)
        files = model_files(args)
        placement = placement_from_namespace(args)
        models = read_models(files)
        req = checked_request(args, files, models)
        check_size(models, args.width, args.height, getattr(args, "size_from_init_img", False))
    except SdplanError as exc:
        print_error(exc)
        return 2
    with Engine(isolated=not args.in_process) as engine:
        engine.start()  # an isolated engine's child process starts (or finishes its imports)
        try:
            from sdplan.core.commands.generate_modules import with_late_modules

            late = {**files, **({"control_net": [str(args.control_net)]} if args.control_net else {})}
            profile = with_late_modules(models.profile(), late, req.hires_model())
            plan, inventory, fit, loras = _resolve(args, engine, late, placement, profile)
        except SdplanError as exc:
            print_error(exc)
            return 2
        fits = fit is None or fit.fits
        from sdplan.core.commands.time_estimate import predict_run

        predicted = predict_run(args, engine, files, plan, inventory, profile, fit, req) \
            if getattr(args, "verbose", False) else None
        try:  # the engine starts on the picture while the tables print
            job = _submit(req, plan, fit, inventory, args, engine) if fits or args.force else 0
        except (SdplanError, ValueError) as exc:
            return _failed(exc)
        console = _stderr_console()  # rich loads here, while the engine works on the picture
        print_tables(plan, inventory, fit)
        _print_inputs(console, loras, args)
        if getattr(args, "demo", False) and not demo_caption_known(args.prompt):
            console.print("[yellow]note[/]: the demo model was trained on captions like "
                          "'a red circle on a blue background' (8 colours; circle, square, "
                          "triangle); other prompts give arbitrary shapes", highlight=False)
        if not fits:
            if not args.force:
                console.print("[bold red]refused[/]: the plan does not fit "
                              f"({'; '.join(fit.reasons)}); use --force to run anyway")
                from sdplan.core.commands.plan import advise, print_advice

                print_advice(advise(plan, _profile(files), inventory, fit, args))
                return 3
            console.print("[yellow]--force[/]: running a plan that does not fit")
        if engine.isolated:
            _load_output_modules()
        try:
            return _generate(args, files, engine, console, job, predicted)
        except (SdplanError, ValueError) as exc:
            return _failed(exc)


def _failed(exc: Exception) -> int:
    """Print an engine request's error (a ValueError as an invalid argument); exit code 2."""
    print_error(exc if isinstance(exc, SdplanError) else InvalidArgument(str(exc)))
    return 2


def _stderr_console() -> Any:
    """A rich console on stderr that wraps no line (piped stderr gets whole lines). Rich is
    imported here, not before the engine has its job: its 25-40 ms of imports would delay
    the jobs the engine waits for."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True)


def _load_output_modules() -> None:
    """Import what prints the plan, the progress bar and the result while the engine process
    makes the picture: rich's tables and progress, the emoji table rich loads on the first
    text it prints with a colon, and numpy and Pillow, which unpack and write the images."""
    import rich.markup  # noqa: F401
    import rich.progress  # noqa: F401
    import rich.table  # noqa: F401
    from rich.emoji import Emoji

    Emoji.replace("")
    from PIL import Image, PngImagePlugin  # noqa: F401
    from sdplan.core.pipelines.stages import results  # noqa: F401 - numpy


def request_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The generation settings of the parsed flags by sd-cli's request keys; a flag left at its
    parser default is None (the family's default applies when the request is checked).

    Raises:
        InvalidArgument / SdplanError: malformed ``--flux-axes``, ``--sigmas``, SLG values...
    """
    def given(value: Any) -> Any:
        return None if isinstance(value, (_DefaultInt, _DefaultFloat, _DefaultStr)) else value

    overrides = {"clip_heads": args.clip_heads, "unet_heads": args.unet_heads,
                 "unet_head_dim": args.unet_head_dim, "prediction": args.prediction,
                 "flux_heads": args.flux_heads, "t5_length": args.t5_length}
    if args.flux_axes:
        try:
            overrides["flux_axes"] = tuple(int(a) for a in args.flux_axes.split(","))
        except ValueError:
            raise InvalidArgument(f"--flux-axes must be three integers like 16,56,56, got {args.flux_axes!r}") from None
    return {**video_request(args), "prompt": args.prompt, "negative_prompt": args.negative_prompt,
            "width": given(args.width), "height": given(args.height), "steps": given(args.steps),
            "cfg_scale": given(args.cfg_scale), "guidance": args.guidance, "seed": args.seed,
            "sampling_method": given(args.sampling_method), "scheduler": args.scheduler,
            "batch_count": args.batch_count, "clip_skip": max(args.clip_skip, 0),
            "upscale_repeats": args.upscale_repeats,
            "threads": args.threads, "overrides": {k: v for k, v in overrides.items() if v is not None},
            "previews": bool(args.preview_path),
            "taesd_decode": bool(args.taesd) and not args.taesd_preview_only,
            "ref_images": [str(p) for p in getattr(args, "ref_image", None) or ()],
            "force_sdxl_vae_conv_scale": bool(getattr(args, "force_sdxl_vae_conv_scale", False)),
            **sampling_request(args), **input_request(args), **module_request(args)}


def checked_request(args: argparse.Namespace, files: dict[str, list[str]], models: Any) -> Any:
    """The request of the flags and ``files`` checked against the files' family
    (:meth:`~sdplan.core.pipelines.request.GenerationRequest.check`) before anything loads; its
    size, steps, CFG and sampler are written back to ``args`` (for the estimate and size check).

    Raises:
        ModelFileError: a family that is not run, incomplete files; InvalidArgument: a
            sampler, scheduler or option the family does not take, naming each.
    """
    from sdplan.core.families import options as o
    from sdplan.core.pipelines.request import GenerationRequest, family_for

    fam, variant = family_for(models.architecture)
    req = GenerationRequest.from_settings(request_settings(args), files).check(fam, variant)
    args.width, args.height, args.steps = req.width, req.height, req.steps
    args.first_frame = fam.honours(o.VIDEO, variant)  # a video family's -i: its first frame, one under img_gen
    # the hires target's alignment: sd-cli's 64 for a UNet (VAE x its 8), two latent pixels for a DiT
    args.hires_multiple = 64 if fam.size_rule == "unet" else 2 * fam.vae_scale
    args.cfg_scale, args.sampling_method = req.cfg_scale, req.sampling_method
    return req


def validate(args: argparse.Namespace) -> None:
    """Check the generation flags and every output location before anything loads
    (:mod:`sdplan.core.pipelines.limits`, :func:`check_outputs`, no output over an input:
    :mod:`sdplan.core.commands.same_file`); raises InvalidArgument or OutputError naming the
    flag."""
    from sdplan.core.pipelines.limits import check_generation
    from sdplan.core.sampling.names import FLOW_SAMPLERS, SAMPLERS, SCHEDULES

    validate_inputs(args)  # first: -W/-H may come from the init picture
    check_generation(args)
    names = sorted(set(SAMPLERS) | set(FLOW_SAMPLERS) | {"ddim"})
    if args.sampling_method not in names:  # the family's own list is checked with the files
        raise InvalidArgument(f"--sampling-method {args.sampling_method!r} is unknown; choose one of "
                              f"{', '.join(names)}")
    if args.scheduler not in (*SCHEDULES, "default", "normal"):
        raise InvalidArgument(f"--scheduler {args.scheduler!r} is unknown; choose one of {', '.join(SCHEDULES)}")
    check_outputs(args)
    from sdplan.core.commands.same_file import check_generate

    check_generate(args)  # no output is an input
    if getattr(args, "ref_image", None):
        from sdplan.core.pipelines.flux2.pipeline import load_ref_image

        for path in args.ref_image:
            load_ref_image(path)  # a missing or broken picture is a one-line error now


def check_outputs(args: argparse.Namespace) -> None:
    """Before any work: the image file (``-o``, a ``.png`` path in a folder that takes files
    and has room for the batch) and the preview folder (``--preview-path``) are writable.

    Raises:
        OutputError: naming the flag and the path.
    """
    from sdplan.core.pipelines.stages.outputs import check_output_file, check_output_folder

    scale = 4 ** args.upscale_repeats if getattr(args, "upscale_model", None) else 1
    width, height = hires_size(args) if getattr(args, "hires", False) else (args.width, args.height)
    raw = width * height * 3 * scale * scale  # an upper bound of a PNG's bytes
    if getattr(args, "mode", "img_gen") == "vid_gen":
        check_video_output(args, raw)
    else:
        check_output_file("-o/--output", args.output, needed_bytes=raw * args.batch_count)
    if args.preview_path:
        check_output_folder("--preview-path", args.preview_path, needed_bytes=raw)


def _print_inputs(console: Any, loras: Any, args: argparse.Namespace) -> None:
    """One line each for the LoRAs (and keys of theirs that patch nothing) and the init picture."""
    if loras.loras:
        console.print(loras.summary(), highlight=False, markup=False)
        for u in loras.unknown():
            console.print(f"[yellow]LoRA key not applied[/]: {u}", highlight=False)
    if args.init_img:  # a video's start picture takes no strength
        how = (f"video from {args.init_img} (the first frame)" if getattr(args, "first_frame", False) else
               f"image from {args.init_img}, strength {args.strength:g}" + (f", mask {args.mask}" if args.mask else ""))
        console.print(f"image to {how}", highlight=False, markup=False)
    for note in [*(getattr(args, "picture_notes", None) or ()), *video_notes(args)]:  # a picture of another shape
        console.print(f"note: {note}", highlight=False, markup=False)


def _submit(req: Any, plan: Any, fit: Any, inventory: Any, args: argparse.Namespace, engine: Any) -> int:
    """Send the checked request with the resolved plan the tables show (its devices' needs
    from ``fit``, checked by the engine against its live devices) to the engine
    (:meth:`Engine.submit`); its job number."""
    from dataclasses import replace

    from sdplan.core.pipelines.job_names import GENERATE_JOB
    from sdplan.core.runtime.run_plan import RunPlan

    run_plan = RunPlan.from_plan(plan, fit, inventory, check_memory=not args.force,
                                 modules=tuple(m for m in req.modules() if m in plan.modules))
    return engine.submit(GENERATE_JOB, {"request": replace(req, plan=run_plan)})


def _generate(args: argparse.Namespace, files: dict[str, list[str]], engine: Any, console: Any, job: int,
              predicted: Any = None) -> int:
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    preview_dir = Path(args.preview_path) if args.preview_path else None
    t0 = time.perf_counter()
    with Progress(TextColumn("sampling"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[rate]}"), TimeRemainingColumn(), console=console,
                  transient=False) as bar:
        task = bar.add_task("sampling", total=args.steps, rate="")
        first: dict[str, float] = {}
        step_times: list[float] = []

        def on_progress(info: dict[str, Any]) -> None:
            if info.get("phase") == "threads":
                bar.console.print(f"CPU threads: {info['threads']} ({info['reason']})",
                                  highlight=False, markup=False)
            if "step" not in info:
                return
            now = time.perf_counter()
            step_times.append(now - first.get("last", now))
            first["last"] = now
            first.setdefault("t", now)
            first.setdefault("step", info["step"])
            done = info["step"] - first["step"]
            rate = done / (now - first["t"]) if done and now > first["t"] else 0.0
            bar.update(task, completed=info["step"], total=info["total"],
                       rate=f"{rate:.2f} steps/s" if rate else "")

        def on_preview(info: dict[str, Any]) -> None:
            nonlocal preview_dir
            if preview_dir is None:
                return
            from sdplan.core.pipelines.stages.results import save_png

            try:
                save_png(info["image"], preview_dir / f"preview_{info['step']:03d}.png")
            except OSError as exc:  # a preview lost must not lose the run
                bar.console.print(f"warning: previews stop: cannot write in {str(preview_dir)!r} "
                                  f"({exc.strerror or exc})", highlight=False, markup=False)
                preview_dir = None

        try:
            res = engine.result(job, on_progress, on_preview)
        except KeyboardInterrupt:
            engine.cancel()
            raise
    # the job was sent before the tables printed: the engine's own timings say what it took
    log.info("picture ready %.2f s after the tables; engine timings (s): %s", time.perf_counter() - t0,
             res.get("timings"))
    from sdplan.core.pipelines.stages.results import (
        picture_text,  # numpy: loaded once the engine runs
    )

    for module, n in (res.get("segments") or {}).items():
        console.print(f"{module}: ran in {n} segments under the --max-vram budget", highlight=False)
    from sdplan.core.commands.time_estimate import measured_timings, print_time

    timings = measured_timings(step_times, res.get("timings") or {})
    res["timings"] = {**(res.get("timings") or {}), **timings}
    if predicted is not None:
        print_time(console, predicted, timings)
    if getattr(args, "mode", "img_gen") == "vid_gen":
        return write_video(res, video_output(args), picture_text(res, files), console)
    return write_images(res["images"], Path(args.output), picture_text(res, files), console)


def write_images(images: list[Any], out: Path, text: dict[str, str], console: Any) -> int:
    """Write each image (``out``, or ``out_N`` for a batch) atomically and print its path on
    stdout; an image whose write fails late (a full disk) goes to the temporary folder
    instead, and the message says where. Returns 0, or 2 when an image could not be
    written anywhere."""
    from sdplan.core.pipelines.stages.outputs import fallback_folder
    from sdplan.core.pipelines.stages.results import save_png

    status = 0
    for i, img in enumerate(images):
        path = out if len(images) == 1 else out.with_name(f"{out.stem}_{i}{out.suffix or '.png'}")
        chunks = text | {"batch_index": str(i)}
        try:
            save_png(img, path, chunks)
        except OSError as exc:
            spare = fallback_folder() / f"sdplan-{os.getpid()}-{int(time.time())}-{path.name}"
            try:
                save_png(img, spare, chunks)
            except OSError as exc2:
                console.print(f"error [output_unwritable]: cannot write {str(path)!r} "
                              f"({exc.strerror or exc}) nor {str(spare)!r} "
                              f"({exc2.strerror or exc2}); the image is lost", highlight=False,
                              markup=False, soft_wrap=True)
                status = 2
                continue
            console.print(f"warning: cannot write {str(path)!r} ({exc.strerror or exc}); "
                          f"the image was written to {str(spare)!r} instead", highlight=False,
                          markup=False, soft_wrap=True)
            path = spare
        print(path, file=sys.stdout)
    return status
