"""Write PyTorch checkpoints the way ``torch.save`` does, without torch, for the .pth tests.

Objects to save are plain containers (dict, OrderedDict, list, tuple, scalars, str, None)
holding :class:`Tensor`/:class:`Parameter` records over :class:`Storage` arrays (numpy).
:func:`save` writes them in either of torch's two formats:

* zip (``torch.save`` default): records ``<stem>/data.pkl`` (the object, pickle protocol 2),
  ``.format_version`` (``1``), ``.storage_alignment`` (``64``), ``byteorder``, one
  ``data/<key>`` per storage (keys ``0``, ``1``, ... in the order the pickle first meets
  them), ``version`` (``3``) and ``.data/serialization_id``; stored uncompressed, each
  record's bytes aligned to 64 in the file by an ``FB`` extra field padded with ``Z``;
* legacy (``_use_new_zipfile_serialization=False``): five pickles (magic number, protocol
  1001, system info, the object, the sorted storage keys), then per key an int64 element
  count and the storage bytes.

In the object pickle a tensor is ``torch._utils._rebuild_tensor_v2(storage, offset, size,
stride, requires_grad, OrderedDict())``, a parameter ``torch._utils._rebuild_parameter(
tensor, True, OrderedDict())`` and a storage the persistent id ``("storage",
torch.<X>Storage, key, "cpu", numel)`` (legacy: plus a view entry, ``None`` but for
:class:`StorageView`, which only torch before 1.0 wrote). A state dict is an OrderedDict
whose ``_metadata`` attribute (module name -> ``{"version": 1}``) is pickled as its state.
The torch names are written by swapping stand-in ``torch``/``torch._utils`` modules into
``sys.modules`` while pickling; torch is never imported. tests/test_pth.py compares this
output with real ``torch.save`` files (``ref`` marker).
"""

from __future__ import annotations

import collections
import contextlib
import io
import pickle
import struct
import sys
import types
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

#: numpy dtype -> torch storage type (bfloat16: a uint16 array with ``bf16=True``).
STORAGE_TYPES: dict[np.dtype, str] = {
    np.dtype(k): v for k, v in {
        "f4": "FloatStorage", "f8": "DoubleStorage", "f2": "HalfStorage", "i8": "LongStorage",
        "i4": "IntStorage", "i2": "ShortStorage", "i1": "CharStorage", "u1": "ByteStorage",
        "?": "BoolStorage"}.items()}
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_SYS_INFO = {"protocol_version": 1001, "little_endian": True,
                   "type_sizes": {"short": 2, "int": 4, "long": 4}}


class Storage:
    """A torch storage: ``data`` is its 1-D element array (uint16 bit patterns when ``bf16``)."""

    def __init__(self, data: np.ndarray, bf16: bool = False) -> None:
        data = np.ascontiguousarray(data).reshape(-1)
        if bf16 and data.dtype != np.uint16:
            raise ValueError("bfloat16 storages hold uint16 bit patterns")
        if not bf16 and data.dtype not in STORAGE_TYPES:
            raise ValueError(f"no torch storage for dtype {data.dtype}")
        self.data, self.bf16 = data, bf16

    @property
    def type_name(self) -> str:
        return "BFloat16Storage" if self.bf16 else STORAGE_TYPES[self.data.dtype]


class StorageView:
    """A slice ``[offset, offset + size)`` of a root storage (legacy format of torch < 1.0)."""

    def __init__(self, root: Storage, offset: int, size: int) -> None:
        self.root, self.offset, self.size = root, offset, size


class Tensor:
    """A tensor: ``storage`` elements at ``offset + sum(i_k * stride[k])`` (all in elements)."""

    requires_grad = False

    def __init__(self, storage: Storage | StorageView, offset: int, size: tuple[int, ...],
                 stride: tuple[int, ...]) -> None:
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride

    @classmethod
    def of(cls, array: np.ndarray, bf16: bool = False) -> Tensor:
        """A C-contiguous tensor on a new storage holding ``array`` (any shape, 0-d too)."""
        a = np.asarray(array)
        strides = [1] * a.ndim  # torch's contiguous strides: sizes of 0 count as 1
        for k in range(a.ndim - 2, -1, -1):
            strides[k] = strides[k + 1] * max(a.shape[k + 1], 1)
        return cls(Storage(a, bf16), 0, tuple(a.shape), tuple(strides))

    def view(self, offset: int, size: tuple[int, ...], stride: tuple[int, ...]) -> Tensor:
        """Another tensor on the same storage (``as_strided``)."""
        return Tensor(self.storage, offset, size, stride)


class Parameter(Tensor):
    """An ``nn.Parameter`` (pickled through ``_rebuild_parameter``, requires_grad True)."""

    requires_grad = True


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounding to nearest even; NaN -> 0x7FC0."""
    bits = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def state_dict(tensors: Mapping[str, np.ndarray | Tensor], version: int = 1) -> collections.OrderedDict:
    """A module's ``state_dict()``: an OrderedDict of tensors with ``_metadata`` listing every
    module (``""``, then each dotted prefix of the names, parents first) as ``{"version": v}``."""
    out: collections.OrderedDict[str, Tensor] = collections.OrderedDict()
    modules: dict[str, dict[str, int]] = {"": {"version": version}}
    for name, t in tensors.items():
        parts = name.split(".")[:-1]
        for i in range(1, len(parts) + 1):
            modules.setdefault(".".join(parts[:i]), {"version": version})
        out[name] = t if isinstance(t, Tensor) else Tensor.of(t)
    out._metadata = collections.OrderedDict(modules)  # type: ignore[attr-defined]
    return out


@contextlib.contextmanager
def _torch_names() -> Iterator[types.SimpleNamespace]:
    """Stand-in ``torch`` and ``torch._utils`` modules in ``sys.modules`` while pickling, so
    pickle writes torch's global names (a real torch, if imported, is put back after)."""
    torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")
    names = types.SimpleNamespace()
    for fn in ("_rebuild_tensor_v2", "_rebuild_parameter"):
        def stand_in(*args: object) -> None:
            raise AssertionError("only a name to pickle")
        stand_in.__module__, stand_in.__name__, stand_in.__qualname__ = "torch._utils", fn, fn
        setattr(utils, fn, stand_in)
        setattr(names, fn, stand_in)
    for type_name in [*STORAGE_TYPES.values(), "BFloat16Storage"]:
        setattr(torch, type_name, type(type_name, (), {"__module__": "torch"}))
    torch._utils = utils  # type: ignore[attr-defined]
    names.torch = torch
    saved = {k: sys.modules.get(k, names) for k in ("torch", "torch._utils")}
    sys.modules["torch"], sys.modules["torch._utils"] = torch, utils
    try:
        yield names
    finally:
        for k, v in saved.items():
            if v is names:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v  # type: ignore[assignment]


class _Pickler(pickle.Pickler):
    """Pickles :class:`Tensor` as torch does and assigns storage keys as torch's pickler."""

    def __init__(self, fh: io.BytesIO, names: types.SimpleNamespace, legacy: bool,
                 protocol: int) -> None:
        super().__init__(fh, protocol=protocol)
        self.names, self.legacy = names, legacy
        self.storages: dict[int, tuple[str, Storage]] = {}  # id -> (key, storage)

    def _key(self, s: Storage) -> str:
        if id(s) not in self.storages:
            n = len(self.storages)
            # legacy keys are storage addresses in decimal; zip keys count up from 0
            key = str(94_000_000_000_000 + 4096 * n) if self.legacy else str(n)
            self.storages[id(s)] = (key, s)
        key = self.storages[id(s)][0]
        # torch formats a legacy key anew each time (pickled again, not memoized)
        return str(int(key)) if self.legacy else key

    def persistent_id(self, obj: object) -> Any:
        if isinstance(obj, StorageView):
            if not self.legacy:
                raise ValueError("storage views exist only in the legacy format")
            root = obj.root
            view = (self._key(root) + f"_{obj.offset}", obj.offset, obj.size)
            return ("storage", getattr(self.names.torch, root.type_name), self._key(root), "cpu",
                    root.data.size, view)
        if isinstance(obj, Storage):
            pid = ("storage", getattr(self.names.torch, obj.type_name), self._key(obj), "cpu",
                   obj.data.size)
            return (*pid, None) if self.legacy else pid
        return None

    def reducer_override(self, obj: object) -> Any:
        if isinstance(obj, Tensor):
            # fresh tuples and hooks per tensor, as torch's Tensor.__reduce_ex__ builds them
            args = (obj.storage, obj.offset, tuple([*obj.size]), tuple([*obj.stride]), False,
                    collections.OrderedDict())
            plain = Tensor(obj.storage, obj.offset, obj.size, obj.stride)
            if obj.requires_grad:
                return (self.names._rebuild_parameter, (plain, True, collections.OrderedDict()))
            return (self.names._rebuild_tensor_v2, args)
        return NotImplemented


def _raw(s: Storage, byteorder: str) -> bytes:
    return s.data.astype(s.data.dtype.newbyteorder(">" if byteorder == "big" else "<")).tobytes()


def _aligned_zip(path: Path, records: list[tuple[str, bytes]]) -> None:
    """Uncompressed zip whose record bytes start at multiples of 64 in the file."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for name, data in records:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            assert zf.fp is not None
            pad = -(zf.fp.tell() + 30 + len(name.encode()) + 4) % 64
            info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
            zf.writestr(info, data)


def save(obj: object, path: Path, *, legacy: bool = False, byteorder: str = "little",
         protocol: int = 2) -> None:
    """Write ``obj`` to ``path`` as ``torch.save`` would (zip, or legacy when ``legacy``).

    ``byteorder="big"`` writes what a big-endian machine would; ``protocol`` is the object
    pickle's protocol (torch uses 2)."""
    buf = io.BytesIO()
    with _torch_names() as names:
        pickler = _Pickler(buf, names, legacy, protocol)
        if legacy:
            info = dict(LEGACY_SYS_INFO, little_endian=byteorder == "little")
            for head in (LEGACY_MAGIC, 1001, info):
                pickle.dump(head, buf, protocol=2)
        pickler.dump(obj)
    storages = list(pickler.storages.values())
    if legacy:  # torch writes the keys sorted, as strings
        storages.sort(key=lambda ks: ks[0])
    if legacy:
        pickle.dump([k for k, _ in storages], buf, protocol=2)
        for _, s in storages:
            buf.write(struct.pack("<q" if byteorder == "little" else ">q", s.data.size))
            buf.write(_raw(s, byteorder))
        path.write_bytes(buf.getvalue())
        return
    root = path.stem
    _aligned_zip(path, [
        (f"{root}/data.pkl", buf.getvalue()), (f"{root}/.format_version", b"1"),
        (f"{root}/.storage_alignment", b"64"), (f"{root}/byteorder", byteorder.encode()),
        *[(f"{root}/data/{k}", _raw(s, byteorder)) for k, s in storages],
        (f"{root}/version", b"3\n"), (f"{root}/.data/serialization_id", b"0" * 40)])


# ------------------------------------------------------------------ a tiny Real-ESRGAN compact
def compact_weights(seed: int = 0, feat: int = 8, n_conv: int = 2, scale: int = 2) -> dict[str, np.ndarray]:
    """SRVGGNetCompact weights (float32): ``body.0`` conv 3->feat, PReLU slopes, ``n_conv``
    x (conv feat->feat, PReLU), last conv feat->3*scale^2; 3x3 kernels, names as in
    Real-ESRGAN's ``body.N``."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    chans = [3] + [feat] * (n_conv + 1) + [3 * scale * scale]
    for i, (cin, cout) in enumerate(zip(chans[:-1], chans[1:], strict=True)):
        out[f"body.{2 * i}.weight"] = (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype(np.float32)
        out[f"body.{2 * i}.bias"] = (rng.standard_normal(cout) * 0.05).astype(np.float32)
        if i < n_conv + 1:  # every conv but the last is followed by a PReLU
            out[f"body.{2 * i + 1}.weight"] = rng.uniform(0.05, 0.3, feat).astype(np.float32)
    return out


def save_compact(path: Path, weights: Mapping[str, np.ndarray], legacy: bool = False,
                 key: str = "params") -> Path:
    """``torch.save({key: net.state_dict()}, path)`` of a compact network (Real-ESRGAN files
    use ``params`` or ``params_ema``); returns ``path``."""
    save({key: state_dict(weights)}, path, legacy=legacy)
    return path
