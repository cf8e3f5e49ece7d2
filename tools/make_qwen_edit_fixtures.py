"""Generate the Qwen-Image Edit references: the Qwen2.5-VL vision tower's picture embeddings and
the encoder's hidden states over a prompt with pictures, from transformers'
``Qwen2_5_VLForConditionalGeneration`` holding the weights of the tiny Qwen2.5-VL fixture
(``tests/fixtures/qwen25vl_tiny.safetensors``, written by ``make_qwen_image_fixtures.py``: a
2-block vision tower of width 16, 2 heads of 8, full attention in block 1, windows of 56 pixels;
3 LLM layers of width 16, heads of 8, mRoPE sections (1, 1, 2)).

Run with the reference environment (torch, transformers, PIL); sdplan's Qwen tokenizer makes the
prompt's ids (this checkout is made importable when sdplan is not installed)::

    /work/venv-ref/bin/python tools/make_qwen_edit_fixtures.py

Writes ``tests/fixtures/qwen_edit_ref.safetensors``:

* ``vision_{a,b}.picture``: a seeded RGB picture, u8 ``(H, W, 3)`` (84 x 140 and 56 x 56, both
  multiples of 28, so the processor does not resize them);
* ``vision_{a,b}.pixels``: transformers' ``Qwen2VLImageProcessorPil`` patches of it (rescaled,
  CLIP-normalised, the frame repeated over the temporal patch of 2, 2x2 merge groups first),
  f32 ``(N, 3 * 2 * 14 * 14)``, and ``vision_{a,b}.grid`` i32 ``(t, h, w)`` in patches;
* ``vision_{a,b}.embeds``: the tower's merged output (``pooler_output``) f32 ``(N / 4, 16)``;
* ``llm.ids``: the Qwen-Image-Edit-2509 prompt (diffusers ``QwenImageEditPlusPipeline``'s
  template, "Picture 1: ... Picture 2: ..." with each ``<|image_pad|>`` repeated once per merged
  token) for both pictures, i32 ``(1, T)``; ``llm.pos``: transformers' M-RoPE position ids
  ``(3, T)`` (``get_rope_index``); ``llm.hidden``: the final normed states of every token,
  f32 ``(1, T, 16)`` (diffusers then drops the template's first 64);
* ``edit.picture`` u8 ``(64, 64, 3)``, ``edit.noise`` ``(1, 16, 8, 8)``, ``edit.context``: the
  encoder's states (transformers, M-RoPE) over sd-cli's Edit prompt with that picture, sized for
  the vision tower by sd-cli's rule (392 x 392, nearest, :func:`vl_pixels`), the first 64 tokens
  dropped; ``edit.latent``: a 4-step run of diffusers' ``QwenImageEditPipeline`` (the tiny
  Qwen-Image DiT and autoencoder of ``make_qwen_image_fixtures.py``) at 64 x 64 from that noise
  with those states and the picture as its reference (its reference latent sized as sd-cli
  sizes it: ``calculate_dimensions`` is given sd-cli's 64 x 64 instead of its 1024^2 area), sd-cli's
  sigmas, no guidance; unpacked, in the DiT's normalised space;
* ``zero.latent`` ``(1, 16, 8, 8)``, ``zero.ref`` ``(1, 16, 4, 8)``, ``zero.context`` ``(1, 7, 16)``,
  ``zero.sigma``: random inputs of the tiny DiT with one reference latent; ``zero.out`` /
  ``zero.plain``: the image tokens' output, unpacked ``(1, 16, 8, 8)``, of diffusers'
  ``QwenImageTransformer2DModel`` with ``zero_cond_t=True`` (Qwen-Image-Edit-2511) / without.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures"
sys.path.insert(0, str(FIX))

from make_qwen_image_fixtures import DIT, STEPS, TEXT, VAE, VISION, _sdplan, pack, unpack  # noqa: E402

TEMPLATE = ("<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
            "objects, background), then explain how the user's text instruction should alter or modify the "
            "image. Generate a new image that meets the user's requirements while maintaining consistency "
            "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n",
            "<|im_end|>\n<|im_start|>assistant\n")
PICTURE = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"
PROMPT = "make the cat blue"
IMAGE_PAD = 151655
SIZES = {"a": (84, 140), "b": (56, 56)}


def load_qwen():
    """transformers' model with the tiny fixture's weights (f16 read back as f32)."""
    from safetensors.numpy import load_file
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    cfg = Qwen2_5_VLConfig(text_config=TEXT, vision_config=VISION, tie_word_embeddings=False)
    model = Qwen2_5_VLForConditionalGeneration(cfg).eval()
    sd = {}
    for k, v in load_file(str(FIX / "qwen25vl_tiny.safetensors")).items():
        name = ("model.language_model." + k[len("model."):]) if k.startswith("model.") else "model." + k
        sd[name] = torch.from_numpy(v.astype(np.float32))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected, (missing, unexpected)
    return model


def vl_pixels(pic: np.ndarray) -> np.ndarray:
    """sd-cli's vision-tower picture of a 64 x 64 reference: 392 x 392 (its area rule), sd-cli's
    nearest rule (output pixel ``i`` reads input ``i * in // out``)."""
    h, w = pic.shape[:2]
    rows, cols = np.arange(392) * h // 392, np.arange(392) * w // 392
    return np.ascontiguousarray(pic[rows][:, cols])


def edit_run(model, tok) -> dict[str, np.ndarray]:
    """The Edit references (module docstring)."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImageTransformer2DModel,
    )
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as edit
    from PIL import Image
    from safetensors.numpy import load_file
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    rng = np.random.default_rng(11)
    pic = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    noise = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    vl = Qwen2VLImageProcessorPil()(images=[Image.fromarray(vl_pixels(pic))], do_resize=False, return_tensors="np")
    grid = vl["image_grid_thw"]
    assert grid.tolist() == [[1, 28, 28]]
    n = int(grid.prod()) // 4
    prefix = TEMPLATE[0] + PICTURE.replace("<|image_pad|>", "<|image_pad|>" * n).format(1)
    ids = torch.tensor([tok.encode(prefix + PROMPT + TEMPLATE[1])])
    with torch.no_grad():
        out = model.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                          pixel_values=torch.from_numpy(vl["pixel_values"].astype(np.float32)),
                          image_grid_thw=torch.from_numpy(grid).long(), mm_token_type_ids=(ids == IMAGE_PAD).int(),
                          output_hidden_states=True)
    context = out.hidden_states[-1][:, 64:].float()

    dit = QwenImageTransformer2DModel(**DIT).eval()
    dit.load_state_dict({k: torch.from_numpy(v.astype(np.float32))
                         for k, v in load_file(str(FIX / "qwen_image_tiny.safetensors")).items()})
    vae = AutoencoderKLQwenImage(**VAE).eval()
    wan = {k: torch.from_numpy(v.astype(np.float32)) for k, v in load_file(str(FIX / "qwen_image_vae_tiny.safetensors")).items()}
    vae.load_state_dict(convert_wan_vae_to_diffusers(wan))
    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)
    pipe = edit.QwenImageEditPipeline(scheduler=sched, vae=vae, text_encoder=None, tokenizer=None, processor=None,
                                      transformer=dit)
    t = 999.0 - np.arange(STEPS) * (999.0 / (STEPS - 1))  # sd-cli's discrete timesteps
    sized = edit.calculate_dimensions
    edit.calculate_dimensions = lambda area, ratio: (64, 64, None)  # sd-cli's reference size here
    try:
        with torch.no_grad():
            tokens = pipe(image=Image.fromarray(pic), prompt_embeds=context,
                          prompt_embeds_mask=torch.ones(context.shape[:2], dtype=torch.long), height=64, width=64,
                          num_inference_steps=STEPS, sigmas=list((t + 1.0) / 1000.0), true_cfg_scale=1.0,
                          latents=pack(torch.from_numpy(noise)), output_type="latent").images
    finally:
        edit.calculate_dimensions = sized
    return {"edit.picture": pic, "edit.noise": noise, "edit.context": context.numpy(),
            "edit.latent": unpack(tokens, 8, 8).numpy()}


def zero_cond() -> dict[str, np.ndarray]:
    """The Qwen-Image-Edit-2511 DiT references (module docstring)."""
    from diffusers import QwenImageTransformer2DModel
    from safetensors.numpy import load_file

    weights = {k: torch.from_numpy(v.astype(np.float32))
               for k, v in load_file(str(FIX / "qwen_image_tiny.safetensors")).items()}
    rng = np.random.default_rng(13)
    lat = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    ref = rng.standard_normal((1, 16, 4, 8)).astype(np.float32)  # even grids: sd-cli centres odd ones otherwise
    ctx = rng.standard_normal((1, 7, 16)).astype(np.float32)
    sigma = 0.6
    out = {"zero.latent": lat, "zero.ref": ref, "zero.context": ctx, "zero.sigma": np.array([sigma], np.float32)}
    for key, flag in (("zero.out", True), ("zero.plain", False)):
        dit = QwenImageTransformer2DModel(**DIT, zero_cond_t=flag).eval()
        dit.load_state_dict(weights)
        tokens = torch.cat([pack(torch.from_numpy(lat)), pack(torch.from_numpy(ref))], dim=1)
        with torch.no_grad():
            y = dit(hidden_states=tokens, encoder_hidden_states=torch.from_numpy(ctx), encoder_hidden_states_mask=None,
                    timestep=torch.tensor([sigma]), img_shapes=[[(1, 4, 4), (1, 2, 4)]], return_dict=False)[0]
        out[key] = unpack(y[:, :16], 8, 8).numpy()
    return out


def main() -> None:
    _sdplan()
    from PIL import Image
    from safetensors.numpy import save_file
    from sdplan.core.text.bpe_tokenizer import BPETokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    model = load_qwen()
    proc = Qwen2VLImageProcessorPil()
    rng = np.random.default_rng(7)
    ref: dict[str, np.ndarray] = {}
    pixels, grids = [], []
    for case, (h, w) in SIZES.items():
        pic = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        out = proc(images=[Image.fromarray(pic)], do_resize=False, return_tensors="np")
        px, grid = out["pixel_values"].astype(np.float32), out["image_grid_thw"].astype(np.int32)
        with torch.no_grad():
            emb = model.model.visual(torch.from_numpy(px), grid_thw=torch.from_numpy(grid).long()).pooler_output
        ref.update({f"vision_{case}.picture": pic, f"vision_{case}.pixels": px, f"vision_{case}.grid": grid[0],
                    f"vision_{case}.embeds": emb.numpy()})
        pixels.append(px)
        grids.append(grid)

    tok = BPETokenizer.qwen()
    assert len(tok.encode(TEMPLATE[0])) == 64
    text = "".join(PICTURE.format(i + 1) for i in range(len(SIZES))) + PROMPT
    ids = tok.encode(TEMPLATE[0] + text + TEMPLATE[1])
    expanded: list[int] = []
    counts = iter(int(g[0].prod()) // 4 for g in grids)
    for t in ids:
        expanded += [t] * next(counts) if t == IMAGE_PAD else [t]
    ids_t = torch.tensor([expanded])
    grid_t = torch.from_numpy(np.concatenate(grids)).long()
    types_t = (ids_t == IMAGE_PAD).int()
    with torch.no_grad():
        pos, _ = model.model.get_rope_index(ids_t, mm_token_type_ids=types_t, image_grid_thw=grid_t)
        out = model.model(input_ids=ids_t, attention_mask=torch.ones_like(ids_t),
                          pixel_values=torch.from_numpy(np.concatenate(pixels)), image_grid_thw=grid_t,
                          mm_token_type_ids=types_t, output_hidden_states=True)
    ref.update({"llm.ids": np.array([expanded], np.int32), "llm.pos": pos[:, 0].numpy().astype(np.int32),
                "llm.hidden": out.hidden_states[-1].numpy().astype(np.float32)})
    ref.update(edit_run(model, tok))
    ref.update(zero_cond())
    path = FIX / "qwen_edit_ref.safetensors"
    save_file({k: np.ascontiguousarray(v) for k, v in ref.items()}, str(path))
    print(path.name, path.stat().st_size, "bytes", {k: v.shape for k, v in ref.items()})


if __name__ == "__main__":
    main()
