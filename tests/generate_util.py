"""Helpers of the ``sdplan generate`` tests: the command's arguments as its parser reads
them, and a written picture as integer RGB."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image


def parse(argv: list[str]) -> argparse.Namespace:
    """``sdplan generate ARGV`` parsed by the command's own parser (``args.run(args)`` runs it)."""
    from sdplan.core.commands import generate

    p = argparse.ArgumentParser()
    generate.add_parser(p.add_subparsers())
    return p.parse_args(["generate", *argv])


def png(path: Path) -> np.ndarray:
    """The picture at ``path`` as int RGB ``(H, W, 3)``."""
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def wan_q8_gguf(src: Path, dst: Path) -> Path:
    """The Wan DiT ``src`` (a safetensors file) as a GGUF file ``dst``: matrices Q8_0 (rows of
    32), vectors f32, the 5-D patch embedding stored 4-D as GGUF holds it, the head width of
    ``src``'s metadata."""
    import gguf
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with safe_open(str(src), "np") as f:
        head_dim = (f.metadata() or {})["sdplan.head_dim"]
    w = gguf.GGUFWriter(str(dst), "wan")
    w.add_string("sdplan.head_dim", head_dim)
    for name, arr in load_file(str(src)).items():
        a = arr.astype(np.float32)
        if a.ndim == 5:
            a = a.reshape(a.shape[0], a.shape[1], a.shape[3], a.shape[4])
        if a.ndim == 2 and a.shape[1] % 32 == 0:
            q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a if a.ndim < 2 else a.astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
