"""Which CPU bf16 kernel each DiT and text encoder should hold its 16-bit weights for: one call
of the module at its real width, sdplan's bf16 kernels (AMX, AVX512_BF16) against the f16 path,
as ratios.

Each family's module is built from the tensor names and shapes of the real checkpoint
(``../shared/models/real_size_key_layouts.json``), cut to its first block(s) (``--blocks``;
every block of one family has the same shapes, so a call's time per block is the model's)
with the embedding tables cut to 4096 rows (a lookup's time does not depend on them): random
f16 matrices and f32 vectors, as a downloaded f16 file has them. Per family and kernel a
process (``SDPLAN_BF16_KERNEL`` = ``amx``, ``avx512`` or ``off``) runs the module as a model
class listing that kernel in ``cpu_bf16_kernels`` is run (bf16 products: with AMX the weights
converted to bf16 as they load, with AVX512_BF16 kept f16 and rounded by the kernel; ``off``:
f16 products) and times one call (DiTs: a 256x256 image, 256 image
tokens and ``--txt`` text tokens, no flash attention as sd-cli's default; encoders: ``--tokens``
tokens), best of ``--repeat`` after one warm-up. Rounds interleave the kernels; medians over
``--rounds``. The load average is printed before and after.

Usage: ``python bench/bench_cpu_bf16_families.py [--threads 2] [--rounds 3] [--repeat 2]
[--families flux,flux2,z_image,sd3,qwen3,t5] [--layouts PATH]``. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _timing
import numpy as np
from dit_cut import EMBED_ROWS, cut_layout

REPO = Path(__file__).resolve().parent.parent
LAYOUTS = REPO.parent / "shared" / "models" / "real_size_key_layouts.json"

#: family -> (layout key, model class path, what it is)
FAMILIES: dict[str, tuple[str, str, str]] = {
    "flux": ("flux1_dev_bfl", "sdplan.core.models.flux:FluxDiT", "FLUX.1-dev DiT (also Chroma's blocks)"),
    "flux2": ("flux2_klein_4b", "sdplan.core.models.flux2:Flux2DiT", "FLUX.2 klein 4B DiT"),
    "z_image": ("z_image_turbo", "sdplan.core.models.z_image:ZImageDiT", "Z-Image Turbo DiT"),
    "sd3": ("sd3_medium_sai", "sdplan.core.models.mmdit:MMDiT", "SD3-medium MMDiT"),
    "qwen3": ("qwen3_4b_hf", "sdplan.core.models.llm:LLMEncoder", "Qwen3-4B text encoder"),
    "t5": ("t5xxl_hf", "sdplan.core.models.t5:T5Encoder", "T5-XXL encoder"),
}


def write_random(path: Path, shapes: dict[str, tuple[int, ...]], seed: int = 0) -> None:
    """A safetensors file of random weights with these shapes: f16 matrices (scaled by
    1/sqrt(fan-in)), f32 vectors."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape in shapes.items():
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[1:]))
            a = rng.standard_normal(shape, dtype=np.float32) / np.sqrt(fan_in)
            tensors[name] = a.astype(np.float16)
        else:
            tensors[name] = (1.0 + 0.01 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    save_file(tensors, str(path))


def module_and_inputs(family: str, shapes: dict[str, tuple[int, ...]], txt: int, tokens: int) -> tuple[Any, dict]:
    """The family's model graph for these shapes and the inputs of one call."""
    import importlib

    rng = np.random.default_rng(1)
    mod_path, cls_name = FAMILIES[family][1].split(":")
    cls = getattr(importlib.import_module(mod_path), cls_name)
    model = cls.from_weights(shapes)
    c = model.cfg
    if family in ("qwen3", "t5"):
        return model, model.inputs(rng.integers(0, EMBED_ROWS, (1, tokens)))
    if family == "flux2":
        lat = rng.standard_normal((1, c.in_channels, 16, 16)).astype(np.float32)
        return model, model.inputs(lat, rng.standard_normal((1, txt, c.context)).astype(np.float32), 0.5)
    lat = rng.standard_normal((1, 16, 32, 32)).astype(np.float32)  # 256x256 pixels: 256 patches of 2x2
    ctx = rng.standard_normal((1, txt, c.context)).astype(np.float32)
    if family == "z_image":
        return model, model.inputs(lat, ctx, 0.5)
    pooled = rng.standard_normal((1, c.pooled)).astype(np.float32)
    if family == "sd3":
        return model, model.inputs(lat, ctx, pooled, 0.5)
    return model, model.inputs(lat, ctx, pooled, 0.5, 3.5)


def worker(family: str, path: str, threads: int, repeat: int, txt: int, tokens: int) -> dict[str, float]:
    """One call of ``family``'s module from ``path`` under this process's bf16 kernel."""
    from sdplan.core.pipelines.stages.flow_dit import shapes as file_shapes
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.native import native
    from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner
    from sdplan.core.runtime.weights import WeightFile

    model, ins = module_and_inputs(family, file_shapes(path), txt, tokens)
    kernel = str(native().bf16_kernel())
    # hold the weights as a model class listing this kernel does (off: as in the file)
    type(model).cpu_bf16_kernels = (kernel,) if kernel != "off" else ()
    with BackendManager(cpu_threads=threads) as m:
        r = ModuleRunner(model, WeightFile(path), ModulePlacement(("CPU",)), BackendPool(m), n_threads=threads)
        t = _timing.best(lambda: r.run(ins), repeat, warmup=1)
        held = sorted({d for n, d in r.wf.dtypes.items() if len(r.wf.infos[n].shape) >= 2})
        r.release()
    return {"s": t, "kernel": kernel, "held": ",".join(held)}  # type: ignore[dict-item]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=1)
    ap.add_argument("--txt", type=int, default=128, help="DiT text tokens")
    ap.add_argument("--tokens", type=int, default=128, help="encoder prompt tokens")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--kernels", default="amx,avx512,off")
    ap.add_argument("--layouts", default=str(LAYOUTS))
    ap.add_argument("--worker", nargs=2, metavar=("FAMILY", "FILE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], a.worker[1], a.threads, a.repeat, a.txt, a.tokens)))
        return 0
    layouts = json.loads(Path(a.layouts).read_text())
    families = a.families.split(",")
    kernels = a.kernels.split(",")
    print(f"load average before: {os.getloadavg()}; threads {a.threads}")
    res: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fam in families:
            path = Path(tmp) / f"{fam}.safetensors"
            write_random(path, cut_layout(layouts[FAMILIES[fam][0]], a.blocks))
            for rnd in range(a.rounds):
                for k in kernels if rnd % 2 == 0 else kernels[::-1]:
                    cmd = [sys.executable, __file__, "--worker", fam, str(path), "--threads", str(a.threads),
                           "--repeat", str(a.repeat), "--txt", str(a.txt), "--tokens", str(a.tokens)]
                    p = subprocess.run(cmd, env=dict(os.environ, SDPLAN_BF16_KERNEL=k), capture_output=True,
                                       text=True)
                    if p.returncode != 0:
                        print(f"  {fam} {k}: failed: {p.stderr.strip().splitlines()[-1:]}")
                        continue
                    out = json.loads(p.stdout.strip().splitlines()[-1])
                    res.setdefault((fam, k), []).append(out["s"])
                    print(f"  round {rnd + 1} {fam:8s} {k:7s} {out['s']:.3f} s (weights {out['held']})", flush=True)
            path.unlink()
    print(f"load average after: {os.getloadavg()}")
    print(f"\nmedian seconds of one call ({a.blocks} block(s) per stack), ratio to the f16 path (off)")
    print(f"{'family':34s}" + "".join(f"{k:>18s}" for k in kernels))
    for fam in families:
        base = statistics.median(res[(fam, "off")]) if res.get((fam, "off")) else None
        cells = []
        for k in kernels:
            v = res.get((fam, k))
            if not v:
                cells.append(f"{'-':>18s}")
                continue
            m = statistics.median(v)
            cells.append(f"{m:9.3f} ({m / base:5.2f}x)" if base else f"{m:9.3f}        ")
        print(f"{FAMILIES[fam][2]:34s}" + "".join(f"{c:>18s}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
