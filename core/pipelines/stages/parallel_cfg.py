"""Parallel CFG (spec section 14.5, ``--backend cfg=DEVICE``) for the UNet pipelines.

A second runner of the diffusion model (:data:`CFG_RUNNER`, the same graph over the same
weight file, placed by the run plan's :data:`~sdplan.core.runtime.placement.CFG` entry: its
weights on the ``cfg=`` device with the diffusion model's residency) runs the unconditional
half of each guided evaluation while the diffusion model's own runner runs the conditional
half, at the same time: the second half is computed on a worker thread (the native compute
releases the interpreter lock; each device computes with its own threads or RPC server).
Without that entry a guided evaluation is one batch of ``2N`` on the diffusion model's
devices, as before. Each half sees exactly the rows it would see in the batch, so the
picture equals the sequential one up to the kernels' batch-size rounding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from sdplan.core.runtime.placement import CFG, CFG_RUNNER, ModulePlacement

__all__ = ["CFG_RUNNER", "add_cfg_copy", "cfg_sessions", "guided_batch"]

#: ``fn(x, t, cond) -> out`` of the UNet: ``x`` ``(N, C, h, w)``, ``t`` the timestep,
#: ``cond`` the conditioning arrays with one row per latent.
UnetFn = Callable[[np.ndarray, Any, Mapping[str, np.ndarray]], np.ndarray]


def add_cfg_copy(pipe: Any, placements: Mapping[str, ModulePlacement] | None, graph: Any, weights: Any) -> None:
    """Give ``pipe`` the diffusion model's parallel-CFG runner when the run's ``placements``
    carry a :data:`~sdplan.core.runtime.placement.CFG` entry: ``graph`` (a fresh instance of
    the diffusion model's graph) over ``weights`` (its weight file), registered as
    :data:`CFG_RUNNER`, LoRAs patched as the diffusion model's."""
    place = (placements or {}).get(CFG)
    if place is not None:
        pipe.runners[CFG_RUNNER] = pipe.new_runner("diffusion", graph, weights, place)


@contextlib.contextmanager
def cfg_sessions(pipe: Any, run: UnetFn) -> Iterator[UnetFn]:
    """``run`` (the diffusion runner's UNet call, inside its session) with the parallel-CFG
    runner's weights in use too and ``run.pair((x, t, cond), (x, t, uncond))`` computing the
    two halves at once (the second on the copy); ``run`` unchanged without a copy."""
    copy = pipe.runners.get(CFG_RUNNER)
    if copy is None:
        yield run
        return

    def on_copy(x: np.ndarray, t: np.ndarray, cond: Mapping[str, np.ndarray]) -> np.ndarray:
        return copy.run({"x": x, "t": t, **cond})["y"]

    with copy.session(), ThreadPoolExecutor(1, thread_name_prefix="sdplan-cfg") as worker:
        def pair(first: tuple[Any, ...], second: tuple[Any, ...]) -> tuple[np.ndarray, np.ndarray]:
            x, t, cond = _inputs(*second)
            other = worker.submit(on_copy, x, t, cond)
            try:
                mine = run(*first)
            finally:
                theirs = other.result()
            return mine, theirs

        run.pair = pair  # type: ignore[attr-defined]
        yield run


def _inputs(x: np.ndarray, t: Any, cond: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    ts = np.ascontiguousarray(np.broadcast_to(t, (x.shape[0],)), dtype=np.float32)
    return (np.ascontiguousarray(x, dtype=np.float32), ts,
            {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in cond.items()})


def guided_batch(unet: Any, x_in: np.ndarray, t: Any, c: Mapping[str, np.ndarray],
                 u: Mapping[str, np.ndarray]) -> np.ndarray:
    """The UNet's output for the guided batch ``[conditional; unconditional]`` (``2N`` rows)
    of latents ``x_in`` ``(N, C, h, w)`` with one-row conditionings ``c`` and ``u``: both
    halves at once on two devices where ``unet`` has a parallel-CFG pair
    (:func:`cfg_sessions`), else one batch of ``2N``."""
    n = x_in.shape[0]
    cond = {k: np.repeat(v, n, 0) for k, v in c.items()}
    uncond = {k: np.repeat(v, n, 0) for k, v in u.items()}
    pair = getattr(unet, "pair", None)
    if pair is not None:
        mine, theirs = pair((x_in, t, cond), (x_in, t, uncond))
        return np.concatenate([mine, theirs], 0)
    both = {k: np.concatenate([cond[k], uncond[k]], 0) for k in cond}
    return unet(np.concatenate([x_in, x_in], 0), t, both)
