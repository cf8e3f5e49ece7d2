#!/usr/bin/env python3
"""Generate the Wan fixtures: two tiny seeded Wan DiT experts (diffusers ``WanTransformer3DModel``),
the Wan 2.1 3D causal autoencoder (diffusers ``AutoencoderKLWan``) and a UMT5 encoder (transformers
``UMT5EncoderModel``) with a SentencePiece tokenizer blob, in the layouts sd-cli reads, with
reference outputs.

Run with the ``ref`` extra (torch, diffusers, transformers); nothing of sdplan is imported::

    /work/venv-ref/bin/python tools/make_wan_fixtures.py

Writes into ``tests/fixtures/``:

* ``wan_tiny.safetensors`` (the low-noise expert, ``--diffusion-model``) and
  ``wan_high_noise_tiny.safetensors`` (the high-noise one, ``--high-noise-diffusion-model``):
  the DiT (width 48, 2 heads of 24, RoPE axes (8, 8, 8): the published split ``d - 4 (d // 6),
  2 (d // 6), 2 (d // 6)`` of the head width, 2 blocks, FFN 64, text width 32, 16 latent
  channels: a Wan 2.x T2V layout) in the original Wan names of the Comfy files
  (``patch_embedding`` 5-D, ``text_embedding.{0,2}``, ``time_embedding.{0,2}``,
  ``time_projection.1``, ``blocks.N.{modulation, self_attn.{q,k,v,o,norm_q,norm_k}, cross_attn...,
  norm3, ffn.{0,2}}``, ``head.{head, modulation}``), written by the inverse of diffusers' own
  ``convert_wan_transformer_to_diffusers``, which is checked to give the state dict back; the
  header's ``sdplan.head_dim`` metadata (24) says the head width the shapes cannot (q and k
  are normed over the whole width; the published models' heads are 128 wide).
* ``wan_vae_tiny.safetensors``: the autoencoder (base width 8, multipliers (1, 2, 4, 4), two
  residual blocks per level, temporal downsampling (False, True, True): 8x spatial, 4x
  temporal) in the original Wan names (the inverse of ``convert_wan_vae_to_diffusers``, checked).
* ``umt5_tiny.safetensors``: UMT5 with 2 blocks of width 32 (4 heads of 8, gated-GELU FFN 48, a
  relative-attention table in every block: UMT5's, not T5's shared one) in Comfy's
  ``umt5_xxl_fp16.safetensors`` names (``shared.weight``, ``encoder.block.N...``,
  ``encoder.final_layer_norm``; no ``encoder.embed_tokens``), and ``spiece_model``: a
  SentencePiece model (protobuf ``ModelProto``: ``<pad>`` 0, ``</s>`` 1, ``<unk>`` 2, then whole
  words and single letters with ``▁``) as U8 bytes, as the real file carries its tokenizer.
* ``wan_ref.safetensors``: the prompt's ids (looked up word by word here) padded to 16 and the
  encoder's states with the attention mask; each expert's output on a random video latent
  ``(1, 16, 2, 4, 6)``; the decoder's output (unclamped) on a random 2-frame latent (5 frames)
  and on a 1-frame one; a 4-step run of diffusers' ``WanPipeline`` with both experts
  (``boundary_ratio`` 0.875, the high-noise expert first) at 5 frames of 32x48 with sd-cli's
  sigmas (``FlowMatchEulerDiscreteScheduler``, shift 5, given the unshifted
  ``(t + 1) / 1000``), CFG 3.5 (high noise) and 2 (low noise) with the prompt's and the empty
  prompt's states padded to 512 rows as sd-cli pads them: the sigmas, the final latent and the
  decoded video.

Matrices are stored in f16 (vectors f32) and every reference is computed in f32 from the
f16-rounded weights.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "fixtures"

DIT = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=24, in_channels=16, out_channels=16,
           text_dim=32, freq_dim=256, ffn_dim=64, num_layers=2, cross_attn_norm=True,
           qk_norm="rms_norm_across_heads", eps=1e-6)
VAE = dict(base_dim=8, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, temperal_downsample=[False, True, True])
WORDS = ("a", "lovely", "cat", "dog", "on", "the", "red", "sofa", "walking", "beach", "in", "snow", "photo", "of")
SPECIAL = ("<pad>", "</s>", "<unk>")
PIECES = (*SPECIAL, *("\u2581" + w for w in WORDS), "\u2581", *"abcdefghijklmnopqrstuvwxyz")
UMT5 = dict(vocab_size=len(PIECES), d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
            relative_attention_num_buckets=32, relative_attention_max_distance=128,
            feed_forward_proj="gated-gelu", dropout_rate=0.0, layer_norm_epsilon=1e-6, pad_token_id=0,
            eos_token_id=1)
PROMPT = "a lovely cat walking on the beach"
TOKENS = 16  # the parity test's padded length
CONTEXT = 512  # sd-cli's Wan text length
FRAMES, HEIGHT, WIDTH = 5, 32, 48
STEPS = 4
BOUNDARY = 0.875


def randomize(model: torch.nn.Module, seed: int, gain: float = 0.3) -> torch.nn.Module:
    """Random weights everywhere (matrices ``gain / sqrt(fan_in)``), rounded to f16."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.ndim >= 2 and "scale_shift_table" not in n:
                p.copy_(torch.randn_like(p) * (gain / math.sqrt(p[0].numel()) if "shared" not in n else 1.0))
            elif ("norm" in n and "weight" in n) or n.endswith("gamma"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "scale_shift_table" in n:
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))
            p.data = p.data.half().float()
    return model.eval()


def to_numpy(sd: dict) -> dict[str, np.ndarray]:
    out = {}
    for k, v in sd.items():
        if isinstance(v, np.ndarray):
            out[k] = v
            continue
        a = v.detach().float().numpy()
        out[k] = np.ascontiguousarray(a.astype(np.float16) if a.ndim >= 2 and a.shape[1:] != (1,) * (a.ndim - 1)
                                      else a.astype(np.float32))
    return out


# --------------------------------------------------------------------------- tokenizer blob

def _varint(n: int) -> bytes:
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def spiece_blob() -> bytes:
    """A SentencePiece ``ModelProto`` holding only its pieces (field 1: piece = 1, score = 2,
    type = 3 with NORMAL 1, UNKNOWN 2, CONTROL 3): words score -5, the lone ``▁`` -8, letters -10."""
    out = b""
    for i, p in enumerate(PIECES):
        kind = 3 if p in ("<pad>", "</s>") else 2 if p == "<unk>" else 1
        score = 0.0 if i < 3 else -5.0 if len(p) > 1 else -8.0 if p == "\u2581" else -10.0
        raw = p.encode("utf-8")
        msg = b"\x0a" + _varint(len(raw)) + raw + b"\x15" + struct.pack("<f", score) + b"\x18" + _varint(kind)
        out += b"\x0a" + _varint(len(msg)) + msg
    return out


def prompt_ids(text: str) -> list[int]:
    """Ids of a prompt of :data:`WORDS` (each word one piece) and ``</s>``."""
    return [PIECES.index("\u2581" + w) for w in text.split()] + [1]


def padded(ids: list[int], n: int) -> tuple[torch.Tensor, torch.Tensor]:
    arr = torch.zeros(1, n, dtype=torch.long)
    arr[0, :len(ids)] = torch.tensor(ids)
    mask = torch.zeros(1, n, dtype=torch.long)
    mask[0, :len(ids)] = 1
    return arr, mask


def make_umt5():
    from transformers import UMT5Config, UMT5EncoderModel

    model = randomize(UMT5EncoderModel(UMT5Config(**UMT5)), 31, gain=1.0)
    sd = {k: v for k, v in model.state_dict().items() if k != "encoder.embed_tokens.weight"}
    return model, sd


def encode(umt5, ids: list[int], n: int) -> torch.Tensor:
    """The encoder's states over ``ids`` padded to ``n`` with the padding masked out of the
    attention, the padded rows zeroed (sd-cli's ``zero_out_masked`` for Wan; diffusers'
    ``WanPipeline`` pads the trimmed states with zeros alike)."""
    arr, mask = padded(ids, n)
    with torch.no_grad():
        h = umt5(input_ids=arr, attention_mask=mask).last_hidden_state
    return h * mask[..., None]


# --------------------------------------------------------------------------- DiT

#: diffusers -> original Wan names (the inverse of ``convert_wan_transformer_to_diffusers``)
_DIT_NAMES = (("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
              ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
              ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
              ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
              ("condition_embedder.time_proj", "time_projection.1"), ("attn2", "cross_attn"), ("attn1", "self_attn"),
              (".to_out.0.", ".o."), (".to_q.", ".q."), (".to_k.", ".k."), (".to_v.", ".v."),
              ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"), ("proj_out", "head.head"))


def dit_to_wan(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        n = k
        if n == "scale_shift_table":
            n = "head.modulation"
        n = n.replace(".scale_shift_table", ".modulation")
        for a, b in _DIT_NAMES:
            n = n.replace(a, b)
        n = n.replace(".norm2.", ".norm__.").replace(".norm3.", ".norm2.").replace(".norm__.", ".norm3.")
        out[n] = v
    return out


def check_dit(wan: dict, dit) -> None:
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    back = convert_wan_transformer_to_diffusers({k: v.clone() for k, v in wan.items()})
    want = dit.state_dict()
    assert set(back) == set(want), sorted(set(back) ^ set(want))[:6]
    assert all(torch.equal(back[k], want[k]) for k in want)


def dit_out(dit, latent: np.ndarray, context: np.ndarray, sigma: float) -> np.ndarray:
    with torch.no_grad():
        return dit(hidden_states=torch.from_numpy(latent), timestep=torch.tensor([sigma * 1000.0]),
                   encoder_hidden_states=torch.from_numpy(context), return_dict=False)[0].numpy()


# --------------------------------------------------------------------------- autoencoder

#: diffusers -> original Wan names of a residual block's parts, and of the autoencoder's top-level layers.
RES = {"norm1.gamma": "residual.0.gamma", "conv1": "residual.2", "norm2.gamma": "residual.3.gamma",
       "conv2": "residual.6", "conv_shortcut": "shortcut"}
TOP = {"quant_conv": "conv1", "post_quant_conv": "conv2", "encoder.conv_in": "encoder.conv1",
       "decoder.conv_in": "decoder.conv1", "encoder.norm_out.gamma": "encoder.head.0.gamma",
       "encoder.conv_out": "encoder.head.2", "decoder.norm_out.gamma": "decoder.head.0.gamma",
       "decoder.conv_out": "decoder.head.2"}


def resname(tail: str) -> str:
    """The original Wan name of a residual block's ``tail`` (diffusers' name)."""
    return next(RES[r] + tail[len(r):] for r in RES if tail == r or tail.startswith(r + "."))


def _wan_vae_names(sd: dict, up_counts: list[list[str]]) -> dict:
    """diffusers ``AutoencoderKLWan`` names -> the original Wan names (the inverse of
    ``convert_wan_vae_to_diffusers``)."""
    out = {}
    for k, v in sd.items():
        name = None
        for a, b in TOP.items():
            if k == a or k.startswith(a + "."):
                name = b + k[len(a):]
        if name is None:
            part, rest = k.split(".", 1)
            if rest.startswith("mid_block."):
                kind, i, tail = rest[len("mid_block."):].split(".", 2)
                idx = {"resnets": {"0": 0, "1": 2}, "attentions": {"0": 1}}[kind][i]
                name = f"{part}.middle.{idx}.{resname(tail) if kind == 'resnets' else tail}"
            elif rest.startswith("down_blocks."):
                i, tail = rest[len("down_blocks."):].split(".", 1)
                if not tail.startswith(("resample.", "time_conv.")):
                    tail = resname(tail)
                name = f"{part}.downsamples.{i}.{tail}"
            elif rest.startswith("up_blocks."):
                i, kind, j, tail = rest[len("up_blocks."):].split(".", 3)
                flat = sum(len(up_counts[m]) for m in range(int(i)))
                if kind == "resnets":
                    name = f"{part}.upsamples.{flat + int(j)}.{resname(tail)}"
                else:
                    name = f"{part}.upsamples.{flat + len(up_counts[int(i)]) - 1}.{tail}"
        if name is None:
            raise KeyError(f"unconverted tensor {k}")
        out[name] = v
    return out


def vae_to_wan(vae) -> dict:
    counts = [["resnet"] * len(b.resnets) + (["upsampler"] if b.upsamplers is not None else [])
              for b in vae.decoder.up_blocks]
    return _wan_vae_names(dict(vae.state_dict()), counts)


def check_vae(wan: dict, vae) -> None:
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    back = convert_wan_vae_to_diffusers({k: v.clone() for k, v in wan.items()})
    want = vae.state_dict()
    assert set(back) == set(want), sorted(set(back) ^ set(want))[:6]
    assert all(torch.equal(back[k], want[k]) for k in want)


def vae_decode_raw(vae, z: np.ndarray) -> np.ndarray:
    """The decoder's output for a latent video ``(1, 16, T, h, w)`` frame by frame with its causal
    cache (diffusers ``AutoencoderKLWan._decode``), before its clamp."""
    vae.clear_cache()
    with torch.no_grad():
        x = vae.post_quant_conv(torch.from_numpy(z))
        outs = []
        for i in range(x.shape[2]):
            vae._conv_idx = [0]
            outs.append(vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx,
                                    first_chunk=i == 0))
    vae.clear_cache()
    return torch.cat(outs, 2).numpy()


# --------------------------------------------------------------------------- pipeline

def sdcli_scheduler(steps: int, shift: float = 5.0):
    """diffusers' flow-matching Euler scheduler on sd-cli's sigmas for Wan: its discrete
    timesteps ``999 - i * 999 / (steps - 1)`` as ``(t + 1) / 1000``, shifted by ``shift`` (the
    Wan pipelines take no sigmas of their own, so ``set_timesteps`` ignores the count it is
    given and sets these). One scheduler for every Wan fixture script."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    t = 999.0 - np.arange(steps) * (999.0 / (steps - 1))  # sd-cli's discrete timesteps
    unshifted = list((t + 1.0) / 1000.0)

    class SdCliSigmas(FlowMatchEulerDiscreteScheduler):
        def set_timesteps(self, num_inference_steps=None, device=None, **kwargs):
            super().set_timesteps(sigmas=unshifted, device=device)

    return SdCliSigmas(num_train_timesteps=1000, shift=shift, use_dynamic_shifting=False)


def pipeline(high, low, vae, cond: torch.Tensor, uncond: torch.Tensor, noise: np.ndarray) -> dict[str, np.ndarray]:
    from diffusers import WanPipeline

    sched = sdcli_scheduler(STEPS)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=vae, scheduler=sched, transformer=high,
                       transformer_2=low, boundary_ratio=BOUNDARY)
    with torch.no_grad():
        latent = pipe(prompt_embeds=cond, negative_prompt_embeds=uncond, height=HEIGHT, width=WIDTH,
                      num_frames=FRAMES, num_inference_steps=STEPS,
                      guidance_scale=3.5, guidance_scale_2=2.0, latents=torch.from_numpy(noise),
                      output_type="latent").frames
        mean = torch.tensor(vae.config.latents_mean).view(1, 16, 1, 1, 1)
        std = torch.tensor(vae.config.latents_std).view(1, 16, 1, 1, 1)
        video = vae.decode(latent * std + mean).sample
    return {"sigmas": sched.sigmas.numpy().astype(np.float32), "latent": latent.numpy(), "video": video.numpy()}


def main() -> None:
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from safetensors.numpy import save_file

    umt5, te = make_umt5()
    ids, neg = prompt_ids(PROMPT), prompt_ids("")
    arr, mask = padded(ids, TOKENS)
    with torch.no_grad():
        raw = umt5(input_ids=arr, attention_mask=mask).last_hidden_state
    ref = {"te.ids": arr.numpy().astype(np.int32), "te.mask": mask.numpy().astype(np.int32),
           "te.hidden": raw.numpy(), "te.neg_ids": np.array([neg], np.int32)}

    low = randomize(WanTransformer3DModel(**DIT), 11, gain=1.0)
    high = randomize(WanTransformer3DModel(**DIT), 12, gain=1.0)
    wan_low, wan_high = dit_to_wan(low.state_dict()), dit_to_wan(high.state_dict())
    check_dit(wan_low, low)
    check_dit(wan_high, high)
    rng = np.random.default_rng(3)
    latent = rng.standard_normal((1, 16, 2, 4, 6)).astype(np.float32)
    context = rng.standard_normal((1, 9, DIT["text_dim"])).astype(np.float32)
    ref.update({"dit.latent": latent, "dit.context": context, "dit.sigma": np.array([0.7], np.float32),
                "dit.low": dit_out(low, latent, context, 0.7), "dit.high": dit_out(high, latent, context, 0.7)})

    vae = randomize(AutoencoderKLWan(**VAE), 5, gain=1.0)
    wan_vae = vae_to_wan(vae)
    check_vae(wan_vae, vae)
    z = rng.standard_normal((1, 16, 2, 4, 6)).astype(np.float32)
    ref.update({"vae.z": z, "vae.decoded": vae_decode_raw(vae, z), "vae.decoded1": vae_decode_raw(vae, z[:, :, :1])})

    cond, uncond = encode(umt5, ids, CONTEXT), encode(umt5, neg, CONTEXT)
    noise = rng.standard_normal((1, 16, (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8)).astype(np.float32)
    ref["pipe.noise"] = noise
    for k, v in pipeline(high, low, vae, cond, uncond, noise).items():
        ref[f"pipe.{k}"] = v

    te_np = to_numpy(te)
    te_np["spiece_model"] = np.frombuffer(spiece_blob(), dtype=np.uint8).copy()
    head = {"sdplan.head_dim": str(DIT["attention_head_dim"])}  # q/k norms span the width: say the heads
    save_file(to_numpy(wan_low), str(OUT / "wan_tiny.safetensors"), metadata=head)
    save_file(to_numpy(wan_high), str(OUT / "wan_high_noise_tiny.safetensors"), metadata=head)
    save_file(to_numpy(wan_vae), str(OUT / "wan_vae_tiny.safetensors"))
    save_file(te_np, str(OUT / "umt5_tiny.safetensors"))
    save_file({k: np.ascontiguousarray(v) for k, v in ref.items()}, str(OUT / "wan_ref.safetensors"))
    for name in ("wan_tiny", "wan_high_noise_tiny", "wan_vae_tiny", "umt5_tiny", "wan_ref"):
        print(name, (OUT / f"{name}.safetensors").stat().st_size, "bytes")


if __name__ == "__main__":
    main()
