"""GUI re-planning during a drag against a 16 ms frame.

Run: ``QT_QPA_PLATFORM=offscreen python bench/bench_gui_replan.py``. A drag over a device
column re-plans on every move event (resolve + estimate) and the board redraws from the
plan (item model reset, every column's bar, figures and cards rebuilt, then painted). For
a Flux-sized model on D1-like devices and a 16-device inventory it reports the median time
of one drop (board edit -> new plan -> board redrawn and painted) and of its parts, each as
a fraction of the frame.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import _timing

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402
from sdplan.app.board.board import Board  # noqa: E402
from sdplan.app.controller import PlanController  # noqa: E402
from sdplan.core.planning.inventory import Device, Inventory  # noqa: E402
from sdplan.core.planning.plan import resolve  # noqa: E402
from sdplan.core.planning.profile import ModuleProfile, Profile  # noqa: E402

GIB = 1 << 30
FRAME_S = 0.016


def flux() -> Profile:
    return Profile({"diffusion": ModuleProfile((400 << 20,) * 57, 120 << 20),
                    "te": ModuleProfile((360 << 20,) * 24, 700 << 20,
                                        {"clip_l": 240 << 20, "t5xxl": 9 * GIB}, "t5xxl"),
                    "vae": ModuleProfile((), 160 << 20)}, "flux", "flux-dev")


def inventories() -> dict[str, Inventory]:
    d1 = Inventory((Device("CUDA0", "RTX 4090", "gpu", "CUDA", 22 * GIB, 24 * GIB),
                    Device("CUDA1", "RTX 3060", "gpu", "CUDA", 11 * GIB, 12 * GIB),
                    Device("CPU", "CPU", "cpu", "CPU", 48 * GIB, 64 * GIB)))
    many = Inventory(tuple(Device(f"CUDA{i}", f"GPU {i}", "gpu", "CUDA", (8 + i) * GIB, 24 * GIB)
                           for i in range(15)) + (Device("CPU", "CPU", "cpu", "CPU", 64 * GIB,
                                                         128 * GIB),))
    return {"D1 (3 devices)": d1, "16 devices": many}


def median_s(fn: Callable[[], object], repeat: int = 60) -> float:
    return _timing.median_s(fn, repeat, warmup=5)


def run_case(app: QApplication, label: str, inv: Inventory) -> None:
    """Time the drop path and its parts for one inventory."""
    ctl = PlanController(inv, flux())
    board = Board(ctl)
    board.resize(1400, 700)
    board.show()
    app.processEvents()
    names = [d.name for d in inv if d.is_gpu_like]
    model = board.model
    state = {"i": 0}

    def drag_step() -> None:  # one move event of a Ctrl-drag + the repaint
        state["i"] += 1
        target = names[state["i"] % len(names)]
        mime = model.mimeData([model.card_index(ctl.plan.modules["vae"].devices[0], "vae")])
        model.dropMimeData(mime, Qt.DropAction.MoveAction, -1, -1,
                           model.target_index(target))
        board.repaint()

    def replan() -> None:
        resolve(ctl.placement.assign("vae", names[0]), inv, ctl.profile)

    def estimate() -> None:
        ctl._estimate()

    def redraw() -> None:
        board.refresh()
        board.repaint()

    print(f"{label}:")
    for name, fn in (("drop: edit + re-plan + redraw + paint", drag_step),
                     ("re-plan (resolve)", replan), ("estimate", estimate),
                     ("board redraw + paint", redraw)):
        t = median_s(fn)
        print(f"  {name:40s} {t * 1e3:7.2f} ms = {t / FRAME_S:5.2f} frame")
    board.close()



def main() -> None:
    app = QApplication.instance() or QApplication([])
    assert isinstance(app, QApplication)
    print(f"reference: one frame = {FRAME_S * 1e3:.0f} ms")
    for label, inv in inventories().items():
        run_case(app, label, inv)


if __name__ == "__main__":
    main()
