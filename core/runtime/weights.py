"""Weights of a model file in ggml backend buffers.

A :class:`WeightFile` couples a file's header (``checkpoint_readers.read_tensor_file``) with
``sdplan._ggml.WeightStore`` objects holding the tensors in the dtypes the runtime uses.
Tensors are allocated per set of names (a whole module, a block range, a segment) into one
backend buffer on one device and filled straight from the file with large sequential reads
(``WeightStore.read``: pread into a staging buffer, ``ggml_backend_tensor_set``, GIL
released), converting dtypes the backend cannot consume.

On a CPU, tensors held in their file dtype are mapped from the file instead
(:meth:`WeightFile.map`, ``WeightStore.map``): a private copy-on-write mapping whose pages are
populated from the page cache, so loading costs no copy and the page cache is the only copy
of the weights in RAM (``SDPLAN_MMAP=0`` turns it off).

Tensors may also come from numpy arrays in memory (:meth:`WeightFile.from_arrays`), written
into the buffers with ``WeightStore.set_data``.

Dtype policy (:func:`runtime_dtype`): vectors (biases, norm weights) become f32; for a module
whose model class lists this CPU's bf16 kernel in ``cpu_bf16_kernels``, run by CPUs that all
run sdplan's bf16 kernel (AMX or AVX512_BF16, :func:`cpu_bf16`), 16-bit float matrices and conv
kernels become bf16 as they load with AMX, and keep their file's dtype (f16 or bf16) with
AVX512_BF16, whose kernel rounds f16 to bf16 as it uses it, so the f16 weights stay mapped
from the file (:func:`bf16_at_load`; f32 files keep f32); otherwise conv kernels (4-D) f16 unless already f32, and matrices
keep the file dtype when the backend multiplies it, otherwise f32 (bf16, f64) or f16 (quantized
kernels ggml cannot run there). A :class:`~sdplan.core.runtime.runner.ModuleRunner` applies the
policy for the device its module runs on (:meth:`WeightFile.hold_for`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.readers import TensorInfo, file_version, read_tensor_file
from sdplan.core.runtime.native import native
from sdplan.core.runtime.threads import usable_cpus

log = logging.getLogger(__name__)

#: Bytes per pread when a tensor must be staged (device buffers or dtype conversion).
CHUNK_BYTES = 64 * 2**20

#: Spans of a file closer than this are advised as one (:meth:`WeightFile.drop_cache`): the
#: gaps between one module's tensors are other modules' tensors or headers, and one call per
#: tensor would cost more than the few pages of the gap.
DROP_GAP_BYTES = 1 << 20

#: File dtypes ggml cannot hold as such, and what they become.
_WIDEN = {"f64": "f32", "i64": "i32"}


#: Environment variable: ``0`` (or ``false``, ``off``, ``no``) reads weights into memory
#: instead of mapping them from their files (:meth:`WeightFile.map`).
MMAP_ENV = "SDPLAN_MMAP"


def mmap_enabled() -> bool:
    """Whether CPU weights held in their file's dtype are mapped from the file (``$SDPLAN_MMAP``
    unset or anything but 0/false/off/no, case-insensitive)."""
    return os.environ.get(MMAP_ENV, "").strip().lower() not in ("0", "false", "off", "no")


def _file_identity(path: str) -> tuple[int, ...] | None:
    """``(device, inode, size, modification time ns)`` of ``path`` (:func:`file_version` less
    the change time, which a chmod moves too), None when it cannot be read."""
    try:
        return file_version(os.stat(path))[:4]
    except OSError:
        return None


def ggml_dtype(file_dtype: str) -> str:
    """ggml type name (lower case) of a safetensors or GGUF dtype (``BF16`` -> ``bf16``)."""
    return file_dtype.lower()


def cpu_bf16(backend: Any | None) -> bool:
    """True when ``backend`` is a local CPU backend (not one standing in for another device)
    and this CPU runs sdplan's bf16 kernel
    (``sdplan._ggml.bf16_kernel()`` is ``amx`` or ``avx512``): matrix products and
    convolutions with bf16 weights then run it (native/kernels/bf16_gemm.cpp), and f16 ones in
    graphs with ``f16_as_bf16``.

    Which modules run their products in bf16 is measured per module and kernel (their model
    class's ``cpu_bf16_kernels``; bench/bench_cpu_bf16.py, core/runtime/bf16_rule.py).
    """
    if backend is None or getattr(backend, "stand_in", False):
        return False
    return native().device_type(backend.device_name) == "cpu" and bf16_kernel() != "off"


def bf16_kernel() -> str:
    """The CPU bf16 kernel graphs built now use: ``amx``, ``avx512`` or ``off``
    (:func:`sdplan.core.runtime.kernels.current`; ``SDPLAN_BF16_KERNEL`` chooses), as the
    native module runs it."""
    native()  # the first use chooses the kernels
    return str(native().bf16_kernel())


def bf16_at_load() -> bool:
    """Whether the f16 weights of modules whose products run the CPU bf16 kernel are converted
    to bf16 as they load (AMX), rather than kept f16 and rounded by the kernel as it uses them
    (AVX512_BF16; ``Graph.f16_as_bf16``): each product gives the same bits either way (ops
    outside the kernel, such as embedding lookups, read f16 values in the second case).

    Measured (bench/bench_cpu_bf16.py, SD 1.5 size, 2 threads, AMD EPYC with AVX512_BF16): the
    load 0.20 s in f16 against 2.6 s with the conversion (first touch of 1.7 GiB of fresh
    memory on that VM), the products 0.96-1.06x their time with bf16 weights at the UNet's
    shapes (1.13x for 1280 channels at 8x8, where each weight value serves 256 flops). AMX
    multiplies about 4x faster, so the conversion would weigh about 4x more per use there: kept
    at load (0.55 s, 1.86x the file read, on a Xeon).
    """
    return bf16_kernel() == "amx"


def runtime_dtype(info: TensorInfo, backend: Any | None = None, bf16: bool = False) -> str:
    """The dtype a tensor is held in on ``backend`` (None: keep what ggml can hold); ``bf16``:
    the module's products run sdplan's bf16 kernel when ``backend`` is a CPU running it
    (:func:`cpu_bf16`): its 16-bit float matrices and conv kernels become bf16 where
    :func:`bf16_at_load`, else keep the file's dtype (f16 or bf16: the kernel reads both; bf16
    conv kernels are not widened to f16).

    Raises ModelFileError for dtypes ggml has no conversion from (integers other than i32).
    """
    dt = ggml_dtype(info.dtype)
    if dt in _WIDEN:
        if dt == "i64":
            raise ModelFileError(info.file, f"tensor {info.name!r}: i64 weights are not supported")
        dt = _WIDEN[dt]
    if dt in ("i32", "i16", "i8"):
        return dt
    if len(info.shape) <= 1:
        return "f32"
    if bf16 and dt in ("f16", "bf16") and len(info.shape) in (2, 4) and cpu_bf16(backend):
        return "bf16" if bf16_at_load() else dt
    if len(info.shape) == 4:
        return dt if dt in ("f32", "f16") else "f16"
    if backend is not None:
        if not native().supports_mul_mat(backend, dt):
            return "f32"
    return dt


class WeightFile:
    """One model file: its tensor index and the dtypes its tensors are held in.

    ``names`` restricts the tensors used (default: all). ``dtypes`` maps names to runtime
    dtypes (default: :func:`runtime_dtype` for ``backend``; :meth:`hold_for` re-applies the
    policy for another device, keeping these). Raises ModelFileError for an unreadable file or
    a missing name.
    """

    def __init__(self, path: str | Path, names: Iterable[str] | None = None,
                 dtypes: Mapping[str, str] | None = None, backend: Any | None = None,
                 _arrays: Mapping[str, Any] | None = None) -> None:
        self.path = str(path)
        #: name -> host array when the tensors come from memory (:meth:`from_arrays`).
        self.arrays: dict[str, Any] | None = None
        #: the file's identity when its header was read (see :meth:`check_unchanged`).
        self._identity: tuple[int, ...] | None = None
        if _arrays is None:
            index = {t.name: t for t in read_tensor_file(path).tensors}
            self._identity = _file_identity(self.path)
        else:
            self.arrays = dict(_arrays)
            index = {n: _array_info(n, a, self.path) for n, a in self.arrays.items()}
        wanted = list(index) if names is None else list(names)
        missing = [n for n in wanted if n not in index]
        if missing:
            raise ModelFileError(self.path, f"missing tensors: {', '.join(missing[:5])}")
        self.infos: dict[str, TensorInfo] = {n: index[n] for n in wanted}
        self.dtypes: dict[str, str] = {
            n: (dtypes or {}).get(n) or runtime_dtype(self.infos[n], backend) for n in wanted}
        #: the policy's dtypes at construction: :meth:`hold_for` changes only the names that
        #: still have them (not those given in ``dtypes`` or set later).
        self._policy = {n: d for n, d in self.dtypes.items() if not (dtypes or {}).get(n)}

    def hold_for(self, backend: Any, bf16: bool = False) -> None:
        """Hold the tensors in the dtypes of :func:`runtime_dtype` for ``backend`` (the device
        the module runs on) and ``bf16``, except those whose dtype was given or set explicitly.
        Call before :meth:`new_store`."""
        for n, d in self._policy.items():
            if self.dtypes[n] == d:
                self.dtypes[n] = self._policy[n] = runtime_dtype(self.infos[n], backend, bf16)

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, Any], label: str | Path, names: Iterable[str] | None = None,
                    dtypes: Mapping[str, str] | None = None, backend: Any | None = None) -> WeightFile:
        """A weight file whose tensors are numpy arrays in memory (a ``.pth`` checkpoint read
        by :mod:`sdplan.core.modelfiles.pth`, say): float64/float32/float16/int32 arrays, held in
        f32/f16/i32 per the dtype policy. ``label`` names the source in errors.

        Raises:
            ModelFileError: an array of another dtype, a missing name, or a runtime dtype
                that cannot be made from an array (bf16, quantized types).
        """
        return cls(label, names, dtypes, backend, _arrays=arrays)

    def specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """``(name, dtype, shape)`` for ``sdplan._ggml.WeightStore``."""
        return [(n, self.dtypes[n], tuple(self.infos[n].shape) or (1,)) for n in self.infos]

    def new_store(self) -> Any:
        """A new, unallocated ``WeightStore`` of every tensor of this file."""
        return native().WeightStore(self.specs())

    def read(self, store: Any, names: Sequence[str], chunk_bytes: int = CHUNK_BYTES, n_threads: int = 0) -> int:
        """Fill the (allocated) tensors ``names`` of ``store`` from the file; returns bytes read.
        Tensors in host memory are copied or converted by ``n_threads`` threads (0: one per CPU
        this process may run on, at most 8).

        Raises ValueError for an unallocated tensor, RuntimeError when the file is short,
        ModelFileError when it changed since its header was read.
        """
        if self.arrays is not None:
            return self._set_arrays(store, names)
        self.check_unchanged()
        items = [(n, self.infos[n].offset, ggml_dtype(self.infos[n].dtype)) for n in names]
        threads = n_threads if n_threads > 0 else min(8, len(usable_cpus()))
        t0 = time.perf_counter()
        n = int(store.read(self.path, items, chunk_bytes, threads))
        dt = time.perf_counter() - t0
        log.debug("read %d bytes of %s in %.3f s", n, self.path, dt)
        return n

    def check_unchanged(self) -> None:
        """Raise ModelFileError when the file is no longer the one whose header was read
        (replaced, or rewritten: another device, inode, size or modification time), so that a
        module loading later in a run never mixes in another file's weights."""
        if self.arrays is None and self._identity is not None and _file_identity(self.path) != self._identity:
            raise ModelFileError(self.path, "the file changed since sdplan opened it (replaced or rewritten "
                                            "while in use); run again")

    def map(self, store: Any, names: Sequence[str], backend: Any) -> tuple[Any | None, list[str]]:
        """Place those of the tensors ``names`` of ``store`` (not yet allocated) that are held in
        their file dtype in a mapping of the file on ``backend``: ``(WeightBuffer or None, the
        names left)``. Nothing is mapped (None, every name) off the CPU, for tensors from
        memory, misaligned tensors, or with ``SDPLAN_MMAP=0``; the caller allocates the names
        left (biases and norms widened to f32, converted dtypes) and fills them with :meth:`read`.

        Raises RuntimeError when the file is shorter than its header says or cannot be read,
        ModelFileError when it changed since its header was read.
        """
        self.check_unchanged()
        if self.arrays is not None or not mmap_enabled():
            return None, list(names)
        items = [(n, self.infos[n].offset, ggml_dtype(self.infos[n].dtype)) for n in names]
        same = [it for it in items if it[2] == self.dtypes[it[0]]]
        if not same:
            return None, list(names)
        t0 = time.perf_counter()
        wb = store.map(self.path, same, backend)
        if wb is None:
            return None, list(names)
        log.debug("mapped %d tensors of %s in %.3f s", len(same), self.path, time.perf_counter() - t0)
        mapped = {it[0] for it in same}
        return wb, [n for n in names if n not in mapped]

    def file_spans(self, names: Iterable[str], gap: int = DROP_GAP_BYTES) -> list[tuple[int, int]]:
        """The file's byte spans ``[(offset, length)]`` holding the tensors ``names``, in file
        order, spans closer than ``gap`` bytes merged (empty for tensors from memory)."""
        if self.arrays is not None:
            return []
        spans = sorted((self.infos[n].offset, self.infos[n].offset + self.infos[n].nbytes) for n in names)
        out: list[list[int]] = []
        for a, b in spans:
            if out and a - out[-1][1] <= gap:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        return [(a, b - a) for a, b in out if b > a]

    def drop_cache(self, names: Iterable[str]) -> int:
        """Tell the kernel the file bytes of ``names`` will not be read again soon
        (``posix_fadvise(POSIX_FADV_DONTNEED)`` over :meth:`file_spans`), so that weights held
        on disk (residency ``disk``) leave no copy in the page cache once their buffers are
        freed. Pages still mapped (by this process or another) stay: the advice drops only
        clean, unmapped page-cache pages. Returns the bytes advised; 0 where the platform has
        no ``posix_fadvise``, for tensors from memory, or when the file cannot be opened
        (the advice is an optimisation, never an error)."""
        spans = self.file_spans(names)
        if not spans or not hasattr(os, "posix_fadvise"):
            return 0
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return 0
        done = 0
        try:
            for off, length in spans:
                os.posix_fadvise(fd, off, length, os.POSIX_FADV_DONTNEED)
                done += length
        except OSError:
            pass
        finally:
            os.close(fd)
        return done

    def _set_arrays(self, store: Any, names: Sequence[str]) -> int:
        import numpy as np

        total = 0
        for n in names:
            to = _NUMPY.get(self.dtypes[n])
            if to is None:
                raise ModelFileError(self.path, f"tensor {n!r}: {self.dtypes[n]} cannot be made from an array")
            store.set_data(n, np.ascontiguousarray(self.arrays[n], dtype=to))  # type: ignore[index]
            total += self.infos[n].nbytes
        return total

    def nbytes(self, names: Iterable[str]) -> int:
        """File bytes of ``names``."""
        return sum(self.infos[n].nbytes for n in names)


#: numpy dtypes of arrays from memory (safetensors names) and of the runtime dtypes they fill.
_ARRAY_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "int32": "I32"}
_NUMPY = {"f32": "float32", "f16": "float16", "i32": "int32"}


def _array_info(name: str, array: Any, label: str) -> TensorInfo:
    dt = _ARRAY_DTYPES.get(str(getattr(array, "dtype", "")))
    if dt is None:
        raise ModelFileError(label, f"tensor {name!r}: arrays of dtype {getattr(array, 'dtype', type(array))} "
                                    f"are not supported (float64/32/16, int32)")
    return TensorInfo(name, dt, tuple(int(d) for d in array.shape), int(array.nbytes), 0, label)


def plain_read_seconds(path: str | Path, chunk_bytes: int = CHUNK_BYTES) -> tuple[int, float]:
    """Read a whole file sequentially into one reused buffer: ``(bytes, seconds)``.

    The reference for weight-load throughput (same file, same page cache state as the
    caller arranges)."""
    buf = bytearray(chunk_bytes)
    view = memoryview(buf)
    total = 0
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            n = os.readv(fd, [view])
            if n <= 0:
                break
            total += n
    finally:
        os.close(fd)
    return total, time.perf_counter() - t0
