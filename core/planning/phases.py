"""Two-stage diffusion models in the plan: each diffusion model of a two-stage model is a
*phase* of the ``diffusion`` module (Wan 2.2 A14B: the high-noise expert of
``--high-noise-diffusion-model`` denoises the first steps, down to the switch sigma, then the
low-noise expert of ``--diffusion-model`` the rest).

How sd-cli places them (``stable-diffusion.cpp``, ``StableDiffusionGGML::init``): both
experts are built on ``backend_for(DIFFUSION)`` and registered with the ``diffusion``
module's params backend and residency (``register_runner_params(..., DIFFUSION)``), so
``--backend diffusion=...``, ``--params-backend diffusion=...``, ``--max-vram`` and a layer
split over several devices apply to both alike, each expert split by its own blocks; there is
no module key of its own. With residency following the runtime device both experts stay
loaded on it for the whole run; with ``--params-backend diffusion=cpu`` (or
``--offload-to-cpu``) both live in RAM and each is staged to the runtime device(s) while its
phase runs; with ``disk`` each is read from its file for its phase.

sdplan's engine places them the same way, with one difference **[sdplan]**: when both
experts do not fit their runtime devices at once (the estimate decides, with everything else
resident there), each expert is loaded for its phase only: the high-noise one is released
after its phase and the low-noise one loaded in its place, then released before the decoder
runs (:data:`SWITCH`), so the peak is the larger expert, not both.

Pure Python.
"""

from __future__ import annotations

from collections.abc import Mapping

from sdplan.core.planning.plan_types import DiffusionPhase

__all__ = ["BOTH", "SWITCH", "PHASE_ORDER", "DiffusionPhase", "phase_placed", "max_bytes", "sum_bytes"]

#: Both experts resident on their runtime devices for the whole run (sd-cli's way).
BOTH = "both"
#: One expert resident at a time: the high-noise one for its phase, then the low-noise one.
SWITCH = "switch"
#: Phase names in the order they run, with the model flag that gives each.
PHASE_ORDER: tuple[tuple[str, str], ...] = (("high_noise", "--high-noise-diffusion-model"),
                                            ("low_noise", "--diffusion-model"))


def phase_placed(phase: DiffusionPhase, main: str) -> dict[str, int]:
    """Device -> bytes of ``phase``'s weights where it runs: each range's blocks on its device
    and the non-block bytes on ``main``; all of it on ``main`` without ranges."""
    if not phase.ranges:
        return {main: phase.bytes}
    placed = {main: phase.main_other_bytes}
    for r in phase.ranges:
        placed[r.device] = placed.get(r.device, 0) + r.bytes
    return placed


def max_bytes(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    """Per device, the larger of two placements (one expert loaded at a time)."""
    return {d: max(a.get(d, 0), b.get(d, 0)) for d in {**a, **b}}


def sum_bytes(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    """Per device, both placements together (both experts loaded)."""
    return {d: a.get(d, 0) + b.get(d, 0) for d in {**a, **b}}
