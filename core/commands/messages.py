"""How the command line reports errors and survives a closed output pipe.

- An error is one line, ``error [code]: message`` (``error: message`` for the few errors
  without a code of their own), never wrapped: a log file or a pipe gets it whole. On a
  terminal a :class:`~sdplan.core.errors.PlanError` adds the flag's text with carets under
  the span; elsewhere the span is named in the line (``at --backend characters 5-9``).
- User text quoted in a message is shortened (:func:`shorten`), so a 100,000-character
  flag value gives a message of a few hundred characters.
- :class:`QuietStdout` stands in for ``sys.stdout`` (and ``sys.stderr``) during a command:
  when the reader goes away (``sdplan generate ... | head -1``) or the stream cannot be
  written at all (``>/dev/full``: no space left; an I/O error on a lost terminal), further
  output is dropped silently and the command carries on, so the image is still written.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from sdplan.core.errors import PlanError, SdplanError

#: Longest message printed whole; longer ones keep their head and tail.
MAX_MESSAGE = 400
#: Characters of a flag's text shown on each side of an error's span.
CONTEXT = 30


def shorten(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` when at most ``limit`` characters, else its head and tail around
    ``… (N characters) …``."""
    if len(text) <= limit:
        return text
    keep = max(limit - 30, 10)
    head, tail = keep * 2 // 3, keep // 3
    return f"{text[:head]}… ({len(text)} characters) …{text[len(text) - tail:]}"


def error_line(exc: BaseException, *, with_span: bool = True) -> str:
    """The one-line form of ``exc``: ``error [code]: message`` (``with_span``: plus where in
    the flag a PlanError's span is)."""
    code = getattr(exc, "code", "error")
    head = "error" if code in ("error", None, "") else f"error [{code}]"
    line = f"{head}: {shorten(' '.join(str(exc).split()))}"
    if with_span and isinstance(exc, PlanError) and exc.span is not None and exc.flag:
        start, end = exc.span
        line += f" (at {exc.flag} characters {start + 1}-{max(end, start + 1)})"
    return line


def excerpt(text: str, span: tuple[int, int], context: int = CONTEXT) -> tuple[str, int, int]:
    """A window of ``text`` around ``span``: ``(shown text, caret start, caret length)``,
    with ``…`` where it was cut; the span itself is cut to ``2 * context`` characters."""
    start, end = max(0, span[0]), max(span[0], span[1])
    lo = max(0, start - context)
    hi = min(len(text), max(end, start + 1) + context, start + 3 * context)
    shown = ("…" if lo else "") + text[lo:hi] + ("…" if hi < len(text) else "")
    caret = start - lo + (1 if lo else 0)
    length = max(1, min(end, hi) - start)
    return shown, caret, length


def print_error(exc: SdplanError, stream: TextIO | None = None) -> None:
    """Print ``exc`` on ``stream`` (default stderr): one unwrapped line; on a terminal, a
    PlanError's flag text (:func:`excerpt`) with carets under its span follows."""
    out = stream or sys.stderr
    tty = _isatty(out)
    if not tty:
        out.write(error_line(exc) + "\n")
        out.flush()
        return
    from rich.console import Console
    from rich.markup import escape

    console = Console(file=out, soft_wrap=True)
    line = error_line(exc, with_span=False)
    head, _, rest = line.partition(": ")
    console.print(f"[bold red]{escape(head)}[/]: {escape(rest)}", highlight=False)
    if isinstance(exc, PlanError) and exc.text is not None and exc.span is not None:
        shown, caret, length = excerpt(exc.text, exc.span)
        console.print(f"  {exc.flag} {shown}", highlight=False, markup=False)
        console.print(" " * (len(exc.flag or "") + 3 + caret) + "^" * length, style="red",
                      highlight=False)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class QuietStdout:
    """A ``sys.stdout`` (or ``sys.stderr``) wrapper that turns a stream that cannot be written
    into silence: after the first :class:`OSError` of a write or flush (a broken pipe, a full
    device, an I/O error) the real stream's file descriptor is pointed at ``/dev/null`` (so
    the final flush at exit cannot fail either) and :attr:`broken` is True. Output is never
    worth losing the picture for."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False

    def _gone(self) -> None:
        self.broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def write(self, text: str) -> int:
        if self.broken:
            return len(text)
        try:
            return self.stream.write(text)
        except OSError:  # BrokenPipeError, ENOSPC (>/dev/full), EIO
            self._gone()
            return len(text)

    def flush(self) -> None:
        if self.broken:
            return
        try:
            self.stream.flush()
        except OSError:  # BrokenPipeError, ENOSPC (>/dev/full), EIO
            self._gone()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
