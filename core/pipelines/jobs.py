"""The engine jobs of image generation: what the engine process runs for a request.

Jobs run in the engine process (:class:`sdplan.core.runtime.process.Engine`), named by
:data:`GENERATE_JOB` and :data:`INVENTORY_JOB`. A *request* is a dict:

- ``model_files``: sd-cli model flags -> paths (``model``, ``diffusion_model``, ``t5xxl``,
  ``clip_l``, ``llm``, ``vae``, ``taesd``, ``upscale_model``);
- ``prompt``, ``negative_prompt``, ``width``, ``height``, ``steps``, ``cfg_scale``, ``seed``,
  ``sampling_method``, ``scheduler``, ``batch_count``, ``clip_skip``, ``guidance``,
  ``vae_tile_size``, ``upscale_repeats``, ``threads``; sd-cli's sampling options ``eta``,
  ``sigmas``, ``flow_shift``, ``timestep_shift``, ``rng``, ``sampler_rng``,
  ``extra_sample_args`` (:meth:`sdplan.core.sampling.options.SamplingOptions.from_request`);
- ``placements``: module -> ModulePlacement (the caller's resolved plan), or else
  ``backend`` / ``params_backend`` / ``max_vram`` / ``stream_layers`` strings resolved in
  the engine process against its live devices; ``rpc_servers``: endpoints added there;
- ``overrides``: ``clip_heads``, ``unet_heads``, ``unet_head_dim``, ``prediction``,
  ``flux_heads``, ``flux_axes``, ``t5_length`` (tiny models), ``chroma_use_dit_mask``,
  ``chroma_t5_mask_pad`` (sd-cli's Chroma model args); ``previews``: send previews
  (default True);
- ``force_sdxl_vae_conv_scale``: sd-cli's flag of that name (SDXL; default False);
- ``taesd_decode``: decode the final images with the ``taesd`` TAE instead of the VAE
  (sd-cli's ``--taesd`` without ``--taesd-preview-only``; default False: previews only;
  FLUX.2 klein honours it);
- ``ref_images``: reference-image paths (sd-cli's ``-r/--ref-image``; FLUX.2 klein edits).
- ``lora_model_dir``, ``lora_apply_mode``: where the prompt's ``<lora:NAME:W>`` files are
  and how they apply (:mod:`sdplan.core.pipelines.lora`); ``init_img``, ``mask``,
  ``strength``: image-to-image and inpainting (:mod:`sdplan.core.pipelines.img2img`). SD and
  the FLUX.1-family base (FLUX.1, Chroma, Z-Image) take them; FLUX.2 klein refuses them.

Messages: progress ``{"step", "total", "phase"}``, preview ``{"step", "total", "image"}``
(uint8 (H, W, 3)), and once ``{"phase": "threads", "threads", "reason"}`` (the CPU threads
chosen); the result is ``{"images": [uint8 (H, W, 3)], "params", "timings", "threads",
"segments"}`` (``segments``: module -> the ``--max-vram`` segments of its last run, for the
modules that were cut).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import ModelFileError
from sdplan.core.modelfiles.checkpoint import profile_from_model_flags, read_model_files
from sdplan.core.modelfiles.readers import file_version
from sdplan.core.pipelines.finite import explains_non_finite
from sdplan.core.pipelines.img2img import request_image_input
from sdplan.core.pipelines.job_names import GENERATE_JOB as GENERATE_JOB
from sdplan.core.pipelines.job_names import INVENTORY_JOB as INVENTORY_JOB
from sdplan.core.pipelines.lora import prompt_loras, refuse_inputs
from sdplan.core.pipelines.results import image_to_uint8
from sdplan.core.pipelines.sd import GenerateParams, StableDiffusion
from sdplan.core.planning.modules import MODEL_FILE_FLAGS
from sdplan.core.runtime.devices import live_inventory
from sdplan.core.runtime.runner import ModulePlacement
from sdplan.core.runtime.threads import check_between_steps, start_run
from sdplan.core.sampling.options import SamplingOptions
from sdplan.core.sampling.slg import SkipLayerGuidance, refuse_other_families

_CACHE: dict[str, Any] = {}  # the engine process's loaded pipeline, reused by the next request

# The other families' pipelines are imported by their run functions below: a request loads
# only its own family's code (SD 1.x / 2.x, the default, is imported here).


def inventory_job(ctx: Any, rpc_servers: Sequence[str] = ()) -> dict[str, Any]:
    """The engine process's live devices (after adding ``rpc_servers``) as Inventory JSON."""
    return live_inventory(rpc_servers=list(rpc_servers)).to_json()


def _files(req: Mapping[str, Any]) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for k, v in (req.get("model_files") or {}).items():
        key = k.lstrip("-").replace("-", "_")
        key = {"m": "model"}.get(key, key)
        files[key] = [str(p) for p in ([v] if isinstance(v, (str, Path)) else v)]
    if not files:
        raise ModelFileError("<request>", "no model files given")
    return files


def _placements(req: Mapping[str, Any], files: Mapping[str, list[str]]) -> dict[str, Any]:
    if req.get("placements"):
        return dict(req["placements"])
    from sdplan.core.planning.placement import Placement
    from sdplan.core.planning.plan import resolve

    placement = Placement.from_strings(req.get("backend") or "", req.get("params_backend") or "",
                                       req.get("max_vram") or "", stream_layers=bool(req.get("stream_layers")),
                                       rpc_servers=list(req.get("rpc_servers") or []))
    inventory = live_inventory(rpc_servers=list(placement.rpc_servers))
    plan = resolve(placement, inventory, profile_from_model_flags(files))
    return {m: ModulePlacement.from_plan(plan, m) for m in ("diffusion", "te", "vae")}


def _first(files: Mapping[str, list[str]], key: str) -> str | None:
    paths = files.get(key) or []
    return paths[0] if paths else None


def _stamps(files: Mapping[str, list[str]]) -> tuple[tuple[Any, ...], ...]:
    """Each model file's identity and version (path, device, inode, size, modification and
    change times, ns; the path alone when it cannot be read), for the pipeline cache's key: a
    file replaced or rewritten between requests loads again instead of reusing old weights."""
    out: list[tuple[Any, ...]] = []
    for key in sorted(files):
        for path in files[key]:
            try:
                st = os.stat(path)
            except OSError:
                out.append((key, path))
                continue
            out.append((key, path, *file_version(st)))
    return tuple(out)


def _cached(key: Any, make: Callable[[], Any]) -> Any:
    """The pipeline of the previous request when ``key`` matches, else a new one (the old is
    closed first: its weights are freed before the new ones load)."""
    if _CACHE.get("key") != key:
        old = _CACHE.pop("obj", None)
        _CACHE.clear()
        if old is not None:
            old.close()
        _CACHE["obj"] = make()
        _CACHE["key"] = key
    return _CACHE["obj"]


def _require(files: Mapping[str, Any], keys: Sequence[str], family: str) -> None:
    """Raise a one-line error naming sd-cli's flags for the ``keys`` (model-file keys such as
    ``diffusion_model``) that ``files`` lacks, for a run of ``family``.

    Raises:
        ModelFileError: a needed file is missing.
    """
    need = [k for k in keys if not files.get(k)]
    if need:
        spell = {f.key: f.spellings[0] for f in MODEL_FILE_FLAGS}
        flags = [spell.get(k, "--" + k) for k in keys]
        raise ModelFileError("<request>", f"a {family} run needs {', '.join(flags[:-1])} and {flags[-1]}; "
                                          f"missing {', '.join(spell.get(k, '--' + k) for k in need)}")


def _open(ctx: Any, key: Any, make: Callable[[], Any]) -> Any:
    """The cached pipeline for ``key`` (see :func:`_cached`), cancelled by this job's context."""
    pipe = _cached(key, make)
    pipe.set_cancel(ctx.cancel)
    return pipe


def _batch(ctx: Any, req: Mapping[str, Any], steps: int,
           one: Callable[[int, Callable[[int, np.ndarray], None]], Mapping[str, Any]]) -> tuple[list[np.ndarray], float]:
    """Run ``one(b, preview)`` for each of the request's ``batch_count`` images (``b`` = 0, 1...;
    ``preview(i, rgb)`` reports step ``i + 1`` of ``steps`` and its preview) and return the
    uint8 images and the seconds taken."""
    on_step, preview = _emitters(ctx, req)

    def cb(i: int, rgb: np.ndarray) -> None:
        on_step(i + 1, steps)
        if preview is not None:
            preview(i + 1, rgb)

    t0 = time.perf_counter()
    images = [image_to_uint8(one(b, cb)["image"][0]) for b in range(int(req.get("batch_count") or 1))]
    return images, time.perf_counter() - t0


@explains_non_finite  # a NaN/inf latent or picture: an error naming the likely cause
def generate_job(ctx: Any, request: Mapping[str, Any]) -> dict[str, Any]:
    """Run one request (see the comment above) in this process: SD 1.x/2.x, SDXL, or Flux /
    Chroma / Z-Image / FLUX.2 klein when the files are such a set. Returns ``{"images",
    "params", "timings", "threads", "segments"}``.

    Raises:
        ModelFileError / PlanError / EngineError: bad files, placement or devices;
        NonFiniteError: a latent or picture became NaN/inf (naming the likely cause);
        Cancelled: ``ctx.cancel`` fired; ValueError: bad sizes.
    """
    req = dict(request)
    files = _files(req)
    rpc = list(req.get("rpc_servers") or [])
    if rpc:
        ctx.add_rpc_servers(rpc)
    core = {k: v for k, v in files.items() if k not in ("taesd", "upscale_model")}
    placements = _placements(req, core)
    family = read_model_files(core).architecture.family
    refuse_other_families(family, req)  # the generate command refuses it first; other callers here
    run = {"flux": _flux_run, "chroma": _chroma_run, "z_image": _zimage_run, "flux2_klein": _klein_run,
           "flux2": _flux2_dev_run, "sd3": _sd3_run}.get(family, _sd_run)
    seed = int(req.get("seed", 42))
    if seed < 0:
        seed = random.randrange(2**31)
    threads = start_run(ctx.pool().manager, int(req.get("threads") or 0), ctx.progress)
    req["threads"] = 0  # computes use the backends' count just set: a change reloads nothing
    t0 = time.perf_counter()
    images, timings, info = run(ctx, req, files, core, placements, seed)
    obj = _CACHE.get("obj")
    runners = obj.sd.runners if isinstance(obj, _SdSession) else getattr(obj, "runners", {})
    segments = {m: r.last_segments for m, r in runners.items() if r.last_segments}
    upscaler = _first(files, "upscale_model")
    if upscaler:
        ctx.progress(phase="upscale")
        images = _upscale(ctx, upscaler, placements["vae"], images, int(req.get("upscale_repeats") or 1),
                          int(req.get("threads") or 0))
    timings["total"] = time.perf_counter() - t0
    params = {k: req.get(k) for k in ("prompt", "negative_prompt", "width", "height", "steps", "cfg_scale",
                                      "sampling_method", "scheduler", "batch_count", "clip_skip")}
    params.update(seed=seed, architecture=family if run is not _sd_run or family == "sdxl" else "sd", **info)
    return {"images": images, "params": params, "timings": timings, "segments": segments,
            "threads": {"threads": threads.threads, "reason": threads.reason}}


def _inputs(pipe: Any, req: Mapping[str, Any], width: int, height: int) -> tuple[str, Any, dict[str, Any]]:
    """The prompt without its LoRA tags, the image input, and what they applied (LoRAs with
    mode and keys that patch nothing; strength) after patching ``pipe`` with the LoRAs."""
    prompt, loras = prompt_loras(req.get("prompt") or "", req.get("lora_model_dir"), pipe.lora_aliases())
    mode = pipe.set_loras(loras, req.get("lora_apply_mode") or "auto")
    init = request_image_input(dict(req), width, height)
    info = _picture_info(req, init)
    if loras:
        info.update(loras=pipe.loras.describe(), lora_apply_mode=mode, lora_unknown_keys=pipe.loras.unknown())
    return prompt, init, info


def _picture_info(req: Mapping[str, Any], init: Any) -> dict[str, Any]:
    """What an image input applied (strength, init picture, mask); empty without one."""
    if init is None:
        return {}
    return {"strength": init.strength, "init_img": req.get("init_img"), "mask": req.get("mask")}


def _emitters(ctx: Any, req: Mapping[str, Any]) -> tuple[Callable[..., None], Callable[[int, np.ndarray], None] | None]:
    total = {"n": int(req.get("steps") or 0)}

    def on_step(step: int, n: int, *_: Any) -> None:
        total["n"] = n
        check_between_steps(ctx.progress)
        ctx.progress(step=step, total=n, phase="sampling")

    def preview(step: int, rgb: np.ndarray) -> None:
        ctx.preview({"step": step, "total": total["n"], "image": np.ascontiguousarray(rgb, dtype=np.uint8)})

    return on_step, (preview if req.get("previews", True) else None)


def _sd_run(ctx: Any, req: Mapping[str, Any], files: Mapping[str, list[str]], core: Mapping[str, list[str]],
            placements: Mapping[str, Any], seed: int) -> tuple[list[np.ndarray], dict[str, float], dict[str, Any]]:
    ov = dict(req.get("overrides") or {})
    threads = int(req.get("threads") or 0)
    taesd = _first(files, "taesd")
    key = ("sd", repr(sorted(core.items())), repr(sorted(placements.items())), repr(sorted(ov.items())),
           threads, taesd, bool(req.get("force_sdxl_vae_conv_scale")))

    def make() -> Any:
        return _SdSession(core, placements, ov, threads, taesd, ctx.pool(),
                          bool(req.get("force_sdxl_vae_conv_scale")))

    sess = _cached((key, _stamps(files)), make)
    sess.sd.set_cancel(ctx.cancel)
    if sess.tae is not None:
        for r in sess.tae.runners.values():
            r.cancel = ctx.cancel
    width, height = int(req.get("width", 512)), int(req.get("height", 512))
    prompt, init, info = _inputs(sess.sd, req, width, height)
    p = GenerateParams(prompt, req.get("negative_prompt") or "", width,
                       height, int(req.get("steps", 20)), float(req.get("cfg_scale", 7.0)),
                       seed, req.get("sampling_method") or "euler_a", req.get("scheduler") or "discrete",
                       int(req.get("batch_count") or 1), max(int(req.get("clip_skip") or 0), 0),
                       SamplingOptions.from_request(req))
    on_step, preview = _emitters(ctx, req)
    images = sess.sd.txt2img(p, on_step, preview, vae_tile=int(req.get("vae_tile_size") or 0) or None,
                             preview_decoder=sess.tae.preview if sess.tae is not None else None,
                             decoder=sess.tae.decode if sess.tae is not None and req.get("taesd_decode")
                             else None, init=init)
    return images, dict(sess.sd.timings), info


class _SdSession:
    """A loaded SD pipeline and its optional TAESD preview decoder (on the VAE's main device,
    weights resident)."""

    def __init__(self, files: Mapping[str, list[str]], placements: Mapping[str, Any], ov: Mapping[str, Any],
                 threads: int, taesd: str | None, pool: Any, force_vae_conv_scale: bool = False) -> None:
        kw = {k: ov[k] for k in ("clip_heads", "unet_heads", "unet_head_dim", "prediction", "family") if ov.get(k)}
        if read_model_files(files).architecture.family == "sdxl":
            from sdplan.core.pipelines.sdxl import StableDiffusionXL

            self.sd = StableDiffusionXL(dict(files), None, pool, threads, placements=placements,
                                        force_vae_conv_scale=force_vae_conv_scale, **kw)
        else:
            self.sd = StableDiffusion(dict(files), None, pool, threads, placements=placements, **kw)
        self.tae = None
        if taesd:
            from sdplan.core.pipelines.tae import Tae

            try:
                self.tae = Tae(taesd, placement=ModulePlacement(placements["vae"].devices[:1]), pool=pool,
                               n_threads=threads)
            except BaseException:
                self.sd.close()
                raise

    def close(self) -> None:
        if self.tae is not None:
            self.tae.close()
        self.sd.close()


def _flux_run(ctx: Any, req: Mapping[str, Any], files: Mapping[str, list[str]], core: Mapping[str, list[str]],
              placements: Mapping[str, Any], seed: int) -> tuple[list[np.ndarray], dict[str, float], dict[str, Any]]:
    from sdplan.core.pipelines.flux import FluxModels, FluxPipeline
    from sdplan.core.sampling.flow import DEFAULT_STEPS

    _require(files, ("diffusion_model", "t5xxl", "clip_l", "vae"), "Flux")
    ov = dict(req.get("overrides") or {})
    axes = ov.get("flux_axes")
    models = FluxModels(files["diffusion_model"][0], files["t5xxl"][0], files["clip_l"][0], files["vae"][0],
                        _first(files, "taesd"), ov.get("flux_heads"),
                        tuple(axes) if axes else None, ov.get("clip_heads"))
    threads = int(req.get("threads") or 0)
    key = ("flux", repr(models), repr(sorted(placements.items())), threads)
    pipe = _open(ctx, (key, _stamps(files)), lambda: FluxPipeline(models, None, ctx.pool(), placements, threads, cancel=ctx.cancel))
    steps = int(req.get("steps") or 0) or DEFAULT_STEPS[pipe.dit.cfg.variant]
    width, height = int(req.get("width", 1024)), int(req.get("height", 1024))
    prompt, init, info = _inputs(pipe, req, width, height)
    images, seconds = _batch(ctx, req, steps, lambda b, cb: pipe.txt2img(
        prompt, width, height, steps=steps, seed=seed + b, sampler=req.get("sampling_method") or "euler",
        guidance=float(req.get("guidance") or 3.5), t5_length=int(ov.get("t5_length") or 256), preview=cb,
        init=init, init_seed=seed, scheduler=req.get("scheduler") or "default",
        sampling=SamplingOptions.from_request(req)))
    return images, {"total_flux": seconds}, info


def _chroma_run(ctx: Any, req: Mapping[str, Any], files: Mapping[str, list[str]], core: Mapping[str, list[str]],
                placements: Mapping[str, Any], seed: int) -> tuple[list[np.ndarray], dict[str, float], dict[str, Any]]:
    from sdplan.core.pipelines.chroma import ChromaModels, ChromaPipeline

    _require(files, ("diffusion_model", "t5xxl", "vae"), "Chroma")
    ov = dict(req.get("overrides") or {})
    axes = ov.get("flux_axes")
    models = ChromaModels(files["diffusion_model"][0], files["t5xxl"][0], files["vae"][0], _first(files, "taesd"),
                          ov.get("flux_heads"), tuple(axes) if axes else None)
    threads = int(req.get("threads") or 0)
    key = ("chroma", repr(models), repr(sorted(placements.items())), threads)
    pipe = _open(ctx, (key, _stamps(files)), lambda: ChromaPipeline(models, None, ctx.pool(), placements, threads, cancel=ctx.cancel))
    steps = int(req.get("steps") or 0) or 20
    width, height = int(req.get("width", 1024)), int(req.get("height", 1024))
    prompt, init, info = _inputs(pipe, req, width, height)
    images, seconds = _batch(ctx, req, steps, lambda b, cb: pipe.txt2img(
        prompt, width, height, negative_prompt=req.get("negative_prompt") or "",
        cfg_scale=float(req.get("cfg_scale", 4.0)), steps=steps, seed=seed + b,
        sampler=req.get("sampling_method") or "euler", t5_length=int(ov.get("t5_length") or 512),
        mask_pad=int(ov.get("chroma_t5_mask_pad", 1)), dit_mask=bool(ov.get("chroma_use_dit_mask", True)),
        preview=cb, init=init, init_seed=seed))
    return images, {"total_chroma": seconds}, info


def _zimage_run(ctx: Any, req: Mapping[str, Any], files: Mapping[str, list[str]], core: Mapping[str, list[str]],
                placements: Mapping[str, Any], seed: int) -> tuple[list[np.ndarray], dict[str, float], dict[str, Any]]:
    from sdplan.core.pipelines.z_image import ZImageModels, ZImagePipeline

    _require(files, ("diffusion_model", "llm", "vae"), "Z-Image")
    models = ZImageModels(files["diffusion_model"][0], files["llm"][0], files["vae"][0], _first(files, "taesd"))
    threads = int(req.get("threads") or 0)
    key = ("z_image", repr(models), repr(sorted(placements.items())), threads)
    pipe = _open(ctx, (key, _stamps(files)), lambda: ZImagePipeline(models, None, ctx.pool(), placements, threads, cancel=ctx.cancel))
    steps = int(req.get("steps") or 0) or 8
    width, height = int(req.get("width", 1024)), int(req.get("height", 1024))
    prompt, init, info = _inputs(pipe, req, width, height)
    images, seconds = _batch(ctx, req, steps, lambda b, cb: pipe.txt2img(
        prompt, width, height, steps=steps, seed=seed + b, sampler=req.get("sampling_method") or "euler",
        cfg_scale=float(req.get("cfg_scale") or 1.0), negative_prompt=req.get("negative_prompt") or "",
        preview=cb, init=init, init_seed=seed))
    return images, {"total_z_image": seconds}, info


def _klein_run(ctx: Any, req: Mapping[str, Any], files: Mapping[str, list[str]], core: Mapping[str, list[str]],
               placements: Mapping[str, Any], seed: int) -> tuple[list[np.ndarray], dict[str, float], dict[str, Any]]:
    from sdplan.core.pipelines.flux2 import KleinModels, KleinPipeline, load_ref_image

    refuse_inputs(req, "FLUX.2 klein")
    one = _first(files, "model")  # a single file holding all three
    paths = {k: _first(files, k) or one for k in ("diffusion_model", "llm", "vae")}
    _require(paths, tuple(paths), "FLUX.2 klein")
    ov = dict(req.get("overrides") or {})
    axes = ov.get("flux_axes")
    models = KleinModels(paths["diffusion_model"], paths["llm"], paths["vae"], _first(files, "taesd"),  # type: ignore[arg-type]
                         tuple(axes) if axes else None)
    refs = [load_ref_image(p) for p in req.get("ref_images") or ()]
    threads = int(req.get("threads") or 0)
    key = ("flux2_klein", repr(models), repr(sorted(placements.items())), threads)
    pipe = _open(ctx, (key, _stamps(files)), lambda: KleinPipeline(models, None, ctx.pool(), placements, threads, cancel=ctx.cancel))
    steps = int(req.get("steps") or 0) or 4
    images, seconds = _batch(ctx, req, steps, lambda b, cb: pipe.txt2img(
        req.get("prompt") or "", int(req.get("width", 1024)), int(req.get("height", 1024)),
        steps=steps, seed=seed + b, sampler=req.get("sampling_method") or "euler",
        cfg_scale=float(req.get("cfg_scale") or 1.0), negative_prompt=req.get("negative_prompt") or "",
        ref_images=refs, preview=cb, tae_decode=bool(req.get("taesd_decode") and models.taesd),
        scheduler=req.get("scheduler") or "default", sampling=SamplingOptions.from_request(req)))
    return images, {"total_flux2_klein": seconds}, {}


def _sd3_run(ctx: Any, req: Mapping[str, Any], files: Mapping[str, list[str]], core: Mapping[str, list[str]],
             placements: Mapping[str, Any], seed: int) -> tuple[list[np.ndarray], dict[str, float], dict[str, Any]]:
    from sdplan.core.pipelines.sd3 import Sd3Pipeline

    refuse_inputs(req, "SD3", pictures=False)
    ov = dict(req.get("overrides") or {})
    threads = int(req.get("threads") or 0)
    sd3_files = {k: v for k, v in files.items() if k != "upscale_model"}
    key = ("sd3", repr(sorted(sd3_files.items())), repr(sorted(placements.items())), threads, ov.get("clip_heads"))
    pipe = _open(ctx, (key, _stamps(files)), lambda: Sd3Pipeline(sd3_files, None, ctx.pool(), placements, threads, cancel=ctx.cancel,
                                               clip_heads=ov.get("clip_heads")))
    steps = int(req.get("steps") or 0) or 20
    width, height = int(req.get("width", 1024)), int(req.get("height", 1024))
    init = request_image_input(dict(req), width, height)
    images, seconds = _batch(ctx, req, steps, lambda b, cb: pipe.txt2img(
        req.get("prompt") or "", width, height, negative_prompt=req.get("negative_prompt") or "",
        cfg_scale=float(req.get("cfg_scale", 7.0)), steps=steps, seed=seed + b,
        sampler=req.get("sampling_method") or "euler", clip_skip=int(req.get("clip_skip") or 0), preview=cb,
        scheduler=req.get("scheduler") or "default", sampling=SamplingOptions.from_request(req),
        slg=SkipLayerGuidance.from_request(req), init=init, init_seed=seed))
    return images, {"total_sd3": seconds}, _picture_info(req, init)


def _flux2_dev_run(*_: Any) -> tuple[list[np.ndarray], dict[str, float], dict[str, Any]]:
    raise ModelFileError("<request>", "FLUX.2 [dev] (48 single blocks, Mistral Small 3.2 text encoder) is "
                                      "recognised but sdplan generates with FLUX.2 klein only")


def _upscale(ctx: Any, path: str, vae: Any, images: list[np.ndarray], repeats: int, threads: int) -> list[np.ndarray]:
    """Upscale uint8 images with the ESRGAN file on the VAE's main device (resident weights)."""
    from sdplan.core.pipelines.upscale import Upscaler

    with Upscaler(path, placement=ModulePlacement(vae.devices[:1]), pool=ctx.pool(), n_threads=threads) as up:
        up.runner.cancel = ctx.cancel
        return [up.upscale_image(img, repeats) for img in images]


