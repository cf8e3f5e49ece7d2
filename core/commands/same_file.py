"""Inputs are never overwritten: every path a command writes is compared with every file it
reads before any work starts.

Two paths are the same file when they resolve to the same path after following links
(``os.path.realpath``: a link to the model, ``./model.png`` and ``model.png``), or when both
exist and share a device and inode (a hard link). An output that is an input is a one-line
:class:`~sdplan.core.errors.OutputError` naming both flags and the path; there is no option
to overwrite a model file, a LoRA, an upscaler or a picture input in place.

The inputs of ``sdplan generate``: every model-file flag (``-m``, ``--diffusion-model``,
``--t5xxl``, ``--clip_l``, ``--clip_g``, ``--llm``, ``--vae``, ``--taesd``,
``--upscale-model``), the LoRA files the prompt's ``<lora:NAME:W>`` tags name (found as the
engine finds them), ``-i/--init-img``, ``--mask``, each ``-r/--ref-image`` and
``--from-image``, ``--high-noise-diffusion-model``, ``--control-net`` and ``--control-image``
(checked whether or not the family runs them: the family check comes later); its outputs:
``-o`` (``NAME_N.png`` for a batch; for ``-M vid_gen`` the video file, or each PNG frame's
name up to ``--video-frames``) and the preview files ``preview_NNN.png`` in ``--preview-path``.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from sdplan.core.errors import OutputError, SdplanError
from sdplan.core.planning import paths

__all__ = ["same_file", "refuse_overwriting", "generate_inputs", "generate_outputs",
           "check_generate", "PREVIEW_NAME"]

#: The name of a preview file ``generate --preview-path`` writes (``preview_007.png``).
PREVIEW_NAME = re.compile(r"preview_\d{3,}\.png")

#: generate's model-file flags: namespace attribute -> the spelling messages use.
MODEL_FLAGS = {"model": "-m/--model", "diffusion_model": "--diffusion-model",
               "high_noise_diffusion_model": "--high-noise-diffusion-model", "t5xxl": "--t5xxl",
               "clip_l": "--clip_l", "clip_g": "--clip_g", "llm": "--llm", "vae": "--vae",
               "taesd": "--taesd", "upscale_model": "--upscale-model", "control_net": "--control-net"}


def _real(path: str | os.PathLike[str]) -> str:
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return os.path.abspath(path)


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name the same file: equal after resolving links, or both
    existing with the same device and inode (hard links).

    Raises:
        PathError: a path that cannot be examined (name too long, permission denied...).
    """
    if _real(a) == _real(b):
        return True
    sa, sb = paths.probe(a), paths.probe(b)
    return sa is not None and sb is not None and (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _in_folder(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """Whether the file ``path`` lies directly in ``folder`` (links resolved)."""
    parent = Path(_real(path)).parent
    return str(parent) == _real(folder) or same_file(parent, folder)


def refuse_overwriting(outputs: Iterable[tuple[str, str | os.PathLike[str]]],
                       inputs: Iterable[tuple[str, str | os.PathLike[str]]],
                       preview: tuple[str, str | os.PathLike[str]] | None = None,
                       preview_name: re.Pattern[str] = PREVIEW_NAME) -> None:
    """Refuse when an output is an input.

    Args:
        outputs: ``(flag, path)`` of every file the command will write.
        inputs: ``(flag, path)`` of every file it reads.
        preview: ``(flag, folder)`` where files named like ``preview_name`` are written.

    Raises:
        OutputError: ``"-o/--output 'm.png' is the same file as -m/--model 'm.png': sdplan
            never writes over an input; choose another output"``.
        PathError: a path that cannot be examined.
    """
    ins = [(flag, os.fspath(p)) for flag, p in inputs if p]
    for oflag, out in outputs:
        for iflag, src in ins:
            if same_file(out, src):
                raise OutputError(
                    f"{oflag} {os.fspath(out)!r} is the same file as {iflag} {src!r}: sdplan "
                    "never writes over an input; choose another output")
    if preview is not None and preview[1]:
        pflag, folder = preview
        for iflag, src in ins:
            if preview_name.fullmatch(Path(_real(src)).name) and _in_folder(src, folder):
                raise OutputError(
                    f"{pflag} {os.fspath(folder)!r} would write previews over {iflag} {src!r}: "
                    "sdplan never writes over an input; choose another preview folder")


def generate_inputs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(flag, path)`` of every file ``sdplan generate`` reads (module docstring); a LoRA
    tag whose file cannot be found is left to the check that reports it."""
    out = [(flag, str(getattr(args, attr))) for attr, flag in MODEL_FLAGS.items()
           if getattr(args, attr, None)]
    out += _lora_inputs(str(getattr(args, "prompt", None) or ""),
                        getattr(args, "lora_model_dir", None))
    for attr, flag in (("init_img", "-i/--init-img"), ("mask", "--mask"),
                       ("from_image", "--from-image"), ("control_image", "--control-image")):
        if getattr(args, attr, None):
            out.append((flag, str(getattr(args, attr))))
    out += [("-r/--ref-image", str(p)) for p in getattr(args, "ref_image", None) or ()]
    return out


def _lora_inputs(prompt: str, lora_dir: str | None) -> list[tuple[str, str]]:
    if "<lora:" not in prompt:
        return []
    from sdplan.core.modelfiles.lora import find_lora_file
    from sdplan.core.text.lora_tags import LORA_TAG_RE

    out = []
    for m in LORA_TAG_RE.finditer(prompt):
        try:
            out.append((f"<lora:{m.group(1)}:...>", str(find_lora_file(m.group(1), lora_dir))))
        except SdplanError:  # a missing file: the LoRA check names it
            continue
    return out


def generate_outputs(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """``(flag, path)`` of every picture ``sdplan generate`` writes: ``-o``, or for a batch
    ``NAME_0.png``, ``NAME_1.png``... (as :func:`sdplan.core.commands.generate.write_images`
    names them); for ``-M vid_gen`` the video file, or the names of PNG frames 0 to
    ``--video-frames`` - 1 (:func:`~sdplan.core.pipelines.stages.video.frame_paths`; Wan
    makes ``(frames - 1) // 4 * 4 + 1`` of them, so this may name a few more than it writes).

    Raises:
        OutputError: a video ``-o`` with an extension sdplan writes no video to.
    """
    if getattr(args, "mode", "img_gen") == "vid_gen":
        from sdplan.core.commands.video_flags import video_output
        from sdplan.core.pipelines.stages.video import frame_paths, video_kind

        video = video_output(args)
        if video_kind(video) != "frames":
            return [("-o/--output", video)]
        return [("-o/--output", p) for p in frame_paths(video, max(int(getattr(args, "video_frames", 1) or 1), 1))]
    out = Path(args.output)
    n = int(getattr(args, "batch_count", 1) or 1)
    if n <= 1:
        return [("-o/--output", out)]
    return [("-o/--output", out.with_name(f"{out.stem}_{i}{out.suffix or '.png'}")) for i in range(n)]


def check_generate(args: argparse.Namespace) -> None:
    """Refuse a ``sdplan generate`` command line whose outputs include one of its inputs
    (:func:`refuse_overwriting`). Raises OutputError or PathError."""
    preview = ("--preview-path", args.preview_path) if getattr(args, "preview_path", None) else None
    refuse_overwriting(generate_outputs(args), generate_inputs(args), preview)


def check_files(outputs: Sequence[tuple[str, str | os.PathLike[str]]],
                inputs: Sequence[tuple[str, str | os.PathLike[str]]]) -> None:
    """:func:`refuse_overwriting` for commands with plain output files (``upscale``,
    ``inspect --write-profile``, ``gui --screenshot``)."""
    refuse_overwriting([(f, p) for f, p in outputs if p], inputs)
