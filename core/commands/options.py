"""Options several commands share, defined once: where the devices and the model profile
come from (``--devices``, ``--profile``, ``--model-profile``), read the same way by
``sdplan plan`` and ``sdplan gui``."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from sdplan.core.errors import PlanError
from sdplan.core.modelfiles.file_roles import read_checked
from sdplan.core.modelfiles.readers import TensorFile
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.plan import PlanWarning
from sdplan.core.planning.profile import Profile
from sdplan.core.planning.target import Target, dialect_from_help


def add_source_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--devices FILE``, ``--profile FILE|NAME`` and ``--model-profile NAME``."""
    p.add_argument("--devices", metavar="FILE", help="plan for the devices in this inventory "
                   "JSON file (a hardware profile; `sdplan devices --json` writes one) instead "
                   "of the live ones")
    p.add_argument("--profile", metavar="FILE|NAME", help="model profile JSON (block sizes), "
                   "or the name of a built-in profile")
    p.add_argument("--model-profile", metavar="NAME", help="plan for a built-in model profile "
                   "(flux1-dev-q8_0, sdxl-base-f16...) without its files; 'list' shows them all")


def profile_from_args(args: argparse.Namespace, model_files: Mapping[str, Sequence[str]] | None = None,
                      headers: dict[str, TensorFile] | None = None) -> Profile | None:
    """The model profile the options and model files name: ``--model-profile``, else
    ``--profile``, else the files' (headers only, checked as ``sdplan generate`` checks them:
    :func:`sdplan.core.modelfiles.file_roles.read_checked`; those in ``headers`` not read
    again, and those read added: :func:`~sdplan.core.modelfiles.readers.read_header_once`),
    else None.

    Raises:
        PlanError: ``conflicting_model_sources`` when more than one source is given.
        ModelFileError: an unreadable profile or model file, an unknown built-in name, a
            file of another kind than its flag takes or files that do not fit together.
    """
    builtin = getattr(args, "model_profile", None)
    given = getattr(args, "profile", None)
    if model_files and (builtin or given):
        raise PlanError("conflicting_model_sources", "--model-profile and --profile exclude "
                        "model files; give one of them",
                        flag="--model-profile" if builtin else "--profile")
    if builtin or given:
        from sdplan.core.planning.builtin_profiles import load_profile_option  # package data

        return load_profile_option(given, builtin)
    # the files checked as generate checks them: a set it refuses is not planned
    return read_checked(model_files, headers).profile() if model_files else None


def load_inventory(path: str | None, rpc_servers: Sequence[str] = ()) -> tuple[Inventory, list[PlanWarning]]:
    """The inventory file at ``path``, else the live devices of this process (after adding
    ``rpc_servers``), else the CPU alone with a ``live_inventory_unavailable`` warning.

    Raises:
        InventoryError: a bad file; RpcError: an unreachable server.
    """
    if path:
        return Inventory.load(path), []
    from sdplan.core.runtime.devices import local_inventory  # its native module, its threads rule

    inventory, missing = local_inventory(rpc_servers)
    if missing is None:
        return inventory, []
    return inventory, [PlanWarning(
        "live_inventory_unavailable", f"live device query unavailable ({missing}); planning "
        "for the CPU alone (use --devices FILE to plan for other devices)")]


def add_input_arguments(p: argparse.ArgumentParser) -> None:
    """Add sd-cli's LoRA and picture-input flags: ``--lora-model-dir``,
    ``--lora-apply-mode``, ``-i/--init-img``, ``--strength``, ``--mask``."""
    from sdplan.core.planning.adapters import APPLY_MODES

    g = p.add_argument_group("LoRA, image to image, inpainting (sd-cli's flags)")
    g.add_argument("--lora-model-dir", metavar="DIR",
                   help="folder of the prompt's <lora:NAME:WEIGHT> files (default: here; with "
                        "--demo the demo model's LoRAs)")
    g.add_argument("--lora-apply-mode", choices=APPLY_MODES, default="auto",
                   help="merge LoRAs into the weights (immediately) or add them in the graph "
                        "(at_runtime); auto: at_runtime for quantized, offloaded or split models")
    g.add_argument("-i", "--init-img", metavar="PATH", help="start from this picture (img2img)")
    g.add_argument("--strength", type=float, default=0.75,
                   help="how much of --init-img to repaint, 0..1 (default 0.75)")
    g.add_argument("--mask", metavar="PATH", help="inpainting mask for --init-img: white = repaint")


def validate_inputs(args: argparse.Namespace) -> None:
    """Check the picture flags before anything loads: strength in [0, 1], ``--mask`` only
    with ``-i``, both readable pictures, and so is ``--control-image``; ``-W``/``-H`` left at their defaults take the init
    picture's size (as sd-cli does; ``--demo``'s own size counts as given).

    A picture (or mask) of another shape than it will be used at is noted in
    ``args.picture_notes`` (:func:`sdplan.core.pipelines.img2img.picture_notes`).

    Raises:
        InvalidArgument: naming the flag.
    """
    import math

    from sdplan.core.errors import InvalidArgument

    if not (math.isfinite(args.strength) and 0.0 <= args.strength <= 1.0):
        raise InvalidArgument(f"--strength must be in [0, 1], got {args.strength}")
    if args.mask and not args.init_img:
        raise InvalidArgument("--mask needs -i/--init-img: the mask says which pixels of that picture to repaint")
    args.picture_notes = []
    if args.init_img:
        # numpy and Pillow load only with a picture input
        from sdplan.core.pipelines.stages.img2img import image_size, picture_notes

        w, h = image_size(args.init_img)
        mask = image_size(args.mask, "--mask") if args.mask else None  # readable?
        for key, value in (("width", w), ("height", h)):
            if type(getattr(args, key)) is not int:  # left at the default (a subclass of int)
                setattr(args, key, value)
                args.size_from_init_img = True  # for the size check's message
        args.picture_notes = picture_notes((w, h), mask, args.width, args.height)
        if getattr(args, "mode", "img_gen") == "vid_gen" and (w, h) != (args.width, args.height):
            # a video's start picture: sd-cli crops it about its centre to the video's aspect, then resizes
            args.picture_notes = [f"-i/--init-img is {w}x{h}: cropped about its centre to the aspect ratio of "
                                  f"{args.width}x{args.height}, then resized to it (as sd-cli does)"]
    if getattr(args, "control_image", None):  # readable, before anything loads
        from sdplan.core.pipelines.stages.img2img import image_size

        image_size(args.control_image, "--control-image")


def input_request(args: argparse.Namespace) -> dict[str, object]:
    """The engine request keys of the LoRA and picture flags."""
    return {"lora_model_dir": args.lora_model_dir or ".", "lora_apply_mode": args.lora_apply_mode,
            "init_img": args.init_img, "mask": args.mask,
            "strength": args.strength if args.init_img else None}


#: Seconds ``--sdcli PATH --help`` may take before sdplan gives up on it.
HELP_TIMEOUT_S = 5.0


def read_sdcli_help(path: str, timeout: float | None = None) -> str:
    """The ``--help`` text (stdout and stderr) of the sd-cli binary at ``path``, given
    ``timeout`` seconds (default :data:`HELP_TIMEOUT_S`).

    Raises:
        InvalidArgument: naming ``--sdcli`` and the path when it cannot be run or does not
            answer within ``timeout`` seconds.
    """
    import subprocess

    from sdplan.core.errors import InvalidArgument

    timeout = HELP_TIMEOUT_S if timeout is None else timeout
    try:
        proc = subprocess.run([path, "--help"], capture_output=True, text=True,
                              errors="replace", timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise InvalidArgument(f"--sdcli {path}: no such program") from None
    except PermissionError:
        raise InvalidArgument(f"--sdcli {path}: not executable") from None
    except subprocess.TimeoutExpired:
        raise InvalidArgument(f"--sdcli {path}: '--help' did not finish within {timeout:g} s; "
                              "name the dialect with --sdcli-dialect instead") from None
    except OSError as exc:
        raise InvalidArgument(f"--sdcli {path}: cannot run it ({exc.strerror or exc})") from None
    return proc.stdout + proc.stderr


def target_from_args(args: argparse.Namespace, command_dialect: str | None = None,
                     pasted: bool = False) -> Target:
    """What the plan is for (spec section 14): ``--sdcli-dialect`` names the sd-cli dialect;
    ``--sdcli PATH`` has its ``--help`` read (:func:`read_sdcli_help`,
    :func:`~sdplan.core.planning.target.dialect_from_help`; unknown: newest); a pasted
    command (``pasted``) is for sd-cli, in the dialect its own syntax shows
    (``command_dialect``) when neither flag names one; otherwise sdplan's engine.

    Raises:
        InvalidArgument: an ``--sdcli`` binary that cannot be run.
    """
    named = getattr(args, "sdcli_dialect", None)
    if named:
        return Target("sd-cli", named, True, "--sdcli-dialect")
    path = getattr(args, "sdcli_path", None)
    if path:
        found = dialect_from_help(read_sdcli_help(path))
        if found is None:
            return Target("sd-cli", "newest", False, f"{path} --help shows neither; newest assumed")
        return Target("sd-cli", found, True, f"{path} --help")
    if pasted:
        if command_dialect is not None:
            return Target("sd-cli", command_dialect, True, "the command's syntax")
        return Target("sd-cli", "newest", False, "assumed")
    return Target()
