"""FLUX.2 dev text-to-image and reference-image editing: Mistral-Small-3.2's hidden states as
the prompt, the FLUX.2 DiT with its distilled-guidance embedder, klein's sampling, autoencoder,
reference pictures and previews (:class:`~sdplan.core.pipelines.flux2.pipeline.KleinPipeline`).

As sd-cli runs it (stable-diffusion.cpp ``conditioner.hpp`` ``LLMEmbedder`` for
``VERSION_FLUX2``, ``llm.hpp`` ``MISTRAL_SMALL_3_2``, ``flux.hpp``):

* prompt: ``<s>`` then ``[SYSTEM_PROMPT]`` :data:`SYSTEM` ``[/SYSTEM_PROMPT][INST]{prompt}[/INST]``
  (:data:`TEMPLATE`; diffusers' ``Flux2Pipeline`` system message), tokenised by Mistral's
  Tekken BPE (:meth:`~sdplan.core.text.bpe_tokenizer.BPETokenizer.mistral`, or a GGUF
  encoder's own), with no token padding: the encoder attends causally over the prompt's
  tokens alone; the states after blocks 10, 20 and 30 (:data:`OUT_LAYERS`) are concatenated
  along the width (3 x 5120 = 15360 for Mistral-Small-3.2), scaled by the ``(text:weight)``
  weights, then padded with zero rows to :data:`MIN_ROWS` (512);
* the encoder is a Mistral (no biases, no q/k norms, RoPE base 1e9, RMS eps 1e-5) whose head
  width is 128 whatever its files say (sd-cli's fixed ``head_dim``; Mistral-Small-3.2's 32
  heads of 128 are narrower than its width 5120);
* the DiT adds ``guidance_in(emb(1000 g))`` to its time vector, ``g`` the ``--guidance``
  (sd-cli's default 3.5); real classifier-free guidance with the negative prompt only when
  ``--cfg-scale`` is not 1 (sd-cli's default 1 for the family);
* sampling, reference pictures and decoding: klein's (FLUX.2's empirical ``mu`` shift of
  ``linspace(1, 0)``, 20 steps by default).

Modules: ``diffusion`` (8 double + 48 single blocks split at real size), ``te`` (the Mistral's
40 layers split; a vision tower in the file is its own ``llm_vision`` part, never run for
FLUX.2) and ``vae``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from sdplan.core.errors import SdplanError
from sdplan.core.families import family
from sdplan.core.models.llm import LLMConfig, llm_config
from sdplan.core.pipelines.flux2.pipeline import KleinModels, KleinPipeline
from sdplan.core.pipelines.stages.flow_dit import shapes
from sdplan.core.pipelines.z_image.pipeline import is_gguf
from sdplan.core.text.bpe_tokenizer import BPETokenizer
from sdplan.core.text.prompt import apply_prompt_weights

__all__ = ["DevPipeline", "DevModels", "SYSTEM", "TEMPLATE", "OUT_LAYERS", "MIN_ROWS", "DEFAULTS", "HEAD_DIM"]

#: diffusers' ``Flux2Pipeline`` system message, as sd-cli writes it (one newline inside).
SYSTEM = ("You are an AI that reasons about image descriptions. You give structured responses focusing on "
          "object relationships, object\nattribution and actions without speculation.")
#: sd-cli's FLUX.2 dev prompt template (prefix, suffix), after the BOS token.
TEMPLATE = (f"[SYSTEM_PROMPT]{SYSTEM}[/SYSTEM_PROMPT][INST]", "[/INST]")
#: The Mistral states FLUX.2 dev takes (after these many blocks); the rows they are padded to.
OUT_LAYERS: tuple[int, ...] = family("flux2").llm_layers  # (10, 20, 30): the family declares them
MIN_ROWS = 512
#: Mistral-Small-3.2's attention head width (sd-cli ``llm.hpp``: fixed, not in the files).
HEAD_DIM = 128
_DEV = family("flux2").defaults
#: sd-cli's settings for FLUX.2 dev (20 steps, CFG 1, euler, distilled guidance 3.5).
DEFAULTS: dict[str, Any] = {**_DEV.settings(), "guidance": _DEV.guidance}
#: The files of a dev run are klein's (``--diffusion-model``, ``--llm``, ``--vae``, ``--taesd``).
DevModels = KleinModels


class DevPipeline(KleinPipeline):
    """FLUX.2 dev over engine module runners (module docstring; the stages are klein's).

    Raises:
        as :class:`~sdplan.core.pipelines.flux2.pipeline.KleinPipeline`; SdplanError: an
        encoder with fewer than 30 blocks or whose width x 3 is not the DiT's text width.
    """

    out_layers = OUT_LAYERS
    title = "FLUX.2 dev"
    encoders = "FLUX.2 dev takes Mistral-Small-3.2-24B"
    defaults = DEFAULTS

    def _llm_config(self, path: str | Path) -> LLMConfig:
        """A Mistral with sd-cli's head width (:data:`HEAD_DIM`).

        Raises:
            SdplanError: an encoder of another family (q/k norms or biases: a Qwen).
        """
        found = llm_config(shapes(path)).arch.name
        if found != "mistral":
            raise SdplanError(f"{path}: FLUX.2 dev reads the states of Mistral-Small-3.2; this encoder is a "
                              f"{found} model (q/k norms or biases)")
        return llm_config(shapes(path), "mistral", HEAD_DIM)

    def _tokenizer(self, path: str | Path) -> BPETokenizer:
        """A GGUF encoder's own tokenizer, else the shipped Tekken vocabulary."""
        return BPETokenizer.from_gguf(path) if is_gguf(path) else BPETokenizer.mistral()

    def encode_prompt(self, prompt: str) -> np.ndarray:
        """The Mistral's states ``(1, max(512, T), 3 width)`` float32 for ``prompt`` in the
        template (``T`` tokens with the BOS), weighted, zero-padded (module docstring).

        Raises:
            PromptError: a malformed weight; ValueError: token ids beyond the encoder's
                vocabulary (a tokenizer that does not belong to it).
        """
        tok = self.tokenizer.encode_prompt(prompt, *TEMPLATE)
        ids = np.concatenate([[[self.tokenizer.token_id("<s>")]], tok.ids], axis=1).astype(np.int32)
        weights = np.concatenate([[[1.0]], tok.weights], axis=1).astype(np.float32)
        hidden = apply_prompt_weights(self.runners["llm"].run(self.llm.inputs(ids))["hidden"], weights)
        rows = max(MIN_ROWS, hidden.shape[1])
        out = np.zeros((1, rows, hidden.shape[2]), np.float32)
        out[:, : hidden.shape[1]] = hidden
        return out
