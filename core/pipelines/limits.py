"""Limits of the generation and upscale settings, checked before anything loads: the
command line's flags (``sdplan generate``, ``sdplan upscale``) and a server's requests
(``sdplan serve``, by the request keys of :data:`SETTING_RANGES`) share them.

Each check raises :class:`~sdplan.core.errors.InvalidArgument` naming the flag, the value
and the allowed range. The bounds keep a run finite and its numbers meaningful; none is
reached by a real use:

- sizes: 1 .. :data:`MAX_SIDE` pixels a side (the model's own multiple is checked by its
  pipeline); batch 1 .. :data:`MAX_BATCH`; steps 1 .. :data:`MAX_STEPS` (the discrete
  schedules have 1000 training timesteps: more steps repeat timesteps);
- CFG scale within +-:data:`MAX_CFG` and Flux guidance 0 .. :data:`MAX_GUIDANCE`, finite
  (a CFG of 1e308 overflows float32 latents into NaN: an all-black picture);
- prompts at most :data:`MAX_PROMPT_CHARS` characters (77-token chunks: 10,000 characters
  is some 40 chunks of conditioning);
- seed within a signed 64-bit integer (sd-cli's ``int64_t``); threads 0 .. :data:`MAX_THREADS`;
  upscale repeats 1 .. :data:`MAX_UPSCALE_REPEATS`; VAE tiles 0 .. MAX_SIDE / 8 latent pixels;
  head counts and widths 1 .. :data:`MAX_HEADS`;
- the hires fix: a scale finite and at most :data:`MAX_HIRES_SCALE`, a target side 0 ..
  :data:`MAX_PICTURE_PX`, second-pass steps 0 .. :data:`MAX_STEPS` (0: the first pass's).

Pure Python.
"""

from __future__ import annotations

import argparse
import math

from sdplan.core.errors import InvalidArgument

MAX_SIDE = 8192
MAX_BATCH = 100
MAX_STEPS = 1000
MAX_CFG = 100.0
MAX_GUIDANCE = 100.0
MAX_PROMPT_CHARS = 10_000
MAX_THREADS = 1024
MAX_UPSCALE_REPEATS = 4
MAX_CLIP_SKIP = 48
#: Largest head count or head width of ``--clip-heads``, ``--unet-heads``, ``--unet-head-dim``,
#: ``--flux-heads`` (whether they split the tensors is checked against the model's shapes).
MAX_HEADS = 4096
SEED_RANGE = (-(2**63), 2**63 - 1)
#: Largest hires scale (a scale of 16 already asks for 16384 px from 1024).
MAX_HIRES_SCALE = 16.0
#: Largest picture side a setting may name in image pixels (hires target, VAE tile).
MAX_PICTURE_PX = 16384

#: sd-cli's request keys -> (low, high): the same bounds as their flags (module docstring).
SETTING_RANGES: dict[str, tuple[float, float]] = {
    "width": (1, MAX_SIDE), "height": (1, MAX_SIDE), "steps": (1, MAX_STEPS),
    "batch_count": (1, MAX_BATCH), "clip_skip": (-1, MAX_CLIP_SKIP), "seed": SEED_RANGE,
    "cfg_scale": (-MAX_CFG, MAX_CFG), "guidance": (0.0, MAX_GUIDANCE),
    "hires_width": (0, MAX_PICTURE_PX), "hires_height": (0, MAX_PICTURE_PX),
    "hires_steps": (0, MAX_STEPS), "hires_scale": (0.0, MAX_HIRES_SCALE),
}


def check_int(flag: str, value: int, low: int, high: int) -> None:
    """Raise InvalidArgument unless ``low <= value <= high``."""
    if not low <= value <= high:
        raise InvalidArgument(f"{flag} must be between {low} and {high}, got {_short(value)}")


def check_float(flag: str, value: float, low: float, high: float) -> None:
    """Raise InvalidArgument unless ``value`` is finite and ``low <= value <= high``."""
    if not math.isfinite(value):
        raise InvalidArgument(f"{flag} must be a finite number, got {value}")
    if not low <= value <= high:
        raise InvalidArgument(f"{flag} must be between {low:g} and {high:g}, got {value:g}")


def check_text(flag: str, text: str, limit: int = MAX_PROMPT_CHARS) -> None:
    """Raise InvalidArgument when ``text`` is longer than ``limit`` characters."""
    if len(text) > limit:
        raise InvalidArgument(f"{flag} is {len(text)} characters long; at most {limit}")


def check_setting(name: str, key: str, value: float) -> None:
    """Check ``value`` of the request key ``key`` against :data:`SETTING_RANGES` (a whole
    number for an integer range), naming it ``name`` (a flag, or a request's field).

    Raises:
        InvalidArgument: outside the range, or not finite.
    """
    low, high = SETTING_RANGES[key]
    if isinstance(low, int) and isinstance(high, int):
        if not (isinstance(value, int) or (isinstance(value, float) and value.is_integer())):
            raise InvalidArgument(f"{name} must be a whole number, got {_short(value)}")
        check_int(name, int(value), low, high)
    else:
        check_float(name, float(value), float(low), float(high))


def check_hires_scale(scale: float, name: str = "--hires-scale") -> None:
    """Refuse a hires scale that is not a finite number up to :data:`MAX_HIRES_SCALE` (a NaN
    or infinite scale has no picture size). Raises InvalidArgument naming ``name``."""
    if not math.isfinite(scale) or scale > MAX_HIRES_SCALE:
        raise InvalidArgument(f"{name} {scale}: must be a finite number, at most {MAX_HIRES_SCALE:g}")


def _short(value: object) -> str:
    text = str(value)
    return text if len(text) <= 40 else f"{text[:20]}… ({len(text)} digits)"


def check_generation(args: argparse.Namespace) -> None:
    """Check every numeric and text limit of ``sdplan generate``'s flags (module docstring);
    flags the namespace lacks are skipped.

    Raises:
        InvalidArgument: the first flag out of range.
    """
    def ranged(flag: str, key: str) -> tuple[str, str, int, int]:
        low, high = SETTING_RANGES[key]
        return flag, key, int(low), int(high)

    ints = (ranged("-W/--width", "width"), ranged("-H/--height", "height"), ranged("--steps", "steps"),
            ranged("-b/--batch-count", "batch_count"),
            ("--upscale-repeats", "upscale_repeats", 1, MAX_UPSCALE_REPEATS),
            ("-t/--threads", "threads", 0, MAX_THREADS),
            ranged("--clip-skip", "clip_skip"), ranged("-s/--seed", "seed"), ("--t5-length", "t5_length", 1, 4096),
            *((flag, attr, 1, MAX_HEADS) for flag, attr in (
                ("--clip-heads", "clip_heads"), ("--unet-heads", "unet_heads"),
                ("--unet-head-dim", "unet_head_dim"), ("--flux-heads", "flux_heads"))))
    for flag, attr, low, high in ints:
        value = getattr(args, attr, None)
        if value is not None:
            check_int(flag, int(value), low, high)
    for flag, attr in (("--cfg-scale", "cfg_scale"), ("--guidance", "guidance")):
        fvalue = getattr(args, attr, None)
        if fvalue is not None:
            check_float(flag, float(fvalue), *SETTING_RANGES[attr])
    for flag, attr in (("-p/--prompt", "prompt"), ("-n/--negative-prompt", "negative_prompt")):
        text = getattr(args, attr, None)
        if text is not None:
            check_text(flag, str(text))


def check_upscale(args: argparse.Namespace) -> None:
    """Check ``sdplan upscale``'s numeric flags (repeats, tile, threads).

    Raises:
        InvalidArgument: the first flag out of range.
    """
    check_int("--upscale-repeats", int(args.upscale_repeats), 1, MAX_UPSCALE_REPEATS)
    if args.upscale_tile is not None:
        check_int("--upscale-tile", int(args.upscale_tile), 8, MAX_SIDE)
    check_int("-t/--threads", int(args.threads), 0, MAX_THREADS)
