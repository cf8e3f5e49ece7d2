"""Shared helpers of the SDXL tests: fixture paths and references, the tiny single file split
into the separate files users download (``--diffusion-model``, ``--clip_l``, ``--clip_g``,
``--vae``), and GGUF UNets quantised as sd-cli writes them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from flux_util import rel_err as rel_err  # re-exported: one formula for all tests

FIX = Path(__file__).resolve().parent / "fixtures"
BASE = FIX / "sdxl_tiny.safetensors"
REFINER = FIX / "sdxl_refiner_tiny.safetensors"
UNET = "model.diffusion_model."
CLIP_L = "conditioner.embedders.0.transformer.text_model."
CLIP_G = "conditioner.embedders.1.model."
VAE = "first_stage_model."


def ref(name: str = "sdxl") -> dict[str, np.ndarray]:
    """The stored diffusers references of ``sdxl`` or ``sdxl_refiner``."""
    from safetensors.numpy import load_file

    return load_file(str(FIX / f"{name}_ref.safetensors"))


def _metadata(path: Path) -> dict[str, str]:
    from sdplan.core.modelfiles.readers import read_tensor_file

    return dict(read_tensor_file(path).metadata)


def openclip_to_hf(sd: dict[str, np.ndarray], prefix: str) -> dict[str, np.ndarray]:
    """An open_clip text tower under ``prefix`` -> transformers ``CLIPTextModelWithProjection``
    names (``text_model.*`` with split q/k/v, ``text_projection.weight`` = ``P.T``), as the
    standalone ``clip_g.safetensors`` files store bigG
    (:func:`sdplan.core.modelfiles.openclip_names.convert_openclip`)."""
    from sdplan.core.modelfiles.openclip_names import convert_openclip

    return convert_openclip(sd, prefix, split=lambda a, n: [np.ascontiguousarray(p) for p in np.split(a, n)],
                            transpose=lambda a: np.ascontiguousarray(a.T))


def split_files(dst: Path, unet_prefix: str = "") -> dict[str, list[str]]:
    """Write the tiny base model as separate files into ``dst``: the UNet (names with
    ``unet_prefix``), ``clip_l.safetensors`` and ``clip_g.safetensors`` in transformers names
    (``text_model.``), the VAE without prefix; each with the fixture's ``sdplan.*`` metadata.
    Returns sd-cli model flags."""
    from safetensors.numpy import load_file, save_file

    sd = load_file(str(BASE))
    meta = _metadata(BASE)
    parts = {
        "diffusion_model": ("unet.safetensors", {unet_prefix + k[len(UNET):]: v for k, v in sd.items()
                                                 if k.startswith(UNET)}),
        "clip_l": ("clip_l.safetensors", {"text_model." + k[len(CLIP_L):]: v for k, v in sd.items()
                                          if k.startswith(CLIP_L)}),
        "clip_g": ("clip_g.safetensors", openclip_to_hf(sd, CLIP_G)),
        "vae": ("vae.safetensors", {k[len(VAE):]: v for k, v in sd.items() if k.startswith(VAE)}),
    }
    flags = {}
    for flag, (name, tensors) in parts.items():
        save_file(tensors, str(dst / name), metadata=meta)
        flags[flag] = [str(dst / name)]
    return flags


def sdcli_quantizes(name: str, shape: tuple[int, ...], block: int) -> bool:
    """sd-cli's ``tensor_should_be_converted`` for a UNet tensor: every tensor whose row
    (``ne0``, numpy's last axis) is a multiple of the quant block, except biases, ``scale``
    tensors, ``time_embed.``, ``label_emb.`` and embeddings."""
    if shape[-1] % block or name.endswith((".bias", ".scale", ".weight_scale")):
        return False
    return not any(p in name for p in ("time_embed.", "label_emb.", "embedding"))


def write_unet_gguf(src: Path, dst: Path, qtype: str, prefix: str = UNET) -> dict[str, str]:
    """The UNet of the single file ``src`` as a GGUF file sd-cli's ``-M convert --type`` would
    write (names under ``prefix``, :func:`sdcli_quantizes` tensors in ``qtype``, the rest in
    their file type), with the fixture's ``sdplan.*`` metadata as GGUF strings. Returns
    name -> the GGUF type written."""
    import gguf
    from safetensors.numpy import load_file

    kind = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}[qtype]
    block = gguf.GGML_QUANT_SIZES[kind][0]
    w = gguf.GGUFWriter(str(dst), "sdxl")
    for k, v in _metadata(src).items():
        w.add_string(k, v)
    types = {}
    for name, arr in load_file(str(src)).items():
        if not name.startswith(UNET):
            continue
        out = prefix + name[len(UNET):]
        if sdcli_quantizes(out, arr.shape, block):
            q = gguf.quants.quantize(arr.astype(np.float32), kind)
            w.add_tensor(out, q, raw_shape=q.shape, raw_dtype=kind)
            types[out] = qtype
        else:
            w.add_tensor(out, arr)
            types[out] = str(arr.dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return types
