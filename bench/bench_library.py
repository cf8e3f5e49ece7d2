"""Model library scan of a 200-file folder: the first scan (every header read) against a
cached one (no header read), and the fit verdicts of every diffusion model.

Run: ``python bench/bench_library.py [--files N] [--repeat N]``. The folder is made of
sparse full-size files with the real tensor layouts of ``../shared/models``
(``real_size_key_layouts.json``: Flux, SD3, SDXL, SD 1.5, Z-Image, FLUX.2, T5-XXL, CLIP,
Qwen3, VAEs), cycled under distinct names, in a temporary folder. Reported: the first scan
(a fresh cache each run; the median of ``repeat`` runs), the cached scan (a new cache object
reading the cache file, as the app's next start does; median), their ratio, the headers
each read, and the verdicts' time for all diffusion models on a 24 GiB GPU. Files written
just before are in the OS page cache, so the first scan measures header parsing, not disk.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from sdplan.core.modelfiles.library import LibraryCache, scan_library  # noqa: E402
from sdplan.core.modelfiles.library_fit import fit_verdict  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sparse_writer import library_layouts, write_sparse  # noqa: E402

LAYOUTS = REPO.parent / "shared" / "models" / "real_size_key_layouts.json"
GIB = 1 << 30


def make_folder(root: Path, n: int) -> None:
    """``n`` sparse files cycling through the library test folder's layouts."""
    specs = list(library_layouts(json.loads(LAYOUTS.read_text())).items())
    for i in range(n):
        rel, (shapes, dtype, prefix, _) = specs[i % len(specs)]
        path = root / f"set{i // len(specs):02d}" / rel
        write_sparse(path.with_name(f"{path.stem}-{i:03d}{path.suffix}"), shapes, dtype, prefix)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not LAYOUTS.is_file():
        print(f"needs {LAYOUTS}", file=sys.stderr)
        return 2
    inv = Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 23 * GIB, 24 * GIB),
                     Device("CPU", "CPU", "cpu", "CPU", 48 * GIB, 64 * GIB)))
    with tempfile.TemporaryDirectory(prefix="sdplan-bench-library-") as tmp:
        root = Path(tmp) / "models"
        make_folder(root, args.files)
        cache_file = Path(tmp) / "cache.json"
        first, cached = [], []
        reads = (0, 0)
        for _ in range(args.repeat):
            cache_file.unlink(missing_ok=True)
            t0 = time.perf_counter()
            r1 = scan_library([root], LibraryCache(cache_file))
            first.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            r2 = scan_library([root], LibraryCache(cache_file))
            cached.append(time.perf_counter() - t0)
            reads = (r1.headers_read, r2.headers_read)
        entries = r2.entries
        models = [e for e in entries if e.kind in ("checkpoint", "diffusion") and not e.error]
        t0 = time.perf_counter()
        for e in models:
            fit_verdict(e, entries, inv)
        verdict_s = time.perf_counter() - t0
    f, c = statistics.median(first), statistics.median(cached)
    print(f"library of {len(entries)} files ({len(models)} diffusion models), "
          f"cache {cache_file.name}")
    print(f"  first scan : {f:7.3f} s  ({reads[0]} headers read)")
    print(f"  cached scan: {c:7.3f} s  ({reads[1]} headers read)")
    print(f"  first / cached: {f / c:6.1f}x")
    print(f"  fit verdicts of {len(models)} models: {verdict_s:.3f} s "
          f"({verdict_s / max(len(models), 1) * 1000:.1f} ms each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
