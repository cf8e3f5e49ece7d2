"""One bounded reader per format: JSON within depth, size and count limits for every JSON
sdplan reads; ``.pth`` archives decompressed within a budget, streamed; every path through one
helper that turns the operating system's errors into one line naming the path."""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, PngImagePlugin
from pth_writer import Tensor, save, state_dict
from sdplan.core.cli import main
from sdplan.core.errors import ModelFileError, PathError, PlanError
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.modelfiles.library import LibraryCache
from sdplan.core.modelfiles.pth import read_pth
from sdplan.core.pipelines.job_queue import JobQueue
from sdplan.core.pipelines.stages.parameters import parse_parameters
from sdplan.core.pipelines.stages.results import read_result
from sdplan.core.planning import bounded_json, paths
from sdplan.core.planning.bounded_json import JsonLimits, JsonRefused, loads, read_json
from sdplan.core.planning.session import load_plan_file

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"
LONG = "n" * 5000
DEEP = "[" * 100_000 + "]" * 100_000


def one_line(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 2) -> str:
    """``sdplan ARGV`` in this process: exit ``code`` and one line on stderr, no traceback."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


# ----------------------------------------------------------------------------- JSON


def test_loads_within_limits_and_each_refusal_names_its_source() -> None:
    assert loads('{"a": [1, 2.5, "x", null, true]}') == {"a": [1, 2.5, "x", None, True]}
    small = JsonLimits(max_bytes=100, max_depth=3, max_containers=5, max_items=6)
    cases = {
        '{"a": "' + "x" * 200 + '"}': "209 bytes of JSON, more than the 100 byte limit",
        "[[[[1]]]]": "JSON nested deeper than 3 levels",
        "[[],[],[],[],[]]": "6 arrays and objects, more than the 5 limit",
        "[1,2,3,4,5,6,7]": "7 values, more than the 6 limit",
        "[NaN]": "NaN is not a finite number",
        "[1e999]": "the number 1e999 overflows",
        "{not json": "not JSON (Expecting property name",
        b"\xff[]": "not JSON (not UTF-8 text at byte 0)",
    }
    for text, message in cases.items():
        with pytest.raises(JsonRefused) as err:
            loads(text, "SRC", small)
        assert str(err.value).startswith("SRC: ") and message in str(err.value), err.value
    with pytest.raises(JsonRefused, match="nested deeper than 64 levels"):
        loads(DEEP, "deep")  # Python's parser would end in a RecursionError
    with pytest.raises(JsonRefused, match="nested deeper than 64 levels"):
        loads("[" * 65 + "]" * 65)  # parses, then the walk counts 65 levels
    assert loads("[" * 64 + "]" * 64) is not None
    with pytest.raises(JsonRefused, match="not JSON"):
        loads("[" + "9" * 5000 + "]")  # past Python's 4300-digit integer limit
    assert isinstance(JsonRefused("x"), ValueError)


def test_the_caller_hook_errors_pass_through() -> None:
    class Dup(ValueError):
        pass

    def hook(pairs):  # noqa: ANN001, ANN202
        raise Dup("dup")

    with pytest.raises(Dup):
        loads('{"a": 1}', object_pairs_hook=hook)


def test_read_json_reads_no_more_than_its_limit(tmp_path: Path, monkeypatch) -> None:
    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 600_000 + "0]")
    read: list[int] = []
    real = paths.read_bytes

    def counting(path, limit, what="file"):  # noqa: ANN001, ANN202
        out = real(path, limit, what)
        read.append(len(out))
        return out

    monkeypatch.setattr(bounded_json.paths, "read_bytes", counting)
    with pytest.raises(JsonRefused, match="larger than the 1000 byte limit of a JSON inventory"):
        read_json(big, JsonLimits(max_bytes=1000), what="inventory")
    assert read == [1001]


def test_read_json_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, message in ((fifo, "not a regular file (a FIFO)"), (tmp_path, "is a folder, not an inventory"),
                          (tmp_path / "none.json", "no such inventory"),
                          (tmp_path / LONG, "file name too long"), ("/dev/zero", "a character device")):
        with pytest.raises(PathError) as err:
            read_json(path, what="inventory")
        assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


# ----------------------------------------------------------------------------- paths


def test_path_helper_answers_or_names_the_path(tmp_path: Path, monkeypatch) -> None:
    assert paths.is_file(DEMO) and paths.is_dir(tmp_path) and not paths.exists(tmp_path / "x")
    assert not paths.exists(DEMO / "under-a-file")  # ENOTDIR: nothing there
    with pytest.raises(PathError, match="file name too long"):
        paths.exists(tmp_path / LONG)
    with pytest.raises(PathError, match="holds a NUL character"):
        paths.is_file("a\0b")
    denied(monkeypatch)
    with pytest.raises(PathError) as err:
        paths.is_file(tmp_path / "denied" / "x")
    assert str(err.value) == f"{tmp_path / 'denied' / 'x'}: permission denied"
    assert isinstance(err.value, OSError) and err.value.code == "bad_path"


def denied(monkeypatch: pytest.MonkeyPatch) -> None:
    """Paths under a folder named ``denied`` raise EACCES, as a folder without search
    permission does for anyone but root (the suite may run as root)."""
    real = os.stat

    def stat(path, *a, **k):  # noqa: ANN001, ANN202
        if "/denied/" in os.fspath(path):
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "stat", stat)


GEN = ["generate", "-p", "a red circle", "-W", "64", "-H", "64", "--steps", "1", "--in-process"]


@pytest.mark.parametrize("make_argv", [
    lambda t, bad: [*GEN, "-m", str(DEMO), "-o", f"{bad}.png"],
    lambda t, bad: [*GEN, "-m", str(DEMO), "-o", str(t / "o.png"), "--preview-path", bad],
    lambda t, bad: [*GEN, "-m", bad, "-o", str(t / "o.png")],
    lambda t, bad: [*GEN, "-m", str(DEMO), "-o", str(t / "o.png"), "-i", bad],
    lambda t, bad: ["generate", "-m", str(DEMO), "-p", f"x <lora:{bad}:1>", "--in-process",
                    "-o", str(t / "o.png")],
    lambda t, bad: ["inspect", bad],
    lambda t, bad: ["library", bad],
    lambda t, bad: ["plan", "--profile", bad],
    lambda t, bad: ["plan", "--devices", bad],
    lambda t, bad: ["upscale", "-i", bad, "--upscale-model", str(DEMO), "-o", str(t / "o.png")],
])
@pytest.mark.parametrize("kind", ["too long", "denied"])
def test_unusable_paths_are_one_line_errors(tmp_path: Path, capsys, monkeypatch, make_argv,
                                            kind: str) -> None:
    if kind == "denied":
        denied(monkeypatch)
        bad = str(tmp_path / "denied" / "thing")
    else:
        bad = str(tmp_path / LONG)
    line = one_line(capsys, make_argv(tmp_path, bad))
    assert line.startswith("error"), line
    assert ("file name too long" if kind == "too long" else "permission denied") in line


def test_a_shard_name_too_long_names_the_index(tmp_path: Path) -> None:
    comp = tmp_path / "unet"
    comp.mkdir()
    (comp / "m.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": LONG + ".safetensors"}}))
    with pytest.raises(ModelFileError) as err:
        read_model_files({"diffusion_model": [comp]})
    assert "m.safetensors.index.json: shard 'nnnn" in str(err.value)
    assert "file name too long" in str(err.value)
    (comp / "m.safetensors.index.json").write_text('{"weight_map": ' + DEEP + "}")
    with pytest.raises(ModelFileError, match="unreadable shard index .*nested deeper than 64"):
        read_model_files({"diffusion_model": [comp]})


# ----------------------------------------------------------------------------- every JSON reader


def test_every_json_reader_refuses_deep_nesting_in_one_line(tmp_path: Path, capsys) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP)
    assert "nested deeper than 64 levels" in one_line(capsys, ["plan", "--devices", str(deep)])
    assert "nested deeper than 64 levels" in one_line(capsys, ["plan", "--profile", str(deep)])
    with pytest.raises(PlanError, match="nested deeper than 64 levels"):
        load_plan_file(deep)
    broken = tmp_path / "cache.json"
    broken.write_text('{"stamp": "x", "entries": ' + DEEP + "}")
    cache = LibraryCache(broken)  # a cache that cannot be read is an empty one, rewritten
    assert cache.entries == {} and not cache.foreign
    assert LibraryCache(deep).foreign  # an array is no cache of sdplan's: never replaced
    assert parse_parameters('a cat\nSteps: 4, SDCPP: {"x": ' + DEEP + "}").settings["steps"] == 4


def test_library_cache_never_replaces_a_file_that_is_not_a_cache(tmp_path: Path) -> None:
    model = tmp_path / "m.safetensors"
    model.write_bytes(DEMO.read_bytes())
    before = model.read_bytes()
    main(["library", str(REPO / "resources" / "demo"), "--cache", str(model)])
    assert model.read_bytes() == before
    other = tmp_path / "other.json"
    other.write_text('{"devices": []}')
    cache = LibraryCache(other)
    assert cache.foreign
    cache._dirty = True
    cache.save()
    assert other.read_text() == '{"devices": []}'


def png_with(path: Path, chunks: dict[str, str]) -> Path:
    info = PngImagePlugin.PngInfo()
    for k, v in chunks.items():
        info.add_text(k, v)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path, pnginfo=info)
    return path


def test_a_picture_record_of_any_shape_reads(tmp_path: Path) -> None:
    deep = png_with(tmp_path / "deep.png", {"sdplan": '{"settings": ' + "[" * 900 + "]" * 900 + "}",
                                            "parameters": "a cat\nSteps: 4, Seed: 3"})
    info = read_result(deep)
    assert info.settings["prompt"] == "a cat" and info.settings["seed"] == 3
    odd = png_with(tmp_path / "odd.png", {"sdplan": json.dumps(
        {"settings": ["x"], "model_files": {"model": 5, "vae": ["v.safetensors"]},
         "placement": [1], "model_flags": "x"})})
    info = read_result(odd)
    assert info.model_files == {"vae": ["v.safetensors"]} and info.placement == {}
    typed = png_with(tmp_path / "typed.png", {"sdplan": json.dumps(
        {"settings": {"prompt": ["not text"], "width": "wide", "steps": 4, "cfg_scale": 1e300,
                      "seed": 2**70}})})
    assert read_result(typed).settings == {"steps": 4, "cfg_scale": 1e300}


def test_queue_keeps_its_good_jobs_and_sets_the_rest_aside(tmp_path: Path) -> None:
    path = tmp_path / "queue.json"
    good = {"id": "a1", "label": "a", "request": {"prompt": "a cat", "steps": 4}}
    path.write_text(json.dumps({"sdplan_queue": 1, "jobs": [
        good, {"id": "b2"}, 7, {"id": "c3", "request": {}, "started": "yesterday"},
        {**good, "id": "d4", "request": {"prompt": "a dog", "steps": [1]}}]}))
    q = JobQueue(path)
    assert [j.id for j in q.jobs] == ["a1", "d4"] and q.jobs[1].steps == 1
    assert q.notes == [f"3 of 5 entries of the queue {path} are not jobs; they were set aside "
                       f"in {path}.bad; the other 2 are kept"]
    assert json.loads((tmp_path / "queue.json.bad").read_text())[1] == 7
    path.write_text('{"sdplan_queue": 1, "jobs": ' + DEEP + "}")
    q = JobQueue(path)
    assert q.jobs == [] and not path.exists() and (tmp_path / "queue.json.bad").exists()
    assert "nested deeper than 64 levels" in q.notes[0] and "set aside" in q.notes[0]
    q = JobQueue(tmp_path / LONG / "queue.json")
    assert q.jobs == [] and "file name too long" in q.notes[0]


# ----------------------------------------------------------------------------- .pth archives


def zip_bomb(path: Path, n_floats: int) -> Path:
    """A ``torch.save`` zip whose one storage claims ``n_floats`` elements, deflated zeros (a
    few hundred KiB for hundreds of MiB)."""
    save(state_dict({"w": Tensor.of(np.zeros(1, np.float32))}), path)
    with zipfile.ZipFile(path) as zf:
        entries = {i.filename: zf.read(i) for i in zf.infolist()}
    pkl = f"{path.stem}/data.pkl"
    count = b"X\x03\x00\x00\x00cpuq\x07K\x01"  # the storage's device, then its element count
    assert entries[pkl].count(count) == 1
    entries[pkl] = entries[pkl].replace(count, count[:-2] + b"J" + struct.pack("<i", n_floats))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for name, data in entries.items():
            if not name.endswith("/data/0"):
                zf.writestr(name, data)
                continue
            with zf.open(name, "w", force_zip64=True) as fh:
                for _ in range(n_floats * 4 >> 22):
                    fh.write(bytes(1 << 22))
    return path


def test_a_zip_bomb_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    bomb = zip_bomb(tmp_path / "w.pth", 64 << 20)  # 256 MiB of zeros
    assert bomb.stat().st_size < 2 << 20
    code = ("import sys\nfrom sdplan.core.modelfiles.pth import read_pth\n"
            "from sdplan.core.errors import ModelFileError\nfrom hostile_corpus import peak_kib\n"
            "try:\n    read_pth(sys.argv[1])\nexcept ModelFileError as e:\n    print(e)\n"
            "print(peak_kib())\n")
    res = subprocess.run([sys.executable, "-c", code, str(bomb)], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).parent)
    message, peak_kib = res.stdout.strip().splitlines()
    assert "archive entry w/data/0 needs 268435456 bytes, past the" in message, res.stdout + res.stderr
    assert "zip bomb" in message and str(bomb) in message
    assert int(peak_kib) < 200 << 10  # under 200 MiB: the entry was never inflated


def test_a_legacy_storage_claiming_past_the_file_and_zero_strides(tmp_path: Path) -> None:
    t = Tensor.of(np.zeros(4, np.float32))
    path = tmp_path / "legacy.pth"
    save(state_dict({"w": t}), path, legacy=True)
    raw = bytearray(path.read_bytes())
    at = raw.rindex(struct.pack("<q", 4))  # the element count before the storage bytes
    raw[at:at + 8] = struct.pack("<q", 1 << 40)
    path.write_bytes(bytes(raw))
    with pytest.raises(ModelFileError, match="claims 1099511627776 elements, past the end of the file"):
        read_pth(path)
    wide = Tensor(t.storage, 0, (1 << 20, 1 << 10), (0, 0))  # 4 GiB from 16 bytes
    path2 = tmp_path / "wide.pth"
    save(state_dict({"w": wide}), path2)
    with pytest.raises(ModelFileError, match=r"tensor of size \(1048576, 1024\) needs 4294967296 bytes"):
        read_pth(path2)


def test_from_image_takes_recorded_sigmas_and_sample_args(tmp_path: Path, capsys) -> None:
    """A picture's record holds ``sigmas`` as a list and ``extra_sample_args`` as a map:
    ``--from-image`` turns them back into the flags' values."""
    pytest.importorskip("sdplan._ggml")
    first = tmp_path / "first.png"
    base = ["generate", "-m", str(DEMO), "-p", "a red circle", "-W", "64", "-H", "64", "-t", "1",
            "--in-process"]
    assert main([*base, "--sigmas", "14,7,1,0", "--sampling-method", "euler_ge",
                 "--extra-sample-args", "gamma=0.5", "-o", str(first)]) == 0
    again = tmp_path / "again.png"
    assert main(["generate", "--from-image", str(first), "-t", "1", "--in-process", "-o", str(again)]) == 0
    capsys.readouterr()
    got = read_result(again).settings
    assert got["sigmas"] == [14.0, 7.0, 1.0, 0.0] and got["extra_sample_args"] == {"gamma": "0.5"}
    assert got["sampling_method"] == "euler_ge"
