"""Shared helpers of the SD3 tests: fixture paths, references, the single file with encoders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flux_util import rel_err as rel_err  # re-exported: one formula for all tests

FIX = Path(__file__).resolve().parent / "fixtures"
SD3 = FIX / "sd3_tiny.safetensors"
CLIP_L = FIX / "sd3_clip_l_tiny.safetensors"
CLIP_G = FIX / "sd3_clip_g_tiny.safetensors"
T5 = FIX / "sd3_t5_tiny.safetensors"
REF = FIX / "sd3_ref.safetensors"
PROMPT = "a photo of a cat"
CLIP_HEADS = 2


def ref() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(REF))


def write_single_file(path: Path) -> Path:
    """The tiny model as one file, as SD3's ``sd3_medium_incl_clips_t5xxlfp16.safetensors``
    names it: the DiT and VAE of ``sd3_tiny`` plus the encoders under
    ``text_encoders.{clip_l,clip_g,t5xxl}.transformer.``."""
    from safetensors.numpy import load_file, save_file

    out = dict(load_file(str(SD3)))
    for name, src in (("clip_l", CLIP_L), ("clip_g", CLIP_G), ("t5xxl", T5)):
        out |= {f"text_encoders.{name}.transformer.{k}": v for k, v in load_file(str(src)).items()}
    save_file(out, str(path))
    return path
