"""Shared helpers of the Z-Image / LLM-encoder tests: fixture paths, references, and the tiny
Qwen3 encoder written whole at test time (transformers names as safetensors, or llama.cpp
names as GGUF with the tokenizer in its metadata).

The fixture stores the encoder without its 151936-row token embedding (only the rows the
tests use are non-zero: ``embed.ids`` / ``embed.rows``); :func:`write_qwen3` puts them into a
full table of zeros.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from flux_util import rel_err as rel_err  # re-exported: one formula for all tests

FIX = Path(__file__).resolve().parent / "fixtures"
PARTS = FIX / "qwen3_tiny_parts.safetensors"
DIT = FIX / "z_image_tiny.safetensors"
AE = FIX / "flux_ae_tiny.safetensors"
REF = FIX / "zimage_ref.safetensors"
VOCAB = 151936
PROMPT = "a photo of a cat on a red sofa"

#: transformers -> llama.cpp GGUF names of a Qwen3 model (llama.cpp ``gguf-py``
#: ``tensor_mapping.py``; the real ``qwen3_4b_gguf`` layout in ../shared/models).
GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
              "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
              "post_attention_layernorm": "ffn_norm"}


def ref() -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(REF))


def qwen3_hf(parts_path: Path = PARTS) -> dict[str, np.ndarray]:
    """The tiny encoder's tensors in transformers names (``model.`` prefix), embedding whole."""
    from safetensors.numpy import load_file

    parts = load_file(str(parts_path))
    ids, rows = parts.pop("embed.ids"), parts.pop("embed.rows")
    embed = np.zeros((VOCAB, rows.shape[1]), dtype=rows.dtype)
    embed[ids] = rows
    return {"model.embed_tokens.weight": embed, **parts}


def gguf_name(name: str) -> str:
    """llama.cpp name of a transformers Qwen3 tensor name."""
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    _, _, i, rest = name.split(".", 3)
    for a, b in GGUF_NAMES.items():
        if rest.startswith(a + "."):
            return f"blk.{i}.{b}{rest[len(a):]}"
    raise KeyError(name)


def write_qwen3(dst: Path, fmt: str = "safetensors", dtype: str = "f16", parts: Path = PARTS) -> Path:
    """Write the tiny encoder of ``parts`` to ``dst``: ``safetensors`` (transformers names, as
    stored), or ``gguf`` with matrices in ``dtype`` (``f32``, ``f16``, ``q8_0``; vectors f32)
    and the Qwen tokenizer in its metadata (as llama.cpp's converter writes it)."""
    import gguf
    from safetensors.numpy import save_file
    from sdplan.core.text.bpe_tokenizer import BPETokenizer

    tensors = qwen3_hf(parts)
    if fmt == "safetensors":
        save_file(tensors, str(dst))
        return dst
    tok = BPETokenizer.qwen()
    w = gguf.GGUFWriter(str(dst), "qwen3")
    tokens = tok.tokens + [f"[PAD{i}]" for i in range(tok.vocab_size, VOCAB)]
    types = [3 if t in tok.special else 1 for t in tok.tokens] + [4] * (VOCAB - tok.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(qwen_merges())
    write_llm_gguf(w, tensors, dtype)
    return dst


def write_llm_gguf(w: object, tensors: dict[str, np.ndarray], dtype: str,
                   transform: Callable[[str, np.ndarray], np.ndarray] | None = None) -> None:
    """Add an LLM's ``tensors`` (transformers names) to the GGUF writer ``w`` in llama.cpp
    names, each first passed through ``transform(name, array)`` (f32) when given: vectors f32,
    matrices in ``dtype`` (``f32``, ``f16``, ``q8_0``; rows too short to quantise stay f16);
    then write the file and close it."""
    import gguf

    kinds = {"q8_0": gguf.GGMLQuantizationType.Q8_0}
    for name, arr in tensors.items():
        a = arr.astype(np.float32)
        if transform is not None:
            a = transform(name, a)
        if a.ndim != 2 or dtype == "f32":
            w.add_tensor(gguf_name(name), a)  # type: ignore[attr-defined]
        elif dtype == "f16" or a.shape[1] % 32:  # rows too short to quantise stay f16
            w.add_tensor(gguf_name(name), a.astype(np.float16))  # type: ignore[attr-defined]
        else:
            q = gguf.quants.quantize(a, kinds[dtype])
            w.add_tensor(gguf_name(name), q, raw_shape=q.shape, raw_dtype=kinds[dtype])  # type: ignore[attr-defined]
    w.write_header_to_file()  # type: ignore[attr-defined]
    w.write_kv_data_to_file()  # type: ignore[attr-defined]
    w.write_tensors_to_file()  # type: ignore[attr-defined]
    w.close()  # type: ignore[attr-defined]



def qwen_merges() -> list[str]:
    """The shipped Qwen merges (``resources/qwen_vocab/merges.txt.gz``), rank order."""
    import gzip
    from importlib import resources

    raw = resources.files("sdplan.resources").joinpath("qwen_vocab/merges.txt.gz").read_bytes()
    return [m for m in gzip.decompress(raw).decode("utf-8").split("\n") if m]
