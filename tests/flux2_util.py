"""Shared helpers of the FLUX.2 klein tests: fixture paths (``make_flux2_fixtures.py``), the
references, the tiny Qwen3 encoder written whole (``zimage_util.write_qwen3``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from zimage_util import write_qwen3

FIX = Path(__file__).resolve().parent / "fixtures"
DIT = FIX / "flux2_klein_tiny.safetensors"
AE = FIX / "flux2_ae_tiny.safetensors"
PARTS = FIX / "qwen3_klein_parts.safetensors"
REF = FIX / "flux2_ref.safetensors"
PROMPT = "a photo of a cat on a red sofa"
SIZE = 16


def ref() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(REF))


def write_llm(dst: Path, fmt: str = "safetensors", dtype: str = "f16") -> Path:
    """The tiny 28-block Qwen3 encoder at ``dst`` (see :func:`zimage_util.write_qwen3`)."""
    return write_qwen3(dst, fmt, dtype, PARTS)
