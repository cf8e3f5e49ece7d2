"""The restricted .pth/.ckpt reader: valid checkpoints written by hand (zip and legacy)
and by torch.save (fixtures), and hostile pickles that must be refused before anything runs."""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
from sdplan.core.errors import ModelFileError
from sdplan.core.pth import load_pth_tensors, read_pth

FIXTURES = Path(__file__).resolve().parent / "fixtures"


# ----------------------------------------------------------------- writing checkpoints by hand
class _FakeStorage:
    """Stands for a torch storage while pickling: raw elements of one dtype."""

    def __init__(self, key: str, type_name: str, data: np.ndarray) -> None:
        self.key, self.type_name, self.data = key, type_name, data


class _FakeTensor:
    def __init__(self, storage: _FakeStorage, offset: int, size: tuple, stride: tuple) -> None:
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (sys.modules["torch._utils"]._rebuild_tensor_v2, self.args)


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """Stand-in ``torch`` and ``torch._utils`` modules so pickle writes torch's global names
    (nothing here imports the real torch)."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):  # type: ignore[no-untyped-def]
        raise AssertionError("only used as a name while pickling")

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2  # type: ignore[attr-defined]
    for name in ("FloatStorage", "HalfStorage", "LongStorage"):
        cls = type(name, (), {"__module__": "torch"})
        setattr(torch, name, cls)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)
    return types.SimpleNamespace(torch=torch)


class _Pickler(pickle.Pickler):
    def __init__(self, fh: io.BytesIO, legacy: bool, protocol: int = 2) -> None:
        super().__init__(fh, protocol=protocol)
        self.legacy = legacy

    def persistent_id(self, obj: object):  # type: ignore[no-untyped-def]
        if isinstance(obj, _FakeStorage):
            stype = getattr(sys.modules["torch"], obj.type_name)
            pid = ("storage", stype, obj.key, "cpu", obj.data.size)
            return (*pid, None) if self.legacy else pid
        return None


def write_zip(path: Path, obj: object, storages: list[_FakeStorage]) -> None:
    buf = io.BytesIO()
    _Pickler(buf, legacy=False).dump(obj)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", buf.getvalue())
        zf.writestr("archive/byteorder", "little")
        for s in storages:
            zf.writestr(f"archive/data/{s.key}", s.data.tobytes())
        zf.writestr("archive/version", "3\n")


def write_legacy(path: Path, obj: object, storages: list[_FakeStorage], protocol: int = 2) -> None:
    buf = io.BytesIO()
    for head in (0x1950A86A20F9469CFC6C, 1001, {"protocol_version": 1001, "little_endian": True}):
        pickle.dump(head, buf, protocol=2)
    # protocol 4 has opcodes for sets and bytes (no global needed)
    _Pickler(buf, legacy=True, protocol=protocol).dump(obj)
    pickle.dump([s.key for s in storages], buf, protocol=2)
    for s in storages:
        buf.write(struct.pack("<q", s.data.size) + s.data.tobytes())
    path.write_bytes(buf.getvalue())


def _sample() -> tuple[dict, list[_FakeStorage], dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    w = rng.standard_normal(24).astype(np.float32)
    h = rng.standard_normal(6).astype(np.float16)
    s0, s1 = _FakeStorage("0", "FloatStorage", w), _FakeStorage("1", "HalfStorage", h)
    obj = {"state_dict": collections.OrderedDict([
        ("conv.weight", _FakeTensor(s0, 0, (2, 3, 2, 2), (12, 4, 2, 1))),
        ("t", _FakeTensor(s0, 1, (3, 2), (1, 3))),           # strided view into the same storage
        ("half", _FakeTensor(s1, 2, (4,), (1,))),
        ("empty", _FakeTensor(s1, 0, (0, 5), (5, 1))),
    ]), "epoch": 7, "names": ["a", None, 1.5, True, (1, 2)]}
    expect = {"conv.weight": w.reshape(2, 3, 2, 2),
              "t": np.lib.stride_tricks.as_strided(w[1:], (3, 2), (4, 12)),
              "half": h[2:6], "empty": np.zeros((0, 5), np.float16)}
    return obj, [s0, s1], expect


@pytest.mark.parametrize("writer", [write_zip, write_legacy])
def test_hand_written_checkpoint(tmp_path: Path, fake_torch: object, writer) -> None:  # type: ignore[no-untyped-def]
    obj, storages, expect = _sample()
    path = tmp_path / "model.pth"
    writer(path, obj, storages)
    got = read_pth(path)
    assert got["epoch"] == 7 and got["names"] == ["a", None, 1.5, True, (1, 2)]
    tensors = load_pth_tensors(path)
    assert list(tensors) == list(expect)
    for k, v in expect.items():
        assert tensors[k].dtype == v.dtype and tensors[k].shape == v.shape, k
        np.testing.assert_array_equal(tensors[k], v)


# ------------------------------------------------------------------------------- torch.save files
def test_torch_zip_and_legacy_fixtures_agree() -> None:
    a = load_pth_tensors(FIXTURES / "compact_x2.pth")
    b = load_pth_tensors(FIXTURES / "compact_x2_legacy.pth")
    assert list(a) == [f"body.{i}.{p}" for i in range(7) for p in
                       (("weight", "bias") if i % 2 == 0 else ("weight",))]
    assert a["body.0.weight"].shape == (8, 3, 3, 3) and a["body.6.weight"].shape == (12, 8, 3, 3)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    io_ = read_pth(FIXTURES / "compact_x2.pth")["io"]
    assert io_["input"].shape == (1, 3, 12, 10) and io_["output"].shape == (1, 3, 24, 20)


def test_torch_odd_tensors() -> None:
    o = read_pth(FIXTURES / "odd_tensors.pth")
    assert isinstance(o, collections.OrderedDict)
    np.testing.assert_array_equal(o["param"], np.linspace(-1, 1, 5, dtype=np.float32))
    assert o["bf16"].dtype == np.float32
    np.testing.assert_array_equal(o["bf16"][:2], [1.5, -2.25])  # exact in bfloat16
    assert abs(o["bf16"][2] - 3.0e-3) < 2e-5  # bfloat16 keeps 8 bits of mantissa
    np.testing.assert_array_equal(o["f16"], np.array([[0.5, -1], [2, 65504]], np.float16))
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(o["transposed"], base.T)
    np.testing.assert_array_equal(o["row"], base[1])
    np.testing.assert_array_equal(o["col"], base[:, 2])
    assert o["ints"].dtype == np.int64 and o["ints"].tolist() == [1, -2, 3]
    assert o["meta"] == {"epoch": 3, "name": "tiny", "ratio": 0.5, "flags": [True, None], "pair": (1, 2)}


# ----------------------------------------------------------------------------- hostile pickles
class _System:
    def __init__(self, cmd: str) -> None:
        self.cmd = cmd

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, (self.cmd,))


class _Eval:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        import builtins

        return (builtins.exec, ("open('MARKER', 'w').write('x')",))


def _hostile_payloads(marker: Path) -> dict[str, object]:
    return {
        "os.system": {"state_dict": {"w": _System(f"touch {marker}")}},
        "exec": [_Eval()],
    }


@pytest.mark.parametrize("kind", ["os.system", "exec"])
@pytest.mark.parametrize("fmt", ["zip", "legacy", "bare"])
def test_hostile_pickle_is_refused_and_nothing_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     kind: str, fmt: str) -> None:
    marker = tmp_path / "MARKER"
    monkeypatch.chdir(tmp_path)  # the exec payload writes ./MARKER
    payload = _hostile_payloads(marker)[kind]
    path = tmp_path / "evil.pth"
    if fmt == "zip":
        write_zip(path, payload, [])
    elif fmt == "legacy":
        write_legacy(path, payload, [])
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    with pytest.raises(ModelFileError) as exc:
        read_pth(path)
    msg = str(exc.value)
    assert str(path) in msg and "refused global" in msg
    assert kind.split(".")[-1] in msg  # the refused global is named
    assert not marker.exists()


def test_refuses_tensor_past_its_storage(tmp_path: Path, fake_torch: object) -> None:
    s = _FakeStorage("0", "FloatStorage", np.zeros(4, np.float32))
    path = tmp_path / "oob.pth"
    write_zip(path, {"w": _FakeTensor(s, 2, (2, 2), (2, 1))}, [s])
    with pytest.raises(ModelFileError, match="reaches past"):
        read_pth(path)


def test_refuses_objects_that_are_not_plain_containers(tmp_path: Path) -> None:
    path = tmp_path / "set.pth"
    write_legacy(path, {"s": {1, 2}}, [], protocol=4)
    with pytest.raises(ModelFileError, match="type set"):
        read_pth(path)


def test_refuses_other_persistent_ids(tmp_path: Path) -> None:
    class P(pickle.Pickler):
        def persistent_id(self, obj):  # type: ignore[no-untyped-def]
            return ("module", "x") if obj == "marker" else None

    buf = io.BytesIO()
    P(buf, protocol=2).dump({"a": "marker"})
    with zipfile.ZipFile(tmp_path / "p.pth", "w") as zf:
        zf.writestr("archive/data.pkl", buf.getvalue())
    with pytest.raises(ModelFileError, match="persistent id"):
        read_pth(tmp_path / "p.pth")


@pytest.mark.parametrize("data", [b"", b"\x80\x02garbage", b"PK\x03\x04truncated", b"hello"])
def test_garbage_is_a_model_file_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "bad.ckpt"
    path.write_bytes(data)
    with pytest.raises(ModelFileError) as exc:
        read_pth(path)
    assert str(path) in str(exc.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="cannot read"):
        read_pth(tmp_path / "nope.pth")


def test_no_tensors(tmp_path: Path) -> None:
    path = tmp_path / "empty.pth"
    write_legacy(path, {"epoch": 1}, [])
    with pytest.raises(ModelFileError, match="no tensors"):
        load_pth_tensors(path)


def test_reader_never_imports_torch() -> None:
    assert "torch" not in sys.modules or not hasattr(sys.modules["torch"], "__version__")
