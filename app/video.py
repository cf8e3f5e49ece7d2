"""Videos in the app: the generation panel's video settings (frames as 4k+1, frames per
second; shown only for a family that makes video, as the family registry says), the player
(frames decoded with PyAV and shown in turn by a QTimer at the file's frame rate, with
play/pause; no Qt Multimedia), a finished run written as a WebM carrying its record, the first
frame with a "video" badge as the gallery's and today's strip's thumbnail, and the gallery's
viewer of a video.

A video's record is the one a picture carries (``parameters`` and ``sdplan``,
:func:`~sdplan.core.pipelines.stages.results.picture_text`), in the WebM's Matroska tags
(:func:`~sdplan.core.pipelines.stages.video.save_video`), and beside it the gallery's index
``<name>.json`` with the full model paths, as for a picture
(:func:`~sdplan.core.pipelines.stages.results.index_record`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QRect, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QFont, QImage, QPainter, QPixmap
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)
from sdplan.app.pictures import to_qimage, uint8_picture
from sdplan.core.families import family_of
from sdplan.core.families.options import VIDEO
from sdplan.core.pipelines.stages.outputs import atomic_write
from sdplan.core.pipelines.stages.video import first_frame, is_video_file, read_video, save_video

__all__ = ["VIDEO_SUFFIXES", "is_video_file", "makes_video", "snap_frames", "VideoFields",
           "VideoPlayer", "VideoViewer", "decode_video", "video_thumbnail", "write_video_result"]

#: The video files the gallery and today's strip list (the extensions sdplan writes).
VIDEO_SUFFIXES = (".webm", ".mp4", ".avi")
#: The video a run in the app writes (the command line's default, ``output.webm``).
APP_VIDEO_SUFFIX = ".webm"
#: sd-cli's defaults (``examples/common``): the frame rate of ``--fps``; the panel's first
#: frame count is the smallest video the Wan autoencoder makes from more than one latent frame.
DEFAULT_FPS = 16
DEFAULT_FRAMES = 5
#: The most frames the panel takes (Wan 2.x is trained on 81: 5 s at 16 fps).
MAX_FRAMES = 1001


def makes_video(architecture: str | None) -> bool:
    """Whether the family of ``architecture`` makes video (it honours ``-M vid_gen``,
    :data:`sdplan.core.families.options.VIDEO`, in the family registry)."""
    fam = family_of(architecture)
    return fam is not None and fam.honours(VIDEO)


def snap_frames(n: int) -> int:
    """The frame count nearest ``n`` of the form 4k+1 (the Wan autoencoder makes 1 frame from
    the first latent frame and 4 from each further one), at least 1; a tie goes up."""
    return max(1, 4 * int((max(int(n), 1) - 1 + 2) // 4) + 1)


class FramesBox(QSpinBox):
    """A spin box of 4k+1 frames: the arrows step by 4, a typed count snaps to 4k+1."""

    def __init__(self) -> None:
        super().__init__()
        self.setRange(1, MAX_FRAMES)
        self.setSingleStep(4)
        self.setKeyboardTracking(False)

    def valueFromText(self, text: str) -> int:  # noqa: N802 - Qt's name
        try:
            return min(snap_frames(int(text.strip() or "1")), MAX_FRAMES)
        except ValueError:
            return self.value()


class VideoFields(QWidget):
    """The panel's video row: frames (4k+1) and frames per second. Visible only while the
    open family makes video (:meth:`set_family`); :meth:`settings` gives sd-cli's request keys
    (``mode`` ``vid_gen``, ``video_frames``, ``fps``), all None for other families."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(8)
        label = QLabel("Video")
        label.setToolTip("-M vid_gen: the model makes a video")
        row.addWidget(label)
        self.frames = FramesBox()
        self.frames.setValue(DEFAULT_FRAMES)
        self.frames.setSuffix(" frames")
        self.frames.setToolTip("--video-frames: 4k+1 frames (1, 5, 9, ... 81)")
        self.fps = QSpinBox()
        self.fps.setRange(1, 120)
        self.fps.setValue(DEFAULT_FPS)
        self.fps.setSuffix(" fps")
        self.fps.setKeyboardTracking(False)
        self.fps.setToolTip("--fps: frames per second of the video file")
        row.addWidget(self.frames, 1)
        row.addWidget(self.fps, 1)
        self.active = False
        self.frames.valueChanged.connect(lambda *_: self.changed.emit())
        self.fps.valueChanged.connect(lambda *_: self.changed.emit())
        self.hide()

    def set_family(self, architecture: str | None) -> None:
        """Show the row when the family of ``architecture`` makes video, hide it otherwise."""
        self.active = makes_video(architecture)
        self.setVisible(self.active)

    def settings(self) -> dict[str, Any]:
        """``mode``, ``video_frames`` and ``fps`` (sd-cli's request keys); None each when the
        family makes no video (the request then has sd-cli's defaults)."""
        if not self.active:
            return {"mode": None, "video_frames": None, "fps": None}
        return {"mode": "vid_gen", "video_frames": self.frames.value(), "fps": self.fps.value()}

    def load(self, g: Mapping[str, Any]) -> None:
        """Show the frames and frame rate of settings ``g`` (absent: kept as they are)."""
        if g.get("video_frames"):
            self.frames.setValue(snap_frames(int(g["video_frames"])))
        if g.get("fps"):
            self.fps.setValue(int(g["fps"]))


def decode_video(path: str | Path) -> tuple[list[QImage], float]:
    """Every frame of a video file as QImages and its frame rate (frames per second; 0 when
    the container does not say), decoded with PyAV
    (:func:`~sdplan.core.pipelines.stages.video.read_video`).

    Raises:
        OSError: the file cannot be read or is no video.
    """
    import av

    try:
        frames, fps = read_video(path)
    except av.FFmpegError as exc:
        raise OSError(f"{path}: not a readable video ({exc})") from None
    return [to_qimage(f) for f in frames], fps


def paint_badge(image: QImage) -> QImage:
    """``image`` (a copy) with a small "video" badge in its lower left corner."""
    out = image.convertToFormat(QImage.Format.Format_ARGB32)
    p = QPainter(out)
    font = QFont()
    font.setPixelSize(max(9, out.height() // 8))
    font.setBold(True)
    p.setFont(font)
    text = "▶ video"
    w = p.fontMetrics().horizontalAdvance(text) + 8
    h = p.fontMetrics().height() + 2
    box = QRect(3, out.height() - h - 3, w, h)
    p.fillRect(box, QColor(0, 0, 0, 170))
    p.setPen(QColor(255, 255, 255))
    p.drawText(box, Qt.AlignmentFlag.AlignCenter, text)
    p.end()
    return out


def video_thumbnail(path: str | Path, side: int) -> QImage:
    """The first frame of a video file scaled into ``side`` x ``side`` (aspect kept) with the
    "video" badge (:func:`paint_badge`); a null image when it cannot be decoded (safe off the
    GUI thread)."""
    try:
        frame, _, _ = first_frame(path)
    except OSError:
        return QImage()
    img = to_qimage(frame).scaled(side, side, Qt.AspectRatioMode.KeepAspectRatio,
                                  Qt.TransformationMode.SmoothTransformation)
    return paint_badge(img)


class VideoPlayer(QWidget):
    """Play/pause and the frame counter of a video whose frames are shown by ``show`` (the
    panel's picture area, the viewer's label): a QTimer at the video's frame rate advances
    :attr:`index` and loops. Hidden while it holds no video.

    Signals:
        frameChanged(int): the index of the frame just shown.
    """

    frameChanged = Signal(int)

    def __init__(self, show: Callable[[QImage], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._show = show
        self.frames: list[QImage] = []
        self.fps = float(DEFAULT_FPS)
        self.index = 0
        self.path: str | None = None
        self.timer = QTimer(self)
        self.timer.timeout.connect(self._advance)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        self.play_btn = QPushButton("Pause")
        self.play_btn.setToolTip("Play or pause the video")
        self.play_btn.clicked.connect(self.toggle)
        row.addWidget(self.play_btn)
        self.counter = QLabel()
        self.counter.setObjectName("Caption")
        row.addWidget(self.counter, 1)
        self.hide()

    def set_frames(self, frames: Sequence[QImage], fps: float, play: bool = True,
                   path: str | None = None) -> None:
        """Hold ``frames`` at ``fps`` frames per second (0 or less: sd-cli's 16), show the
        first and play when ``play``."""
        self.timer.stop()
        self.frames = list(frames)
        self.fps = float(fps) if fps and fps > 0 else float(DEFAULT_FPS)
        self.path = path
        self.index = 0
        self.timer.setInterval(max(1, round(1000.0 / self.fps)))
        self.setVisible(bool(self.frames))
        if self.frames:
            self._show_frame()
            if play:
                self.play()
            else:
                self.pause()

    def load(self, path: str | Path, play: bool = True) -> None:
        """Decode the video file ``path`` (:func:`decode_video`) and hold it.

        Raises:
            OSError: the file cannot be read or is no video.
        """
        frames, fps = decode_video(path)
        self.set_frames(frames, fps, play, str(path))

    def is_playing(self) -> bool:
        return self.timer.isActive()

    def play(self) -> None:
        if self.frames:
            self.timer.start()
            self.play_btn.setText("Pause")

    def pause(self) -> None:
        self.timer.stop()
        self.play_btn.setText("Play")

    def toggle(self) -> None:
        """Pause a playing video, play a paused one."""
        if self.is_playing():
            self.pause()
        else:
            self.play()

    def clear(self) -> None:
        """Stop and drop the video (a new run's previews take the picture area)."""
        self.timer.stop()
        self.frames, self.path, self.index = [], None, 0
        self.hide()

    def _advance(self) -> None:
        if self.frames:
            self.index = (self.index + 1) % len(self.frames)
            self._show_frame()

    def _show_frame(self) -> None:
        self._show(self.frames[self.index])
        self.counter.setText(f"frame {self.index + 1}/{len(self.frames)} · {self.fps:g} fps")
        self.frameChanged.emit(self.index)


class VideoViewer(QDialog):
    """A video of the gallery, playing in a loop, with its details (rich text)."""

    def __init__(self, path: str, details: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle(Path(path).name)
        lay = QVBoxLayout(self)
        self.image = QLabel()
        self.image.setAlignment(Qt.AlignmentFlag.AlignCenter)
        lay.addWidget(self.image, 1)
        self.player = VideoPlayer(lambda img: self.image.setPixmap(QPixmap.fromImage(img)), self)
        lay.addWidget(self.player)
        text = QLabel(details)
        text.setWordWrap(True)
        text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(text)
        try:
            self.player.load(path)
        except OSError as exc:
            self.image.setText(str(exc))
        first = self.player.frames[0] if self.player.frames else None
        if first is not None:
            self.resize(min(max(first.width(), 320) + 60, 1400), min(first.height() + 200, 1000))


def write_video_result(folder: Path, frames: Sequence[Any], record: Mapping[str, Any],
                       model_files: Mapping[str, Any], fps: int,
                       saved: Callable[[Path], None] = lambda path: None) -> Path:
    """Save a run's frames (uint8 ``(H, W, 3)`` arrays) in ``folder`` as
    ``<date-time>-video.webm`` at ``fps`` frames per second (never over an existing file),
    carrying the record's text (:func:`~sdplan.core.pipelines.stages.results.picture_text`) in
    its metadata, and beside it the gallery's index ``<name>.json`` with the full paths; both
    written atomically. ``saved`` is called with the video's path. Returns the path.

    Raises:
        OSError: the folder or a file cannot be written.
        OutputError: no frames, or the VP9 encoder is missing from PyAV's FFmpeg.
    """
    from sdplan.core.pipelines.stages.results import index_record, picture_text

    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path, n = folder / f"{stamp}-video{APP_VIDEO_SUFFIX}", 1
    while path.exists():  # a queue can finish two jobs within a second
        path, n = folder / f"{stamp}-video-{n}{APP_VIDEO_SUFFIX}", n + 1
    save_video([uint8_picture(f) for f in frames], path, int(fps), picture_text(record, model_files))
    index = json.dumps(index_record(record["params"], model_files), indent=1, default=str)
    atomic_write(path.with_suffix(".json"), lambda tmp: tmp.write_text(index))
    saved(path)
    return path
