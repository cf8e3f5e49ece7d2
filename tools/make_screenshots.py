"""Make the README's screenshots of the model library, the queue and the gallery, rendered
offscreen (the window on real screens, with a window manager, is
``tools/desk_screenshots.py``'s).

Run: ``python tools/make_screenshots.py [--out docs/screenshots] [--jobs 5] [--steps 10]
[--only lora-img2img]``.

- ``library.png``: a folder of sparse full-size files with the real tensor layouts of
  ``../shared/models`` (written to a temporary folder; no weights) and the test fixtures,
  judged for a hardware profile of one 24 GiB GPU and 64 GiB of RAM.
- ``queue.png`` and ``gallery.png``: ``--jobs`` real generations of the bundled demo model on
  this machine's CPU, queued with different captions and seeds; the queue is captured while
  a job runs, the gallery once all are done.
- ``d1-flux-split.png`` and ``cpu-only.png`` (1440x900): FLUX.1-dev Q8_0 split over the
  two GPUs of ``../shared/cases/devices/D1.json``, and planned for a 24 GiB CPU-only machine
  with its text encoders read from disk.
- ``lora-img2img.png`` (1440x900): the demo model with its outline LoRA added from the LoRA
  list, starting from a rendered scene as the init picture, after a real generation on this
  machine's CPU (``--only lora-img2img`` makes this one alone).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
sys.path.insert(0, str(REPO / "tests"))
GIB = 1 << 30

DEVICES = {"devices": [
    {"name": "CUDA0", "description": "NVIDIA GeForce RTX 4090", "type": "gpu",
     "registry": "CUDA", "free": 23 * GIB, "total": 24 * GIB},
    {"name": "CPU", "description": "AMD Ryzen 9 7950X", "type": "cpu", "registry": "CPU",
     "free": 48 * GIB, "total": 64 * GIB}]}
TWO_GPUS = {"devices": [
    {"name": "CUDA0", "description": "NVIDIA GeForce RTX 3060", "type": "gpu",
     "registry": "CUDA", "free": int(11.2 * GIB), "total": 12 * GIB},
    {"name": "CUDA1", "description": "NVIDIA GeForce RTX 3060", "type": "gpu",
     "registry": "CUDA", "free": int(11.5 * GIB), "total": 12 * GIB},
    {"name": "CPU", "description": "AMD Ryzen 7 5800X", "type": "cpu", "registry": "CPU",
     "free": 24 * GIB, "total": 32 * GIB}]}
PROMPTS = ["a red circle on a blue background", "a yellow triangle on a green background",
           "a white square on a black background", "a blue circle on a yellow background",
           "a green triangle on a purple background", "an orange square on a white background"]


def pump(app: object, until: object, timeout_s: float) -> bool:
    """Process events until ``until()`` is true or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not until() and time.monotonic() < deadline:  # type: ignore[operator]
        app.processEvents()  # type: ignore[attr-defined]
        time.sleep(0.05)
    for _ in range(10):
        app.processEvents()  # type: ignore[attr-defined]
    return bool(until())  # type: ignore[operator]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "docs" / "screenshots"))
    ap.add_argument("--jobs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", choices=["lora-img2img"], help="make this screenshot alone")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.only == "lora-img2img":
        return lora_img2img(out, args.steps)

    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication
    from sdplan.app.controller import PlanController
    from sdplan.app.main import open_demo
    from sdplan.app.window import MainWindow, apply_theme
    from sdplan.core.planning.inventory import Inventory
    from sdplan.core.planning.placement import Placement
    from sparse_writer import make_library_folder

    app = QApplication.instance() or QApplication(["sdplan"])
    apply_theme(app, "light")  # type: ignore[arg-type]
    tmp = Path(tempfile.mkdtemp(prefix="sdplan-screenshots-"))
    settings = QSettings(str(tmp / "sdplan.ini"), QSettings.Format.IniFormat)
    ctl = PlanController(Inventory.from_json(DEVICES))
    win = MainWindow(ctl, settings, history_dir=tmp / "history", queue_path=tmp / "queue.json",
                     library_cache=str(tmp / "library-cache.json"))
    win.resize(1440, 900)
    win.show()
    pump(app, lambda: False, 0.3)

    # the library
    layouts = json.loads((SHARED / "models" / "real_size_key_layouts.json").read_text())
    make_library_folder(tmp / "models", layouts, SHARED)
    win.tabs.setCurrentWidget(win.library)
    win.library.add_folder(tmp / "models")
    if not pump(app, lambda: win.library.last_scan is not None
                and not win.library.is_scanning(), 300):
        print("library scan did not finish", file=sys.stderr)
        return 2
    win.library.select(str(tmp / "models/models/diffusion_models/flux1-dev.safetensors"))
    pump(app, lambda: False, 0.3)
    win.grab().save(str(out / "library.png"))
    print(out / "library.png")

    # the queue, running real generations of the demo model on this machine's CPU
    if not open_demo(ctl):
        print("no demo model", file=sys.stderr)
        return 2
    ctl.edit(Placement.from_strings("CPU"), "CPU")
    ctl.undo_stack.clear()
    ctl.planChanged.emit("load")  # the panel takes the demo's size and sampling
    # the queue beside the library (the library tab stays open)
    win.side.setCurrentWidget(win.queue_panel)
    g = win.generation
    g.steps.setValue(args.steps)
    assert (g.width_box.value(), g.height_box.value()) == (128, 128)
    for i in range(args.jobs):
        g.prompt.setPlainText(PROMPTS[i % len(PROMPTS)])
        g.seed.setValue(100 + i)
        win.queue_panel.add_current()
    q = win.runner.queue
    target = min(2, args.jobs - 1)
    ok = pump(app, lambda: q.counts()["done"] >= target and q.running() is not None
              and q.running().steps_done >= max(args.steps // 3, 1), 1800)
    if not ok:
        print(f"queue did not progress: {q.counts()}", file=sys.stderr)
        return 2
    win.queue_panel.list.setCurrentRow(target)
    win.queue_panel._totals()
    win.grab().save(str(out / "queue.png"))
    print(out / "queue.png")
    if not pump(app, lambda: q.counts()["queued"] == 0 and q.running() is None, 3600):
        print(f"queue did not finish: {q.counts()}", file=sys.stderr)
        return 2

    # the gallery
    win.tabs.setCurrentWidget(win.gallery)
    win.gallery.reload()
    win.gallery.select_path(str(q.jobs[1].results[0]))
    pump(app, lambda: len(win.gallery.model.decoded) >= args.jobs, 20)
    win.grab().save(str(out / "gallery.png"))
    print(out / "gallery.png")
    win.close()

    cpu = tmp / "cpu-only.json"
    cpu.write_text(json.dumps({"devices": [{"name": "CPU", "description": "CPU", "type": "cpu",
                                            "registry": "CPU", "free": 20 * GIB,
                                            "total": 24 * GIB}]}))
    big = [sys.executable, "-m", "sdplan.core.cli", "gui", "--model-profile", "flux1-dev-q8_0"]
    for name, extra in (("d1-flux-split.png",
                         ["--devices", str(SHARED / "cases" / "devices" / "D1.json"),
                          "--backend", "CUDA0,diffusion=CUDA0&CUDA1"]),
                        ("cpu-only.png", ["--devices", str(cpu), "--backend", "CPU",
                                          "--params-backend", "te=disk"])):
        subprocess.run([*big, "--screenshot", str(out / name), *extra], check=True)
        print(out / name)
    return 0


def lora_img2img(out: Path, steps: int) -> int:
    """``lora-img2img.png``: the demo model, its outline LoRA added from the list, a rendered
    scene as the init picture (strength 0.7), the finished generation on screen."""
    from PIL import Image
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication
    from sdplan.app.controller import PlanController
    from sdplan.app.main import open_demo
    from sdplan.app.window import MainWindow, apply_theme
    from sdplan.core.pipelines.demo.scenes import Scene, render
    from sdplan.core.planning.inventory import Inventory
    from sdplan.core.planning.placement import Placement

    app = QApplication.instance() or QApplication(["sdplan"])
    apply_theme(app, "light")  # type: ignore[arg-type]
    tmp = Path(tempfile.mkdtemp(prefix="sdplan-screenshots-"))
    settings = QSettings(str(tmp / "sdplan.ini"), QSettings.Format.IniFormat)
    ctl = PlanController(Inventory.from_json(DEVICES))
    win = MainWindow(ctl, settings, history_dir=tmp / "history", queue_path=tmp / "queue.json",
                     library_cache=str(tmp / "library-cache.json"))
    win.resize(1440, 900)
    win.show()
    if not open_demo(ctl):
        print("no demo model", file=sys.stderr)
        return 2
    ctl.edit(Placement.from_strings("CPU"), "CPU")
    ctl.undo_stack.clear()
    ctl.planChanged.emit("load")
    g = win.generation
    pump(app, lambda: g.inputs.table.rowCount() > 0, 10)
    g.steps.setValue(steps)
    g.seed.setValue(46)
    g.prompt.setPlainText("a white square on a purple background")
    g.inputs.add(0)  # the outline LoRA's tag into the prompt
    pic = tmp / "start-scene.png"
    Image.fromarray(render(Scene("square", "white", "purple", 64, 64, 30), 128)).save(pic)
    g.inputs.init_slot.choose(str(pic))
    g.inputs.strength.setValue(0.7)
    g.request_extra = {"threads": 2}
    if not g.generate() or not pump(app, lambda: not g.is_running(), 1800):
        print("the generation did not finish", file=sys.stderr)
        return 2
    pump(app, lambda: False, 0.5)
    win.grab().save(str(out / "lora-img2img.png"))
    print(out / "lora-img2img.png")
    g.shutdown()
    win.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
