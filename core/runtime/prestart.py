"""Engine child processes started ahead of need.

:func:`spawn` starts ``python -m sdplan.core.runtime.process`` (the engine child of
:class:`sdplan.core.runtime.process.Engine`). :func:`prestart` starts one before any engine
asks for it: the command line calls it as soon as it knows its command runs the engine, so
the child's Python start and its imports of the job modules it is told about overlap the
command's own start-up; the next isolated engine of the process that inherits the
environment takes it (:func:`take_prestarted`), and :func:`discard_prestarted` ends it when
none did.

This module imports nothing but the standard library's process tools, so a caller can start
the child before loading anything else.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import threading
from collections.abc import Sequence

__all__ = ["spawn", "prestart", "take_prestarted", "discard_prestarted", "end_unused"]

_SPARE: subprocess.Popen[bytes] | None = None  # a child started by prestart(), not yet taken
_LOCK = threading.Lock()
_AT_EXIT: list[bool] = []  # discard_prestarted() is registered at exit once


def spawn(env: dict[str, str] | None, preload: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """A new engine child process with pipes on its stdin, stdout and stderr; ``env``: its
    environment (None: this one's); ``preload``: modules (``"package.module"``) it imports
    before serving jobs. The child ends when this process does: started from the main
    thread it is told this process's id (on Linux the kernel kills it when this thread
    ends); from any thread it exits when its stdin closes without a ``quit``.

    Raises:
        OSError: the process cannot be started.
    """
    argv = [sys.executable, "-m", "sdplan.core.runtime.process"]
    if preload:
        argv += ["--preload", ",".join(preload)]
    if threading.current_thread() is threading.main_thread():  # its end is the process's
        argv += ["--parent", str(os.getpid())]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def prestart(preload: Sequence[str] = ()) -> None:
    """Start an engine child process now (:func:`spawn` with this environment) for the next
    isolated engine of this process that inherits the environment; it imports the
    ``preload`` modules (e.g. those of the jobs it will run) while it waits. A second call
    while one waits does nothing. An untaken child is ended by :func:`discard_prestarted`
    (also run at exit).

    Raises:
        OSError: the child process cannot be started.
    """
    global _SPARE
    with _LOCK:
        if _SPARE is not None:
            return
        _SPARE = spawn(None, preload)
        if not _AT_EXIT:
            _AT_EXIT.append(True)
            atexit.register(discard_prestarted)


def take_prestarted() -> subprocess.Popen[bytes] | None:
    """The child :func:`prestart` started, handed over once (None when there is none)."""
    global _SPARE
    with _LOCK:
        proc, _SPARE = _SPARE, None
    return proc


def discard_prestarted() -> None:
    """End the child :func:`prestart` started if no engine took it (idempotent)."""
    proc = take_prestarted()
    if proc is not None:
        end_unused(proc)


def end_unused(proc: subprocess.Popen[bytes]) -> None:
    """Kill a child that ran no job, wait for it and close its pipes."""
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
