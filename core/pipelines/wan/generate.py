"""The engine's entry for Wan (the registry's ``pipeline`` and ``dry_run``): a checked request on
a :class:`~sdplan.core.pipelines.wan.pipeline.WanPipeline` placed by the run's plan (kept loaded
for the next request with the same files and placements), the video's frames as the run's
pictures (``-M vid_gen``; one frame without it), and the compute dry run of its graphs.
Image to video (Wan 2.2 I2V-A14B, and TI2V-5B with ``-i``) reads the ``-i`` picture at the
video's size (:func:`~sdplan.core.pipelines.wan.i2v.start_picture`) before anything loads.

Both experts of an A14B pair stay resident when, on every device the diffusion module runs on,
the free memory plus what this pipeline holds there already covers the bytes every module's
placement puts there (the estimate's rule, :mod:`sdplan.core.planning.phases`); otherwise the
high-noise expert is released after its phase.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from sdplan.core.errors import InvalidArgument
from sdplan.core.models.wan_vae import latent_frames, video_frames
from sdplan.core.pipelines.request import GenerationRequest
from sdplan.core.pipelines.run_context import FamilyResult, RunContext
from sdplan.core.pipelines.wan.pipeline import HighNoise, WanModels, WanPipeline
from sdplan.core.pipelines.work import input_shapes
from sdplan.core.runtime.placement import ModulePlacement
from sdplan.core.text.umt5_tokenizer import WAN_MAX_LENGTH

__all__ = ["generate", "measure", "both_fit"]


def both_fit(pipe: WanPipeline, free: Mapping[str, int]) -> bool:
    """Whether both experts can stay resident: residency ``runtime`` and, on each device of
    the diffusion placement, ``free[device]`` plus this pipeline's bytes there now at least the
    bytes every runner's placement puts there (without compute buffers)."""
    place = pipe.placements["diffusion"]
    if place.params_mode != "runtime" or "diffusion_high" not in pipe.runners:
        return place.params_mode == "runtime"
    need: dict[str, int] = {}
    held: dict[str, int] = {}
    for r in pipe.runners.values():
        for dev, n in r.placed_bytes().items():
            need[dev] = need.get(dev, 0) + n
        for dev, m in r.memory().items():
            held[dev] = held.get(dev, 0) + m.weights
    return all(need.get(d, 0) <= free.get(d, 0) + held.get(d, 0) for d in place.devices)


def _free_memory(devices: tuple[str, ...]) -> dict[str, int]:
    from sdplan.core.runtime.devices import live_inventory

    return {d.name: d.free for d in live_inventory() if d.name in devices}


def generate(request: GenerationRequest, plan: Mapping[str, ModulePlacement], progress: RunContext) -> FamilyResult:
    """Generate the request's video (or one frame) with Wan.

    Raises:
        ModelFileError / EngineError / SdplanError: bad files, devices or sizes.
        InvalidArgument: an unreadable ``-i`` picture, or ``--strength`` set with it (sd-cli's
            Wan image to video takes the picture as the first frame, no strength).
    """
    picture = None
    if request.init_img:
        from sdplan.core.pipelines.wan.i2v import start_picture

        if request.strength != 0.75:  # sd-cli's default, which it ignores here
            raise InvalidArgument(f"--strength {request.strength:g}: Wan image to video takes the -i picture as "
                                  "its first frame, not a strength; remove it")
        picture = start_picture(request.init_img, int(request.width or 0), int(request.height or 0))
    models = WanModels(request.file("diffusion_model"), request.file("t5xxl"), request.file("vae"),  # type: ignore[arg-type]
                       request.file("high_noise_diffusion_model"))
    pipe = progress.cached(("wan", repr(models), repr(sorted(plan.items()))),
                           lambda: WanPipeline(models, None, progress.pool(), dict(plan), 0, cancel=progress.cancel))
    v = request.video
    if "diffusion_high" in pipe.runners:
        place = pipe.placements["diffusion"]
        pipe.keep_both = both_fit(pipe, _free_memory(tuple(place.devices)))
    frames = v.frames if v.video else 1
    high = HighNoise(v.high_steps, v.high_cfg_scale, v.high_sampling_method, v.high_eta, v.moe_boundary)
    steps = int(request.steps or 0)
    total = steps + (max(0, v.high_steps) if "diffusion_high" in pipe.runners else 0)
    cb = progress.per_step(total)
    t0 = time.perf_counter()
    out = pipe.txt2vid(request.prompt, int(request.width or 0), int(request.height or 0), frames, steps=steps,
                       seed=request.seed, sampler=str(request.sampling_method), cfg_scale=float(request.cfg_scale or 0.0),
                       negative_prompt=request.negative_prompt, high=high, sampling=request.sampling,
                       scheduler=request.scheduler, preview=cb, picture=picture)
    from sdplan.core.pipelines.stages.results import image_to_uint8

    video = out["video"][0]  # (3, F, H, W)
    images = [image_to_uint8(video[:, f]) for f in range(video.shape[1])]
    info: dict[str, Any] = {"high_noise_steps": out["switch"]} if "diffusion_high" in pipe.runners else {}
    if v.video:
        info["video"] = {"frames": len(images), "fps": v.fps}
    if "diffusion_high" in pipe.runners:
        info["experts_resident"] = "both" if pipe.keep_both else "switch"
    return {"images": images, "timings": {"sampling_and_decode": time.perf_counter() - t0}, "info": info,
            "runners": pipe.runners}


@contextlib.contextmanager
def _graphs(model_files: Mapping[str, list[str]], width: int, height: int, pool: Any,
            placements: Mapping[str, Any] | None, overrides: Mapping[str, Any]) -> Iterator[tuple[Any, dict[str, Any]]]:
    """A Wan pipeline on the files (weights not loaded) and its graphs' input shapes at this
    size and ``overrides["video_frames"]`` (default 1): module -> (runner, shapes) for UMT5 on
    512 tokens with its mask, the DiT on the latent video, the decoder on the whole video,
    ``vae_encode`` on an image-to-video DiT's ``1 + 4 (T - 1)`` frames or TI2V-5B's picture, and
    ``diffusion_frames`` on TI2V-5B's DiT with a timestep per latent frame (its image to video)."""
    high = model_files.get("high_noise_diffusion_model")
    models = WanModels(model_files["diffusion_model"][0], model_files["t5xxl"][0], model_files["vae"][0],
                       high[0] if high else None)
    t = latent_frames(int(overrides.get("video_frames") or 1))
    with WanPipeline(models, None, pool, placements) as pipe:
        f, c = pipe.ae.factor, pipe.ae.z  # 8x and 16 channels; Wan 2.2 TI2V-5B's autoencoder 16x and 48
        h, w = height // f, width // f
        ins = pipe.dit.inputs(np.zeros((1, pipe.dit.cfg.in_channels, t, h, w), np.float32),
                              np.zeros((1, WAN_MAX_LENGTH, pipe.dit.cfg.text), np.float32), 1.0)
        graphs = {"te": (pipe.runners["t5xxl"], {"ids": (1, WAN_MAX_LENGTH), "mask": (WAN_MAX_LENGTH,)}),
                  "diffusion": (pipe.runners["diffusion"], input_shapes(ins)),
                  "vae": (pipe.runners["vae"], {"z": (t, c, h, w)})}
        if "vae_encode" in pipe.runners:
            graphs["vae_encode"] = (pipe.runners["vae_encode"],
                                    {"video": (video_frames(t) if pipe.i2v else 1, 3, height, width)})
        if pipe.ti2v and "vae_encode" in pipe.runners and t > 1:  # image to video: a timestep per frame
            graphs["diffusion_frames"] = (pipe.runners["diffusion"], {**graphs["diffusion"][1], "t": (t,)})
        yield pipe, graphs


def measure(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
            pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
            vae_tile: tuple[int, int] | None = None) -> dict[str, int]:
    """Compute-buffer bytes per module of a Wan generation (:func:`_graphs`): UMT5; the DiT
    (one graph: the negative prompt's is the same shape; with two experts each holds its own
    graph, counted once: the larger expert's phase runs alone; TI2V-5B with its encoder the
    larger of its graph with one timestep and with one per frame, image to video's); the
    autoencoder, the larger of its decoder and its encoder (they run at different times;
    counted whether or not ``-i`` comes, as the request is not known here).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    with _graphs(model_files, width, height, pool, placements, overrides) as (_, graphs):
        size = {name: sum(r.measure(s).values()) for name, (r, s) in graphs.items()}
    return {"te": size["te"], "diffusion": max(size["diffusion"], size.get("diffusion_frames", 0)),
            "vae": max(size["vae"], size.get("vae_encode", 0))}


def work(model_files: Mapping[str, list[str]], *, width: int, height: int, batch: int, cfg: bool,
         pool: Any, placements: Mapping[str, Any] | None, overrides: Mapping[str, Any],
         vae_tile: tuple[int, int] | None = None) -> dict[str, list[Any]]:
    """The work of a Wan generation's graphs (:func:`_graphs`), per module as
    :class:`~sdplan.core.planning.work.ModuleWork`: UMT5 once per prompt (the negative
    prompt's too with CFG), the DiT once per sampler evaluation and CFG pass (both experts
    have one layout: one graph's work stands for either phase), the decoder once per video;
    an image-to-video DiT's encoder once on the start picture's frames (TI2V-5B's optional
    picture is not counted: the request is not known here). ``batch``: Wan runs one video
    (:mod:`sdplan.core.pipelines.work`).

    Raises:
        ValueError / RuntimeError / SdplanError: graphs that cannot be built at this size.
    """
    from sdplan.core.planning.work import ModuleWork

    passes = 2 if cfg else 1
    with _graphs(model_files, width, height, pool, placements, overrides) as (pipe, graphs):
        def one(name: str, module: str, phase: str, calls: int) -> Any:
            runner, shapes = graphs[name]
            return ModuleWork(module, phase, runner.work(shapes), calls)

        out = {"te": [one("te", "te", "text", passes)], "diffusion": [one("diffusion", "diffusion", "step", passes)],
               "vae": [one("vae", "vae", "decode", 1)]}
        if pipe.i2v:
            out["vae"].append(one("vae_encode", "vae", "decode", 1))
        return out
