"""Bounded header readers for ``.safetensors`` and ``.gguf`` model files.

Only headers are read: tensor names, dtypes, shapes, byte sizes and absolute byte offsets.
No weight byte is touched and no allocation depends on a length the file claims without
first checking it against the file's real size, so a hostile header (a length beyond the
file, a tensor claiming terabytes, an array of 2^60 entries) is a
:class:`~sdplan.core.errors.ModelFileError` naming the file, never a hang or a huge read.

Formats:

- safetensors: 8-byte little-endian header length ``N``, ``N`` bytes of JSON
  ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``,
  then the data region; offsets are relative to the data region.
- GGUF (versions 2 and 3): magic ``GGUF``, version, tensor count, key/value count,
  key/value pairs, tensor infos (name, dims in ggml order ``ne0..``, ggml type, offset),
  padding to ``general.alignment`` (default 32), data. The header is parsed here with
  ``struct`` on a memory map, using the ``gguf`` package's enums and
  ``gguf.GGML_QUANT_SIZES`` (block size, bytes per block) for the quant types;
  ``gguf.GGUFReader`` itself iterates claimed array lengths without a bound, which a
  hostile file can turn into a hang, so it is only used by the tests as a reference.
"""

from __future__ import annotations

import collections
import dataclasses
import mmap
import os
import stat
import struct
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sdplan.core.errors import ModelFileError, PathError
from sdplan.core.planning import paths
from sdplan.core.planning.bounded_json import JsonLimits, JsonRefused, loads

#: Largest safetensors JSON header accepted (bytes). Real full-size checkpoints need a
#: few hundred KiB; anything above this is refused before it is read.
MAX_HEADER_BYTES = 100 * 2**20

#: Bounds of a safetensors JSON header (:mod:`sdplan.core.planning.bounded_json`): a real
#: header nests 3 levels and holds some ten values per tensor.
HEADER_LIMITS = JsonLimits(max_bytes=MAX_HEADER_BYTES, max_depth=8, max_containers=2_000_000,
                           max_items=8_000_000)

#: safetensors dtype -> bytes per element.
SAFETENSORS_DTYPES: dict[str, int] = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
}

#: Headers kept in this process (a run reads the same file's header in several places): the
#: most recently read files, keyed by path and the file's identity, size and timestamps.
HEADER_CACHE_FILES = 16
#: A file whose timestamps are younger than this (seconds) is read again every time: a
#: rewrite of the same size within one timestamp tick would otherwise look unchanged.
HEADER_SETTLE_SECONDS = 2.0

_GGUF_MAGIC = b"GGUF"
_GGUF_MAX_DIMS = 4
_GGUF_MAX_NAME = 65536


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a header describes it.

    Attributes:
        name: the tensor name in the file.
        dtype: safetensors dtype (``F16``, ``BF16``...) or ggml type name (``Q4_0``...).
        shape: numpy order (outermost first) for both formats (GGUF dims are reversed).
        nbytes: bytes of the tensor's data.
        offset: absolute byte offset of the data in the file.
        file: the file path.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    offset: int
    file: str


@dataclass(frozen=True)
class TensorFile:
    """A model file's header: its tensors in file order and its string metadata."""

    path: str
    format: str  # "safetensors" | "gguf"
    tensors: tuple[TensorInfo, ...]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        """Bytes of all tensors' data."""
        return sum(t.nbytes for t in self.tensors)


def file_version(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """Which file a ``stat`` result describes and which version of it: ``(device, inode, size,
    modification time ns, change time ns)``. Equal versions mean the same bytes (short of a
    rewrite that keeps both times)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


_SPECIAL_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def model_path_error(exc: PathError) -> ModelFileError:
    """The :class:`ModelFileError` of a path that cannot be examined (same path, same words)."""
    return ModelFileError(exc.path, str(exc).removeprefix(f"{exc.path}: "))


def stat_model_path(path: str | Path) -> os.stat_result | None:
    """``os.stat`` of a model path, None when nothing is there
    (:func:`sdplan.core.planning.paths.probe`).

    Raises:
        ModelFileError: the path cannot be examined (name too long, permission denied, loop
            of links...), naming it.
    """
    try:
        return paths.probe(path)
    except PathError as exc:
        raise model_path_error(exc) from None


def special_file_kind(path: str | Path) -> str | None:
    """What ``path`` is when it is neither a regular file nor a folder (``"a FIFO"``, ``"a
    character device"``, ``"a block device"``, ``"a socket"``), else None (also when it does
    not exist or cannot be examined). Only stats the path: opening a FIFO would block until
    a writer comes."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return next((name for test, name in _SPECIAL_KINDS if test(mode)), None)


def refuse_special_file(path: str | Path) -> None:
    """Raise ModelFileError ``"PATH: not a regular file (a FIFO)"`` (or another
    :func:`special_file_kind`) for such a path, or naming a path that cannot be examined
    (``"PATH: file name too long"``); a file, a folder or a missing path passes."""
    st = stat_model_path(path)
    kind = paths.special_kind(st) if st is not None else None
    if kind is not None:
        raise ModelFileError(path, f"not a regular file ({kind})")


def check_model_file(path: str | Path) -> None:
    """Refuse a model path that is not a regular file, without opening it.

    Raises:
        ModelFileError: naming ``path``: no such file, a folder, not a regular file (a
            FIFO, a character device, ...), or a path that cannot be examined (name too
            long, permission denied...).
    """
    st = stat_model_path(path)
    if st is None:
        raise ModelFileError(path, "no such file")
    if stat.S_ISDIR(st.st_mode):
        raise ModelFileError(path, "is a folder, not a model file")
    kind = paths.special_kind(st)
    if kind is not None:
        raise ModelFileError(path, f"not a regular file ({kind})")


def read_tensor_file(path: str | Path) -> TensorFile:
    """Read the header of a ``.safetensors`` or ``.gguf`` file (format from its magic).

    A header read before in this process is returned again while the file keeps its
    identity, size and timestamps (the last :data:`HEADER_CACHE_FILES` files; never a file
    changed in the last :data:`HEADER_SETTLE_SECONDS`): the result is the same as reading it.

    Raises:
        ModelFileError: the file is missing, a folder or not a regular file, unreadable, of
            another format (PyTorch pickle, anything else) or its header is malformed,
            truncated or hostile.
    """
    p = Path(path)
    check_model_file(p)
    try:
        with open(p, "rb") as fh:
            st = os.fstat(fh.fileno())
            key = (str(p), *file_version(st))
            known = _cached_header(key)
            if known is not None:
                return known
            tf = _read_header(p, fh, st.st_size)
    except OSError as exc:
        raise ModelFileError(p, f"cannot read file: {exc.strerror or exc}") from None
    if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > HEADER_SETTLE_SECONDS * 1e9:
        _keep_header(key, tf)
    return tf


def read_header_once(path: str | Path, headers: dict[str, TensorFile] | None) -> TensorFile:
    """:func:`read_tensor_file` of ``path``, or the header ``headers`` holds for it: a command
    that reads the same model files for several purposes (``sdplan plan``: the profile, the
    dry run, the size check, the work count) passes one dict to each, so that each file's
    header is read once; a header read here is added to it. ``headers`` None: read it.

    Raises:
        ModelFileError: as :func:`read_tensor_file`.
    """
    if headers is None:
        return read_tensor_file(path)
    key = str(Path(path))
    known = headers.get(key)
    if known is None:
        known = headers[key] = read_tensor_file(path)
    return known


def _read_header(p: Path, fh: object, size: int) -> TensorFile:
    head = fh.read(8)  # type: ignore[attr-defined]
    if head[:4] == _GGUF_MAGIC:
        return _read_gguf(p, fh, size)
    n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
    if head[:4] == b"PK\x03\x04" or (head[:1] == b"\x80" and n > size - 8):
        raise ModelFileError(
            p, "is a PyTorch pickle checkpoint (.ckpt/.pt); only safetensors and "
            "GGUF headers can be read without loading weights")
    return _read_safetensors(p, fh, size, head)


_HEADERS: collections.OrderedDict[tuple[object, ...], TensorFile] = collections.OrderedDict()
_HEADERS_LOCK = threading.Lock()


def _cached_header(key: tuple[object, ...]) -> TensorFile | None:
    with _HEADERS_LOCK:
        tf = _HEADERS.get(key)
        if tf is None:
            return None
        _HEADERS.move_to_end(key)
    return dataclasses.replace(tf, metadata=dict(tf.metadata))  # the caller's own metadata


def _keep_header(key: tuple[object, ...], tf: TensorFile) -> None:
    with _HEADERS_LOCK:
        _HEADERS[key] = dataclasses.replace(tf, metadata=dict(tf.metadata))
        while len(_HEADERS) > HEADER_CACHE_FILES:
            _HEADERS.popitem(last=False)


# --------------------------------------------------------------------------- safetensors


class _DuplicateKeyError(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKeyError(k)
        out[k] = v
    return out


def _read_safetensors(p: Path, fh: object, size: int, head: bytes) -> TensorFile:
    if size < 8 or len(head) < 8:
        raise ModelFileError(p, f"truncated: {size} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", head)
    if n > size - 8:
        raise ModelFileError(
            p, f"not a safetensors or GGUF file: header length {n} bytes is beyond the "
            f"file ({size} bytes; truncated or another format)")
    if n > MAX_HEADER_BYTES:
        raise ModelFileError(p, f"safetensors header of {n} bytes exceeds the "
                                f"{MAX_HEADER_BYTES} byte limit")
    if n < 2:
        raise ModelFileError(p, "not a safetensors file: empty header")
    raw = fh.read(n)  # type: ignore[attr-defined]
    if len(raw) != n:
        raise ModelFileError(p, "truncated: header shorter than its declared length")
    try:  # a real header nests 3 levels: {name: {"shape": [...]}}
        header = loads(raw, "header", HEADER_LIMITS, object_pairs_hook=_no_duplicates)
    except _DuplicateKeyError as exc:
        raise ModelFileError(p, f"duplicate tensor name {exc.args[0]!r} in header") from None
    except JsonRefused as exc:
        raise ModelFileError(p, f"not a safetensors or GGUF file: {exc}") from None
    if not isinstance(header, dict):
        raise ModelFileError(p, "not a safetensors file: header is not a JSON object")
    data_start = 8 + n
    data_len = size - data_start
    meta_raw = header.pop("__metadata__", {})
    metadata = ({str(k): str(v) for k, v in meta_raw.items()}
                if isinstance(meta_raw, dict) else {})
    tensors: list[TensorInfo] = []
    spans: list[tuple[int, int, str]] = []
    for name, entry in header.items():
        dtype, shape, begin, end = _check_entry(p, name, entry)
        if end > data_len:
            raise ModelFileError(
                p, f"truncated: tensor {name!r} ends at data byte {end} but the data region "
                f"holds {data_len} bytes")
        spans.append((begin, end, name))
        tensors.append(TensorInfo(name, dtype, shape, end - begin, data_start + begin, str(p)))
    _check_overlaps(p, spans)
    return TensorFile(str(p), "safetensors", tuple(tensors), metadata)


def _check_entry(p: Path, name: str, entry: object) -> tuple[str, tuple[int, ...], int, int]:
    if not isinstance(entry, dict):
        raise ModelFileError(p, f"tensor {name!r}: header entry is not an object")
    dtype = entry.get("dtype")
    if dtype not in SAFETENSORS_DTYPES:
        raise ModelFileError(p, f"tensor {name!r}: unknown dtype {dtype!r}")
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ModelFileError(p, f"tensor {name!r}: shape {shape!r} is not a list of sizes")
    offs = entry.get("data_offsets")
    if (not isinstance(offs, list) or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)
            or not 0 <= offs[0] <= offs[1]):
        raise ModelFileError(p, f"tensor {name!r}: bad data_offsets {offs!r}")
    count = 1
    for d in shape:
        count *= d
    nbytes = count * SAFETENSORS_DTYPES[dtype]
    if offs[1] - offs[0] != nbytes:
        raise ModelFileError(
            p, f"tensor {name!r}: data_offsets span {offs[1] - offs[0]} bytes but "
            f"{dtype}{shape} needs {nbytes}")
    return dtype, tuple(shape), offs[0], offs[1]


def _check_overlaps(p: Path, spans: list[tuple[int, int, str]]) -> None:
    spans.sort()
    prev_end, prev_name = 0, ""
    for begin, end, name in spans:
        if begin < prev_end and end > begin:
            raise ModelFileError(p, f"tensors {prev_name!r} and {name!r} overlap in the data")
        if end > prev_end:
            prev_end, prev_name = end, name


# --------------------------------------------------------------------------- GGUF


class _Cursor:
    """Bounds-checked little-endian reads from a memory map."""

    def __init__(self, p: Path, buf: mmap.mmap, size: int) -> None:
        self.p, self.buf, self.size, self.pos = p, buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelFileError(self.p, f"truncated GGUF header: {what} runs past the end "
                                         f"of the file ({self.size} bytes)")

    def unpack(self, fmt: str, what: str) -> tuple[int, ...]:
        n = struct.calcsize("<" + fmt)
        self.need(n, what)
        vals = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += n
        return vals

    def string(self, what: str, limit: int | None = None) -> str:
        (n,) = self.unpack("Q", what)
        if limit is not None and n > limit:
            raise ModelFileError(self.p, f"GGUF {what} of {n} bytes exceeds {limit}")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ModelFileError(self.p, f"GGUF {what} is not UTF-8") from None


def _gguf_scalar_sizes() -> dict[int, str]:
    from gguf import GGUFValueType as T

    return {T.UINT8: "B", T.INT8: "b", T.UINT16: "H", T.INT16: "h", T.UINT32: "I",
            T.INT32: "i", T.FLOAT32: "f", T.BOOL: "?", T.UINT64: "Q", T.INT64: "q",
            T.FLOAT64: "d"}


def _read_gguf(p: Path, fh: object, size: int) -> TensorFile:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

    scalars = _gguf_scalar_sizes()
    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:  # type: ignore[attr-defined]
        c = _Cursor(p, buf, size)
        c.pos = 4
        (version,) = c.unpack("I", "version")
        if version not in (2, 3):
            raise ModelFileError(p, f"unsupported GGUF version {version} (expected 2 or 3)")
        n_tensors, n_kv = c.unpack("QQ", "counts")
        if n_tensors > (size - c.pos) // 24 or n_kv > (size - c.pos) // 12:
            raise ModelFileError(p, f"GGUF header claims {n_tensors} tensors and {n_kv} "
                                    f"key/value pairs, more than the file can hold")
        metadata: dict[str, str] = {}
        alignment = 32
        for _ in range(n_kv):
            key = c.string("metadata key", _GGUF_MAX_NAME)
            (vtype,) = c.unpack("I", f"type of {key!r}")
            value = _gguf_value(c, vtype, key, scalars, GGUFValueType)
            if key in metadata:
                raise ModelFileError(p, f"duplicate GGUF metadata key {key!r}")
            metadata[key] = "" if value is None else str(value)
            if key == "general.alignment":
                if not isinstance(value, int) or value <= 0 or value & (value - 1):
                    raise ModelFileError(p, f"GGUF alignment {value!r} is not a power of two")
                alignment = value
        infos: list[tuple[str, tuple[int, ...], str, int, int]] = []
        seen: set[str] = set()
        for i in range(n_tensors):
            name = c.string(f"name of tensor {i}", _GGUF_MAX_NAME)
            if name in seen:
                raise ModelFileError(p, f"duplicate tensor name {name!r}")
            seen.add(name)
            (n_dims,) = c.unpack("I", f"dims of {name!r}")
            if n_dims > _GGUF_MAX_DIMS:
                raise ModelFileError(p, f"tensor {name!r}: {n_dims} dimensions (max 4)")
            dims = c.unpack("Q" * n_dims, f"dims of {name!r}")
            (tcode, rel) = c.unpack("IQ", f"type of {name!r}")
            try:
                qtype = GGMLQuantizationType(tcode)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise ModelFileError(p, f"tensor {name!r}: unknown ggml type {tcode}") from None
            count = 1
            for d in dims:
                count *= d
            if dims and dims[0] % block:
                raise ModelFileError(p, f"tensor {name!r}: row of {dims[0]} is not a multiple "
                                        f"of the {qtype.name} block size {block}")
            infos.append((name, tuple(reversed(dims)), qtype.name, rel,
                          count // block * type_size))
        data_start = -(-c.pos // alignment) * alignment
    tensors: list[TensorInfo] = []
    spans: list[tuple[int, int, str]] = []
    for name, shape, dtype, rel, nbytes in infos:
        if data_start + rel + nbytes > size:
            raise ModelFileError(p, f"truncated: tensor {name!r} ends at byte "
                                    f"{data_start + rel + nbytes} beyond the file ({size})")
        spans.append((rel, rel + nbytes, name))
        tensors.append(TensorInfo(name, dtype, shape, nbytes, data_start + rel, str(p)))
    _check_overlaps(p, spans)
    return TensorFile(str(p), "gguf", tuple(tensors), metadata)


def read_gguf_arrays(path: str | Path, keys: Iterable[str]) -> dict[str, list]:
    """The GGUF metadata arrays named ``keys`` (strings as ``str``, numbers as ``int`` /
    ``float``), e.g. a llama.cpp file's ``tokenizer.ggml.tokens``; keys the file lacks are
    absent from the result. Bounded like :func:`read_tensor_file`.

    Raises:
        ModelFileError: not a GGUF file, or a malformed, truncated or hostile header.
    """
    from gguf import GGUFValueType

    p, wanted = Path(path), set(keys)
    out: dict[str, list] = {}
    try:
        with open(p, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if fh.read(4) != _GGUF_MAGIC:
                raise ModelFileError(p, "not a GGUF file")
            scalars = _gguf_scalar_sizes()
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                c = _Cursor(p, buf, size)
                c.pos = 4
                (version,) = c.unpack("I", "version")
                if version not in (2, 3):
                    raise ModelFileError(p, f"unsupported GGUF version {version} (expected 2 or 3)")
                _, n_kv = c.unpack("QQ", "counts")
                if n_kv > (size - c.pos) // 12:
                    raise ModelFileError(p, f"GGUF header claims {n_kv} key/value pairs, more "
                                            f"than the file can hold")
                for _ in range(n_kv):
                    key = c.string("metadata key", _GGUF_MAX_NAME)
                    (vtype,) = c.unpack("I", f"type of {key!r}")
                    value = _gguf_value(c, vtype, key, scalars, GGUFValueType, key in wanted)
                    if key in wanted and isinstance(value, list):
                        out[key] = value
    except OSError as exc:
        raise ModelFileError(p, f"cannot read file: {exc.strerror or exc}") from None
    return out


def _gguf_value(c: _Cursor, vtype: int, key: str, scalars: dict[int, str],
                T: type, keep: bool = False) -> object:  # noqa: N803 (the enum type)
    """One metadata value; arrays are skipped (None) unless ``keep`` (a list then)."""
    if vtype in scalars:
        return c.unpack(scalars[vtype], f"value of {key!r}")[0]
    if vtype == T.STRING:  # type: ignore[attr-defined]
        return c.string(f"value of {key!r}")
    if vtype == T.ARRAY:  # type: ignore[attr-defined]
        (itype, count) = c.unpack("IQ", f"array {key!r}")
        if itype in scalars:
            item = struct.calcsize("<" + scalars[itype])
            c.need(count * item, f"array {key!r}")
            values = (list(struct.unpack_from(f"<{count}{scalars[itype]}", c.buf, c.pos))
                      if keep else None)
            c.pos += count * item
            return values
        if itype == T.STRING:  # type: ignore[attr-defined]
            c.need(count * 8, f"array {key!r}")  # each string has an 8-byte length
            strings: list[str] = []
            for i in range(count):
                if keep:
                    strings.append(c.string(f"item {i} of array {key!r}"))
                    continue
                (n,) = c.unpack("Q", f"array {key!r}")
                c.need(n, f"array {key!r}")
                c.pos += n
            return strings if keep else None
        raise ModelFileError(c.p, f"GGUF array {key!r} of unsupported item type {itype}")
    raise ModelFileError(c.p, f"GGUF key {key!r} has unknown value type {vtype}")
