"""Flux.1 text-to-image: T5-XXL + CLIP-L pooled conditioning, flow-matching sampling with the
DiT, decoding with the 16-channel autoencoder, TAEF1 previews.

Modules run through :class:`ModuleRunner`: a module graph (:class:`sdplan.core.models.ModuleGraph`)
with its weights read from one model file into backend buffers, blocks placed by layer-split
ranges (``(backend index, first block, last block)``; non-block tensors, inputs and outputs on
backend 0, the main device), residency ``runtime`` (weights stay in the buffers) or ``disk``
(weights are read for every call and freed after it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core import graph as gr
from sdplan.core.errors import SdplanError
from sdplan.core.weights import CHUNK_BYTES, ggml_dtype

log = logging.getLogger(__name__)

__all__ = ["ModuleRunner", "FluxModels", "FluxPlacement", "FluxPipeline", "txt2img", "SCALE_FACTOR", "SHIFT_FACTOR"]

#: Flux autoencoder latent scaling: ``z_model = (z_vae - SHIFT) * SCALE``.
SCALE_FACTOR = 0.3611
SHIFT_FACTOR = 0.1159

Range = tuple[int, int, int]
#: ggml's tensor names hold at most 63 bytes.
MAX_NAME = 63


def _short_name(name: str) -> str:
    """``name`` itself when it fits ggml's 63-byte names, else a short unique alias
    (the name without its leading prefix parts, or a hash)."""
    if len(name.encode()) <= MAX_NAME:
        return name
    parts = name.split(".")
    for k in range(1, len(parts)):
        tail = ".".join(parts[k:])
        if len(tail.encode()) <= MAX_NAME - 9:
            import hashlib

            return hashlib.sha1(name.encode()).hexdigest()[:8] + ":" + tail
    import hashlib

    return "w:" + hashlib.sha1(name.encode()).hexdigest()


class ModuleRunner:
    """Run one module graph on one or several backends.

    Args:
        module: a ModuleGraph (``n_blocks``, ``block_tensors``, ``other_tensors``,
            ``input_specs``, ``build_pre/block/post``).
        path: the model file (safetensors or GGUF) holding the module's tensors.
        backends: ``sdplan._ggml.Backend`` objects, main device first.
        ranges: ``(backend index, first block, last block)`` covering every block once, in
            order; None puts every block on backend 0.
        residency: ``runtime`` (weights resident between calls) or ``disk`` (read per call).
        dtypes: name -> runtime dtype overrides (default: the weights module's policy).
        n_threads: CPU threads per compute (0: ggml's default).

    Raises:
        SdplanError: bad ranges or residency; ModelFileError for missing tensors.
    """

    def __init__(self, module: Any, path: str | Path, backends: Sequence[Any],
                 ranges: Sequence[Range] | None = None, residency: str = "runtime",
                 dtypes: Mapping[str, str] | None = None, n_threads: int = 0) -> None:
        from sdplan.core.weights import WeightFile

        if residency not in ("runtime", "disk"):
            raise SdplanError(f"residency must be 'runtime' or 'disk', got {residency!r}")
        self.module = module
        self.backends = list(backends)
        self.residency = residency
        self.n_threads = n_threads
        n = module.n_blocks
        ranges = list(ranges) if ranges else ([(0, 0, n - 1)] if n else [])
        self.block_device = [-1] * n
        for dev, first, last in ranges:
            if not 0 <= dev < len(self.backends) or not 0 <= first <= last < n:
                raise SdplanError(f"layer-split range {(dev, first, last)} does not fit {n} blocks "
                                  f"on {len(self.backends)} devices")
            for i in range(first, last + 1):
                if self.block_device[i] != -1:
                    raise SdplanError(f"block {i} is in two layer-split ranges")
                self.block_device[i] = dev
        if -1 in self.block_device:
            raise SdplanError(f"layer-split ranges leave block {self.block_device.index(-1)} unplaced")
        self.names_per_device: list[list[str]] = [[] for _ in self.backends]
        self.names_per_device[0] += module.other_tensors()
        for i, dev in enumerate(self.block_device):
            self.names_per_device[dev] += module.block_tensors(i)
        every = [nm for names in self.names_per_device for nm in names]
        self.file = WeightFile(path, names=every, dtypes=dtypes, backend=self.backends[0])
        self.alias = {n: _short_name(n) for n in every}
        import sdplan._ggml as native

        self.store = native.WeightStore([(self.alias[n], dt, shape) for n, dt, shape in self.file.specs()])
        self.buffers: list[tuple[int, Any]] = []
        self.graphs: dict[tuple, Any] = {}
        if residency == "runtime":
            self._load()

    def _load(self) -> None:
        for i, (b, names) in enumerate(zip(self.backends, self.names_per_device, strict=True)):
            if names:
                self.buffers.append((i, self.store.allocate([self.alias[n] for n in names], b)))
                items = [(self.alias[n], self.file.infos[n].offset, ggml_dtype(self.file.infos[n].dtype))
                         for n in names]
                self.store.read(self.file.path, items, CHUNK_BYTES)

    def _free(self) -> None:
        for _, buf in self.buffers:
            buf.free()
        self.buffers = []

    def weight_bytes(self) -> list[int]:
        """Bytes of weight buffers per backend (index order); 0 where none is allocated."""
        out = [0] * len(self.backends)
        for i, buf in self.buffers:
            out[i] += int(buf.size)
        return out

    def tensor_bytes(self) -> list[int]:
        """Bytes of the tensors (in runtime dtypes) placed on each backend, whether resident or not."""
        return [sum(int(self.store.nbytes(self.alias[n])) for n in names) for names in self.names_per_device]

    def _build(self, shapes: dict[str, tuple[int, ...]]) -> Any:
        m = self.module
        g = gr.new_graph(self.backends, n_threads=self.n_threads)

        def w(name: str) -> Any:
            return self.store.tensor(self.alias[name])

        with gr.on(g, 0):
            ins = {k: g.input(k, shape, dt) for k, (shape, dt) in m.input_specs(shapes).items()}
            state = m.build_pre(g, w, ins)
        for i in range(m.n_blocks):
            with gr.on(g, self.block_device[i]):
                state = m.build_block(g, w, i, state)
        with gr.on(g, 0):
            outs = m.build_post(g, w, state)
        for k, v in outs.items():
            g.output(k, v)
        return g

    def __call__(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Compute the module on ``arrays`` (graph input name -> array); returns its outputs."""
        shapes = {k: tuple(np.shape(v)) for k, v in arrays.items()}
        key = tuple(sorted(shapes.items()))
        if self.residency == "disk":
            self._load()
        try:
            g = self.graphs.get(key) if self.residency == "runtime" else None
            if g is None:
                g = self._build(shapes)
                if self.residency == "runtime":
                    self.graphs[key] = g
            for name in g.input_names:
                g.set_input(name, np.ascontiguousarray(arrays[name]))
            g.compute()
            return {name: np.array(g.get_output(name)) for name in g.output_names}
        finally:
            if self.residency == "disk":
                self._free()

    def close(self) -> None:
        """Free graphs and weight buffers."""
        self.graphs.clear()
        self._free()


class _StoreView(Mapping[str, Any]):
    """Model-file names -> tensors of a runner's store (for graph functions taking a mapping)."""

    def __init__(self, runner: ModuleRunner) -> None:
        self.runner = runner

    def __getitem__(self, name: str) -> Any:
        if name not in self.runner.alias:
            raise KeyError(name)
        return self.runner.store.tensor(self.runner.alias[name])

    def __iter__(self) -> Any:
        return iter(self.runner.alias)

    def __len__(self) -> int:
        return len(self.runner.alias)


class _Whole:
    """A module without blocks built by one function ``fn(g, weights_view, inputs) -> outputs``."""

    n_blocks = 0

    def __init__(self, names: list[str], specs: dict[str, tuple[tuple[int, ...], str]],
                 fn: Callable[[Any, Mapping[str, Any], dict[str, Any]], dict[str, Any]]) -> None:
        self.names, self.specs, self.fn = names, specs, fn
        self.view: Mapping[str, Any] = {}

    def block_tensors(self, i: int) -> list[str]:
        raise IndexError(i)

    def other_tensors(self) -> list[str]:
        return list(self.names)

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        return {k: (tuple(shapes[k]), dt) for k, (_, dt) in self.specs.items()}

    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return dict(inputs)

    def build_post(self, g: Any, w: Any, state: dict[str, Any]) -> dict[str, Any]:
        return self.fn(g, self.view, state)


def _shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    from sdplan.core.checkpoint_readers import read_tensor_file

    return {t.name: tuple(t.shape) for t in read_tensor_file(path).tensors}


@dataclass
class FluxModels:
    """The model files of a Flux run (sd-cli's ``--diffusion-model``, ``--t5xxl``,
    ``--clip_l``, ``--vae``, ``--taesd``) and the hyper-parameter overrides tiny models need
    (``heads``/``axes`` of the DiT, ``clip_heads``)."""

    diffusion_model: str | Path
    t5xxl: str | Path
    clip_l: str | Path
    vae: str | Path
    taesd: str | Path | None = None
    heads: int | None = None
    axes: tuple[int, int, int] | None = None
    clip_heads: int | None = None


@dataclass
class FluxPlacement:
    """Backends and layer split of a Flux run.

    ``diffusion`` / ``te``: backends, main device first; ``diffusion_ranges`` / ``te_ranges``:
    ``(backend index, first block, last block)`` (None: all on the main device); ``vae``:
    the VAE's backend (default: the diffusion main device); residencies ``runtime`` or
    ``disk``. CLIP-L runs on the ``te`` main device.
    """

    diffusion: Sequence[Any]
    te: Sequence[Any] | None = None
    vae: Any | None = None
    diffusion_ranges: Sequence[Range] | None = None
    te_ranges: Sequence[Range] | None = None
    diffusion_residency: str = "runtime"
    te_residency: str = "runtime"
    n_threads: int = 0
    dtypes: Mapping[str, str] = field(default_factory=dict)


class FluxPipeline:
    """Flux.1 txt2img over :class:`ModuleRunner` modules.

    Raises:
        ModelLayoutError / ModelFileError: files that are not the expected models.
    """

    def __init__(self, models: FluxModels, placement: FluxPlacement) -> None:
        from sdplan.core.models.clip import clip_config
        from sdplan.core.models.flux import FluxDiT
        from sdplan.core.models.t5 import T5Encoder
        from sdplan.core.models.vae import vae_config

        pl = placement
        te = list(pl.te or pl.diffusion[:1])
        self.dit = FluxDiT.from_weights(_shapes(models.diffusion_model), models.heads, models.axes)
        self.dit_runner = ModuleRunner(self.dit, models.diffusion_model, pl.diffusion, pl.diffusion_ranges,
                                       pl.diffusion_residency, pl.dtypes, pl.n_threads)
        self.t5 = T5Encoder.from_weights(_shapes(models.t5xxl))
        self.t5_runner = ModuleRunner(self.t5, models.t5xxl, te, pl.te_ranges, pl.te_residency,
                                      pl.dtypes, pl.n_threads)
        clip_shapes = _shapes(models.clip_l)
        self.clip_cfg = clip_config(clip_shapes, n_heads=models.clip_heads)
        clip_names = [n for n in clip_shapes if n.startswith(self.clip_cfg.prefix) and "position_ids" not in n
                      and "text_projection" not in n]
        self.clip_mod = _Whole(clip_names, {"ids": ((1, 77), "i32"), "mask": ((77, 77), "f32")}, self._clip)
        self.clip_runner = ModuleRunner(self.clip_mod, models.clip_l, te[:1], None, pl.te_residency,
                                        pl.dtypes, pl.n_threads)
        self.clip_mod.view = _StoreView(self.clip_runner)
        vae_shapes = _shapes(models.vae)
        prefix = "first_stage_model." if any(n.startswith("first_stage_model.") for n in vae_shapes) else ""
        self.vae_cfg = vae_config(vae_shapes, prefix)
        dec = [n for n in vae_shapes if n.startswith(prefix + "decoder.")]
        self.vae_mod = _Whole(dec, {"z": ((), "f32")}, self._decode)
        self.vae_runner = ModuleRunner(self.vae_mod, models.vae, [pl.vae or pl.diffusion[0]], None, "runtime",
                                       None, pl.n_threads)
        self.vae_mod.view = _StoreView(self.vae_runner)
        self.preview = None
        if models.taesd is not None:
            self.preview = _tae_decoder(models.taesd, pl.vae or pl.diffusion[0], pl.n_threads)

    def _clip(self, g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        from sdplan.core.models.clip import clip_text

        return {"hidden": clip_text(g, w, ins["ids"], ins["mask"], self.clip_cfg)}

    def _decode(self, g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        from sdplan.core.models.vae import vae_decode

        return {"image": vae_decode(g, w, ins["z"], self.vae_cfg)}

    # ------------------------------------------------------------------ stages
    def encode_prompt(self, prompt: str, t5_length: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """``(context (1, T, t5 width), pooled (1, clip width))`` float32 for ``prompt``:
        T5 hidden states with the prompt weights applied (sd-cli's mean-keeping rule), and
        CLIP-L's final-LayerNorm state at the first end-of-text token."""
        from sdplan.core.models.clip import causal_mask
        from sdplan.core.prompt import apply_prompt_weights
        from sdplan.core.t5_tokenizer import T5Tokenizer
        from sdplan.core.tokenizer import EOS_ID, ClipTokenizer

        tok = T5Tokenizer().tokenize(prompt, t5_length)
        hidden = self.t5_runner(self.t5.inputs(tok.ids))["hidden"]
        context = apply_prompt_weights(hidden, tok.weights)
        clip = ClipTokenizer(EOS_ID).tokenize(prompt)
        ids = clip.ids[:1]
        h = self.clip_runner({"ids": ids, "mask": causal_mask(77)})["hidden"]
        eos = int(np.argmax(ids[0] == EOS_ID))
        return context.astype(np.float32), h[:, eos, :].astype(np.float32)

    def velocity(self, x: np.ndarray, sigma: float, context: np.ndarray, pooled: np.ndarray,
                 guidance: float | None) -> np.ndarray:
        """The DiT's velocity for latent ``x`` ``(1, 16, H, W)`` at ``sigma``."""
        from sdplan.core.models.flux import unpatchify

        out = self.dit_runner(self.dit.inputs(x, context, pooled, sigma, guidance))["out"]
        return unpatchify(out, x.shape[2], x.shape[3])

    def decode(self, latent: np.ndarray) -> np.ndarray:
        """Image ``(1, 3, 8h, 8w)`` (about [-1, 1]) of a model-space latent: the VAE decodes
        ``latent / SCALE_FACTOR + SHIFT_FACTOR``."""
        z = (latent / SCALE_FACTOR + SHIFT_FACTOR).astype(np.float32)
        return self.vae_runner({"z": z})["image"]

    def txt2img(self, prompt: str, width: int, height: int, *, steps: int | None = None,
                seed: int = 42, sampler: str = "euler", guidance: float = 3.5,
                t5_length: int = 256, noise: np.ndarray | None = None,
                preview: Callable[[int, np.ndarray], None] | None = None,
                vae_scale: int = 8) -> dict[str, np.ndarray]:
        """Generate one image.

        Args:
            prompt: the prompt (sd-cli weighting syntax).
            width, height: image size in pixels (multiples of ``2 * vae_scale``).
            steps: sampling steps (default: 4 for schnell, 20 for dev).
            seed: Philox seed of the starting noise (and of ancestral samplers).
            sampler: a :data:`sdplan.core.flow.FLOW_SAMPLERS` name.
            guidance: dev's distilled guidance (``--guidance``; schnell ignores it).
            t5_length: T5 tokens after padding (256 as sd-cli for Flux).
            noise: an explicit starting noise ``(1, 16, h, w)`` instead of the seed's.
            preview: ``preview(step, rgb_uint8 (H, W, 3))`` after each step, from TAEF1 when
                a ``taesd`` file is given, else the latent-to-RGB projection.
            vae_scale: pixels per latent cell (8 for Flux's autoencoder).

        Returns:
            ``{"latent": (1, 16, h, w), "image": (1, 3, H, W) float32, "sigmas": ...}``.

        Raises:
            SdplanError: a size that is not a multiple of ``2 * vae_scale``; SamplingError.
        """
        from sdplan.core.flow import DEFAULT_STEPS, flux_sigmas, sample_flow
        from sdplan.core.sampling import PhiloxNoise

        if width % (2 * vae_scale) or height % (2 * vae_scale) or width <= 0 or height <= 0:
            raise SdplanError(f"Flux image size {width}x{height} must be positive multiples of {2 * vae_scale}")
        h, w = height // vae_scale, width // vae_scale
        variant = self.dit.cfg.variant
        steps = steps or DEFAULT_STEPS[variant]
        sigmas = flux_sigmas(steps, (h // 2) * (w // 2), shift=variant == "dev")
        context, pooled = self.encode_prompt(prompt, t5_length)
        rng = PhiloxNoise(seed)
        start = rng.randn((1, 16, h, w)) if noise is None else np.asarray(noise, dtype=np.float32)
        g = guidance if self.dit.cfg.guidance else None

        def vel(x: np.ndarray, s: float) -> np.ndarray:
            return self.velocity(x, s, context, pooled, g)

        def cb(i: int, x: np.ndarray, den: np.ndarray) -> None:
            if preview is not None:
                preview(i, self._preview_rgb(den))

        latent = sample_flow(sampler, vel, start, sigmas, noise=rng, callback=cb)
        return {"latent": latent, "image": self.decode(latent), "sigmas": sigmas}

    def _preview_rgb(self, latent: np.ndarray) -> np.ndarray:
        if self.preview is not None:
            img = self.preview(latent / SCALE_FACTOR + SHIFT_FACTOR)
            return (np.clip(img[0].transpose(1, 2, 0), 0, 1) * 255).round().astype(np.uint8)
        from sdplan.core.preview import latent_to_rgb

        return latent_to_rgb(latent, "flux")

    def memory(self) -> dict[str, list[int]]:
        """Weight bytes per backend (index order) of each module: ``diffusion``, ``t5xxl``,
        ``clip_l``, ``vae``."""
        return {"diffusion": self.dit_runner.weight_bytes(), "t5xxl": self.t5_runner.weight_bytes(),
                "clip_l": self.clip_runner.weight_bytes(), "vae": self.vae_runner.weight_bytes()}

    def close(self) -> None:
        """Free every weight buffer and graph."""
        for r in (self.dit_runner, self.t5_runner, self.clip_runner, self.vae_runner):
            r.close()


def _tae_decoder(path: str | Path, backend: Any, n_threads: int) -> Callable[[np.ndarray], np.ndarray]:
    """TAEF1 decoder of ``path`` as ``decode(latent (1, 16, h, w)) -> image (1, 3, 8h, 8w)`` in
    about [0, 1]."""
    from sdplan.core.models.tae import detect_tae, split_tae, tae_decode

    shapes = _shapes(path)
    layouts = detect_tae(shapes, str(path))
    if "decoder" not in layouts:
        raise SdplanError(f"{path}: no TAE decoder")
    holder: dict[str, Any] = {}

    def fn(g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        return {"image": tae_decode(g, split_tae(w, layouts["decoder"]), ins["z"])}

    mod = _Whole(list(shapes), {"z": ((), "f32")}, fn)
    runner = ModuleRunner(mod, path, [backend], None, "runtime", None, n_threads)
    mod.view = _StoreView(runner)
    holder["runner"] = runner
    return lambda z: runner({"z": np.ascontiguousarray(z, dtype=np.float32)})["image"]


def txt2img(models: FluxModels, placement: FluxPlacement, prompt: str, width: int, height: int,
            **kw: Any) -> dict[str, np.ndarray]:
    """One-call Flux txt2img: builds a :class:`FluxPipeline`, runs :meth:`FluxPipeline.txt2img`
    (keyword arguments as there), frees it; returns its result plus ``memory``."""
    pipe = FluxPipeline(models, placement)
    try:
        out = pipe.txt2img(prompt, width, height, **kw)
        out["memory"] = pipe.memory()  # type: ignore[assignment]
        return out
    finally:
        pipe.close()
