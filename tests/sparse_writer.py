"""Writers of sparse real-size model files for the tests: a safetensors header with the
real tensor names and shapes (``../shared/models/real_size_key_layouts.json``) and the data
region left sparse (no disk space), and a model-library folder made of them plus the test
fixtures (see :func:`make_library_folder`)."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from pathlib import Path

Layout = dict[str, list[int]]
FIXTURES = Path(__file__).parent / "fixtures"
DEMO = Path(__file__).resolve().parent.parent / "resources" / "demo" / \
    "sdplan-demo-shapes.safetensors"


def write_sparse(path: Path, shapes: Layout, dtype: str = "BF16", prefix: str = "") -> int:
    """Header with ``shapes`` (names prefixed), data region sparse; returns data bytes."""
    size = {"BF16": 2, "F16": 2, "F32": 4}[dtype]
    header, off = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape) * size
        header[prefix + name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hb)) + hb)
        fh.seek(off - 1, 1)
        fh.write(b"\0")
    return off


def _lora(unet_names: Layout, rank: int = 16, limit: int = 40) -> Layout:
    """A kohya-style LoRA layout over the first ``limit`` 2-D weights of ``unet_names``
    (``lora_unet_<name with _>.lora_down.weight`` (rank, in), ``lora_up`` (out, rank))."""
    out: Layout = {}
    picked = [(n, s) for n, s in unet_names.items() if n.endswith(".weight") and len(s) == 2]
    for name, (o, i) in picked[:limit]:
        key = "lora_unet_" + name.removeprefix("model.diffusion_model.") \
            .removesuffix(".weight").replace(".", "_")
        out[f"{key}.lora_down.weight"] = [rank, i]
        out[f"{key}.lora_up.weight"] = [o, rank]
        out[f"{key}.alpha"] = [1]
    return out


#: The library folder: relative path -> (layout key or builder, dtype, prefix,
#: (kind, family, encoders, latent channels)) as the library must report them. FLUX.2's
#: family, which sdplan does not detect yet, is compared with ``read_model_files`` instead
#: (None here).
def library_layouts(layouts: dict[str, Layout]) -> dict[str, tuple[Layout, str, str, tuple]]:
    sd_vae = {n.removeprefix("first_stage_model."): s for n, s in layouts["sd_vae_ldm"].items()}
    sd15 = {**layouts["sd15_unet_ldm"], **layouts["sd_vae_ldm"],
            **{"cond_stage_model.transformer.text_model." + n: s
               for n, s in layouts["clip_l_hf"].items()}}
    attn = {n: s for n, s in layouts["sd15_unet_ldm"].items() if "attn2.to_k" in n}
    flux_lora = {f"lora_unet_double_blocks_{i}_img_attn_qkv.lora_down.weight": [16, 3072]
                 for i in range(19)}
    flux_lora |= {f"lora_unet_double_blocks_{i}_img_attn_qkv.lora_up.weight": [9216, 16]
                  for i in range(19)}
    return {
        "diffusion_models/flux1-dev.safetensors":
            (layouts["flux1_dev_bfl"], "BF16", "", ("diffusion", "flux", (), None)),
        "diffusion_models/sd3_medium.safetensors":
            (layouts["sd3_medium_sai"], "F16", "model.diffusion_model.",
             ("diffusion", "sd3", (), None)),
        "diffusion_models/z_image_turbo_bf16.safetensors":
            (layouts["z_image_turbo"], "BF16", "", ("diffusion", "z_image", (), None)),
        "diffusion_models/flux-2-klein-4b.safetensors":
            (layouts["flux2_klein_4b"], "BF16", "", ("diffusion", None, (), None)),
        "checkpoints/v1-5-pruned-emaonly.safetensors":
            (sd15, "F16", "", ("checkpoint", "sd1", ("clip_l",), 4)),
        "checkpoints/sd_xl_base_1.0.safetensors":
            (layouts["sdxl_base_ldm_full"], "F16", "",
             ("checkpoint", "sdxl", ("clip_l", "clip_g"), 4)),
        "text_encoders/t5xxl_fp16.safetensors":
            (layouts["t5xxl_hf"], "F16", "", ("encoder", None, ("t5xxl",), None)),
        "text_encoders/clip_l.safetensors":
            (layouts["clip_l_hf"], "F16", "text_model.", ("encoder", None, ("clip_l",), None)),
        "text_encoders/qwen_3_4b.safetensors":
            (layouts["qwen3_4b_hf"], "BF16", "", ("encoder", None, ("llm",), None)),
        "vae/ae.safetensors": (layouts["flux1_ae_bfl"], "F32", "", ("vae", None, (), 16)),
        "vae/sd_vae.safetensors": (sd_vae, "F16", "", ("vae", None, (), 4)),
        "vae/flux2-vae.safetensors": (layouts["flux2_vae"], "F32", "", ("vae", None, (), 32)),
        "loras/flux_style_lora.safetensors": (flux_lora, "BF16", "", ("lora", "flux", (), None)),
        "loras/sd15_detail_lora.safetensors":
            (_lora({**attn, **layouts["sd15_unet_ldm"]}), "F16", "", ("lora", "sd1", (), None)),
    }


#: Test fixtures and shared weights copied (linked) into the folder, with what the library
#: reports for them: (kind, family, encoders, latent channels). The tiny SD fixtures carry
#: no family metadata and a scaled-down UNet: checkpoint.py calls them ``unknown``.
FIXTURE_FILES: dict[str, tuple] = {
    "sd1_tiny.safetensors": ("checkpoint", "unknown", ("clip_l",), 4),
    "sd2_tiny.safetensors": ("checkpoint", "unknown", ("clip_h",), 4),
    "flux_dev_tiny.safetensors": ("diffusion", "flux", (), None),
    "flux_schnell_tiny.safetensors": ("diffusion", "flux", (), None),
    "clip_l_tiny.safetensors": ("encoder", None, ("clip_l",), None),
    "t5_tiny.safetensors": ("encoder", None, ("t5xxl",), None),
    "flux_ae_tiny.safetensors": ("vae", None, (), 16),
    "sd1_ref.safetensors": ("unknown", None, (), None),
}


def make_library_folder(root: Path, layouts: dict[str, Layout],
                        shared: Path | None = None) -> dict[str, tuple]:
    """Write the sparse real-layout files of :func:`library_layouts` under ``root/models``
    and link the fixtures of :data:`FIXTURE_FILES` and the demo model under
    ``root/fixtures``; returns absolute path -> expected (kind, family, encoders, latent
    channels)."""
    expected: dict[str, tuple] = {}
    for rel, (shapes, dtype, prefix, want) in library_layouts(layouts).items():
        path = root / "models" / rel
        write_sparse(path, shapes, dtype, prefix)
        expected[str(path)] = want
    fx = root / "fixtures"
    fx.mkdir(parents=True, exist_ok=True)
    for name, want in FIXTURE_FILES.items():
        _link(FIXTURES / name, fx / name)
        expected[str(fx / name)] = want
    _link(DEMO, fx / DEMO.name)
    expected[str(fx / DEMO.name)] = ("checkpoint", "sd1", ("clip_l",), 4)
    if shared is not None:
        w = shared / "weights"
        _link(w / "realesr-animevideov3.safetensors", fx / "realesr-animevideov3.safetensors")
        expected[str(fx / "realesr-animevideov3.safetensors")] = ("upscaler", None, (), None)
        _link(w / "taef2_decoder.safetensors", fx / "taef2_decoder.safetensors")
        expected[str(fx / "taef2_decoder.safetensors")] = ("tae", None, (), None)
    return expected


def _link(src: Path, dst: Path) -> None:
    try:
        os.symlink(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
