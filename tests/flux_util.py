"""Shared helpers of the Flux-family tests: fixture paths, references, tiny GGUF writers."""

from __future__ import annotations

from pathlib import Path

import numpy as np

FIX = Path(__file__).resolve().parent / "fixtures"
DEV = FIX / "flux_dev_tiny.safetensors"
SCHNELL = FIX / "flux_schnell_tiny.safetensors"
T5 = FIX / "t5_tiny.safetensors"
CLIP = FIX / "clip_l_tiny.safetensors"
AE = FIX / "flux_ae_tiny.safetensors"
REF = FIX / "flux_ref.safetensors"
CHROMA = FIX / "chroma_tiny.safetensors"
CHROMA_REF = FIX / "chroma_ref.safetensors"
AXES = (4, 6, 6)


def ref(path: Path = REF) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """Largest absolute difference relative to the reference's largest magnitude."""
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a - b).max() / np.abs(b).max())


def write_gguf(src: Path, dst: Path, dtype: str) -> None:
    """Copy the safetensors file ``src`` into a GGUF file with matrices in ``dtype``
    (``f32``, ``f16``, ``bf16``, ``q8_0``, ``q4_0``; vectors stay f32), quantised by gguf."""
    import gguf
    from safetensors.numpy import load_file

    kinds = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0,
             "bf16": gguf.GGMLQuantizationType.BF16}
    w = gguf.GGUFWriter(str(dst), "flux")
    for name, arr in load_file(str(src)).items():
        a = arr.astype(np.float32)
        if a.ndim != 2 or dtype == "f32":
            w.add_tensor(name, a)
        elif dtype == "f16" or (dtype.startswith("q") and a.shape[1] % 32):  # rows too short to quantise
            w.add_tensor(name, a.astype(np.float16))
        else:
            q = gguf.quants.quantize(a, kinds[dtype])
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=kinds[dtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
