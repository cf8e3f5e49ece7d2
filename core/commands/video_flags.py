"""``sdplan generate``'s video flags (sd-cli's ``-M vid_gen``, ``--video-frames``, ``--fps``,
``--high-noise-diffusion-model`` and the high-noise phase's ``--high-noise-steps``,
``--high-noise-cfg-scale``, ``--high-noise-sampling-method``, ``--high-noise-eta``,
``--moe-boundary``), their request keys, and the video's output.

sd-cli's other high-noise flags (``--high-noise-guidance``, ``--high-noise-img-cfg-scale``,
the high-noise SLG flags) are not parsed here, so generate refuses them by name as it
refuses every sd-cli flag it does not run. Defaults are sd-cli's (``examples/common``): 1
frame, 16 fps, steps -1 (the boundary decides), CFG 7, boundary 0.875. The output: ``-o``
left at its default writes ``output.webm`` **[sdplan]** (sd-cli's default is ``output.avi``
in Motion JPEG; ``-o output.avi`` writes that too).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_video_arguments", "video_request", "video_frames", "video_notes", "video_output", "check_video_output",
           "write_video", "DEFAULT_VIDEO"]

#: The video ``-o`` left at its default writes.
DEFAULT_VIDEO = "output.webm"


def add_video_arguments(p: argparse.ArgumentParser) -> None:
    """Register the video flags on generate's parser."""
    g = p.add_argument_group("video (Wan)")
    g.add_argument("-M", "--mode", choices=("img_gen", "vid_gen"), default="img_gen",
                   help="img_gen: pictures (default); vid_gen: a video (Wan)")
    g.add_argument("--video-frames", type=int, default=1, help="video frames (default 1; Wan makes 4k+1)")
    g.add_argument("--fps", type=int, default=16, help="frames per second of the video file (default 16)")
    g.add_argument("--high-noise-diffusion-model", metavar="PATH",
                   help="Wan 2.2 A14B: the high-noise expert (--diffusion-model is the low-noise one)")
    g.add_argument("--high-noise-steps", type=int, default=-1,
                   help="steps of the high-noise expert (default -1: the --moe-boundary sigma decides)")
    g.add_argument("--high-noise-cfg-scale", type=float, default=7.0, help="CFG of the high-noise phase (default 7)")
    g.add_argument("--high-noise-sampling-method", help="sampler of the high-noise phase (default: --sampling-method)")
    g.add_argument("--high-noise-eta", type=float, help="eta of the high-noise phase")
    g.add_argument("--moe-boundary", type=float, default=0.875,
                   help="sigma below which the low-noise expert samples (default 0.875)")


def video_request(args: argparse.Namespace) -> dict[str, Any]:
    """The request keys of the video flags (sd-cli's names)."""
    return {"mode": getattr(args, "mode", "img_gen"), "video_frames": getattr(args, "video_frames", 1),
            "fps": getattr(args, "fps", 16), "high_noise_steps": getattr(args, "high_noise_steps", -1),
            "high_noise_cfg_scale": getattr(args, "high_noise_cfg_scale", 7.0),
            "high_noise_sampling_method": getattr(args, "high_noise_sampling_method", None),
            "high_noise_eta": getattr(args, "high_noise_eta", None),
            "moe_boundary": getattr(args, "moe_boundary", 0.875)}


def video_notes(args: argparse.Namespace) -> list[str]:
    """What the video flags change that the user may not expect: a frame count Wan rounds
    down to ``4k + 1`` (as sd-cli's Wan runner does)."""
    n = video_frames(args)
    made = (n - 1) // 4 * 4 + 1
    return [f"--video-frames {n}: Wan makes 4k+1 frames; {made} will be made"] if made != n else []


def video_frames(args: argparse.Namespace) -> int:
    """The video's frames: ``--video-frames`` under ``-M vid_gen``, 1 under another mode; a
    command without ``-M`` (``sdplan plan``) takes ``--video-frames`` as given."""
    return int(getattr(args, "video_frames", 1) or 1) if getattr(args, "mode", "vid_gen") == "vid_gen" else 1


def check_video_output(args: argparse.Namespace, frame_bytes: int) -> None:
    """Before any work: the video's ``-o`` (a video or PNG-frames path) is writable and its
    folder has room for ``frame_bytes`` (an upper bound of one frame's bytes) per frame.

    Raises:
        OutputError: naming ``-o/--output`` and the path.
    """
    from sdplan.core.pipelines.stages.outputs import check_output_file
    from sdplan.core.pipelines.stages.video import frame_paths, video_kind

    out = video_output(args)
    first = frame_paths(out, 1)[0] if video_kind(out) == "frames" else out  # a path that will be written
    check_output_file("-o/--output", str(first), (".png", ".webm", ".mp4", ".avi"),
                      needed_bytes=frame_bytes * video_frames(args))


def video_output(args: argparse.Namespace) -> Path:
    """The path ``-o`` names for a video (``output.webm`` when it is left at its default).

    Raises:
        OutputError: an extension sdplan writes no video to (or a printf-style name with a
            video extension: :func:`~sdplan.core.pipelines.stages.video.video_kind`).
    """
    from sdplan.core.pipelines.stages.video import video_kind

    defaults = getattr(args, "parser_defaults", {}) or {}
    out = Path(DEFAULT_VIDEO if args.output == defaults.get("output", "output.png") else args.output)
    video_kind(out)
    return out


def write_video(res: dict[str, Any], out: Path, text: dict[str, str], console: Any) -> int:
    """Write the run's frames as the video ``out`` (its container's metadata carrying the
    run's text where the format keeps it) or PNG frames (each with the run's text), and print
    the path(s) on stdout. Returns 0, or 2 when ``out`` could not be written: the error is
    said in one line and the frames are kept as PNG pictures (:func:`keep_frames`), their
    paths said too, so a finished run is never lost to a full disk or a failing encoder."""
    from sdplan.core.errors import SdplanError
    from sdplan.core.pipelines.stages.results import save_png
    from sdplan.core.pipelines.stages.video import frame_paths, save_video, video_kind

    frames = list(res["images"])
    fps = int((res.get("params") or {}).get("video", {}).get("fps") or 16)
    try:
        if video_kind(out) == "frames":
            for i, (img, path) in enumerate(zip(frames, frame_paths(out, len(frames)), strict=True)):
                save_png(img, path, text | {"frame_index": str(i)})
                print(path, file=sys.stdout)
            return 0
        save_video(frames, out, fps, text)
    except (OSError, SdplanError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        console.print(f"error [output_unwritable]: cannot write {str(out)!r} ({why})",
                      highlight=False, markup=False, soft_wrap=True)
        kept = keep_frames(frames, out, text)
        console.print(f"  the {len(frames)} frames are kept as PNG pictures: {kept[0]} .. {kept[-1]}" if kept else
                      "  the frames could not be kept either", highlight=False, markup=False, soft_wrap=True)
        return 2
    print(out, file=sys.stdout)
    return 0


def keep_frames(frames: list[Any], out: Path, text: dict[str, str]) -> list[Path]:
    """Save ``frames`` (uint8 ``(H, W, 3)``) as PNG pictures (``NAME_0.png``.. after ``out``'s
    name, each with the run's ``text``) beside ``out`` when none of those names exists and the
    folder takes them, else in a new folder under the system's temporary folder. Returns the
    paths written, [] when neither place took them."""
    import tempfile

    from sdplan.core.pipelines.stages.results import save_png
    from sdplan.core.pipelines.stages.video import frame_paths

    name = out.with_suffix(".png").name.replace("%", "_")
    beside = frame_paths(out.with_name(name), len(frames))
    places: list[Callable[[], list[Path]]] = [] if any(p.exists() for p in beside) else [lambda: beside]
    places.append(lambda: frame_paths(Path(tempfile.mkdtemp(prefix="sdplan-frames-")) / name, len(frames)))
    for place in places:
        written: list[Path] = []
        try:
            for k, (img, path) in enumerate(zip(frames, place(), strict=True)):
                save_png(img, path, text | {"frame_index": str(k)})
                written.append(path)
            return written
        except OSError:
            for path in written:
                path.unlink(missing_ok=True)
    return []
