"""Text-to-image for the SD 1.x / 2.x family on sdplan's engine.

:class:`StableDiffusion` reads a single-file checkpoint (``read_model_files``), infers each
module's hyper-parameters from its tensor shapes, and runs the CLIP text encoder (``te``), the
UNet (``diffusion``) and the VAE (``vae``) where a :class:`~sdplan.core.plan.Plan` puts them:

* runtime device = the module's first plan device; the graph's backends are that device's
  backend followed by the CPU (the scheduler's fallback);
* params residency ``runtime``: the weights are read into a buffer on the runtime device once
  and stay; ``device``: they stay on the params device and are copied into a runtime-device
  buffer for each use (staging), freed after; ``disk``: read from the file for each use
  and freed after.

A "use" is one text encoding, one whole sampling loop, or one decode. The UNet graph is built
once per latent shape and batch and reused across steps; classifier-free guidance runs the
conditional and unconditional halves as one batch of 2N.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core import graph as gr
from sdplan.core import sampling
from sdplan.core.checkpoint import ModelTensor, read_model_files
from sdplan.core.errors import EngineError, ModelFileError
from sdplan.core.models import clip as clip_m
from sdplan.core.models import unet as unet_m
from sdplan.core.models import vae as vae_m
from sdplan.core.preview import latent_to_rgb
from sdplan.core.prompt import apply_prompt_weights
from sdplan.core.tokenizer import ClipTokenizer

__all__ = ["ModuleWeights", "StableDiffusion", "GenerateParams", "runtime_dtype",
           "image_to_uint8"]

log = logging.getLogger(__name__)
Backend = Any


def runtime_dtype(shape: tuple[int, ...], file_dtype: str) -> str:
    """Dtype a weight is held in: vectors f32, f16/f32 kept, anything else (bf16...) f32."""
    dt = file_dtype.lower()
    if len(shape) <= 1:
        return "f32"
    return dt if dt in ("f16", "f32") else "f32"


class ModuleWeights:
    """One module's weight tensors in a ``sdplan._ggml.WeightStore``.

    Tensor names in the store are short (``w0``, ``w1``... ggml caps names at 63 characters);
    :attr:`tensors` maps the checkpoint names to the store's tensors for the model graphs.
    ``load(backend)`` allocates one buffer on the backend and reads the file (bytes);
    ``stage(src, backend)`` copies from another loaded ``ModuleWeights`` of the same tensors.

    Raises ModelFileError when a tensor has an unsupported dtype.
    """

    def __init__(self, tensors: list[ModelTensor]) -> None:
        import sdplan._ggml as native

        self.infos = [t.info for t in tensors if t.info.shape]
        self.short = {i.name: f"w{k}" for k, i in enumerate(self.infos)}
        try:
            self.store = native.WeightStore(
                [(self.short[i.name], runtime_dtype(i.shape, i.dtype), list(i.shape)) for i in self.infos])
        except ValueError as exc:
            raise ModelFileError(self.infos[0].file if self.infos else "?", str(exc)) from None
        self.tensors = {i.name: self.store.tensor(self.short[i.name]) for i in self.infos}
        self.buffer: Any = None

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors in their runtime dtypes."""
        return sum(self.store.nbytes(s) for s in self.short.values())

    def load(self, backend: Backend) -> int:
        """Allocate on ``backend`` and read every tensor from its file; returns bytes read."""
        self.buffer = self.store.allocate(list(self.short.values()), backend)
        total = 0
        by_file: dict[str, list[tuple[str, int, str]]] = {}
        for i in self.infos:
            by_file.setdefault(i.file, []).append((self.short[i.name], i.offset, i.dtype.lower()))
        for path, items in by_file.items():
            total += int(self.store.read(path, items))
        return total

    def stage(self, src: ModuleWeights, backend: Backend) -> int:
        """Allocate on ``backend`` and copy every tensor from ``src``; returns bytes."""
        self.buffer = self.store.allocate(list(self.short.values()), backend)
        return int(self.store.copy_from(src.store, list(self.short.values())))

    def free(self) -> None:
        """Free the buffer (idempotent)."""
        if self.buffer is not None:
            self.buffer.free()
            self.buffer = None


@dataclass
class _Module:
    """A module's placement and its resident/staged weights and cached graphs."""

    name: str
    tensors: list[ModelTensor]
    runtime: Backend
    cpu: Backend
    mode: str = "runtime"
    params: Backend | None = None
    resident: ModuleWeights | None = None
    graphs: dict[Any, Any] = field(default_factory=dict)
    n_threads: int = 0
    load_seconds: float = 0.0

    @contextlib.contextmanager
    def use(self) -> Iterator[dict[str, Any]]:
        """Weights on the runtime device for the duration of the block."""
        if self.mode == "runtime":
            if self.resident is None:
                t0 = time.perf_counter()
                self.resident = ModuleWeights(self.tensors)
                self.resident.load(self.runtime)
                self.load_seconds += time.perf_counter() - t0
            yield self.resident.tensors
            return
        t0 = time.perf_counter()
        active = ModuleWeights(self.tensors)
        if self.mode == "device":
            if self.resident is None:
                self.resident = ModuleWeights(self.tensors)
                self.resident.load(self.params or self.cpu)
            active.stage(self.resident, self.runtime)
        else:
            active.load(self.runtime)
        self.load_seconds += time.perf_counter() - t0
        self.graphs.clear()
        try:
            yield active.tensors
        finally:
            self.graphs.clear()
            active.free()

    def graph(self, key: Any, build: Callable[[Any], None]) -> Any:
        """The cached graph for ``key`` (built by ``build(g)`` on first use)."""
        g = self.graphs.get(key)
        if g is None:
            backends = [self.runtime] if self.runtime is self.cpu else [self.runtime, self.cpu]
            g = gr.new_graph(backends, n_threads=self.n_threads)
            build(g)
            self.graphs[key] = g
        return g

    def close(self) -> None:
        self.graphs.clear()
        if self.resident is not None:
            self.resident.free()
            self.resident = None


@dataclass
class GenerateParams:
    """What to generate (sd-cli's meanings): prompt, negative prompt, width/height in pixels,
    steps, cfg scale, seed, sampler (``--sampling-method``), scheduler, batch count, clip skip
    (0 = the family default)."""

    prompt: str
    negative_prompt: str = ""
    width: int = 512
    height: int = 512
    steps: int = 20
    cfg_scale: float = 7.0
    seed: int = 42
    sampler: str = "euler_a"
    scheduler: str = "discrete"
    batch: int = 1
    clip_skip: int = 0


def image_to_uint8(img: np.ndarray) -> np.ndarray:
    """``(3, H, W)`` float in [-1, 1] -> ``(H, W, 3)`` uint8 (clamped, rounded)."""
    x = np.clip((img + 1.0) * 127.5, 0, 255)
    return np.ascontiguousarray(np.round(x).astype(np.uint8).transpose(1, 2, 0))


class StableDiffusion:
    """An SD 1.x / 2.x checkpoint ready to run.

    Args:
        model: the single-file checkpoint (``-m``).
        plan: a resolved :class:`~sdplan.core.plan.Plan` (None: everything on the CPU).
        manager: a ``sdplan._ggml.BackendManager`` (None: a private one, CPU threads
            ``n_threads``).
        family: ``sd1`` or ``sd2`` (None: ``sd2`` for an OpenCLIP text encoder, else ``sd1``).
        prediction: ``eps`` or ``v`` (None: the family's, v for sd2).
        clip_heads / unet_heads / unet_head_dim: override the head rules (tiny models).

    Raises:
        ModelFileError: unreadable file or a missing module (te, diffusion, vae).
        EngineError: a planned device that has no backend here.
    """

    def __init__(self, model: str | Path, plan: Any = None, manager: Any = None, n_threads: int = 0,
                 family: str | None = None, prediction: str | None = None,
                 clip_heads: int | None = None, unet_heads: int | None = None,
                 unet_head_dim: int | None = None) -> None:
        import sdplan._ggml as native

        self.path = str(model)
        self.ms = read_model_files({"model": [self.path]})
        missing = [m for m in ("te", "diffusion", "vae") if not self.ms.module_tensors(m)]
        if missing:
            raise ModelFileError(self.path, f"no {', '.join(missing)} tensors: not an SD checkpoint")
        self._own_manager = manager is None
        self.manager = manager or native.BackendManager(n_threads)
        self.cpu = self.manager.get("CPU")
        shapes = {t.info.name: tuple(t.info.shape) for t in self.ms.tensors}
        self.clip_cfg = clip_m.clip_config(shapes, n_heads=clip_heads)
        self.family = family or ("sd2" if self.clip_cfg.layout == "openclip" else "sd1")
        self.prediction = prediction or ("v" if self.family == "sd2" else "eps")
        self.unet_cfg = unet_m.unet_config(shapes, self.family, unet_heads, unet_head_dim)
        self.vae_cfg = vae_m.vae_config(shapes)
        self.tokenizer = ClipTokenizer.for_family(self.family)
        self.schedule = sampling.DiscreteSchedule()
        self.modules = {m: self._module(m, plan, n_threads) for m in ("te", "diffusion", "vae")}
        self.timings: dict[str, float] = {}

    def _backend(self, device: str | None) -> Backend:
        if device is None or device == "CPU":
            return self.cpu
        try:
            return self.manager.get(device)
        except (ValueError, RuntimeError) as exc:
            raise EngineError(f"planned device {device!r} has no backend here: {exc}") from None

    def _module(self, name: str, plan: Any, n_threads: int) -> _Module:
        tensors = self.ms.module_tensors(name)
        if plan is None:
            return _Module(name, tensors, self.cpu, self.cpu, n_threads=n_threads)
        mp = plan.modules[name]
        runtime = self._backend(mp.devices[0] if mp.devices else None)
        params = self._backend(mp.params.device) if mp.params.mode == "device" else None
        mode = mp.params.mode
        if mode == "device" and params is runtime:
            mode = "runtime"
        return _Module(name, tensors, runtime, self.cpu, mode, params, n_threads=n_threads)

    def close(self) -> None:
        """Free every weight buffer and graph (and the private backend manager)."""
        for m in self.modules.values():
            m.close()
        if self._own_manager:
            self.manager.close()

    def __enter__(self) -> StableDiffusion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ text encoder

    def encode_ids(self, ids: np.ndarray, clip_skip: int = 0, final_ln: bool = True) -> np.ndarray:
        """Hidden states of token-id chunks ``(K, 77)`` int32 -> ``(K, 77, D)`` float32.

        ``clip_skip`` 0 means the family default (1 for sd1, 2 for sd2)."""
        skip = clip_skip or (2 if self.family == "sd2" else 1)
        ids = np.ascontiguousarray(ids, dtype=np.int32)
        mod = self.modules["te"]
        t0 = time.perf_counter()
        with mod.use() as w:
            def build(g: Any) -> None:
                x = g.input("ids", ids.shape, "i32")
                mask = g.input("mask", (ids.shape[1], ids.shape[1]))
                g.output("h", clip_m.clip_text(g, w, x, mask, self.clip_cfg, skip, final_ln))
            g = mod.graph(("clip", ids.shape, skip, final_ln), build)
            g.set_input("ids", ids)
            g.set_input("mask", clip_m.causal_mask(ids.shape[1]))
            g.compute()
            out = g.get_output("h")
        self.timings["text_encode"] = time.perf_counter() - t0
        return out

    def encode_prompt(self, prompt: str, clip_skip: int = 0) -> np.ndarray:
        """Context for a prompt with sd-cli's ``(word:1.2)`` weights, chunks of 77 tokens
        concatenated: ``(1, 77*K, D)`` float32."""
        tp = self.tokenizer.tokenize(prompt)
        ids = np.asarray(tp.ids, dtype=np.int32).reshape(-1, 77)
        hidden = self.encode_ids(ids, clip_skip)
        weights = np.asarray(tp.weights, dtype=np.float32).reshape(hidden.shape[:2])
        hidden = apply_prompt_weights(hidden, weights)
        return hidden.reshape(1, -1, hidden.shape[-1]).astype(np.float32)

    # ------------------------------------------------------------------ UNet

    @contextlib.contextmanager
    def unet_session(self) -> Iterator[Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]]:
        """``fn(x, t, context) -> out`` with the UNet's weights in use (graph per shape)."""
        mod = self.modules["diffusion"]
        with mod.use() as w:
            def run(x: np.ndarray, t: np.ndarray, ctx: np.ndarray) -> np.ndarray:
                key = ("unet", x.shape, ctx.shape)

                def build(g: Any) -> None:
                    xi = g.input("x", x.shape)
                    ti = g.input("t", (x.shape[0],))
                    ci = g.input("c", ctx.shape)
                    g.output("y", unet_m.unet(g, w, xi, ti, ci, self.unet_cfg))
                g = mod.graph(key, build)
                g.set_input("x", np.ascontiguousarray(x, dtype=np.float32))
                g.set_input("t", np.ascontiguousarray(np.broadcast_to(t, (x.shape[0],)), dtype=np.float32))
                g.set_input("c", np.ascontiguousarray(ctx, dtype=np.float32))
                g.compute()
                return g.get_output("y")
            yield run

    def denoiser(self, unet: Callable[..., np.ndarray], cond: np.ndarray, uncond: np.ndarray | None,
                 cfg_scale: float) -> sampling.Denoiser:
        """A k-diffusion style denoiser (eps or v scalings of :func:`sampling.scalings`);
        with CFG both halves run as one batch: ``u + cfg (c - u)``."""
        guided = uncond is not None and cfg_scale != 1.0

        def denoise(x: np.ndarray, sigma: float) -> np.ndarray:
            c_skip, c_out, c_in = sampling.scalings(float(sigma), self.prediction)
            t = np.float32(self.schedule.sigma_to_t(float(sigma)))
            x_in = (x * c_in).astype(np.float32)
            n = x.shape[0]
            if guided:
                assert uncond is not None
                ctx = np.concatenate([np.repeat(cond, n, 0), np.repeat(uncond, n, 0)], 0)
                out = unet(np.concatenate([x_in, x_in], 0), t, ctx)
                out = out[n:] + cfg_scale * (out[:n] - out[n:])
            else:
                out = unet(x_in, t, np.repeat(cond, n, 0))
            return (x * c_skip + out * c_out).astype(np.float32)

        return denoise

    # ------------------------------------------------------------------ VAE

    def decode(self, latent: np.ndarray, tile: int | None = None) -> np.ndarray:
        """Latent as sampled (``(N, 4, h, w)``, scaled) -> images ``(N, 3, 8h, 8w)`` in [-1, 1].

        ``tile`` (latent pixels) decodes in overlapping tiles when the latent is larger."""
        z = np.ascontiguousarray(latent / vae_m.SCALE_FACTOR, dtype=np.float32)
        mod = self.modules["vae"]
        t0 = time.perf_counter()
        with mod.use() as w:
            def one(zt: np.ndarray) -> np.ndarray:
                def build(g: Any) -> None:
                    zi = g.input("z", zt.shape)
                    g.output("img", vae_m.vae_decode(g, w, zi, self.vae_cfg))
                g = mod.graph(("dec", zt.shape), build)
                g.set_input("z", zt)
                g.compute()
                return g.get_output("img")
            if tile and (z.shape[-1] > tile or z.shape[-2] > tile):
                out = vae_m.tiled_decode(one, z, tile, max(1, tile // 4), self.vae_cfg.factor)
            else:
                out = one(z)
        self.timings["decode"] = time.perf_counter() - t0
        return out

    def encode_image(self, img: np.ndarray) -> np.ndarray:
        """Images ``(N, 3, H, W)`` in [-1, 1] -> latent means ``(N, 4, H/8, W/8)`` (unscaled)."""
        img = np.ascontiguousarray(img, dtype=np.float32)
        mod = self.modules["vae"]
        with mod.use() as w:
            def build(g: Any) -> None:
                xi = g.input("img", img.shape)
                g.output("mean", vae_m.vae_encode(g, w, xi, self.vae_cfg))
            g = mod.graph(("enc", img.shape), build)
            g.set_input("img", img)
            g.compute()
            return g.get_output("mean")

    # ------------------------------------------------------------------ txt2img

    def txt2img(self, p: GenerateParams,
                on_step: Callable[[int, int, np.ndarray], None] | None = None,
                preview: Callable[[int, np.ndarray], None] | None = None,
                noise: np.ndarray | None = None, sigmas: np.ndarray | None = None,
                vae_tile: int | None = None) -> list[np.ndarray]:
        """Generate ``p.batch`` images; returns ``(H, W, 3)`` uint8 arrays.

        ``on_step(step, total, latent)`` after every sampler step; ``preview(step, rgb)``
        with the cheap latent-to-RGB projection (uint8 ``(h, w, 3)``). ``noise``/``sigmas``
        override the seeded Philox noise ``(batch, 4, H/8, W/8)`` and the schedule (tests).

        Raises:
            ValueError: width/height not multiples of 8 * 2^(levels-1)... (the UNet's factor).
            sampling.SamplingError: unknown sampler or scheduler.
        """
        f = self.vae_cfg.factor * 2 ** (len(self.unet_cfg.channel_mult) - 1)
        if p.width % f or p.height % f or p.width <= 0 or p.height <= 0:
            raise ValueError(f"width and height must be positive multiples of {f}, got "
                             f"{p.width}x{p.height}")
        cond = self.encode_prompt(p.prompt, p.clip_skip)
        uncond = self.encode_prompt(p.negative_prompt, p.clip_skip) if p.cfg_scale != 1.0 else None
        if uncond is not None and uncond.shape != cond.shape:
            k = max(cond.shape[1], uncond.shape[1])
            cond, uncond = _pad_chunks(cond, k), _pad_chunks(uncond, k)
        shape = (p.batch, self.unet_cfg.in_channels, p.height // self.vae_cfg.factor,
                 p.width // self.vae_cfg.factor)
        gen = sampling.PhiloxNoise(p.seed)
        if noise is None:
            noise = gen.randn(shape)
        if sigmas is None:
            sigmas = sampling.get_sigmas(p.scheduler, p.steps, self.schedule, self.family)
        x = sampling.initial_latent(noise, sigmas)
        total = len(sigmas) - 1

        def cb(i: int, xi: np.ndarray, den: np.ndarray) -> None:
            if on_step:
                on_step(i + 1, total, xi)
            if preview:
                preview(i + 1, latent_to_rgb(den[0], self.family))

        t0 = time.perf_counter()
        with self.unet_session() as unet:
            den = self.denoiser(unet, cond, uncond, p.cfg_scale)
            latent = sampling.sample(p.sampler, den, x, sigmas, noise=gen, callback=cb,
                                     schedule=self.schedule)
        self.timings["sampling"] = time.perf_counter() - t0
        self.timings["per_step"] = self.timings["sampling"] / max(total, 1)
        images = self.decode(latent, vae_tile)
        return [image_to_uint8(im) for im in images]


def _pad_chunks(ctx: np.ndarray, tokens: int) -> np.ndarray:
    """Repeat the last 77-token chunk until ``ctx`` has ``tokens`` tokens."""
    while ctx.shape[1] < tokens:
        ctx = np.concatenate([ctx, ctx[:, -77:]], 1)
    return ctx
