"""The split policy a plan carries (spec sections 14.4 and 14.5): ``--split-ratio`` checked
against the split modules' device lists, and the parallel-CFG device of ``--backend
cfg=DEVICE`` resolved, with the cases where sd-cli keeps the sequential path as warnings."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from sdplan.core.errors import PlanError
from sdplan.core.families import family_of
from sdplan.core.planning.assignment import DeviceIndex
from sdplan.core.planning.placement import Placement
from sdplan.core.planning.plan_types import CfgPlan, PlanWarning
from sdplan.core.planning.profile import Profile
from sdplan.core.planning.target import Target

__all__ = ["split_ratio_check", "cfg_plan", "cfg_command_reasons"]


def split_ratio_check(pl: Placement, split: Mapping[str, Sequence[str]]) -> list[PlanWarning]:
    """Spec section 14.4: ``--split-ratio r0,r1,...`` names one ratio per listed device of
    every layer-split module (``split``: module -> its devices, for the modules split by
    layers); warning ``split_ratio_unused`` when no module is split.

    Raises:
        PlanError: ``invalid_split_ratio`` (span: the whole value) when a split module's
            device count differs from the number of ratios.
    """
    ratio = pl.split_ratio
    if ratio is None:
        return []
    several = {m: list(d) for m, d in split.items() if len(d) > 1}
    if not several:
        return [PlanWarning("split_ratio_unused", f"--split-ratio {ratio.text()} has no effect: "
                            "no module runs on several devices")]
    if ratio.kind == "ratios":
        text = pl.texts.get("--split-ratio") or ratio.text()
        for m, devs in several.items():
            if len(devs) != len(ratio.ratios):
                raise PlanError("invalid_split_ratio", f"--split-ratio: {len(ratio.ratios)} "
                                f"ratios for {m}'s {len(devs)} devices ({' & '.join(devs)}); "
                                "give one per listed device, in --backend order",
                                flag="--split-ratio", text=text,
                                span=(0, len(text)) if pl.texts.get("--split-ratio") else None)
    return []


def cfg_plan(pl: Placement, idx: DeviceIndex, diffusion: Sequence[str] | None,
             target: Target, profile: Profile | None = None
             ) -> tuple[CfgPlan | None, list[PlanWarning]]:
    """Spec section 14.5: the parallel-CFG device of ``--backend cfg=DEVICE`` (exact name)
    and whether sd-cli uses it. It runs the unconditional pass on a second copy of the
    diffusion model; sd-cli keeps the sequential path (warning ``cfg_sequential``) when
    ``cfg`` names the diffusion device itself, with ControlNet or PhotoMaker in the model,
    and on the snapshot (which has no ``cfg`` key; the written flags leave it out); for
    sdplan's engine, with a family whose pipeline has no parallel CFG
    (:attr:`~sdplan.core.families.declaration.Family.parallel_cfg`).
    The command's own reasons are :func:`cfg_command_reasons`.

    Raises:
        PlanError: ``device_not_found`` or ``ambiguous_device`` for the named device.
    """
    if pl.cfg is None:
        return None, []
    name = idx.resolve(pl.cfg.refs[0], "--backend", pl.texts.get("--backend"))
    reasons = []
    if diffusion and name == diffusion[0]:
        reasons.append(f"cfg names the diffusion device {name} itself")
    for module, what in (("controlnet", "ControlNet"), ("photomaker", "PhotoMaker")):
        if profile is not None and profile.get(module) is not None:
            reasons.append(f"the model has {what}")
    if target.sdcli and target.dialect == "snapshot":
        reasons.append("the snapshot sd-cli has no parallel CFG")
    fam = family_of(profile.architecture) if profile is not None else None
    if not target.sdcli and fam is not None and not fam.parallel_cfg:
        reasons.append(f"sdplan's engine runs {fam.title}'s two passes one after another")
    return with_reasons(CfgPlan(name, True), reasons, "sd-cli" if target.sdcli else "sdplan's engine")


def with_reasons(cfg: CfgPlan, reasons: Collection[str], runner: str = "sd-cli") -> tuple[CfgPlan, list[PlanWarning]]:
    """``cfg`` made sequential for ``reasons`` (warning ``cfg_sequential`` each, saying that
    ``runner`` runs the unconditional pass sequentially), or as is."""
    if not reasons:
        return cfg, []
    out = CfgPlan(cfg.device, False, (*cfg.reasons, *reasons))
    return out, [PlanWarning("cfg_sequential", f"--backend cfg={cfg.device}: {runner} runs the "
                             f"unconditional pass sequentially ({r})") for r in reasons]


def cfg_command_reasons(generation: Mapping[str, object], flags: Collection[str],
                        model_files: Collection[str]) -> list[str]:
    """Why a pasted command keeps sd-cli's sequential CFG path (spec section 14.5): no
    unconditional pass (``--cfg-scale 1``), a two-stage model (its high-noise model runs
    sequentially), ControlNet, step caches (``--cache-mode``), PhotoMaker."""
    reasons = []
    if generation.get("cfg_scale") == 1:
        reasons.append("--cfg-scale 1 has no unconditional pass")
    if "--high-noise-diffusion-model" in flags or "high_noise_diffusion_model" in model_files:
        reasons.append("the high-noise model of a two-stage model runs sequentially")
    if "control_net" in model_files or "--control-net" in flags:
        reasons.append("ControlNet is used")
    if "--cache-mode" in flags:
        reasons.append("a step cache (--cache-mode) is used")
    if "photo_maker" in model_files or "--photo-maker" in flags:
        reasons.append("PhotoMaker is used")
    return reasons
