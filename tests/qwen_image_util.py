"""Shared helpers of the Qwen-Image tests: the fixture paths (``make_qwen_image_fixtures.py``),
the references, the prompt, a Q8_0 GGUF copy of the DiT."""

from __future__ import annotations

from pathlib import Path

import numpy as np

FIX = Path(__file__).resolve().parent / "fixtures"
DIT = FIX / "qwen_image_tiny.safetensors"
LLM = FIX / "qwen25vl_tiny.safetensors"
VAE = FIX / "qwen_image_vae_tiny.safetensors"
REF = FIX / "qwen_image_ref.safetensors"
PROMPT = "a photo of a cat on a red sofa"
SIZE = 64  # pixels: an 8x8 latent, 4x4 DiT tokens


def ref() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(REF))


def files() -> dict[str, list[str]]:
    """The tiny model set as sd-cli's model flags."""
    return {"diffusion_model": [str(DIT)], "llm": [str(LLM)], "vae": [str(VAE)]}
