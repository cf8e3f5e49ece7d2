"""Paths through one door: every ``exists`` / ``is_file`` / ``is_dir`` / ``open`` of a path
the user gave (or a file recorded) goes through these helpers, which turn the operating
system's errors into one-line :class:`~sdplan.core.errors.PathError` messages naming the
path.

``pathlib``'s ``exists()`` and ``is_file()`` answer False only for a missing file
(``ENOENT``, ``ENOTDIR``); a name longer than the file system takes (``ENAMETOOLONG``), a
folder on the way without search permission (``EACCES``), a loop of links (``ELOOP``) or an
I/O error raise :class:`OSError` from a call that looks harmless, and a path holding a NUL
character raises :class:`ValueError`. Here a missing path is ``None`` / ``False`` and every
other failure is a :class:`PathError` (also an ``OSError``), e.g.
``"/x/aaaa…: file name too long"``.

Opening for reading refuses what is not a regular file (a FIFO would block the open until a
writer comes; a character device such as ``/dev/zero`` never ends) before opening it.
"""

from __future__ import annotations

import errno
import os
import stat as stat_mod
from typing import BinaryIO

from sdplan.core.errors import PathError

__all__ = ["reason", "path_error", "probe", "exists", "is_file", "is_dir", "special_kind",
           "open_regular", "read_bytes"]

#: errno values that mean "there is no such path" (not an error of the path itself).
MISSING = frozenset({errno.ENOENT, errno.ENOTDIR})

_SPECIAL = ((stat_mod.S_ISFIFO, "a FIFO"), (stat_mod.S_ISCHR, "a character device"),
            (stat_mod.S_ISBLK, "a block device"), (stat_mod.S_ISSOCK, "a socket"))


def reason(exc: BaseException) -> str:
    """The operating system's words for ``exc``, lower case (``"file name too long"``,
    ``"permission denied"``); a NUL character in a path for the ValueError Python raises; a
    :class:`PathError`'s message without its path."""
    if isinstance(exc, PathError):
        return str(exc).removeprefix(f"{exc.path}: ")
    if isinstance(exc, ValueError):
        return "the path holds a NUL character"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text[:1].lower() + text[1:]


def path_error(path: str | os.PathLike[str], exc: BaseException, doing: str = "") -> PathError:
    """A :class:`PathError` naming ``path`` for the failure ``exc`` (``doing``: what was
    tried, e.g. ``"cannot read"``; the message is ``"PATH: cannot read: permission denied"``)."""
    if isinstance(exc, PathError):
        return exc
    text = reason(exc)
    return PathError(os.fspath(path), f"{doing}: {text}" if doing else text)


def probe(path: str | os.PathLike[str], *, follow: bool = True) -> os.stat_result | None:
    """``os.stat(path)`` (``os.lstat`` with ``follow=False``), or None when nothing is there.

    Raises:
        PathError: any other failure (name too long, permission denied, loop of links, I/O
            error, a NUL character), naming ``path``.
    """
    try:
        return os.stat(path) if follow else os.lstat(path)
    except OSError as exc:
        if exc.errno in MISSING:
            return None
        raise path_error(path, exc) from None
    except ValueError as exc:  # a NUL character
        raise path_error(path, exc) from None


def exists(path: str | os.PathLike[str]) -> bool:
    """Whether something is at ``path`` (links followed). Raises PathError as :func:`probe`."""
    return probe(path) is not None


def is_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file (links followed). Raises PathError as :func:`probe`."""
    st = probe(path)
    return st is not None and stat_mod.S_ISREG(st.st_mode)


def is_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a folder (links followed). Raises PathError as :func:`probe`."""
    st = probe(path)
    return st is not None and stat_mod.S_ISDIR(st.st_mode)


def special_kind(st: os.stat_result) -> str | None:
    """``"a FIFO"``, ``"a character device"``, ``"a block device"`` or ``"a socket"`` for
    such a ``stat`` result; None for a file, a folder or a link."""
    return next((name for test, name in _SPECIAL if test(st.st_mode)), None)


def open_regular(path: str | os.PathLike[str], what: str = "file") -> BinaryIO:
    """``path`` opened for binary reading, after checking it is a regular file.

    Args:
        path: the file.
        what: what the file is, for the messages (``"inventory"``, ``"profile"``...).

    Raises:
        PathError: naming ``path``: missing (``no such file``), a folder, not a regular file
            (a FIFO, a device...), or the open failed (permission denied, name too long...).
    """
    st = probe(path)
    if st is None:
        raise PathError(os.fspath(path), f"no such {what}")
    if stat_mod.S_ISDIR(st.st_mode):
        raise PathError(os.fspath(path), f"is a folder, not {'an' if what[:1] in 'aeiou' else 'a'} {what}")
    kind = special_kind(st)
    if kind is not None:
        raise PathError(os.fspath(path), f"not a regular file ({kind})")
    try:
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    except (OSError, ValueError) as exc:
        raise path_error(path, exc, "cannot open") from None


def read_bytes(path: str | os.PathLike[str], limit: int, what: str = "file") -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``path`` (one more than ``limit``
    tells the caller the file is too large without reading it all).

    Raises:
        PathError: as :func:`open_regular`, or the read failed (an I/O error), naming ``path``.
    """
    with open_regular(path, what) as fh:
        try:
            return fh.read(limit + 1)
        except OSError as exc:
            raise path_error(path, exc, "cannot read") from None

