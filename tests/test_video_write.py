"""Writing a finished video (:func:`sdplan.core.commands.video_flags.write_video`): when the
video cannot be written (a failing encoder, a full disk), the error is one line and the frames
are kept as PNG pictures, beside the output when their names are free, else in a temporary
folder; the user's files are never overwritten."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from rich.console import Console
from sdplan.core.commands import video_flags
from sdplan.core.errors import OutputError
from sdplan.core.pipelines.stages import video


def frames() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (16, 24, 3), dtype=np.uint8) for _ in range(3)]


def failing(*_: object, **__: object) -> None:
    raise OutputError("-o 'clip.webm': the libvpx-vp9 encoder failed: no space left")


def run(out: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[str]]:
    monkeypatch.setattr(video, "save_video", failing)
    buf = io.StringIO()
    rc = video_flags.write_video({"images": frames(), "params": {"video": {"fps": 8}}}, out,
                                 {"prompt": "a cat"}, Console(file=buf, width=300))
    return rc, buf.getvalue().splitlines()


def test_a_video_that_cannot_be_written_keeps_its_frames_beside_it(tmp_path: Path, monkeypatch) -> None:
    rc, lines = run(tmp_path / "clip.webm", monkeypatch)
    assert rc == 2 and not (tmp_path / "clip.webm").exists()
    kept = [tmp_path / f"clip_{i}.png" for i in range(3)]
    assert lines == [f"error [output_unwritable]: cannot write {str(tmp_path / 'clip.webm')!r} (-o 'clip.webm': "
                     "the libvpx-vp9 encoder failed: no space left)",
                     f"  the 3 frames are kept as PNG pictures: {kept[0]} .. {kept[2]}"]
    for f, path in zip(frames(), kept, strict=True):
        with Image.open(path) as im:
            assert np.array_equal(np.asarray(im.convert("RGB")), f) and im.text["prompt"] == "a cat"


def test_frames_never_overwrite_the_users_files(tmp_path: Path, monkeypatch) -> None:
    mine = tmp_path / "clip_1.png"
    mine.write_bytes(b"the user's picture")
    rc, lines = run(tmp_path / "clip.webm", monkeypatch)
    assert rc == 2 and mine.read_bytes() == b"the user's picture"
    first = Path(lines[1].split(": ")[1].split(" .. ")[0])
    assert first.parent != tmp_path and first.name == "clip_0.png" and first.parent.name.startswith("sdplan-frames-")
    with Image.open(first) as im:
        assert np.array_equal(np.asarray(im.convert("RGB")), frames()[0])
