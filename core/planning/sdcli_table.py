"""sd-cli's argument table: every option of the ``sd-cli`` command, its short form and arity.

Taken from stable-diffusion.cpp at commit ``97d2990807fe6d558e395f8764198d7c7e7b411c``
(``examples/cli/main.cpp``: the CLI options; ``examples/common/common.cpp``: the context and
generation options); ``tools/sdcli_flags.py`` lists them again from a newer snapshot. Only
names, arities and how repeats combine are recorded here, which is all a reader needs to
split a pasted command exactly as sd-cli does: sd-cli matches each argument against the
table (no ``--flag=value`` form, no abbreviations), a flag of arity 1 takes the next
argument whatever it looks like (``--max-vram -1``), and an argument that is no flag of the
table is an error ("unknown argument").

The newest sd-cli (after that commit; spec section 14) adds ``--disable-prefetch``,
``--disable-segmented-compute``, ``--split-ratio`` and ``--tokenizer`` (listed after the
snapshot's, :data:`NEWEST_ROWS`), gives ``--auto-fit`` the value ``on|off`` and drops
``--stream-layers``; the table holds both so a command of either dialect reads, and
``--auto-fit`` takes a following ``on``/``off`` as its value
(:mod:`sdplan.core.planning.target` says which dialect has which option).

Repeats: ``join`` options append their value to the earlier one with ``,`` (``--backend``,
``--params-backend``, ``--split-mode``, ``--rpc-servers``, ``--tensor-type-rules``,
``--model-args`` and the ``--extra-*-args`` lists); ``append`` options collect a list
(``--ref-image``...); every other option keeps its last value.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SDCLI_COMMIT", "SdcliOption", "SDCLI_OPTIONS", "NEWEST_ROWS", "option", "ALIASES"]

#: The stable-diffusion.cpp commit the table was read from.
SDCLI_COMMIT = "97d2990807fe6d558e395f8764198d7c7e7b411c"


@dataclass(frozen=True)
class SdcliOption:
    """One sd-cli option.

    Attributes:
        long: the long spelling (``--sampling-method``); the option's identity.
        short: the short spelling (``-s``) or ``""``.
        values: arguments it takes after the flag (0 for switches, else 1).
        repeat: ``join`` (values joined with ``,``), ``append`` (a list) or ``last``.
        group: sd-cli's help section: ``cli``, ``context`` or ``generation``.
    """

    long: str
    short: str
    values: int
    repeat: str
    group: str

    @property
    def spellings(self) -> tuple[str, ...]:
        """The long spelling, then the short one when there is one."""
        return (self.long, self.short) if self.short else (self.long,)


_ROWS: tuple[tuple[str, str, int, str, str], ...] = (
    # cli
    ("--output", "-o", 1, "last", "cli"),
    ("--image", "", 1, "last", "cli"),
    ("--metadata-format", "", 1, "last", "cli"),
    ("--preview-path", "", 1, "last", "cli"),
    ("--imat-out", "", 1, "last", "cli"),
    ("--preview-interval", "", 1, "last", "cli"),
    ("--output-begin-idx", "", 1, "last", "cli"),
    ("--canny", "", 0, "last", "cli"),
    ("--convert-name", "", 0, "last", "cli"),
    ("--verbose", "-v", 0, "last", "cli"),
    ("--color", "", 0, "last", "cli"),
    ("--taesd-preview-only", "", 0, "last", "cli"),
    ("--preview-noisy", "", 0, "last", "cli"),
    ("--metadata-raw", "", 0, "last", "cli"),
    ("--metadata-brief", "", 0, "last", "cli"),
    ("--metadata-all", "", 0, "last", "cli"),
    ("--mode", "-M", 1, "last", "cli"),
    ("--preview", "", 1, "last", "cli"),
    ("--help", "-h", 0, "last", "cli"),
    ("--imat-in", "", 1, "append", "cli"),
    # context
    ("--model", "-m", 1, "last", "context"),
    ("--clip_l", "", 1, "last", "context"),
    ("--clip_g", "", 1, "last", "context"),
    ("--clip_vision", "", 1, "last", "context"),
    ("--t5xxl", "", 1, "last", "context"),
    ("--llm", "", 1, "last", "context"),
    ("--llm_vision", "", 1, "last", "context"),
    ("--qwen2vl", "", 1, "last", "context"),
    ("--qwen2vl_vision", "", 1, "last", "context"),
    ("--diffusion-model", "", 1, "last", "context"),
    ("--high-noise-diffusion-model", "", 1, "last", "context"),
    ("--uncond-diffusion-model", "", 1, "last", "context"),
    ("--embeddings-connectors", "", 1, "last", "context"),
    ("--vae", "", 1, "last", "context"),
    ("--vae-format", "", 1, "last", "context"),
    ("--audio-vae", "", 1, "last", "context"),
    ("--taesd", "", 1, "last", "context"),
    ("--tae", "", 1, "last", "context"),
    ("--control-net", "", 1, "last", "context"),
    ("--ip-adapter", "", 1, "last", "context"),
    ("--motion-module", "", 1, "last", "context"),
    ("--embd-dir", "", 1, "last", "context"),
    ("--lora-model-dir", "", 1, "last", "context"),
    ("--hires-upscalers-dir", "", 1, "last", "context"),
    ("--tensor-type-rules", "", 1, "join", "context"),
    ("--model-args", "", 1, "join", "context"),
    ("--photo-maker", "", 1, "last", "context"),
    ("--pulid-weights", "", 1, "last", "context"),
    ("--upscale-model", "", 1, "last", "context"),
    ("--backend", "", 1, "join", "context"),
    ("--params-backend", "", 1, "join", "context"),
    ("--split-mode", "", 1, "join", "context"),
    ("--rpc-servers", "", 1, "join", "context"),
    ("--max-vram", "", 1, "last", "context"),
    ("--threads", "-t", 1, "last", "context"),
    ("--stream-layers", "", 0, "last", "context"),
    ("--eager-load", "", 0, "last", "context"),
    ("--auto-fit", "", 0, "last", "context"),
    ("--force-sdxl-vae-conv-scale", "", 0, "last", "context"),
    ("--offload-to-cpu", "", 0, "last", "context"),
    ("--mmap", "", 0, "last", "context"),
    ("--control-net-cpu", "", 0, "last", "context"),
    ("--clip-on-cpu", "", 0, "last", "context"),
    ("--vae-on-cpu", "", 0, "last", "context"),
    ("--fa", "", 0, "last", "context"),
    ("--diffusion-fa", "", 0, "last", "context"),
    ("--diffusion-conv-direct", "", 0, "last", "context"),
    ("--vae-conv-direct", "", 0, "last", "context"),
    ("--type", "", 1, "last", "context"),
    ("--rng", "", 1, "last", "context"),
    ("--sampler-rng", "", 1, "last", "context"),
    ("--prediction", "", 1, "last", "context"),
    ("--lora-apply-mode", "", 1, "last", "context"),
    ("--list-devices", "", 0, "last", "context"),
    # generation
    ("--prompt", "-p", 1, "last", "generation"),
    ("--negative-prompt", "-n", 1, "last", "generation"),
    ("--ad-model", "", 1, "last", "generation"),
    ("--ad-prompt", "", 1, "last", "generation"),
    ("--ad-negative-prompt", "", 1, "last", "generation"),
    ("--extra-ad-args", "", 1, "join", "generation"),
    ("--init-img", "-i", 1, "last", "generation"),
    ("--end-img", "", 1, "last", "generation"),
    ("--mask", "", 1, "last", "generation"),
    ("--control-image", "", 1, "last", "generation"),
    ("--ip-adapter-image", "", 1, "last", "generation"),
    ("--control-video", "", 1, "last", "generation"),
    ("--pm-id-images-dir", "", 1, "last", "generation"),
    ("--pm-id-embed-path", "", 1, "last", "generation"),
    ("--pulid-id-embedding", "", 1, "last", "generation"),
    ("--hires-upscaler", "", 1, "last", "generation"),
    ("--extra-sample-args", "", 1, "join", "generation"),
    ("--extra-tiling-args", "", 1, "join", "generation"),
    ("--ref-image-args", "", 1, "join", "generation"),
    ("--height", "-H", 1, "last", "generation"),
    ("--width", "-W", 1, "last", "generation"),
    ("--steps", "", 1, "last", "generation"),
    ("--high-noise-steps", "", 1, "last", "generation"),
    ("--clip-skip", "", 1, "last", "generation"),
    ("--batch-count", "-b", 1, "last", "generation"),
    ("--qwen-image-layers", "", 1, "last", "generation"),
    ("--video-frames", "", 1, "last", "generation"),
    ("--fps", "", 1, "last", "generation"),
    ("--timestep-shift", "", 1, "last", "generation"),
    ("--upscale-repeats", "", 1, "last", "generation"),
    ("--upscale-tile-size", "", 1, "last", "generation"),
    ("--hires-width", "", 1, "last", "generation"),
    ("--hires-height", "", 1, "last", "generation"),
    ("--hires-steps", "", 1, "last", "generation"),
    ("--hires-upscale-tile-size", "", 1, "last", "generation"),
    ("--cfg-scale", "", 1, "last", "generation"),
    ("--img-cfg-scale", "", 1, "last", "generation"),
    ("--guidance", "", 1, "last", "generation"),
    ("--slg-scale", "", 1, "last", "generation"),
    ("--skip-layer-start", "", 1, "last", "generation"),
    ("--skip-layer-end", "", 1, "last", "generation"),
    ("--eta", "", 1, "last", "generation"),
    ("--flow-shift", "", 1, "last", "generation"),
    ("--high-noise-cfg-scale", "", 1, "last", "generation"),
    ("--high-noise-img-cfg-scale", "", 1, "last", "generation"),
    ("--high-noise-guidance", "", 1, "last", "generation"),
    ("--high-noise-slg-scale", "", 1, "last", "generation"),
    ("--high-noise-skip-layer-start", "", 1, "last", "generation"),
    ("--high-noise-skip-layer-end", "", 1, "last", "generation"),
    ("--high-noise-eta", "", 1, "last", "generation"),
    ("--strength", "", 1, "last", "generation"),
    ("--pm-style-strength", "", 1, "last", "generation"),
    ("--pulid-id-weight", "", 1, "last", "generation"),
    ("--control-strength", "", 1, "last", "generation"),
    ("--ip-adapter-strength", "", 1, "last", "generation"),
    ("--moe-boundary", "", 1, "last", "generation"),
    ("--vace-strength", "", 1, "last", "generation"),
    ("--vae-tile-overlap", "", 1, "last", "generation"),
    ("--hires-scale", "", 1, "last", "generation"),
    ("--hires-denoising-strength", "", 1, "last", "generation"),
    ("--increase-ref-index", "", 0, "last", "generation"),
    ("--disable-auto-resize-ref-image", "", 0, "last", "generation"),
    ("--circular", "", 0, "last", "generation"),
    ("--circularx", "", 0, "last", "generation"),
    ("--circulary", "", 0, "last", "generation"),
    ("--disable-image-metadata", "", 0, "last", "generation"),
    ("--vae-tiling", "", 0, "last", "generation"),
    ("--temporal-tiling", "", 0, "last", "generation"),
    ("--hires", "", 0, "last", "generation"),
    ("--seed", "-s", 1, "last", "generation"),
    ("--sampling-method", "", 1, "last", "generation"),
    ("--high-noise-sampling-method", "", 1, "last", "generation"),
    ("--scheduler", "", 1, "last", "generation"),
    ("--sigmas", "", 1, "last", "generation"),
    ("--hires-sigmas", "", 1, "last", "generation"),
    ("--skip-layers", "", 1, "last", "generation"),
    ("--high-noise-skip-layers", "", 1, "last", "generation"),
    ("--ref-image", "-r", 1, "append", "generation"),
    ("--ref-video", "", 1, "append", "generation"),
    ("--ref-video-audio", "", 1, "append", "generation"),
    ("--ref-audio", "", 1, "append", "generation"),
    ("--cache-mode", "", 1, "last", "generation"),
    ("--cache-option", "", 1, "last", "generation"),
    ("--scm-mask", "", 1, "last", "generation"),
    ("--scm-policy", "", 1, "last", "generation"),
    ("--vae-tile-size", "", 1, "last", "generation"),
    ("--vae-relative-tile-size", "", 1, "last", "generation"),
    ("--prompt-file", "", 1, "last", "generation"),
    ("--negative-prompt-file", "", 1, "last", "generation"),
)

#: Options of the newest sd-cli that the snapshot lacks (spec sections 14.2, 14.4, 14.8).
NEWEST_ROWS: tuple[tuple[str, str, int, str, str], ...] = (
    ("--tokenizer", "", 1, "last", "context"),
    ("--split-ratio", "", 1, "last", "context"),
    ("--disable-prefetch", "", 0, "last", "context"),
    ("--disable-segmented-compute", "", 0, "last", "context"),
)

#: Every sd-cli option of either dialect, in sd-cli's help order (the newest's additions last).
SDCLI_OPTIONS: tuple[SdcliOption, ...] = tuple(SdcliOption(*row) for row in (*_ROWS, *NEWEST_ROWS))
_BY_SPELLING = {s: o for o in SDCLI_OPTIONS for s in o.spellings}
#: Deprecated or alternative spellings sd-cli reads into another option's value:
#: spelling -> the long spelling of the option it sets.
ALIASES = {"--qwen2vl": "--llm", "--qwen2vl_vision": "--llm_vision", "--tae": "--taesd"}


def option(spelling: str) -> SdcliOption | None:
    """The option spelled ``spelling`` exactly (``-p``, ``--prompt``), or None: sd-cli matches
    whole spellings, case-sensitively."""
    return _BY_SPELLING.get(spelling)
