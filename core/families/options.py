"""The generation options a family can honour, by name, with the sd-cli flag that sets each.

A family declares the options its pipeline honours (:attr:`sdplan.core.families.registry.Family.options`);
a request that sets any other option away from its default is refused, naming the flag and
the family, before anything loads (:func:`sdplan.core.pipelines.request.GenerationRequest.check`).
The prompt, size, steps, seed, sampler and scheduler are no options here: every family takes
them (samplers and schedulers are checked against the family's own lists).
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["OPTIONS", "NEGATIVE_PROMPT", "CFG_SCALE", "GUIDANCE", "CLIP_SKIP", "BATCH", "ETA",
           "SIGMAS", "FLOW_SHIFT", "TIMESTEP_SHIFT", "RNG", "SAMPLER_RNG", "EXTRA_SAMPLE_ARGS",
           "SLG", "LORA", "INIT_IMG", "MASK", "REF_IMAGES", "TAESD", "TAESD_DECODE",
           "VAE_TILING", "UPSCALE", "CONTROL", "HIRES", "VAE_CONV_SCALE", "VIDEO", "HIGH_NOISE"]

NEGATIVE_PROMPT = "negative_prompt"
CFG_SCALE = "cfg_scale"
GUIDANCE = "guidance"
CLIP_SKIP = "clip_skip"
BATCH = "batch_count"
ETA = "eta"
SIGMAS = "sigmas"
FLOW_SHIFT = "flow_shift"
TIMESTEP_SHIFT = "timestep_shift"
RNG = "rng"
SAMPLER_RNG = "sampler_rng"
EXTRA_SAMPLE_ARGS = "extra_sample_args"
SLG = "slg"
LORA = "lora"
INIT_IMG = "init_img"
MASK = "mask"
REF_IMAGES = "ref_images"
TAESD = "taesd"
TAESD_DECODE = "taesd_decode"
VAE_TILING = "vae_tiling"
UPSCALE = "upscale"
CONTROL = "control"
HIRES = "hires"
VAE_CONV_SCALE = "force_sdxl_vae_conv_scale"
VIDEO = "video"
HIGH_NOISE = "high_noise"

#: Option name -> the sd-cli flag (or flags) that set it, as refusals name them.
OPTIONS = MappingProxyType({
    NEGATIVE_PROMPT: "-n/--negative-prompt",
    CFG_SCALE: "--cfg-scale",
    GUIDANCE: "--guidance",
    CLIP_SKIP: "--clip-skip",
    BATCH: "-b/--batch-count",
    ETA: "--eta",
    SIGMAS: "--sigmas",
    FLOW_SHIFT: "--flow-shift",
    TIMESTEP_SHIFT: "--timestep-shift",
    RNG: "--rng",
    SAMPLER_RNG: "--sampler-rng",
    EXTRA_SAMPLE_ARGS: "--extra-sample-args",
    SLG: "--slg-scale",
    LORA: "<lora:...> prompt tags",
    INIT_IMG: "-i/--init-img",
    MASK: "--mask",
    REF_IMAGES: "-r/--ref-image",
    TAESD: "--taesd",
    TAESD_DECODE: "--taesd (final decode)",
    VAE_TILING: "--vae-tiling/--vae-tile-size",
    UPSCALE: "--upscale-model",
    CONTROL: "--control-net",
    HIRES: "--hires",
    VAE_CONV_SCALE: "--force-sdxl-vae-conv-scale",
    VIDEO: "-M vid_gen/--video-frames/--fps",
    HIGH_NOISE: "--high-noise-diffusion-model/--high-noise-*/--moe-boundary",
})
