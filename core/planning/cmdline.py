"""Pasted command lines -> argument lists, read the way the shell they came from reads them.

People paste sd-cli commands from a POSIX shell, from cmd.exe, from PowerShell and from
logs that print one argument per line. :func:`split_command_line` picks the dialect from
the text (:func:`command_dialect`) and splits it:

- ``posix``: shell words (:mod:`shlex`): quotes, backslash escapes, backslash-newline
  continuations.
- ``windows``: the rules every C/C++ program on Windows gets its ``argv`` by (Microsoft's
  "Parsing C++ command-line arguments", as ``CommandLineToArgvW`` implements them):
  whitespace separates, ``"`` toggles quoting, backslashes are literal except before a
  ``"`` (``2n`` backslashes + ``"``: ``n`` backslashes and a quote toggle; ``2n+1``: ``n``
  backslashes and a literal ``"``), ``""`` inside quotes is a literal ``"``. So
  ``..\\Lora\\`` and ``C:\\models\\v1-5.safetensors`` stay paths. What cmd.exe does before the
  program sees the line is undone first: ``^`` escapes the next character outside quotes
  and ``^`` at a line end continues the line. PowerShell's backtick continuation and
  backtick escapes are undone too, and its single-quoted strings read as one argument when
  the text is PowerShell's (a backtick continuation or a ``&`` call operator).
- ``lines``: one argument per line, as logs print an ``argv`` (no continuation marks, and
  every line that starts with ``-`` holds nothing but the flag); a line wrapped in quotes
  loses them.

The program itself (``sd-cli``, ``.\\bin\\Release\\sd.exe``, ``C:\\sd\\sd-cli.exe``...) is
removed by :func:`strip_program`.
"""

from __future__ import annotations

import re
import shlex

from sdplan.core.errors import PlanError

__all__ = ["BINARY_NAMES", "command_dialect", "split_command_line", "split_windows",
           "strip_program"]

#: Program names of stable-diffusion.cpp's command (compared lower-case, without folder).
BINARY_NAMES = frozenset({"sd-cli", "sd", "sd-cli.exe", "sd.exe", "sd-server", "sd-server.exe"})

_DRIVE = re.compile(r"(?:^|[\s\"'=])[A-Za-z]:\\")
_WIN_RELATIVE = re.compile(r"(?:^|[\s\"'=])\.{1,2}\\")
_CARET_CONT = re.compile(r"\^[ \t]*\r?\n")
_BACKTICK_CONT = re.compile(r"`[ \t]*\r?\n")
_BACKSLASH_CONT = re.compile(r"\\[ \t]*\r?\n")


def command_dialect(text: str) -> str:
    """Which shell ``text`` was written for: ``windows``, ``lines`` or ``posix``.

    Windows: a cmd.exe ``^`` or PowerShell backtick continuation, a drive letter path
    (``C:\\``), a ``.\\``/``..\\`` relative path, or a program ending in ``.exe``. Lines: several
    lines, no continuation marks, and every line starting with ``-`` is a single word.
    Otherwise POSIX.
    """
    if _CARET_CONT.search(text) or _BACKTICK_CONT.search(text):
        return "windows"
    if _DRIVE.search(text) or _WIN_RELATIVE.search(text):
        return "windows"
    first = text.strip().split(None, 1)[0] if text.strip() else ""
    if first.strip("\"'").lower().endswith(".exe"):
        return "windows"
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) >= 3 and not _BACKSLASH_CONT.search(text) and all(
            len(ln.split()) == 1 for ln in lines if ln.startswith("-")):
        return "lines"
    return "posix"


_SINGLE_QUOTED = re.compile(r"(?:^|\s)'[^']*'(?:\s|$)")


def _powershell(text: str) -> bool:
    """PowerShell rather than cmd.exe: a backtick continuation, the ``&`` call operator, or
    a single-quoted word (cmd.exe passes single quotes through, so nobody quotes with them
    there) without a cmd.exe caret continuation."""
    if _BACKTICK_CONT.search(text) or text.lstrip().startswith("& "):
        return True
    return not _CARET_CONT.search(text) and bool(_SINGLE_QUOTED.search(text))


def split_windows(text: str, *, powershell: bool = False) -> list[str]:
    """Split a Windows command line (module docstring): cmd.exe carets (or, with
    ``powershell``, backticks and single-quoted strings) undone, then the C runtime's
    argument rules. Newlines separate arguments like spaces.

    Raises:
        PlanError: ``invalid_assignment`` for an unterminated quote.
    """
    text = _BACKSLASH_CONT.sub(" ", text)  # docs continue Windows lines with \ too
    if powershell:
        text = _BACKTICK_CONT.sub(" ", text)
        text = text.lstrip()
        if text.startswith("& "):
            text = text[2:]
    else:
        text = _CARET_CONT.sub(" ", text)
    args: list[str] = []
    cur: list[str] = []
    have = False  # an argument is open (so "" gives an empty argument)
    quoted = False
    single = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if single:
            if c == "'":
                if i + 1 < n and text[i + 1] == "'":
                    cur.append("'")
                    i += 2
                    continue
                single = False
            else:
                cur.append(c)
            i += 1
            continue
        if c == "\\":
            j = i
            while j < n and text[j] == "\\":
                j += 1
            count = j - i
            if j < n and text[j] == '"':
                cur.append("\\" * (count // 2))
                have = True
                if count % 2:
                    cur.append('"')
                    i = j + 1
                else:
                    i = j  # the quote toggles below
                continue
            cur.append("\\" * count)
            have = True
            i = j
            continue
        if c == '"':
            if quoted and i + 1 < n and text[i + 1] == '"':
                cur.append('"')
                i += 2
                continue
            quoted = not quoted
            have = True
            i += 1
            continue
        if not quoted and not powershell and c == "^" and i + 1 < n:
            cur.append(text[i + 1])
            have = True
            i += 2
            continue
        if not quoted and powershell and c == "`" and i + 1 < n:
            cur.append(text[i + 1])
            have = True
            i += 2
            continue
        if not quoted and powershell and c == "'":
            single = True
            have = True
            i += 1
            continue
        if not quoted and c in " \t\r\n":
            if have:
                args.append("".join(cur))
                cur, have = [], False
            i += 1
            continue
        cur.append(c)
        have = True
        i += 1
    if quoted or single:
        raise PlanError("invalid_assignment", "cannot read the command line: a quote is "
                        "not closed")
    if have:
        args.append("".join(cur))
    return args


def _split_lines(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'":
            s = s[1:-1]
        out.append(s)
    return out


def split_command_line(text: str, dialect: str | None = None) -> list[str]:
    """The arguments of a pasted command line (the program included), read in
    ``dialect`` (``posix``, ``windows``, ``powershell``, ``lines``; default: detected by
    :func:`command_dialect`).

    Raises:
        PlanError: ``invalid_assignment`` for unbalanced quotes or an unknown dialect.
    """
    dialect = dialect or command_dialect(text)
    if dialect == "windows":
        return split_windows(text, powershell=_powershell(text))
    if dialect == "powershell":
        return split_windows(text, powershell=True)
    if dialect == "lines":
        return _split_lines(text)
    if dialect != "posix":
        raise PlanError("invalid_assignment", f"unknown command-line dialect {dialect!r}")
    try:
        return shlex.split(_BACKSLASH_CONT.sub(" ", text), comments=True)
    except ValueError as exc:
        raise PlanError("invalid_assignment", f"cannot read the command line: {exc}") from None


def strip_program(args: list[str]) -> tuple[str | None, list[str]]:
    """``(program, rest)``: the leading program (a name of :data:`BINARY_NAMES`, or any
    first word with a ``/`` or ``\\`` in it that is not a flag) split off, else ``(None, args)``.
    """
    if not args or args[0].startswith("-"):
        return None, args
    base = re.split(r"[\\/]", args[0])[-1].lower()
    if base in BINARY_NAMES or "/" in args[0] or "\\" in args[0] or base.endswith(".exe"):
        return args[0], args[1:]
    return None, args
