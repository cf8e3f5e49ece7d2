"""Z-Image on sdplan's engine against diffusers / transformers on the CPU, same threads, as
ratios: one main layer of the Z-Image DiT at its real size (width 3840, 30 heads of 128,
feed-forward 10240, adaLN from 256) on a 256x256 image's tokens (256 image + 32 text), and
the Qwen3-4B text encoder at its real width (2560, 32 query / 8 key-value heads of 128, MLP
9728) with ``--llm-blocks`` of its 36 blocks (vocabulary cut to 4096 rows: the lookup does
not change the time) on a ``--tokens`` prompt.

sdplan runs random f16 weights as a user's f16 file runs (bf16 products where the CPU has AMX,
or AVX512_BF16 measured fast: the modules' ``cpu_bf16_kernels``, core/runtime/bf16_rule.py;
else f16 products); the references run their modules
in float32, torch's CPU default, and in bfloat16, in a subprocess
with the reference interpreter (``--ref-python``, default the checkout's ``.venv-ref``, else
/work/venv-ref; torch 2.13 CPU). Best of ``--repeat`` calls after one warm-up.

Usage: ``python bench/bench_zimage.py [--threads 2] [--repeat 3] [--llm-blocks 2]
[--tokens 128]``. Prints figures and ratios (sdplan / reference), asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import _timing
import numpy as np

REPO = Path(__file__).resolve().parent.parent
#: The checkout's reference environment when it has one (``.venv-ref``), else the shared one.
REF_PYTHON = next((p for p in (REPO / ".venv-ref/bin/python", Path("/work/venv-ref/bin/python")) if p.exists()),
                  Path("python"))
WIDTH, HEADS, FFN, ADALN, AXES = 3840, 30, 10240, 256, (32, 48, 48)
LLM = dict(hidden_size=2560, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
           intermediate_size=9728, vocab_size=4096, rms_norm_eps=1e-6)

REF_CODE = r'''
import json, sys, time, torch
a = json.loads(sys.argv[1])
torch.set_num_threads(a["threads"]); torch.set_grad_enabled(False); torch.manual_seed(0)
def best(fn):
    fn(); ts = []
    for _ in range(a["repeat"]):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return min(ts)
from diffusers.models.transformers.transformer_z_image import RopeEmbedder, ZImageTransformerBlock
blk = ZImageTransformerBlock(0, a["width"], a["heads"], a["heads"], 1e-5, True, modulation=True).eval()
n = a["img"] + a["txt"]
ids = torch.zeros(n, 3, dtype=torch.int64); ids[:, 0] = torch.arange(n) % 1024
freqs = RopeEmbedder(256.0, [32, 48, 48], [1024, 512, 512])(ids).unsqueeze(0)
x = torch.randn(1, n, a["width"]); c = torch.randn(1, a["adaln"])
out = {"block": best(lambda: blk(x, None, freqs, c))}
blk = blk.to(torch.bfloat16)
xb, cb = x.to(torch.bfloat16), c.to(torch.bfloat16)
out["block_bf16"] = best(lambda: blk(xb, None, freqs, cb))
del blk
from transformers import Qwen3Config, Qwen3Model
llm = Qwen3Model(Qwen3Config(num_hidden_layers=a["llm_blocks"], **a["llm"])).eval()
tok = torch.randint(0, a["llm"]["vocab_size"], (1, a["tokens"]))
out["encoder"] = best(lambda: llm(input_ids=tok))
llm = llm.to(torch.bfloat16)
out["encoder_bf16"] = best(lambda: llm(input_ids=tok))
print(json.dumps(out))
'''


def write_block(path: Path, seed: int = 0) -> None:
    """One Z-Image main layer (``layers.0.``) with random f16 matrices, f32 vectors."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    p = "layers.0."

    def mat(o: int, i: int) -> np.ndarray:
        return (rng.standard_normal((o, i), dtype=np.float32) / np.sqrt(i)).astype(np.float16)

    t = {p + "attention.qkv.weight": mat(3 * WIDTH, WIDTH), p + "attention.out.weight": mat(WIDTH, WIDTH),
         p + "feed_forward.w1.weight": mat(FFN, WIDTH), p + "feed_forward.w3.weight": mat(FFN, WIDTH),
         p + "feed_forward.w2.weight": mat(WIDTH, FFN), p + "adaLN_modulation.0.weight": mat(4 * WIDTH, ADALN),
         p + "adaLN_modulation.0.bias": np.zeros(4 * WIDTH, np.float32)}
    for n in ("attention.q_norm", "attention.k_norm"):
        t[p + n + ".weight"] = np.ones(WIDTH // HEADS, np.float32)
    for n in ("attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"):
        t[p + n + ".weight"] = np.ones(WIDTH, np.float32)
    save_file(t, str(path))


def write_llm(path: Path, blocks: int, seed: int = 1) -> None:
    """A Qwen3-4B-width model of ``blocks`` blocks in transformers names, f16 matrices."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    h, hd, ffn = LLM["hidden_size"], LLM["head_dim"], LLM["intermediate_size"]
    q, kv = LLM["num_attention_heads"] * hd, LLM["num_key_value_heads"] * hd

    def mat(o: int, i: int) -> np.ndarray:
        return (rng.standard_normal((o, i), dtype=np.float32) / np.sqrt(i)).astype(np.float16)

    t = {"model.embed_tokens.weight": mat(LLM["vocab_size"], h), "model.norm.weight": np.ones(h, np.float32)}
    for i in range(blocks):
        p = f"model.layers.{i}."
        t |= {p + "self_attn.q_proj.weight": mat(q, h), p + "self_attn.k_proj.weight": mat(kv, h),
              p + "self_attn.v_proj.weight": mat(kv, h), p + "self_attn.o_proj.weight": mat(h, q),
              p + "mlp.gate_proj.weight": mat(ffn, h), p + "mlp.up_proj.weight": mat(ffn, h),
              p + "mlp.down_proj.weight": mat(h, ffn)}
        for n in ("self_attn.q_norm", "self_attn.k_norm"):
            t[p + n + ".weight"] = np.ones(hd, np.float32)
        for n in ("input_layernorm", "post_attention_layernorm"):
            t[p + n + ".weight"] = np.ones(h, np.float32)
    save_file(t, str(path))


class OneBlock:
    """The Z-Image DiT's main layer 0 alone as a ModuleGraph: inputs ``x`` (1, L, 3840),
    ``cond`` (1, 256), ``pe_cos`` / ``pe_sin`` (L, 1, 64, 1); output ``x``. Its weights are
    held as the whole DiT's are (``cpu_bf16_kernels``: bf16 where the CPU has AMX)."""

    n_blocks = 1

    def __init__(self) -> None:
        from sdplan.core.models.z_image import ZImageConfig, ZImageDiT

        self.cpu_bf16_kernels = ZImageDiT.cpu_bf16_kernels
        self.dit = ZImageDiT(ZImageConfig("", 16, WIDTH, HEADS, HEADS, WIDTH // HEADS, FFN, 2560, ADALN,
                                          1, 0, 0, AXES))

    def block_tensors(self, i: int) -> list[str]:
        return self.dit.block_tensors(0)

    def other_tensors(self) -> list[str]:
        return []

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        return {k: (tuple(v), "f32") for k, v in shapes.items()}

    def build_pre(self, g: Any, w: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return dict(inputs)

    def build_block(self, g: Any, w: Any, i: int, state: dict[str, Any]) -> dict[str, Any]:
        return self.dit.build_block(g, w, 0, state)

    def build_post(self, g: Any, w: Any, state: dict[str, Any]) -> dict[str, Any]:
        return {"x": state["x"]}


def bench_sdplan(tmp: Path, a: argparse.Namespace, img: int, txt: int) -> dict[str, float]:
    from sdplan.core.models.flux import rope_tables
    from sdplan.core.models.llm import LLMEncoder
    from sdplan.core.models.z_image import THETA, position_ids
    from sdplan.core.pipelines.stages.flow_dit import shapes as _shapes
    from sdplan.core.runtime.devices import BackendManager
    from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner
    from sdplan.core.runtime.weights import WeightFile

    rng = np.random.default_rng(0)
    side = int(round(np.sqrt(img))) * 2
    cos, sin = rope_tables(position_ids(txt, side, side), AXES, THETA)
    ins = {"x": rng.standard_normal((1, cos.shape[0], WIDTH)).astype(np.float32),
           "cond": rng.standard_normal((1, ADALN)).astype(np.float32),
           "pe_cos": cos[:, None, :, None].copy(), "pe_sin": sin[:, None, :, None].copy()}
    out: dict[str, float] = {}
    with BackendManager(cpu_threads=a.threads) as m:
        pool = BackendPool(m)
        block = tmp / "z_image_block.safetensors"
        write_block(block)
        for name, flash in (("block", False), ("block_flash", True)):
            model = OneBlock()
            model.dit.flash = flash
            r = ModuleRunner(model, WeightFile(block), ModulePlacement(("CPU",)), pool, n_threads=a.threads)
            out[name] = _timing.best(lambda r=r: r.run(ins), a.repeat, warmup=1)
            r.release()
        block.unlink()
        llm = tmp / "qwen3_4b_width.safetensors"
        write_llm(llm, a.llm_blocks)
        enc = LLMEncoder.from_weights(_shapes(llm))
        r = ModuleRunner(enc, WeightFile(llm), ModulePlacement(("CPU",)), pool, n_threads=a.threads)
        ids = enc.inputs(rng.integers(0, LLM["vocab_size"], (1, a.tokens)))
        out["encoder"] = _timing.best(lambda: r.run(ids), a.repeat, warmup=1)
        r.release()
        llm.unlink()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--llm-blocks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128, help="prompt tokens (template included)")
    ap.add_argument("--ref-python", default=str(REF_PYTHON))
    a = ap.parse_args()
    img, txt = 256, 32  # 256x256: a 32x32 latent in 2x2 patches; text padded to 32
    with tempfile.TemporaryDirectory(prefix="sdplan-bench-zimage-") as d:
        ours = bench_sdplan(Path(d), a, img, txt)
    arg = json.dumps({"threads": a.threads, "repeat": a.repeat, "width": WIDTH, "heads": HEADS, "adaln": ADALN,
                      "img": img, "txt": txt, "llm": LLM, "llm_blocks": a.llm_blocks, "tokens": a.tokens})
    res = subprocess.run([a.ref_python, "-c", REF_CODE, arg], capture_output=True, text=True, check=True)
    ref = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"Z-Image main layer, {img + txt} tokens; Qwen3-4B width, {a.llm_blocks} blocks, {a.tokens} tokens; "
          f"{a.threads} thread(s)")
    print(f"{'':22} {'sdplan s':>10} {'torch fp32 s':>13} {'ratio':>7} {'torch bf16 s':>13} {'ratio':>7}")
    for key, label, rkey in (("block", "DiT layer", "block"), ("block_flash", "DiT layer (flash attn)", "block"),
                             ("encoder", "Qwen3 encoder", "encoder")):
        bf = ref.get(rkey + "_bf16")
        tail = f" {bf:13.3f} {ours[key] / bf:7.2f}" if bf else ""
        print(f"{label:22} {ours[key]:10.3f} {ref[rkey]:13.3f} {ours[key] / ref[rkey]:7.2f}{tail}")
    print(json.dumps({"sdplan": ours, "reference": ref}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
