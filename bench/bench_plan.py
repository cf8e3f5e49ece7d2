"""Plan resolution time against a 16 ms frame (the GUI re-plans on every drag event).

Run: ``python bench/bench_plan.py``. Reports, for a 16-device inventory and a long
assignment, the median time of: parsing + resolving the strings, resolving the canonical
placement, one GUI-style edit + re-resolve, and resolving against a fresh inventory object
(cold device index) -- each as a fraction of the frame.
"""

from __future__ import annotations

from collections.abc import Callable

import _timing
from sdplan.core.planning.inventory import Device, Inventory
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.profile import ModuleProfile, Profile

GIB = 1 << 30
FRAME_S = 0.016


def inventory() -> Inventory:
    gpus = [Device(f"CUDA{i}", f"GPU {i}", "gpu", "CUDA", (8 + i) * GIB, 24 * GIB)
            for i in range(13)]
    rpc = [Device(f"RPC{i}", "192.0.2.1:50052", "gpu", "RPC", 10 * GIB, 12 * GIB)
           for i in range(2)]
    return Inventory((*gpus, Device("CPU", "CPU", "cpu", "CPU", 64 * GIB, 128 * GIB), *rpc))


BACKEND = ",".join([
    "cuda1", "diffusion=cuda0&cuda2&cuda3&cuda4&cuda5&cuda6&cuda7&cuda8&RPC0&RPC1",
    "t5xxl=cuda9&cuda10&cuda11&cuda12", "Clip-Vision=cpu", "first_stage=cuda3", "control=CUDA4",
    "pmid=cuda5", "hires=cuda6", "yolo=cuda7", "te=CUDA9&CUDA10&CUDA11&CUDA12", "vae=cuda2",
])
PARAMS = "cpu,vae=disk,te=cuda9,upscaler=disk,detector=cuda7,controlnet=auto"
MAX_VRAM = ",".join(["-1.5"] + [f"cuda{i}={4 + i / 2}" for i in range(13)] + ["rpc1=6"])
PROFILE = Profile({"diffusion": ModuleProfile((300 << 20,) * 57, 2 * GIB),
                   "te": ModuleProfile((200 << 20,) * 24, 500 << 20)})


def median_s(fn: Callable[[], object], repeat: int = 400) -> float:
    return _timing.median_s(fn, repeat, warmup=20)


def main() -> None:
    inv = inventory()
    plan = resolve(Placement.from_strings(BACKEND, PARAMS, MAX_VRAM, stream_layers=True),
                   inv, PROFILE)
    canon = plan.placement
    state = {"i": 0}

    def edit() -> None:
        state["i"] += 1
        dev = f"CUDA{state['i'] % 13}"
        resolve(canon.assign("vae", dev).set_budget(dev, 5), inv, PROFILE)

    rows = [
        ("parse + resolve strings", lambda: resolve(Placement.from_strings(
            BACKEND, PARAMS, MAX_VRAM, stream_layers=True), inv, PROFILE)),
        ("resolve canonical placement", lambda: resolve(canon, inv, PROFILE)),
        ("GUI edit + re-resolve", edit),
        ("resolve, fresh inventory object", lambda: resolve(canon, Inventory(
            tuple(inv.devices)), PROFILE)),
    ]
    print(f"16 devices, --backend of {len(BACKEND)} chars, {len(plan.warnings)} warnings; "
          f"reference: one frame = {FRAME_S * 1e3:.0f} ms")
    for name, fn in rows:
        t = median_s(fn)
        print(f"  {name:34s} {t * 1e6:9.1f} us  = {t / FRAME_S:6.4f} frame "
              f"({FRAME_S / t:7.0f} per frame)")


if __name__ == "__main__":
    main()
