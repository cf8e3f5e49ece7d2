"""Hostile and broken model files: each is a ModelFileError naming the file and the problem.

Nothing may crash with another exception, hang, or allocate what a header claims: a
header claiming terabytes is checked with tracemalloc's peak.
"""

from __future__ import annotations

import json
import struct
import tracemalloc
from pathlib import Path

import gguf  # noqa: F401  (imported up front so tracemalloc sees only the reads)
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file
from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.checkpoint import read_model_files
from sdplan.core.modelfiles.readers import MAX_HEADER_BYTES, read_tensor_file


def raw_st(path: Path, header: bytes | str, data: bytes = b"", length: int | None = None) -> Path:
    """Write a safetensors file with a literal header (and optional lying length)."""
    hb = header.encode() if isinstance(header, str) else header
    path.write_bytes(struct.pack("<Q", len(hb) if length is None else length) + hb + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def expect_error(path: Path, match: str) -> ModelFileError:
    with pytest.raises(ModelFileError, match=match) as err:
        read_tensor_file(path)
    assert err.value.path == str(path) and path.name in str(err.value)
    return err.value


def test_truncated_file(tmp_path: Path) -> None:
    good = tmp_path / "good.safetensors"
    save_file({"a": np.zeros((64, 64), np.float32)}, str(good))
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-100])
    expect_error(cut, "truncated")
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"\x05\x00")
    expect_error(tiny, "too short")


def test_header_length_beyond_the_file(tmp_path: Path) -> None:
    expect_error(raw_st(tmp_path / "x.safetensors", "{}", length=10**12), "beyond the file")


def test_header_length_above_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as fh:  # sparse: the claimed header exists but is never read
        fh.write(struct.pack("<Q", MAX_HEADER_BYTES + 1))
        fh.seek(MAX_HEADER_BYTES + 8)
        fh.write(b"\0")
    tracemalloc.start()
    expect_error(path, "exceeds")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20


def test_header_not_json(tmp_path: Path) -> None:
    expect_error(raw_st(tmp_path / "a.safetensors", "{not json"), "not JSON")
    expect_error(raw_st(tmp_path / "b.safetensors", b"\xff\xfe{}"), "not JSON")
    expect_error(raw_st(tmp_path / "c.safetensors", "[1, 2]"), "not a JSON object")


def test_unknown_dtype(tmp_path: Path) -> None:
    h = json.dumps({"w": entry("F12", [2], 0, 4)})
    expect_error(raw_st(tmp_path / "d.safetensors", h, b"\0" * 4), "unknown dtype 'F12'")


def test_duplicate_names(tmp_path: Path) -> None:
    h = ('{"w": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},'
         ' "w": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}}')
    expect_error(raw_st(tmp_path / "dup.safetensors", h, b"\0" * 8), "duplicate tensor name 'w'")


@pytest.mark.parametrize("entries, match", [
    ({"a": entry("F16", [2], 0, 4), "b": entry("F16", [2], 2, 6)}, "overlap"),
    ({"a": entry("F16", [3], 0, 4)}, "needs 6"),
    ({"a": entry("F16", [2], 4, 0)}, "bad data_offsets"),
    ({"a": entry("F16", [-2], 0, 4)}, "not a list of sizes"),
    ({"a": entry("F16", [2], 0, 4) | {"data_offsets": [0, "4"]}}, "bad data_offsets"),
    ({"a": "F16"}, "not an object"),
    ({"a": entry("F16", [4], 0, 8)}, "truncated"),
])
def test_bad_entries(tmp_path: Path, entries: dict, match: str) -> None:
    expect_error(raw_st(tmp_path / "e.safetensors", json.dumps(entries), b"\0" * 6), match)


def test_header_claiming_terabytes_is_not_read(tmp_path: Path) -> None:
    n = 2**20
    h = json.dumps({"huge": entry("F32", [n, n], 0, n * n * 4)})
    path = raw_st(tmp_path / "tb.safetensors", h, b"\0" * 16)
    tracemalloc.start()
    expect_error(path, "truncated")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize("content, match", [
    (b"", "too short"),
    (b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "not a safetensors or GGUF"),
    (b"hello world, this is text\n" * 4, "not a safetensors or GGUF"),
    (b"PK\x03\x04" + b"\0" * 60, "PyTorch pickle"),
    (b"\x80\x02}q\x00(X\x01\x00" + b"\0" * 8, "PyTorch pickle"),
])
def test_not_a_model_file(tmp_path: Path, content: bytes, match: str) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(content)
    expect_error(path, match)


def test_no_tensors_and_missing_paths(tmp_path: Path) -> None:
    empty = raw_st(tmp_path / "empty.safetensors", '{"__metadata__": {"a": "b"}}')
    with pytest.raises(ModelFileError, match="no tensors"):
        read_model_files({"model": [empty]})
    with pytest.raises(ModelFileError, match="no such file"):
        read_model_files({"vae": [tmp_path / "nope.safetensors"]})
    (tmp_path / "folder").mkdir()
    with pytest.raises(ModelFileError, match="no .safetensors"):
        read_model_files({"model": [tmp_path / "folder"]})
    with pytest.raises(ModelFileError, match="is a folder"):
        read_tensor_file(tmp_path)


# --------------------------------------------------------------------------- GGUF


def gguf_bytes(kv: bytes = b"", n_kv: int = 0, tensors: bytes = b"", n_tensors: int = 0,
               version: int = 3, tail: bytes = b"") -> bytes:
    return (b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kv + tensors + tail)


def gstr(s: str) -> bytes:
    return struct.pack("<Q", len(s)) + s.encode()


def tinfo(name: str, dims: list[int], ggml_type: int, offset: int) -> bytes:
    return (gstr(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", ggml_type, offset))


def test_gguf_hostile_headers(tmp_path: Path) -> None:
    p = tmp_path / "m.gguf"

    def check(data: bytes, match: str) -> None:
        p.write_bytes(data)
        tracemalloc.start()
        expect_error(p, match)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 1 << 20

    check(b"GGUF\x03\x00", "truncated GGUF header")
    check(gguf_bytes(version=1), "unsupported GGUF version 1")
    check(gguf_bytes(n_tensors=2**60), "more than the file can hold")
    # an array claiming 2^60 strings, and one claiming 2^60 uint32 items
    arr = gstr("tokens") + struct.pack("<IIQ", 9, 8, 2**60) + gstr("a")
    check(gguf_bytes(arr, 1, tail=b"\0" * 64), "runs past the end")
    arr = gstr("ids") + struct.pack("<IIQ", 9, 4, 2**60)
    check(gguf_bytes(arr, 1, tail=b"\0" * 64), "runs past the end")
    check(gguf_bytes(gstr("k") + struct.pack("<I", 99), 1, tail=b"\0" * 32),
          "unknown value type 99")
    check(gguf_bytes(struct.pack("<Q", 2**62) + b"k", 1, tail=b"\0" * 32), "exceeds")
    data = b"\0" * 64
    check(gguf_bytes(tensors=tinfo("w", [32], 200, 0), n_tensors=1, tail=data),
          "unknown ggml type 200")
    check(gguf_bytes(tensors=tinfo("w", [32, 2**40], 0, 0), n_tensors=1, tail=data),
          "truncated: tensor 'w'")
    two = tinfo("w", [4], 0, 0) + tinfo("w", [4], 0, 32)
    check(gguf_bytes(tensors=two, n_tensors=2, tail=data), "duplicate tensor name 'w'")
    two = tinfo("a", [8], 0, 0) + tinfo("b", [8], 0, 16)
    check(gguf_bytes(tensors=two, n_tensors=2, tail=data * 2), "overlap")
    check(gguf_bytes(tensors=tinfo("q", [20], 2, 0), n_tensors=1, tail=data),
          "not a multiple of the Q4_0 block size 32")
    check(gguf_bytes(tensors=tinfo("d", [1, 1, 1, 1, 1], 0, 0), n_tensors=1, tail=data),
          "5 dimensions")


def test_gguf_valid_minimal(tmp_path: Path) -> None:
    """A hand-made GGUF: F32 [2, 4] and Q8_0 [1, 32] after 32-byte alignment."""
    ti = tinfo("a", [4, 2], 0, 0) + tinfo("q", [32, 1], 8, 32)
    head = gguf_bytes(tensors=ti, n_tensors=2)
    pad = b"\0" * (-len(head) % 32)
    p = tmp_path / "ok.gguf"
    p.write_bytes(head + pad + b"\0" * 32 + b"\0" * 34)
    tf = read_tensor_file(p)
    start = len(head) + len(pad)
    assert [(t.name, t.dtype, t.shape, t.nbytes, t.offset) for t in tf.tensors] == [
        ("a", "F32", (2, 4), 32, start), ("q", "Q8_0", (1, 32), 34, start + 32)]


# --------------------------------------------------------------------------- fuzz


def _good_file(tmp_path: Path, kind: str) -> Path:
    good = tmp_path / f"g.{kind}"
    if good.exists():
        return good
    if kind == "safetensors":
        save_file({"a.weight": np.zeros((3, 4), np.float16), "b": np.ones(5, np.float32)},
                  str(good))
    else:
        ti = tinfo("a", [4, 2], 0, 0) + tinfo("q", [32, 1], 8, 32)
        kv = gstr("general.name") + struct.pack("<I", 8) + gstr("x")
        kv += gstr("tok") + struct.pack("<IIQ", 9, 8, 2) + gstr("ab") + gstr("c")
        head = gguf_bytes(kv, 2, ti, 2)
        good.write_bytes(head + b"\0" * (-len(head) % 32 + 66))
    return good


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["safetensors", "gguf"]), cut=st.integers(0, 400),
       flips=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 255)), max_size=4))
def test_damaged_files_only_raise_model_file_errors(tmp_path: Path, kind: str, cut: int,
                                                     flips: list[tuple[int, int]]) -> None:
    """Any truncation or byte change of a valid file reads or fails with ModelFileError."""
    good = _good_file(tmp_path, kind)
    data = bytearray(good.read_bytes()[:cut] if cut < 300 else good.read_bytes())
    for pos, val in flips:
        if pos < len(data):
            data[pos] = val
    bad = tmp_path / f"bad.{kind}"
    bad.write_bytes(bytes(data))
    try:
        read_tensor_file(bad)
    except ModelFileError as exc:
        assert bad.name in str(exc)


@pytest.mark.parametrize("opener,closer", [("[", "]"), ('{"a":', "}")])
def test_header_nested_thousands_deep(tmp_path: Path, opener: str, closer: str) -> None:
    """A header nesting JSON 100,000 levels deep is one clear error, not a RecursionError."""
    for depth, name in ((100_000, "deep"), (2_000, "medium")):
        header = '{"t": ' + opener * depth + "1" + closer * depth + "}"
        expect_error(raw_st(tmp_path / f"{name}.safetensors", header), "nested deeper than 8 levels")
    for where in ("__metadata__", "t"):  # deep nesting inside metadata or an entry
        header = '{"' + where + '": {"x": ' + "[" * 50_000 + "1" + "]" * 50_000 + "}}"
        path = raw_st(tmp_path / f"meta_{where}.safetensors", header)
        with pytest.raises(ModelFileError):
            read_tensor_file(path)
