"""The engine's entry for SDXL (the registry's ``pipeline``): the UNet run of
:func:`sdplan.core.pipelines.sd.generate.run_unet` on a
:class:`~sdplan.core.pipelines.sdxl.pipeline.StableDiffusionXL` (and its refiner), with
sd-cli's ``--force-sdxl-vae-conv-scale``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.run_context import FamilyResult, RunContext
from sdplan.core.pipelines.sd.generate import run_unet
from sdplan.core.pipelines.sdxl.pipeline import StableDiffusionXL
from sdplan.core.runtime.placement import ModulePlacement

__all__ = ["generate", "work"]


def generate(request: GenerationRequest, plan: Mapping[str, ModulePlacement], progress: RunContext) -> FamilyResult:
    """Generate the request's pictures with SDXL (base or refiner).

    Raises:
        ModelFileError / EngineError / SdplanError: bad files, devices, LoRAs or pictures.
    """
    scale = request.force_sdxl_vae_conv_scale

    def make(files: dict[str, list[str]], kw: dict[str, Any]) -> Any:
        return StableDiffusionXL(files, None, kw.pop("pool"), 0, force_vae_conv_scale=scale, **kw)

    return run_unet(request, plan, progress, make, key=("sdxl", scale))


def work(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
         pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
         vae_tile: tuple[int, int] | None = None) -> dict[str, list[Any]]:
    """The work of an SDXL generation's graphs (base or refiner), per module as
    :class:`~sdplan.core.planning.work.ModuleWork` (:mod:`sdplan.core.pipelines.work`): each
    text encoder (CLIP ViT-L and OpenCLIP bigG; the refiner has bigG alone) on one 77-token
    chunk once per prompt, twice with CFG's negative prompt; the UNet once per sampler
    evaluation on the CFG batch with its ``vec`` vector (with a parallel-CFG copy among
    ``placements``: a batch per half, run at the same time, group ``cfg``); a ControlNet on
    the conditional batch, its residuals serving both halves; the VAE decoder once per picture
    batch (or on one tile of ``vae_tile`` ``(w, h)`` latent pixels per tile).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    from sdplan.core.pipelines.sdxl.conditioner import _skip
    from sdplan.core.planning.work import ModuleWork
    from sdplan.core.runtime.placement import CFG_RUNNER

    sd = StableDiffusionXL(dict(model_files), None, pool, placements=placements,
                           clip_heads=overrides.get("clip_heads") or None)
    try:
        copy = sd.runners.get(CFG_RUNNER) if cfg else None  # parallel CFG: a batch per half
        lh, lw = height // sd.vae_cfg.factor, width // sd.vae_cfg.factor
        th, tw = (vae_tile[1], vae_tile[0]) if vae_tile else (lh, lw)
        n = batch * (2 if cfg and copy is None else 1)
        clip = {"ids": (1, 77), "mask": (77, 77)}
        te = [ModuleWork("te", "text", r.work({**clip, "eos": (1,)} if name == "clip_g" else clip), 2 if cfg else 1)
              for name, r in sd.cond._runners(_skip(0)).items()]
        unet: dict[str, tuple[int, ...]] = {"x": (n, sd.unet_cfg.in_channels, lh, lw), "t": (n,),
                                            "c": (n, 77, sd.unet_cfg.context_dim),
                                            "vec": (n, sd.unet_cfg.adm_in_channels)}
        out: dict[str, list[Any]] = {"te": te}
        control = list(model_files.get("control_net") or ())
        if control:
            from sdplan.core.pipelines.stages.control import ControlNetStage

            stage = ControlNetStage(sd, control[0], (placements or {}).get("controlnet") or ModulePlacement(("CPU",)))
            sd.runners["controlnet"] = stage.runner
            unet.update(stage.output_shapes(n, lh, lw))
            out["controlnet"] = [ModuleWork("controlnet", "step", stage.runner.work(stage.input_shapes(batch, lh, lw)), 1)]
        group = "cfg" if copy is not None else ""
        out["diffusion"] = [ModuleWork("diffusion", "step", sd.runners["diffusion"].work(unet), 1, group=group)]
        if copy is not None:
            out["diffusion"].append(ModuleWork("diffusion", "step", copy.work(unet), 1, group="cfg"))
        out["vae"] = [ModuleWork("vae", "decode", sd.runners["vae"].work(
            {"z": (batch, sd.unet_cfg.out_channels, th, tw)}), 1)]
        return out
    finally:
        sd.close()
