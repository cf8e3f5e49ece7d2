"""What ``sdplan generate`` does before its engine starts: the command line process loads
neither numpy nor the native module (the engine child process does), the engine child is
started before the command's modules load and ended when bad input stops the command, and
a model file's header read twice in a process is read once while the file is unchanged.

Speed itself is measured by ``bench/bench_startup.py``, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sdplan.core import cli
from sdplan.core.modelfiles import readers
from sdplan.core.runtime import prestart, process

HEAVY = ("numpy", "sdplan._ggml", "PIL")


def _python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line last."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "SDPLAN_PROBE_FILE"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_command_line_loads_no_numpy_nor_native_module() -> None:
    got = _python("import json, sys\nimport sdplan.core.cli\nfrom sdplan.core.cli import build_parser\n"
                  "build_parser()\n"
                  f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    assert got == []


def test_generate_plans_and_starts_its_engine_without_numpy_in_the_command_process(tmp_path: Path) -> None:
    """A whole demo run through the command line: at each engine job sent (the devices, the dry
    run, the generation; the last before the plan's tables print) the command's own process has
    loaded none of numpy, Pillow or the
    native module; the picture is written all the same."""
    pytest.importorskip("sdplan._ggml")
    out = tmp_path / "demo.png"
    code = f"""
import json, sys
from sdplan.core.runtime import prestart, process
seen = []
real = process.Engine.submit
tables = []
def submit(self, func, *a, **k):
    seen.append([func, [m for m in {HEAVY!r} if m in sys.modules], self.isolated, len(tables)])
    return real(self, func, *a, **k)
process.Engine.submit = submit
import sdplan.core.commands.plan as plan_cmd
real_tables = plan_cmd.print_tables
def print_tables(*a, **k):
    tables.append(1)
    return real_tables(*a, **k)
plan_cmd.print_tables = print_tables
from sdplan.core.cli import main
code = main(["generate", "--demo", "-p", "a red circle on a blue background", "--steps", "2",
             "-t", "1", "-o", {str(out)!r}])
print(json.dumps({{"code": code, "seen": seen}}))
"""
    got = _python(code)
    assert got["code"] == 0 and out.is_file()
    assert [s[0].rsplit(":", 1)[1] for s in got["seen"]] == ["inventory_job", "compute_job", "generate_job"]
    for func, loaded, isolated, _ in got["seen"]:
        assert isolated and loaded == [], (func, loaded)
    assert [s[3] for s in got["seen"]] == [0, 0, 0]  # the picture's job is sent before the tables print


def test_the_engine_child_starts_before_the_command_modules_load(tmp_path: Path) -> None:
    """The dispatcher starts the child first: when it is spawned no subcommand module, nor
    argparse, nor numpy has loaded in the command's process."""
    code = f"""
import json, sys
from sdplan.core.runtime import prestart
seen = []
real = prestart.spawn
def spy(env, preload=()):
    seen.append(sorted(m for m in sys.modules if m.startswith("sdplan.core.commands") or m in ("argparse", "numpy")))
    return real(env, preload)
prestart.spawn = spy
from sdplan.core.cli import main
code = main(["generate", "--demo", "-p", "a red circle on a blue background", "--steps", "0",
             "-o", {str(tmp_path / "x.png")!r}])
print(json.dumps({{"code": code, "seen": seen}}))
"""
    assert _python(code) == {"code": 2, "seen": [[]]}


@pytest.mark.parametrize(("argv", "wanted"), [
    (["generate", "--demo", "-p", "x"], True),
    (["-v", "generate", "--demo"], True),
    (["generate", "--demo", "--in-process"], False),
    (["generate", "--help"], False),
    (["-h", "generate"], False),
    (["--version"], False),
    (["plan", "--json"], False),
    ([], False),
])
def test_an_engine_child_is_prestarted_only_for_an_isolated_generate(argv: list[str], wanted: bool) -> None:
    preload = cli.engine_preload(argv)
    assert bool(preload) == wanted
    if wanted:
        assert preload[:2] == ("sdplan.core.pipelines.jobs", "sdplan.core.pipelines.compute")


@pytest.mark.parametrize(("argv", "warm"), [
    (["generate", "--demo", "-p", "x"], True),
    (["generate", "-m", "sd15.safetensors", "-p", "x"], True),
    (["generate", "--model=sdxl.safetensors", "-p", "x"], True),
    (["generate", "--diffusion-model", "f.gguf", "--clip_l", "l.safetensors", "-p", "x"], True),
    (["generate", "--diffusion-model", "z.safetensors", "--llm", "q.safetensors", "-p", "x"], False),
])
def test_the_child_of_a_clip_model_builds_its_tokenizer_while_the_command_starts(argv: list[str],
                                                                                warm: bool) -> None:
    """A command line naming a model with CLIP (the demo, a checkpoint, CLIP-L/G files) has the
    engine child build the CLIP tokenizer after its imports; one naming only an LLM does not."""
    preload = cli.engine_preload(argv)
    assert ("sdplan.core.text.clip_tokenizer:warm" in preload) == warm


def test_a_preload_warm_up_runs_in_the_child_before_its_first_job(tmp_path: Path) -> None:
    """``--preload module:function`` imports the module and calls the function before the
    child serves jobs (no job is sent here); a failing warm-up, even one raising SystemExit,
    does not stop the child."""
    marker = tmp_path / "warmed"
    (tmp_path / "warmmark.py").write_text(
        f"import pathlib\ndef mark():\n    pathlib.Path({str(marker)!r}).write_text('yes')\n"
        "def broken():\n    raise RuntimeError('no')\n"
        "def leaves():\n    raise SystemExit(3)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    child = prestart.spawn(env, ["warmmark:broken", "warmmark:leaves", "warmmark:mark"])
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert marker.read_text() == "yes"
        assert child.poll() is None  # still serving
    finally:
        assert child.stdin is not None
        child.stdin.close()  # the end of input: the child exits
        child.wait(30)


def test_warm_builds_the_clip_tokenizer_once() -> None:
    from sdplan.core.text import clip_tokenizer

    clip_tokenizer._backend.cache_clear()
    clip_tokenizer.warm()
    assert clip_tokenizer._backend.cache_info().currsize == 1
    assert clip_tokenizer.ClipTokenizer().encode("a red circle") == [320, 736, 7117]
    assert clip_tokenizer._backend.cache_info().hits >= 1


@pytest.fixture
def started(monkeypatch) -> list[subprocess.Popen[bytes]]:
    """The engine child processes started during the test, in order."""
    out: list[subprocess.Popen[bytes]] = []
    spawn = prestart.spawn

    def spy(env, preload=()):  # noqa: ANN001, ANN202
        out.append(spawn(env, preload))
        return out[-1]

    monkeypatch.setattr(prestart, "spawn", spy)
    return out


def test_bad_input_gets_its_line_and_the_prestarted_child_is_ended(started, capsys, tmp_path: Path) -> None:
    """``--steps 0`` is refused in one line (exit 2) before anything is planned; the engine
    child started for the command ran no job and is gone when the command returns."""
    out = tmp_path / "no.png"
    assert cli.main(["generate", "--demo", "-p", "a red circle on a blue background", "--steps", "0",
                     "-o", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error [invalid_argument]: --steps must be between 1 and 1000, got 0"]
    assert len(started) == 1 and started[0].poll() is not None  # ended, not left running
    assert prestart.take_prestarted() is None and not out.exists()


def test_an_engine_takes_the_prestarted_child(started) -> None:
    """The next isolated engine runs its jobs in the child started before it (no second
    child); an engine with an environment of its own starts its own."""
    pytest.importorskip("sdplan._ggml")
    prestart.prestart(("sdplan.core.pipelines.jobs",))
    try:
        with process.Engine() as engine:
            inv = engine.call("sdplan.core.pipelines.jobs:inventory_job", {})
            assert engine.pid == started[0].pid and len(started) == 1
        assert "CPU" in [d["name"] for d in inv["devices"]]
        prestart.prestart()
        with process.Engine(env=dict(os.environ)) as engine:
            engine.start()
            assert len(started) == 3 and engine.pid == started[2].pid
    finally:
        prestart.discard_prestarted()
    assert all(p.wait(10) is not None for p in started)


FORKED = """
import json, os, sys, threading
from sdplan.core.runtime import prestart
seen = {"could": prestart.can_fork()}
prestart.prestart(("sdplan.core.pipelines.jobs",), fork=True)
child = prestart.take_prestarted()
seen["kind"] = type(child).__name__
with open(f"/proc/{child.pid}/stat") as fh:
    seen["ppid"] = int(fh.read().rsplit(")", 1)[1].split()[1]) == os.getpid()
seen["numpy_here"] = "numpy" in sys.modules
from sdplan.core.runtime import process
engine = process.Engine()
engine._proc = child  # as Engine.start() takes a prestarted child
threading.Thread(target=engine._drain, args=(child,), daemon=True).start()
inv = engine.call("sdplan.core.pipelines.jobs:inventory_job", {})
seen["comm"] = open(f"/proc/{child.pid}/comm").read().strip()  # named before it serves jobs
seen["devices"] = [d["name"] for d in inv["devices"]]
try:
    engine.call("sdplan.core.pipelines.jobs:no_such_job", {})
except Exception as exc:
    seen["error"] = type(exc).__name__
seen["alive_after_error"] = child.poll() is None
engine.close()
seen["code"] = child.returncode
print(json.dumps(seen))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the command line forks on Linux only")
def test_a_single_threaded_command_line_forks_its_engine_child() -> None:
    """``prestart(fork=True)`` in a fresh single-threaded process forks the child: it is a
    direct child named ``sdplan-engine``, imports its jobs' modules (numpy among them) in
    its own memory, serves jobs and errors as a spawned child does, and exits 0 on close."""
    pytest.importorskip("sdplan._ggml")
    got = _python(FORKED)
    assert got["could"] and got["kind"] == "ForkedChild" and got["ppid"] and not got["numpy_here"]
    assert got["comm"] == "sdplan-engine" and "CPU" in got["devices"]
    assert got["error"] == "EngineError" and got["alive_after_error"] and got["code"] == 0


def test_no_fork_with_other_threads_or_native_modules_loaded(monkeypatch) -> None:
    """Forking copies a process as it is: with a second thread running, or numpy (its BLAS
    threads) loaded, ``prestart(fork=True)`` spawns a fresh interpreter instead."""
    import threading

    assert "numpy" in sys.modules or "pytest" in sys.modules
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert not prestart.can_fork()
    finally:
        stop.set()
        worker.join()
    monkeypatch.setitem(sys.modules, "numpy", sys.modules.get("numpy", object()))
    assert not prestart.can_fork()
    prestart.prestart((), fork=True)
    try:
        child = prestart.take_prestarted()
        assert isinstance(child, subprocess.Popen)
    finally:
        prestart.end_unused(child)


def test_a_forked_childs_wait_poll_and_kill() -> None:
    """:class:`ForkedChild` answers as Popen does: ``wait(timeout)`` raises TimeoutExpired
    while the child runs, ``kill()`` ends it and its status is minus the signal."""
    import signal

    pid = os.fork()
    if pid == 0:  # a child that waits to be killed
        time.sleep(60)
        os._exit(3)
    r, w = os.pipe()
    child = prestart.ForkedChild(pid, open(w, "wb"), open(r, "rb"), open(os.devnull, "rb"))
    try:
        assert child.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(0.05)
        child.kill()
        assert child.wait(10) == -signal.SIGKILL and child.poll() == -signal.SIGKILL
        child.kill()  # reaped: nothing to signal, no error
    finally:
        for stream in (child.stdin, child.stdout, child.stderr):
            stream.close()


def test_a_command_line_builds_its_own_commands_parser_alone() -> None:
    """A command line naming its command loads that command's module only, and the parser
    it gets gives the same usage and the same command help as the full one."""
    import argparse

    full = cli.build_parser()

    def commands(parser: argparse.ArgumentParser) -> dict:
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices

    assert list(commands(full)) == list(cli.COMMANDS)
    for name in cli.COMMANDS:
        one = cli.build_parser(name)
        assert list(commands(one)) == [name]
        assert commands(one)[name].format_help() == commands(full)[name].format_help()
        assert one.format_usage() == full.format_usage()
    assert cli.command_word(["-v", "generate", "-p", "x"]) == "generate"
    assert cli.command_word(["-h", "generate"]) is None and cli.command_word(["-v"]) is None
    assert cli.command_word(["--", "generate"]) is None and cli.command_word(["-", "generate"]) is None
    got = _python("import json, sys\nfrom sdplan.core import cli\ncli.build_parser(cli.command_word(['generate']))\n"
                  "print(json.dumps(sorted(m for m in sys.modules if m.startswith('sdplan.core.commands.'))))")
    assert "sdplan.core.commands.generate" in got
    assert not {"sdplan.core.commands.devices", "sdplan.core.commands.gui", "sdplan.core.commands.rpc_server",
                "sdplan.core.commands.upscale", "sdplan.core.commands.library"} & set(got)


def _safetensors(path: Path, values: bytes) -> None:
    head = json.dumps({"w": {"dtype": "U8", "shape": [len(values)], "data_offsets": [0, len(values)]}}).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + values)


def test_a_header_is_read_again_when_its_file_changes(tmp_path: Path, monkeypatch) -> None:
    """A settled file's header comes from memory the second time; a rewrite of the same
    size is read anew (a fresh file never comes from memory, a settled one is known by its
    timestamps)."""
    reads: list[str] = []
    real = readers._read_header
    monkeypatch.setattr(readers, "_read_header", lambda p, fh, size: reads.append(str(p)) or real(p, fh, size))
    path = tmp_path / "m.safetensors"
    _safetensors(path, b"abcd")
    assert readers.read_tensor_file(path).tensors[0].shape == (4,)
    _safetensors(path, b"wxyz")  # same size, just written: read again
    readers.read_tensor_file(path)
    assert len(reads) == 2
    # settled: changed longer ago than the rule's seconds (none here: os.utime sets the
    # status-change time to now, and the rule counts it too)
    monkeypatch.setattr(readers, "HEADER_SETTLE_SECONDS", 0.0)
    old = time.time() - 3600
    os.utime(path, (old, old))
    first = readers.read_tensor_file(path)
    again = readers.read_tensor_file(path)
    assert len(reads) == 3 and again == first
    again.metadata["x"] = "y"  # the caller's own copy
    assert "x" not in readers.read_tensor_file(path).metadata
    head = json.dumps({"v": {"dtype": "U8", "shape": [2, 2], "data_offsets": [0, 4]}}).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"wxyz")
    os.utime(path, (old - 10, old - 10))  # another (old) timestamp: read anew
    assert [t.name for t in readers.read_tensor_file(path).tensors] == ["v"] and len(reads) == 4


def test_the_parents_cpu_time_is_read() -> None:
    got = _python("import json\nfrom sdplan.core.runtime.threads import parent_cpu_seconds\n"
                  "print(json.dumps(parent_cpu_seconds()))")
    assert got > 0.0  # this test process has run for a while


def test_the_engines_pipeline_cache_loads_a_replaced_model_file_again(tmp_path: Path) -> None:
    """A model file replaced (or rewritten) between two requests to one engine process gets a
    new pipeline: weights of the old file are never reused under the new file's name."""
    from types import SimpleNamespace

    from sdplan.core.pipelines import run_context
    from sdplan.core.pipelines.request import GenerationRequest

    model = tmp_path / "m.safetensors"
    model.write_bytes(b"first")
    made: list[int] = []

    class Pipe:
        def close(self) -> None:
            pass

    def make() -> Pipe:
        made.append(1)
        return Pipe()

    ctx = run_context.RunContext(SimpleNamespace(cancel=None),
                                 GenerationRequest.from_settings({"prompt": "x"}, {"model": [str(model)]}))
    run_context.close_cached()
    try:
        first = ctx.cached("sd", make)
        assert ctx.cached("sd", make) is first and len(made) == 1
        other = tmp_path / "new.safetensors"
        other.write_bytes(b"second, longer")
        other.replace(model)  # an atomic replace: same path, another file
        assert ctx.cached("sd", make) is not first and len(made) == 2
        with open(model, "r+b") as fh:  # rewritten in place, same size
            fh.write(b"SECOND")
        os.utime(model, ns=(0, 10**9))  # a different modification time
        ctx.cached("sd", make)
        assert len(made) == 3
    finally:
        run_context.close_cached()


def test_a_command_started_with_stdout_closed_runs() -> None:
    """``sdplan devices >&-``: Python gives no sys.stdout; the command still runs (exit 0)."""
    out = subprocess.run(["sh", "-c", 'exec "$0" -m sdplan.core.cli devices >&-', sys.executable],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
