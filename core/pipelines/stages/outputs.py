"""Output files: checked before any work, written atomically, kept when a write fails late.

- :func:`check_output_file` / :func:`check_output_folder`: a location is usable when its
  folder exists or can be created, a file can really be created there (a probe file, so a
  read-only file system counts even for root, for whom permission bits do not) and the
  file system has room for the expected bytes. Raise :class:`OutputError` naming the flag.
- :func:`atomic_write`: write to a temporary name in the same folder, flush it to disk, then
  rename over the target: a failure leaves the old file (or none), never a partial one.
- :func:`fallback_folder`: where a picture goes when its own location fails late (the
  system's temporary folder), so the work is not lost.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from sdplan.core.errors import OutputError
from sdplan.core.planning import paths

#: Bytes kept free on a file system beyond a write's own estimate (metadata, other writers).
HEADROOM_BYTES = 1 << 20


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _probe(flag: str, path: Path) -> os.stat_result | None:
    """``os.stat(path)``, None when nothing is there; OutputError naming ``flag`` for a path
    that cannot be examined (:func:`sdplan.core.planning.paths.probe`: a name too long, a
    folder without search permission)."""
    try:
        return paths.probe(path)
    except OSError as exc:
        raise OutputError(f"{flag} {str(path)!r}: {paths.reason(exc)}") from None


def check_output_folder(flag: str, folder: str | Path, needed_bytes: int = 0) -> Path:
    """Create ``folder`` if needed and check a file can be written there with
    ``needed_bytes`` (plus :data:`HEADROOM_BYTES`) free on its file system.

    Args:
        flag: the option that named the folder (for the message), e.g. ``--preview-path``.
        folder: the folder.
        needed_bytes: bytes the outputs will take (an upper estimate).

    Returns:
        The folder as a Path.

    Raises:
        OutputError: the folder cannot be created, is not a folder, is read-only or full.
    """
    path = Path(folder) if str(folder) else Path(".")
    found = _probe(flag, path)
    if found is not None and not stat.S_ISDIR(found.st_mode):
        raise OutputError(f"{flag} {str(path)!r}: cannot create the folder (a file of that "
                          "name is in the way)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{flag} {str(path)!r}: cannot create the folder "
                          f"({_reason(exc)})") from None
    try:
        import tempfile  # shutil, random: loaded when a file is written

        fd, probe = tempfile.mkstemp(dir=path, prefix=".sdplan-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"{flag} {str(path)!r}: cannot write files in this folder "
                          f"({_reason(exc)})") from None
    try:
        st = os.statvfs(path)
        free = st.f_bavail * st.f_frsize
    except (OSError, AttributeError):
        return path
    if needed_bytes and free < needed_bytes + HEADROOM_BYTES:
        raise OutputError(f"{flag} {str(path)!r}: the disk has {free / 2**20:.1f} MiB free, "
                          f"the output needs about {(needed_bytes + HEADROOM_BYTES) / 2**20:.1f} MiB")
    return path


def check_output_file(flag: str, path: str | Path, suffixes: tuple[str, ...] = (".png",),
                      needed_bytes: int = 0) -> Path:
    """Check an output file path before any work: its extension is one of ``suffixes``
    (case-insensitive), it is not a folder, and its folder passes
    :func:`check_output_folder`.

    Raises:
        OutputError: naming ``flag`` and the path.
    """
    out = Path(path)
    st = _probe(flag, out) if str(path) else None
    if not str(path) or (st is not None and stat.S_ISDIR(st.st_mode)) or str(path).endswith(("/", os.sep)):
        raise OutputError(f"{flag} {str(path)!r}: a file name is needed, not a folder")
    if out.suffix.lower() not in suffixes:
        what = f"the extension {out.suffix!r}" if out.suffix else "no extension"
        raise OutputError(f"{flag} {str(path)!r} has {what}; use "
                          f"{' or '.join(suffixes)}")
    check_output_folder(flag, out.parent, needed_bytes)
    return out


@contextlib.contextmanager
def _temporary_beside(path: Path) -> Iterator[Path]:
    import tempfile  # shutil, random: loaded when a file is written

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    os.close(fd)
    try:
        yield Path(tmp)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _new_file_mode() -> int:
    """The permission bits a plain ``open()`` gives a new file: 0o666 less the process umask
    (read from /proc where it exists, so the umask is never changed under other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Write ``path`` atomically: ``write(tmp)`` fills a temporary file in the same folder,
    which is flushed to disk and renamed over ``path``. Returns ``path``.

    Raises:
        OSError: the folder, the write or the rename failed; the temporary file is removed
            and an existing ``path`` is left as it was.
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with _temporary_beside(out) as tmp:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, _new_file_mode())  # mkstemp's 0o600 would hide pictures from others
        os.replace(tmp, out)
    return out


def fallback_folder() -> Path:
    """The system's temporary folder: where an output that failed late is written instead."""
    import tempfile  # shutil, random: loaded when a file is written

    return Path(tempfile.gettempdir())


def is_disk_full(exc: OSError) -> bool:
    """True for the errors of a full disk or quota (ENOSPC, EDQUOT, EFBIG)."""
    return exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1), errno.EFBIG)
