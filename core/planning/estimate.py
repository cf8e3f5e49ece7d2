"""Memory estimate of a resolved plan: per module and device, against free memory and budgets.

Three parts per module and device (bytes):

- **weights** (resident between uses): residency ``runtime`` puts the module on its
  runtime device (a layer split: each range's blocks on its device, the non-block bytes on
  the main device; a row split: each device's share of the block rows, the non-block bytes
  on the main device, which alone runs the graph and holds the compute buffer); ``device`` puts all of it on the params device; ``disk`` nothing.
  An LLM encoder's vision tower (``te``'s ``llm_vision`` bytes: Qwen2.5-VL's) is never split
  (sd-cli keeps it on the main device) and counts only for a run given reference pictures.
- **staging** (while the module runs): with ``device`` or ``disk`` residency the weights
  are copied to the runtime device(s): each range's blocks to its device plus the non-block
  bytes to the main device, or the whole module on a single device.
- **segments**: with a ``--max-vram`` budget on a single runtime device and units to cut at
  (the blocks, or a UNet's engine stages: input blocks, middle block, output blocks), the
  engine runs the module in segments packed in order so that the fixed bytes (everything
  but the units) + at-runtime LoRA + segment + compute fit the budget (a unit larger than that is one
  segment). Only the fixed bytes plus the largest segment are there at once: the fixed
  bytes are the weights (``runtime``) or staged (``device``/``disk``), the segment is
  staging. A module that fits in one segment keeps its weights as without a budget.
- **compute**: the graph's compute buffer, estimated from the architecture below. A split
  module needs it on each of its devices (each runs whole layers).
- **lora**: at-runtime LoRA tensors, resident beside the blocks they patch
  (:mod:`sdplan.core.planning.adapters`; merged LoRAs take no device memory).

The compute part is for the engine that runs the plan (``engine``): sdplan's own engine
(a dry-run reserve of its graphs when the caller measured one, else figures fitted to those
graphs, :mod:`sdplan.core.planning.engine_compute`), or sd-cli (the formula below, with or
without ``--diffusion-fa``). :attr:`FitReport.engine` and :attr:`FitReport.compute_source`
say which.

A device's total is its resident weights and LoRA tensors of every module plus the largest
``staging + compute`` of one module, because sd-cli runs the modules one after another.

Compute-buffer formula (bytes, F32 activations, without flash attention)::

    compute = batch * 4 * (heads * N**2 + K * N * D)

with ``N`` the tokens of the largest attention, ``heads`` its heads, ``D`` the widest
activation (the MLP width, 4x the hidden size or channels) and ``K = 4`` live activations
of that width (block input, MLP up-projection, its activation, residual). For
UNets ``N`` is the latent size ``(H/8)*(W/8)`` at the first level with attention (SDXL:
one level down, ``/4``); for DiTs ``N = (H/16)*(W/16) + text tokens``; for text encoders
``N`` is the context length; for VAE decoding the mid-block attention at latent size (one
head) plus ``K`` feature maps of 128 channels at image size; for ESRGAN ``K`` maps of 64
channels at image size. Constants are the published model configurations (Flux: hidden
3072, 24 heads, 512 T5 tokens (schnell 256); Chroma: Flux's with sd-cli's 512 T5 tokens
(sdplan's engine drops the masked ones, so it needs less); SD3-medium: 1536, 24 heads, 154
text tokens (one chunk of 77 CLIP then 77 T5 rows, sd-cli's ``SD3CLIPEmbedder`` and sdplan's
engine alike; its T5-XXL also runs 77-token chunks); SD3.5-large: 2432, 38 heads; Z-Image: 3840, 30 heads, 512 LLM tokens; FLUX.2 klein
4B: 3072, 24 heads, 512 LLM tokens (9B: 4096, 32 heads; reference images add their tokens); SD1: 320
channels, 8 heads; SD2: 320 channels, 5 heads;
SDXL: 640 channels, 10 heads; T5-XXL: 64 heads, 10240 MLP, 512 tokens; CLIP-L/H/G:
12/16/20 heads, 3072/4096/5120 MLP, 77 tokens). ``K = 4`` is a rule of thumb for a block's
live tensors; the engine's measured figure is the reference this estimate is checked
against. Unknown architectures use a quarter of the module's weights at 512x512, scaled by
pixels and batch.

The estimate of an sd-cli command (:class:`RuntimeFlags`, from the command's
``--fa``/``--diffusion-fa``, ``--diffusion-conv-direct``/``--vae-conv-direct``, ``--mmap``
and ``--eager-load``): flash attention drops the ``heads * N**2`` score matrix of the
modules it covers (it is computed in tiles); sd-cli's default convolution lowers each 3x3
convolution through an F16 ``im2col`` buffer of ``batch * 2 * 9 * C * P`` bytes for the
widest one at full size (VAE decoder: ``C = 128`` at image size; UNets: the first level's
channels at latent size), which ``--*-conv-direct`` removes; ``--mmap`` maps the files, so
weights kept on the CPU are file pages the system can reclaim rather than allocations
(counted apart, as ``mapped``); ``--eager-load`` loads every module's weights at start
instead of at first use, which moves the peak earlier but not higher (the modules run once
each and keep their weights), so it changes no figure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sdplan.core.families import ComputeShape, family_of, variant_of
from sdplan.core.planning.adapters import LoraProfile, lora_device_bytes
from sdplan.core.planning.engine_compute import sdplan_compute_bytes
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB
from sdplan.core.planning.phases import BOTH, SWITCH, max_bytes, phase_placed, sum_bytes
from sdplan.core.planning.plan_types import DiffusionPhase
from sdplan.core.planning.profile import ModuleProfile, Profile

_K = 4
_F32 = 4

#: Engines an estimate can be for (see :func:`module_compute`).
ENGINES = ("sdplan", "sd-cli", "sd-cli-fa")

# encoder -> (heads, MLP width, tokens)
_TE = {"t5xxl": (64, 10240, 512), "llm": (28, 18944, 512), "clip_l": (12, 3072, 77),
       "clip_h": (16, 4096, 77), "clip_g": (20, 5120, 77)}


def _shape(architecture: str | None) -> ComputeShape | None:
    """The family's published compute constants for an architecture name (its variant's when
    it has its own; :attr:`sdplan.core.families.declaration.Family.compute`), or None."""
    fam = family_of(architecture)
    return fam.compute_for(variant_of(architecture)) if fam is not None else None


@dataclass(frozen=True)
class RuntimeFlags:
    """How the sd-cli command runs, for its estimate (module docstring).

    Attributes:
        flash_attention: modules computing attention in tiles (``--fa``: all,
            ``--diffusion-fa``: ``diffusion``).
        conv_direct: modules with direct convolutions (no ``im2col`` buffer).
        mmap: ``--mmap``: CPU-resident weights are mapped file pages.
        eager_load: ``--eager-load`` (no figure changes; recorded in the report).
        im2col: estimate sd-cli's ``im2col`` convolution buffers (True for an sd-cli
            command; sdplan's own engine chooses other convolution methods).
    """

    flash_attention: frozenset[str] = frozenset()
    conv_direct: frozenset[str] = frozenset()
    mmap: bool = False
    eager_load: bool = False
    im2col: bool = True

    def to_json(self) -> dict[str, object]:
        return {"flash_attention": sorted(self.flash_attention),
                "conv_direct": sorted(self.conv_direct), "mmap": self.mmap,
                "eager_load": self.eager_load, "im2col": self.im2col}


def im2col_bytes(module: str, architecture: str | None, *, width: int, height: int,
                 batch: int) -> int:
    """sd-cli's F16 ``im2col`` buffer of ``module``'s widest 3x3 convolution in bytes
    (module docstring): VAE ``batch * 2 * 9 * 128 * pixels``; SD/SDXL UNets
    ``batch * 2 * 9 * 320 * latent pixels``; 0 for DiTs and other modules."""
    shape = _shape(architecture)
    if module == "vae":
        return batch * 2 * 9 * 128 * width * height
    if module in ("diffusion", "controlnet") and shape is not None and shape.kind == "unet":
        return batch * 2 * 9 * 320 * (height // 8) * (width // 8)
    return 0


@dataclass(frozen=True)
class ModuleEstimate:
    """One module's bytes per device (see module docstring for the parts)."""

    module: str
    mode: str
    devices: tuple[str, ...]
    weights: dict[str, int] = field(default_factory=dict)
    staging: dict[str, int] = field(default_factory=dict)
    compute: dict[str, int] = field(default_factory=dict)
    lora: dict[str, int] = field(default_factory=dict)
    #: bytes of each ``--max-vram`` segment, in execution order; empty when not segmented.
    segments: tuple[int, ...] = ()
    #: a two-stage diffusion model: ``both`` (both experts resident) or ``switch`` (one at a
    #: time: :mod:`sdplan.core.planning.phases`); empty otherwise.
    phase_residency: str = ""
    #: per phase (``high_noise``, ``low_noise``), its weights per device where it runs.
    phases: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"mode": self.mode, "devices": list(self.devices), "weights": self.weights,
                                "staging": self.staging, "compute": self.compute, "lora": self.lora}
        if self.segments:
            d["segments"] = list(self.segments)
        if self.phases:
            d["phase_residency"] = self.phase_residency
            d["phases"] = {k: dict(v) for k, v in self.phases.items()}
        return d


@dataclass(frozen=True)
class DeviceTotals:
    """A device's estimate in bytes; ``budget`` 0 means none."""

    device: str
    weights: int
    staging: int
    compute: int
    total: int
    free: int
    budget: int
    lora: int = 0

    def to_json(self) -> dict[str, object]:
        return {"weights": self.weights, "staging": self.staging, "compute": self.compute,
                "lora": self.lora, "total": self.total, "free": self.free, "budget": self.budget}


@dataclass(frozen=True)
class FitReport:
    """Per-device totals, per-module figures and the verdict with its reasons."""

    devices: dict[str, DeviceTotals]
    modules: dict[str, ModuleEstimate]
    fits: bool
    reasons: list[str]
    width: int
    height: int
    batch: int
    #: the engine the figures are for: ``sdplan`` (its own engine) or ``sd-cli``
    engine: str = "sdplan"
    #: per module, where its compute figure comes from: ``measured`` (a dry-run reserve of
    #: the engine's graph), ``fitted`` (:mod:`~sdplan.core.planning.engine_compute`) or
    #: ``formula`` (:func:`compute_bytes`)
    compute_source: dict[str, str] = field(default_factory=dict)

    def engine_label(self) -> str:
        """One line naming the engine and how compute was estimated, e.g. ``sdplan's engine
        (compute measured by a dry run)``."""
        sources = sorted(set(self.compute_source.values()))
        how = {"measured": "measured by a dry run of its graphs", "fitted": "fitted to its graphs",
               "formula": "by formula"}
        what = "; ".join(how[x] for x in sources) or "none"
        name = "sdplan's engine" if self.engine == "sdplan" else (
            "sd-cli" + (" with --diffusion-fa" if self.engine == "sd-cli-fa" else ""))
        return f"{name} (compute {what})"

    def to_json(self) -> dict[str, object]:
        """JSON form (bytes) for ``sdplan plan --json`` under ``"fit"``."""
        return {"fits": self.fits, "reasons": list(self.reasons), "width": self.width,
                "height": self.height, "batch": self.batch, "engine": self.engine,
                "compute_source": dict(self.compute_source),
                "devices": {d: t.to_json() for d, t in self.devices.items()},
                "modules": {m: e.to_json() for m, e in self.modules.items()}}


def _attn(batch: int, heads: int, tokens: int, width: int, flash: bool = False) -> int:
    return batch * _F32 * ((0 if flash else heads * tokens * tokens) + _K * tokens * width)


def compute_bytes(module: str, mp: ModuleProfile, architecture: str | None, *,
                  width: int, height: int, batch: int, flash: bool = False, frames: int = 1,
                  vae_frames: int | None = None) -> int:
    """Compute-buffer estimate in bytes of one module (formula in the module docstring):
    sd-cli's path (F32 activations); ``flash`` (sd-cli's ``--fa``/``--diffusion-fa``) drops
    the ``heads * N**2`` attention score matrices.

    Args:
        module: module name (``diffusion``, ``te``, ``vae``...).
        mp: the module's weight sizes (unknown architectures scale from them).
        architecture: the profile's architecture name (``flux-dev``, ``sdxl``...) or None.
        width, height: image size in pixels; batch: images per run.
        flash: flash attention (no ``heads * N**2`` score matrix).
        frames: a video's frames (Wan): a DiT attends over the patches of its
            ``(frames - 1) // 4 + 1`` latent frames at once.
        vae_frames: the frames one decoder graph makes (default ``frames``: sdplan's engine
            decodes the whole video at once; sd-cli decodes a latent frame, 4 frames, at a time).
    """
    shape = _shape(architecture)
    scale = shape.scale if shape is not None and shape.scale else 8  # Wan 2.2 TI2V-5B: 16
    latent = (height // scale) * (width // scale)
    pixels = width * height * (frames if vae_frames is None else vae_frames)
    if module in ("diffusion", "controlnet"):
        if shape is not None and shape.kind == "dit":
            cells = latent // 4 * ((frames - 1) // 4 + 1)
            return _attn(batch, shape.heads, cells + shape.tokens, 4 * shape.width, flash)
        if shape is not None and shape.kind == "unet":
            return _attn(batch, shape.heads, latent // shape.tokens, 4 * shape.width, flash)
    elif module == "te":
        encs = [e for e in (mp.encoders or {mp.block_encoder: 0}) if e in _TE]
        te_tokens = shape.te_tokens if shape is not None else None
        if encs:  # encoders run one after another: the largest buffer counts
            return max(_attn(batch, _TE[e][0], te_tokens or _TE[e][2], _TE[e][1], flash)
                       for e in encs)
    elif module == "vae":
        return batch * _F32 * ((0 if flash else latent * latent) + _K * 128 * pixels)
    elif module == "upscaler":
        return batch * _F32 * _K * 64 * pixels
    elif module in ("clip_vision", "photomaker"):
        return _attn(batch, 16, 257, 4096, flash)
    return _fallback(mp, pixels, batch)


def _fallback(mp: ModuleProfile, pixels: int, batch: int) -> int:
    return mp.total // 4 * pixels * batch // (512 * 512)


def segments(units: tuple[int, ...], fixed: int, budget: int, compute: int) -> list[int]:
    """Bytes of each segment when ``units`` (blocks or stages, in order) are packed so that
    ``fixed + segment + compute`` fits ``budget`` (a unit larger than that is one segment),
    as the engine's runner packs them."""
    room = budget - fixed - compute
    out: list[int] = []
    seg = 0
    for b in units:
        if seg and seg + b > room:
            out.append(seg)
            seg = 0
        seg += b
    return out + ([seg] if units else [])


def module_compute(module: str, mp: ModuleProfile, architecture: str | None, *, width: int,
                   height: int, batch: int, engine: str = "sdplan",
                   measured: Mapping[str, int] | None = None, frames: int = 1) -> tuple[int, str]:
    """One module's compute bytes for ``engine`` and where the figure comes from.

    ``engine`` ``sdplan``: ``measured[module]`` when given (a dry-run reserve), else the
    fitted figures of :func:`sdplan.core.planning.engine_compute.sdplan_compute_bytes`, else
    the formula; ``sd-cli``/``sd-cli-fa``: the formula of :func:`compute_bytes` without /
    with ``--diffusion-fa``. Returns ``(bytes, "measured" | "fitted" | "formula")``.
    """
    if engine == "sdplan":
        if measured and module in measured:
            return int(measured[module]), "measured"
        fitted = sdplan_compute_bytes(module, architecture, width=width, height=height,
                                      batch=batch) if frames == 1 else None
        if fitted is not None:
            return fitted, "fitted"
    flash = engine == "sd-cli-fa" and module in ("diffusion", "controlnet")
    return compute_bytes(module, mp, architecture, width=width, height=height, batch=batch,
                         flash=flash, frames=frames,
                         vae_frames=None if engine == "sdplan" else min(frames, 4)), "formula"


def estimate_plan(plan: object, profile: Profile, inventory: Inventory, *,
                  width: int = 512, height: int = 512, batch: int = 1, engine: str = "sdplan",
                  measured: Mapping[str, int] | None = None,
                  flags: RuntimeFlags | None = None,
                  loras: Mapping[str, LoraProfile] | None = None,
                  reserve: int = 0, ref_images: int = 0, frames: int = 1) -> FitReport:
    """Estimate a resolved plan's memory per module and device and say whether it fits.

    Args:
        plan: a :class:`sdplan.core.planning.plan_types.Plan` (``modules[m].devices``, ``.params.mode``
            ``runtime``/``device``/``disk``, ``.params.device``, ``.ranges``;
            ``budgets`` bytes, 0 = none).
        profile: the model's sizes; modules absent from it are not estimated.
        inventory: the devices with their free memory (bytes).
        width, height: image size in pixels; batch: images per run.
        engine: ``sdplan`` (its own engine), ``sd-cli`` or ``sd-cli-fa`` (sd-cli with
            ``--diffusion-fa``): whose compute buffers are estimated (:func:`module_compute`).
        measured: module -> compute bytes measured by a dry-run reserve of sdplan's engine.
        flags: estimate the sd-cli command run with these flags (module docstring; flash
            attention per module, im2col columns, mmap); given, the engine is sd-cli's.
        loras: per module, the at-runtime LoRA bytes kept on its devices (None or absent:
            none, as for merged LoRAs).
        reserve: bytes each GPU-like device keeps free (:func:`totals`).
        ref_images: reference pictures the run is given (``-r``): an LLM encoder's vision
            tower (``te``'s ``llm_vision`` bytes, on the main device) is loaded only for them,
            as sd-cli encodes the pictures with it, and only for a family whose encoder reads
            them (``Family.vision_refs``: Qwen-Image; FLUX.2 dev's pictures go through its
            autoencoder); otherwise it is not counted.
        frames: a video's frames (``-M vid_gen --video-frames``; :func:`compute_bytes`).

    Returns:
        A :class:`FitReport`; ``fits`` is False when a device's total exceeds its free
        memory or its ``--max-vram`` budget, each such device giving one reason.

    Raises:
        ValueError: width, height or batch not positive, or an unknown engine.
    """
    if width <= 0 or height <= 0 or batch <= 0:
        raise ValueError(f"image size {width}x{height} and batch {batch} must be positive")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
    sources: dict[str, str] = {}
    mods: dict[str, ModuleEstimate] = {}
    budgets: dict[str, int] = dict(getattr(plan, "budgets", {}))
    fam = family_of(profile.architecture)
    vision = bool(ref_images) and (fam is None or fam.vision_refs)
    for name, mp in profile.modules.items():
        mplan = plan.modules.get(name)  # type: ignore[attr-defined]
        if mplan is None:
            continue
        devs = tuple(mplan.devices)
        main = devs[0]
        mode = mplan.params.mode
        if flags is not None:
            comp = compute_bytes(name, mp, profile.architecture, width=width, height=height,
                                 batch=batch, flash=name in flags.flash_attention, frames=frames,
                                 vae_frames=min(frames, 4))
            if flags.im2col and name not in flags.conv_direct:
                comp += im2col_bytes(name, profile.architecture, width=width, height=height,
                                     batch=batch)
            sources[name] = "formula"
        else:
            comp, sources[name] = module_compute(name, mp, profile.architecture, width=width,
                                                 height=height, batch=batch, engine=engine,
                                                 measured=measured, frames=frames)
        placed: dict[str, int] = {}
        row_shares = getattr(mplan, "row_shares", None)
        unused = mp.encoders.get("llm_vision", 0) if name == "te" and not vision else 0
        total = mp.total - unused
        if mplan.ranges:  # a UNet split by stages keeps only its non-stage bytes on main
            placed[main] = getattr(mplan, "main_other_bytes", mp.other) - unused
            for r in mplan.ranges:
                placed[r.device] = placed.get(r.device, 0) + r.bytes
        elif row_shares:  # row split: block rows on every device, the rest on the main one
            placed = dict(row_shares)
            placed[main] = placed.get(main, 0) + mp.other - unused
        else:
            placed[main] = total
        weights: dict[str, int] = {}
        staging: dict[str, int] = {}
        if mode == "runtime":
            weights = placed
        else:
            if mode == "device" and mplan.params.device:
                weights = {mplan.params.device: total}
            staging = dict(placed)
        lp = (loras or {}).get(name)
        lora = lora_device_bytes(mplan, lp) if lp is not None else {}
        segs: list[int] = []
        budget = budgets.get(main, 0)
        units = mp.blocks or mp.stages
        if len(devs) == 1 and budget > 0 and units:  # at-runtime LoRA stays beside the fixed bytes
            fixed = total - sum(units)
            segs = segments(units, fixed, budget, comp + lora.get(main, 0))
            if len(segs) > 1 and mode == "runtime":
                weights, staging = {main: fixed}, {main: max(segs)}
            elif len(segs) > 1:
                staging = {main: fixed + max(segs)}
        compute = {d: comp for d in (devs if mplan.ranges else devs[:1])}
        if flags is not None and flags.mmap:  # CPU-kept weights are mapped file pages
            weights = {d: b for d, b in weights.items() if not _is_cpu(inventory, d)}
        mods[name] = ModuleEstimate(name, mode, devs, weights, staging, compute, lora,
                                    tuple(segs) if len(segs) > 1 else ())
    target = getattr(plan, "target", None)
    dmp = profile.get("diffusion")
    if flags is None and engine == "sdplan" and not getattr(target, "sdcli", False) \
            and "diffusion" in mods and dmp is not None:  # the engine's parallel-CFG copy
        copy = cfg_copy(plan, mods["diffusion"], dmp.total)
        if copy is not None:
            mods["cfg"] = copy
    report = totals(mods, inventory, budgets, width, height, batch, reserve)
    two = _two_stage(mods.get("diffusion"), getattr(plan, "phases", ()), report.devices,
                     budgets, reserve, inventory, switch_allowed=flags is None and engine == "sdplan")
    if two is not None:
        mods["diffusion"] = two
        report = totals(mods, inventory, budgets, width, height, batch, reserve)
    return dataclasses.replace(report, engine="sd-cli" if flags is not None else engine,
                               compute_source=sources)


def cfg_copy(plan: object, diffusion: ModuleEstimate, total: int) -> ModuleEstimate | None:
    """The parallel-CFG copy of diffusion on the CFG device (spec section 14.5): resident
    there when diffusion's weights follow runtime, else staged there, with a second copy on
    diffusion's params device (the RAM copy doubles too); diffusion's compute beside it (the
    copy runs half of diffusion's CFG batch: counted whole, on the safe side)."""
    cfg = getattr(plan, "cfg", None)
    if cfg is None or not cfg.active:
        return None
    params = plan.modules["diffusion"].params  # type: ignore[attr-defined]
    compute = {cfg.device: max(diffusion.compute.values(), default=0)}
    if params.mode == "runtime":
        return ModuleEstimate("cfg", "runtime", (cfg.device,), {cfg.device: total}, {}, compute)
    weights = {params.device: total} if params.mode == "device" and params.device else {}
    return ModuleEstimate("cfg", params.mode, (cfg.device,), weights, {cfg.device: total},
                          compute)


def _two_stage(est: ModuleEstimate | None, phases: Sequence[DiffusionPhase],
               devices: Mapping[str, DeviceTotals], budgets: Mapping[str, int], reserve: int,
               inventory: Inventory, *, switch_allowed: bool) -> ModuleEstimate | None:
    """The ``diffusion`` estimate of a two-stage model (:mod:`sdplan.core.planning.phases`):
    ``est`` holds the low-noise expert only; the high-noise one runs first on the same devices
    and residency. Residency ``runtime``: both experts' weights resident (``both``) when the
    diffusion devices then still fit (``devices``: the totals with the low-noise expert alone
    resident, plus the high-noise expert's bytes), else (sdplan's engine only,
    ``switch_allowed``) one expert at a time (``switch``): no resident weights, the larger
    expert per device staged with the compute buffer. ``device``: both live on the params
    device, each staged for its phase; ``disk``: each read for its phase. None for a one-stage
    model."""
    if est is None or len(phases) != 2 or est.segments:
        return None
    main = est.devices[0]
    high, low = (phase_placed(p, main) for p in phases)
    per = {p.name: pl for p, pl in zip(phases, (high, low), strict=True)}
    if est.mode == "runtime":
        def fits(dev: str) -> bool:
            t = devices.get(dev)
            if t is None:
                return True
            keep = reserve if any(d.name == dev and d.is_gpu_like for d in inventory) else 0
            need = t.total + high.get(dev, 0)
            return need + keep <= t.free and (budgets.get(dev, 0) <= 0 or need <= budgets[dev])
        if not switch_allowed or all(fits(d) for d in high):
            return dataclasses.replace(est, weights=sum_bytes(est.weights, high),
                                       phase_residency=BOTH, phases=per)
        return dataclasses.replace(est, weights={}, staging=max_bytes(high, low),
                                   phase_residency=SWITCH, phases=per)
    weights = dict(est.weights)
    if est.mode == "device" and est.weights:
        weights = {d: b + phases[0].bytes for d, b in est.weights.items()}
    return dataclasses.replace(est, weights=weights, staging=max_bytes(high, low),
                               phase_residency=SWITCH, phases=per)


def _is_cpu(inventory: Inventory, name: str) -> bool:
    return any(d.name == name and d.type == "cpu" for d in inventory)


def totals(mods: Mapping[str, ModuleEstimate], inventory: Inventory, budgets: Mapping[str, int],
           width: int, height: int, batch: int, reserve: int = 0) -> FitReport:
    """Per-device totals of module estimates and the verdict: a device's resident weights
    and LoRA tensors plus the largest ``staging + compute`` of one module must fit its free
    memory less ``reserve`` bytes on a GPU-like device (the newest sd-cli keeps 512 MiB of
    scratch at every capacity check, spec section 14.6) and its ``--max-vram`` budget."""
    devices: dict[str, DeviceTotals] = {}
    reasons: list[str] = []
    for dev in inventory:
        w = sum(e.weights.get(dev.name, 0) for e in mods.values())
        lora = sum(e.lora.get(dev.name, 0) for e in mods.values())
        transient = [(e.staging.get(dev.name, 0), e.compute.get(dev.name, 0))
                     for e in mods.values()]
        peak = max(transient, key=sum, default=(0, 0))
        if not (w or lora or sum(peak)):
            continue
        budget = budgets.get(dev.name, 0)
        t = DeviceTotals(dev.name, w, peak[0], peak[1], w + lora + sum(peak), dev.free, budget, lora)
        devices[dev.name] = t
        keep = reserve if dev.is_gpu_like else 0
        if t.total + keep > t.free:
            reasons.append(f"{dev.name}: needs {t.total / GIB:.2f} GiB (weights "
                           f"{w / GIB:.2f}, staging {peak[0] / GIB:.2f}, compute "
                           f"{peak[1] / GIB:.2f}{f', LoRA {lora / GIB:.2f}' if lora else ''}) "
                           f"but has {t.free / GIB:.2f} GiB free"
                           + (f" less {keep / GIB:.2f} GiB of scratch" if keep else ""))
        elif budget > 0 and t.total > budget:
            reasons.append(f"{dev.name}: needs {t.total / GIB:.2f} GiB, over its --max-vram "
                           f"budget of {budget / GIB:.2f} GiB")
    return FitReport(devices, dict(mods), not reasons, reasons, width, height, batch)
