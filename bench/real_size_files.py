"""Random-weight model files in the released layouts, for bench/bench_real_size.py.

Each family the engine runs (:data:`sdplan.core.families.registry.FAMILIES`, ``runs``) gets a
recipe here: the sd-cli flags of its files (``--model``, ``--diffusion-model``, ``--vae``...)
and, for each, the real tensor names and shapes from ``../shared/models/real_size_key_layouts.json``
(layout keys, name prefixes) and the dtype the released file has. A family whose files have no
real-size layout there has ``None`` and the reason.

:func:`write_random` writes one file: the safetensors header, then every tensor's data drawn from
a pool of random values (normal, std 0.02; 1-D tensors named like norms are 1, other 1-D 0),
each tensor a slice of the pool at its own offset, so gigabytes cost disk time only. Integer
tensors (``position_ids``, ``num_batches_tracked``) are written as the real files hold them.
:func:`write_sparse_header` writes the same header with the data region sparse (tests).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: bytes per element of the dtypes written here (safetensors names)
ITEM = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8}


@dataclass(frozen=True)
class FilePart:
    """Tensors of one layout key in a file: names prefixed with ``prefix``."""

    key: str
    prefix: str = ""
    strip: str = ""  # a prefix the layout's names carry that the file does not


@dataclass(frozen=True)
class ModelFile:
    """One file of a family's set: the sd-cli flag that names it, its parts, its dtype (the
    released file's), and the bytes budget it must fit in RAM for bf16 (else Q8_0)."""

    flag: str
    name: str
    parts: tuple[FilePart, ...]
    dtype: str


CLIP_TM = "cond_stage_model.transformer.text_model."

#: layouts derived here from stored ones (:func:`layouts`): OpenCLIP ViT-bigG in transformers
#: names (SD3's standalone ``clip_g.safetensors``) from SDXL's single file, CLIP ViT-L with its
#: ``text_projection.weight`` (SD3's ``clip_l.safetensors``, a ``CLIPTextModelWithProjection``;
#: FLUX.1's has none), and Chroma's DiT from FLUX.1-dev's
CLIP_G_HF, CLIP_L_PROJ, CHROMA = "clip_g_hf (derived)", "clip_l_proj (derived)", "chroma_dit (derived)"
OPEN_CLIP_G = "conditioner.embedders.1.model."

#: family name -> its files as released (None: no real-size layout of some file; the reason).
RECIPES: dict[str, tuple[ModelFile, ...] | str] = {
    "sd1": (ModelFile("--model", "sd15.safetensors",
                      (FilePart("sd15_unet_ldm"), FilePart("sd_vae_ldm"), FilePart("clip_l_hf", CLIP_TM)), "F16"),),
    "sd2": "no SD 2.x layout (OpenCLIP ViT-H text encoder, 768 px UNet) in ../shared/models",
    "sdxl": (ModelFile("--model", "sdxl_base.safetensors", (FilePart("sdxl_base_ldm_full"),), "F16"),),
    "sd3": (ModelFile("--diffusion-model", "sd3_medium.safetensors", (FilePart("sd3_medium_sai"),), "F16"),
            ModelFile("--clip_l", "clip_l.safetensors", (FilePart(CLIP_L_PROJ),), "F16"),
            ModelFile("--clip_g", "clip_g.safetensors", (FilePart(CLIP_G_HF),), "F16"),
            ModelFile("--t5xxl", "t5xxl.safetensors", (FilePart("t5xxl_hf"),), "F16"),
            ModelFile("--vae", "ae.safetensors", (FilePart("flux1_ae_bfl"),), "F32")),
    "flux": (ModelFile("--diffusion-model", "flux1-dev.safetensors", (FilePart("flux1_dev_bfl"),), "BF16"),
             ModelFile("--clip_l", "clip_l.safetensors", (FilePart("clip_l_hf", "text_model."),), "F16"),
             ModelFile("--t5xxl", "t5xxl.safetensors", (FilePart("t5xxl_hf"),), "F16"),
             ModelFile("--vae", "ae.safetensors", (FilePart("flux1_ae_bfl"),), "F32")),
    "chroma": (ModelFile("--diffusion-model", "chroma1_hd.safetensors", (FilePart(CHROMA),), "BF16"),
               ModelFile("--t5xxl", "t5xxl.safetensors", (FilePart("t5xxl_hf"),), "F16"),
               ModelFile("--vae", "ae.safetensors", (FilePart("flux1_ae_bfl"),), "F32")),
    "flux2_klein": (ModelFile("--diffusion-model", "flux-2-klein-4b.safetensors", (FilePart("flux2_klein_4b"),), "BF16"),
                    ModelFile("--llm", "qwen_3_4b.safetensors", (FilePart("qwen3_4b_hf"),), "BF16"),
                    ModelFile("--vae", "flux2-vae.safetensors", (FilePart("flux2_vae"),), "F32")),
    "z_image": (ModelFile("--diffusion-model", "z_image_turbo_bf16.safetensors", (FilePart("z_image_turbo"),), "BF16"),
                ModelFile("--llm", "qwen_3_4b.safetensors", (FilePart("qwen3_4b_hf"),), "BF16"),
                ModelFile("--vae", "ae.safetensors", (FilePart("flux1_ae_bfl"),), "F32")),
    "qwen_image": (ModelFile("--diffusion-model", "qwen_image_bf16.safetensors", (FilePart("qwen_image_dit"),), "BF16"),
                   ModelFile("--llm", "qwen_2.5_vl_7b.safetensors", (FilePart("qwen25vl_7b_llm"),), "BF16"),
                   ModelFile("--vae", "qwen_image_vae.safetensors", (FilePart("qwen_image_vae"),), "BF16")),
    "flux2": "no FLUX.2 dev DiT or Mistral-Small-3.2 encoder layout in ../shared/models (the plan's "
             "tests read one derived from the published configurations)",
    "wan": "Wan 2.2 T2V-A14B's layouts are in ../shared/models, but its two 14 B experts (28.6 GB each "
           "in F16, 15.4 GB in Q8_0) and an 81-frame 480p video exceed this bench's RAM and time; "
           "TI2V-5B is refused by the engine (planned only)",
}

#: tensors real files hold as integers (and their dtype), by name ending
INT_TENSORS = ("position_ids", "num_batches_tracked")


def layouts(shared: Path) -> dict[str, dict[str, list[int]]]:
    """The real-size layouts (``../shared/models/real_size_key_layouts.json``), plus the
    derived ones of :data:`CLIP_G_HF`, :data:`CLIP_L_PROJ` and :data:`CHROMA`."""
    from dit_cut import chroma_layout

    lay: dict[str, dict[str, list[int]]] = json.loads(
        (shared / "models" / "real_size_key_layouts.json").read_text())
    lay[CLIP_G_HF] = clip_g_hf(lay["sdxl_base_ldm_full"])
    clip_l = {"text_model." + n: list(v) for n, v in lay["clip_l_hf"].items()}
    width = clip_l["text_model.final_layer_norm.weight"][0]
    lay[CLIP_L_PROJ] = {**clip_l, "text_projection.weight": [width, width]}
    lay[CHROMA] = {n: list(s) for n, s in chroma_layout(lay["flux1_dev_bfl"]).items()}
    return lay


def clip_g_hf(sdxl: Mapping[str, list[int]]) -> dict[str, list[int]]:
    """ViT-bigG's text tower in transformers ``CLIPTextModelWithProjection`` names (as SD3's
    ``clip_g.safetensors`` is released: ``text_model.*``, q/k/v split, ``text_projection.weight``)
    from the OpenCLIP names under :data:`OPEN_CLIP_G` in SDXL's single file, renamed by
    :func:`sdplan.core.modelfiles.openclip_names.convert_openclip`; ``logit_scale`` dropped.
    Shapes in PyTorch order."""
    from sdplan.core.modelfiles.openclip_names import convert_openclip

    return convert_openclip({n: list(v) for n, v in sdxl.items()}, OPEN_CLIP_G,
                            split=lambda s, n: [[s[0] // n, *s[1:]] for _ in range(n)],
                            transpose=lambda s: s[::-1])


def shapes_of(mf: ModelFile, lay: Mapping[str, Mapping[str, list[int]]]) -> dict[str, list[int]]:
    """File tensor name -> shape (PyTorch order) of ``mf``."""
    out: dict[str, list[int]] = {}
    for p in mf.parts:
        for n, s in lay[p.key].items():
            out[p.prefix + n.removeprefix(p.strip)] = list(s)
    return out


def _dtype_of(name: str, shape: list[int], dtype: str) -> str:
    if name.endswith(INT_TENSORS):
        return "I64"
    return "F32" if dtype == "F32" or len(shape) <= 1 else dtype


def _header(shapes: Mapping[str, list[int]], dtype: str) -> tuple[bytes, int]:
    header, off = {}, 0
    for name, shape in shapes.items():
        dt = _dtype_of(name, shape, dtype)
        n = math.prod(shape) * ITEM[dt]
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)  # data aligned to 8 bytes, as safetensors writers do
    return struct.pack("<Q", len(hb)) + hb, off


def write_sparse_header(path: Path, mf: ModelFile, lay: Mapping[str, Mapping[str, list[int]]]) -> int:
    """The file's header with its data region sparse (no disk space); returns data bytes."""
    head, size = _header(shapes_of(mf, lay), mf.dtype)
    with open(path, "wb") as fh:
        fh.write(head)
        fh.seek(size - 1, 1)
        fh.write(b"\0")
    return size


def _pool(dtype: str, n: int, seed: int) -> np.ndarray:
    """``n`` random normal values (std 0.02) as the raw bytes of ``dtype``."""
    x = (np.random.default_rng(seed).standard_normal(n, dtype=np.float32) * 0.02)
    if dtype == "F32":
        return x.view(np.uint8)
    if dtype == "F16":
        return x.astype(np.float16).view(np.uint8)
    return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)  # bf16: the top half


def write_random(path: Path, mf: ModelFile, lay: Mapping[str, Mapping[str, list[int]]], seed: int = 0,
                 pool_values: int = 1 << 24) -> int:
    """Write ``mf`` at ``path`` with random weights (module docstring); returns data bytes."""
    shapes = shapes_of(mf, lay)
    head, size = _header(shapes, mf.dtype)
    pools = {dt: _pool(dt, pool_values, seed + i) for i, dt in enumerate(("F32", "F16", "BF16"))}
    rng = np.random.default_rng(seed + 7)
    with open(path, "wb") as fh:
        fh.write(head)
        for name, shape in shapes.items():
            dt = _dtype_of(name, shape, mf.dtype)
            count = math.prod(shape)
            if dt == "I64":
                vals = np.arange(count, dtype=np.int64) if name.endswith("position_ids") else np.zeros(count, np.int64)
                fh.write(vals.tobytes())
                continue
            if len(shape) <= 1:
                one = 1.0 if any(k in name for k in ("norm", "scale", "gamma", "running_var")) else 0.0
                arr = np.full(count, one, np.float32)
                fh.write(arr.tobytes() if dt == "F32" else _pool_of_const(arr, dt))
                continue
            nbytes, pool = count * ITEM[dt], pools[dt]
            at = int(rng.integers(0, pool.size // 2)) & ~7
            while nbytes > 0:
                take = min(nbytes, pool.size - at)
                fh.write(pool[at:at + take].data)
                nbytes -= take
                at = 0
    return size


def _pool_of_const(arr: np.ndarray, dt: str) -> bytes:
    if dt == "F16":
        return arr.astype(np.float16).tobytes()
    return (arr.view(np.uint32) >> 16).astype(np.uint16).tobytes()
