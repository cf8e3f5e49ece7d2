"""Parts of a generation request that run further modules: the hires fix (sd-cli's ``--hires``
flags) and ControlNet (``--control-net``, ``--control-image``, ``--control-strength``,
``--canny``). Frozen values read from and written to sd-cli's request keys; pure Python (the
command line builds them before the engine starts).

The hires fix resolves as sd-cli's ``GenerationRequest::resolve_hires`` does
(``src/stable-diffusion.cpp``; read, not copied): the target is ``--hires-width`` x
``--hires-height`` (one of them alone: a square), else the picture times ``--hires-scale``
rounded half away from zero, aligned up to the family's multiple; the denoising strength is
clamped to 0.0001..1; the upscaler ``None`` turns it off; a name that is none of sd-cli's
(:data:`HIRES_UPSCALERS`) is an ESRGAN model under ``--hires-upscalers-dir``, named without
path or extension.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdplan.core.errors import InvalidArgument

__all__ = ["HiresFix", "ControlInput", "VideoSettings", "MODES", "HIRES_UPSCALERS", "LATENT_UPSCALERS",
           "MODEL_EXTENSIONS"]

#: sd-cli's hires upscaler names (``hires_upscaler_to_str``) that interpolate the latent.
LATENT_UPSCALERS = ("Latent", "Latent (nearest)", "Latent (nearest-exact)", "Latent (antialiased)",
                    "Latent (bicubic)", "Latent (bicubic antialiased)")
#: Every name sd-cli knows (a model name is anything else, found in the upscalers folder).
HIRES_UPSCALERS = ("None", *LATENT_UPSCALERS, "Lanczos", "Nearest")
#: The extensions sd-cli tries for a model named by ``--hires-upscaler``, in order.
MODEL_EXTENSIONS = (".gguf", ".safetensors", ".pt", ".pth")


@dataclass(frozen=True)
class HiresFix:
    """sd-cli's hires fix (module docstring). Sizes in pixels.

    Attributes:
        enabled: ``--hires``.
        upscaler: ``--hires-upscaler`` (default ``Latent``).
        scale: ``--hires-scale`` (default 2).
        width, height: ``--hires-width`` / ``--hires-height`` (0: from the scale).
        steps: ``--hires-steps`` (0: the first pass's steps).
        denoising_strength: ``--hires-denoising-strength`` (default 0.7).
        upscalers_dir: ``--hires-upscalers-dir``, where a model upscaler is found.
    """

    enabled: bool = False
    upscaler: str = "Latent"
    scale: float = 2.0
    width: int = 0
    height: int = 0
    steps: int = 0
    denoising_strength: float = 0.7
    upscalers_dir: str | None = None

    @classmethod
    def from_request(cls, s: Mapping[str, Any]) -> HiresFix:
        """From sd-cli's request keys (``hires`` true or a mapping of these attributes, and
        ``hires_*`` keys); absent keys keep the defaults.

        Raises:
            InvalidArgument: a value out of sd-cli's ranges, naming its flag.
        """
        h = s.get("hires")
        d: dict[str, Any] = dict(h) if isinstance(h, Mapping) else {"enabled": bool(h)}
        for key in ("upscaler", "scale", "width", "height", "steps", "denoising_strength", "upscalers_dir"):
            if s.get(f"hires_{key}") is not None:
                d[key] = s[f"hires_{key}"]
        try:
            out = cls(bool(d.get("enabled")), str(d.get("upscaler") or "Latent"), float(d.get("scale", 2.0)),
                      int(d.get("width") or 0), int(d.get("height") or 0), int(d.get("steps") or 0),
                      float(d.get("denoising_strength", 0.7)), d.get("upscalers_dir") or None)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"--hires: {exc}") from None
        out.check()
        return out

    def check(self) -> None:
        """sd-cli's checks of the hires flags (``SDGenerationParams::validate``).

        Raises:
            InvalidArgument: naming the flag.
        """
        if not self.enabled:
            return
        if self.width < 0 or self.height < 0:
            raise InvalidArgument("--hires-width/--hires-height must be >= 0")
        if not math.isfinite(self.scale) or (self.scale <= 0 and self.width <= 0 and self.height <= 0):
            raise InvalidArgument(f"--hires-scale {self.scale:g}: must be positive when no hires size is set")
        if self.steps < 0:
            raise InvalidArgument(f"--hires-steps {self.steps}: must be >= 0")
        if not (0.0 < self.denoising_strength <= 1.0):
            raise InvalidArgument(f"--hires-denoising-strength {self.denoising_strength:g}: must be in (0, 1]")
        if self.is_model:
            name = self.upscaler
            if "/" in name or "\\" in name or name.lower().endswith(MODEL_EXTENSIONS):
                raise InvalidArgument(f"--hires-upscaler {name!r}: name a model of --hires-upscalers-dir "
                                      "without path or extension, or one of " + ", ".join(HIRES_UPSCALERS))
            if not self.upscalers_dir:
                raise InvalidArgument(f"--hires-upscaler {name!r} is a model: give --hires-upscalers-dir")

    @property
    def active(self) -> bool:
        """On, and not the ``None`` upscaler (which turns it off, as in sd-cli)."""
        return self.enabled and self.upscaler != "None"

    @property
    def is_model(self) -> bool:
        """The upscaler is an ESRGAN model (a name sd-cli does not know)."""
        return self.upscaler not in HIRES_UPSCALERS

    @property
    def in_latent(self) -> bool:
        """The upscaler interpolates the latent (no decode and encode)."""
        return self.upscaler in LATENT_UPSCALERS

    def model_path(self) -> str | None:
        """The model file a model upscaler names: the first of
        ``<upscalers_dir>/<name><ext>`` for :data:`MODEL_EXTENSIONS` that is a file; None for
        sd-cli's own upscalers.

        Raises:
            InvalidArgument: no such file.
        """
        if not self.active or not self.is_model:
            return None
        base = Path(str(self.upscalers_dir))
        for ext in MODEL_EXTENSIONS:
            p = base / (self.upscaler + ext)
            if p.is_file():
                return str(p)
        raise InvalidArgument(f"--hires-upscaler {self.upscaler!r}: no {'/'.join(MODEL_EXTENSIONS)} file of "
                              f"that name in --hires-upscalers-dir {str(base)!r}")

    def target(self, width: int, height: int, multiple: int) -> tuple[int, int]:
        """The second pass's ``(width, height)`` for a first pass of ``width`` x ``height``
        (module docstring), aligned up to ``multiple`` pixels."""
        if self.width > 0 and self.height > 0:
            w, h = self.width, self.height
        elif self.width > 0 or self.height > 0:
            w = h = max(self.width, self.height)
        else:  # std::round: halves away from zero
            w, h = int(math.floor(width * self.scale + 0.5)), int(math.floor(height * self.scale + 0.5))
        return -(-w // multiple) * multiple, -(-h // multiple) * multiple

    @property
    def strength(self) -> float:
        """The denoising strength as sd-cli uses it (clamped to 0.0001..1)."""
        return min(max(self.denoising_strength, 0.0001), 1.0)

    def to_json(self) -> dict[str, Any]:
        """The request's ``hires`` mapping (:meth:`from_request` reads it back)."""
        return {"enabled": self.enabled, "upscaler": self.upscaler, "scale": self.scale, "width": self.width,
                "height": self.height, "steps": self.steps, "denoising_strength": self.denoising_strength,
                "upscalers_dir": self.upscalers_dir}


@dataclass(frozen=True)
class ControlInput:
    """ControlNet's inputs besides its file (``--control-net``).

    Attributes:
        image: ``--control-image`` (a picture resized to the generation's size), or None.
        strength: ``--control-strength`` (default 0.9, sd-cli's).
        canny: ``--canny``: sd-cli's Canny preprocessor applied to the control picture first.
    """

    image: str | None = None
    strength: float = 0.9
    canny: bool = False

    @classmethod
    def from_request(cls, s: Mapping[str, Any]) -> ControlInput:
        """From the request keys ``control_image``, ``control_strength``, ``canny``.

        Raises:
            InvalidArgument: a strength that is not a finite number >= 0.
        """
        strength = float(s["control_strength"]) if s.get("control_strength") is not None else 0.9
        if not math.isfinite(strength) or strength < 0:
            raise InvalidArgument(f"--control-strength {strength:g}: must be a finite number >= 0 "
                                  "(the scale of the ControlNet's residuals)")
        return cls(s.get("control_image") or None, strength, bool(s.get("canny")))

    def to_json(self) -> dict[str, Any]:
        return {"control_image": self.image, "control_strength": self.strength, "canny": self.canny}


#: sd-cli's run modes this request takes (``-M``): pictures, or a video (Wan).
MODES = ("img_gen", "vid_gen")


#: The most frames a video request may ask for: 4 x 256 + 1 (Wan makes 4k+1 frames; its
#: models are trained at 81; sd-cli sets no limit, a bound keeps a typo from a day-long run).
MAX_VIDEO_FRAMES = 1025

#: The most frames per second a video may ask for: sd-cli sets no limit; the encoders refuse
#: rates far above it only when the file is written, after the whole run (libvpx-vp9 at
#: 2^31 - 1, every container past 2^31), and players show none of them.
MAX_FPS = 1000


@dataclass(frozen=True)
class VideoSettings:
    """sd-cli's video flags (``-M vid_gen``, ``--video-frames``, ``--fps``) and a two-stage
    model's high-noise phase (``--high-noise-steps``, ``--high-noise-cfg-scale``,
    ``--high-noise-sampling-method``, ``--high-noise-eta``, ``--moe-boundary``; sd-cli's
    ``examples/common``: steps -1 = the boundary decides, CFG 7, the boundary 0.875; the
    sampler and eta follow the low-noise phase's when not given)."""

    mode: str = "img_gen"
    frames: int = 1
    fps: int = 16
    high_steps: int = -1
    high_cfg_scale: float = 7.0
    high_sampling_method: str | None = None
    high_eta: float | None = None
    moe_boundary: float = 0.875

    @classmethod
    def from_request(cls, s: Mapping[str, Any]) -> VideoSettings:
        """From sd-cli's request keys (``mode``, ``video_frames``, ``fps``, ``high_noise_steps``,
        ``high_noise_cfg_scale``, ``high_noise_sampling_method``, ``high_noise_eta``,
        ``moe_boundary``); absent or None keys keep the defaults.

        Raises:
            InvalidArgument: a mode sd-cli's generation does not have, frames outside
                1..:data:`MAX_VIDEO_FRAMES` or fps outside 1..:data:`MAX_FPS`,
                a boundary outside 0..1, naming the flag.
        """
        def pick(key: str, default: Any) -> Any:
            return default if s.get(key) is None else s[key]

        try:
            out = cls(str(pick("mode", "img_gen")), int(pick("video_frames", 1)), int(pick("fps", 16)),
                      int(pick("high_noise_steps", -1)), float(pick("high_noise_cfg_scale", 7.0)),
                      s.get("high_noise_sampling_method") or None,
                      None if s.get("high_noise_eta") is None else float(s["high_noise_eta"]),
                      float(pick("moe_boundary", 0.875)))
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"video settings: {exc}") from None
        if out.mode not in MODES:
            raise InvalidArgument(f"-M {out.mode!r}: sdplan generates with -M img_gen or vid_gen")
        if not 1 <= out.frames <= MAX_VIDEO_FRAMES:
            raise InvalidArgument(f"--video-frames must be 1..{MAX_VIDEO_FRAMES}, got {out.frames}")
        if not 1 <= out.fps <= MAX_FPS:
            raise InvalidArgument(f"--fps must be 1..{MAX_FPS}, got {out.fps}")
        if not 0.0 <= out.moe_boundary <= 1.0 or not math.isfinite(out.high_cfg_scale):
            raise InvalidArgument(f"--moe-boundary must be 0..1 and --high-noise-cfg-scale finite, got "
                                  f"{out.moe_boundary} and {out.high_cfg_scale}")
        return out

    @property
    def video(self) -> bool:
        """A video is made (``-M vid_gen``)."""
        return self.mode == "vid_gen"

    @property
    def high_noise_set(self) -> bool:
        """A ``--high-noise-*`` or ``--moe-boundary`` flag away from its default."""
        return (self.high_steps != -1 or self.high_cfg_scale != 7.0 or self.high_sampling_method is not None
                or self.high_eta is not None or self.moe_boundary != 0.875)

    def to_request(self) -> dict[str, Any]:
        """sd-cli's request keys of these settings."""
        return {"mode": self.mode, "video_frames": self.frames, "fps": self.fps, "high_noise_steps": self.high_steps,
                "high_noise_cfg_scale": self.high_cfg_scale,
                "high_noise_sampling_method": self.high_sampling_method, "high_noise_eta": self.high_eta,
                "moe_boundary": self.moe_boundary}
