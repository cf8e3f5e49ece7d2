"""Fuzzing (hypothesis) of every reader and of ``plan`` / ``generate`` command lines.

Readers (the bounded JSON reader; the inventory, profile, plan, queue, library cache and
picture-record readers; ``.pth`` archives) get arbitrary bytes, arbitrary JSON and mutations
of valid files: each returns or raises only its documented one-line error. Command lines
are drawn from a vocabulary of each flag's good and hostile values (built on a valid 64x64,
one-step demo run, so a line that passes every check runs for a fraction of a second): the
exit code is 0, 2 or 3, a refusal is one line on stderr, no traceback is printed, and no
file outside the output folder is created or changed. The process's peak memory grows by
less than 1 GiB over the whole module.

The budget is fixed: examples per test are counted (derandomized, no deadline, no example
database), some 15 s in all on a 2-core machine.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, PngImagePlugin
from pth_writer import Tensor, save, state_dict
from sdplan.core.cli import main
from sdplan.core.errors import InventoryError, ModelFileError, PlanError
from sdplan.core.modelfiles.library import LibraryCache
from sdplan.core.modelfiles.pth import read_pth
from sdplan.core.pipelines.job_queue import JobQueue
from sdplan.core.pipelines.stages.parameters import parse_parameters
from sdplan.core.pipelines.stages.results import read_result
from sdplan.core.planning.bounded_json import JsonLimits, JsonRefused, loads
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.profile import Profile
from sdplan.core.planning.session import load_plan_file, read_plan_document

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"
LORA = REPO / "resources" / "demo" / "loras" / "outline.safetensors"
GIB = 1 << 30
#: The process's peak resident memory (KiB) when this module's first test starts (set by
#: :func:`peak_at_start`; at import it would be taken before the rest of a suite ran).
START_KIB: list[int] = []


@pytest.fixture(autouse=True, scope="module")
def peak_at_start() -> None:
    START_KIB.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)

FUZZ = settings(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(
        st.sampled_from(["devices", "modules", "name", "free", "total", "type", "registry",
                         "description", "blocks", "other", "backend", "model_files", "generation",
                         "jobs", "sdplan_queue", "id", "request", "state", "stamp", "entries",
                         "weight_map", "settings", "placement", "x"]), inner, max_size=6),
    max_leaves=30)


def _text(doc: object) -> bytes:
    return json.dumps(doc).encode()


DOCUMENTS = st.one_of(
    st.binary(max_size=300),
    JSON.map(_text),
    st.builds(lambda d, n: b"[" * n + _text(d) + b"]" * n, JSON, st.integers(0, 3000)),
    st.builds(lambda d, cut: _text(d)[:cut], JSON, st.integers(0, 200)),
    st.sampled_from([b"NaN", b"[Infinity]", b"1e999", b"[" + b"9" * 5000 + b"]", b"\xff{}", b""]),
)


@settings(FUZZ, max_examples=300)
@given(st.one_of(DOCUMENTS, st.text(max_size=300).map(str.encode)))
def test_bounded_json_returns_or_refuses(data: bytes) -> None:
    try:
        doc = loads(data, "fuzz", JsonLimits(max_bytes=1 << 16, max_depth=32))
    except JsonRefused as exc:
        assert str(exc).startswith("fuzz: ") and "\n" not in str(exc)
        return
    assert json.loads(data) == doc  # what it accepts, it reads as Python's parser does


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("readers")


@settings(FUZZ, max_examples=150)
@given(data=DOCUMENTS)
def test_file_readers_raise_only_their_one_line_errors(folder: Path, data: bytes) -> None:
    path = folder / "doc.json"
    path.write_bytes(data)
    for read, errors in ((Inventory.load, InventoryError), (Profile.load, ModelFileError),
                         (load_plan_file, PlanError)):
        try:
            read(path)
        except errors as exc:
            assert "\n" not in str(exc)
    queue = JobQueue(path)  # never raises: a bad file is set aside with a note
    assert all("\n" not in n for n in queue.notes)
    if not path.exists():
        path.write_bytes(data)
    LibraryCache(path)  # never raises: an unreadable cache is an empty one
    try:
        doc = loads(data, "session")
    except JsonRefused:
        return
    try:
        read_plan_document(doc, "session")
    except PlanError as exc:
        assert "\n" not in str(exc)


@settings(FUZZ, max_examples=80)
@given(record=DOCUMENTS, parameters=st.text(max_size=200), sdcpp=DOCUMENTS)
def test_picture_records_of_any_content_read(folder: Path, record: bytes, parameters: str,
                                             sdcpp: bytes) -> None:
    path = folder / "pic.png"
    info = PngImagePlugin.PngInfo()
    info.add_text("sdplan", record.decode("latin-1"))
    info.add_text("parameters", parameters + ", SDCPP: " + sdcpp.decode("latin-1"))
    Image.new("RGB", (4, 4)).save(path, pnginfo=info)
    result = read_result(path)
    assert isinstance(result.settings, dict) and isinstance(result.model_files, dict)
    parse_parameters(parameters + "\nSteps: 4, SDCPP: " + sdcpp.decode("latin-1"))


def _valid_pth(folder: Path, legacy: bool) -> bytes:
    path = folder / ("legacy.pth" if legacy else "zip.pth")
    save(state_dict({"a.weight": Tensor.of(np.arange(12, dtype=np.float32).reshape(3, 4)),
                     "b.bias": Tensor.of(np.ones(3, np.float16))}), path, legacy=legacy)
    return path.read_bytes()


@settings(FUZZ, max_examples=120)
@given(legacy=st.booleans(), cut=st.integers(0, 2000),
       flips=st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=6))
def test_damaged_pth_files_are_model_file_errors(folder: Path, legacy: bool, cut: int,
                                                 flips: list[tuple[int, int]]) -> None:
    data = bytearray(_valid_pth(folder, legacy))
    data = data[:cut] if cut < len(data) // 2 else data
    for pos, val in flips:
        if pos < len(data):
            data[pos] = val
    path = folder / "bad.pth"
    path.write_bytes(bytes(data))
    try:
        read_pth(path)
    except ModelFileError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc)


# ----------------------------------------------------------------------------- command lines


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Inputs (a demo model, a LoRA folder, pictures, hostile files, a FIFO) and an output
    folder."""
    root = tmp_path_factory.mktemp("argv")
    ins, out = root / "inputs", root / "out"
    ins.mkdir()
    out.mkdir()
    model = ins / "model.safetensors"
    shutil.copyfile(DEMO, model)
    (ins / "loras").mkdir()
    shutil.copyfile(LORA, ins / "loras" / "outline.safetensors")
    Image.new("RGB", (64, 64), (200, 30, 30)).save(ins / "pic.png")
    Image.new("L", (96, 32), 255).save(ins / "mask.png")
    info = PngImagePlugin.PngInfo()
    info.add_text("sdplan", "[" * 5000)
    info.add_text("parameters", "a cat\nSteps: 1, Seed: 3, Size: 64x64, Model: model.safetensors")
    Image.new("RGB", (64, 64)).save(ins / "record.png", pnginfo=info)
    (ins / "deep.json").write_bytes(b"[" * 100_000 + b"]" * 100_000)
    (ins / "bad.safetensors").write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with zipfile.ZipFile(ins / "bad.pth", "w") as zf:
        zf.writestr("x/data.pkl", b"\x80\x02]q\x00.")
    os.mkfifo(ins / "fifo")
    devices = {"devices": [
        {"name": "CUDA0", "description": "gpu", "type": "gpu", "registry": "CUDA", "free": 6 * GIB, "total": 8 * GIB},
        {"name": "CPU", "description": "cpu", "type": "cpu", "registry": "CPU", "free": 30 * GIB, "total": 32 * GIB}]}
    (ins / "devices.json").write_text(json.dumps(devices))
    return {"root": root, "inputs": ins, "out": out, "model": model}


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def _vocabulary(s: dict[str, Path], command: str) -> dict[str, list[str]]:
    ins, out = s["inputs"], s["out"]
    long = "n" * 5000
    shared = {
        "-W": ["64", "0", "-1", "8193", "x", ""], "-H": ["64", "0", "99999"],
        "-b": ["1", "0", "101", "two"],
        "--max-vram": ["CPU=2", "lots", "CPU=nan", "CUDA0=1e400", "=", "CPU=-0.5"],
        "--backend": ["CPU", "diffusion=GPU9", "☃", "", "te=CPU,vae=CPU", "x" * 3000],
        "--params-backend": ["vae=disk", "x=y", "*=CPU", ""],
        "-m": [str(s["model"]), str(ins / "missing.safetensors"), str(ins), str(ins / long),
               str(ins / "bad.safetensors"), str(ins / "fifo"), str(ins / "pic.png")],
        "--offload-to-cpu": [], "--vae-on-cpu": [], "--stream-layers": [],
    }
    if command == "plan":
        return {**shared, "--model-profile": ["sd15-f16", "flux1-dev-q8_0", "nope", "list"],
                "--profile": [str(ins / "deep.json"), str(ins / "missing.json"), str(ins / "devices.json")],
                "--devices": [str(ins / "devices.json"), str(ins / "deep.json"), str(ins / "fifo")],
                "--engine": ["sdplan", "sd-cli", "x"], "--json": [],
                "--command": ["sd-cli -m m.safetensors --steps 4", "--steps", "'unclosed", ""]}
    return {**shared,
            "--steps": ["1", "0", "1001", "x"], "--cfg-scale": ["1", "nan", "inf", "-1e9"],
            "--sampling-method": ["euler", "bogus", "dpm++2m", "lcm"], "--scheduler": ["karras", "nope"],
            "--sigmas": ["1,0", "nan", "-1", "1e308", ",", "a", ",".join(["1"] * 1002), "3e38,1"],
            "-s": ["1", "-1", str(2**64)], "--strength": ["0.5", "2", "nan"],
            "-i": [str(ins / "pic.png"), str(ins / "missing.png"), str(ins), str(ins / long),
                   str(ins / "fifo"), str(s["model"])],
            "--mask": [str(ins / "mask.png"), str(ins / "missing.png")],
            "-o": [str(out / "a.png"), str(out / "b.txt"), str(out) + "/", str(out / long) + ".png",
                   str(s["model"]), str(ins / "pic.png"), "/proc/sdplan-fuzz/x.png"],
            "--preview-path": [str(out / "prev"), str(ins / "pic.png"), str(out / long)],
            "-p": ["a red circle", "", "x" * 12000, "a <lora:outline:1>", "a <lora:outline:1e308>",
                   f"a <lora:{long}:1>", "a <lora:bad:nan>", "a <lora:missing:1>"],
            "-n": ["blurry", "y" * 12000],
            "--lora-model-dir": [str(ins / "loras"), str(ins / "missing")],
            "--unet-heads": ["8", "0", "3"], "--clip-heads": ["2", "3"],
            "--from-image": [str(ins / "record.png"), str(ins / "pic.png"), str(ins / "deep.json")],
            "--upscale-repeats": ["1", "9"], "--upscale-model": [str(ins / "bad.pth")],
            "--rng": ["cpu", "dice"], "--extra-sample-args": ["a=b", "novalue"],
            "--frobnicate": [], "--fa": [], "--control-net": ["x.safetensors"], "--demo": []}


def _argv(s: dict[str, Path], command: str):  # noqa: ANN202 - a hypothesis strategy
    vocab = _vocabulary(s, command)

    def token(flag: str):  # noqa: ANN202
        values = vocab[flag]
        return st.just([flag]) if not values else st.sampled_from(values).map(lambda v: [flag, v])

    pairs = st.lists(st.sampled_from(sorted(vocab)).flatmap(token), max_size=4)
    if command == "plan":
        base = ["plan", "--devices", str(s["inputs"] / "devices.json"), "-m", str(s["model"])]
    else:
        base = ["generate", "--in-process", "-t", "1", "-W", "64", "-H", "64", "--steps", "1",
                "-o", str(s["out"] / "default.png"), "-m", str(s["model"]), "-p", "a red circle"]
    return pairs.map(lambda ps: base + [t for p in ps for t in p])


def _run(argv: list[str]) -> tuple[int, str, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(argv)
        except SystemExit as exc:  # --help
            code = int(exc.code or 0)
    return code, err.getvalue(), out.getvalue()


def _check_run(s: dict[str, Path], argv: list[str]) -> None:
    before = _snapshot(s["inputs"])
    outside = {p.name for p in s["root"].iterdir()}
    code, err, out = _run(argv)
    assert code in (0, 2, 3), (argv, code, err[-500:])
    assert "Traceback" not in err and "Exception" not in err, (argv, err[-1000:])
    lines = [ln for ln in err.splitlines() if ln.startswith(("error", "sdplan"))]
    if code == 2 and "--json" in argv and not lines:  # plan --json: the error as JSON on stdout
        assert json.loads(out)["ok"] is False, (argv, out[-500:])
    elif code == 2:
        assert len(lines) == 1, (argv, err[-1000:])
    named = [Path(v) for f, v in zip(argv, argv[1:], strict=False) if f in ("-o", "--preview-path")]
    after = _snapshot(s["inputs"])
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    # no file created, changed or removed but the outputs the command line names
    assert all(any(Path(k) == n or Path(k).parent == n or Path(k).stem.startswith(n.stem + "_")
                   for n in named) for k in changed), (argv, changed)
    assert {p.name for p in s["root"].iterdir()} == outside, argv  # nothing beside out/


def test_plan_command_lines(sandbox: dict[str, Path]) -> None:
    @settings(FUZZ, max_examples=150)
    @given(argv=_argv(sandbox, "plan"))
    def run(argv: list[str]) -> None:
        _check_run(sandbox, argv)

    run()


def test_generate_command_lines(sandbox: dict[str, Path]) -> None:
    pytest.importorskip("sdplan._ggml")

    @settings(FUZZ, max_examples=150)
    @given(argv=_argv(sandbox, "generate"))
    def run(argv: list[str]) -> None:
        _check_run(sandbox, argv)

    run()


def test_memory_stayed_bounded() -> None:
    """The whole module (this is its last test) grew the process's peak resident memory by
    less than 1 GiB over the peak when its first test started (taken at import, the peak left
    out everything a suite ran between collecting and running this module: 1038 MiB once,
    most of it other modules')."""
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - START_KIB[0]
    assert grown < 1 << 20, f"{grown / 1024:.0f} MiB"
