"""Where a text encoder's time goes, op by op: the language model of a safetensors file (as
FLUX.2 klein runs Qwen3-4B: the states after blocks 9, 18 and 27, the prompt padded to 512
tokens with the padding masked) cut to its first ``--blocks`` blocks and its embedding table to
4096 rows, written beside in the file's own dtypes (bf16 stays bf16), run once through
``ModuleRunner`` as the pipeline runs it (the CPU bf16 rule of ``LLMEncoder``), then profiled
with ``Graph.profile`` (each node timed in turn; slower than a plain run, so the shares are what
it is for). Prints the runner's bf16 choice, the dtypes held, the plain run's seconds (best of
``--repeat``), and the per-op seconds and shares with their source dtypes (``CUSTOM`` with
``f32,bf16`` sources is sdplan's bf16 product, with four f32 sources its CPU attention op).

Usage: ``python bench/bench_llm_profile.py FILE [--blocks 2] [--tokens 512] [--real 72]
[--threads 1] [--repeat 2]`` (FILE e.g. ``/tmp/sdplan-real-size/flux2_klein/qwen_3_4b.safetensors``
from ``bench_real_size.py --keep``). Prints the load average; asserts nothing.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

EMBED_ROWS = 4096


def cut_file(src: Path, dst: Path, blocks: int) -> None:
    """``src`` (safetensors) with only blocks ``0..blocks-1`` of ``layers.N.`` and the embedding
    table's first EMBED_ROWS rows, the bytes copied as they are."""
    with open(src, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        out: dict[str, dict] = {}
        blobs: list[bytes] = []
        off = 0
        for name, info in header.items():
            if name == "__metadata__":
                continue
            m = re.search(r"layers\.(\d+)\.", name)
            if m and int(m.group(1)) >= blocks:
                continue
            a, b = info["data_offsets"]
            shape = list(info["shape"])
            if "embed_tokens" in name:
                b = a + (b - a) // shape[0] * EMBED_ROWS
                shape[0] = EMBED_ROWS
            f.seek(base + a)
            blobs.append(f.read(b - a))
            out[name] = {"dtype": info["dtype"], "shape": shape, "data_offsets": [off, off + len(blobs[-1])]}
            off += len(blobs[-1])
    h = json.dumps(out).encode()
    h += b" " * (-len(h) % 8)
    with open(dst, "wb") as g:
        g.write(struct.pack("<Q", len(h)) + h)
        for blob in blobs:
            g.write(blob)


def profile(path: Path, blocks: int, tokens: int, real: int, threads: int, repeat: int) -> None:
    from sdplan.core.models.llm import LLMEncoder
    from sdplan.core.pipelines.stages.flow_dit import shapes as file_shapes
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.native import native
    from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner
    from sdplan.core.runtime.weights import WeightFile

    enc = LLMEncoder.from_weights(file_shapes(path), (blocks,))
    ids = np.zeros((1, tokens), np.int32)
    ids[:, :real] = np.random.default_rng(0).integers(0, EMBED_ROWS, real)
    ins = enc.inputs(ids)
    ins["mask"][:, real:] = -np.inf  # nobody attends to the padding (the klein pipeline's mask)
    with BackendManager(cpu_threads=threads) as m:
        r = ModuleRunner(enc, WeightFile(path), ModulePlacement(("CPU",)), BackendPool(m), n_threads=threads)
        held = sorted({d for n, d in r.wf.dtypes.items() if len(r.wf.infos[n].shape) >= 2})
        print(f"bf16 kernel {native().bf16_kernel()}; runner bf16 {r.bf16}; matrices held {held}; "
              f"{blocks} block(s), {tokens} tokens ({real} real), {threads} thread(s)")
        r.run(ins)
        best = min(_timed(lambda: r.run(ins)) for _ in range(repeat))
        print(f"run: {best:.3f} s ({best / blocks:.3f} s per block)")
        g, _ = r._whole_graph({k: tuple(v.shape) for k, v in ins.items()})
        with r.session():
            g.allocate()
            for k, v in ins.items():
                g.set_input(k, np.ascontiguousarray(v))
            rows = g.profile()
        r.release()
    total = sum(row[4] for row in rows)
    per: dict[tuple[str, str], float] = collections.defaultdict(float)
    count: collections.Counter[tuple[str, str]] = collections.Counter()
    for op, _name, _shape, src, s in rows:
        per[(op, src)] += s
        count[(op, src)] += 1
    print(f"profile: {total:.3f} s over {len(rows)} nodes")
    for (op, src), s in sorted(per.items(), key=lambda kv: -kv[1]):
        if s > 0:
            print(f"  {s:8.3f} s {100 * s / total:5.1f}%  {count[(op, src)]:3d} x {op} ({src})")


def _timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--real", type=int, default=72, help="tokens before the padding")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        cut = Path(tmp) / "llm_cut.safetensors"
        cut_file(Path(a.file), cut, a.blocks)
        profile(cut, a.blocks, a.tokens, a.real, a.threads, a.repeat)
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
