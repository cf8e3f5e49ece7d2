"""The newest sd-cli's memory accounting on top of the estimate (spec sections 14.5-14.7).

:func:`sdcli_estimate` takes :func:`~sdplan.core.planning.estimate.estimate_plan`'s figures
for an sd-cli command and applies what the newest sd-cli does with them (its
``docs/performance.md``):

- every capacity check keeps 512 MiB of the device's free memory for backend scratch;
- a graph runs monolithic unless its missing weights (those not resident on the device)
  plus its compute workspace, with 128 MiB more of planning headroom, exceed what the
  device has left (its budget, else free memory less the scratch, less the weights resident
  there); then it runs its *fixed* segment list: one segment per graph-cut mark (a DiT or
  text encoder: the prelude, one per block, the tail; a UNet: about one per stage). The
  segment being computed, the next one being prefetched (unless ``--disable-prefetch``) and
  the non-block weights must then fit. ``--disable-segmented-compute`` forces monolithic;
- a failed VAE decode is retried with spatial tiles of at most 256 image pixels, halving
  down to 4 latent pixels (``--vae-tiling`` tiles from the start);
- parallel CFG (``--backend cfg=DEVICE``) keeps a second copy of the diffusion weights,
  following diffusion's residency, and its compute on that device.

The snapshot (and sdplan's own engine) keep the estimate as it is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from sdplan.core.planning.estimate import (
    FitReport,
    RuntimeFlags,
    cfg_copy,
    compute_bytes,
    estimate_plan,
    im2col_bytes,
    totals,
)
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.plan_types import Plan
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.sdcli_split import SCRATCH, newest_budget
from sdplan.core.planning.vae_tiling import MIN_TILE_LATENT, VaeTiling, vae_scale_factor

__all__ = ["PLANNING_HEADROOM", "ModuleForecast", "VaeForecast", "SdcliForecast",
           "sdcli_estimate", "graph_cut_segments", "forecast_lines"]

#: Headroom the newest sd-cli needs beyond a graph's estimate to choose segmented over
#: monolithic execution (its ``docs/performance.md``).
PLANNING_HEADROOM = 128 << 20
#: The newest sd-cli's first VAE retry tile, in image pixels.
RETRY_TILE_PX = 256


def graph_cut_segments(mp: ModuleProfile) -> int:
    """Segments sd-cli runs for a module when it segments: its blocks plus the prelude and
    the tail (a graph-cut mark before the first block and after each), or one per UNet stage
    (sd-cli marks the stem and each input block but the downsamplers, the middle block and
    each output block; SDXL: 18 either way); 1 for a module without cut points."""
    if mp.blocks:
        return len(mp.blocks) + 2
    return len(mp.stages) or 1


@dataclass(frozen=True)
class ModuleForecast:
    """How sd-cli runs one module on its device: ``segments`` (1: monolithic), the bytes it
    needs there at its peak and what the device has left for it (bytes), and whether that
    fits."""

    module: str
    device: str
    segments: int
    need: int
    available: int

    @property
    def fits(self) -> bool:
        return self.need <= self.available

    def to_json(self) -> dict[str, object]:
        return {"device": self.device, "segments": self.segments, "need": self.need,
                "available": self.available, "fits": self.fits}


@dataclass(frozen=True)
class VaeForecast:
    """The VAE decode: ``tile`` the tile side in image pixels sd-cli ends at (0: whole
    image), ``retried`` when a failed whole decode is retried with tiles."""

    tile: tuple[int, int]
    retried: bool
    fits: bool

    def to_json(self) -> dict[str, object]:
        return {"tile_px": list(self.tile), "retried": self.retried, "fits": self.fits}


@dataclass(frozen=True)
class SdcliForecast:
    """What the newest sd-cli will do with the plan (module docstring)."""

    scratch: int
    modules: dict[str, ModuleForecast] = field(default_factory=dict)
    vae: VaeForecast | None = None
    cfg_device: str | None = None

    def to_json(self) -> dict[str, object]:
        return {"scratch": self.scratch, "planning_headroom": PLANNING_HEADROOM,
                "modules": {m: f.to_json() for m, f in self.modules.items()},
                "vae": self.vae.to_json() if self.vae is not None else None,
                "cfg_device": self.cfg_device}


def sdcli_estimate(plan: Plan, profile: Profile, inventory: Inventory, *, width: int = 512,
                   height: int = 512, batch: int = 1, flags: RuntimeFlags | None = None,
                   tiling: VaeTiling | None = None) -> tuple[FitReport, SdcliForecast | None]:
    """The estimate of the sd-cli command that runs ``plan`` and, for the newest sd-cli
    (``plan.target``), its forecast (module docstring).

    Args:
        plan: a resolved plan; its target's dialect decides (sdplan's engine and the
            snapshot: the plain estimate and no forecast).
        profile, inventory, width, height, batch: as :func:`estimate_plan`.
        flags: the command's runtime flags (default: none given).
        tiling: the command's VAE tiling (default: none).

    Raises:
        ValueError: as :func:`estimate_plan`.
    """
    flags = flags or RuntimeFlags()
    if not (plan.target.sdcli and plan.target.dialect == "newest"):
        return estimate_plan(plan, profile, inventory, width=width, height=height, batch=batch,
                             flags=flags), None
    report = estimate_plan(plan, profile, inventory, width=width, height=height, batch=batch,
                           flags=flags, reserve=SCRATCH)
    mods = dict(report.modules)
    diffusion = mods.get("diffusion")
    dmp = profile.get("diffusion")
    if diffusion is not None and dmp is not None:
        copy = cfg_copy(plan, diffusion, dmp.total)
        if copy is not None:
            mods["cfg"] = copy
    free = {d.name: d for d in inventory}
    forecasts: dict[str, ModuleForecast] = {}
    vae: VaeForecast | None = None
    for name, est in list(mods.items()):
        mp = profile.get(name if name != "cfg" else "diffusion")
        dev = est.devices[0]
        if mp is None or len(est.devices) > 1 or not free[dev].is_gpu_like:
            continue
        room = newest_budget(free[dev].free, plan.budgets.get(dev, 0))
        others = sum(e.weights.get(dev, 0) + e.lora.get(dev, 0) for m, e in mods.items()
                     if m != name)
        resident = est.weights.get(dev, 0)
        compute = max(est.compute.values(), default=0)
        missing = mp.total - resident if est.mode != "runtime" else 0
        mono = resident + missing + compute
        segmented = (not plan.placement.disable_segmented_compute and graph_cut_segments(mp) > 1
                     and missing and others + mono + PLANNING_HEADROOM > room)
        if name == "vae":
            vae, compute = _vae(mp, profile.architecture, flags, tiling or VaeTiling(),
                                room - others - resident - missing, width, height, batch)
            mono = resident + missing + compute
            mods[name] = dataclasses.replace(est, compute={dev: compute})
        if segmented:
            units = sorted(mp.blocks or mp.stages, reverse=True)
            live = units[0] + (units[1] if len(units) > 1 and
                               not plan.placement.disable_prefetch else 0)
            fixed = mp.total - sum(mp.blocks or mp.stages)
            need = others + resident + fixed + live + compute
            mods[name] = dataclasses.replace(est, staging={dev: fixed + live})
            forecasts[name] = ModuleForecast(name, dev, graph_cut_segments(mp), need, room)
        else:
            forecasts[name] = ModuleForecast(name, dev, 1, others + mono, room)
    out = totals(mods, inventory, plan.budgets, width, height, batch, SCRATCH)
    reasons = list(out.reasons) + [
        f"{f.device}: sd-cli's {m} needs {f.need / GIB:.2f} GiB"
        + (f" in {f.segments} graph-cut segments" if f.segments > 1 else " monolithic")
        + f" but has {f.available / GIB:.2f} GiB (budget or free memory less 512 MiB scratch)"
        for m, f in forecasts.items() if not f.fits]
    out = dataclasses.replace(out, fits=not reasons, reasons=reasons, engine="sd-cli",
                              compute_source=dict(report.compute_source))
    return out, SdcliForecast(SCRATCH, forecasts, vae, plan.cfg.device if plan.cfg and
                              plan.cfg.active else None)


def _vae(mp: ModuleProfile, architecture: str | None, flags: RuntimeFlags, tiling: VaeTiling,
         room: int, width: int, height: int, batch: int) -> tuple[VaeForecast, int]:
    """The VAE decode's tile and compute bytes: with ``--vae-tiling`` its tiles from the
    start; else the whole image, retried when that does not fit ``room`` with tiles of at
    most 256 image pixels, halved down to 4 latent pixels."""
    scale = vae_scale_factor(architecture)

    def need(w: int, h: int) -> int:
        extra = im2col_bytes("vae", architecture, width=w, height=h, batch=batch) \
            if flags.im2col and "vae" not in flags.conv_direct else 0
        return compute_bytes("vae", mp, architecture, width=w, height=h, batch=batch,
                             flash="vae" in flags.flash_attention) + extra

    if tiling.enabled:
        tw, th = tiling.tile_latent(width, height, scale)
        c = need(tw * scale, th * scale)
        return VaeForecast((tw * scale, th * scale), False, c <= room), c
    whole = need(width, height)
    if whole <= room:
        return VaeForecast((0, 0), False, True), whole
    tw, th = min(RETRY_TILE_PX, width), min(RETRY_TILE_PX, height)
    while True:
        c = need(tw, th)
        if c <= room or (tw // scale <= MIN_TILE_LATENT and th // scale <= MIN_TILE_LATENT):
            return VaeForecast((tw, th), True, c <= room), c
        tw = max(tw // 2, MIN_TILE_LATENT * scale)
        th = max(th // 2, MIN_TILE_LATENT * scale)


def forecast_lines(forecast: SdcliForecast) -> list[str]:
    """The forecast for people, one line each (GiB)."""
    lines = []
    for m, f in forecast.modules.items():
        if f.segments > 1:
            lines.append(f"{m}: sd-cli runs {f.segments} graph-cut segments on {f.device} "
                         f"(needs {f.need / GIB:.2f} of {f.available / GIB:.2f} GiB)")
    if forecast.vae is not None and forecast.vae.tile != (0, 0):
        w, h = forecast.vae.tile
        lines.append(f"vae: decodes in {w}x{h} pixel tiles"
                     + (" after a failed whole decode" if forecast.vae.retried else "")
                     + ("" if forecast.vae.fits else " and still does not fit"))
    if forecast.cfg_device:
        lines.append(f"cfg: a second copy of diffusion on {forecast.cfg_device}")
    return lines

