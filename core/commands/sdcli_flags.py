"""``sdplan generate`` and sd-cli's full argument table: the sampling options sdplan's
engine implements (``--eta``, ``--sigmas``, ``--flow-shift``, ``--timestep-shift``,
``--rng``, ``--sampler-rng``, ``--extra-sample-args``; SD3's skip-layer guidance ``--slg-scale``,
``--skip-layers``, ``--skip-layer-start``, ``--skip-layer-end``), settings taken from a PNG
(``--from-image``), and one clear line for everything else a pasted sd-cli command may hold.

:func:`refuse_unsupported` looks at the arguments argparse did not take: sd-cli options that
only tune sd-cli's own execution without changing the picture (:data:`NO_EFFECT`: flash
attention, direct convolutions, memory mapping, eager loading, log verbosity) are accepted
with a note; every other sd-cli option (:mod:`sdplan.core.planning.sdcli_table`) and every
argument sd-cli does not know either is refused, all of them named in one line.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sdplan.core.errors import SdplanError

__all__ = ["NO_EFFECT", "add_sampling_arguments", "sampling_request", "refuse_unsupported",
           "apply_from_image"]

#: sd-cli options that change how sd-cli runs, not what it draws; generate accepts and
#: ignores them (sdplan's engine chooses its own kernels and loads as the plan says).
NO_EFFECT = frozenset({"--verbose", "--color", "--mmap", "--eager-load", "--fa",
                       "--diffusion-fa", "--diffusion-conv-direct", "--vae-conv-direct"})


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """Add sd-cli's sampling options the engine implements, and ``--from-image``."""
    g = p.add_argument_group("sampling (as sd-cli spells it)")
    g.add_argument("--eta", type=float, help="noise amount (default: the sampler's, as sd-cli)")
    g.add_argument("--sigmas", metavar="S0,S1,...", help="custom sigma schedule (replaces "
                   "--scheduler; a final 0 is added)")
    g.add_argument("--flow-shift", type=float, help="flow models' timestep shift")
    g.add_argument("--timestep-shift", type=int, default=0,
                   help="SDXL (NitroFusion): shift timesteps to N/1000 of themselves")
    g.add_argument("--rng", default="cuda", help="cuda (default), cpu or std_default")
    g.add_argument("--sampler-rng", help="the sampler's generator (default: --rng)")
    g.add_argument("--extra-sample-args", action="append", default=[], metavar="K=V,...",
                   help="sampler/scheduler arguments (lms_max_order, gamma, alpha...)")
    slg = p.add_argument_group("skip-layer guidance (SD3 / SD3.5, as sd-cli spells it)")
    slg.add_argument("--slg-scale", type=float, help="skip-layer guidance scale (default 0: off; "
                     "2.5 suits SD3.5 medium)")
    slg.add_argument("--skip-layers", metavar="[7,8,9]", help="MMDiT blocks the guidance pass skips "
                     "(default [7,8,9])")
    slg.add_argument("--skip-layer-start", type=float, help="SLG starts after this fraction of the "
                     "steps (default 0.01)")
    slg.add_argument("--skip-layer-end", type=float, help="SLG stops at this fraction of the steps "
                     "(default 0.2)")
    p.add_argument("--from-image", metavar="PNG",
                   help="take prompt, settings, model files and placement from a PNG's "
                        "parameters (sd-cli's or sdplan's); flags given here win")
    p.set_defaults(refuse_extras=refuse_unsupported)


def sampling_request(args: argparse.Namespace) -> dict[str, Any]:
    """The engine request keys of the sampling options
    (:meth:`~sdplan.core.sampling.options.SamplingOptions.from_request`).

    Raises:
        SdplanError: a malformed ``--sigmas`` / ``--extra-sample-args`` or unknown rng (the
            sampling error's one line); InvalidArgument: malformed ``--skip-layers`` or SLG
            numbers.
    """
    from sdplan.core.sampling.options import SamplingOptions, parse_key_values, parse_sigmas
    from sdplan.core.sampling.slg import SkipLayerGuidance

    req: dict[str, Any] = {"eta": args.eta, "flow_shift": args.flow_shift,
                           "timestep_shift": args.timestep_shift, "rng": args.rng,
                           "sampler_rng": args.sampler_rng}
    if args.sigmas:
        req["sigmas"] = list(parse_sigmas(args.sigmas))
    extra: dict[str, str] = {}
    for text in args.extra_sample_args or []:
        extra.update(parse_key_values(text))
    req["extra_sample_args"] = extra
    SamplingOptions.from_request(req)  # checks the names now, before any work
    req |= SkipLayerGuidance.from_request({  # checks the SLG values too
        "slg_scale": getattr(args, "slg_scale", None), "skip_layers": getattr(args, "skip_layers", None),
        "skip_layer_start": getattr(args, "skip_layer_start", None),
        "skip_layer_end": getattr(args, "skip_layer_end", None)}).to_request()
    return req


def _is_file(path: str) -> bool:
    """Whether a path a picture records is a file here (a name too long: no)."""
    from sdplan.core.planning import paths

    try:
        return paths.is_file(path)
    except OSError:
        return False


def refuse_unsupported(args: argparse.Namespace, extras: list[str]) -> list[str]:
    """Check the arguments argparse left over; returns notes for the accepted ones
    (:data:`NO_EFFECT`).

    Raises:
        SdplanError: one line naming every sd-cli option generate does not implement and
            every argument that is no sd-cli option either.
    """
    if not extras:
        return []
    from sdplan.core.planning.sdcli import parse_sdcli_args  # sd-cli's flag table

    try:
        parsed = parse_sdcli_args(list(extras))
    except SdplanError as exc:
        raise SdplanError(f"cannot read the arguments {' '.join(extras)}: {exc}") from None
    ignored, refused, unknown = [], [], []
    for a in parsed:
        if not a.known:
            unknown.append(" ".join(a.tokens))
        elif a.flag in NO_EFFECT:
            ignored.append(a.spelling)
        elif a.flag == "--mode" and a.values == ("img_gen",):
            ignored.append("-M img_gen")
        else:
            refused.append(a.spelling)
    parts = []
    if refused:
        parts.append(f"generate does not run these sd-cli options: {', '.join(refused)}")
    if unknown:
        parts.append(f"not sd-cli options: {', '.join(unknown)}")
    if parts:
        raise SdplanError("; ".join(parts) + " (sdplan plan --command keeps them in the "
                          "written sd-cli command)")
    return [f"{', '.join(ignored)}: no effect on sdplan's engine (it chooses its own kernels "
            "and loading)"] if ignored else []


def _as_flag_value(key: str, value: Any) -> Any:
    """A recorded setting as its flag's parsed value: ``--sigmas`` and ``--skip-layers`` text,
    ``--extra-sample-args`` as the list of ``K=V,...`` texts argparse collects."""
    if key == "sigmas" and not isinstance(value, str):
        return ",".join(f"{float(v):g}" for v in value)
    if key == "extra_sample_args" and isinstance(value, dict):
        return [",".join(f"{k}={v}" for k, v in value.items())] if value else []
    if key == "extra_sample_args" and isinstance(value, str):
        return [value]
    if key == "skip_layers" and not isinstance(value, str):
        return "[" + ",".join(str(int(v)) for v in value) + "]"
    return value


def apply_from_image(args: argparse.Namespace, parser_defaults: dict[str, Any]) -> str | None:
    """With ``--from-image PNG``: fill every setting the command line left at its default
    from the PNG's parameters (:func:`sdplan.core.pipelines.stages.results.reusable_settings`,
    what the app's "Reuse settings" takes too): the prompts, size, steps, CFG, guidance where
    the family takes it, seed, sampler, scheduler, clip skip, the sampling and SLG options,
    LoRA folder and picture inputs (found beside the picture or in the current folder), the
    model files (sdplan's own PNGs name them by file name: found as they are, beside the
    picture, in the current folder or among the model library's files) and the placement
    strings. Returns a note of what was taken, or None without
    ``--from-image``.

    Raises:
        SdplanError: the PNG cannot be read or holds no generation parameters.
    """
    path = getattr(args, "from_image", None)
    if not path:
        return None
    from sdplan.core.pipelines.stages.results import (
        locate_inputs,
        locate_model_files,
        read_generation,
        reusable_settings,
    )

    try:
        got = read_generation(path)
    except OSError as exc:
        raise SdplanError(f"--from-image {path}: {exc.strerror or exc}") from None
    if not got.settings and not got.model_files:
        raise SdplanError(f"--from-image {path}: no generation parameters in this PNG")
    taken = []
    for key, value in locate_inputs(reusable_settings(got), path).items():
        if not hasattr(args, key):
            continue
        current = getattr(args, key)
        if current is None or current == parser_defaults.get(key) or (
                key == "prompt" and not current):
            setattr(args, key, _as_flag_value(key, value))
            taken.append(key)
    if not (getattr(args, "model", None) or getattr(args, "diffusion_model", None)):
        # every model file the record names, by its name: beside the picture, in the current
        # folder or in the model library (its SHA-256 first when the picture records it)
        found = locate_model_files(got.model_files, path, sha256=got.model_hash)
        for key, paths in found.items():
            if hasattr(args, key) and not getattr(args, key, None):
                setattr(args, key, paths[0])
                taken.append(key)
        lost = [Path(p).name for k, v in got.model_files.items() if k not in found for p in v]
        if lost and not (getattr(args, "model", None) or getattr(args, "diffusion_model", None)):
            raise SdplanError(f"--from-image {path}: the model file {', '.join(lost)} is not "
                              "beside the picture, in the current folder or in the model "
                              "library; give it with -m or --diffusion-model")
    for key in ("backend", "params_backend", "max_vram", "split_mode"):
        value = got.placement.get(key)
        if value and hasattr(args, key) and not getattr(args, key, None):
            setattr(args, key, [value] if key != "split_mode" else value)
            taken.append(key)
    servers = got.placement.get("rpc_servers")
    if servers and hasattr(args, "rpc_servers") and not getattr(args, "rpc_servers", None):
        args.rpc_servers = servers
        taken.append("rpc_servers")
    return f"from {path}: {', '.join(taken) if taken else 'nothing (the command line gives all)'}"
