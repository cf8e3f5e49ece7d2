"""Shared helpers of the FLUX.2 dev tests: fixture paths (``make_flux2_dev_fixtures.py``), the
references, and the tiny Mistral encoder written whole (transformers names as safetensors, or
llama.cpp names as GGUF with its q/k rows permuted as llama.cpp's converter stores Llama
models and the Tekken tokenizer in its metadata)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from zimage_util import write_llm_gguf

FIX = Path(__file__).resolve().parent / "fixtures"
DIT = FIX / "flux2_dev_tiny.safetensors"
AE = FIX / "flux2_ae_tiny.safetensors"
PARTS = FIX / "mistral_flux2_parts.safetensors"
REF = FIX / "flux2_dev_ref.safetensors"
PROMPT = "a photo of a cat on a red sofa"
SIZE = 16
VOCAB = 131072
HEADS, KV_HEADS = 2, 1


def ref() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(REF))


def mistral_hf() -> dict[str, np.ndarray]:
    """The tiny encoder's tensors in transformers names (``model.`` prefix), embedding whole."""
    from safetensors.numpy import load_file

    parts = load_file(str(PARTS))
    ids, rows = parts.pop("embed.ids"), parts.pop("embed.rows")
    embed = np.zeros((VOCAB, rows.shape[1]), dtype=rows.dtype)
    embed[ids] = rows
    return {"model.embed_tokens.weight": embed, **parts}


def _permute(a: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: each head's two rotary halves interleaved."""
    return a.reshape(heads, 2, a.shape[0] // heads // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)


def write_llm(dst: Path, fmt: str = "safetensors", dtype: str = "f16") -> Path:
    """Write the tiny Mistral at ``dst``: ``safetensors`` (transformers names), or ``gguf``
    (``llama`` architecture, matrices in ``dtype``: ``f16`` or ``q8_0``, vectors f32, the
    shipped Tekken vocabulary as the file's tokenizer, pre-tokenizer ``tekken``)."""
    import gguf
    from safetensors.numpy import save_file
    from sdplan.core.text.bpe_tokenizer import BPETokenizer, _merges

    tensors = mistral_hf()
    if fmt == "safetensors":
        save_file(tensors, str(dst))
        return dst
    tok = BPETokenizer.mistral()
    w = gguf.GGUFWriter(str(dst), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("tekken")
    w.add_token_list(tok.tokens)
    w.add_token_types([3 if t in tok.special else 1 for t in tok.tokens])
    w.add_token_merges(_merges("mistral_vocab/merges.txt.gz"))

    def permuted(name: str, a: np.ndarray) -> np.ndarray:  # llama.cpp's rotary order of q and k rows
        if name.endswith("q_proj.weight"):
            return _permute(a, HEADS)
        return _permute(a, KV_HEADS) if name.endswith("k_proj.weight") else a

    write_llm_gguf(w, tensors, dtype, permuted)
    return dst
