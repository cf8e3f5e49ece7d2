"""The model library: every model file in the user's folders, read once and cached.

:func:`scan_library` walks folders for model files (``.safetensors``, ``.sft``, ``.gguf``;
``.ckpt``/``.pt``/``.pth`` pickles are listed but not read) and diffusers pipeline folders,
reads each header once (:func:`sdplan.core.modelfiles.readers.read_tensor_file`, never a
weight byte) and describes it as a :class:`LibraryEntry`: its kind (checkpoint, diffusion
model, text encoder, VAE, LoRA, upscaler...), family, size, quantisation, latent channels
(VAEs) and the planner's profile of its modules.

Entries are cached in ``library-v1.json`` under the user's cache folder
(:func:`cache_dir`), keyed by absolute path and valid while the file's size and
modification time (nanoseconds) are unchanged: a second scan of an unchanged folder reads
no header (:attr:`ScanResult.headers_read` is 0). What fits on which devices is not cached:
:mod:`sdplan.core.modelfiles.library_fit` computes it from the cached profiles.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sdplan.core.errors import ModelFileError
from sdplan.core.families import lora_family as registry_lora_family
from sdplan.core.modelfiles import checkpoint as _ckpt
from sdplan.core.modelfiles.checkpoint import ModelSet, ModelTensor, read_model_files
from sdplan.core.modelfiles.readers import TensorFile, read_tensor_file
from sdplan.core.planning import paths as safe_paths
from sdplan.core.planning.bounded_json import read_json

log = logging.getLogger(__name__)

#: Suffixes of files whose headers the library reads.
HEADER_SUFFIXES = (".safetensors", ".sft", ".gguf")
#: PyTorch pickle suffixes: listed (kind ``pickle``), never read.
PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth")
#: The cache file's name; the ``v1`` changes whenever :class:`LibraryEntry` does.
CACHE_NAME = "library-v1.json"

#: Kinds in display order, with their titles.
KIND_TITLES: dict[str, str] = {
    "checkpoint": "Checkpoint", "diffusion": "Diffusion model", "encoder": "Text encoder",
    "vae": "VAE", "tae": "Tiny autoencoder", "lora": "LoRA", "controlnet": "ControlNet",
    "upscaler": "Upscaler", "clip_vision": "CLIP vision", "photomaker": "PhotoMaker",
    "pickle": "PyTorch pickle", "unknown": "Not a model",
}
#: Kinds that generate images (they get a fit verdict).
DIFFUSION_KINDS = ("checkpoint", "diffusion")

_LORA_RE = re.compile(r"(?:^|[._])(lora_(?:up|down|A|B)|lora\.(?:up|down)|hada_w[12]_[ab]|"
                      r"lokr_w[12])(?:\.|$)")


@dataclass(frozen=True)
class LibraryEntry:
    """One model file (or diffusers folder) of the library.

    Attributes:
        path: absolute path.
        size: bytes on disk (a folder: its weight files together).
        mtime_ns: modification time in nanoseconds (a folder: its newest weight file).
        kind: a key of :data:`KIND_TITLES`.
        family: the diffusion family (``sd1``, ``sdxl``, ``flux``... as
            :func:`sdplan.core.modelfiles.checkpoint.detect_architecture` names it) for
            checkpoints, diffusion models, LoRAs and ControlNets; None for shared parts.
        variant: the family's variant (``dev``, ``schnell``, ``refiner``...), or None.
        quant: the dominant weight dtype by bytes (``BF16``, ``F16``, ``Q8_0``, ``Q4_K``...).
        weight_bytes: bytes of all tensors the header lists.
        modules: modules the file holds (spec section 1 names), in module order.
        encoders: text encoders it holds (``clip_l``, ``t5xxl``, ``llm``...).
        latent_channels: a VAE's latent channels (4 for SD, 16 for Flux/SD3...), or None.
        profile: the planner's profile JSON of its modules
            (:meth:`sdplan.core.planning.profile.Profile.to_json`), or None.
        error: why the file could not be read or understood, or None.
    """

    path: str
    size: int
    mtime_ns: int
    kind: str
    family: str | None = None
    variant: str | None = None
    quant: str | None = None
    weight_bytes: int = 0
    modules: tuple[str, ...] = ()
    encoders: tuple[str, ...] = ()
    latent_channels: int | None = None
    profile: dict | None = field(default=None, compare=False)
    error: str | None = None

    @property
    def name(self) -> str:
        return Path(self.path).name

    @property
    def architecture(self) -> str | None:
        """``family-variant`` (``flux-dev``), the family alone, or None."""
        if self.family is None:
            return None
        return f"{self.family}-{self.variant}" if self.variant else self.family

    @property
    def group(self) -> str:
        """The heading it is listed under: the family for models of one family
        (``flux``), else the kind's title (``Text encoder``)."""
        if self.kind in (*DIFFUSION_KINDS, "lora", "controlnet") and self.family:
            return self.family
        return KIND_TITLES.get(self.kind, self.kind)

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["modules"], d["encoders"] = list(self.modules), list(self.encoders)
        return d

    @classmethod
    def from_json(cls, data: dict) -> LibraryEntry:
        """Inverse of :meth:`to_json` (raises KeyError/TypeError on a malformed dict)."""
        d = dict(data)
        d["modules"] = tuple(d.get("modules") or ())
        d["encoders"] = tuple(d.get("encoders") or ())
        return cls(**d)


def grouped(entries: Iterable[LibraryEntry]) -> dict[str, list[LibraryEntry]]:
    """Entries by :attr:`LibraryEntry.group`: families first (alphabetically, ``unknown``
    last), then the shared kinds in :data:`KIND_TITLES` order; entries keep their order."""
    groups: dict[str, list[LibraryEntry]] = {}
    for e in entries:
        groups.setdefault(e.group, []).append(e)
    kinds = list(KIND_TITLES.values())

    def key(g: str) -> tuple[int, int, str]:
        if g in kinds:
            return (2, kinds.index(g), g)
        return (1 if g == "unknown" else 0, 0, g)

    return {g: groups[g] for g in sorted(groups, key=key)}


@dataclass
class ScanResult:
    """What :func:`scan_library` found: entries by path order, how many headers it read,
    how many entries came from the cache, and the folders that do not exist."""

    entries: list[LibraryEntry]
    headers_read: int = 0
    cached: int = 0
    missing_folders: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- cache


def cache_dir() -> Path:
    """The user's cache folder for sdplan: ``$SDPLAN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/sdplan`` (``~/.cache/sdplan``; ``%LOCALAPPDATA%\\sdplan\\cache`` on
    Windows, ``~/Library/Caches/sdplan`` on macOS)."""
    env = os.environ.get("SDPLAN_CACHE_DIR")
    if env:
        return Path(env)
    if sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
        return Path(os.environ["LOCALAPPDATA"]) / "sdplan" / "cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "sdplan"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sdplan"


def classifier_stamp() -> str:
    """A digest of the code that describes files (the header readers, the family rules and
    this module): a cache written by other code is not used, so a new sdplan that knows a
    new family never shows an old description from the cache."""
    import hashlib

    from sdplan.core import families
    from sdplan.core.modelfiles import checkpoint, readers

    rules = [sys.modules[n] for n in sorted(sys.modules) if n.startswith("sdplan.core.families.")]
    h = hashlib.sha256()
    for mod in (readers, families, *rules, checkpoint, sys.modules[__name__]):
        try:
            h.update(Path(str(mod.__file__)).read_bytes())
        except OSError:
            h.update(str(getattr(mod, "__name__", "")).encode())
    return h.hexdigest()[:16]


def _starts_as_cache(path: Path) -> bool:
    """Whether the file at ``path`` is empty or starts as JSON text of an object (as every
    cache sdplan writes does)."""
    try:
        with safe_paths.open_regular(path, "library cache") as fh:
            head = fh.read(1)
    except OSError:
        return False
    return head in (b"", b"{")


class LibraryCache:
    """Entries by absolute path, read from and written to one JSON file (``path``;
    default :func:`cache_dir` / :data:`CACHE_NAME`), valid for the code that wrote it
    (:func:`classifier_stamp`). A missing, unreadable or other code's cache is an empty one
    (logged), never an error. The file is read with the bounded JSON reader
    (:func:`sdplan.core.planning.bounded_json.read_json`). A broken cache (text starting
    with ``{`` that is not JSON) is replaced; a file that is not text JSON (a model file given
    as ``--cache``, say) or JSON of another kind (an object without a ``stamp``) is
    :attr:`foreign` and never replaced."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else cache_dir() / CACHE_NAME
        self.entries: dict[str, LibraryEntry] = {}
        #: Absolute path -> ``[size, mtime_ns, sha256 hex]`` of the whole file
        #: (:func:`file_sha256`); kept whatever code wrote the entries (a hash does not depend
        #: on it).
        self.hashes: dict[str, list] = {}
        self._dirty = False
        self.stamp = classifier_stamp()
        self.foreign = False
        try:
            if not safe_paths.exists(self.path):
                return
            self.foreign = not _starts_as_cache(self.path)
            raw = read_json(self.path, what="library cache")
            if not isinstance(raw, dict) or "stamp" not in raw:
                self.foreign = True
                raise ValueError("not an sdplan library cache")
            hashes = raw.get("sha256")
            if isinstance(hashes, dict):
                self.hashes = {str(k): list(v) for k, v in hashes.items()
                               if isinstance(v, list) and len(v) == 3}
            if raw.get("stamp") != self.stamp:
                raise ValueError("written by other code (the file descriptions may differ)")
            for item in raw.get("entries", []):
                e = LibraryEntry.from_json(item)
                self.entries[e.path] = e
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.info("library cache %s not used: %s", self.path, exc)
            self.entries = {}

    def get(self, path: str, size: int, mtime_ns: int) -> LibraryEntry | None:
        """The cached entry of ``path`` when its size and mtime still match, else None."""
        e = self.entries.get(path)
        return e if e is not None and e.size == size and e.mtime_ns == mtime_ns else None

    def put(self, entry: LibraryEntry) -> None:
        self.entries[entry.path] = entry
        self._dirty = True

    def forget_missing(self, under: Iterable[str]) -> None:
        """Drop entries below the folders ``under`` whose files no longer exist."""
        roots = [os.path.join(os.path.abspath(u), "") for u in under]
        for p in [p for p in self.entries if any(p.startswith(r) for r in roots)]:
            if not os.path.exists(p):
                del self.entries[p]
                self._dirty = True

    def save(self) -> None:
        """Write the cache when it changed (atomically; a failure is logged)."""
        if not self._dirty:
            return
        if self.foreign:
            log.warning("library cache %s not written: that file is not an sdplan cache",
                        self.path)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            data = {"stamp": self.stamp, "entries": [e.to_json() for e in self.entries.values()],
                    "sha256": self.hashes}
            tmp.write_text(json.dumps(data), encoding="utf-8")
            os.replace(tmp, self.path)
            self._dirty = False
        except OSError as exc:
            log.warning("library cache %s not written: %s", self.path, exc)


    def sha256(self, path: str | Path) -> str:
        """The SHA-256 (hex) of the whole file ``path``, from the cache while its size and
        modification time are unchanged, else read and kept (:meth:`save` writes it).

        Raises:
            OSError: the file cannot be read.
        """
        import hashlib

        key = os.path.abspath(path)
        st = os.stat(key)
        got = self.hashes.get(key)
        if got is not None and got[0] == st.st_size and got[1] == st.st_mtime_ns:
            return str(got[2])
        h = hashlib.sha256()
        with open(key, "rb") as fh:
            for block in iter(lambda: fh.read(8 << 20), b""):
                h.update(block)
        self.hashes[key] = [st.st_size, st.st_mtime_ns, h.hexdigest()]
        self._dirty = True
        return h.hexdigest()


_HASH_LOCK = threading.Lock()


def file_sha256(path: str | Path, cache: LibraryCache | None = None) -> str:
    """The SHA-256 (hex) of a model file, computed once and kept with the library's header
    cache (:meth:`LibraryCache.sha256`; the default cache file, saved at once). Its first 10
    hex digits are the ``Model hash`` Stable Diffusion web UI writes (its "AutoV2" hash), by
    which model sites link a picture to its model. Safe to call from several threads.

    Raises:
        OSError: the file cannot be read.
    """
    with _HASH_LOCK:
        c = cache if cache is not None else LibraryCache()
        digest = c.sha256(path)
        c.save()
        return digest


# --------------------------------------------------------------------------- scanning


def classify_file(tf: TensorFile) -> ModelSet:
    """:func:`~sdplan.core.modelfiles.checkpoint.read_model_files` of one ``-m`` file whose
    header is already read, so the library reads each header once: the same steps (the
    single-file classification, duplicate check, blocks, architecture) on ``tf``.

    Raises:
        ModelFileError: the file holds no tensors or none in a known layout.
    """
    if not tf.tensors:
        raise ModelFileError(tf.path, "not a model: the file holds no tensors")
    cls, ignored = _ckpt.classify_checkpoint(tf)
    tensors = [ModelTensor(t, m, e) for t, m, e in cls]
    _ckpt._check_duplicates(tensors)
    dominant = _ckpt._dominant(tensors)
    ms = ModelSet([tf], [_ckpt._with_block(t, dominant) for t in tensors], ignored)
    ms.architecture = _ckpt.detect_architecture(ms)
    return ms



def _is_diffusers(folder: Path) -> bool:
    return (folder / "model_index.json").is_file() or (
        (folder / "vae").is_dir() and any((folder / c).is_dir() for c in ("unet", "transformer")))


def find_model_files(folders: Sequence[str | Path]) -> tuple[list[Path], list[str]]:
    """Model files and diffusers folders below ``folders`` (recursively, hidden folders
    skipped, sorted), and the folders that do not exist."""
    found: list[Path] = []
    missing: list[str] = []
    for folder in folders:
        root = Path(os.path.abspath(Path(folder).expanduser()))
        try:
            there = safe_paths.is_dir(root)
        except OSError as exc:  # a name too long, a folder without search permission
            missing.append(f"{folder} ({safe_paths.reason(exc)})")
            continue
        if not there:
            missing.append(str(folder))
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            if _is_diffusers(here):
                found.append(here)
                dirnames[:] = []
                continue
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            found.extend(here / f for f in sorted(filenames)
                         if f.lower().endswith(HEADER_SUFFIXES + PICKLE_SUFFIXES))
    return sorted(set(found)), missing


def _stat(path: Path) -> tuple[int, int]:
    """``(size, mtime_ns)``; for a folder, of its weight files together."""
    if path.is_dir():
        files = [f for f in path.rglob("*") if f.suffix in (".safetensors", ".json", ".gguf")]
        stats = [f.stat() for f in files]
        return sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0)
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def scan_library(folders: Sequence[str | Path], cache: LibraryCache | None = None, *,
                 progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> ScanResult:
    """Describe every model file below ``folders``, from the cache where it is current.

    Args:
        folders: folders to walk (a folder that does not exist is reported in
            :attr:`ScanResult.missing_folders`, not raised).
        cache: the cache to use and update (saved before returning); None: a fresh
            :class:`LibraryCache` at the default location.
        progress: called with ``(done, total)`` after each file.
        should_stop: polled before each file; True ends the scan early (entries so far).

    Returns:
        A :class:`ScanResult`; an unreadable file is an entry with ``error`` set.
    """
    cache = cache if cache is not None else LibraryCache()
    paths, missing = find_model_files(folders)
    result = ScanResult([], missing_folders=missing)
    for i, path in enumerate(paths):
        if should_stop is not None and should_stop():
            break
        try:
            size, mtime = _stat(path)
        except OSError as exc:
            log.info("%s skipped: %s", path, exc)
            continue
        entry = cache.get(str(path), size, mtime)
        if entry is None:
            entry, reads = describe_file(path, size, mtime)
            result.headers_read += reads
            cache.put(entry)
        else:
            result.cached += 1
        result.entries.append(entry)
        if progress is not None:
            progress(i + 1, len(paths))
    cache.forget_missing([os.path.abspath(Path(f).expanduser()) for f in folders])
    cache.save()
    return result


def describe_file(path: str | Path, size: int | None = None,
                  mtime_ns: int | None = None) -> tuple[LibraryEntry, int]:
    """Read one file's header (a diffusers folder: its components') and describe it.

    Returns:
        ``(entry, headers read)``. Unreadable files and files that are not models give an
        entry of kind ``unknown`` with ``error`` set (never raised).
    """
    p = Path(os.path.abspath(path))  # links keep their own path (the cache's key)
    if size is None or mtime_ns is None:
        size, mtime_ns = _stat(p)
    base = LibraryEntry(str(p), size, mtime_ns, "unknown")
    if p.suffix.lower() in PICKLE_SUFFIXES and p.is_file():
        return _replace(base, kind="pickle", error="PyTorch pickle: its tensors cannot be "
                        "listed without loading it (convert it to safetensors)"), 0
    try:
        if p.is_dir():
            ms = read_model_files({"model": [p]})
            return describe_model_set(base, ms), len(ms.files)
        tf = read_tensor_file(p)
    except ModelFileError as exc:
        return _replace(base, error=_short(exc, p)), 1
    lora = lora_family(tf)
    if lora is not None:
        return _replace(base, kind="lora", family=lora, quant=_quant(tf),
                        weight_bytes=tf.nbytes), 1
    try:
        ms = classify_file(tf)
    except ModelFileError as exc:
        return _replace(base, quant=_quant(tf), weight_bytes=tf.nbytes,
                        error=_short(exc, p)), 1
    return describe_model_set(base, ms), 1


def _short(exc: ModelFileError, p: Path) -> str:
    return str(exc).removeprefix(f"{p}: ")


def _replace(e: LibraryEntry, **kw: object) -> LibraryEntry:
    return LibraryEntry(**{**asdict(e), **kw})  # type: ignore[arg-type]


def _quant(tf: TensorFile | Iterable[TensorFile]) -> str | None:
    by: Counter[str] = Counter()
    for f in [tf] if isinstance(tf, TensorFile) else tf:
        for t in f.tensors:
            by[t.dtype] += t.nbytes
    return by.most_common(1)[0][0] if by else None


def describe_model_set(base: LibraryEntry, ms: ModelSet) -> LibraryEntry:
    """Fill ``base`` (path, size, mtime) from a classified model set: kind, family,
    quantisation, modules, encoders, latent channels and profile."""
    mods = tuple(ms.modules())
    arch = ms.architecture
    encoders = tuple(ms.encoder_bytes())
    previews = not ms.module_tensors("vae", "main") and ms.module_tensors("vae", "preview")
    if "diffusion" in mods:
        kind = "checkpoint" if ("te" in mods or "vae" in mods) else "diffusion"
    elif mods == ("te",):
        kind = "encoder"
    elif mods == ("vae",):
        kind = "tae" if previews or not _has_conv_in(ms) else "vae"
    elif len(mods) == 1 and mods[0] in KIND_TITLES:
        kind = mods[0]
    else:
        kind = "unknown"
    family = arch.family if kind in DIFFUSION_KINDS else None
    variant = arch.variant if kind in DIFFUSION_KINDS else None
    biggest = max(mods, key=ms.module_bytes, default=None)
    dtypes = ms.dtype_mix(biggest) if biggest else {}
    return _replace(base, kind=kind, family=family, variant=variant,
                    quant=next(iter(dtypes), None),
                    weight_bytes=sum(t.info.nbytes for t in ms.tensors), modules=mods,
                    encoders=encoders, latent_channels=latent_channels(ms),
                    profile=ms.profile().to_json())


def _has_conv_in(ms: ModelSet) -> bool:
    return any(".conv_in." in t.info.name or t.info.name.startswith("conv_in.")
               for t in ms.module_tensors("vae"))


def latent_channels(ms: ModelSet) -> int | None:
    """Latent channels of the main VAE: the input channels of its decoder's first
    convolution (``decoder.conv_in.weight``, shape ``(C_out, latent, 3, 3)``), or None."""
    for t in ms.module_tensors("vae"):
        if t.info.name.endswith("decoder.conv_in.weight") and len(t.info.shape) == 4:
            return int(t.info.shape[1])
    return None


def lora_family(tf: TensorFile) -> str | None:
    """The family a LoRA (or LyCORIS) file adapts, or None when ``tf`` is not one.

    A LoRA has ``lora_up``/``lora_down`` (kohya), ``lora_A``/``lora_B`` (PEFT) or LoHa /
    LoKr factors; its family is the registry's answer from its names and shapes
    (:func:`sdplan.core.families.lora_family`: FLUX.1 block names, SD3 ``joint_blocks``, a
    second text encoder for SDXL, else the cross-attention width 768 / 1024 / 2048), else
    ``unknown``.
    """
    names = [t.name for t in tf.tensors]
    if not names or not any(_LORA_RE.search(n) for n in names):
        return None
    return registry_lora_family(names, {t.name: tuple(t.shape) for t in tf.tensors})
