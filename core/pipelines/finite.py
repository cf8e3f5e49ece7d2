"""Why a generation's numbers became NaN or infinite: the likely cause named in the error.

The sampling loops and the pictures' conversion raise
:class:`~sdplan.core.errors.NonFiniteError` at the first non-finite value
(:mod:`sdplan.core.sampling.finite`); :func:`explains_non_finite` wraps an engine job so that
the error names what in its request most likely did it, in this order:

1. **weights**: the first tensor holding NaN or infinity in a model file, LoRA file or
   upscaler the request names (float tensors of safetensors / GGUF files read in chunks of
   :data:`SCAN_CHUNK_BYTES`, at most :data:`MAX_SCAN_BYTES` in all; ``.pth`` upscalers
   through the restricted reader);
2. **sigmas**: custom ``--sigmas`` larger than :data:`LARGE_SIGMA` (float32 latents times
   such a sigma overflow);
3. **LoRA weight**: a ``<lora:NAME:W>`` tag with ``|W|`` above 1 (a patch scaled past its
   training makes the weights overflow in f16).

When none of these is found the message says so and names the three places to look.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import NonFiniteError, SdplanError

__all__ = ["likely_causes", "explains_non_finite", "non_finite_tensor", "LARGE_SIGMA",
           "MAX_SCAN_BYTES"]

#: A custom sigma above this is named as a likely cause (SD's largest trained sigma is
#: about 14.6, flow models' 1; float32 overflows past about 3.4e38).
LARGE_SIGMA = 1000.0
#: Bytes of weights read at most when looking for a non-finite tensor.
MAX_SCAN_BYTES = 64 * 2**30
#: Bytes of a tensor read at a time.
SCAN_CHUNK_BYTES = 64 * 2**20

_FLOATS = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": np.uint16}


def _bad_values(a: np.ndarray, bf16: bool) -> bool:
    if bf16:  # exponent bits all set: infinity or NaN
        return bool(((a & 0x7F80) == 0x7F80).any())
    return not bool(np.isfinite(a).all())


def non_finite_tensor(path: str | Path, budget: list[int] | None = None) -> str | None:
    """The name of the first tensor of a model file holding NaN or infinity, or None (also
    when the file cannot be read, or ``budget`` (one-element list of bytes left) runs out).

    safetensors and GGUF float tensors (F32, F16, BF16, F64) are read in chunks from the
    file; a ``.pth``/``.ckpt`` through :func:`sdplan.core.modelfiles.pth.load_pth_tensors`;
    quantised tensors are skipped.
    """
    left = budget if budget is not None else [MAX_SCAN_BYTES]
    try:
        from sdplan.core.modelfiles.pth import is_pth, load_pth_tensors

        if is_pth(path):
            for name, arr in load_pth_tensors(path).items():
                if np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
                    return name
            return None
        from sdplan.core.modelfiles.readers import read_tensor_file

        tensors = read_tensor_file(path).tensors
    except (SdplanError, OSError, ValueError):
        return None
    for t in tensors:
        dt = _FLOATS.get(t.dtype.upper())
        if dt is None or not t.nbytes:
            continue
        if t.nbytes > left[0]:
            return None
        left[0] -= t.nbytes
        mm = np.memmap(path, dtype=dt, mode="r", offset=t.offset, shape=(t.nbytes // np.dtype(dt).itemsize,))
        step = max(SCAN_CHUNK_BYTES // np.dtype(dt).itemsize, 1)
        for i in range(0, mm.size, step):
            if _bad_values(np.asarray(mm[i:i + step]), dt is np.uint16):
                return t.name
    return None


def _paths(value: Any) -> list[str]:
    if isinstance(value, (str, Path)):
        return [str(value)]
    return [str(v) for v in value or ()]


def likely_causes(request: Mapping[str, Any]) -> tuple[str, ...]:
    """What in an engine ``request`` (:mod:`sdplan.core.pipelines.jobs`' keys) most likely made
    its numbers non-finite (module docstring), most likely first; the three places to look
    when nothing stands out."""
    causes: list[str] = []
    budget = [MAX_SCAN_BYTES]
    files = request.get("model_files") or {}
    for value in files.values():
        for path in _paths(value):
            name = non_finite_tensor(path, budget)
            if name is not None:
                causes.append(f"weights: tensor {name!r} of {path} holds NaN or infinite values")
    prompt = str(request.get("prompt") or "")
    tags: list[tuple[str, float]] = []
    if "<lora:" in prompt:
        from sdplan.core.text.lora_tags import extract_lora_tags

        try:
            tags = [(t.name, t.weight) for t in extract_lora_tags(prompt)[1]]
        except SdplanError:
            tags = []
        from sdplan.core.modelfiles.lora import find_lora_file

        for name, _ in tags:
            try:
                path = find_lora_file(name, request.get("lora_model_dir"))
            except SdplanError:
                continue
            bad = non_finite_tensor(path, budget)
            if bad is not None:
                causes.append(f"weights: tensor {bad!r} of the LoRA {path} holds NaN or infinite values")
    sigmas = [float(s) for s in request.get("sigmas") or ()]
    if sigmas and max(sigmas) > LARGE_SIGMA:
        causes.append(f"sigmas: --sigmas holds {max(sigmas):g} (a latent that noisy overflows; "
                      f"trained sigmas stay below about 15, flow models' below 1)")
    for name, weight in tags:
        if abs(weight) > 1.0:
            causes.append(f"LoRA weight: <lora:{name}:{weight:g}> scales its patch past what it "
                          "was trained for (try 0.5 to 1)")
    if not causes:
        causes.append("no tensor of the files holds NaN or infinity; look at the model's "
                      "precision (f16 weights that overflow), --sigmas, the LoRA weights and "
                      "--cfg-scale")
    return tuple(causes)


def explains_non_finite(job: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap an engine job ``job(ctx, request, ...)`` so that a NonFiniteError it raises names
    the likely causes of its ``request`` (:func:`likely_causes`)."""
    @functools.wraps(job)
    def run(ctx: Any, request: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return job(ctx, request, *args, **kwargs)
        except NonFiniteError as exc:
            data = request.to_dict() if hasattr(request, "to_dict") else request
            raise exc.with_causes(likely_causes(data)) from None
    return run
