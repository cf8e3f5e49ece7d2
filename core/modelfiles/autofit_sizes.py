"""Component sizes as sd-cli's ``--auto-fit`` counts them, from classified model tensors.

stable-diffusion.cpp (``src/core/backend_fit.cpp``, ``estimate_components``, commit
97d2990) sizes each of ``diffusion``, ``te`` and ``vae`` as the sum over its tensors of the
tensor's bytes in the file's type plus 64 bytes, skipping the tensors its loader never uses
(``is_unused_tensor`` in ``src/model_loader.cpp``: position ids, ``logit_scale``, T5's
training-only ``encoder.embed_tokens``, an LLM's output head, schedule buffers...). Those
names are matched against the name sd-cli's loader gives the tensor: a standalone file's
names get the prefix its flag adds (``--t5xxl``: ``text_encoders.t5xxl.transformer.``,
``--llm``: ``text_encoders.llm.``, ``--diffusion-model``: ``model.diffusion_model.``).
``--taesd`` counts towards ``vae`` (upstream classifies ``tae.`` names as the VAE).

:func:`loaded_component_bytes` sizes the same tensors as sd-cli then allocates them: a text
encoder's token embedding (CLIP ``token_embedding``, T5 ``shared`` and
``relative_attention_bias``, an LLM's ``embed_tokens``/``token_embd``) whose type has no
``get_rows`` in sd-cli (anything but F32, F16, Q8_0, Q5_1, Q5_0, Q4_1, Q4_0:
``support_get_rows`` in ``src/core/ggml_extend.hpp``) is loaded as F32. A BF16 Qwen3-4B's
embedding (151936 x 2560) is so 1.5 GiB in memory where auto-fit counts 0.7 GiB.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Protocol

__all__ = ["UNUSED_PREFIXES", "PER_TENSOR", "GET_ROWS_TYPES", "loader_name",
           "autofit_component_bytes", "loaded_component_bytes"]

#: Types sd-cli's embedding lookups read directly; others are loaded as F32.
GET_ROWS_TYPES = frozenset({"F32", "F16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0"})
_EMBEDDING = re.compile(
    r"(?:^|\.)(?:token_embedding|shared|relative_attention_bias|embed_tokens|token_embd)\.weight$")

#: Bytes auto-fit adds per tensor.
PER_TENSOR = 64
#: Name prefixes stable-diffusion.cpp's loader ignores (``unused_tensors`` at 97d2990).
UNUSED_PREFIXES = (
    "betas", "alphas_cumprod", "alphas_cumprod_prev", "sqrt_alphas_cumprod",
    "sqrt_one_minus_alphas_cumprod", "log_one_minus_alphas_cumprod",
    "sqrt_recip_alphas_cumprod", "sqrt_recipm1_alphas_cumprod", "posterior_variance",
    "posterior_log_variance_clipped", "posterior_mean_coef1", "posterior_mean_coef2",
    "cond_stage_model.transformer.text_model.embeddings.position_ids",
    "cond_stage_model.1.model.text_model.embeddings.position_ids",
    "cond_stage_model.transformer.vision_model.embeddings.position_ids",
    "cond_stage_model.model.logit_scale",
    "conditioner.embedders.0.transformer.text_model.embeddings.position_ids",
    "conditioner.embedders.0.model.logit_scale",
    "conditioner.embedders.1.model.logit_scale",
    "model.diffusion_model.time_embedding.cond_proj.weight",
    "unet.time_embedding.cond_proj.weight",
    "model_ema.decay", "model_ema.num_updates", "model_ema.diffusion_model",
    "embedding_manager", "denoiser.sigmas",
    "text_encoders.t5xxl.transformer.encoder.embed_tokens.weight",
    "ztsnr", "edm_vpred.sigma_min",
    "text_encoders.llm.output.weight", "text_encoders.llm.lm_head.",
)
_CHECKPOINT_PREFIXES = ("model.diffusion_model.", "cond_stage_model.", "conditioner.",
                        "first_stage_model.", "text_encoders.", "model_ema.", "unet.")
_STANDALONE_PREFIX = {("diffusion", None): "model.diffusion_model.",
                      ("te", "t5xxl"): "text_encoders.t5xxl.transformer.",
                      ("te", "llm"): "text_encoders.llm.",
                      ("te", "clip_l"): "text_encoders.clip_l.transformer.",
                      ("te", "clip_g"): "text_encoders.clip_g.transformer.",
                      ("vae", None): "first_stage_model."}


class _Info(Protocol):
    name: str
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


class _Tensor(Protocol):
    """What is read of a classified tensor (:class:`~sdplan.core.modelfiles.checkpoint.ModelTensor`)."""

    info: _Info
    module: str
    encoder: str | None
    role: str


def loader_name(t: _Tensor) -> str:
    """The name stable-diffusion.cpp's loader gives ``t``: checkpoint names as they are, a
    standalone file's names with the prefix of its flag (module docstring)."""
    name = t.info.name
    if name.startswith(_CHECKPOINT_PREFIXES):
        return name
    if t.role == "preview":
        return "tae." + name
    prefix = _STANDALONE_PREFIX.get((t.module, t.encoder if t.module == "te" else None))
    return prefix + name if prefix else name


def autofit_component_bytes(tensors: Iterable[_Tensor]) -> dict[str, int]:
    """``{"diffusion", "te", "vae"}`` -> bytes as auto-fit counts them (module docstring);
    0 for a component without tensors."""
    out = {"diffusion": 0, "te": 0, "vae": 0}
    for t in tensors:
        if t.module not in out or loader_name(t).startswith(UNUSED_PREFIXES):
            continue
        out[t.module] += t.info.nbytes + PER_TENSOR
    return out


def loaded_bytes(t: _Tensor) -> int:
    """Bytes sd-cli allocates for ``t``: its file bytes, or 4 per element for a text
    encoder's token embedding in a type without ``get_rows`` (module docstring)."""
    if t.module == "te" and t.info.dtype.upper() not in GET_ROWS_TYPES and \
            _EMBEDDING.search(t.info.name):
        return 4 * math.prod(t.info.shape)
    return t.info.nbytes


def loaded_component_bytes(tensors: Iterable[_Tensor]) -> dict[str, int]:
    """As :func:`autofit_component_bytes`, with each tensor at :func:`loaded_bytes`: what
    the components occupy once sd-cli has loaded them."""
    out = {"diffusion": 0, "te": 0, "vae": 0}
    for t in tensors:
        if t.module not in out or loader_name(t).startswith(UNUSED_PREFIXES):
            continue
        out[t.module] += loaded_bytes(t) + PER_TENSOR
    return out
