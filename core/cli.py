"""The ``sdplan`` command: a dispatcher over the subcommands in :mod:`sdplan.core.commands`.

Each subcommand lives in its own module exposing ``add_parser(subparsers)`` and
``run(args) -> int``. Errors of sdplan's own hierarchy become one-line messages
(:mod:`sdplan.core.commands.messages`) and exit code 2; a closed output pipe is quiet;
without arguments the GUI starts.

A command that runs sdplan's engine in a child process (:data:`ENGINE_COMMANDS`) gets that
child started first, before the subcommand modules load: the child's imports overlap the
command's own (:func:`sdplan.core.runtime.prestart.prestart`; on Linux the command's process,
single-threaded with only the standard library loaded, forks it, so it skips a Python start).
Bad input still gets its one-line error at once; the child is then ended unused. So that the
child starts before anything else loads, this module imports the rest in its functions, and
a command line that names its command loads that command's module alone (:func:`build_parser`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NoReturn

from sdplan.core.pipelines.job_names import COMPUTE_JOB, GENERATE_JOB

if TYPE_CHECKING:
    import argparse

#: Commands that run their jobs in an engine child process unless given ``--in-process``,
#: with the modules of those jobs (the child imports them while the command starts).
ENGINE_COMMANDS: dict[str, tuple[str, ...]] = {
    "generate": tuple(job.partition(":")[0] for job in (GENERATE_JOB, COMPUTE_JOB)),
}


#: The subcommands in help order: name -> its module in :mod:`sdplan.core.commands`.
COMMANDS: dict[str, str] = {
    "devices": "devices", "rpc-server": "rpc_server", "plan": "plan", "inspect": "inspect",
    "library": "library", "generate": "generate", "upscale": "upscale", "serve": "serve", "gui": "gui",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Build the top-level argument parser with every subcommand, or with ``command`` alone
    (a name of :data:`COMMANDS`): a command line that names its command gets the same
    results, help and errors from it, without loading the other commands' modules (their
    imports would compete for the CPU with the engine child starting meanwhile)."""
    import argparse
    import importlib

    from sdplan.core import __version__

    names = [command] if command in COMMANDS else list(COMMANDS)
    modules = [importlib.import_module(f"sdplan.core.commands.{COMMANDS[name]}") for name in names]
    parser = argparse.ArgumentParser(
        prog="sdplan",
        description="Plan and run stable-diffusion.cpp device placements on mixed hardware.",
    )
    parser.add_argument("--version", action="version", version=f"sdplan {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in modules:
        module.add_parser(sub)
    parser.error = _one_line_error("")  # type: ignore[method-assign,assignment]
    for name, p in sub.choices.items():  # every command's argument errors: one line too
        p.error = _one_line_error(name)  # type: ignore[method-assign,assignment]
    return parser


def _one_line_error(command: str) -> Callable[[str], NoReturn]:
    """argparse's ``error`` for ``sdplan COMMAND``: an SdplanError the dispatcher prints in
    one line (``sdplan plan: argument -W/--width: invalid positive_int value: 'x' (see
    sdplan plan --help)``), instead of the usage text and the message on two."""
    def error(message: str) -> NoReturn:
        from sdplan.core.errors import SdplanError

        raise SdplanError(f"{message} (see sdplan {command + ' ' if command else ''}--help)")
    return error


def command_word(args_list: Sequence[str]) -> str | None:
    """The subcommand a command line names: its first word that is not an option (the
    top-level options take no value); None when there is none or the top-level help comes
    first (it lists every command)."""
    for word in args_list:
        if word in ("-h", "--help", "-", "--"):  # "--", "-": argparse reads what follows itself
            return None
        if not word.startswith("-"):
            return word
    return None


def engine_preload(args_list: Sequence[str]) -> tuple[str, ...]:
    """The job modules an engine child should import for the command line ``args_list``
    (:data:`ENGINE_COMMANDS`), or () when it names no such command, asks for help or the
    version, or runs the engine ``--in-process``. A guess from the words alone, before
    parsing: a wrong guess costs one unused child process, never a different result."""
    for i, word in enumerate(args_list):
        if word in ("-h", "--help", "--version"):
            return ()
        if not word.startswith("-"):
            rest = args_list[i + 1:]
            if any(w in ("-h", "--help", "--in-process") for w in rest):
                return ()
            return ENGINE_COMMANDS.get(word, ()) + _warm_ups(word, rest)
    return ()


#: Words of a ``generate`` command line that name a model with a CLIP text encoder (the demo,
#: a single-file checkpoint, CLIP-L/G files): its child builds the CLIP tokenizer while the
#: command starts (about 0.09 s of a 0.47 s first demo picture on a 2-core Zen 4).
_CLIP_WORDS = frozenset({"--demo", "-m", "--model", "--clip_l", "--clip_g"})


def _warm_ups(command: str, rest: Sequence[str]) -> tuple[str, ...]:
    """The ``module:function`` warm-ups the engine child of ``command`` runs after its
    imports, guessed from the words ``rest`` (a wrong guess costs the child that work alone)."""
    if command == "generate" and any(w.split("=", 1)[0] in _CLIP_WORDS for w in rest):
        return ("sdplan.core.text.clip_tokenizer:warm",)
    return ()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``sdplan`` command line; returns the process exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    preload = engine_preload(args_list)
    if not preload:
        return _main(args_list)
    try:
        from sdplan.core.runtime.prestart import discard_prestarted, prestart
    except KeyboardInterrupt:
        return _interrupted()
    try:
        try:  # this process's own command line: nothing else runs in it yet, so it may fork
            prestart(preload, fork=argv is None)
        except OSError:  # the command's engine reports it
            pass
        return _main(args_list)
    except KeyboardInterrupt:  # Ctrl-C while the engine child starts (_main handles its own)
        return _interrupted()
    finally:
        discard_prestarted()  # when the command took none (bad input, an early error, Ctrl-C)


def negative_values(parser: argparse.ArgumentParser, args_list: list[str]) -> list[str]:
    """``args_list`` with a list starting with a negative number given to an option that takes
    a value joined to it (``--split-ratio -1,2`` -> ``--split-ratio=-1,2``, ``--max-vram
    -1,cpu=4`` likewise): argparse takes only a
    single negative number for a value and reads ``-1,2`` as an unknown option ("expected one
    argument"), so the value's own check never named what was wrong with it."""
    import re

    number_list = re.compile(r"^-(\d|\.\d)")
    actions: dict[str, argparse.Action] = dict(parser._option_string_actions)
    for group in parser._subparsers._group_actions if parser._subparsers else ():
        sub = getattr(group, "choices", {}).get(command_word(args_list) or "")
        if sub is not None:
            actions.update(sub._option_string_actions)
    out: list[str] = []
    for i, word in enumerate(args_list):
        prev = out[-1] if out else ""
        action = actions.get(prev) if i and "=" not in prev else None
        if action is not None and action.nargs != 0 and number_list.match(word) and "," in word:
            out[-1] = f"{prev}={word}"
        else:
            out.append(word)
    return out


def _interrupted() -> int:
    print("sdplan: interrupted", file=sys.stderr)
    return 130


def _main(args_list: list[str]) -> int:
    import logging
    import os

    from sdplan.core.commands.messages import QuietStdout, print_error, shorten
    from sdplan.core.errors import SdplanError

    if not args_list:
        args_list = ["gui"]
    parser = build_parser(command_word(args_list))
    try:
        args, extras = parser.parse_known_args(negative_values(parser, args_list))
        if extras and getattr(args, "refuse_extras", None) is None:
            _one_line_error(args.command or "")(f"unrecognized arguments: {' '.join(extras)}")
    except SdplanError as exc:  # every parser reports in one line
        word = command_word(args_list)
        print(f"sdplan{' ' + shorten(word, 40) if word in COMMANDS else ''}: {shorten(str(exc))}",
              file=sys.stderr)
        return 2
    if extras:
        args.extra_argv = extras  # the command refuses or accepts them in one line
    if args.command is None:
        parser.print_help()
        return 2
    if sys.stdout is None:  # started with stdout closed (``>&-``): nothing to show it on
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    real_stdout, real_stderr = sys.stdout, sys.stderr
    # A reader that goes away (``sdplan generate ... | head -1``, or ``2>&1 | head -1`` for
    # the progress on stderr) silences that stream; the command carries on (the image is
    # still written).
    sys.stdout = QuietStdout(real_stdout)  # type: ignore[assignment]
    sys.stderr = QuietStdout(real_stderr)  # type: ignore[assignment]
    logging.basicConfig(  # on the wrapped stderr
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.run(args) or 0)
    except SdplanError as exc:
        print_error(exc)
        return 2
    except KeyboardInterrupt:
        print("sdplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output written around the wrapper (a child's inherited stdout): stop quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), real_stdout.fileno())
        return 0
    finally:
        if isinstance(sys.stdout, QuietStdout):
            sys.stdout.flush()
            sys.stdout = real_stdout
        if isinstance(sys.stderr, QuietStdout):
            sys.stderr.flush()
            sys.stderr = real_stderr


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
