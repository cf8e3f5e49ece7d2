"""Qwen-Image text-to-image and image-to-image: the Qwen2.5-VL language model's final states as
the prompt, flow-matching sampling with the MMDiT, the Wan 2.1 autoencoder frame by frame.

As sd-cli runs it (stable-diffusion.cpp ``conditioner.hpp`` ``LLMEmbedder`` for
``VERSION_QWEN_IMAGE``, ``stable-diffusion.cpp``, ``wan_vae.hpp``):

* prompt: ``<|im_start|>system\\nDescribe the image by detailing the color, shape, size,
  texture, quantity, text, spatial relationships of the objects and
  background:<|im_end|>\\n<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n``
  (:data:`TEMPLATE`, diffusers' ``QwenImagePipeline`` has the same), tokenised by the
  encoder's own tokenizer (a GGUF file's metadata, else the shipped Qwen vocabulary), no
  padding; the final normed state of every token, ``(text:weight)`` weights applied with
  sd-cli's mean-keeping rule, then the template's first :data:`DROP` (34) tokens dropped;
* sampling: the 16-channel latent at 1/8 of the image size, sigmas of the discrete flow
  schedule with shift 3 (:func:`~sdplan.core.sampling.flow.discrete_flow_sigmas`; sd-cli's
  default flow shift for the family), the DiT at ``t = sigma``, euler by default;
  classifier-free guidance ``uncond + cfg (cond - uncond)`` with the negative prompt when
  ``cfg_scale != 1`` (sd-cli's; diffusers' ``true_cfg_scale`` also rescales the guided
  prediction to the conditional one's norm, which sd-cli does not);
* decoding: ``latent * std + mean`` per channel (Wan 2.1's statistics,
  :data:`~sdplan.core.models.qwen_image_vae.LATENT_MEAN`) through the autoencoder; image to
  image encodes the picture to the mean of the autoencoder's latent and normalises it
  (sd-cli draws no sample from it); previews project the normalised latent with Wan 2.1's
  latent-to-RGB factors.

Edit (reference pictures, ``-r``; :mod:`sdplan.core.pipelines.qwen_image.edit`): the pictures
go through the encoder's vision tower into the Edit template's prompt, and through the
autoencoder's encoder into reference latents after the image's tokens in the DiT's sequence.
An encoder without a vision tower encodes the prompt as for text to image (sd-cli's too); the
reference latents still go to the DiT.

Modules: ``diffusion`` (the DiT; its transformer blocks split), ``te`` (the LLM, runner
``llm``; its layers split; the vision tower, runner ``llm_vision``, loaded on the LLM's main
device only for reference pictures) and ``vae`` (the decoder; the encoder, runner
``vae_encoder``, on the VAE's device when a picture is encoded).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import SdplanError
from sdplan.core.families import family, generation_defaults
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.base import FunctionGraph
from sdplan.core.models.llm import LLMEncoder, llm_config
from sdplan.core.models.qwen25vl_vision import META_KEYS, VisionTower, find_vision_prefix
from sdplan.core.models.qwen25vl_vision import weight_file as vision_weight_file
from sdplan.core.models.qwen_image import QwenImageDiT
from sdplan.core.models.qwen_image_vae import (
    LATENT_MEAN,
    LATENT_STD,
    vae_decode,
    vae_encode,
    wan_vae_config,
    weight_file,
)
from sdplan.core.pipelines.flux2.pipeline import resize_nearest
from sdplan.core.pipelines.qwen_image.edit import (
    EDIT_DROP,
    EDIT_TEMPLATE,
    POSITIONS,
    edit_prefix,
    vae_size,
    vl_picture,
)
from sdplan.core.pipelines.stages.base import module_placements
from sdplan.core.pipelines.stages.flow_dit import FlowDiTPipeline, shapes
from sdplan.core.pipelines.stages.img2img import ImageInput
from sdplan.core.pipelines.stages.vae_tiles import encode_tiled
from sdplan.core.pipelines.z_image.pipeline import is_gguf
from sdplan.core.runtime.placement import ModulePlacement
from sdplan.core.sampling.flow import discrete_flow_sigmas, guided_velocity
from sdplan.core.sampling.options import SamplingOptions
from sdplan.core.text.bpe_tokenizer import BPETokenizer
from sdplan.core.text.prompt import apply_prompt_weights

__all__ = ["QwenImageModels", "QwenImagePipeline", "TEMPLATE", "DROP", "SHIFT", "DEFAULTS", "MODULES",
           "llm_head_dim"]

#: sd-cli's Qwen-Image prompt template (prefix, suffix) and the tokens of it dropped from the
#: states (``prompt_template_encode_start_idx``: the prefix's 34 tokens).
TEMPLATE = ("<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
            "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n",
            "<|im_end|>\n<|im_start|>assistant\n")
DROP = 34
#: sd-cli's default flow shift for Qwen-Image.
SHIFT = 3.0
#: sd-cli's documented settings (CFG 2.5, euler, 20 steps), the family's defaults.
DEFAULTS: dict[str, Any] = generation_defaults("qwen_image")
MODULES = ("diffusion", "te", "vae")
#: The metadata key a small test encoder gives its head width under (Qwen2.5's projections
#: carry no per-head norm; the published models' heads are 128 wide).
HEAD_DIM_KEY = "sdplan.llm_head_dim"
#: The metadata key a small test encoder gives its M-RoPE sections under (comma-separated; the
#: published ones scale to the head width).
MROPE_KEY = "sdplan.llm_mrope_section"

_MEAN = np.asarray(LATENT_MEAN, np.float32).reshape(1, -1, 1, 1)
_STD = np.asarray(LATENT_STD, np.float32).reshape(1, -1, 1, 1)


@dataclass
class QwenImageModels:
    """The model files of a Qwen-Image run (sd-cli's ``--diffusion-model``, ``--llm``,
    ``--vae``), the RoPE axes override small models need, and Qwen-Image-Edit-2511's
    ``zero_cond_t`` (None: from the DiT file, :data:`~sdplan.core.models.qwen_image.ZERO_COND_MARKER`)."""

    diffusion_model: str | Path
    llm: str | Path
    vae: str | Path
    axes: tuple[int, ...] | None = None
    zero_cond_t: bool | None = None


def llm_head_dim(path: str | Path) -> int | None:
    """The head width a language-model file states in its ``sdplan.llm_head_dim`` metadata,
    or None (the family's preset: 128)."""
    raw = read_tensor_file(path).metadata.get(HEAD_DIM_KEY)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def _meta_ints(path: str | Path, key: str) -> tuple[int, ...] | None:
    """Comma-separated integers a file's metadata states under ``key``, or None.

    Raises:
        SdplanError: a value that is not integers, naming the file and the key.
    """
    raw = read_tensor_file(path).metadata.get(key)
    if not raw:
        return None
    try:
        return tuple(int(v) for v in raw.split(","))
    except ValueError:
        raise SdplanError(f"{path}: metadata {key} {raw!r} is not comma-separated integers") from None


def vision_tower(path: str | Path, names: Mapping[str, Any]) -> VisionTower | None:
    """The vision tower of an encoder file with tensor shapes ``names``, sized by the file's
    ``sdplan.vision_*`` metadata where it states them (the published ones otherwise), or None
    when the file has none."""
    if find_vision_prefix(names) is None:
        return None
    kw: dict[str, Any] = {}
    for arg, key in META_KEYS.items():
        v = _meta_ints(path, key)
        if v is not None:
            kw[arg] = v if arg == "full_blocks" else v[0]
    return VisionTower.from_weights(names, **kw)


class QwenImagePipeline(FlowDiTPipeline):
    """Qwen-Image txt2img and img2img over engine module runners (module docstring); the DiT
    runner, the sampling loop, image to image, VAE tiles and the hires fix come from
    :class:`~sdplan.core.pipelines.stages.flow_dit.FlowDiTPipeline`.

    Args:
        models: the model files.
        plan: a resolved ``Plan`` giving each module's placement; None: the CPU.
        pool, placements, n_threads, dtypes, cancel: as :class:`~sdplan.core.pipelines.flux.pipeline.FluxPipeline`.
        flash: ggml's flash attention in the DiT (sd-cli's ``--diffusion-fa``).

    Raises:
        ModelLayoutError / ModelFileError: files that are not the expected models (a Wan
            autoencoder without the 16 latent channels, Qwen-Image-Layered included).
        SdplanError: an encoder whose width is not the DiT's text width.
        EngineError: a device without a backend, or memory that cannot be allocated.
    """

    #: sd-cli's Qwen-Image denoiser is the discrete flow schedule (SD3's time shift, shift 3).
    schedule_kind = "sd3"
    latent_format = "wan21_vae"

    def __init__(self, models: QwenImageModels, plan: Any = None, pool: Any = None,
                 placements: Mapping[str, Any] | None = None, n_threads: int = 0,
                 dtypes: Mapping[str, str] | None = None, cancel: Any = None, flash: bool = False) -> None:
        self.dit = QwenImageDiT.from_weights(shapes(models.diffusion_model), models.axes, flash, models.zero_cond_t)
        cfg = llm_config(shapes(models.llm), head_dim=llm_head_dim(models.llm))
        if cfg.hidden != self.dit.cfg.context:
            raise SdplanError(f"{models.llm}: the text encoder's width {cfg.hidden} is not the Qwen-Image DiT's "
                              f"text width {self.dit.cfg.context} (Qwen-Image reads Qwen2.5-VL-7B's 3584)")
        vae_shapes = shapes(models.vae)
        self.vae_cfg = wan_vae_config(vae_shapes)
        if self.vae_cfg.z != len(LATENT_MEAN) or not self.vae_cfg.decoder:
            raise SdplanError(f"{models.vae}: not the Qwen-Image autoencoder (Wan 2.1's decoder of "
                              f"{len(LATENT_MEAN)} latent channels); this one has {self.vae_cfg.z}")
        self.llm = LLMEncoder(cfg, family("qwen_image").llm_out_layers(cfg.n_blocks),  # the final normed states
                              mrope=_meta_ints(models.llm, MROPE_KEY))
        self._llm_path = models.llm
        self.vision = vision_tower(models.llm, shapes(models.llm))
        #: the encoder's positions of a prompt with pictures (:data:`~.edit.POSITIONS`)
        self.positions = "sd-cli"
        self.tokenizer = BPETokenizer.from_gguf(models.llm) if is_gguf(models.llm) else BPETokenizer.qwen()
        super().__init__(pool, n_threads, cancel)
        self.placements = module_placements(MODULES, plan, placements)
        self._vae_path, self._vae_shapes = models.vae, vae_shapes
        try:
            self.runners["diffusion"] = self._runner("diffusion", self.dit, models.diffusion_model,
                                                     self.placements["diffusion"], dtypes)
            self.runners["llm"] = self._runner("llm", self.llm, models.llm, self.placements["te"], dtypes)
            p = self.vae_cfg.prefix
            dec = [n for n in vae_shapes if n.startswith((p + "decoder.", p + "conv2."))]
            self.runners["vae"] = self._vae_runner("vae", dec, {"z": "f32"}, self._decode)
        except BaseException:
            self.close()
            raise

    def _vae_runner(self, name: str, names: list[str], specs: dict[str, str],
                    fn: Callable[[Any, Any, dict[str, Any]], dict[str, Any]]) -> Any:
        """A runner of the autoencoder function ``fn`` over ``names`` held in their folded
        shapes (:func:`~sdplan.core.models.qwen_image_vae.weight_file`), where the VAE is placed."""
        placement = self.placements["vae"]
        wf = weight_file(self._vae_path, names, self.pool.get(placement.devices[0]))
        return self.new_runner(name, FunctionGraph(names, specs, fn), wf, placement)

    def _decode(self, g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
        return {"image": vae_decode(g, w, ins["z"], self.vae_cfg, self._vae_shapes)}

    def lora_aliases(self) -> Any:
        """Qwen-Image takes no LoRA yet.

        Raises:
            SdplanError: always.
        """
        raise SdplanError("Qwen-Image takes no LoRA")

    # ------------------------------------------------------------------ stages
    def encode_prompt(self, prompt: str, pictures: Sequence[tuple[np.ndarray, tuple[int, int, int]]] = ()
                      ) -> np.ndarray:
        """The LLM's final states ``(1, T - 34, width)`` float32 for ``prompt`` in the template,
        weighted, the template's first 34 tokens dropped (module docstring); with ``pictures``
        (:meth:`picture_embeddings`) in the Edit template, its first 64 tokens dropped.

        Raises:
            PromptError: a malformed weight; ValueError: token ids beyond the encoder's
                vocabulary (a tokenizer that does not belong to it).
        """
        if not pictures:
            tok = self.tokenizer.encode_prompt(prompt, *TEMPLATE)
            hidden = self.runners["llm"].run(self.llm.inputs(tok.ids))["hidden"]
            return np.ascontiguousarray(apply_prompt_weights(hidden, tok.weights)[:, DROP:], dtype=np.float32)
        if self.positions not in POSITIONS:
            raise SdplanError(f"Qwen-Image encoder positions {self.positions!r}: one of {', '.join(POSITIONS)}")
        grids = [g for _, g in pictures]
        tok = self.tokenizer.encode_prompt(prompt, edit_prefix(grids), EDIT_TEMPLATE[1])
        inputs = self.llm.picture_inputs(tok.ids, [e for e, _ in pictures], grids, mrope=self.positions == "mrope")
        hidden = self.runners["llm"].run(inputs)["hidden"]
        return np.ascontiguousarray(apply_prompt_weights(hidden, tok.weights)[:, EDIT_DROP:], dtype=np.float32)

    def picture_embeddings(self, pictures: Sequence[np.ndarray]) -> list[tuple[np.ndarray, tuple[int, int, int]]]:
        """Each reference picture u8 ``(H, W, 3)`` through the vision tower (runner
        ``llm_vision``, on the LLM's main device): its merged embeddings f32 ``(n, width)`` and
        patch grid; empty when the encoder has no vision tower."""
        if self.vision is None or not pictures:
            return []
        runner = self.vision_runner()
        out = []
        for p in pictures:
            patches, grid = vl_picture(p)
            out.append((runner.run(self.vision.inputs(patches, grid))["embeds"], grid))
        return out

    def vision_runner(self) -> Any:
        """The vision tower's runner (``llm_vision``, on the LLM's main device, never split: as
        sd-cli), made on first use.

        Raises:
            SdplanError: the encoder has no vision tower.
        """
        if self.vision is None:
            raise SdplanError(f"{self._llm_path}: the encoder has no vision tower (visual.*)")
        if "llm_vision" not in self.runners:
            dev = self.placements["te"].devices[0]
            names = self.vision.other_tensors() + [n for i in range(self.vision.n_blocks)
                                                   for n in self.vision.block_tensors(i)]
            wf = vision_weight_file(self._llm_path, names, self.pool.get(dev))
            self.runners["llm_vision"] = self.new_runner("llm_vision", self.vision, wf, ModulePlacement((dev,)))
        return self.runners["llm_vision"]

    def reference_latent(self, picture: np.ndarray, width: int, height: int) -> np.ndarray:
        """A reference picture u8 ``(H, W, 3)`` resized nearest to
        :func:`~sdplan.core.pipelines.qwen_image.edit.vae_size` for a ``width x height`` output,
        as the autoencoder's normalised mean ``(1, 16, h, w)`` (:meth:`encode_sample`)."""
        w, h = vae_size(width, height, picture.shape[1], picture.shape[0])
        img = resize_nearest(np.asarray(picture), w, h).astype(np.float32) / 127.5 - 1.0
        return self.encode_sample(np.ascontiguousarray(img.transpose(2, 0, 1)[None]), np.zeros(0, np.float32))

    def velocity(self, x: np.ndarray, sigma: float, context: np.ndarray, pooled: Any = None,  # type: ignore[override]
                 guidance: float | None = None, refs: Sequence[np.ndarray] = ()) -> np.ndarray:
        """The DiT's velocity ``noise - x0`` for latent ``x`` ``(1, 16, h, w)`` at ``sigma`` and
        LLM states ``context``, with reference latents ``refs`` (``(1, 16, h', w')`` each) after
        the image's tokens (Qwen-Image has no pooled vector and no distilled guidance:
        ``pooled`` and ``guidance`` are ignored)."""
        out = self.runners["diffusion"].run(self.dit.inputs(x, context, sigma, refs))["out"]
        return self.dit.velocity(out, x.shape[2], x.shape[3])

    def to_vae(self, latent: np.ndarray) -> np.ndarray:
        """The autoencoder's latent ``latent * std + mean`` of a normalised one ``(1, 16, h, w)``."""
        return (np.asarray(latent, np.float32) * _STD + _MEAN).astype(np.float32)

    def decode(self, latent: np.ndarray, tile: Any = None) -> np.ndarray:
        """Image ``(1, 3, 8h, 8w)`` (about [-1, 1]) of a normalised latent ``(1, 16, h, w)``
        (``tile``: in tiles, :meth:`vae_decode`)."""
        return self.vae_decode(self.to_vae(latent), tile)

    def vae_encoder_runner(self) -> Any:
        """The autoencoder's encoder (runner ``vae_encoder``, where the VAE is placed), made on
        first use.

        Raises:
            SdplanError: the autoencoder file has no encoder.
        """
        if "vae_encoder" not in self.runners:
            if not self.vae_cfg.encoder:
                raise SdplanError(f"{self._vae_path}: the autoencoder has no encoder: img2img and -r need one")
            p = self.vae_cfg.prefix
            names = [n for n in self._vae_shapes if n.startswith((p + "encoder.", p + "conv1."))]

            def enc(g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
                return {"mean": vae_encode(g, w, ins["image"], self.vae_cfg, self._vae_shapes)}

            self.runners["vae_encoder"] = self._vae_runner("vae_encoder", names, {"image": "f32"}, enc)
        return self.runners["vae_encoder"]

    def encode_sample(self, img: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """Image ``(1, 3, H, W)`` in [-1, 1] -> the normalised latent ``(1, 16, H/8, W/8)`` of
        the autoencoder's mean (sd-cli's Wan encode draws no sample: ``noise`` is unused). The
        encoder runs where the VAE is placed.

        Raises:
            SdplanError: the autoencoder file has no encoder.
        """
        runner = self.vae_encoder_runner()
        with runner.session():
            mean = encode_tiled(lambda part: runner.run({"image": part})["mean"],
                                np.ascontiguousarray(img, dtype=np.float32), self.vae_tiling, self.vae_cfg.factor)
        return ((mean - _MEAN) / _STD).astype(np.float32)

    def txt2img(self, prompt: str, width: int, height: int, *, steps: int | None = None,
                seed: int = 42, sampler: str = "euler", cfg_scale: float = 2.5, negative_prompt: str = "",
                shift: float = SHIFT, noise: np.ndarray | None = None,
                preview: Callable[[int, np.ndarray], None] | None = None,
                init: ImageInput | None = None, init_seed: int | None = None, scheduler: str = "default",
                sampling: SamplingOptions | None = None, vae_tile: Any = None,
                step_hook: Callable[[int, int], None] | None = None,
                ref_images: Sequence[np.ndarray] = ()) -> dict[str, np.ndarray]:
        """Generate one image (with ``init``: from a picture; with ``ref_images``: an edit).

        Args:
            prompt, negative_prompt: sd-cli weighting syntax; the negative prompt is used only
                with ``cfg_scale != 1``.
            width, height: image size in pixels (positive multiples of 16).
            steps: sampling steps (default 20, sd-cli's).
            seed: Philox seed of the starting noise (and of ancestral samplers).
            sampler: a :data:`sdplan.core.sampling.flow.FLOW_SAMPLERS` name.
            cfg_scale: classifier-free guidance scale (1: none).
            shift: the flow shift of the sigma schedule (``sampling.flow_shift`` wins).
            noise: an explicit starting noise ``(1, 16, h, w)`` instead of the seed's.
            preview: ``preview(step, rgb_uint8 (h, w, 3))`` after each step.
            init: the picture (and mask) to start from (:mod:`sdplan.core.pipelines.stages.img2img`);
                ``init_seed`` seeds the draw of its latent (default ``seed``).
            scheduler, sampling: sd-cli's ``--scheduler`` (``default``: the discrete flow
                schedule of ``shift``) and its other sampling options, through the shared flow
                loop (:meth:`~sdplan.core.pipelines.stages.flow_dit.FlowDiTPipeline._sample`).
            vae_tile: ``--vae-tiling`` (the autoencoder decodes, and encodes, in tiles).
            step_hook: ``step_hook(done, n)`` before the first step and after each.
            ref_images: reference pictures u8 ``(H, W, 3)`` (sd-cli's ``-r``), module docstring.

        Returns:
            ``{"latent": (1, 16, h, w), "image": (1, 3, H, W) float32, "sigmas": ...}``.

        Raises:
            SdplanError: a size that is not a positive multiple of 16, a non-finite
                ``cfg_scale``; SamplingError.
        """
        if width % 16 or height % 16 or width <= 0 or height <= 0:
            raise SdplanError(f"Qwen-Image image size {width}x{height} must be positive multiples of 16")
        if not np.isfinite(cfg_scale):
            raise SdplanError(f"Qwen-Image cfg_scale must be finite, got {cfg_scale}")
        pictures = self.picture_embeddings(ref_images)
        context = self.encode_prompt(prompt, pictures)
        uncond = self.encode_prompt(negative_prompt, pictures) if cfg_scale != 1.0 else None
        refs = [self.reference_latent(p, width, height) for p in ref_images]
        vel = guided_velocity(lambda x, s: self.velocity(x, s, context, refs=refs),
                              None if uncond is None else lambda x, s: self.velocity(x, s, uncond, refs=refs),
                              cfg_scale)
        return self._sample(vel, height // 8, width // 8, steps or int(DEFAULTS["steps"]), shift=False, seed=seed,
                            sampler=sampler, noise=noise, preview=preview, scheduler=scheduler, sampling=sampling,
                            flow_shift=shift, init=init, init_seed=init_seed, step_hook=step_hook, vae_tile=vae_tile)

    def _default_sigmas(self, steps: int, tokens: int, shift: bool, flow_shift: float) -> np.ndarray:
        """Qwen-Image's own sigmas: the discrete flow schedule of ``flow_shift``."""
        return discrete_flow_sigmas(steps, flow_shift)
