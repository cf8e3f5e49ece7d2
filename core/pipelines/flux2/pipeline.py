"""FLUX.2 klein text-to-image and reference-image editing: a Qwen3 language model's hidden
states as the prompt, flow-matching sampling with the FLUX.2 DiT, the 32-channel FLUX.2
autoencoder with its batch-norm latent statistics, TAEF2 previews.

As sd-cli runs it (stable-diffusion.cpp ``conditioner.hpp`` ``LLMEmbedder`` for
``VERSION_FLUX2_KLEIN``, ``stable-diffusion.cpp``, ``auto_encoder_kl.hpp``):

* prompt: ``<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n``
  (:data:`TEMPLATE`, Qwen3's chat template without thinking, as diffusers'
  ``Flux2KleinPipeline`` applies it), padded on the right to :data:`MIN_TOKENS` (512) with
  ``<|endoftext|>``; the encoder attends causally and never to the padding; the states after
  blocks 9, 18 and 27 (:data:`OUT_LAYERS`) of every token, padding included, are
  concatenated along the width (3 x 2560 = 7680 for Qwen3-4B, 3 x 4096 for Qwen3-8B / klein
  9B); ``(text:weight)`` weights scale them with sd-cli's mean-keeping rule;
* sampling: the 128-channel latent (the autoencoder's 32 channels patchified 2x2) at 1/16 of
  the image size, sigmas ``linspace(1, 0)`` shifted by FLUX.2's empirical ``mu``
  (:func:`~sdplan.core.sampling.flow.flux2_mu`), euler by default, the DiT at ``t = sigma``;
  classifier-free guidance ``uncond + cfg (cond - uncond)`` with the negative prompt only
  when ``cfg_scale != 1`` (the distilled klein runs 4 steps at CFG 1, the klein base models
  20 at CFG 4: :data:`DEFAULTS` are the distilled model's);
* reference images (``-r/--ref-image``, edit mode): each image is resized (nearest) to at
  most the output's pixel count with its aspect kept, sides rounded to multiples of 16,
  encoded to the latent mean, normalised, and its tokens appended to the image tokens at
  RoPE time index 10, 20, ... (:func:`ref_size`, :meth:`KleinPipeline.encode_image`);
* decoding: ``z = latent * sqrt(running_var + 1e-4) + running_mean`` with the file's
  ``bn`` statistics per diffusion channel, unpatchified to 32 channels, through the
  autoencoder; TAEF2 previews decode the normalised latent unpatchified (sd-cli's
  ``TinyImageAutoEncoder``), the latent-to-RGB projection otherwise.

Modules: ``diffusion`` (the DiT; double then single blocks split), ``te`` (the LLM, runner
``llm``; its blocks split) and ``vae`` (decoder, the encoder when reference images are given,
the TAEF2 preview decoder).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import ModelFileError, SdplanError
from sdplan.core.families import family, generation_defaults
from sdplan.core.modelfiles.readers import read_tensor_file
from sdplan.core.models.base import FunctionGraph
from sdplan.core.models.flux2 import Flux2DiT, patchify_latent, unpatchify_latent, untokens
from sdplan.core.models.llm import LLMConfig, LLMEncoder, llm_config
from sdplan.core.models.tae import detect_tae
from sdplan.core.models.vae import vae_encode
from sdplan.core.pipelines.stages.base import module_placements
from sdplan.core.pipelines.stages.flow_dit import VAE_BF16, FlowDiTPipeline, shapes
from sdplan.core.pipelines.stages.images import read_image_rgb
from sdplan.core.pipelines.stages.vae_tiles import as_tiling, encode_tiled
from sdplan.core.pipelines.z_image.pipeline import is_gguf
from sdplan.core.sampling.flow import flux2_mu, flux_sigmas, guided_velocity, sample_flow
from sdplan.core.sampling.options import SamplingOptions, prepare
from sdplan.core.sampling.preview import latent_to_rgb
from sdplan.core.sampling.schedules_more import FlowSchedule
from sdplan.core.text.bpe_tokenizer import BPETokenizer
from sdplan.core.text.prompt import apply_prompt_weights

__all__ = ["KleinModels", "KleinPipeline", "TEMPLATE", "OUT_LAYERS", "MIN_TOKENS", "DEFAULTS", "MODULES",
           "BN_EPS", "ref_size", "resize_nearest", "load_ref_image"]

#: sd-cli's FLUX.2 klein prompt template (prefix, suffix).
TEMPLATE = ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
#: The LLM states klein takes (after these many blocks), and the padded token count.
OUT_LAYERS: tuple[int, ...] = family("flux2_klein").llm_layers  # (9, 18, 27): the family declares them
MIN_TOKENS = 512
PAD_TOKEN = "<|endoftext|>"
#: The batch-norm eps of the FLUX.2 autoencoder's latent statistics (its diffusers config).
BN_EPS = 1e-4
#: The distilled klein's settings (4 steps, CFG 1, euler), the family's defaults.
DEFAULTS: dict[str, Any] = generation_defaults("flux2_klein")
MODULES = ("diffusion", "te", "vae")
#: sd-cli's cap on a reference image's pixels before the autoencoder.
REF_MAX_PIXELS = 1024 * 1024


@dataclass
class KleinModels:
    """The model files of a FLUX.2 klein run (sd-cli's ``--diffusion-model``, ``--llm``,
    ``--vae``, ``--taesd``) and the RoPE axes override tiny models need."""

    diffusion_model: str | Path
    llm: str | Path
    vae: str | Path
    taesd: str | Path | None = None
    axes: tuple[int, ...] | None = None


def ref_size(width: int, height: int, ref_width: int, ref_height: int, factor: int = 16) -> tuple[int, int]:
    """``(width, height)`` sd-cli resizes a ``ref_width x ref_height`` reference image to
    before encoding it for a ``width x height`` output: the pixel count
    ``min(1024 * 1024, width * height)`` at the reference's aspect ratio (integer arithmetic
    as sd-cli's), each side rounded to a multiple of ``factor`` (16: the autoencoder's 8 times
    the 2x2 patch), at least ``factor``."""
    area = min(REF_MAX_PIXELS, width * height)
    w = math.sqrt(area * ref_width // ref_height)
    h = w * ref_height / ref_width
    return (max(factor, int(math.floor(w / factor + 0.5)) * factor),
            max(factor, int(math.floor(h / factor + 0.5)) * factor))


def resize_nearest(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """``image`` ``(H, W, C)`` resized to ``(height, width, C)`` by sd-cli's nearest rule:
    output index ``i`` reads input ``i * in / out`` (integer division)."""
    h, w = image.shape[:2]
    rows = np.arange(height) * h // height
    cols = np.arange(width) * w // width
    return np.ascontiguousarray(image[rows][:, cols])


def load_ref_image(path: str | Path) -> np.ndarray:
    """A reference image file as uint8 ``(H, W, 3)`` RGB, any mode Pillow reads
    (:func:`sdplan.core.pipelines.stages.images.read_image_rgb`).

    Raises:
        SdplanError: a missing or unreadable image, naming ``-r/--ref-image``.
    """
    try:
        return read_image_rgb(path)
    except ModelFileError as exc:
        reason = str(exc).removeprefix(f"{path}: ")
        raise SdplanError(f"-r/--ref-image {str(path)!r}: {reason}") from None


def _read_vector(path: str | Path, name: str) -> np.ndarray | None:
    """A small float tensor of a safetensors or GGUF file as float32, found by its name with
    or without a prefix (``first_stage_model.bn.running_mean``); None when absent."""
    info = next((t for t in read_tensor_file(path).tensors if t.name == name or t.name.endswith("." + name)), None)
    if info is None:
        return None
    kinds = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
    if info.dtype not in kinds:
        raise ModelFileError(path, f"{name}: dtype {info.dtype} is not a float vector")
    with open(path, "rb") as fh:
        fh.seek(info.offset)
        raw = np.frombuffer(fh.read(info.nbytes), kinds[info.dtype]).reshape(info.shape)
    if info.dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


class KleinPipeline(FlowDiTPipeline):
    """FLUX.2 klein txt2img and editing over engine module runners (module docstring); the
    DiT runner and its session come from
    :class:`~sdplan.core.pipelines.stages.flow_dit.FlowDiTPipeline`.

    Args:
        models: the model files.
        plan: a resolved ``Plan`` giving each module's placement; None: the CPU.
        pool, placements, n_threads, dtypes, cancel: as :class:`~sdplan.core.pipelines.flux.pipeline.FluxPipeline`.
        flash: ggml's flash attention in the DiT (sd-cli's ``--diffusion-fa``).

    Raises:
        ModelLayoutError / ModelFileError: files that are not the expected models (an
            autoencoder without ``bn`` statistics, a TAE that is not TAEF2 included).
        ModelFileError: an encoder with fewer than 27 blocks or whose width does not fit the DiT.
        EngineError: a device without a backend, or memory that cannot be allocated.
    """

    #: The encoder states the DiT reads, the family's title, its encoders, its defaults.
    out_layers: tuple[int, ...] = OUT_LAYERS
    title = "FLUX.2 klein"
    encoders = "klein 4B takes Qwen3-4B, klein 9B Qwen3-8B"
    defaults: dict[str, Any] = DEFAULTS

    def __init__(self, models: KleinModels, plan: Any = None, pool: Any = None,
                 placements: Mapping[str, Any] | None = None, n_threads: int = 0,
                 dtypes: Mapping[str, str] | None = None, cancel: Any = None, flash: bool = False) -> None:
        self.dit = Flux2DiT.from_weights(shapes(models.diffusion_model), axes=models.axes, flash=flash)
        cfg = self._llm_config(models.llm)
        layers = self.out_layers
        if cfg.n_blocks < max(layers):
            raise ModelFileError(models.llm, f"{self.title} takes the states after blocks {layers}; "
                                             f"this encoder has {cfg.n_blocks} blocks")
        if len(layers) * cfg.hidden != self.dit.cfg.context:
            raise ModelFileError(models.llm, f"{len(layers)} states of width {cfg.hidden} do not fit the DiT's "
                                             f"text width {self.dit.cfg.context} ({self.encoders})")
        #: the distilled guidance of the DiT's guidance embedder (FLUX.2 dev; klein has none)
        self.guidance: float | None = None
        mean, var = _read_vector(models.vae, "bn.running_mean"), _read_vector(models.vae, "bn.running_var")
        if mean is None or var is None or mean.shape != (self.dit.cfg.in_channels,) or var.shape != mean.shape:
            raise ModelFileError(models.vae, "not a FLUX.2 autoencoder: bn.running_mean / bn.running_var of "
                                             f"{self.dit.cfg.in_channels} values missing")
        self.bn_mean = mean.reshape(1, -1, 1, 1)
        self.bn_std = np.sqrt(var + np.float32(BN_EPS)).astype(np.float32).reshape(1, -1, 1, 1)
        if models.taesd is not None:
            tae = detect_tae(shapes(models.taesd), str(models.taesd))
            if "decoder" in tae and tae["decoder"].latent_channels != 32:
                raise ModelFileError(models.taesd, f"a {tae['decoder'].variant} decoder ({tae['decoder'].latent_channels} "
                                                   "latent channels); FLUX.2 klein previews need TAEF2 (32)")
        self.llm = LLMEncoder(cfg, layers)
        self.tokenizer = self._tokenizer(models.llm)
        super().__init__(pool, n_threads, cancel)
        self.placements = module_placements(MODULES, plan, placements)
        self.vae_path = models.vae
        try:
            self.runners["diffusion"] = self._runner("diffusion", self.dit, models.diffusion_model,
                                                     self.placements["diffusion"], dtypes)
            self.runners["llm"] = self._runner("llm", self.llm, models.llm, self.placements["te"], dtypes)
            self._init_vae(models.vae, models.taesd)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ the encoder
    def _llm_config(self, path: str | Path) -> LLMConfig:
        """The text encoder's configuration (klein: a Qwen3, found from its shapes)."""
        return llm_config(shapes(path))

    def _tokenizer(self, path: str | Path) -> BPETokenizer:
        """A GGUF encoder's own tokenizer, else the shipped Qwen vocabulary."""
        return BPETokenizer.from_gguf(path) if is_gguf(path) else BPETokenizer.qwen()

    # ------------------------------------------------------------------ stages
    def encode_prompt(self, prompt: str) -> np.ndarray:
        """The LLM's states ``(1, max(512, T), 3 width)`` float32 for ``prompt`` in the
        template, padded and weighted (module docstring).

        Raises:
            PromptError: a malformed weight; ValueError: token ids beyond the encoder's
                vocabulary (a tokenizer that does not belong to it).
        """
        tok = self.tokenizer.encode_prompt(prompt, *TEMPLATE)
        n, total = tok.length, max(MIN_TOKENS, tok.length)
        ids = np.full((1, total), self.tokenizer.token_id(PAD_TOKEN), np.int32)
        ids[:, :n] = tok.ids
        weights = np.ones((1, total), np.float32)
        weights[:, :n] = tok.weights
        inputs = self.llm.inputs(ids)
        inputs["mask"][:, n:] = -np.inf  # nobody attends to the padding
        hidden = self.runners["llm"].run(inputs)["hidden"]
        return apply_prompt_weights(hidden, weights).astype(np.float32)

    def velocity(self, x: np.ndarray, sigma: float, context: np.ndarray, pooled: Any = None,  # type: ignore[override]
                 guidance: float | None = None, refs: Sequence[np.ndarray] = ()) -> np.ndarray:
        """The DiT's velocity ``noise - x0`` for latent ``x`` ``(1, 128, h, w)`` at ``sigma``,
        LLM states ``context`` and normalised reference latents ``refs`` (no pooled vector:
        ``pooled`` is ignored; the distilled guidance is :attr:`guidance`, used by a DiT with a
        guidance embedder, FLUX.2 dev's)."""
        out = self.runners["diffusion"].run(self.dit.inputs(x, context, sigma, refs, self.guidance))["out"]
        return untokens(out, x.shape[2], x.shape[3])

    def to_vae(self, latent: np.ndarray) -> np.ndarray:
        """The autoencoder's latent ``(1, 32, 2h, 2w)`` of a diffusion latent ``(1, 128, h, w)``."""
        return unpatchify_latent(latent * self.bn_std + self.bn_mean)

    def decode(self, latent: np.ndarray, tile: Any = None) -> np.ndarray:
        """Image ``(1, 3, H, W)`` (about [-1, 1]) of a diffusion latent ``(1, 128, h, w)``
        (``tile``: the autoencoder's latent decoded in tiles, :meth:`vae_decode`)."""
        return self.vae_decode(self.to_vae(latent).astype(np.float32), tile)

    def encode_image(self, image: np.ndarray) -> np.ndarray:
        """The normalised diffusion latent ``(1, 128, H/16, W/16)`` of ``image`` uint8
        ``(H, W, 3)`` (sides multiples of 16; of ``2 * factor`` for another autoencoder):
        the encoder's mean, patchified, minus ``running_mean``, over the std."""
        if "vae_encoder" not in self.runners:
            names = [n for n in shapes(self.vae_path) if n.startswith(self.vae_cfg.prefix + "encoder.")]
            if not names:
                raise ModelFileError(self.vae_path, "reference images need the autoencoder's encoder; "
                                                    "this file has only the decoder")

            def fn(g: Any, w: Mapping[str, Any], ins: dict[str, Any]) -> dict[str, Any]:
                return {"mean": vae_encode(g, w, ins["image"], self.vae_cfg)}

            self.runners["vae_encoder"] = self._runner("vae", FunctionGraph(names, {"image": "f32"}, fn, VAE_BF16),
                                                       self.vae_path, self.placements["vae"], None)
        img = np.asarray(image, np.float32).transpose(2, 0, 1)[None] / np.float32(127.5) - np.float32(1.0)
        runner = self.runners["vae_encoder"]
        with runner.session():
            mean = encode_tiled(lambda part: runner.run({"image": part})["mean"], np.ascontiguousarray(img),
                                self.vae_tiling, self.vae_cfg.factor)
        return ((patchify_latent(mean) - self.bn_mean) / self.bn_std).astype(np.float32)

    def tae_latent(self, latent: np.ndarray) -> np.ndarray:
        """TAEF2's input: the normalised diffusion latent unpatchified to 32 channels (sd-cli's
        ``TinyImageAutoEncoder`` for FLUX.2)."""
        return unpatchify_latent(latent)

    def _preview_rgb(self, latent: np.ndarray) -> np.ndarray:
        if self.preview is not None:
            return super()._preview_rgb(latent)
        return latent_to_rgb(unpatchify_latent(latent), "flux2_ae")

    def txt2img(self, prompt: str, width: int, height: int, *, steps: int | None = None, seed: int = 42,
                sampler: str = "euler", cfg_scale: float = 1.0, negative_prompt: str = "",
                ref_images: Sequence[np.ndarray] = (), noise: np.ndarray | None = None,
                preview: Callable[[int, np.ndarray], None] | None = None, vae_scale: int = 8,
                tae_decode: bool = False, scheduler: str = "default",
                sampling: SamplingOptions | None = None, vae_tile: Any = None,
                guidance: float | None = None) -> dict[str, np.ndarray]:
        """Generate one image (with ``ref_images``: edit them).

        Args:
            prompt, negative_prompt: sd-cli weighting syntax; the negative prompt is used only
                with ``cfg_scale != 1``.
            width, height: image size in pixels (multiples of ``2 * vae_scale``).
            steps: sampling steps (default 4, the distilled klein's).
            seed: Philox seed of the starting noise (and of ancestral samplers).
            sampler: a :data:`sdplan.core.sampling.flow.FLOW_SAMPLERS` name.
            cfg_scale: classifier-free guidance scale (1: none).
            ref_images: uint8 ``(H, W, 3)`` reference images (sd-cli's ``-r``).
            noise: an explicit starting noise ``(1, 128, h, w)`` instead of the seed's.
            preview: ``preview(step, rgb_uint8)`` after each step.
            vae_scale: pixels per autoencoder latent cell (8 for the FLUX.2 autoencoder).
            tae_decode: decode the final image with the ``taesd`` TAE instead of the VAE.
            scheduler: ``default`` (FLUX.2's shifted schedule, sd-cli's for the family) or an
                sd-cli scheduler over FLUX.1's flow schedule of shift ``sampling.flow_shift``
                (default 1, sd-cli's for klein: no guidance embedder).
            sampling: ``--eta``, ``--sigmas``, ``--rng`` and the other options.
            vae_tile: ``--vae-tiling`` (a :class:`~sdplan.core.planning.vae_tiling.VaeTiling`, or
                tiles of this many autoencoder latent pixels): the autoencoder decodes (and
                encodes the reference pictures) in tiles of its own latent.
            guidance: the distilled guidance (``--guidance``) of a DiT with a guidance
                embedder (FLUX.2 dev; default :attr:`defaults`' ``guidance``); klein has none.

        Returns:
            ``{"latent": (1, 128, h, w), "image": (1, 3, H, W) float32, "sigmas": ...}``.

        Raises:
            SdplanError: a bad size, a non-finite ``cfg_scale``, a reference image that is not
                ``(H, W, 3)``, or ``tae_decode`` without a TAE; SamplingError.
        """
        f = 2 * vae_scale
        if width % f or height % f or width <= 0 or height <= 0:
            raise SdplanError(f"FLUX.2 image size {width}x{height} must be positive multiples of {f}")
        if not np.isfinite(cfg_scale):
            raise SdplanError(f"FLUX.2 cfg_scale must be finite, got {cfg_scale}")
        if tae_decode and self.preview is None:
            raise SdplanError("decoding with the TAE needs a --taesd file")
        self.vae_tiling, self.last_decode = as_tiling(vae_tile, self.vae_cfg.factor), None
        refs = []
        for k, img in enumerate(ref_images):
            arr = np.asarray(img)
            if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
                raise SdplanError(f"reference image {k + 1}: expected uint8 (H, W, 3), got {arr.dtype} {arr.shape}")
            rw, rh = ref_size(width, height, arr.shape[1], arr.shape[0], f)
            refs.append(self.encode_image(resize_nearest(arr, rw, rh)))
        h, w = height // f, width // f
        steps = steps or int(self.defaults["steps"])
        self.guidance = float(self.defaults.get("guidance", 3.5) if guidance is None else guidance)
        opts = sampling or SamplingOptions()
        rng, sampler_noise, sigmas = prepare(
            opts, seed, steps, "discrete" if scheduler == "default" else scheduler,
            FlowSchedule(opts.flow_shift if opts.flow_shift is not None else 1.0, "flux"), image_tokens=h * w)
        if scheduler == "default" and not opts.sigmas:
            sigmas = flux_sigmas(steps, mu=flux2_mu(h * w, steps))
        context = self.encode_prompt(prompt)
        uncond = self.encode_prompt(negative_prompt) if cfg_scale != 1.0 else None
        start = rng((1, self.dit.cfg.in_channels, h, w)) if noise is None else np.asarray(noise, np.float32)

        vel = guided_velocity(lambda x, s: self.velocity(x, s, context, refs=refs),
                              None if uncond is None else lambda x, s: self.velocity(x, s, uncond, refs=refs),
                              cfg_scale)

        def cb(i: int, x: np.ndarray, den: np.ndarray) -> None:
            if preview is not None:
                preview(i, self._preview_rgb(den))

        with self.diffusion_session():
            latent = sample_flow(sampler, vel, start, sigmas, noise=sampler_noise, callback=cb, eta=opts.eta,
                                 extra=opts.extra)
        image = self.tae_image(latent) if tae_decode else self.decode(latent, vae_tile)
        return {"latent": latent, "image": image, "sigmas": sigmas}
