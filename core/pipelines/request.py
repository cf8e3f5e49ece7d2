"""One generation request: a frozen value built once by the command line and once by the app,
checked once against the family's capabilities, and sent to the engine process as it is.

:meth:`GenerationRequest.from_settings` builds it from sd-cli's request keys (``prompt``,
``cfg_scale``, ``sampling_method``, ``sigmas``...; what ``sdplan generate``'s flags, the
app's generation panel, a queued job and a picture's record all hold). Settings left out are
None and take the family's defaults when the request is checked.
:meth:`GenerationRequest.check` is the one validation against a family
(:class:`~sdplan.core.families.declaration.Family`): its model files, its samplers and
schedulers, and every generation option (:data:`sdplan.core.families.options.OPTIONS`) set
away from its default that its pipeline does not honour, all named in one line before
anything loads. The checked request has every setting resolved, and
:meth:`GenerationRequest.settings` is what a picture records: exactly the settings that ran.

Pure Python (no numpy): the command line builds and checks it before the engine starts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from sdplan.core.errors import InvalidArgument, ModelFileError
from sdplan.core.families import UNKNOWN
from sdplan.core.families import family as registry_family
from sdplan.core.families import options as o
from sdplan.core.families.declaration import Family
from sdplan.core.pipelines.request_parts import ControlInput, HiresFix, VideoSettings
from sdplan.core.planning.modules import MODEL_FILE_FLAGS
from sdplan.core.planning.vae_tiling import VaeTiling
from sdplan.core.runtime.run_plan import RunPlan
from sdplan.core.sampling.names import samplers_for, schedulers_for
from sdplan.core.sampling.options import SamplingOptions, parse_key_values, parse_sigmas
from sdplan.core.sampling.slg import SkipLayerGuidance

__all__ = ["GenerationRequest", "ModelOverrides", "SIDE_DEFAULT", "family_for", "FALLBACK", "planned_request"]

#: sd-cli's image side (pixels) when neither the flags nor the family give one.
SIDE_DEFAULT = 512
#: Model-file keys that are not the model set itself (read by their own stages).
LATE_FILES = ("taesd", "upscale_model")
#: The family that runs a model set no rule recognises (a UNet of sd-cli's names).
FALLBACK = "sd1"


def family_for(architecture: Any) -> tuple[Family, str | None]:
    """The registry family that runs a model set of ``architecture`` (an
    :class:`~sdplan.core.modelfiles.checkpoint.Architecture`: ``family``, ``variant``) and its
    variant; a set no rule recognises runs as :data:`FALLBACK` (SD's UNet pipeline).

    Raises:
        ModelFileError: a family name the registry does not know.
    """
    fam = registry_family(architecture.family) if architecture.family != UNKNOWN else registry_family(FALLBACK)
    if fam is None:
        raise ModelFileError("<request>", f"no pipeline runs the {architecture.family} family")
    return fam, architecture.variant


@dataclass(frozen=True)
class ModelOverrides:
    """Hyper-parameters small test models do not carry in their shapes (None: from the
    files' ``sdplan.*`` metadata or the family's rule).

    Attributes:
        clip_heads, unet_heads, unet_head_dim, flux_heads: head counts / widths.
        prediction: ``eps`` or ``v`` (UNets).
        flux_axes: the DiT's RoPE axes widths.
        t5_length: T5 tokens after padding.
        chroma_use_dit_mask, chroma_t5_mask_pad: sd-cli's Chroma model arguments.
        qwen_image_zero_cond_t: sd-cli's ``qwen_image_zero_cond_t`` model argument
            (Qwen-Image-Edit-2511; None: from the DiT file's marker tensor).
    """

    clip_heads: int | None = None
    unet_heads: int | None = None
    unet_head_dim: int | None = None
    prediction: str | None = None
    flux_heads: int | None = None
    flux_axes: tuple[int, ...] | None = None
    t5_length: int | None = None
    chroma_use_dit_mask: bool | None = None
    chroma_t5_mask_pad: int | None = None
    qwen_image_zero_cond_t: bool | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any] | None) -> ModelOverrides:
        """From a request's ``overrides`` mapping (unknown keys ignored, None skipped)."""
        d = {k: v for k, v in (data or {}).items() if k in cls.__dataclass_fields__ and v is not None}
        if "flux_axes" in d:
            d["flux_axes"] = tuple(int(a) for a in d["flux_axes"])
        return cls(**d)

    def to_mapping(self) -> dict[str, Any]:
        """The set overrides by name."""
        return {k: v for k, v in vars(self).items() if v is not None}


def _files(model_files: Mapping[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    out = []
    for key, value in model_files.items():
        name = {"m": "model"}.get(key.lstrip("-").replace("-", "_"), key.lstrip("-").replace("-", "_"))
        paths = (value,) if isinstance(value, str) or hasattr(value, "__fspath__") else tuple(value or ())
        if paths:
            out.append((name, tuple(str(p) for p in paths)))
    return tuple(sorted(out))


def _plan_of(s: Mapping[str, Any]) -> RunPlan | None:
    """A settings mapping's ``plan`` (a RunPlan or its JSON), or its legacy ``placements``
    (module -> ModulePlacement) with ``rpc_servers``, or None."""
    plan = s.get("plan")
    if isinstance(plan, RunPlan):
        return plan
    if isinstance(plan, Mapping):
        return RunPlan.from_json(plan)
    if s.get("placements"):
        rpc = s.get("rpc_servers") or ()
        return RunPlan(MappingProxyType(dict(s["placements"])),
                       tuple(rpc.split(",")) if isinstance(rpc, str) else tuple(rpc))
    return None


def _opt_float(value: Any) -> float | None:
    return None if value is None or value == "" else float(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None or value == "" else int(value)


@dataclass(frozen=True)
class GenerationRequest:
    """A generation request (module docstring). Units: pixels, steps, seconds nowhere.

    Attributes:
        model_files: ``(key, paths)`` pairs by sd-cli's model-file keys (``model``,
            ``diffusion_model``, ``clip_l``, ``t5xxl``, ``llm``, ``vae``, ``taesd``,
            ``upscale_model``...); :attr:`files` as a dict.
        prompt, negative_prompt: the prompts (sd-cli's weighting syntax, ``<lora:...>`` tags).
        width, height: image size in pixels (None: the family's, else 512).
        steps, cfg_scale, guidance, sampling_method: None: the family's defaults.
        scheduler: ``default`` (the family's own sigmas) or an sd-cli scheduler.
        seed: the seed (< 0: a random one, drawn by the engine).
        batch_count: images per request.
        clip_skip: CLIP layers skipped (<= 0: the family's default).
        sampling: ``--eta``, ``--sigmas``, ``--flow-shift``, ``--timestep-shift``, ``--rng``,
            ``--sampler-rng``, ``--extra-sample-args``.
        slg: skip-layer guidance (SD3).
        lora_model_dir, lora_apply_mode: where the prompt's LoRA tags' files are, how they apply.
        init_img, mask, strength: image to image and inpainting.
        ref_images: reference pictures (FLUX.2 klein edits).
        taesd_decode: decode the final image with the ``taesd`` file (else previews only).
        vae_tiling: ``--vae-tiling``, ``--vae-tile-size`` (image pixels, ``WxH``),
            ``--vae-tile-overlap``, ``--vae-relative-tile-size`` (the newest sd-cli's, spec
            section 14.7; a size without ``--vae-tiling`` is the tile of the retry after a
            decode that does not fit).
        vae_tile_size: an older request's tile in latent pixels (tiling on); :meth:`check`
            turns it into :attr:`vae_tiling` with the family's VAE scale.
        upscale_repeats: upscaler passes (with an ``upscale_model`` file).
        control_net: ``--control-net``, the ControlNet file; control: its picture, strength
            and ``--canny`` (:class:`~sdplan.core.pipelines.request_parts.ControlInput`).
        hires: sd-cli's hires fix (:class:`~sdplan.core.pipelines.request_parts.HiresFix`).
        previews: send a preview per step.
        threads: CPU threads (0: the engine's choice).
        force_sdxl_vae_conv_scale: sd-cli's flag of that name.
        overrides: :class:`ModelOverrides`.
        video: ``-M vid_gen``, ``--video-frames``, ``--fps`` and the high-noise phase's flags
            (:class:`~sdplan.core.pipelines.request_parts.VideoSettings`).
        plan: the resolved plan to run (None: the engine resolves ``placement_strings``).
        placement_strings: ``backend``/``params_backend``/``max_vram``/``rpc_servers``/
            ``stream_layers`` for a request without a resolved plan.
    """

    model_files: tuple[tuple[str, tuple[str, ...]], ...]
    prompt: str
    negative_prompt: str = ""
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    cfg_scale: float | None = None
    guidance: float | None = None
    seed: int = 42
    sampling_method: str | None = None
    scheduler: str = "default"
    batch_count: int = 1
    clip_skip: int = 0
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    slg: SkipLayerGuidance = field(default_factory=SkipLayerGuidance)
    lora_model_dir: str | None = None
    lora_apply_mode: str = "auto"
    init_img: str | None = None
    mask: str | None = None
    strength: float = 0.75
    ref_images: tuple[str, ...] = ()
    taesd_decode: bool = False
    vae_tiling: VaeTiling = field(default_factory=VaeTiling)
    vae_tile_size: int = 0
    upscale_repeats: int = 1
    control_net: str | None = None
    control: ControlInput = field(default_factory=ControlInput)
    hires: HiresFix = field(default_factory=HiresFix)
    previews: bool = True
    threads: int = 0
    force_sdxl_vae_conv_scale: bool = False
    overrides: ModelOverrides = field(default_factory=ModelOverrides)
    video: VideoSettings = field(default_factory=VideoSettings)
    plan: RunPlan | None = None
    placement_strings: tuple[tuple[str, Any], ...] = ()

    # ------------------------------------------------------------------ building
    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], model_files: Mapping[str, Any] | None = None,
                      plan: RunPlan | None = None) -> GenerationRequest:
        """A request from sd-cli's request keys (module docstring); ``model_files`` (else
        ``settings["model_files"]``) by model-file key; absent or None keys keep their
        defaults (None: the family's).

        Raises:
            InvalidArgument / SamplingError: a malformed value (``--sigmas``, SLG layers,
                ``--extra-sample-args``, an unknown rng), naming its flag.
        """
        s = dict(settings)
        files = model_files if model_files is not None else (s.get("model_files") or {})
        raw_sigmas = s.get("sigmas")
        sigmas = parse_sigmas(raw_sigmas) if isinstance(raw_sigmas, str) and raw_sigmas.strip() else \
            tuple(float(v) for v in (raw_sigmas or ()))
        extra = s.get("extra_sample_args")
        extra_map = parse_key_values(extra) if isinstance(extra, str) else dict(extra or {})
        sampling = SamplingOptions(eta=_opt_float(s.get("eta")), sigmas=sigmas,
                                   flow_shift=_opt_float(s.get("flow_shift")),
                                   timestep_shift=int(s.get("timestep_shift") or 0),
                                   rng=str(s.get("rng") or "cuda"),
                                   sampler_rng=str(s["sampler_rng"]) if s.get("sampler_rng") else None,
                                   extra=extra_map)
        clip_skip = _opt_int(s.get("clip_skip"))
        strings = tuple((k, s[k]) for k in ("backend", "params_backend", "max_vram", "rpc_servers",
                                            "stream_layers") if s.get(k))
        return cls(
            model_files=_files(files), prompt=str(s.get("prompt") or ""),
            negative_prompt=str(s.get("negative_prompt") or ""),
            width=_opt_int(s.get("width")), height=_opt_int(s.get("height")),
            steps=_opt_int(s.get("steps")), cfg_scale=_opt_float(s.get("cfg_scale")),
            guidance=_opt_float(s.get("guidance")),
            seed=int(s["seed"]) if s.get("seed") is not None else 42,
            sampling_method=s.get("sampling_method") or None,
            scheduler=str(s.get("scheduler") or "default"),
            batch_count=int(s.get("batch_count") or 1),
            clip_skip=max(clip_skip, 0) if clip_skip is not None else 0,
            sampling=sampling, slg=SkipLayerGuidance.from_request(s),
            lora_model_dir=s.get("lora_model_dir") or None,
            lora_apply_mode=str(s.get("lora_apply_mode") or "auto"),
            init_img=s.get("init_img") or None, mask=s.get("mask") or None,
            strength=float(s["strength"]) if s.get("strength") is not None else 0.75,
            ref_images=tuple(str(p) for p in s.get("ref_images") or ()),
            taesd_decode=bool(s.get("taesd_decode")),
            vae_tiling=VaeTiling.from_json(s["vae_tiling"]) if s.get("vae_tiling") else VaeTiling(),
            vae_tile_size=int(s.get("vae_tile_size") or 0),
            upscale_repeats=int(s.get("upscale_repeats") or 1),
            control_net=s.get("control_net") or None,
            control=ControlInput.from_request(s.get("control") if isinstance(s.get("control"), Mapping) else s),
            hires=HiresFix.from_request(s),
            previews=bool(s.get("previews", True)), threads=int(s.get("threads") or 0),
            force_sdxl_vae_conv_scale=bool(s.get("force_sdxl_vae_conv_scale")),
            overrides=ModelOverrides.from_mapping(s.get("overrides")), video=VideoSettings.from_request(s),
            plan=plan if plan is not None else _plan_of(s), placement_strings=strings)

    @property
    def files(self) -> dict[str, list[str]]:
        """Model-file key -> paths."""
        return {k: list(v) for k, v in self.model_files}

    @property
    def model_set(self) -> dict[str, list[str]]:
        """The model set's files: every model file but ``taesd`` and ``upscale_model``."""
        return {k: list(v) for k, v in self.model_files if k not in LATE_FILES}

    def file(self, key: str) -> str | None:
        """The first path of model-file ``key``, or None."""
        return next((v[0] for k, v in self.model_files if k == key and v), None)

    def modules(self) -> tuple[str, ...]:
        """The placed modules this request runs (spec section 1's names), in run order:
        ``te``, ``diffusion`` and ``vae`` always, ``controlnet`` with a ControlNet file, and
        ``upscaler`` with an ``upscale_model`` file or a hires fix upscaled by a model: the
        modules whose placements the run's plan carries and whose devices it checks."""
        out = ["te", "diffusion", "vae"]
        if self.control_net:
            out.insert(1, "controlnet")
        if self.file("upscale_model") or self.hires_model():
            out.append("upscaler")
        return tuple(out)

    def hires_model(self) -> str | None:
        """The ESRGAN file the hires fix upscales with, or None (no hires fix, or an
        interpolating upscaler).

        Raises:
            InvalidArgument: a model name with no file in ``--hires-upscalers-dir``.
        """
        return self.hires.model_path()

    # ------------------------------------------------------------------ checking
    def options_set(self, fam: Family) -> dict[str, str]:
        """The generation options this request sets away from their defaults (the family's,
        where it has them): option name -> the flag and value, as a refusal names it."""
        d = fam.defaults
        out: dict[str, str] = {}

        def put(opt: str, value: object = None) -> None:
            out[opt] = o.OPTIONS[opt] + ("" if value is None else f" {value}")

        if self.negative_prompt:
            put(o.NEGATIVE_PROMPT)
        if self.cfg_scale is not None and self.cfg_scale != d.cfg_scale:
            put(o.CFG_SCALE, f"{self.cfg_scale:g}")
        if self.guidance is not None and self.guidance != d.guidance:
            put(o.GUIDANCE, f"{self.guidance:g}")
        if self.clip_skip > 0 and self.clip_skip != d.clip_skip:
            put(o.CLIP_SKIP, self.clip_skip)
        if self.batch_count > 1:
            put(o.BATCH, self.batch_count)
        sm = self.sampling
        for opt, on, value in ((o.ETA, sm.eta is not None, sm.eta), (o.SIGMAS, bool(sm.sigmas), None),
                               (o.FLOW_SHIFT, sm.flow_shift is not None, sm.flow_shift),
                               (o.TIMESTEP_SHIFT, sm.timestep_shift != 0, sm.timestep_shift),
                               (o.RNG, sm.rng != "cuda", sm.rng),
                               (o.SAMPLER_RNG, sm.sampler_rng is not None, sm.sampler_rng),
                               (o.EXTRA_SAMPLE_ARGS, bool(sm.extra), None)):
            if on:
                put(opt, value)
        if self.slg.enabled:
            put(o.SLG, f"{self.slg.scale:g}")
        if "<lora:" in self.prompt:
            put(o.LORA)
        for opt, on in ((o.INIT_IMG, self.init_img), (o.MASK, self.mask), (o.REF_IMAGES, self.ref_images),
                        (o.TAESD, self.file("taesd")), (o.TAESD_DECODE, self.taesd_decode and self.file("taesd")),
                        (o.VAE_TILING, self.vae_tile_size or self.vae_tiling.enabled or self.vae_tiling.customised),
                        (o.UPSCALE, self.file("upscale_model")),
                        (o.CONTROL, self.control_net), (o.HIRES, self.hires.active),
                        (o.VAE_CONV_SCALE, self.force_sdxl_vae_conv_scale)):
            if on:
                put(opt)
        v = self.video
        if v.video or v.frames != 1 or v.fps != 16:
            put(o.VIDEO)
        if v.high_noise_set or self.file("high_noise_diffusion_model"):
            put(o.HIGH_NOISE)
        return out

    def check(self, fam: Family, variant: str | None = None) -> GenerationRequest:
        """This request checked against ``fam`` (``variant``'s defaults) with every setting
        resolved: size, steps, CFG, guidance, sampler and CLIP skip from the family where
        the request leaves them open.

        Raises:
            ModelFileError: a family that is recognised but not run, or model files that are
                not a complete set of the family's (naming the missing flags).
            InvalidArgument: a sampler or scheduler the family does not run, or options it
                does not honour (every one named, with the family, in one line; ``variant``'s
                own options where it has them), or options the variant needs and the
                request leaves out (named in one line), or ``--strength`` away from 0.75
                beside ``-i`` for a video family (the picture is the first frame).
        """
        if not fam.runs:
            raise ModelFileError("<request>", fam.refusal or f"sdplan does not generate with {fam.title}")
        self._check_files(fam)
        d = fam.defaults_for(variant)
        sampler = self.sampling_method or d.sampling_method
        if sampler not in samplers_for(fam.sampling):
            raise InvalidArgument(f"--sampling-method {sampler}: {fam.title} does not run it; choose one of "
                                  f"{', '.join(samplers_for(fam.sampling))}")
        if self.scheduler not in schedulers_for(fam.sampling):
            raise InvalidArgument(f"--scheduler {self.scheduler}: {fam.title} does not run it; choose one of "
                                  f"{', '.join(schedulers_for(fam.sampling))}")
        set_options = self.options_set(fam)
        refused = [flag for opt, flag in set_options.items() if not fam.honours(opt, variant)]
        if refused:
            them = "it" if len(refused) == 1 else "them"
            raise InvalidArgument(f"{', '.join(refused)}: {fam.title} does not take {them} in sdplan; "
                                  f"remove {them}")
        missing = [(o.OPTIONS[opt], why) for opt, why in fam.needs_for(variant).items() if opt not in set_options]
        if missing:
            raise InvalidArgument("; ".join(f"{flag} missing: {why} ({fam.title}); give it" for flag, why in missing))
        if self.init_img and self.strength != 0.75 and fam.honours(o.VIDEO, variant):
            # a video family's -i is the first frame (sd-cli's Wan image to video), which no strength
            # changes; 0.75 is sd-cli's default, which it ignores there
            raise InvalidArgument(f"--strength {self.strength:g}: {fam.title}'s image to video takes the -i picture "
                                  "as its first frame, not a strength; remove it")
        if self.cfg_scale is not None and not math.isfinite(self.cfg_scale):
            raise InvalidArgument(f"--cfg-scale must be a finite number, got {self.cfg_scale}")
        high = self.video.high_sampling_method
        if high and high not in samplers_for(fam.sampling):
            raise InvalidArgument(f"--high-noise-sampling-method {high}: {fam.title} does not run it; choose one of "
                                  f"{', '.join(samplers_for(fam.sampling))}")
        if self.hires.active:
            if self.mask:
                raise InvalidArgument("--hires with --mask: sdplan does not run the hires fix of an "
                                      "inpainting; remove one of them")
            self.hires_model()  # a model upscaler's file, named before anything loads
        if self.control_net and not self.control.image:
            raise InvalidArgument("--control-net needs --control-image (the picture that steers it)")
        tiling = self.vae_tiling
        if self.vae_tile_size:  # an older request: latent pixels, tiling on
            px = self.vae_tile_size * fam.vae_scale
            tiling = replace(tiling, enabled=True, tile_px=(px, px))
        return replace(self, vae_tiling=tiling, vae_tile_size=0, width=self.width or d.width or SIDE_DEFAULT,
                       height=self.height or d.height or SIDE_DEFAULT, steps=self.steps or d.steps,
                       cfg_scale=d.cfg_scale if self.cfg_scale is None else self.cfg_scale,
                       guidance=d.guidance if self.guidance is None else self.guidance,
                       sampling_method=sampler, clip_skip=self.clip_skip or d.clip_skip)

    def _check_files(self, fam: Family) -> None:
        have = {k for k, v in self.model_files if v and k not in LATE_FILES}
        if any(set(need) <= have for need in fam.files):
            return
        spell = {f.key: f.spellings[0] for f in MODEL_FILE_FLAGS}
        need = max(fam.files, key=lambda keys: len(set(keys) & have))
        flags = [spell.get(k, "--" + k) for k in need]
        missing = [spell.get(k, "--" + k) for k in need if k not in have]
        listed = flags[0] if len(flags) == 1 else f"{', '.join(flags[:-1])} and {flags[-1]}"
        raise ModelFileError("<request>", f"a {fam.title} run needs {listed}; missing {', '.join(missing)}")

    # ------------------------------------------------------------------ records
    def settings(self, fam: Family | None = None) -> dict[str, Any]:
        """The settings by sd-cli's request keys, as a picture records them: the prompts,
        size, steps, CFG, seed, sampler, scheduler, batch, CLIP skip, and each option this
        request sets (with ``fam``: ``guidance`` only where the family honours it, the CLIP skip
        only when it is not the family's own, which sd-cli takes by itself; ``taesd_decode``
        when the ``taesd`` file decoded the final picture, ``force_sdxl_vae_conv_scale`` when
        set). None values are left out."""
        sm = self.sampling
        out: dict[str, Any] = {
            "prompt": self.prompt, "negative_prompt": self.negative_prompt or None,
            "width": self.width, "height": self.height, "steps": self.steps, "cfg_scale": self.cfg_scale,
            "seed": self.seed, "sampling_method": self.sampling_method, "scheduler": self.scheduler,
            "batch_count": self.batch_count,
            "clip_skip": self.clip_skip if self.clip_skip and (fam is None or self.clip_skip != fam.defaults.clip_skip)
            else None}
        if fam is None or fam.honours(o.GUIDANCE):
            out["guidance"] = self.guidance
        out.update(eta=sm.eta, sigmas=list(sm.sigmas) or None,
                   flow_shift=sm.flow_shift, timestep_shift=sm.timestep_shift or None,
                   rng=sm.rng if sm.rng != "cuda" else None, sampler_rng=sm.sampler_rng,
                   extra_sample_args=dict(sm.extra) or None)
        if self.slg.enabled:
            out.update(self.slg.to_request())
        if "<lora:" in self.prompt:
            out.update(lora_model_dir=self.lora_model_dir, lora_apply_mode=self.lora_apply_mode)
        if self.init_img:
            out.update(init_img=self.init_img, mask=self.mask, strength=self.strength)
        if self.ref_images:
            out["ref_images"] = list(self.ref_images)
        if self.vae_tile_size:
            out["vae_tile_size"] = self.vae_tile_size
        if self.vae_tiling.enabled or self.vae_tiling.customised:
            out["vae_tiling"] = self.vae_tiling.to_json()
        if self.file("upscale_model"):
            out.update(upscale_model=self.file("upscale_model"), upscale_repeats=self.upscale_repeats)
        if self.taesd_decode and self.file("taesd"):
            out["taesd_decode"] = True
        if self.video.video or self.video.high_noise_set or self.file("high_noise_diffusion_model"):
            out.update(self.video.to_request())
        if self.force_sdxl_vae_conv_scale:
            out["force_sdxl_vae_conv_scale"] = True
        if self.hires.active:
            out["hires"] = self.hires.to_json()
        if self.control_net:
            out.update(control_net=self.control_net, control=self.control.to_json())
        return {k: v for k, v in out.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        """JSON form (sd-cli's request keys, ``model_files``, ``overrides``, ``plan``): what a
        queued job keeps; :meth:`from_settings` reads it back."""
        sm = self.sampling
        out: dict[str, Any] = {
            "model_files": self.files, "prompt": self.prompt, "negative_prompt": self.negative_prompt,
            "width": self.width, "height": self.height, "steps": self.steps, "cfg_scale": self.cfg_scale,
            "guidance": self.guidance, "seed": self.seed, "sampling_method": self.sampling_method,
            "scheduler": self.scheduler, "batch_count": self.batch_count, "clip_skip": self.clip_skip,
            "eta": sm.eta, "sigmas": list(sm.sigmas), "flow_shift": sm.flow_shift,
            "timestep_shift": sm.timestep_shift, "rng": sm.rng, "sampler_rng": sm.sampler_rng,
            "extra_sample_args": dict(sm.extra), **self.slg.to_request(),
            "lora_model_dir": self.lora_model_dir, "lora_apply_mode": self.lora_apply_mode,
            "init_img": self.init_img, "mask": self.mask, "strength": self.strength,
            "ref_images": list(self.ref_images), "taesd_decode": self.taesd_decode,
            "vae_tiling": self.vae_tiling.to_json(), "vae_tile_size": self.vae_tile_size,
            "upscale_repeats": self.upscale_repeats,
            "control_net": self.control_net, "control": self.control.to_json(), "hires": self.hires.to_json(),
            "previews": self.previews,
            "threads": self.threads, "force_sdxl_vae_conv_scale": self.force_sdxl_vae_conv_scale,
            "overrides": self.overrides.to_mapping(), **self.video.to_request(), **dict(self.placement_strings)}
        if self.plan is not None:
            out["plan"] = self.plan.to_json()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GenerationRequest:
        """The inverse of :meth:`to_dict` (a ``plan`` in JSON form is read back).

        Raises:
            InvalidArgument / SamplingError / ValueError: malformed values.
        """
        return cls.from_settings(data)

    def with_seed(self, seed: int) -> GenerationRequest:
        """The same request with another seed."""
        return replace(self, seed=seed)


def request_keys() -> Sequence[str]:
    """Every key :meth:`GenerationRequest.to_dict` writes (for readers of queued jobs)."""
    return tuple(GenerationRequest((), "").to_dict())


def planned_request(settings: Mapping[str, Any], model_files: Mapping[str, Any], plan: Any,
                    fit: Any = None, inventory: Any = None) -> GenerationRequest:
    """A request of ``settings`` (sd-cli's request keys) and ``model_files`` that runs the
    resolved ``plan`` the user saw (:class:`~sdplan.core.planning.plan_types.Plan`), with each
    device's need from ``fit`` and its free memory from ``inventory`` (the one the plan was
    resolved against) for the engine's check of its live devices.

    Raises:
        InvalidArgument / SamplingError: malformed settings.
    """
    fits = fit is None or bool(getattr(fit, "fits", True))
    req = GenerationRequest.from_settings(settings, model_files)
    run_plan = RunPlan.from_plan(plan, fit, inventory, check_memory=fits,
                                 modules=tuple(m for m in req.modules() if m in plan.modules))
    return replace(req, plan=run_plan)
