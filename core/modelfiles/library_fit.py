"""What each diffusion model of the library needs, and whether it fits on the devices.

A diffusion model alone does not generate: its family's companions (:func:`needs_of`) say which text encoders
and which VAE (by latent channels) each family pairs with, and :func:`companions` finds
them among the library's entries (the model's own folder first). :func:`fit_verdict`
then asks the planner the question the library answers at a glance, on the model with its
companions, at the family's native image size:

- ``resident``: every module's weights stay on the device that runs it (no split);
- ``split``: it fits with the diffusion model (or encoders) split over several devices;
- ``offload``: it fits only with weights kept in RAM or read from disk while they run
  (``--params-backend``, possibly with ``--max-vram`` segments);
- ``none``: no plan found fits.

The plans tried are the base placement as it is (the default placement unless given) and
:func:`sdplan.core.planning.autoplan.auto_plan`'s proposal; the verdict is the best of
those that fit, and its fit is :func:`sdplan.core.planning.estimate.estimate_plan`'s: the
same as ``sdplan plan`` gives for the same files and flags (:attr:`FitVerdict.files`,
:attr:`FitVerdict.backend`...). A verdict that fits also says how long a picture takes on
that plan (:attr:`FitVerdict.time`: :func:`~sdplan.core.planning.timing.predict_time` by the
parameter-count formula, at the verdict's size with the family's default steps, sampler and
guidance, with the inventory devices' profiles or their types' stated defaults).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sdplan.core.families import Companions, family, family_of, generation_defaults
from sdplan.core.modelfiles.library import DIFFUSION_KINDS, LibraryEntry
from sdplan.core.modelfiles.te_read import trim_llm_profile
from sdplan.core.planning.autoplan import auto_plan
from sdplan.core.planning.estimate import FitReport, estimate_plan
from sdplan.core.planning.inventory import Inventory
from sdplan.core.planning.modules import GIB, MODULES
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan import resolve
from sdplan.core.planning.plan_types import Plan
from sdplan.core.planning.profile import ModuleProfile, Profile
from sdplan.core.planning.timing import RunSettings, TimeReport, predict_fitted, seconds_text

#: Verdicts from best to worst.
VERDICTS = ("resident", "split", "offload", "none")
VERDICT_TITLES = {"resident": "fits resident", "split": "fits with a split",
                  "offload": "fits with offload", "none": "does not fit"}


def needs_of(entry: LibraryEntry) -> Companions | None:
    """What ``entry``'s family pairs with (its variant's companions; None for an unknown
    family): the registry's :attr:`~sdplan.core.families.declaration.Family.companions`,
    from sd-cli's documented model sets (SD1 CLIP-L; SD2 OpenCLIP ViT-H; SDXL CLIP-L + bigG;
    the refiner bigG alone; SD3 CLIP-L + bigG + T5-XXL; Flux CLIP-L + T5-XXL; Chroma T5-XXL
    alone, Chroma Radiance in pixel space; Z-Image and FLUX.2 klein a Qwen3 LLM encoder;
    4-channel SD VAEs, 16-channel Flux/SD3 autoencoders, FLUX.2's 32-channel one) and each
    family's training resolution."""
    fam = family(entry.family)
    return fam.companions_for(entry.variant) if fam is not None else None


def native_size(entry: LibraryEntry) -> int:
    """The image side (pixels) the fit is estimated at: the family's, else 512."""
    needs = needs_of(entry)
    return needs.size if needs else 512


def _rank(candidate: LibraryEntry, model: LibraryEntry, needs: Companions) -> tuple:
    """Closest folder first (longest common path), then, for SDXL, names with ``xl``,
    then the larger file (full precision over a quantised copy), then the path."""
    try:
        common = len(Path(os.path.commonpath([candidate.path, model.path])).parts)
    except ValueError:  # other drives
        common = 0
    name = candidate.name.lower()
    odd = bool(needs.prefers and needs.prefers not in name) or bool(needs.avoids and needs.avoids in name)
    return (-common, odd, -candidate.weight_bytes, candidate.path)


def companions(model: LibraryEntry, entries: Sequence[LibraryEntry]
               ) -> tuple[dict[str, list[str]], tuple[str, ...]]:
    """The sd-cli model-file flags that run ``model`` with the library's companions, and
    the companions not found (``clip_l``, ``t5xxl``, ``vae``...).

    A checkpoint is ``model`` (``-m``), a diffusion model alone ``diffusion_model``; each
    encoder the family needs and the file lacks comes from an encoder file, the VAE from a
    VAE file with the family's latent channels (the closest folder first, then for SDXL
    names with ``xl``, then the larger file). Unknown families get no companions and
    nothing is reported missing.
    """
    key = "model" if model.kind == "checkpoint" else "diffusion_model"
    flags: dict[str, list[str]] = {key: [model.path]}
    needs = needs_of(model)
    if needs is None:
        return flags, ()
    missing: list[str] = []
    ok = [e for e in entries if e.error is None and e.path != model.path]
    for enc in needs.encoders:
        if enc in model.encoders:
            continue
        cands = [e for e in ok if e.kind == "encoder" and e.encoders == (enc,)]
        if cands:
            flags[enc] = [min(cands, key=lambda e: _rank(e, model, needs)).path]
        else:
            missing.append(enc)
    if "vae" not in model.modules and needs.latent_channels is not None:
        cands = [e for e in ok if e.kind == "vae"
                 and e.latent_channels == needs.latent_channels]
        if cands:
            flags["vae"] = [min(cands, key=lambda e: _rank(e, model, needs)).path]
        else:
            missing.append("vae")
    return flags, tuple(missing)


def combined_profile(parts: Sequence[LibraryEntry]) -> Profile:
    """One profile of several files, as :func:`sdplan.core.modelfiles.checkpoint.read_model_files`
    would make of them given together: modules summed (an LLM encoder file's less what the
    family never reads: :func:`sdplan.core.modelfiles.te_read.trim_llm_profile`); ``te`` keeps the blocks of its
    dominant encoder (T5-XXL or the LLM, the larger, else the largest CLIP) and counts
    every other encoder as non-block bytes. Named and typed after the first part."""
    profs = [Profile.from_json(p.profile, source=p.path) for p in parts if p.profile]
    mods: dict[str, ModuleProfile] = {}
    te: list[ModuleProfile] = []
    arch = profs[0].architecture if profs else None
    for prof in profs:
        for name, mp in prof.modules.items():
            if name == "te":  # an encoder file alone: less the LLM blocks the family never reads
                te.append(mp if family_of(prof.architecture) else trim_llm_profile(mp, arch))
            elif name in mods:
                old = mods[name]
                mods[name] = ModuleProfile(old.blocks + mp.blocks, old.other + mp.other)
            else:
                mods[name] = mp
    if te:
        mods["te"] = _merge_te(te)
    first = profs[0] if profs else None
    ordered = {m: mods[m] for m in (*MODULES, *mods) if m in mods}
    autofit: dict[str, int] = {}
    loaded: dict[str, int] = {}
    for prof in profs:  # sd-cli's auto-fit sizes add up over the files as read together
        for total, part in ((autofit, prof.autofit), (loaded, prof.autofit_loaded)):
            for m, b in part.items():
                total[m] = total.get(m, 0) + int(b)
    return Profile(ordered, first.name if first else None,
                   first.architecture if first else None, autofit=autofit,
                   autofit_loaded=loaded)


def _merge_te(parts: list[ModuleProfile]) -> ModuleProfile:
    if len(parts) == 1:
        return parts[0]
    enc: dict[str, int] = {}
    for mp in parts:
        for e, b in (mp.encoders or {"te": mp.total}).items():
            enc[e] = enc.get(e, 0) + b
    big: list[str] = [e for e in ("t5xxl", "llm") if e in enc]
    dominant = max(big or list(enc), key=lambda e: enc[e])
    owner = next(mp for mp in parts if dominant in (mp.encoders or {"te": 0}))
    total = sum(mp.total for mp in parts)
    blocks = owner.blocks if owner.block_encoder == dominant else ()
    return ModuleProfile(blocks, total - sum(blocks), enc, dominant)


@dataclass(frozen=True)
class FitVerdict:
    """The library's answer for one diffusion model on an inventory.

    Attributes:
        verdict: one of :data:`VERDICTS`.
        fits: the estimate's verdict for the placement below (False for ``none``).
        files: the model-file flags estimated (the model and the companions found).
        missing: companions the library lacks (the estimate is without them).
        backend, params_backend, max_vram: the canonical flags of the placement judged;
            ``sdplan plan`` with these files and flags gives the same ``fits``.
        width, height, batch: what the compute estimate assumed.
        devices: device -> bytes planned there.
        reasons: the estimate's reasons when it does not fit.
        notes: how the plan was found (Auto plan's notes).
        time: the predicted time of a picture on the plan judged (None for ``none``; see
            the module docstring): ``step_s``, ``image_s``, ``load_s`` (seconds), ``steps``,
            ``sampler``, ``cfg``, ``measured`` (False: a device ran on default speeds).
    """

    verdict: str
    fits: bool
    files: dict[str, list[str]]
    missing: tuple[str, ...]
    backend: str
    params_backend: str
    max_vram: str
    width: int
    height: int
    batch: int = 1
    devices: dict[str, int] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    time: dict[str, object] | None = None

    @property
    def title(self) -> str:
        return VERDICT_TITLES[self.verdict]

    def flags(self) -> list[str]:
        """The placement as sd-cli arguments (empty values left out)."""
        out: list[str] = []
        for flag, v in (("--backend", self.backend), ("--params-backend", self.params_backend),
                        ("--max-vram", self.max_vram)):
            if v:
                out += [flag, v]
        return out

    def summary(self) -> str:
        """One line: the verdict and where it runs (``fits with offload: --backend ...``)."""
        where = " ".join(self.flags()) or "default placement"
        tail = f"; without {', '.join(self.missing)}" if self.missing else ""
        took = f"; {self.time_text(long=True)}" if self.time else ""
        return f"{self.title} at {self.width}x{self.height}: {where}{tail}{took}"

    def time_text(self, long: bool = False) -> str:
        """``~19 s/picture`` (``*`` after it on default speeds), or with ``long`` the steps,
        seconds per step and ``default speeds`` written out; empty without a time."""
        t = self.time
        if not t:
            return ""

        def sec(key: str) -> str:
            v = t.get(key)
            return seconds_text(float(v) if isinstance(v, (int, float)) else 0.0)

        image = f"~{sec('image_s')} s/picture"
        if not long:
            return image if t["measured"] else f"{image}*"
        out = f"{image} ({t['steps']} steps, ~{sec('step_s')} s/step, load {sec('load_s')} s)"
        return out if t["measured"] else f"{out}, default speeds"

    def to_json(self) -> dict[str, object]:
        return {"verdict": self.verdict, "fits": self.fits, "files": self.files,
                "missing": list(self.missing), "backend": self.backend,
                "params_backend": self.params_backend, "max_vram": self.max_vram,
                "width": self.width, "height": self.height, "batch": self.batch,
                "devices": self.devices, "reasons": list(self.reasons),
                "notes": list(self.notes), "time": self.time}


def classify_plan(plan: Plan, profile: Profile, fit: FitReport) -> str:
    """``resident``, ``split``, ``offload`` or ``none`` for one estimated plan (see the
    module docstring)."""
    if not fit.fits:
        return "none"
    mods = [plan.modules[m] for m in profile.modules if m in plan.modules]
    if any(mp.params.mode != "runtime" for mp in mods):
        return "offload"
    if any(len(mp.devices) > 1 for mp in mods):
        return "split"
    return "resident"


def fit_verdict(model: LibraryEntry, entries: Sequence[LibraryEntry], inventory: Inventory,
                base: Placement | None = None, *, width: int | None = None,
                height: int | None = None, batch: int = 1) -> FitVerdict:
    """The verdict for ``model`` (a checkpoint or diffusion model entry) with its
    companions among ``entries`` on ``inventory`` (module docstring).

    ``base``: the placement whose budgets and RPC servers count (default: none);
    ``width``/``height``: pixels (default: the family's :func:`native_size`).

    Raises:
        ValueError: ``model`` is not a readable checkpoint or diffusion model.
        PlanError: ``base`` does not resolve on ``inventory``.
    """
    if model.kind not in DIFFUSION_KINDS or model.error or not model.profile:
        raise ValueError(f"{model.path}: not a diffusion model the library could read")
    files, missing = companions(model, entries)
    by_path = {e.path: e for e in entries}
    parts = [model] + [by_path[p] for k, ps in files.items() if k not in ("model",
                                                                         "diffusion_model")
                       for p in ps if p in by_path]
    profile = combined_profile(parts)
    side = native_size(model)
    w, h = width or side, height or side
    base = base or Placement()
    tried: list[tuple[int, Plan, FitReport, tuple[str, ...]]] = []
    plan = resolve(base, inventory, profile)
    fit = estimate_plan(plan, profile, inventory, width=w, height=h, batch=batch)
    tried.append((VERDICTS.index(classify_plan(plan, profile, fit)), plan, fit,
                  ("the placement as given",)))
    if tried[0][0] != 0:
        for inv in _inventories(inventory):
            prop = auto_plan(inv, profile, base, width=w, height=h, batch=batch)
            plan = resolve(prop.placement, inventory, profile)
            fit = estimate_plan(plan, profile, inventory, width=w, height=h, batch=batch)
            tried.append((VERDICTS.index(classify_plan(plan, profile, fit)), plan, fit,
                          tuple(prop.notes)))
    rank, plan, fit, notes = min(tried, key=lambda t: t[0])
    if rank == VERDICTS.index("none"):
        rank, plan, fit, notes = tried[1]  # Auto plan's attempt names what is short
    time = _time_json(plan_time(plan, fit, profile, inventory, w, h, batch)) if rank < VERDICTS.index("none") \
        else None
    return FitVerdict(VERDICTS[rank], fit.fits, files, missing, plan.backend,
                      plan.params_backend, plan.max_vram, w, h, batch,
                      {d: t.total for d, t in fit.devices.items()}, tuple(fit.reasons), notes, time)


def default_run(architecture: str | None, width: int, height: int, batch: int = 1) -> RunSettings:
    """The run a model is timed at: ``width`` x ``height`` pixels, ``batch`` pictures, its
    family's default steps, sampler and guidance
    (:func:`~sdplan.core.families.generation_defaults`), else sd-cli's (20 steps of
    ``euler_a`` with CFG 7: ``examples/cli/main.cpp`` of stable-diffusion.cpp)."""
    d = generation_defaults(architecture)
    return RunSettings(width=width, height=height, batch=batch, steps=int(d.get("steps", 20)),
                       sampler=str(d.get("sampling_method", "euler_a")),
                       cfg=float(d.get("cfg_scale", 7.0)) != 1.0)


def plan_time(plan: Plan, fit: FitReport, profile: Profile, inventory: Inventory, width: int,
              height: int, batch: int = 1) -> TimeReport:
    """The predicted time of ``plan`` (its estimate ``fit`` gives the ``--max-vram``
    segments) at :func:`default_run`, by the parameter-count formula with ``inventory``'s
    device profiles (stated defaults for devices without one)."""
    return predict_fitted(plan, inventory, profile, default_run(profile.architecture, width, height, batch),
                          fit)


def _time_json(rep: TimeReport) -> dict[str, object]:
    s = rep.settings
    return {"step_s": rep.step_s, "image_s": rep.image_s, "load_s": rep.load_s, "steps": s.steps,
            "sampler": s.sampler, "cfg": s.cfg, "measured": rep.measured}


def _inventories(inventory: Inventory) -> list[Inventory]:
    """The inventories Auto plan is asked about: all devices, then the GPU with the most
    free memory with the CPU alone (Auto plan splits over several GPUs before it tries
    segments on one; that order can miss a plan that fits)."""
    out = [inventory]
    gpus = sorted((d for d in inventory if d.is_gpu_like), key=lambda d: -d.free)
    cpus = [d for d in inventory if d.type == "cpu"]
    if len(gpus) > 1:
        out.append(Inventory((gpus[0], *cpus)))
    return out


def describe_devices(v: FitVerdict) -> str:
    """``CUDA0 20.1 GiB · CPU 9.8 GiB``: the planned bytes per device."""
    return " · ".join(f"{d} {b / GIB:.1f} GiB" for d, b in v.devices.items())
