"""Train sdplan's demo model: a small SD 1.x-layout text-to-image model of coloured shapes.

Needs the ``ref`` extra (torch, diffusers, transformers) and runs on the CPU:

    /work/venv-ref/bin/python tools/demo/train_demo.py --work /tmp/sdplan-demo

Stages (each checkpoints into ``--work`` and is skipped or resumed when run again):

1. ``vae``: an ``AutoencoderKL`` (f=8, 4 latent channels; widths 64/64/96/96, so the
   32 GroupNorm groups hold 2-3 channels each) on fresh whole scenes from
   :mod:`sdplan.core.pipelines.demo.scenes` (every picture holds a shape and its background, as full
   pictures do: GroupNorm statistics span the picture, and a crop of plain background
   loses its colour in the first norm), in two phases (``phases``): 800 steps of scenes
   rendered at 24-48 pixels at a constant rate, then 400 steps at 48-96 pixels with shapes
   as wide in pixels as in the 128-pixel pictures, the shape's colour weighted up
   (:func:`vae_loss`) and the rate decaying to a tenth. The decoder reads the encoder's
   mean; loss ``|x - x'| + (x - x')^2 + 1e-6 KL``; Adam with a linear warm-up. Every
   ``check_every`` steps ``decode(encode(x))`` of true 128-pixel scenes is scored with
   :func:`~sdplan.core.pipelines.demo.scenes.caption_matches`; training stops at the first check where
   background and shape colour both reach ``stop_rate``, or after the last phase.
2. ``scale``: rescale the VAE so that ``encoder mean * 0.18215`` has unit variance
   (quant_conv mean rows times k, logvar bias + 2 ln k, post_quant_conv inputs / k), then
   encode a fixed set of scenes (``n_latents``) to scaled latents.
3. ``unet``: a ``UNet2DConditionModel`` and a ``CLIPTextModel`` (real 49408-token vocabulary,
   sdplan's own tokenizer, SD 1.x padding) trained jointly on v prediction (as SD 2.x) over
   the 1000-step scaled-linear DDPM schedule (betas 0.00085..0.012), min-SNR-5 loss weights,
   10% empty captions for classifier-free guidance, EMA of both. v rather than eps: at high
   noise an eps target hardly depends on the picture, so the caption's colours earn almost
   no loss and the model learns to ignore them; the v target there is the picture itself.
4. ``export``: EMA weights in the original single-file layout (``tests/fixtures/convert_ldm``),
   checked against diffusers' own single-file converters, fp16 safetensors with the configs
   in the metadata (key ``sdplan.demo``) and in ``sdplan-demo-shapes.json``.

Every random draw is seeded from ``--seed`` and the step index, so a resumed run equals an
uninterrupted one.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import logging
import math
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
log = logging.getLogger("train_demo")

CONFIG: dict = {
    "seed": 20240611,
    "vae": {
        "model": dict(
            in_channels=3,
            out_channels=3,
            down_block_types=["DownEncoderBlock2D"] * 4,
            up_block_types=["UpDecoderBlock2D"] * 4,
            block_out_channels=[64, 64, 96, 96],
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=32,
            sample_size=128,
            scaling_factor=0.18215,
        ),
        # Phase 1: whole scenes at 24-48 pixels (shapes scale with the picture), constant
        # rate. Phase 2: scenes at 48-96 pixels with shapes as large in pixels as in the
        # 128-pixel demo pictures, shape colour weighted up, rate decaying to a tenth.
        "phases": [
            {"steps": 800, "scenes": "scaled", "sizes": [24, 32, 40, 48], "batches": [12],
             "decay": False, "shape_weight": 1.0, "colour_weight": 0.0},
            {"steps": 400, "scenes": "pixel", "sizes": [48, 64, 96], "batches": [12, 8, 4],
             "decay": True, "shape_weight": 4.0, "colour_weight": 2.0},
        ],
        "lr": 5e-4,
        "warmup": 20,
        "kl_weight": 1e-6,
        "check_every": 100,
        "check_n": 16,
        "stop_rate": 0.98,
    },
    "n_latents": 672,
    "clip": dict(
        vocab_size=49408,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=2,
        max_position_embeddings=77,
        hidden_act="quick_gelu",
        bos_token_id=49406,
        eos_token_id=49407,
        pad_token_id=1,
        projection_dim=64,
    ),
    "unet": {
        "model": dict(
            sample_size=16,
            in_channels=4,
            out_channels=4,
            layers_per_block=1,
            block_out_channels=[64, 64, 96],
            down_block_types=["CrossAttnDownBlock2D"] * 3,
            up_block_types=["CrossAttnUpBlock2D"] * 3,
            cross_attention_dim=64,
            attention_head_dim=8,
            norm_num_groups=32,
            use_linear_projection=False,
            transformer_layers_per_block=1,
        ),
        "steps": 2000,
        "batch": 32,
        "lr": 1e-3,
        "warmup": 30,
        "caption_dropout": 0.1,
        "ema": 0.995,
        "min_snr_gamma": 5.0,
        "checkpoint_every": 20,
        "check_every": 250,
        "check_n": 16,
    },
    "schedule": dict(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        prediction_type="v_prediction",
    ),
    "vae_scale_factor": 0.18215,
    "family": "sd1",
    "clip_skip": 1,
}


#: diffusers' prediction_type -> the ``sdplan.prediction`` metadata value
PREDICTION = {"epsilon": "eps", "v_prediction": "v"}


def import_sdplan() -> None:
    """Make ``sdplan.core`` and ``sdplan.resources`` importable from this checkout."""
    try:
        import sdplan.core.pipelines.demo.scenes  # noqa: F401

        return
    except ImportError:
        pass
    pkg = types.ModuleType("sdplan")
    pkg.__path__ = []  # type: ignore[attr-defined]
    sys.modules["sdplan"] = pkg
    for sub, folder in (("core", "core"), ("resources", "resources")):
        spec = importlib.util.spec_from_file_location(
            f"sdplan.{sub}",
            REPO / folder / "__init__.py",
            submodule_search_locations=[str(REPO / folder)],
        )
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[f"sdplan.{sub}"] = mod
        spec.loader.exec_module(mod)
        setattr(pkg, sub, mod)


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 ``(N, H, W, 3)`` -> float32 ``(N, 3, H, W)`` in -1..1."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float() / 127.5 - 1.0


def cosine_lr(peak: float, step: int, steps: int, warmup: int) -> float:
    """Learning rate at ``step``: linear warm-up over ``warmup`` steps to ``peak``, then a
    cosine decay from ``peak`` to ``peak / 10`` at ``steps``."""
    ramp = min(1.0, (step + 1) / warmup)
    return peak * ramp * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))


def save_state(path: Path, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


# ----------------------------------------------------------------------------- VAE


def build_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(**CONFIG["vae"]["model"])


def vae_loss(rec: torch.Tensor, x: torch.Tensor, phase: dict) -> torch.Tensor:
    """Reconstruction loss of a batch ``(B, 3, S, S)`` in -1..1 (the KL term is added apart).

    ``|x' - x| + (x' - x)^2`` per pixel, with the shape's pixels weighted ``shape_weight``
    times (found from the picture: pixels that differ from its top-left corner, which is
    background), plus ``colour_weight`` times the error of 8x8 means (one latent pixel):
    the shape holds a fifth of the pixels or less, and its flat colour is what the demo's
    captions name, so its colour must not be the last thing learnt. With both weights at
    their neutral values (1 and 0) this is the plain mean.
    """
    cfg = phase
    err = rec - x
    shape = ((x - x[:, :, :1, :1]).abs().sum(dim=1, keepdim=True) > 0.1).float()
    w = 1.0 + (cfg["shape_weight"] - 1.0) * shape
    pix = ((err.abs() + err.pow(2)) * w).mean() / w.mean()
    colour = torch.nn.functional.avg_pool2d(err, 8).abs().mean()
    return pix + cfg["colour_weight"] * colour


def vae_scene(rng: np.random.Generator, size: int) -> np.ndarray:
    """One whole scene rendered at ``size`` pixels, uint8 ``(size, size, 3)``.

    The shape's half-size is drawn in *pixels* (6 to ``min(40, size / 2 - 4)``), not as a
    share of the picture: the autoencoder is convolutional, so what it must learn is flat
    colour regions as large as those of the 128-pixel demo pictures (half-sizes 22-40
    pixels, see :data:`~sdplan.core.pipelines.demo.scenes.RADIUS_RANGE`), next to small ones.
    """
    from sdplan.core.pipelines.demo import scenes as ds

    f = ds.SIZE / size  # render() takes coordinates of the 128-pixel picture
    color = ds.COLORS[int(rng.integers(len(ds.COLORS)))]
    others = [c for c in ds.COLORS if c != color]
    background = others[int(rng.integers(len(others)))]
    shape = ds.SHAPES[int(rng.integers(len(ds.SHAPES)))]
    radius = float(rng.integers(6, min(40, size // 2 - 4) + 1))
    cx, cy = (float(v) for v in rng.uniform(radius + 4, size - radius - 4, size=2))
    return ds.render(ds.Scene(shape, color, background, cx * f, cy * f, radius * f), size)


def vae_phase(step: int) -> tuple[dict, int, int]:
    """``(phase config, first step of the phase, last step + 1)`` of VAE step ``step``."""
    start = 0
    for phase in CONFIG["vae"]["phases"]:
        if step < start + phase["steps"]:
            return phase, start, start + phase["steps"]
        start += phase["steps"]
    raise ValueError(f"VAE step {step} is past the last phase")


def vae_batch(rng: np.random.Generator, step: int) -> torch.Tensor:
    """One VAE training batch, float32 ``(B, 3, S, S)`` in -1..1, of whole scenes: every
    picture holds a shape and its background, as full pictures do (GroupNorm statistics
    span the picture: a crop of plain background would leave nothing of its colour after
    the first norm).

    ``scaled`` phases draw ``S`` from ``sizes`` at random and render the 128-pixel scenes of
    :func:`~sdplan.core.pipelines.demo.scenes.random_scene` scaled down; ``pixel`` phases take the
    sizes in turn, ``batches[i]`` pictures of side ``sizes[i]`` (about the same pixel count
    per step), drawn by :func:`vae_scene`.
    """
    from sdplan.core.pipelines.demo import scenes as ds

    phase, _, _ = vae_phase(step)
    sizes, batches = phase["sizes"], phase["batches"]
    if phase["scenes"] == "scaled":
        size = int(sizes[int(rng.integers(len(sizes)))])
        return to_tensor(np.stack([ds.render(ds.random_scene(rng), size)
                                   for _ in range(int(batches[0]))]))
    i = step % len(sizes)
    return to_tensor(np.stack([vae_scene(rng, int(sizes[i])) for _ in range(int(batches[i]))]))


@torch.no_grad()
def vae_colour_check(vae, seed: int, n: int) -> dict[str, float]:
    """Share of ``n`` true scenes whose ``decode(encode(x))`` still matches its caption."""
    from sdplan.core.pipelines.demo import scenes as ds

    imgs, caps = ds.make_scenes(n, seed=seed + 9)
    x = to_tensor(imgs)
    rec = torch.cat([vae.decode(vae.encode(x[i : i + 16]).latent_dist.mean).sample
                     for i in range(0, n, 16)])
    rec = ((rec.clamp(-1, 1) + 1) * 127.5).round().permute(0, 2, 3, 1).numpy()
    return ds.caption_match_rates(rec, caps)


def train_vae(work: Path, seed: int) -> None:
    cfg = CONFIG["vae"]
    path = work / "vae.pt"
    torch.manual_seed(seed)
    vae = build_vae()
    opt = torch.optim.Adam(vae.parameters(), lr=cfg["lr"])
    start = 0
    if path.exists():
        st = torch.load(path, weights_only=False)
        vae.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        start = st["step"]
        if st.get("done"):
            return
    total = sum(phase["steps"] for phase in cfg["phases"])
    if start >= total:
        return
    t0 = time.time()
    for step in range(start, total):
        rng = np.random.default_rng([seed, 1, step])
        x = vae_batch(rng, step)
        phase, first, end = vae_phase(step)
        lr = cfg["lr"] * min(1.0, (step + 1) / cfg["warmup"])
        if phase["decay"]:
            lr = cosine_lr(cfg["lr"], step - first, end - first, 1)
        for g in opt.param_groups:
            g["lr"] = lr
        post = vae.encode(x).latent_dist
        # Decode the mean: the UNet only ever sees means, and sampling with the initial
        # unit variance drowns the colour signal for hundreds of steps.
        rec = vae.decode(post.mean).sample
        kl = post.kl().mean() / x[0].numel()
        loss = vae_loss(rec, x, phase) + cfg["kl_weight"] * kl
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step == total - 1:
            log.info("vae step %d loss %.4f (%.1f s)", step, loss.item(), time.time() - t0)
        done = False
        if (step + 1) % cfg["check_every"] == 0:
            vae.eval()
            rates = vae_colour_check(vae, seed, cfg["check_n"])
            vae.train()
            log.info("vae step %d encode/decode caption match %s", step + 1, rates)
            done = min(rates["background"], rates["color"]) >= cfg["stop_rate"]
        if done or (step + 1) % 50 == 0 or step == total - 1:
            save_state(
                path,
                {"model": vae.state_dict(), "opt": opt.state_dict(), "step": step + 1,
                 "done": done},
            )
        if done:
            log.info("vae colours reproduced at step %d: stopping", step + 1)
            return


@torch.no_grad()
def rescale_vae(vae, k: float) -> None:
    """Scale the latent by ``k`` without changing ``decode(encode(x))`` (see module doc)."""
    lc = vae.config.latent_channels
    qc, pqc = vae.quant_conv, vae.post_quant_conv
    qc.weight[:lc] *= k
    qc.bias[:lc] *= k
    qc.bias[lc:] += 2 * math.log(k)
    pqc.weight /= k


@torch.no_grad()
def scale_and_encode(work: Path, seed: int) -> None:
    from sdplan.core.pipelines.demo import scenes as ds

    path = work / "latents.pt"
    if path.exists():
        return
    vae = build_vae().eval()
    vae.load_state_dict(torch.load(work / "vae.pt", weights_only=False)["model"])
    captions = ds.all_captions()
    imgs, caps = ds.make_scenes(CONFIG["n_latents"], seed=seed + 2, captions=captions)
    x = to_tensor(imgs)
    means = torch.cat([vae.encode(x[i : i + 64]).latent_dist.mean for i in range(0, len(x), 64)])
    sf = CONFIG["vae_scale_factor"]
    k = 1.0 / (sf * float(means.std()))
    probe = x[:8]
    before = vae.decode(vae.encode(probe).latent_dist.mean).sample
    rescale_vae(vae, k)
    after = vae.decode(vae.encode(probe).latent_dist.mean).sample
    drift = float((before - after).abs().max())
    log.info("latent rescale k=%.4f; decode(encode(x)) changes by at most %.2e", k, drift)
    if drift > 1e-3:
        raise RuntimeError(f"VAE rescale changed the reconstruction by {drift}")
    latents = means * k * sf
    rec = vae.decode(latents[:64] / sf).sample
    err = float((rec - x[:64]).abs().mean()) * 127.5
    log.info(
        "scaled latents: mean %.3f std %.3f; reconstruction mean abs error %.2f / 255",
        float(latents.mean()),
        float(latents.std()),
        err,
    )
    save_state(
        path,
        {"latents": latents, "captions": caps, "k": k, "vae": vae.state_dict(), "rec_err": err},
    )


# ----------------------------------------------------------------------------- UNet + CLIP


def build_unet_clip():
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    unet = UNet2DConditionModel(**CONFIG["unet"]["model"])
    clip = CLIPTextModel(CLIPTextConfig(**CONFIG["clip"]))
    return unet, clip


def token_ids(captions: list[str]) -> torch.Tensor:
    from sdplan.core.text.clip_tokenizer import ClipTokenizer

    tok = ClipTokenizer.for_family(CONFIG["family"])
    return torch.from_numpy(np.stack([tok.tokenize(c).ids[0] for c in captions])).long()


@torch.no_grad()
def unet_caption_check(unet, clip, params, ema, vae, seed: int, n: int) -> dict[str, float]:
    """Share of ``n`` pictures (EMA weights, DDIM 20 steps, CFG 5) that match their captions.

    Uses its own seeded generators, so training draws are unchanged; the live weights are
    restored afterwards.
    """
    import check_demo  # beside this script
    from sdplan.core.pipelines.demo import scenes as ds

    live = [p.detach().clone() for p in params]
    for p, e in zip(params, ema, strict=True):
        p.copy_(e)
    unet.eval()
    clip.eval()
    rng = np.random.default_rng(seed + 11)
    caps = [ds.all_captions()[i] for i in rng.choice(168, size=n, replace=False)]
    seeds = [int(s) for s in rng.integers(0, 2**31, size=n)]
    imgs = np.concatenate([check_demo.generate(unet, clip, vae, caps[i : i + 8], seeds[i : i + 8])
                           for i in range(0, n, 8)])
    for p, v in zip(params, live, strict=True):
        p.copy_(v)
    unet.train()
    clip.train()
    return ds.caption_match_rates(imgs, caps)


def train_unet(work: Path, seed: int) -> None:
    from diffusers import DDPMScheduler

    cfg = CONFIG["unet"]
    path = work / "unet.pt"
    data = torch.load(work / "latents.pt", weights_only=False)
    latents, caps = data["latents"], data["captions"]
    ids = token_ids(caps)
    empty = token_ids([""])[0]
    ac = DDPMScheduler(**CONFIG["schedule"]).alphas_cumprod.float()
    snr = ac / (1 - ac)
    # min-SNR-gamma weights for a v target (Hang et al. 2023, "Efficient Diffusion Training
    # via Min-SNR Weighting Strategy", eq. for v prediction: min(SNR, gamma) / (SNR + 1))
    weight = torch.clamp(snr, max=cfg["min_snr_gamma"]) / (snr + 1)

    vae = build_vae().eval()
    vae.load_state_dict(data["vae"])
    torch.manual_seed(seed + 3)
    unet, clip = build_unet_clip()
    params = list(unet.parameters()) + list(clip.parameters())
    opt = torch.optim.AdamW(params, lr=cfg["lr"], weight_decay=0.0)
    ema = [p.detach().clone() for p in params]
    start = 0
    if path.exists():
        st = torch.load(path, weights_only=False)
        unet.load_state_dict(st["unet"])
        clip.load_state_dict(st["clip"])
        opt.load_state_dict(st["opt"])
        ema = st["ema"]
        start = st["step"]
    t0 = time.time()
    for step in range(start, cfg["steps"]):
        gen = torch.Generator().manual_seed(seed * 1000 + step)
        idx = torch.randint(0, len(latents), (cfg["batch"],), generator=gen)
        x0 = latents[idx]
        flip = torch.rand(cfg["batch"], generator=gen) < 0.5  # mirrored scenes are scenes too
        x0 = torch.where(flip.view(-1, 1, 1, 1), x0.flip(-1), x0)
        tok = ids[idx].clone()
        drop = torch.rand(cfg["batch"], generator=gen) < cfg["caption_dropout"]
        tok[drop] = empty
        t = torch.randint(0, 1000, (cfg["batch"],), generator=gen)
        eps = torch.randn(x0.shape, generator=gen)
        a = ac[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * eps
        lr = cosine_lr(cfg["lr"], step, cfg["steps"], cfg["warmup"])
        for g in opt.param_groups:
            g["lr"] = lr
        ctx = clip(tok).last_hidden_state
        pred = unet(xt, t, encoder_hidden_states=ctx).sample
        v = a.sqrt() * eps - (1 - a).sqrt() * x0
        loss = ((pred - v).pow(2).mean(dim=(1, 2, 3)) * weight[t]).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        with torch.no_grad():
            d = min(cfg["ema"], (1 + step) / (10 + step))
            for e, p in zip(ema, params, strict=True):
                e.mul_(d).add_(p.detach(), alpha=1 - d)
        if step % 10 == 0 or step == cfg["steps"] - 1:
            log.info(
                "unet step %d loss %.4f lr %.2e (%.1f s)", step, loss.item(), lr, time.time() - t0
            )
        if (step + 1) % cfg["check_every"] == 0 or step == cfg["steps"] - 1:
            rates = unet_caption_check(unet, clip, params, ema, vae, seed, cfg["check_n"])
            log.info("unet step %d caption match (EMA) %s", step + 1, rates)
        if (step + 1) % cfg["checkpoint_every"] == 0 or step == cfg["steps"] - 1:
            save_state(
                path,
                {
                    "unet": unet.state_dict(),
                    "clip": clip.state_dict(),
                    "opt": opt.state_dict(),
                    "ema": ema,
                    "step": step + 1,
                },
            )


def load_trained(work: Path, use_ema: bool = True):
    """(unet, clip, vae) from the work folder, EMA weights by default; eval mode."""
    unet, clip = build_unet_clip()
    st = torch.load(work / "unet.pt", weights_only=False)
    unet.load_state_dict(st["unet"])
    clip.load_state_dict(st["clip"])
    if use_ema:
        with torch.no_grad():
            params = list(unet.parameters()) + list(clip.parameters())
            for p, e in zip(params, st["ema"], strict=True):
                p.copy_(e)
    vae = build_vae()
    vae.load_state_dict(torch.load(work / "latents.pt", weights_only=False)["vae"])
    return unet.eval(), clip.eval(), vae.eval()


# ----------------------------------------------------------------------------- export


def export(work: Path, out: Path) -> Path:
    from safetensors.torch import save_file

    sys.path.insert(0, str(REPO / "tests" / "fixtures"))
    import convert_ldm
    import make_fixtures  # its check_round_trip compares against diffusers' converters

    unet, clip, vae = load_trained(work)
    for m in (unet, clip, vae):  # the file is fp16: check the round trip on fp16 values
        make_fixtures.round_fp16(m)
    ckpt = {}
    ckpt.update(convert_ldm.unet_to_ldm(unet.state_dict(), dict(unet.config)))
    ckpt.update(convert_ldm.vae_to_ldm(vae.state_dict(), dict(vae.config)))
    ckpt.update(convert_ldm.clip_to_ldm(clip.state_dict()))
    make_fixtures.check_round_trip("sd1", ckpt, unet, vae, clip)
    ckpt16 = {k: v.detach().half().contiguous() for k, v in ckpt.items()}
    meta = dict(CONFIG)
    meta["latent_rescale_k"] = torch.load(work / "latents.pt", weights_only=False)["k"]
    # the UNet step the weights come from (a run stopped early and exported says so)
    meta["unet_trained_steps"] = torch.load(work / "unet.pt", weights_only=False)["step"]
    out.mkdir(parents=True, exist_ok=True)
    target = out / "sdplan-demo-shapes.safetensors"
    metadata = {
        "sdplan.demo": json.dumps(meta),
        "sdplan.family": CONFIG["family"],
        "sdplan.prediction": PREDICTION[CONFIG["schedule"]["prediction_type"]],
        "sdplan.clip_heads": str(CONFIG["clip"]["num_attention_heads"]),
        # diffusers' SD 1.x "attention_head_dim" is the number of heads per attention
        "sdplan.unet_heads": str(CONFIG["unet"]["model"]["attention_head_dim"]),
    }
    save_file(ckpt16, str(target), metadata=metadata)
    (out / "sdplan-demo-shapes.json").write_text(json.dumps(meta, indent=1) + "\n")
    log.info("wrote %s (%.2f MB)", target, target.stat().st_size / 1e6)
    return target


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/sdplan-demo"), help="checkpoints")
    ap.add_argument("--out", type=Path, default=REPO / "resources" / "demo")
    ap.add_argument("--seed", type=int, default=CONFIG["seed"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vae-steps", type=int, help="override the step count of the VAE's last phase")
    ap.add_argument("--unet-steps", type=int, help="override the UNet's step count")
    ap.add_argument("--until", choices=["vae", "scale", "unet", "export"], default="export")
    ap.add_argument("--export-only", action="store_true",
                    help="export the checkpoint in --work as it is (no training)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    import_sdplan()
    CONFIG["seed"] = args.seed
    if args.vae_steps:
        CONFIG["vae"]["phases"][-1]["steps"] = args.vae_steps
    if args.unet_steps:
        CONFIG["unet"]["steps"] = args.unet_steps
    args.work.mkdir(parents=True, exist_ok=True)
    if args.export_only:
        export(args.work, args.out)
        return 0
    stages = [
        ("vae", train_vae),
        ("scale", scale_and_encode),
        ("unet", train_unet),
    ]
    t0 = time.time()
    for name, fn in stages:
        fn(args.work, args.seed)
        log.info("stage %s done at %.1f min", name, (time.time() - t0) / 60)
        if args.until == name:
            return 0
    export(args.work, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
