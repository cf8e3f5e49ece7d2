"""The restricted .pth/.ckpt reader on checkpoints written at test time in torch.save's zip
and legacy formats (tests/pth_writer.py): every storage dtype in both byte orders, views
sharing a storage, non-contiguous and zero strides, 0-d and empty tensors, parameters,
state dicts nested as Real-ESRGAN/Lightning save them, plain values; hostile pickles that
must be refused before anything runs; and (``ref`` marker, needs torch) the writer's files
against real ``torch.save`` files of the same objects."""

from __future__ import annotations

import collections
import io
import os
import pickle
import pickletools
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pth_writer import (
    STORAGE_TYPES,
    Parameter,
    Storage,
    StorageView,
    Tensor,
    bf16_bits,
    compact_weights,
    save,
    save_compact,
    state_dict,
)
from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.pth import load_pth_tensors, read_pth

FORMATS = pytest.mark.parametrize("legacy", [False, True], ids=["zip", "legacy"])
COMPACT_NAMES = [f"body.{i}.{p}" for i in range(7) for p in (("weight", "bias") if i % 2 == 0 else ("weight",))]


# ------------------------------------------------------------------------------- checkpoints
def odd_checkpoint() -> collections.OrderedDict:
    """A parameter, bf16 and f16 tensors, three views of one storage (transposed, a row at an
    offset, a strided column), an expanded tensor (stride 0), 0-d and empty tensors, int64,
    and plain values, in a top-level OrderedDict."""
    base = Tensor.of(np.arange(24, dtype=np.float32).reshape(4, 6))
    return collections.OrderedDict(
        param=Parameter.of(np.linspace(-1, 1, 5, dtype=np.float32)),
        bf16=Tensor.of(bf16_bits(np.array([1.5, -2.25, 3.0e-3], np.float32)), bf16=True),
        f16=Tensor.of(np.array([[0.5, -1], [2, 65504]], np.float16)),
        transposed=base.view(0, (6, 4), (1, 6)),
        row=base.view(6, (6,), (1,)),
        col=base.view(2, (4,), (6,)),
        expanded=Tensor.of(np.array([1, 2, 3], np.float32)).view(0, (2, 3), (0, 1)),
        scalar=Tensor.of(np.array(7, np.int64)),
        empty=Tensor.of(np.zeros((0, 5), np.float16)),
        ints=Tensor.of(np.array([1, -2, 3], np.int64)),
        meta={"epoch": 3, "name": "tiny", "ratio": 0.5, "flags": [True, None], "pair": (1, 2)},
    )


#: one 2 x 2 tensor per storage dtype: name -> values as saved (bf16: bit patterns)
DTYPE_VALUES = {
    "f64": np.array([np.pi, -1e300, 5e-324, -0.0]),
    "f32": np.array([1.0, -3.4e38, np.inf, np.nan], np.float32),
    "f16": np.array([65504, -(2.0 ** -24), 1 / 3, -np.inf], np.float16),
    "bf16": np.array([0x3FC0, 0xC010, 0x7F80, 0x0001], np.uint16),
    "i64": np.array([-(2 ** 63), 2 ** 63 - 1, 0, -5], np.int64),
    "i32": np.array([-(2 ** 31), 2 ** 31 - 1, 1, -1], np.int32),
    "i16": np.array([-32768, 32767, 2, -2], np.int16),
    "i8": np.array([-128, 127, 3, -3], np.int8),
    "u8": np.array([0, 255, 4, 128], np.uint8),
    "bool": np.array([True, False, False, True]),
}


def dtype_checkpoint() -> dict[str, Tensor]:
    return {k: Tensor.of(v.reshape(2, 2), bf16=k == "bf16") for k, v in DTYPE_VALUES.items()}


def assert_same(got: Any, want: Any, where: str = "") -> None:
    """Equal containers (same types and key order) and arrays (dtype, shape, values, NaN too)."""
    assert type(got) is type(want), (where, type(got), type(want))
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, (where, got.dtype, got.shape)
        np.testing.assert_array_equal(got, want, err_msg=where)
    elif isinstance(want, dict):
        assert list(got) == list(want), where
        for k in want:
            assert_same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


# ------------------------------------------------------------------------- valid checkpoints
@FORMATS
def test_odd_tensors(tmp_path: Path, legacy: bool) -> None:
    path = tmp_path / "odd_tensors.pth"
    save(odd_checkpoint(), path, legacy=legacy)
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    assert_same(read_pth(path), collections.OrderedDict(
        param=np.linspace(-1, 1, 5, dtype=np.float32),
        # bfloat16 keeps 8 bits of mantissa: 3e-3 rounds to 197 * 2^-16
        bf16=np.array([1.5, -2.25, 197 * 2.0 ** -16], np.float32),
        f16=np.array([[0.5, -1], [2, 65504]], np.float16),
        transposed=base.T, row=base[1], col=base[:, 2],
        expanded=np.array([[1, 2, 3], [1, 2, 3]], np.float32),
        scalar=np.array(7, np.int64),
        empty=np.zeros((0, 5), np.float16),
        ints=np.array([1, -2, 3], np.int64),
        meta={"epoch": 3, "name": "tiny", "ratio": 0.5, "flags": [True, None], "pair": (1, 2)},
    ))


@FORMATS
@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_every_storage_dtype(tmp_path: Path, legacy: bool, byteorder: str) -> None:
    path = tmp_path / "dtypes.pth"
    save(dtype_checkpoint(), path, legacy=legacy, byteorder=byteorder)
    want = {k: v.reshape(2, 2) for k, v in DTYPE_VALUES.items()}
    want["bf16"] = np.array([[1.5, -2.25], [np.inf, 2.0 ** -133]], np.float32)  # bits << 16
    assert_same(read_pth(path), want)
    assert {v.dtype for k, v in DTYPE_VALUES.items() if k != "bf16"} == set(STORAGE_TYPES)


@FORMATS
def test_views_at_offsets_into_shared_storages(tmp_path: Path, legacy: bool) -> None:
    rng = np.random.default_rng(3)
    w, h = rng.standard_normal(24).astype(np.float32), rng.standard_normal(6).astype(np.float16)
    s0, s1 = Storage(w), Storage(h)
    path = tmp_path / "model.pth"
    save({"state_dict": collections.OrderedDict([
        ("conv.weight", Tensor(s0, 0, (2, 3, 2, 2), (12, 4, 2, 1))),
        ("t", Tensor(s0, 1, (3, 2), (1, 3))),  # strided view into the same storage
        ("half", Tensor(s1, 2, (4,), (1,))),
        ("empty", Tensor(s1, 0, (0, 5), (5, 1))),
    ]), "epoch": 7, "names": ["a", None, 1.5, True, (1, 2)]}, path, legacy=legacy)
    got = read_pth(path)
    assert got["epoch"] == 7 and got["names"] == ["a", None, 1.5, True, (1, 2)]
    assert_same(load_pth_tensors(path), {
        "conv.weight": w.reshape(2, 3, 2, 2), "t": np.array([w[[1, 4]], w[[2, 5]], w[[3, 6]]]),
        "half": h[2:6], "empty": np.zeros((0, 5), np.float16)})


def test_legacy_storage_views(tmp_path: Path) -> None:
    """Files of torch < 1.0 name a view (key, offset, size) of a root storage."""
    root = Storage(np.arange(10, dtype=np.float32))
    path = tmp_path / "old.pth"
    save({"a": Tensor(StorageView(root, 2, 5), 1, (2, 2), (2, 1)),
          "b": Tensor(StorageView(root, 6, 4), 0, (4,), (1,)), "c": Tensor(root, 0, (10,), (1,))},
         path, legacy=True)
    assert_same(read_pth(path), {"a": np.array([[3, 4], [5, 6]], np.float32),
                                 "b": np.arange(6, 10, dtype=np.float32),
                                 "c": np.arange(10, dtype=np.float32)})
    save({"a": Tensor(StorageView(root, 8, 5), 0, (1,), (1,))}, path, legacy=True)
    with pytest.raises(ModelFileError, match="view past the end"):
        read_pth(path)


@FORMATS
def test_compact_state_dict(tmp_path: Path, legacy: bool) -> None:
    """``torch.save({"params": net.state_dict()})`` of a compact upscaler: the state dict's
    ``_metadata`` is pickled as its state; names and values come back unchanged."""
    w = compact_weights()
    path = save_compact(tmp_path / "compact_x2.pth", w, legacy=legacy)
    raw = read_pth(path)
    assert list(raw) == ["params"] and type(raw["params"]) is collections.OrderedDict
    assert not hasattr(raw["params"], "_metadata")
    tensors = load_pth_tensors(path)
    assert list(tensors) == COMPACT_NAMES
    assert tensors["body.0.weight"].shape == (8, 3, 3, 3) and tensors["body.6.weight"].shape == (12, 8, 3, 3)
    assert_same(tensors, w)


def _sd(scale: float) -> collections.OrderedDict:
    return state_dict({"conv.weight": np.arange(4, dtype=np.float32) * scale,
                       "conv.bias": np.full(2, scale, np.float32)})


@pytest.mark.parametrize("obj,prefix,scale", [
    ({"params": _sd(1), "params_ema": _sd(2)}, "", 2),  # Real-ESRGAN: params_ema first
    ({"model": _sd(1), "state_dict": _sd(3), "epoch": 1}, "", 3),
    ({"state_dict": {"module.conv.weight": _sd(4)["conv.weight"],
                     "module.conv.bias": _sd(4)["conv.bias"]}}, "", 4),  # DataParallel
    ({"model": {"net": _sd(5)}, "optimizer": {"lr": 0.1}}, "net.", 5),
    ({"net": _sd(6)}, "net.", 6),
])
def test_which_tensors_a_checkpoint_holds(tmp_path: Path, obj: dict, prefix: str, scale: float) -> None:
    path = tmp_path / "ckpt.pth"
    save(obj, path)
    assert_same(load_pth_tensors(path), {f"{prefix}conv.weight": np.arange(4, dtype=np.float32) * scale,
                                         f"{prefix}conv.bias": np.full(2, scale, np.float32)})


def test_reader_never_imports_torch(tmp_path: Path) -> None:
    """Reading both formats with ``import torch`` made to fail (and nothing of torch loaded)."""
    paths = [tmp_path / "a.pth", tmp_path / "b.pth"]
    save(odd_checkpoint(), paths[0])
    save(odd_checkpoint(), paths[1], legacy=True)
    code = ("import sys; sys.modules['torch'] = None\n"
            "from sdplan.core.modelfiles.pth import read_pth\n"
            "assert [read_pth(p)['ints'].tolist() for p in sys.argv[1:]] == [[1, -2, 3]] * 2\n"
            "assert [m for m in sys.modules if m.startswith('torch') and sys.modules[m]] == []\n")
    res = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr


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
    if fmt == "bare":
        path.write_bytes(pickle.dumps(payload, protocol=2))
    else:
        save(payload, path, legacy=fmt == "legacy")
    with pytest.raises(ModelFileError) as exc:
        read_pth(path)
    msg = str(exc.value)
    assert str(path) in msg and "refused global" in msg
    assert kind.split(".")[-1] in msg  # the refused global is named
    assert not marker.exists()


@FORMATS
def test_refuses_tensor_past_its_storage(tmp_path: Path, legacy: bool) -> None:
    path = tmp_path / "oob.pth"
    save({"w": Tensor(Storage(np.zeros(4, np.float32)), 2, (2, 2), (2, 1))}, path, legacy=legacy)
    with pytest.raises(ModelFileError, match="reaches past"):
        read_pth(path)


def test_refuses_objects_that_are_not_plain_containers(tmp_path: Path) -> None:
    path = tmp_path / "set.pth"
    save({"s": {1, 2}}, path, legacy=True, protocol=4)  # protocol 4 pickles a set without a global
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
    with pytest.raises(ModelFileError, match="nope.pth: no such file"):
        read_pth(tmp_path / "nope.pth")


def test_no_tensors(tmp_path: Path) -> None:
    path = tmp_path / "empty.pth"
    save({"epoch": 1}, path, legacy=True)
    with pytest.raises(ModelFileError, match="no tensors"):
        load_pth_tensors(path)


# ------------------------------------------------------ the writer against torch.save (ref)
_ITEMSIZE = {**{v: k.itemsize for k, v in STORAGE_TYPES.items()}, "BFloat16Storage": 2}


class _StorageTypes(pickle.Unpickler):
    """Collects ``key -> storage type`` from a checkpoint pickle, building nothing of torch."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.types: dict[str, str] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch":
            return name
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        return lambda *args: None

    def persistent_load(self, pid: Any) -> None:
        self.types[pid[2]] = pid[1]


def _pickles(fh: io.BytesIO, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        start = fh.tell()
        for _op in pickletools.genops(fh):
            pass
        out.append(fh.getvalue()[start:fh.tell()])
    return out


def _summary(path: Path, legacy: bool) -> dict[str, Any]:
    """A file's layout with storage keys renamed in the order the object pickle names them:
    opcodes (with arguments) of every pickle, the records (zip) and each storage's bytes."""
    if legacy:
        fh = io.BytesIO(path.read_bytes())
        parts = _pickles(fh, 5)
        heads, pkl, keys = parts[:3], parts[3], pickle.loads(parts[4])
        types_ = _StorageTypes(pkl)
        types_.load()
        storages = {}
        for k in keys:
            (numel,) = struct.unpack("<q", fh.read(8))
            storages[k] = fh.read(numel * _ITEMSIZE[types_.types[k]])
        assert fh.read() == b""
        extra: dict[str, Any] = {"heads": heads, "sorted keys": keys == sorted(keys)}
    else:
        raw = path.read_bytes()
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            root = f"{path.stem}/"
            assert all(i.filename.startswith(root) and i.compress_type == zipfile.ZIP_STORED for i in infos)
            pkl = zf.read(root + "data.pkl")
            keys = [i.filename[len(root + "data/"):] for i in infos if i.filename.startswith(root + "data/")]
            storages = {k: zf.read(f"{root}data/{k}") for k in keys}
            records = {i.filename[len(root):]: zf.read(i) for i in infos}
        starts = [i.header_offset + 30 + sum(struct.unpack("<HH", raw[i.header_offset + 26:i.header_offset + 30]))
                  for i in infos]
        sid = records.pop(".data/serialization_id")
        extra = {"records": [n for n in records if not n.startswith("data/")],
                 "meta": {n: b for n, b in records.items() if n[0] == "." or n in ("byteorder", "version")},
                 "aligned": [s % 64 for s in starts], "serialization id": (len(sid), sid.isdigit())}
    rename: dict[str, str] = {}
    ops = []
    for op, arg, _pos in pickletools.genops(pkl):
        if isinstance(arg, str) and arg in storages:
            arg = rename.setdefault(arg, f"<storage {len(rename)}>")
        ops.append((op.name, arg))
    assert set(rename) == set(storages)
    return {**extra, "ops": ops, "keys": [rename[k] for k in keys] if not legacy else None,
            "storages": {rename[k]: v for k, v in storages.items()}}


def _torch_odd(torch: Any) -> collections.OrderedDict:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    return collections.OrderedDict(
        param=torch.nn.Parameter(torch.linspace(-1, 1, 5)),
        bf16=torch.tensor([1.5, -2.25, 3.0e-3], dtype=torch.bfloat16),
        f16=torch.tensor([[0.5, -1.0], [2.0, 65504.0]], dtype=torch.float16),
        transposed=base.t(), row=base[1], col=base[:, 2],
        expanded=torch.tensor([1.0, 2.0, 3.0]).expand(2, 3),
        scalar=torch.tensor(7),
        empty=torch.zeros(0, 5, dtype=torch.float16),
        ints=torch.tensor([1, -2, 3]),
        meta={"epoch": 3, "name": "tiny", "ratio": 0.5, "flags": [True, None], "pair": (1, 2)},
    )


def _torch_dtypes(torch: Any) -> dict[str, Any]:
    out = {k: torch.from_numpy(v.reshape(2, 2).copy()) for k, v in DTYPE_VALUES.items()}
    out["bf16"] = out["bf16"].view(torch.int16).view(torch.bfloat16)
    return out


def _torch_compact(torch: Any) -> dict[str, Any]:
    """A real module's state dict: compact network of conv/PReLU layers in ``body``."""
    nn = torch.nn
    net = nn.Module()
    net.body = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1), nn.PReLU(8), nn.Conv2d(8, 8, 3, 1, 1), nn.PReLU(8),
                             nn.Conv2d(8, 8, 3, 1, 1), nn.PReLU(8), nn.Conv2d(8, 12, 3, 1, 1))
    net.load_state_dict({k: torch.from_numpy(v) for k, v in compact_weights().items()})
    return {"params": net.state_dict()}


@pytest.mark.ref
@FORMATS
@pytest.mark.parametrize("case", ["odd", "dtypes", "compact"])
def test_writer_matches_torch_save(tmp_path: Path, legacy: bool, case: str) -> None:
    """The same objects through torch.save and through tests/pth_writer.py: the same records,
    byte-identical storages, the same pickle opcodes (storage keys renamed in order of use;
    byte-identical in the zip format) and identical arrays from the reader."""
    torch = pytest.importorskip("torch")
    ours, theirs = tmp_path / "ours" / "ckpt.pth", tmp_path / "torch" / "ckpt.pth"
    ours.parent.mkdir()
    theirs.parent.mkdir()
    if case == "compact":
        save_compact(ours, compact_weights(), legacy=legacy)
    else:
        save(odd_checkpoint() if case == "odd" else dtype_checkpoint(), ours, legacy=legacy)
    obj = {"odd": _torch_odd, "dtypes": _torch_dtypes, "compact": _torch_compact}[case](torch)
    torch.save(obj, theirs, _use_new_zipfile_serialization=not legacy)
    mine, ref = _summary(ours, legacy), _summary(theirs, legacy)
    assert mine == ref
    if not legacy:
        assert ref["aligned"] == [0] * len(ref["aligned"])
        with zipfile.ZipFile(ours) as a, zipfile.ZipFile(theirs) as b:
            assert a.read("ckpt/data.pkl") == b.read("ckpt/data.pkl")
    assert_same(read_pth(ours), read_pth(theirs))


@pytest.mark.ref
def test_bf16_rounding_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    ties = np.array([0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00008000, 0x80018000], np.uint32).view(np.float32)
    x = np.concatenate([ties, np.random.default_rng(0).standard_normal(1000).astype(np.float32),
                        np.array([np.inf, -np.inf, 0.0, -0.0, 3.0e-3], np.float32)])
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bf16_bits(x), want)
    # NaN bit patterns differ between torch's code paths; both are NaNs
    nan = np.array([np.nan], np.float32)
    for bits in (bf16_bits(nan), torch.from_numpy(nan).to(torch.bfloat16).view(torch.int16).numpy()):
        assert np.isnan((bits.astype(np.uint32) << 16).view(np.float32)).all()
