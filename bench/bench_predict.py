"""Predicted against measured seconds per step and per picture, for placements on this machine.

For each model (the demo at 128 px, an SD 1.5-size checkpoint of random fp16 weights at
256 px) and each placement below, one worker process (RPC clients live in their own
process: ggml aborts a client whose server goes) calibrates every device once
(:func:`sdplan.core.runtime.calibrate.calibrate_device`; the drive of the model files too),
predicts the plan's time (:func:`sdplan.core.planning.timing.predict_time` with the work of
the engine's graphs, :mod:`sdplan.core.pipelines.work`), then generates ``--repeat + 1``
pictures with the same pipeline and placements, the placements in interleaved rounds (a
change in the machine's load hits them alike): the first round loads, the others are timed;
every device is calibrated again afterwards, and the prediction is the mean of the two
calibrations' (on a shared machine a device's speed drifts over the minutes of a run).

- ``step``: the median of the intervals between sampler steps (the first step of each
  picture left out) against the predicted step;
- ``picture``: the median wall time of a picture after the first (text encoding, sampling,
  decoding, and the weights each use stages) against the predicted picture without the
  load; text encoding and decoding are printed beside it (not targeted).

Placements (sd-cli's flags): ``cpu``; ``disk`` (the diffusion model's weights read per use);
``staged`` (the diffusion model on RPC0, its weights kept in RAM and staged per use);
``rpc`` (every module on RPC0); ``throttled`` (every module on RPC2, a server behind
``tests/rpc_throttle.py`` at 100 MB/s and 1 ms each way); ``cpu+rpc`` (text encoder and
VAE on the CPU, the diffusion model on RPC0); ``two-rpc`` (the text encoder layer-split
over RPC0 and RPC1, the UNet on RPC1, the VAE on RPC0); ``cfg`` (as ``cpu+rpc`` with
parallel CFG: the unconditional half on RPC1 at the same time, ``--backend ...,cfg=RPC1``:
its step against ``cpu+rpc``'s is the parallel against the sequential); ``split-vram`` and
``split-auto`` (the text encoder listed over the throttled RPC2 and RPC0, ``--split-ratio
vram`` filling RPC2 first, ``auto`` placing the blocks by the devices' measured cost). Three
``sdplan rpc-server`` processes, one thread each. Target: every ratio in 0.75-1.33.

Usage: ``python bench/bench_predict.py [--threads 1] [--repeat 2] [--steps 4] [--size demo|sd15|both]
[--only cpu,rpc,...]``. The SD 1.5-size checkpoint (about 2 GB) is written to a temporary
folder and removed afterwards. The load average before and after is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))

DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"
PROMPT = "a red circle on a blue background"

#: name -> sd-cli placement arguments.
PLACEMENTS = {
    "cpu": ["--backend", "CPU"],
    "disk": ["--backend", "CPU", "--params-backend", "diffusion=disk"],
    "staged": ["--backend", "te=CPU,diffusion=RPC0,vae=CPU", "--params-backend", "diffusion=CPU"],
    "rpc": ["--backend", "RPC0"],
    "throttled": ["--backend", "RPC2"],
    "cpu+rpc": ["--backend", "te=CPU,diffusion=RPC0,vae=CPU"],
    "two-rpc": ["--backend", "te=RPC0&RPC1,diffusion=RPC1,vae=RPC0"],
    "cfg": ["--backend", "te=CPU,diffusion=RPC0,cfg=RPC1,vae=CPU"],
    "split-vram": ["--backend", "te=RPC2&RPC0,diffusion=CPU,vae=CPU", "--split-ratio", "vram"],
    "split-auto": ["--backend", "te=RPC2&RPC0,diffusion=CPU,vae=CPU", "--split-ratio", "auto"],
}


def worker(cfg: dict) -> dict:
    """In the worker process: calibrate every device, predict each placement, then measure
    the placements in interleaved rounds (one picture each per round: the first round
    loads), and calibrate again; the prediction is the mean of the two calibrations'."""
    from dataclasses import replace

    from sdplan.core.modelfiles.checkpoint import read_model_files
    from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion
    from sdplan.core.pipelines.work import count_work, plan_placements
    from sdplan.core.planning.inventory import Inventory
    from sdplan.core.planning.plan import resolve
    from sdplan.core.planning.timing import RunSettings, drive_of_files, predict_time
    from sdplan.core.runtime.calibrate import calibrate_device, calibrate_drive
    from sdplan.core.runtime.devices import BackendManager, add_rpc_servers, live_inventory
    from sdplan.core.runtime.runner import BackendPool

    add_rpc_servers(cfg["rpc"])
    threads = cfg["threads"]
    manager = BackendManager(cpu_threads=threads)
    pool = BackendPool(manager)
    live = live_inventory()
    files = {"model": [cfg["model"]]}
    models = read_model_files(files)
    profile = models.profile()
    size, steps = cfg["size"], cfg["steps"]
    settings = RunSettings(size, size, 1, steps, "euler", True, threads)
    paths = {m: [os.path.abspath(p) for p in ps] for m, ps in drive_of_files(files).items()}
    names = cfg["placements"]

    def calibrated() -> Inventory:
        profiles = {d.name: calibrate_device(manager, d.name, threads) for d in live}
        drive = calibrate_drive(Path(cfg["model"]).parent)
        return Inventory(tuple(replace(d, profile=profiles[d.name]) for d in live), (drive,))

    t0 = time.time()
    inventories = [calibrated()]
    calibration_s = time.time() - t0
    plans = {n: resolve(PLACEMENTS[n], inventories[0], profile) for n in names}  # auto: by the measured speeds
    placements = {n: plan_placements(plans[n]) for n in names}
    works = {n: count_work(files, width=size, height=size, pool=pool, placements=placements[n]) for n in names}
    p = GenerateParams(PROMPT, "", size, size, steps, 5.0, 1, "euler", "discrete", 1, 0)
    pipes = {}
    gaps: dict[str, list[float]] = {n: [] for n in names}
    phases: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    pictures: dict[str, list[float]] = {n: [] for n in names}
    first: dict[str, float] = {}
    for r in range(cfg["repeat"] + 1):
        for n in names:
            t_load = time.perf_counter()
            if n not in pipes:
                pipes[n] = StableDiffusion(models, None, pool, placements=placements[n])
            last = [time.perf_counter()]
            mine: list[float] = []

            def on_step(i: int, k: int, x: object, last: list = last, mine: list = mine) -> None:
                now = time.perf_counter()
                mine.append(now - last[0])
                last[0] = now

            t = time.perf_counter()
            pipes[n].txt2img(p, on_step=on_step)
            took = time.perf_counter() - t
            if r == 0:
                first[n] = time.perf_counter() - t_load
            else:
                pictures[n].append(took)
                gaps[n] += mine[1:]
                phases[n].append((pipes[n].timings["text_encode"], pipes[n].timings["decode"]))
    for pipe in pipes.values():
        pipe.close()
    inventories.append(calibrated())
    rows = []
    for n in names:
        preds = [predict_time(plans[n], inv, profile, settings, works[n], paths) for inv in inventories]
        warm = statistics.median(pictures[n])
        row = {"placement": n, "step": statistics.median(gaps[n]), "picture": warm, "load": first[n] - warm,
               "pred_step": statistics.mean(x.step_s for x in preds),
               "pred_picture": statistics.mean(x.image_s - x.load_s for x in preds),
               "pred_load": statistics.mean(x.load_s for x in preds),
               "pred_steps": [x.step_s for x in preds], "pred_texts": [x.text_s for x in preds],
               "pred_pictures": [x.image_s - x.load_s for x in preds], "notes": list(preds[0].notes),
               "text": statistics.median(t for t, _ in phases[n]), "decode": statistics.median(d for _, d in phases[n]),
               "pred_text": statistics.mean(x.text_s for x in preds),
               "pred_decode": statistics.mean(x.decode_s for x in preds),
               "te_ranges": [[r.device, r.first_block, r.last_block] for r in plans[n].modules["te"].ranges],
               "diffusion_call": [{k: round(v, 5) for t in x.modules.get("diffusion", ()) for k, v in t.call_s.items()}
                                  for x in preds]}
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    manager.close()
    return {"calibration_s": calibration_s, "rows": rows,
            "profiles": [{d.name: d.profile.to_json() for d in inv if d.profile} for inv in inventories]}


def run_model(model: Path, size: int, a: argparse.Namespace, rpc: list[str]) -> dict:
    cfg = {"model": str(model), "size": size, "steps": a.steps, "repeat": a.repeat, "threads": a.threads,
           "rpc": rpc, "placements": a.only}
    with tempfile.TemporaryDirectory(prefix="sdplan-cache-") as cache:
        env = {**os.environ, "XDG_CACHE_HOME": cache}
        done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(cfg)], capture_output=True,
                              text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"worker failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    if a.verbose:
        print(done.stderr, file=sys.stderr)
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(title: str, res: dict) -> None:
    print(f"\n{title} (calibration {res['calibration_s']:.1f} s)")
    print("| placement | step s (pred / meas) | ratio | picture s (pred / meas) | ratio "
          "| text s (pred / meas) | decode s (pred / meas) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in res["rows"]:
        print(f"| {r['placement']} | {r['pred_step']:.3f} / {r['step']:.3f} | {r['pred_step'] / r['step']:.2f} | "
              f"{r['pred_picture']:.3f} / {r['picture']:.3f} | {r['pred_picture'] / r['picture']:.2f} | "
              f"{r['pred_text']:.3f} / {r['text']:.3f} | {r['pred_decode']:.3f} / {r['decode']:.3f} |")
    rows = {r["placement"]: r for r in res["rows"]}
    pairs = (("cfg", "cpu+rpc", "step", "parallel CFG (RPC0 + RPC1) against sequential (RPC0)"),
             ("split-auto", "split-vram", "picture", "--split-ratio auto against vram (te over RPC2 & RPC0)"))
    for a, b, key, what in pairs:
        if a in rows and b in rows:
            ra, rb = rows[a], rows[b]
            print(f"{what}: {key} measured {ra[key]:.3f} / {rb[key]:.3f} s ({ra[key] / rb[key]:.2f}x), "
                  f"predicted {ra['pred_' + key]:.3f} / {rb['pred_' + key]:.3f} s "
                  f"({ra['pred_' + key] / rb['pred_' + key]:.2f}x); te ranges {ra['te_ranges']} / {rb['te_ranges']}")


def parser() -> argparse.ArgumentParser:
    """The command line: every flag with what it does, its unit and its default."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # the worker process's settings (JSON)
    ap.add_argument("--threads", type=int, default=1, metavar="N",
                    help="CPU threads the worker computes and calibrates with (the three RPC servers run one "
                         "thread each; default: %(default)s)")
    ap.add_argument("--repeat", type=int, default=2, metavar="N",
                    help="timed pictures per placement, after one untimed first picture that loads the weights "
                         "(default: %(default)s)")
    ap.add_argument("--steps", type=int, default=4, metavar="N",
                    help="sampler steps per picture (default: %(default)s)")
    ap.add_argument("--size", choices=("demo", "sd15", "both"), default="both",
                    help="the model: demo (the demo model at 128 px), sd15 (an SD 1.5-size checkpoint of random "
                         "fp16 weights at 256 px, about 2 GB written to a temporary folder) or both "
                         "(default: %(default)s)")
    ap.add_argument("--only", default=",".join(PLACEMENTS), metavar="NAME,...",
                    help=f"comma-separated placements to run, of {', '.join(PLACEMENTS)} (default: all of them)")
    ap.add_argument("--shared", default=str(REPO.parent / "shared"), metavar="FOLDER",
                    help="the shared inputs folder; the SD 1.5-size checkpoint takes its tensor names and shapes "
                         "from models/real_size_key_layouts.json there (default: %(default)s)")
    ap.add_argument("--verbose", action="store_true",
                    help="also print each placement's details: one JSON line per row on stderr (both "
                         "calibrations' predictions, text encoding and decoding, the text encoder's block "
                         "ranges; default: off)")
    return ap


def check_flags(a: argparse.Namespace) -> None:
    """Refuse, before the RPC servers start, what would fail or run nothing only after the
    calibration: an unknown or empty ``--only``, a thread, repeat or step count below 1, and
    with ``--size sd15``/``both`` a ``--shared`` folder without the layouts file.

    Raises:
        SystemExit: one line naming the flag and the value at fault.
    """
    only = [p for p in a.only.split(",") if p]
    unknown = [p for p in only if p not in PLACEMENTS]
    if unknown or not only:
        raise SystemExit(f"--only {a.only!r}: unknown placements {unknown or '(none given)'}; "
                         f"choose from {', '.join(PLACEMENTS)}")
    for flag, value in (("--threads", a.threads), ("--repeat", a.repeat), ("--steps", a.steps)):
        if value < 1:
            raise SystemExit(f"{flag} must be at least 1, got {value}")
    layouts = Path(a.shared) / "models" / "real_size_key_layouts.json"
    if a.size in ("sd15", "both") and not layouts.is_file():
        raise SystemExit(f"--shared {a.shared!r}: no {layouts.relative_to(a.shared)} there "
                         "(the SD 1.5-size checkpoint's layout); give the folder, or --size demo")


def main() -> int:
    ap = parser()
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(json.loads(a.worker))))
        return 0
    check_flags(a)
    a.only = [p for p in a.only.split(",") if p]
    from rpc_throttle import Throttle
    from rpc_util import rpc_servers

    print(f"load average before: {os.getloadavg()}")
    with rpc_servers(3, threads=1) as servers, Throttle(("127.0.0.1", servers[2].port), 100, 1) as link:
        rpc = [servers[0].endpoint, servers[1].endpoint, link.endpoint]
        if a.size in ("demo", "both"):
            table(f"demo, 128 px, {a.steps} steps, {a.threads} thread(s)", run_model(DEMO, 128, a, rpc))
        if a.size in ("sd15", "both"):
            from bench_sd import write_sd15_checkpoint

            with tempfile.TemporaryDirectory(prefix="sdplan-sd15-") as d:
                path = Path(d) / "sd15_random.safetensors"
                write_sd15_checkpoint(path, Path(a.shared))
                table(f"SD 1.5-size random weights, 256 px, {a.steps} steps, {a.threads} thread(s)",
                      run_model(path, 256, a, rpc))
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
