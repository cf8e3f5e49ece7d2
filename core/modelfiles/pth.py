"""Reading PyTorch ``.pth``/``.ckpt`` files without executing pickled code.

A PyTorch checkpoint is a pickle whose tensors point at raw storages: in the zip format
(``torch.save`` since 1.6) a ``<folder>/data.pkl`` pickle plus one ``<folder>/data/<key>``
entry per storage; in the legacy format a chain of pickles (magic number, protocol, system
info, the object, the storage keys) followed by each storage as an int64 element count and
its bytes. A pickle can name any importable callable and call it, so this reader never uses
``pickle.load``'s default class lookup: :class:`_RestrictedUnpickler` resolves only an
explicit allow-list of names (``torch._utils._rebuild_tensor_v2``,
``torch._utils._rebuild_parameter``, the ``torch.*Storage`` types,
``collections.OrderedDict``) to this module's own numpy re-implementations, and refuses
everything else with a :class:`ModelFileError` that names the file and the global. torch is
never imported.

The result may hold only dict, OrderedDict, list, tuple, str, int, float, bool, None and
tensors (as numpy arrays); :func:`load_pth_tensors` flattens it into ``name -> array``.
Format as written by ``torch.serialization`` (BSD-3-Clause), read from its documentation
and from files it writes.
"""

from __future__ import annotations

import collections
import functools
import io
import logging
import math
import os
import pickle
import re
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np
from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.readers import check_model_file

__all__ = ["read_pth", "load_pth_tensors", "is_pth", "STORAGE_DTYPES"]

log = logging.getLogger(__name__)

#: torch storage type name -> numpy dtype (bfloat16 is read as its uint16 bit pattern).
STORAGE_DTYPES: dict[str, str] = {
    "FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2", "BFloat16Storage": "<u2",
    "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1",
    "ByteStorage": "u1", "BoolStorage": "?",
}
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_KEY = re.compile(r"^[A-Za-z0-9_]{1,64}$")
#: Largest object pickle read (bytes): a state dict's pickle holds names and geometry only.
MAX_PICKLE_BYTES = 16 * 2**20
#: The sane maximum of what a checkpoint's storages and rebuilt tensors may take in memory
#: (bytes): this many times the file's own size, plus :data:`BUDGET_SLACK`, and never more
#: than :data:`MAX_TOTAL_BYTES`. ``torch.save`` stores its entries uncompressed (a ratio of
#: 1); a zip entry that inflates further (a zip bomb: 4 MB claiming gigabytes) or a tensor
#: that repeats its storage by zero strides past this budget is refused before it is read.
BUDGET_RATIO = 4
#: Bytes added to the budget of a small file (its own size times :data:`BUDGET_RATIO`).
BUDGET_SLACK = 64 * 2**20
#: The budget's ceiling (bytes): no upscaler or LoRA checkpoint is larger.
MAX_TOTAL_BYTES = 16 * 2**30
#: Bytes read from a compressed entry at a time (the entry is streamed into its storage).
_CHUNK = 1 << 22


class _Refused(Exception):
    """Raised inside the unpickler; turned into ModelFileError naming the file."""


class _Budget:
    """Bytes a checkpoint may still take in memory (see :data:`BUDGET_RATIO`)."""

    __slots__ = ("left", "total")

    def __init__(self, file_bytes: int) -> None:
        self.total = min(MAX_TOTAL_BYTES, BUDGET_RATIO * file_bytes + BUDGET_SLACK)
        self.left = self.total

    def take(self, n: int, what: str) -> None:
        if n > self.left:
            raise _Refused(f"{what} needs {n} bytes, past the {self.total} byte budget of a "
                           f"checkpoint this size ({BUDGET_RATIO} times the file plus "
                           f"{BUDGET_SLACK >> 20} MiB; a zip bomb or a tensor repeating its "
                           "storage)")
        self.left -= n


class _StorageType:
    """Stands for a ``torch.<X>Storage`` global: carries the element dtype."""

    __slots__ = ("name", "dtype")

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = np.dtype(STORAGE_DTYPES[name])

    def __setstate__(self, state: object) -> None:
        raise _Refused("state set on a storage type")


class _Storage:
    """A storage's elements (a 1-D numpy array) and whether they are bfloat16 bits."""

    __slots__ = ("data", "bf16")

    def __init__(self, data: np.ndarray, bf16: bool) -> None:
        self.data = data
        self.bf16 = bf16

    def __setstate__(self, state: object) -> None:
        raise _Refused("state set on a storage")


class _Tensor:
    """A rebuilt tensor (numpy array, float32 for bfloat16) until the result is checked."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __setstate__(self, state: object) -> None:
        raise _Refused("state set on a tensor")


def _ints(v: object, what: str) -> tuple[int, ...]:
    if not isinstance(v, (tuple, list)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise _Refused(f"{what} must be a tuple of ints, got {type(v).__name__}")
    return tuple(int(i) for i in v)


def _rebuild_tensor(storage: object, offset: object, size: object, stride: object, *rest: object,
                    budget: _Budget | None = None) -> _Tensor:
    """``torch._utils._rebuild_tensor_v2`` in numpy: a bounds-checked strided copy, its bytes
    taken from ``budget``."""
    if not isinstance(storage, _Storage):
        raise _Refused("tensor rebuilt from something that is not a storage")
    shape, strides = _ints(size, "tensor size"), _ints(stride, "tensor stride")
    if not isinstance(offset, int) or offset < 0 or len(shape) != len(strides) or len(shape) > 8:
        raise _Refused(f"bad tensor geometry: offset {offset!r}, size {shape}, stride {strides}")
    if any(n < 0 for n in shape) or any(s < 0 for s in strides):
        raise _Refused(f"negative tensor size or stride: {shape}, {strides}")
    data = storage.data
    if math.prod(shape) == 0:
        arr = np.zeros(shape, data.dtype)
    else:
        last = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        if last >= data.size:
            raise _Refused(f"tensor (offset {offset}, size {shape}, stride {strides}) reaches past "
                           f"its storage of {data.size} elements")
        item = data.dtype.itemsize
        if budget is not None:
            budget.take(math.prod(shape) * (4 if storage.bf16 else item), f"tensor of size {shape}")
        arr = np.lib.stride_tricks.as_strided(data[offset:], shape, tuple(s * item for s in strides),
                                              writeable=False).copy()
    if storage.bf16:
        arr = (arr.astype(np.uint32) << 16).view(np.float32)
    return _Tensor(arr)


def _rebuild_parameter(data: object, requires_grad: object = False, hooks: object = None,
                       *rest: object) -> _Tensor | _LazyTensor:
    """``torch._utils._rebuild_parameter``: a parameter is its tensor."""
    if not isinstance(data, (_Tensor, _LazyTensor)):
        raise _Refused("parameter rebuilt from something that is not a tensor")
    return data


_ALLOWED: dict[tuple[str, str], Callable[..., Any] | _StorageType] = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    **{("torch", n): _StorageType(n) for n in STORAGE_DTYPES},
}


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only :data:`_ALLOWED` globals; persistent ids go to ``load_storage``; rebuilt
    tensors take their bytes from ``budget``."""

    def __init__(self, fh: IO[bytes], load_storage: Callable[[tuple[Any, ...]], _Storage],
                 budget: _Budget | None = None) -> None:
        super().__init__(fh)
        self._load_storage = load_storage
        self.budget = budget

    def find_class(self, module: str, name: str) -> Any:
        try:
            found = _ALLOWED[(module, name)]
        except KeyError:
            raise _Refused(f"refused global {module}.{name}") from None
        if found is _rebuild_tensor and self.budget is not None:
            return functools.partial(_rebuild_tensor, budget=self.budget)
        return found

    def persistent_load(self, pid: Any) -> Any:
        if not isinstance(pid, tuple) or not pid or pid[0] != "storage":
            raise _Refused(f"refused persistent id {str(pid)[:80]!r}")
        return self._load_storage(pid)


def _check_result(obj: Any, depth: int = 0) -> Any:
    """Convert :class:`_Tensor` to arrays; refuse anything but plain containers and scalars."""
    if depth > 64:
        raise _Refused("containers nested deeper than 64")
    if isinstance(obj, _Tensor):
        return obj.array
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, collections.OrderedDict) or type(obj) is dict:
        out = collections.OrderedDict() if isinstance(obj, collections.OrderedDict) else {}
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise _Refused(f"dict key of type {type(k).__name__}")
            out[k] = _check_result(v, depth + 1)
        return out
    if type(obj) in (list, tuple):
        return type(obj)(_check_result(v, depth + 1) for v in obj)
    raise _Refused(f"refused object of type {type(obj).__name__}")


def _storage_of(stype: object, numel: object, raw: bytes | bytearray, big_endian: bool = False) -> _Storage:
    if not isinstance(stype, _StorageType) or not isinstance(numel, int) or numel < 0:
        raise _Refused("storage reference without a storage type or element count")
    need = numel * stype.dtype.itemsize
    if len(raw) < need:
        raise _Refused(f"storage holds {len(raw)} bytes, {need} needed")
    dt = stype.dtype.newbyteorder(">") if big_endian and stype.dtype.itemsize > 1 else stype.dtype
    data = np.frombuffer(raw, dt, numel).astype(stype.dtype, copy=False)
    return _Storage(data, stype.name == "BFloat16Storage")


def _read_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, need: int) -> bytearray:
    """The first ``need`` bytes of an archive entry, streamed in chunks into one buffer (never
    more than ``need`` bytes held); refused when the entry declares fewer or yields fewer."""
    if info.file_size < need:
        raise _Refused(f"archive entry {info.filename} holds {info.file_size} bytes, {need} needed")
    out = bytearray(need)
    view = memoryview(out)
    done = 0
    with zf.open(info) as fh:  # a ZipExtFile (a BufferedIOBase)
        assert isinstance(fh, io.BufferedIOBase)
        while done < need:
            n = fh.readinto(view[done:done + _CHUNK])
            if not n:
                raise _Refused(f"archive entry {info.filename} ends after {done} of {need} bytes")
            done += n
    return out


def _read_zip(p: Path, budget: _Budget) -> Any:
    with zipfile.ZipFile(p) as zf:
        infos = {i.filename: i for i in zf.infolist()}
        pkls = [n for n in infos if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pkls) != 1:
            raise _Refused("zip archive without exactly one <folder>/data.pkl")
        root = pkls[0][: -len("data.pkl")]
        big = False
        if root + "byteorder" in infos:
            info = infos[root + "byteorder"]
            big = _read_entry(zf, info, min(info.file_size, 16)).strip() == b"big"
        cache: dict[str, _Storage] = {}

        def entry(name: str, need: int) -> bytearray:
            info = infos.get(name)
            if info is None:
                raise _Refused(f"missing archive entry {name}")
            budget.take(need, f"archive entry {name}")
            return _read_entry(zf, info, need)

        def load_storage(pid: tuple[Any, ...]) -> _Storage:
            if len(pid) != 5 or not isinstance(pid[2], str) or not _KEY.match(pid[2]):
                raise _Refused(f"bad storage reference {str(pid)[:80]!r}")
            _, stype, key, _location, numel = pid
            if key not in cache:
                need = _storage_bytes(stype, numel)
                cache[key] = _storage_of(stype, numel, entry(f"{root}data/{key}", need), big)
            return cache[key]

        pkl = infos[pkls[0]]
        if pkl.file_size > MAX_PICKLE_BYTES:
            raise _Refused(f"object pickle {pkl.filename} of {pkl.file_size} bytes (limit "
                           f"{MAX_PICKLE_BYTES})")
        raw = entry(pkls[0], pkl.file_size)
        return _RestrictedUnpickler(io.BytesIO(raw), load_storage, budget).load()


def _storage_bytes(stype: object, numel: object) -> int:
    """Bytes of a storage reference's data; refused when it names no storage type or count."""
    if not isinstance(stype, _StorageType) or not isinstance(numel, int) or numel < 0:
        raise _Refused("storage reference without a storage type or element count")
    return numel * stype.dtype.itemsize


def _read_legacy(p: Path, budget: _Budget) -> Any:
    with open(p, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size

        def plain(what: str) -> Any:
            def no_storage(pid: tuple[Any, ...]) -> _Storage:
                raise _Refused(f"storage reference in the {what}")
            return _RestrictedUnpickler(fh, no_storage).load()

        if plain("magic number") != _LEGACY_MAGIC:
            raise _Refused("not a PyTorch legacy checkpoint (magic number differs)")
        if plain("protocol version") != 1001:
            raise _Refused("unsupported legacy protocol version")
        info = plain("system info")
        little = not isinstance(info, dict) or info.get("little_endian", True)
        pending: dict[str, tuple[_StorageType, int]] = {}
        views: list[tuple[_Storage, str, int, int]] = []
        roots: dict[str, _Storage] = {}

        def load_storage(pid: tuple[Any, ...]) -> _Storage:
            if len(pid) != 6 or not isinstance(pid[2], str) or not _KEY.match(pid[2]):
                raise _Refused(f"bad storage reference {str(pid)[:80]!r}")
            _, stype, key, _location, numel, view = pid
            if not isinstance(stype, _StorageType) or not isinstance(numel, int) or numel < 0:
                raise _Refused("storage reference without a storage type or element count")
            pending.setdefault(key, (stype, numel))
            if key not in roots:
                roots[key] = _Storage(np.zeros(0, stype.dtype), stype.name == "BFloat16Storage")
            if view is None:
                return roots[key]
            if not isinstance(view, tuple) or len(view) != 3:
                raise _Refused("bad storage view")
            _vkey, voff, vsize = view
            if not (isinstance(voff, int) and isinstance(vsize, int) and voff >= 0 and vsize >= 0):
                raise _Refused("bad storage view")
            vs = _Storage(np.zeros(0, stype.dtype), roots[key].bf16)
            views.append((vs, key, voff, vsize))
            return vs

        # Tensors need their storage data, which follows the pickle: rebuild lazily.
        obj = _LazyUnpickler(fh, load_storage, budget).load()
        keys = plain("storage key list")
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise _Refused("storage key list is not a list of strings")
        for key in keys:
            if key not in pending:
                raise _Refused(f"storage {key!r} listed but never referenced")
            stype, _ = pending[key]
            head = fh.read(8)
            if len(head) != 8:
                raise _Refused(f"file ends before storage {key!r}")
            (numel,) = struct.unpack("<q" if little else ">q", head)
            need = numel * stype.dtype.itemsize
            if numel < 0 or need > size - fh.tell():
                raise _Refused(f"storage {key!r} claims {numel} elements, past the end of the file")
            budget.take(need, f"storage {key!r}")
            raw = fh.read(need)
            roots[key].data = _storage_of(stype, numel, raw, not little).data
        for vs, key, voff, vsize in views:
            root = roots[key].data
            if voff + vsize > root.size:
                raise _Refused(f"storage view past the end of storage {key!r}")
            vs.data = root[voff:voff + vsize]
        return _resolve_lazy(obj, budget=budget)


class _LazyTensor:
    """A tensor of a legacy file, rebuilt once the storages that follow the pickle are read."""

    __slots__ = ("args",)

    def __init__(self, *args: object) -> None:
        self.args = args

    def __setstate__(self, state: object) -> None:
        raise _Refused("state set on a tensor")


class _LazyUnpickler(_RestrictedUnpickler):
    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name)
        rebuild = isinstance(found, functools.partial) and found.func is _rebuild_tensor
        return _LazyTensor if found is _rebuild_tensor or rebuild else found


def _resolve_lazy(obj: Any, depth: int = 0, budget: _Budget | None = None) -> Any:
    if depth > 64:
        raise _Refused("containers nested deeper than 64")
    if isinstance(obj, _LazyTensor):
        return _rebuild_tensor(*obj.args, budget=budget)
    if isinstance(obj, _Tensor) or not isinstance(obj, (dict, list, tuple)):
        return obj
    if isinstance(obj, dict):
        for k in list(obj):
            obj[k] = _resolve_lazy(obj[k], depth + 1, budget)
        return obj
    return type(obj)(_resolve_lazy(v, depth + 1, budget) for v in obj)


def is_pth(path: str | Path) -> bool:
    """True when the file starts like a PyTorch checkpoint (zip or pickle), by its magic."""
    with open(path, "rb") as fh:
        head = fh.read(4)
    return head == b"PK\x03\x04" or head[:1] == b"\x80"


def read_pth(path: str | Path) -> Any:
    """The object saved in a ``.pth``/``.ckpt`` file, tensors as numpy arrays (bfloat16 as
    float32), without executing any code from the file.

    Raises:
        ModelFileError: naming the file: missing or unreadable, not a regular file, not a
            PyTorch checkpoint, truncated, or the pickle names a global outside the
            allow-list, holds an object that is not a tensor or plain container, or a tensor
            that does not fit its storage.
    """
    p = Path(path)
    check_model_file(p)
    try:
        budget = _Budget(os.path.getsize(p))
        if zipfile.is_zipfile(p):
            obj = _read_zip(p, budget)
        else:
            obj = _read_legacy(p, budget)
        obj = _resolve_lazy(obj, budget=budget) if not isinstance(obj, _Tensor) else obj
        return _check_result(obj)
    except _Refused as exc:
        raise ModelFileError(p, f"PyTorch checkpoint refused: {exc}") from None
    except (pickle.UnpicklingError, EOFError, zipfile.BadZipFile, ValueError, TypeError,
            IndexError, KeyError, AttributeError, struct.error, MemoryError, RecursionError) as exc:
        raise ModelFileError(p, f"not a readable PyTorch checkpoint: {type(exc).__name__}: {exc}") from None
    except OSError as exc:
        raise ModelFileError(p, f"cannot read file: {exc.strerror or exc}") from None


def _flatten(obj: Any, prefix: str, out: dict[str, np.ndarray]) -> None:
    if isinstance(obj, np.ndarray):
        out[prefix[:-1]] = obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _flatten(v, f"{prefix}{k}.", out)


def load_pth_tensors(path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of a checkpoint as ``name -> array``: the first of ``params_ema``,
    ``params``, ``state_dict``, ``model`` that is a dict (Real-ESRGAN and Lightning
    conventions), else the top-level dict; nested dicts join with ``.``; a leading
    ``module.`` (DataParallel) is dropped.

    Raises:
        ModelFileError: as :func:`read_pth`, or when the file holds no tensors.
    """
    obj = read_pth(path)
    if isinstance(obj, dict):
        for key in ("params_ema", "params", "state_dict", "model"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    out: dict[str, np.ndarray] = {}
    _flatten(obj, "", out)
    if not out:
        raise ModelFileError(path, "PyTorch checkpoint holds no tensors")
    if all(k.startswith("module.") for k in out):
        out = {k[len("module."):]: v for k, v in out.items()}
    log.debug("%s: %d tensors", path, len(out))
    return out
