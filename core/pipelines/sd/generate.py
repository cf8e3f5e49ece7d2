"""The engine's entry for SD 1.x / 2.x (the registry's ``pipeline``, ``dry_run`` and ``work``).

:func:`generate` runs a checked :class:`~sdplan.core.pipelines.request.GenerationRequest` on
a :class:`~sdplan.core.pipelines.sd.pipeline.StableDiffusion` placed by the run's plan (kept
loaded for the next request with the same files, placements and model overrides), with its
LoRAs, image input, TAE previews or decode and VAE tiles. :func:`run_unet` is the same for
any UNet pipeline (SDXL's passes its own). :func:`measure` is the compute dry run, :func:`work`
the work count of the same graphs (:func:`unet_work`, SDXL's too).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.run_context import FamilyResult, RunContext
from sdplan.core.pipelines.sd.pipeline import GenerateParams, StableDiffusion
from sdplan.core.pipelines.stages.hires import hires_upscaler
from sdplan.core.pipelines.stages.lora import apply_request_loras
from sdplan.core.runtime.placement import CFG_RUNNER, ModulePlacement

__all__ = ["generate", "run_unet", "measure", "work", "unet_work", "UnetSession"]


class UnetSession:
    """A loaded UNet pipeline and its optional TAE (on the VAE's main device, weights
    resident), closed together."""

    def __init__(self, sd: Any, taesd: str | None, placements: Mapping[str, ModulePlacement], pool: Any,
                 control_net: str | None = None) -> None:
        self.sd = sd
        self.tae = None
        self.control = None
        if control_net:  # the controlnet module: its own placement (else the UNet's device)
            from sdplan.core.pipelines.stages.control import ControlNetStage

            place = placements.get("controlnet") or ModulePlacement(placements["diffusion"].devices[:1])
            try:
                self.control = ControlNetStage(sd, control_net, place)
            except BaseException:
                sd.close()
                raise
            sd.runners["controlnet"] = self.control.runner
        if taesd:
            from sdplan.core.pipelines.stages.tae import Tae

            try:
                self.tae = Tae(taesd, placement=ModulePlacement(placements["vae"].devices[:1]), pool=pool)
            except BaseException:
                sd.close()
                raise

    @property
    def runners(self) -> dict[str, Any]:
        return dict(self.sd.runners)

    def set_cancel(self, token: Any) -> None:
        self.sd.set_cancel(token)
        if self.tae is not None:
            for r in self.tae.runners.values():
                r.cancel = token

    def close(self) -> None:
        if self.tae is not None:
            self.tae.close()
        self.sd.close()


def run_unet(request: GenerationRequest, plan: Mapping[str, ModulePlacement], progress: RunContext,
             make: Callable[[dict[str, list[str]], dict[str, Any]], Any], key: tuple[Any, ...] = ()) -> FamilyResult:
    """Run ``request`` on a UNet pipeline ``make(files, keywords)`` (module docstring)."""
    ov = request.overrides
    kw = {k: v for k, v in ov.to_mapping().items() if k in ("clip_heads", "unet_heads", "unet_head_dim", "prediction")}
    taesd = request.file("taesd")
    files = request.model_set
    sess = progress.cached(("unet", key, repr(sorted(files.items())), repr(sorted(plan.items())),
                            repr(sorted(kw.items())), taesd, request.control_net),
                           lambda: UnetSession(make(files, {**kw, "placements": dict(plan), "pool": progress.pool()}),
                                               taesd, plan, progress.pool(), request.control_net))
    prompt, init, info = apply_request_loras(sess.sd, request)
    p = GenerateParams(prompt, request.negative_prompt, int(request.width or 0), int(request.height or 0),
                       int(request.steps or 0), float(request.cfg_scale or 0.0), request.seed,
                       str(request.sampling_method), request.scheduler, request.batch_count, request.clip_skip,
                       request.sampling)
    tae = sess.tae
    control = None
    if sess.control is not None and request.control.image:
        from sdplan.core.pipelines.stages.control import control_picture

        f = sess.sd.vae_cfg.factor  # the hint encoder divides by 8 whatever the VAE's factor
        hint = control_picture(request.control.image, p.width // f * 8, p.height // f * 8, request.control.canny)
        control = (sess.control, hint, request.control.strength)
    with hires_upscaler(request, plan, progress.pool(), progress.cancel) as upscaler:
        images = sess.sd.txt2img(p, lambda step, n, *_: progress.step(step, n), progress.preview,
                                 vae_tile=request.vae_tiling,
                                 preview_decoder=tae.preview if tae is not None else None,
                                 decoder=tae.decode if tae is not None and request.taesd_decode else None, init=init,
                                 hires=request.hires, upscaler=upscaler, control=control)
    if request.hires.active:
        info = {**info, "hires_size": [int(images[0].shape[1]), int(images[0].shape[0])]}
    return {"images": images, "timings": dict(sess.sd.timings), "info": {**info, **sess.sd.run_info()}, "runners": sess.runners}


def generate(request: GenerationRequest, plan: Mapping[str, ModulePlacement], progress: RunContext) -> FamilyResult:
    """Generate the request's pictures with SD 1.x / 2.x (or a UNet of sd-cli's names that no
    rule recognises). Returns images, timings, what the inputs applied, the runners.

    Raises:
        ModelFileError / EngineError / SdplanError: bad files, devices, LoRAs or pictures.
    """
    def make(files: dict[str, list[str]], kw: dict[str, Any]) -> Any:
        return StableDiffusion(files, None, kw.pop("pool"), 0, **kw)

    return run_unet(request, plan, progress, make)


def _graphs(sd: Any, model_files: Mapping[str, list[str]], width: int, height: int, batch: int, cfg: bool,
            placements: Mapping[str, Any] | None, vae_tile: tuple[int, int] | None
            ) -> tuple[dict[str, list[tuple[Any, dict[str, tuple[int, ...]]]]], Any]:
    """Module -> its graphs' ``(runner, input shapes)`` a UNet generation runs (SD 1.x / 2.x's
    or SDXL's: each text encoder on one 77-token chunk, :func:`_text_graphs`; the UNet on the
    CFG batch, with SDXL's ``vec`` vector; the VAE decoder on the batch or on one tile of
    ``vae_tile`` ``(w, h)`` latent pixels; with a ``control_net`` file the ControlNet on the
    batch, its residuals added to the UNet's inputs), and the ControlNet stage (None without
    one)."""
    lh, lw = height // sd.vae_cfg.factor, width // sd.vae_cfg.factor
    th, tw = (vae_tile[1], vae_tile[0]) if vae_tile else (lh, lw)
    n = batch * (2 if cfg else 1)
    unet: dict[str, tuple[int, ...]] = {"x": (n, sd.unet_cfg.in_channels, lh, lw), "t": (n,),
                                        "c": (n, 77, sd.unet_cfg.context_dim)}
    if sd.unet_cfg.adm_in_channels:  # SDXL's vector conditioning
        unet["vec"] = (n, sd.unet_cfg.adm_in_channels)
    graphs: dict[str, list[tuple[Any, dict[str, tuple[int, ...]]]]] = {
        "te": _text_graphs(sd), "diffusion": [(sd.runners["diffusion"], unet)],
        "vae": [(sd.runners["vae"], {"z": (batch, sd.unet_cfg.out_channels, th, tw)})]}
    control = list(model_files.get("control_net") or ())
    stage = None
    if control:  # its residuals are UNet inputs too; it runs once for both CFG halves
        from sdplan.core.pipelines.stages.control import ControlNetStage

        place = (placements or {}).get("controlnet") or ModulePlacement(("CPU",))
        stage = ControlNetStage(sd, control[0], place)
        sd.runners["controlnet"] = stage.runner
        unet.update(stage.output_shapes(n, lh, lw))
    return graphs, stage


def _text_graphs(sd: Any) -> list[tuple[Any, dict[str, tuple[int, ...]]]]:
    """Each text encoder's runner and input shapes on one 77-token chunk at the default clip
    skip: SD 1.x / 2.x's one CLIP; SDXL's CLIP ViT-L and OpenCLIP bigG (the refiner's bigG
    alone), bigG with its end-of-text row."""
    from sdplan.core.pipelines.sdxl.pipeline import StableDiffusionXL

    clip: dict[str, tuple[int, ...]] = {"ids": (1, 77), "mask": (77, 77)}
    if not isinstance(sd, StableDiffusionXL):
        return [(sd._te(sd._skip(0), True), clip)]
    return [(r, {**clip, "eos": (1,)} if name == "clip_g" else clip)
            for name, r in sd.cond._runners(sd._skip(0)).items()]


def measure(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
            pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
            vae_tile: tuple[int, int] | None = None) -> dict[str, int]:
    """Compute-buffer bytes per module of an SD 1.x / 2.x generation (the graphs of
    :func:`_graphs`: the text encoder on one 77-token chunk, the UNet on the CFG batch, the
    VAE decoder on the batch, or on one tile of ``vae_tile`` ``(w, h)`` latent pixels; with a
    ``control_net`` file the ControlNet on the batch and the UNet with its residuals as
    inputs), by a dry-run reserve on ``pool``'s backends (:mod:`sdplan.core.pipelines.compute`).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    sd = StableDiffusion(dict(model_files), None, pool, placements=placements)
    try:
        shapes, stage = _graphs(sd, model_files, width, height, batch, cfg, placements, vae_tile)
        out: dict[str, int] = {}
        if stage is not None:
            out["controlnet"] = stage.measure(batch, height // sd.vae_cfg.factor, width // sd.vae_cfg.factor)
        out.update({module: sum(sum(runner.measure(inputs).values()) for runner, inputs in runs)
                    for module, runs in shapes.items()})
        return out
    finally:
        sd.close()


def work(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
         pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
         vae_tile: tuple[int, int] | None = None) -> dict[str, list[Any]]:
    """The work of an SD 1.x / 2.x generation's graphs (those :func:`measure` reserves):
    :func:`unet_work` of its :class:`~sdplan.core.pipelines.sd.pipeline.StableDiffusion`.

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    sd = StableDiffusion(dict(model_files), None, pool, placements=placements,
                         clip_heads=overrides.get("clip_heads") or None)
    return unet_work(sd, model_files, width=width, height=height, batch=batch, cfg=cfg, placements=placements,
                     vae_tile=vae_tile)


def unet_work(sd: Any, model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
              placements: Mapping[str, Any] | None, vae_tile: tuple[int, int] | None) -> dict[str, list[Any]]:
    """The work of a UNet pipeline's generation (``sd``: SD 1.x / 2.x's or SDXL's, closed
    here), per module as :class:`~sdplan.core.planning.work.ModuleWork` (the graphs of
    :func:`_graphs`): each text encoder once per prompt (twice with CFG's negative prompt), the
    UNet once per sampler evaluation on the CFG batch (with a parallel-CFG copy among
    ``placements``, ``--backend cfg=DEVICE``: the conditional half on the UNet's devices and
    the unconditional half on the copy's, one :attr:`~sdplan.core.planning.work.ModuleWork.group`
    run at the same time; a ControlNet on the conditional batch, its residuals serving both
    halves), the VAE decoder once per picture batch (:mod:`sdplan.core.pipelines.work`).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    from sdplan.core.planning.work import ModuleWork

    try:
        copy = sd.runners.get(CFG_RUNNER) if cfg else None  # parallel CFG: a batch per half
        graphs, stage = _graphs(sd, model_files, width, height, batch, cfg and copy is None, placements, vae_tile)
        phase = {"te": ("text", 2 if cfg else 1), "diffusion": ("step", 1), "vae": ("decode", 1)}
        together = {"diffusion": "cfg"} if copy is not None else {}
        out = {m: [ModuleWork(m, phase[m][0], runner.work(inputs), phase[m][1], group=together.get(m, ""))
                   for runner, inputs in runs]
               for m, runs in graphs.items()}
        if copy is not None:
            out["diffusion"].append(ModuleWork("diffusion", "step", copy.work(graphs["diffusion"][0][1]), 1, group="cfg"))
        if stage is not None:
            lh, lw = height // sd.vae_cfg.factor, width // sd.vae_cfg.factor  # the conditional batch alone
            out["controlnet"] = [ModuleWork("controlnet", "step", stage.runner.work(stage.input_shapes(batch, lh, lw)), 1)]
        return out
    finally:
        sd.close()
