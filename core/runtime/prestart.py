"""Engine child processes started ahead of need.

:func:`spawn` starts ``python -m sdplan.core.runtime.process`` (the engine child of
:class:`sdplan.core.runtime.process.Engine`). :func:`prestart` starts one before any engine
asks for it: the command line calls it as soon as it knows its command runs the engine, so
the child's imports of the job modules it is told about overlap the command's own start-up;
the next isolated engine of the process that inherits the environment takes it
(:func:`take_prestarted`), and :func:`discard_prestarted` ends it when none did.

On Linux the command line's own process, still single-threaded and with nothing but the
standard library loaded, forks its child instead (:func:`fork_engine`): the child skips the
interpreter's start (30-40 ms of a 0.2-0.3 s ``generate --demo`` start-up on a 2-core Zen 4)
and is the same engine child otherwise (``/proc/PID/comm``: ``sdplan-engine``). Any other
caller (the app's worker threads, a test process) spawns, as forking a process with threads
or native libraries loaded is not safe.

This module imports nothing but the standard library's process tools, so a caller can start
the child before loading anything else.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import IO, Union

__all__ = ["spawn", "prestart", "take_prestarted", "discard_prestarted", "end_unused", "fork_engine",
           "can_fork", "ForkedChild", "ENGINE_MODULE", "ENGINE_NAME"]

#: The module whose ``child_main(argv)`` an engine child runs (spawned: ``python -m`` it).
ENGINE_MODULE = "sdplan.core.runtime.process"

#: The engine child's name in ``/proc/PID/comm`` (``ps -e``, ``top``) when it was forked.
ENGINE_NAME = "sdplan-engine"

#: Modules whose presence makes a fork unsafe (native threads, GUI or accelerator state).
_NO_FORK_MODULES = ("sdplan._ggml", "numpy", "PySide6", "torch")


class ForkedChild:
    """An engine child made by :func:`fork_engine`, with the part of
    :class:`subprocess.Popen`'s interface the engine uses: ``pid``, ``stdin`` (binary
    writer), ``stdout`` and ``stderr`` (binary readers), ``returncode``, :meth:`poll`,
    :meth:`wait`, :meth:`send_signal`, :meth:`kill` and :meth:`terminate`. ``returncode``
    follows Popen: the exit code, or minus the signal number that ended the process."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.pid = pid
        self.args = [ENGINE_NAME]
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self.stderr: IO[bytes] | None = stderr
        self.returncode: int | None = None
        self._lock = threading.Lock()  # one waitpid() at a time (a second would find no child)

    def _reaped(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        """The exit status if the child has ended (it is then reaped), else None."""
        if self.returncode is not None or not self._lock.acquire(blocking=False):
            return self.returncode  # another thread is waiting for it
        try:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid == self.pid:
                    return self._reaped(status)
        except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): its status is lost
            self.returncode = 0
        finally:
            self._lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to end; its exit status.

        Raises:
            subprocess.TimeoutExpired: it has not ended after ``timeout`` seconds.
        """
        if timeout is None:
            with self._lock:
                if self.returncode is None:
                    try:
                        return self._reaped(os.waitpid(self.pid, 0)[1])
                    except ChildProcessError:
                        self.returncode = 0
            return self.returncode
        end = time.monotonic() + timeout
        delay = 0.0005
        while (code := self.poll()) is None:
            left = end - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        return code

    def send_signal(self, sig: int) -> None:
        """Send signal ``sig`` unless the child has been reaped (as Popen.send_signal)."""
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        """Send SIGKILL unless the child has been reaped."""
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        """Send SIGTERM unless the child has been reaped."""
        self.send_signal(signal.SIGTERM)

Child = Union[subprocess.Popen, ForkedChild]  # noqa: UP007 - a runtime alias

_SPARE: Child | None = None  # a child started by prestart(), not yet taken
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
    argv = [sys.executable, "-m", ENGINE_MODULE]
    if preload:
        argv += ["--preload", ",".join(preload)]
    if threading.current_thread() is threading.main_thread():  # its end is the process's
        argv += ["--parent", str(os.getpid())]
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def can_fork() -> bool:
    """Whether :func:`fork_engine` may run in this process now: on Linux, from the main
    thread, the only Python thread, with none of :data:`_NO_FORK_MODULES` loaded, and the
    standard streams' descriptors 0-2 in use (the child's pipes must not take them)."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return False
    if threading.current_thread() is not threading.main_thread() or threading.active_count() != 1:
        return False
    if any(name in sys.modules for name in _NO_FORK_MODULES):
        return False
    try:
        return all(os.fstat(fd) is not None for fd in (0, 1, 2))
    except OSError:
        return False


def _open_fds() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return list(range(3, 256))


def fork_engine(preload: Sequence[str] = ()) -> ForkedChild:
    """Fork this process into an engine child (as :func:`spawn` makes one, with pipes on its
    standard streams) that imports the ``preload`` modules and then serves jobs
    (``child_main`` of :data:`ENGINE_MODULE`); it ends when this process does. Only
    where :func:`can_fork` holds: this process's state is copied, so it must have no other
    threads nor native libraries loaded.

    Raises:
        OSError: the pipes or the process cannot be made.
    """
    fds = [*os.pipe(), *os.pipe(), *os.pipe()]  # stdin r/w, stdout r/w, stderr r/w
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):  # the child must not write their text again
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    try:
        pid = os.fork()
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    if pid == 0:  # the child: never returns into the caller's code
        code = 1
        try:
            os.dup2(fds[0], 0)
            os.dup2(fds[3], 1)
            os.dup2(fds[5], 2)
            for fd in _open_fds():
                if fd > 2:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            if sys.stdin is None:
                sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own
            if sys.stderr is None:
                sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
            import importlib

            entry = importlib.import_module(ENGINE_MODULE).child_main  # as spawn's ``-m`` runs it
            code = entry(["--parent", str(parent), "--name", ENGINE_NAME,
                                *(["--preload", ",".join(preload)] if preload else [])])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - reported on the child's stderr, then it exits
            import traceback

            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):  # os._exit flushes nothing
                try:
                    if stream is not None:
                        stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(code)
    for fd in (fds[0], fds[3], fds[5]):
        os.close(fd)
    return ForkedChild(pid, open(fds[1], "wb"), open(fds[2], "rb"), open(fds[4], "rb"))


def prestart(preload: Sequence[str] = (), fork: bool = False) -> None:
    """Start an engine child process now (:func:`spawn` with this environment) for the next
    isolated engine of this process that inherits the environment; it imports the
    ``preload`` modules (e.g. those of the jobs it will run) while it waits. With ``fork``
    the child is forked (:func:`fork_engine`) where :func:`can_fork` holds, spawned
    otherwise. A second call while one waits does nothing. An untaken child is ended by
    :func:`discard_prestarted` (also run at exit).

    Raises:
        OSError: the child process cannot be started.
    """
    global _SPARE
    if fork and can_fork():  # the only thread: no lock needed, and the child inherits none held
        if _SPARE is None:
            _SPARE = fork_engine(preload)
            _register_at_exit()
        return
    with _LOCK:
        if _SPARE is not None:
            return
        _SPARE = spawn(None, preload)
        _register_at_exit()


def _register_at_exit() -> None:
    """Register :func:`discard_prestarted` at exit once (callers hold _LOCK or are the only
    thread)."""
    if not _AT_EXIT:
        _AT_EXIT.append(True)
        atexit.register(discard_prestarted)


def take_prestarted() -> Child | None:
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


def end_unused(proc: Child) -> None:
    """Kill a child that ran no job, wait for it and close its pipes."""
    proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
