"""Every model graph definition in ``core/models/`` against the ``ModuleGraph`` protocol
(:mod:`sdplan.core.models.base`), on the tiny fixtures and the small real weights:

* its weights are named as the file says: ``other_tensors()`` and every ``block_tensors(i)``
  are names in the file, disjoint, each listed once, and exactly the tensors of the file
  (or of its module there) the graph owns;
* it reads what it lists: building ``build_pre``/``build_post`` looks up exactly the
  non-block tensors, ``build_block(i)`` exactly block ``i``'s (what a layer split relies on),
  in the configuration that runs every block (a CLIP skip or an earlier LLM output layer
  leaves trailing blocks listed and unread; the runner does not load an LLM's unread blocks,
  its ``blocks_read``, as sd-cli loads only the tensors its graph uses);
* blocks are reported when it has them (``n_blocks`` > 0, every block non-empty) and a
  block index outside ``0..n_blocks - 1`` raises IndexError;
* it builds and runs on the CPU through ``ModuleRunner`` at two input sizes (one runner,
  one graph per shape) with the expected output shapes, finite and not all zero;
* graphs with blocks give the same outputs whole, cut into one segment per block, and
  split over two CPU backends.

The table :data:`CASES` must name every graph class of ``core/models/*.py``:
:func:`test_every_graph_class_has_a_row` finds them in the source and fails on one without
a row. A new architecture adds its rows here (a ``@case`` function returning a
:class:`Built`).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO
from safetensors.numpy import load_file, save_file
from sdplan.core.models import base

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from sdplan.core.modelfiles.checkpoint import read_model_files  # noqa: E402
from sdplan.core.modelfiles.readers import read_tensor_file  # noqa: E402
from sdplan.core.models.blockstack import BlockStack, BlockStackConfig, write_model  # noqa: E402
from sdplan.core.models.chroma import ChromaDiT  # noqa: E402
from sdplan.core.models.clip import (  # noqa: E402
    ClipGraph,
    causal_mask,
    clip_config,
    clip_text,
    find_prefix,
    find_projection,
)
from sdplan.core.models.controlnet import ControlNetGraph, controlnet_config, residual_shapes  # noqa: E402
from sdplan.core.models.esrgan import UpscalerGraph, canonical_rrdb_names, detect_esrgan  # noqa: E402
from sdplan.core.models.flux import FluxDiT  # noqa: E402
from sdplan.core.models.flux2 import Flux2DiT  # noqa: E402
from sdplan.core.models.llm import LLMEncoder  # noqa: E402
from sdplan.core.models.mmdit import MMDiT  # noqa: E402
from sdplan.core.models.qwen25vl_vision import VisionTower, patchify  # noqa: E402
from sdplan.core.models.qwen25vl_vision import weight_file as vision_weight_file  # noqa: E402
from sdplan.core.models.qwen_image import QwenImageDiT  # noqa: E402
from sdplan.core.models.t5 import T5Encoder  # noqa: E402
from sdplan.core.models.tae import TaeGraph, detect_tae  # noqa: E402
from sdplan.core.models.unet import UNetGraph, unet_config  # noqa: E402
from sdplan.core.models.unet import find_prefix as unet_prefix  # noqa: E402
from sdplan.core.models.vae import SDXL_CONV_SCALE, VaeGraph, vae_config, vae_decode, vae_encode  # noqa: E402
from sdplan.core.models.wan import WanDiT  # noqa: E402
from sdplan.core.models.wan import weight_file as wan_weight_file  # noqa: E402
from sdplan.core.models.z_image import ZImageDiT  # noqa: E402
from sdplan.core.pipelines.sd.pipeline import model_overrides, module_weight_file  # noqa: E402
from sdplan.core.runtime import graph as gr  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402
from test_models_esrgan import rrdb_weights, to_old_names  # noqa: E402
from zimage_util import PARTS, write_qwen3  # noqa: E402

FIX = REPO / "tests" / "fixtures"
MODELS = REPO / "core" / "models"
FLUX_AXES = tuple(json.loads((FIX / "flux_fixture_config.json").read_text())["dit"]["axes_dims_rope"])
#: Largest difference, relative to the largest magnitude, between a whole run and the same
#: graph cut into segments or split over backends (the same ops in the same order; states
#: cross a segment boundary as f32 arrays).
COMPOSE_TOL = 1e-5
#: Token ids below this have non-zero embedding rows in the tiny text encoders (the fixture
#: scripts zero the rest so the files compress).
TOKENS = 4096


# ------------------------------------------------------------------------------ the table
@dataclass
class Run:
    """One run: input arrays and the output shapes they must give."""

    inputs: dict[str, np.ndarray]
    outputs: dict[str, tuple[int, ...]]


@dataclass
class Built:
    """A graph definition made from its weight file: ``owned`` is the set of the file's
    names the graph must list (no more, no less); ``runs`` at least two input sizes."""

    graph: Any
    path: Path
    owned: set[str]
    runs: list[Run]

    def weight_file(self, names: Iterable[str]) -> WeightFile:
        """The file restricted to ``names``, in the default runtime dtypes."""
        return WeightFile(self.path, list(names))


@dataclass(frozen=True)
class Case:
    id: str
    cls: type
    make: Callable[[Path, Path], Built]  # (shared dir or None, tmp dir) -> Built
    shared: bool  # needs ../shared/weights
    blocks: int  # the blocks it must report


CASES: dict[str, Case] = {}


def case(id: str, cls: type, blocks: int = 0,
         shared: bool = False) -> Callable[[Callable[..., Built]], Callable[..., Built]]:
    """Register a row: ``make(shared_dir, tmp_dir) -> Built`` checks class ``cls``, which
    must report ``blocks`` blocks; ``shared``: it reads ``../shared/weights``."""
    def deco(make: Callable[..., Built]) -> Callable[..., Built]:
        assert id not in CASES, id
        CASES[id] = Case(id, cls, make, shared, blocks)
        return make
    return deco


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _normal(shape: tuple[int, ...], seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _names(path: Path) -> list[str]:
    return [t.name for t in read_tensor_file(path).tensors]


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.shape) for t in read_tensor_file(path).tensors}


def _clip_runs(width: int) -> list[Run]:
    def run(b: int, t: int) -> Run:
        ids = _rng(t).integers(0, TOKENS, (b, t)).astype(np.int32)
        return Run({"ids": ids, "mask": causal_mask(t)}, {"hidden": (b, t, width)})
    return [run(1, 77), run(2, 20)]


_CLIP_UNUSED = ("position_ids", "text_projection", "logit_scale")


def _sd_clip(family: str) -> Built:
    ms = read_model_files({"model": [FIX / f"{family}_tiny.safetensors"]})
    te = {t.info.name: tuple(t.info.shape) for t in ms.module_tensors("te")}
    cfg = clip_config(te, n_heads=2)
    owned = {n for n in te if n.startswith(cfg.prefix) and not n.endswith(_CLIP_UNUSED)}
    wf, names = module_weight_file(ms, "te", lambda n: n in owned)
    return Built(ClipGraph(cfg, names), Path(wf.path), owned, _clip_runs(16))


@case("clip-sd1-openai", ClipGraph, blocks=2)
def _clip_sd1(shared: Path, tmp: Path) -> Built:
    return _sd_clip("sd1")


@case("clip-sd2-openclip", ClipGraph, blocks=2)
def _clip_sd2(shared: Path, tmp: Path) -> Built:
    return _sd_clip("sd2")


@case("clip-l-flux", ClipGraph, blocks=2)
def _clip_l(shared: Path, tmp: Path) -> Built:
    path = FIX / "clip_l_tiny.safetensors"
    shapes = _shapes(path)
    cfg = clip_config(shapes, n_heads=2)
    owned = {n for n in shapes if not n.endswith(_CLIP_UNUSED)}
    return Built(ClipGraph(cfg, {n: n for n in owned}), path, owned, _clip_runs(16))


def _sd_module(family: str, module: str) -> tuple[Any, dict[str, str], set[str], dict[str, tuple[int, ...]]]:
    ms = read_model_files({"model": [FIX / f"{family}_tiny.safetensors"]})
    wf, names = module_weight_file(ms, module)
    shapes = {t.info.name: tuple(t.info.shape) for t in ms.tensors}
    return wf, names, {t.info.name for t in ms.module_tensors(module)}, shapes


def _unet(family: str) -> Built:
    wf, names, owned, shapes = _sd_module(family, "diffusion")
    cfg = unet_config(shapes, family, head_dim=8 if family == "sd2" else None)

    def run(n: int, h: int, w: int, s: int) -> Run:
        return Run({"x": _normal((n, 4, h, w), h), "t": np.linspace(999, 1, n).astype(np.float32),
                    "c": _normal((n, s, 16), s)}, {"y": (n, 4, h, w)})
    return Built(UNetGraph(cfg, names), Path(wf.path), owned, [run(1, 8, 8, 77), run(2, 16, 8, 20)])


@case("unet-sd1", UNetGraph, blocks=8)
def _unet_sd1(shared: Path, tmp: Path) -> Built:
    return _unet("sd1")


@case("unet-sd2", UNetGraph, blocks=8)
def _unet_sd2(shared: Path, tmp: Path) -> Built:
    return _unet("sd2")


def _sdxl_unet(name: str) -> Built:
    """An SDXL UNet (``label_emb``: the vector input ``vec``), its stages as blocks."""
    ms = read_model_files({"model": [FIX / f"{name}_tiny.safetensors"]})
    wf, names = module_weight_file(ms, "diffusion")
    shapes = {t.info.name: tuple(t.info.shape) for t in ms.module_tensors("diffusion")}
    meta = model_overrides(ms)
    cfg = unet_config(shapes, "sdxl", None, meta["unet_head_dim"], unet_prefix(shapes))
    assert cfg.adm_in_channels > 0

    def run(n: int, h: int, w: int, s: int) -> Run:
        return Run({"x": _normal((n, 4, h, w), h), "t": np.linspace(999, 1, n).astype(np.float32),
                    "c": _normal((n, s, cfg.context_dim), s), "vec": _normal((n, cfg.adm_in_channels), n)},
                   {"y": (n, 4, h, w)})
    return Built(UNetGraph(cfg, names), Path(wf.path), set(names), [run(1, 8, 8, 77), run(2, 16, 8, 154)])


@case("unet-sdxl", UNetGraph, blocks=8)
def _unet_sdxl(shared: Path, tmp: Path) -> Built:
    return _sdxl_unet("sdxl")


@case("controlnet-sd1", ControlNetGraph)
def _controlnet_sd1(shared: Path, tmp: Path) -> Built:
    """The tiny SD1 ControlNet (``control_model.``): the stem's and each input block's
    residual, then the middle block's."""
    path = FIX / "sd1_controlnet_tiny.safetensors"
    shapes = _shapes(path)
    cfg = controlnet_config(shapes, 8, None)
    graph = ControlNetGraph(cfg, {n: n for n in shapes})

    def run(n: int, h: int, w: int, s: int) -> Run:
        ins = {"x": _normal((n, 4, h, w), h), "hint": _normal((n, 3, 8 * h, 8 * w), w, 0.5) ** 2,
               "t": np.linspace(999, 1, n).astype(np.float32), "c": _normal((n, s, 16), s)}
        chans = {0: 32, 1: 32, 2: 32, 3: 64}
        res = {0: (h, w), 1: (h, w), 2: (h // 2, w // 2), 3: (h // 2, w // 2)}
        outs = {f"ctl.{b}": (n, chans[b], *res[b]) for b in (0, 1, 2, 3)}
        return Run(ins, {**outs, "ctl.mid": (n, 64, h // 2, w // 2)})
    return Built(graph, path, set(shapes), [run(1, 8, 8, 77), run(2, 4, 8, 20)])


@case("controlnet-sdxl", ControlNetGraph)
def _controlnet_sdxl(shared: Path, tmp: Path) -> Built:
    """A ControlNet of the tiny SDXL UNet (``label_emb``: the vector input ``vec``)."""
    from controlnet_util import controlnet_from_unet

    path = Path(controlnet_from_unet(FIX / "sdxl_tiny.safetensors", tmp / "sdxl_controlnet.safetensors"))
    shapes = _shapes(path)
    meta = model_overrides(read_model_files({"model": [FIX / "sdxl_tiny.safetensors"]}))
    cfg = controlnet_config(shapes, None, meta["unet_head_dim"])
    graph = ControlNetGraph(cfg, {n: n for n in shapes})
    assert cfg.adm_in_channels > 0

    def run(n: int, h: int, w: int) -> Run:
        ins = {"x": _normal((n, 4, h, w), h), "hint": _normal((n, 3, 8 * h, 8 * w), w, 0.5) ** 2,
               "t": np.linspace(999, 1, n).astype(np.float32), "c": _normal((n, 77, cfg.context_dim), 1),
               "vec": _normal((n, cfg.adm_in_channels), n)}
        return Run(ins, residual_shapes(graph, shapes, n, h, w))
    return Built(graph, path, set(shapes), [run(1, 8, 8), run(2, 8, 4)])


@case("unet-sdxl-refiner", UNetGraph, blocks=12)
def _unet_sdxl_refiner(shared: Path, tmp: Path) -> Built:
    return _sdxl_unet("sdxl_refiner")


@case("clip-g-sdxl-openclip-pooled", ClipGraph, blocks=3)
def _clip_g_sdxl(shared: Path, tmp: Path) -> Built:
    """SDXL's bigG in open_clip names (fused ``in_proj``) with its pooled projection: the
    penultimate state and ``pooled`` at each sequence's end-of-text row."""
    ms = read_model_files({"model": [FIX / "sdxl_tiny.safetensors"]})
    te = {t.info.name: tuple(t.info.shape) for t in ms.module_tensors("te") if t.encoder == "clip_g"}
    prefix, _ = find_prefix(te)
    cfg = clip_config(te, n_heads=2, prefix=prefix, activation="gelu_erf")
    proj = find_projection(te, prefix)
    assert proj is not None and proj[1] == "matrix"
    owned = {n for n in te if n.startswith(prefix) and not n.endswith(("position_ids", "logit_scale"))}
    wf, names = module_weight_file(ms, "te", lambda n: n in owned)

    def run(b: int, t: int) -> Run:
        ids = _rng(t).integers(0, TOKENS, (b, t)).astype(np.int32)
        eos = (np.arange(b) * t + t - 1 - np.arange(b)).astype(np.int32)
        return Run({"ids": ids, "mask": causal_mask(t), "eos": eos},
                   {"hidden": (b, t, cfg.width), "pooled": (b, te[proj[0]][1])})
    return Built(ClipGraph(cfg, names, 2, final_ln=False, projection=proj), Path(wf.path), owned,
                 [run(1, 77), run(2, 20)])


@case("vae-sdxl-conv-scale", VaeGraph)
def _vae_sdxl(shared: Path, tmp: Path) -> Built:
    """SDXL's VAE with sd-cli's fp16 overflow guard (convolution inputs scaled by 1/32)."""
    ms = read_model_files({"model": [FIX / "sdxl_tiny.safetensors"]})
    wf, names = module_weight_file(ms, "vae")
    shapes = {t.info.name: tuple(t.info.shape) for t in ms.module_tensors("vae")}
    cfg = vae_config(shapes, "first_stage_model.")
    f = cfg.factor
    runs = [Run({"z": _normal((1, 4, 4, 4))}, {"image": (1, 3, 4 * f, 4 * f)}),
            Run({"z": _normal((1, 4, 2, 6))}, {"image": (1, 3, 2 * f, 6 * f)}),
            Run({"image": _normal((1, 3, 2 * f, 3 * f), scale=0.5)}, {"mean": (1, 4, 2, 3), "logvar": (1, 4, 2, 3)})]
    return Built(VaeGraph(cfg, names, SDXL_CONV_SCALE), Path(wf.path), set(names), runs)


@case("vae-sd1", VaeGraph)
def _vae_sd1(shared: Path, tmp: Path) -> Built:
    wf, names, owned, shapes = _sd_module("sd1", "vae")
    cfg = vae_config(shapes)
    assert cfg.factor == 2  # two levels in the tiny VAE
    runs = [Run({"z": _normal((1, 4, 8, 8))}, {"image": (1, 3, 16, 16)}),
            Run({"z": _normal((1, 4, 4, 6))}, {"image": (1, 3, 8, 12)}),
            Run({"image": _normal((1, 3, 16, 12), scale=0.5)}, {"mean": (1, 4, 8, 6), "logvar": (1, 4, 8, 6)})]
    return Built(VaeGraph(cfg, names), Path(wf.path), owned, runs)


@case("t5-flux", T5Encoder, blocks=3)
def _t5(shared: Path, tmp: Path) -> Built:
    path = FIX / "t5_tiny.safetensors"
    enc = T5Encoder.from_weights(_shapes(path))

    def run(t: int) -> Run:
        return Run(enc.inputs(_rng(t).integers(0, TOKENS, (1, t))), {"hidden": (1, t, 16)})
    return Built(enc, path, set(_names(path)), [run(8), run(16)])


@case("umt5-wan", T5Encoder, blocks=2)
def _umt5(shared: Path, tmp: Path) -> Built:
    path = FIX / "umt5_tiny.safetensors"
    enc = T5Encoder.from_weights(_shapes(path))

    def run(t: int, n: int) -> Run:  # n tokens, the rest padding masked out
        ids = _rng(t).integers(3, 44, (1, t))
        return Run(enc.inputs(ids, (np.arange(t) < n).astype(np.int32)[None]), {"hidden": (1, t, 32)})
    # the tokenizer blob is the tokenizer's, no weight of the graph
    return Built(enc, path, set(_names(path)) - {"spiece_model"}, [run(8, 5), run(16, 16)])


@dataclass
class _WanBuilt(Built):
    """The Wan DiT's file with its 5-D patch embedding held 2-D (:func:`wan_weight_file`)."""

    def weight_file(self, names: Iterable[str]) -> WeightFile:
        return wan_weight_file(self.path, list(names))


@case("wan", WanDiT, blocks=2)
def _wan(shared: Path, tmp: Path) -> Built:
    path = FIX / "wan_tiny.safetensors"
    dit = WanDiT.from_weights(_shapes(path), 24)

    def run(f: int, h: int, w: int, t: int) -> Run:  # 1x2x2 patches of 16 channels: 64 values each
        ins = dit.inputs(_normal((1, 16, f, h, w), h), _normal((1, t, 32), t), 0.6)
        return Run(ins, {"out": (1, f * (h // 2) * (w // 2), 64)})
    return _WanBuilt(dit, path, set(_names(path)), [run(2, 4, 6, 9), run(1, 8, 4, 20)])


def _flux(path: Path) -> Built:
    dit = FluxDiT.from_weights(_shapes(path), axes=FLUX_AXES)  # type: ignore[arg-type]

    def run(h: int, w: int, t: int) -> Run:
        ins = dit.inputs(_normal((1, 16, h, w), h), _normal((1, t, 16), t), _normal((1, 16), 3), 0.6, 3.5)
        return Run(ins, {"out": (1, (h // 2) * (w // 2), 64)})
    return Built(dit, path, set(_names(path)), [run(8, 8, 16), run(4, 6, 8)])


@case("flux-dev", FluxDiT, blocks=4)
def _flux_dev(shared: Path, tmp: Path) -> Built:
    return _flux(FIX / "flux_dev_tiny.safetensors")


@case("flux-schnell-prefixed", FluxDiT, blocks=4)
def _flux_schnell(shared: Path, tmp: Path) -> Built:
    return _flux(FIX / "flux_schnell_tiny.safetensors")


@case("chroma", ChromaDiT, blocks=4)
def _chroma(shared: Path, tmp: Path) -> Built:
    path = FIX / "chroma_tiny.safetensors"
    dit = ChromaDiT.from_weights(_shapes(path), axes=FLUX_AXES)  # type: ignore[arg-type]

    def run(h: int, w: int, t: int) -> Run:  # T5 states only: no pooled vector
        ins = dit.inputs(_normal((1, 16, h, w), h), _normal((1, t, 16), t), None, 0.6)
        return Run(ins, {"out": (1, (h // 2) * (w // 2), 64)})
    return Built(dit, path, set(_names(path)), [run(8, 8, 16), run(4, 6, 5)])


@case("mmdit-sd35-medium", MMDiT, blocks=3)
def _mmdit(shared: Path, tmp: Path) -> Built:
    path = FIX / "sd3_tiny.safetensors"  # the MMDiT beside its autoencoder, as SD3 single files
    dit = MMDiT.from_weights(_shapes(path))

    def run(h: int, w: int, t: int) -> Run:  # RMS qk norm, MMDiT-X attn2 in blocks 0-1
        ins = dit.inputs(_normal((1, 16, h, w), h), _normal((1, t, 48), t), _normal((1, 32), 3), 0.6)
        return Run(ins, {"out": (1, (h // 2) * (w // 2), 64)})
    owned = {n for n in _names(path) if n.startswith("model.diffusion_model.")}
    return Built(dit, path, owned, [run(8, 8, 154), run(4, 6, 20)])


@case("flux2-klein", Flux2DiT, blocks=4)
def _flux2(shared: Path, tmp: Path) -> Built:
    path = FIX / "flux2_klein_tiny.safetensors"
    dit = Flux2DiT.from_weights(_shapes(path))

    def run(h: int, w: int, t: int, refs: tuple[tuple[int, int], ...]) -> Run:  # 128 channels, patch 1
        ins = dit.inputs(_normal((1, 128, h, w), h), _normal((1, t, 48), t), 0.6,
                         [_normal((1, 128, *r), 7) for r in refs])
        return Run(ins, {"out": (1, h * w + sum(a * b for a, b in refs), 128)})
    return Built(dit, path, set(_names(path)), [run(4, 4, 10, ()), run(3, 5, 7, ((2, 3),))])


@case("flux2-dev", Flux2DiT, blocks=50)
def _flux2_dev(shared: Path, tmp: Path) -> Built:
    path = FIX / "flux2_dev_tiny.safetensors"
    dit = Flux2DiT.from_weights(_shapes(path))
    assert dit.cfg.guidance  # guidance_in: the distilled guidance is an input

    def run(h: int, w: int, t: int, refs: tuple[tuple[int, int], ...], guidance: float) -> Run:
        ins = dit.inputs(_normal((1, 128, h, w), h), _normal((1, t, 48), t), 0.6,
                         [_normal((1, 128, *r), 7) for r in refs], guidance)
        return Run(ins, {"out": (1, h * w + sum(a * b for a, b in refs), 128)})
    return Built(dit, path, set(_names(path)), [run(4, 4, 10, (), 3.5), run(3, 5, 7, ((2, 3),), 5.0)])


def _tae(shared: Path, part: str) -> Built:
    path = shared / "weights" / f"taef2_{part}.safetensors"
    shapes = _shapes(path)
    lay = detect_tae(shapes, str(path))[part]
    assert lay.latent_channels == 32  # TAEF2, shared/weights/README.md
    if part == "encoder":
        runs = [Run({"image": _normal((1, 3, 32, 32), scale=0.3) + 0.5}, {"latent": (1, 32, 4, 4)}),
                Run({"image": _normal((1, 3, 16, 24), scale=0.3) + 0.5}, {"latent": (1, 32, 2, 3)})]
    else:
        runs = [Run({"latent": _normal((1, 32, 2, 2))}, {"image": (1, 3, 16, 16)}),
                Run({"latent": _normal((1, 32, 3, 2))}, {"image": (1, 3, 24, 16)})]
    return Built(TaeGraph(lay, list(shapes)), path, set(shapes), runs)


@case("llm-qwen3", LLMEncoder, blocks=4)
def _llm(shared: Path, tmp: Path) -> Built:
    path = write_qwen3(tmp / "qwen3_tiny.safetensors")
    enc = LLMEncoder.from_weights(_shapes(path))  # the final normed state: every block runs
    used = load_file(str(PARTS))["embed.ids"]  # the embedding rows the fixture keeps non-zero

    def run(t: int) -> Run:
        return Run(enc.inputs(_rng(t).choice(used, (1, t))), {"hidden": (1, t, 32)})
    return Built(enc, path, set(_names(path)), [run(17), run(6)])


@case("llm-mistral", LLMEncoder, blocks=31)
def _llm_mistral(shared: Path, tmp: Path) -> Built:
    from flux2_dev_util import PARTS as MISTRAL_PARTS
    from flux2_dev_util import write_llm as write_mistral

    path = write_mistral(tmp / "mistral_tiny.safetensors")
    enc = LLMEncoder.from_weights(_shapes(path), arch="mistral", head_dim=128)  # every block runs
    used = load_file(str(MISTRAL_PARTS))["embed.ids"]

    def run(t: int) -> Run:
        return Run(enc.inputs(_rng(t).choice(used, (1, t))), {"hidden": (1, t, 16)})
    return Built(enc, path, set(_names(path)), [run(17), run(6)])


@case("qwen-image", QwenImageDiT, blocks=2)
def _qwen_image(shared: Path, tmp: Path) -> Built:
    path = FIX / "qwen_image_tiny.safetensors"
    dit = QwenImageDiT.from_weights(_shapes(path))

    def run(h: int, w: int, t: int, refs: tuple[tuple[int, int], ...]) -> Run:  # 2x2 patches of 64 values
        ins = dit.inputs(_normal((1, 16, h, w), h), _normal((1, t, 16), t), 0.6,
                         [_normal((1, 16, *r), 7) for r in refs])
        return Run(ins, {"out": (1, (h * w + sum(a * b for a, b in refs)) // 4, 64)})
    return Built(dit, path, set(_names(path)), [run(8, 8, 9, ()), run(4, 6, 20, ((2, 4),))])


@dataclass
class _VisionBuilt(Built):
    """Qwen2.5-VL's file with the vision tower's 5-D patch embedding held 2-D."""

    def weight_file(self, names: Iterable[str]) -> WeightFile:
        return vision_weight_file(self.path, list(names))


@case("qwen25vl-vision", VisionTower, blocks=2)
def _qwen25vl_vision(shared: Path, tmp: Path) -> Built:
    path = FIX / "qwen25vl_tiny.safetensors"
    tower = VisionTower.from_weights(_shapes(path), head_dim=8, full_blocks=(1,), window=56)

    def run(h: int, w: int) -> Run:  # pixels; 28 x 28 per merged token of width 16
        patches, grid = patchify(_rng(h).integers(0, 256, (h, w, 3)))
        return Run(tower.inputs(patches, grid), {"embeds": (h * w // 784, 16)})
    return _VisionBuilt(tower, path, {n for n in _names(path) if n.startswith("visual.")}, [run(84, 140), run(56, 28)])


@case("z-image", ZImageDiT, blocks=4)
def _z_image(shared: Path, tmp: Path) -> Built:
    path = FIX / "z_image_tiny.safetensors"
    dit = ZImageDiT.from_weights(_shapes(path))

    def run(h: int, w: int, t: int) -> Run:  # latent 16 channels, 2x2 patches of 64 values
        ins = dit.inputs(_normal((1, 16, h, w), h), _normal((1, t, 32), t), 0.6)
        return Run(ins, {"out": (1, (h // 2) * (w // 2), 64)})
    return Built(dit, path, set(_names(path)), [run(8, 8, 10), run(4, 6, 33)])


@case("tae-taef2-encoder", TaeGraph, shared=True)
def _tae_enc(shared: Path, tmp: Path) -> Built:
    return _tae(shared, "encoder")


@case("tae-taef2-decoder", TaeGraph, shared=True)
def _tae_dec(shared: Path, tmp: Path) -> Built:
    return _tae(shared, "decoder")


def _upscaler(path: Path, scale: int) -> Built:
    shapes = _shapes(path)
    names = canonical_rrdb_names(list(shapes))
    cfg = detect_esrgan({k: shapes[v] for k, v in names.items()}, str(path))
    assert cfg.scale == scale
    runs = [Run({"image": _normal((1, 3, h, w), h, 0.2) + 0.5}, {"image": (1, 3, h * scale, w * scale)})
            for h, w in ((8, 8), (6, 10))]
    return Built(UpscalerGraph(cfg, names), path, set(shapes), runs)


@case("upscaler-compact-x4", UpscalerGraph, shared=True)
def _esrgan_compact(shared: Path, tmp: Path) -> Built:
    return _upscaler(shared / "weights" / "realesr-animevideov3.safetensors", 4)


@case("upscaler-rrdb-x2-unshuffle-old-names", UpscalerGraph)
def _esrgan_rrdb(shared: Path, tmp: Path) -> Built:
    path = tmp / "rrdb.safetensors"
    save_file(to_old_names(rrdb_weights(_rng(1), 12, n_up=2), 1, 2), str(path))
    return _upscaler(path, 2)


@case("blockstack", BlockStack, blocks=3)
def _blockstack(shared: Path, tmp: Path) -> Built:
    cfg = BlockStackConfig(n_blocks=3, dim=32, heads=2, ffn=64, d_in=8, d_out=6)
    path = tmp / "stack.safetensors"
    write_model(path, cfg, seed=2)
    runs = [Run({"x": _normal((1, 5, 8))}, {"y": (1, 5, 6)}), Run({"x": _normal((2, 9, 8))}, {"y": (2, 9, 6)})]
    return Built(BlockStack(cfg), path, set(_names(path)), runs)


@case("function-flux-ae-decoder", base.FunctionGraph)
def _function_vae(shared: Path, tmp: Path) -> Built:
    path = FIX / "flux_ae_tiny.safetensors"
    shapes = _shapes(path)
    cfg = vae_config(shapes, "")
    dec = [n for n in shapes if n.startswith("decoder.")]

    def fn(g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        return {"image": vae_decode(g, w, ins["z"], cfg)}
    runs = [Run({"z": _normal((1, 16, 4, 4))}, {"image": (1, 3, 8, 8)}),
            Run({"z": _normal((1, 16, 6, 3))}, {"image": (1, 3, 12, 6)})]
    return Built(base.FunctionGraph(dec, {"z": "f32"}, fn), path, set(dec), runs)


@case("function-flux2-ae", base.FunctionGraph)
def _function_flux2_vae(shared: Path, tmp: Path) -> Built:
    """The FLUX.2 autoencoder's BFL names: ``decoder.post_quant_conv`` / ``encoder.quant_conv``
    inside the halves, ``bn`` statistics outside the graph."""
    path = FIX / "flux2_ae_tiny.safetensors"
    shapes = _shapes(path)
    cfg = vae_config(shapes, "")
    names = [n for n in shapes if n.startswith(("decoder.", "encoder."))]

    def fn(g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        return {"image": vae_decode(g, w, ins["z"], cfg), "mean": vae_encode(g, w, ins["image"], cfg)}
    runs = [Run({"z": _normal((1, 32, 4, 4)), "image": _normal((1, 3, 8, 8), 1)},
                {"image": (1, 3, 8, 8), "mean": (1, 32, 4, 4)}),
            Run({"z": _normal((1, 32, 6, 3)), "image": _normal((1, 3, 4, 6), 1)},
                {"image": (1, 3, 12, 6), "mean": (1, 32, 2, 3)})]
    return Built(base.FunctionGraph(names, {"z": "f32", "image": "f32"}, fn), path, set(names), runs)


@case("function-clip-l-text", base.FunctionGraph)
def _function_clip(shared: Path, tmp: Path) -> Built:
    path = FIX / "clip_l_tiny.safetensors"
    shapes = _shapes(path)
    cfg = clip_config(shapes, n_heads=2)
    names = [n for n in shapes if not n.endswith(_CLIP_UNUSED)]

    def fn(g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        return {"hidden": clip_text(g, w, ins["ids"], ins["mask"], cfg)}
    return Built(base.FunctionGraph(names, {"ids": "i32", "mask": "f32"}, fn), path, set(names), _clip_runs(16))


# ------------------------------------------------------------------------- the harness
@pytest.fixture(scope="module")
def pool():
    """Backends ``CPU`` and a second CPU instance ``CPU1`` (one thread each)."""
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


_BUILT: dict[str, Built] = {}


def _build(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, id: str) -> Built:
    """The row ``id`` made once per module (skips, or fails in CI, without ../shared)."""
    if id not in _BUILT:
        c = CASES[id]
        shared = request.getfixturevalue("shared_dir") if c.shared else None
        _BUILT[id] = c.make(shared, tmp_path_factory.mktemp(c.id))  # type: ignore[arg-type]
    return _BUILT[id]


@pytest.fixture(params=sorted(CASES), scope="module")
def row(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Case, Built]:
    return CASES[request.param], _build(request, tmp_path_factory, request.param)


@pytest.fixture(params=sorted(k for k, c in CASES.items() if c.blocks), scope="module")
def with_blocks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Built:
    return _build(request, tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def built(row: tuple[Case, Built]) -> Built:
    return row[1]


def _listed(m: Any) -> list[str]:
    return list(m.other_tensors()) + [n for i in range(m.n_blocks) for n in m.block_tensors(i)]


def _runner(b: Built, pool: BackendPool, placement: ModulePlacement | None = None) -> ModuleRunner:
    """The engine's runner of the graph, its weight file restricted to the names it lists
    (a lookup of any other name fails the build)."""
    return ModuleRunner(b.graph, b.weight_file(_listed(b.graph)), placement or ModulePlacement(("CPU",)),
                        pool, n_threads=1)


def test_weights_named_as_the_file_says(built: Built) -> None:
    m = built.graph
    other = list(m.other_tensors())
    blocks = [list(m.block_tensors(i)) for i in range(m.n_blocks)]
    listed = other + [n for b in blocks for n in b]
    dupes = sorted({n for n in listed if listed.count(n) > 1})
    assert dupes == [], f"listed more than once (or in two groups): {dupes[:5]}"
    in_file = set(_names(built.path))
    assert sorted(set(listed) - in_file) == [], "names not in the file"
    assert sorted(built.owned - set(listed)) == [], "tensors of the module the graph does not list"
    assert sorted(set(listed) - built.owned) == [], "tensors listed that are not the module's"


def test_blocks_reported(row: tuple[Case, Built]) -> None:
    c, built = row
    m = built.graph
    assert m.n_blocks == c.blocks
    for i in range(m.n_blocks):
        assert m.block_tensors(i), f"block {i} has no tensors"
    for bad in (m.n_blocks, m.n_blocks + 1, -1):
        with pytest.raises(IndexError):
            m.block_tensors(bad)
    if m.n_blocks == 0:
        with pytest.raises(IndexError):
            m.build_block(None, None, 0, {})


def _reads(m: Any, store: Any, backend: Any, shapes: dict[str, tuple[int, ...]]) -> tuple[set[str], list[set[str]]]:
    """Names looked up by build_pre + build_post, and by each build_block, for one input shape."""
    g = gr.new_graph([backend])
    outer: set[str] = set()
    per_block: list[set[str]] = []

    def lookup(into: set[str]) -> Callable[[str], Any]:
        def w(name: str) -> Any:
            into.add(name)
            return store.tensor(name)
        return w

    ins = {k: g.input(k, s, dt) for k, (s, dt) in m.input_specs(shapes).items()}
    state = m.build_pre(g, lookup(outer), ins)
    for i in range(m.n_blocks):
        per_block.append(set())
        state = m.build_block(g, lookup(per_block[-1]), i, state)
    m.build_post(g, lookup(outer), state)
    return outer, per_block


def test_reads_what_it_lists(built: Built, pool: BackendPool) -> None:
    m = built.graph
    store = built.weight_file(_listed(m)).new_store()  # tensors without data: enough to build
    outer: set[str] = set()
    blocks: list[set[str]] = [set() for _ in range(m.n_blocks)]
    for run in built.runs:  # the union over runs (a VAE decodes with one half, encodes with the other)
        o, bs = _reads(m, store, pool.get("CPU"), {k: tuple(v.shape) for k, v in run.inputs.items()})
        outer |= o
        for i, b in enumerate(bs):
            blocks[i] |= b
    assert outer == set(m.other_tensors()), (sorted(outer ^ set(m.other_tensors()))[:5])
    for i, b in enumerate(blocks):
        assert b == set(m.block_tensors(i)), (i, sorted(b ^ set(m.block_tensors(i)))[:5])


def test_builds_and_runs_at_two_sizes(built: Built, pool: BackendPool) -> None:
    shapes = [tuple(sorted((k, v.shape) for k, v in r.inputs.items())) for r in built.runs]
    assert len(set(shapes)) >= 2, "needs two input sizes"
    r = _runner(built, pool)
    try:
        for run in built.runs:
            out = r.run(run.inputs)
            assert {k: v.shape for k, v in out.items()} == run.outputs
            for k, v in out.items():
                assert np.isfinite(v).all(), f"{k}: not finite"
                assert np.abs(v).max() > 0, f"{k}: all zero"
        assert len(r._graphs) == len(set(shapes))  # one graph per input shape, reused by none other
    finally:
        r.release()


def test_blocks_compose(with_blocks: Built, pool: BackendPool) -> None:
    """Whole, one segment per block (a 1-byte budget), and split over CPU and CPU1 agree."""
    built = with_blocks
    m = built.graph
    ins = built.runs[0].inputs
    whole = _runner(built, pool)
    seg = _runner(built, pool, ModulePlacement(("CPU",), budget=1))
    half = max(m.n_blocks // 2, 1)  # blocks 0..half-1 on CPU, the rest on CPU1
    ranges = (BlockRange("CPU", 0, half - 1),) + ((BlockRange("CPU1", half, m.n_blocks - 1),) if m.n_blocks > 1 else ())
    split = _runner(built, pool, ModulePlacement(("CPU", "CPU1"), ranges))
    try:
        ref = whole.run(ins)
        assert seg.segments({k: tuple(v.shape) for k, v in ins.items()}) == [[i] for i in range(m.n_blocks)]
        for other in (seg.run(ins), split.run(ins)):
            assert other.keys() == ref.keys()
            for k in ref:
                err = float(np.abs(other[k] - ref[k]).max() / np.abs(ref[k]).max())
                assert err <= COMPOSE_TOL, (k, err)
        if m.n_blocks > 1:
            assert split.placed_bytes()["CPU1"] > 0
    finally:
        for r in (whole, seg, split):
            r.release()


# ------------------------------------------------------------------ the table is complete
#: Classes of core/models/*.py that define graph methods but are not graphs to build: the
#: protocol itself and the abstract base of graphs without blocks.
ABSTRACT = {"base.ModuleGraph": "the protocol (typing.Protocol)",
            "base.WholeGraph": "abstract base: build, other_tensors, input_specs raise NotImplementedError"}
GRAPH_METHODS = {"build", "build_pre", "build_block", "build_post"}


def graph_classes(sources: Mapping[str, str]) -> set[str]:
    """``module.Class`` of every class in ``sources`` (module stem -> source text) that
    defines a graph method, or derives (by name, through any module) from one that does."""
    defs: dict[str, tuple[str, list[str], bool]] = {}
    for mod, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
                own = any(isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name in GRAPH_METHODS
                          for f in node.body)
                defs[f"{mod}.{node.name}"] = (node.name, bases, own)
    found = {q for q, (_, _, own) in defs.items() if own}
    grew = True
    while grew:
        names = {defs[q][0] for q in found}
        more = {q for q, (_, bases, _) in defs.items() if q not in found and names & set(bases)}
        found |= more
        grew = bool(more)
    return found


def _model_sources() -> dict[str, str]:
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(MODELS.glob("*.py"))}


def _qualified(cls: type) -> str:
    return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__qualname__}"


def test_every_graph_class_has_a_row() -> None:
    found = graph_classes(_model_sources())
    covered = {_qualified(c.cls) for c in CASES.values()}
    missing = sorted(found - covered - set(ABSTRACT))
    assert missing == [], f"graph classes without a row in tests/test_model_protocol.py CASES: {missing}"
    assert sorted(covered - found) == [], "rows of classes the finder does not see"
    assert set(ABSTRACT) <= found


def test_the_finder_sees_a_new_graph_class() -> None:
    planted = dict(_model_sources())
    planted["newfamily"] = ("from sdplan.core.models.base import WholeGraph\n"
                            "class NewDiT:\n    def build_pre(self, g, w, inputs):\n        return inputs\n"
                            "class NewVae(WholeGraph):\n    pass\n"
                            "class Helper:\n    def run(self):\n        pass\n")
    found = graph_classes(planted)
    assert {"newfamily.NewDiT", "newfamily.NewVae"} <= found and "newfamily.Helper" not in found
    covered = {_qualified(c.cls) for c in CASES.values()}
    assert sorted(found - covered - set(ABSTRACT)) == ["newfamily.NewDiT", "newfamily.NewVae"]


def test_abstract_bases_are_not_buildable() -> None:
    w = base.WholeGraph()
    with pytest.raises(NotImplementedError):
        w.build(None, None, {})
    with pytest.raises(NotImplementedError):
        w.other_tensors()
    assert getattr(base.ModuleGraph, "_is_protocol", False)
