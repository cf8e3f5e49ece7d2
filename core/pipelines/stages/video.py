"""Writing a generated video: a file people open (WebM with VP9, MP4 with H.264, AVI with
Motion JPEG, through PyAV, the maintained FFmpeg bindings), or its frames as PNG pictures on
request.

sd-cli's ``-M vid_gen`` writes ``.avi``, ``.webm`` or animated ``.webp`` by the output's
extension, and a picture sequence for a printf-style name (``frames_%03d.png``); sdplan writes
``.webm`` (VP9, yuv420p), ``.mp4`` (H.264, yuv420p, ``+faststart``) and ``.avi`` (MJPEG), and
PNG frames for a ``.png`` name, printf-style (``frames_%03d.png``) or not (``name_N.png``); a
printf-style name with a video extension is refused (its frames are pictures). Frames whose sides are
odd are padded by one row or column of their edge (yuv420p needs even sides). The file is
written beside its final name and renamed, so a failed write leaves nothing half-written.

A video carries its run's record as a picture does (the ``parameters`` and ``sdplan`` text of
:func:`~sdplan.core.pipelines.stages.results.picture_text`) in the container's metadata: Matroska
tags in WebM, ``use_metadata_tags`` atoms in MP4 (FFmpeg's ``movflags``); AVI's INFO list holds
no such keys, so an AVI carries none (:func:`read_video_text` reads them back).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np
from sdplan.core.errors import OutputError

__all__ = ["VIDEO_FORMATS", "is_frame_pattern", "is_video_file", "video_kind", "frame_paths", "save_video",
           "read_video", "read_video_text", "first_frame"]

#: Extension -> (container format, codec, pixel format) of the video files sdplan writes.
VIDEO_FORMATS = {".webm": ("webm", "libvpx-vp9", "yuv420p"), ".mp4": ("mp4", "libx264", "yuv420p"),
                 ".avi": ("avi", "mjpeg", "yuvj420p")}
_PATTERN = re.compile(r"%0?\d*d")


def is_frame_pattern(path: str | Path) -> bool:
    """Whether ``path`` is a printf-style picture sequence (``frames_%03d.png``)."""
    return bool(_PATTERN.search(Path(path).name))


def is_video_file(path: str | Path) -> bool:
    """Whether ``path`` names a video file sdplan writes and reads (:data:`VIDEO_FORMATS`)."""
    return Path(path).suffix.lower() in VIDEO_FORMATS


def video_kind(path: str | Path) -> str:
    """``frames`` (PNG pictures: a ``.png`` name, printf-style or not) or the video extension of
    ``path``.

    Raises:
        OutputError: an extension sdplan writes no video to, or a printf-style name with a
            video extension (its frames would be PNG pictures under that extension).
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".png":
        return "frames"
    if suffix in VIDEO_FORMATS and is_frame_pattern(p):
        raise OutputError(f"-o {str(p)!r}: a printf-style name writes the frames as PNG pictures; end it in .png "
                          f"(such as frames_%03d.png), or name one {suffix} video without %d")
    if suffix in VIDEO_FORMATS:
        return suffix
    raise OutputError(f"-o {str(p)!r}: a video is written as {', '.join(VIDEO_FORMATS)} or PNG frames "
                      "(a .png or printf-style name such as frames_%03d.png)")


def frame_paths(path: str | Path, n: int) -> list[Path]:
    """The PNG paths of ``n`` frames: the printf pattern filled with 0, 1, ... or
    ``name_N.png`` beside a ``.png`` name."""
    p = Path(path)
    if is_frame_pattern(p):
        spec = _PATTERN.search(p.name)
        assert spec is not None
        return [p.with_name(p.name[:spec.start()] + spec.group(0) % i + p.name[spec.end():]) for i in range(n)]
    return [p.with_name(f"{p.stem}_{i}.png") for i in range(n)]


def _even(frame: np.ndarray) -> np.ndarray:
    h, w = frame.shape[:2]
    return np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge") if h % 2 or w % 2 else frame


def save_video(frames: Sequence[np.ndarray], path: str | Path, fps: int,
               text: Mapping[str, str] | None = None) -> Path:
    """Write uint8 frames ``(H, W, 3)`` to ``path`` (its extension picks the format,
    :data:`VIDEO_FORMATS`) at ``fps`` frames per second, with ``text`` (the run's record: key
    -> text) in the container's metadata where the format keeps it (WebM, MP4; see the
    module docstring); returns the path.

    Raises:
        OutputError: no frames, an unknown extension, PyAV missing or its codec absent.
        OSError: the file cannot be written.
    """
    import av  # PyAV: loaded when a video is written

    out = Path(path)
    kind = video_kind(out)
    if kind == "frames" or not frames:
        raise OutputError(f"-o {str(out)!r}: no video to write ({len(frames)} frames, {kind})")
    fmt, codec, pix = VIDEO_FORMATS[kind]
    tmp = out.with_name(f".{out.name}.part")
    try:
        opts = {"movflags": "+faststart+use_metadata_tags"} if fmt == "mp4" else {}
        with av.open(str(tmp), mode="w", format=fmt, options=opts) as box:
            if fmt != "avi":
                for key, value in (text or {}).items():
                    box.metadata[key] = value
            stream = box.add_stream(codec, rate=Fraction(int(fps), 1))
            first = _even(np.asarray(frames[0]))
            stream.height, stream.width = first.shape[:2]
            stream.pix_fmt = pix
            if codec == "libvpx-vp9":
                stream.options = {"crf": "15", "b:v": "0"}
            elif codec == "libx264":
                stream.options = {"crf": "18", "preset": "medium"}
            for frame in frames:
                vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(_even(np.asarray(frame, np.uint8))), format="rgb24")
                for packet in stream.encode(vf):
                    box.mux(packet)
            for packet in stream.encode():
                box.mux(packet)
        os.replace(tmp, out)
    except av.FFmpegError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"-o {str(out)!r}: the {codec} encoder failed: {exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def read_video(path: str | Path) -> tuple[list[np.ndarray], float]:
    """The frames (uint8 ``(H, W, 3)``) and frame rate of a video file (what a player sees)."""
    import av

    with av.open(str(path)) as box:
        stream = box.streams.video[0]
        rate = float(stream.average_rate or stream.base_rate or 0)
        return [f.to_ndarray(format="rgb24") for f in box.decode(stream)], rate


def read_video_text(path: str | Path) -> dict[str, str]:
    """The text a video file carries in its container's metadata (:func:`save_video`'s
    ``text``), keys lower-cased (Matroska writes them upper-case); FFmpeg's own keys
    (``encoder``, ``major_brand``...) come along.

    Raises:
        OSError: the file cannot be read or is no video FFmpeg opens.
    """
    import av

    try:
        with av.open(str(path)) as box:
            if not box.streams.video:
                raise OSError(f"{path}: no video stream")
            return {str(k).lower(): str(v) for k, v in box.metadata.items()}
    except av.FFmpegError as exc:
        raise OSError(f"{path}: not a readable video ({exc})") from None


def first_frame(path: str | Path) -> tuple[np.ndarray, float, int]:
    """The first frame of a video file (uint8 ``(H, W, 3)``), its frame rate (frames per
    second; 0 when the container does not say) and its frame count (0 when not recorded).

    Raises:
        OSError: the file cannot be read, is no video or has no frame.
    """
    import av

    try:
        with av.open(str(path)) as box:
            if not box.streams.video:
                raise OSError(f"{path}: no video stream")
            stream = box.streams.video[0]
            rate = float(stream.average_rate or stream.base_rate or 0)
            for frame in box.decode(stream):
                return frame.to_ndarray(format="rgb24"), rate, int(stream.frames or 0)
    except av.FFmpegError as exc:
        raise OSError(f"{path}: not a readable video ({exc})") from None
    raise OSError(f"{path}: a video without frames")
