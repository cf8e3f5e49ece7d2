"""The memory estimate against the peak sdplan's engine really allocates, in one script.

For the demo model and an SD 1.5-size model (random weights: the real tensor names and
shapes from ``../shared/models``, F16, data left sparse) at 256, 512 and 1024 px, this
prints, on the CPU:

- ``estimate``: what ``sdplan generate`` plans for the run (weights plus compute measured
  by a dry-run reserve of the engine's graphs, :mod:`sdplan.core.pipelines.compute`);
- ``fitted``: the estimate from a profile alone (``sdplan plan --model-profile``: the
  per-pixel figures of :mod:`sdplan.core.planning.engine_compute`; fitted for SD 1.x/2.x at
  real size, so it is meant for the SD 1.5-size rows);
- ``sd-cli``: the formula for sd-cli's own path (no ``--diffusion-fa``), for comparison;
- ``measured``: the engine's peak over a real generation (text encoder, one UNet step with
  CFG, VAE decode): per module, its own peak (weights, staging, compute buffers as
  allocated) plus the weights of the modules that ran before it and stay resident;
- ``rss+``: growth of the process's peak RSS over the run (ggml's CPU work buffers, numpy
  arrays and allocator slack included), for reference;

and the ratio estimate / measured (target: within 10%).

Usage: ``python bench/bench_estimate.py [--sizes 256,512,1024] [--models demo,sd15]
[--threads 2]``. The SD 1.5 rows at 1024 px run a full-size UNet step and VAE decode on
the CPU: minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
MIB = 1 << 20


def write_sd15(path: Path) -> Path:
    """A header-only SD 1.5 single file (F16, sparse data region) from the shared layouts."""
    layouts = json.loads((SHARED / "models/real_size_key_layouts.json").read_text())
    shapes = {**layouts["sd15_unet_ldm"], **layouts["sd_vae_ldm"]}
    shapes |= {"cond_stage_model.transformer.text_model." + n: s
               for n, s in layouts["clip_l_hf"].items()}
    header, off = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape) * 2
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        fh.seek(off - 1, 1)
        fh.write(b"\0")
    return path


def estimates(model: Path, width: int, height: int) -> dict[str, int]:
    """Planned CPU totals (bytes): with the dry run, fitted figures alone, sd-cli's formula."""
    from sdplan.core.modelfiles.checkpoint import profile_from_model_flags
    from sdplan.core.pipelines.compute import measure_compute
    from sdplan.core.planning.estimate import estimate_plan
    from sdplan.core.planning.inventory import Device, Inventory
    from sdplan.core.planning.plan import resolve

    files = {"model": [str(model)]}
    inv = Inventory((Device("CPU", "host", "cpu", "CPU", 64 << 30, 64 << 30),))
    prof = profile_from_model_flags(files)
    plan = resolve(["--backend", "CPU"], inv, prof)
    measured = measure_compute(files, width=width, height=height)
    out = {}
    for key, kw in (("estimate", {"engine": "sdplan", "measured": measured}),
                    ("fitted", {"engine": "sdplan"}), ("sd-cli", {"engine": "sd-cli"})):
        fit = estimate_plan(plan, prof, inv, width=width, height=height, **kw)  # type: ignore[arg-type]
        out[key] = fit.devices["CPU"].total
    return out


def measured_peak(model: Path, width: int, height: int, threads: int) -> dict[str, float]:
    """The engine's real peak over one generation (1 step, CFG) on the CPU: bytes, and the
    RSS growth, and the seconds it took."""
    from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    with BackendManager(threads) as manager:
        sd = StableDiffusion(str(model), None, BackendPool(manager))
        try:
            sd.txt2img(GenerateParams("a red circle on a blue background", "", width, height,
                                      steps=1, cfg_scale=5.0, sampler="euler"))
            peak = engine_peak(sd, ("te", "diffusion", "vae"))
        finally:
            sd.close()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    return {"measured": peak, "rss": rss, "seconds": time.perf_counter() - t0}


def engine_peak(sd: object, order: tuple[str, ...]) -> int:
    """Peak CPU bytes of a generation whose modules ran in ``order`` with resident weights:
    each module's own peak plus the weights of those before it."""
    runners = sd.runners  # type: ignore[attr-defined]
    peak = before = 0
    for m in order:
        own = runners[m].last_peak.get("CPU")
        if own is not None:
            peak = max(peak, before + own.weights + own.staging + own.compute)
        now = runners[m].memory().get("CPU")
        before += now.weights if now is not None else 0
    return peak


def one(path: Path, px: int, threads: int) -> dict[str, float]:
    """Both sides for one model and size, in a fresh process (its peak RSS is its own)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import bench_estimate as b; "
            "from pathlib import Path; p = Path(sys.argv[2]); px = int(sys.argv[3]); "
            "print(json.dumps({**b.estimates(p, px, px), **b.measured_peak(p, px, px, int(sys.argv[4]))}))")
    res = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(path), str(px),
                          str(threads)], capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="256,512,1024")
    ap.add_argument("--models", default="demo,sd15")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    from sdplan.core.pipelines.demo.model import demo_model_path

    with tempfile.TemporaryDirectory() as tmp:
        models = {"demo": demo_model_path(), "sd15": None}
        print(f"{'model':6} {'px':>5} {'estimate':>9} {'fitted':>8} {'sd-cli':>8} {'measured':>9} "
              f"{'ratio':>6} {'rss+':>7} {'s':>6}   (MiB; ratio = estimate / measured)")
        for name in a.models.split(","):
            path = models[name] if name == "demo" else write_sd15(Path(tmp) / "sd15.safetensors")
            for px in (int(x) for x in a.sizes.split(",")):
                est = got = one(Path(str(path)), px, a.threads)
                ratio = est["estimate"] / got["measured"]
                print(f"{name:6} {px:5d} {est['estimate'] / MIB:9.1f} {est['fitted'] / MIB:8.1f} "
                      f"{est['sd-cli'] / MIB:8.1f} {got['measured'] / MIB:9.1f} {ratio:6.3f} "
                      f"{got['rss'] / MIB:7.1f} {got['seconds']:6.1f}", flush=True)


if __name__ == "__main__":
    main()
