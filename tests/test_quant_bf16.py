"""Quantised weights (Q8_0, Q4_K, Q5_K from a GGUF file) in sdplan's bf16 product: each block
dequantised as ggml does and rounded to bf16 as it is used, against gguf-py's numpy
dequantisation (an independent reference):

- the stated tolerance: within 1e-2 of the output's largest magnitude of the f32 product with
  the dequantised weights (bf16 rounds weights and activations to 8 significant bits);
- the kernel really ran: within 1e-3 of the same product computed in float64 from the
  bf16-rounded activations and dequantised weights, where ggml's quantised product (which also
  quantises the activations to 8 bits per block) is several times further off (checked too);
- the weights stay quantised in memory (mapped from the file) as before.

Blocks are random bytes with sane scales, so every bit of the layouts (6-bit scales and mins,
nibbles, Q5_K's fifth bits) is exercised; K of 512 spans two K-quant super-blocks and 16 Q8_0
blocks per row, and shapes cover the rows path (many rows) and the column-block path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
gguf = pytest.importorskip("gguf")
from sdplan.core.runtime import graph as gr  # noqa: E402
from sdplan.core.runtime.devices import BackendManager  # noqa: E402
from sdplan.core.runtime.native import native  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402
from test_bf16_kernels import kernel_path  # noqa: E402

QT = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_k": gguf.GGMLQuantizationType.Q4_K,
      "q5_k": gguf.GGMLQuantizationType.Q5_K}


def random_blocks(qtype: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random quantised rows (uint8 [n, bytes per row]) with f16 scales about 0.02 / 16."""
    block, size = gguf.GGML_QUANT_SIZES[QT[qtype]]
    raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    scales = 2  # f16 fields at the start of each block: d, and dmin for the K-quants
    nf = 1 if qtype == "q8_0" else scales
    d = (rng.uniform(0.5, 1.5, (n, k // block, nf)) * (0.02 if qtype == "q8_0" else 0.002)).astype(np.float16)
    raw[:, :, :2 * nf] = d.view(np.uint8).reshape(n, k // block, 2 * nf)
    return raw.reshape(n, -1)


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (nearest even), returned as float32."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


class Linear:
    """One linear layer ``y = x @ w.T`` as a ModuleGraph whose products run in bf16 where the
    CPU has a bf16 kernel (as the DiTs' and text encoders' do)."""

    n_blocks = 0
    cpu_bf16_kernels = ("amx", "avx512")

    def block_tensors(self, i: int) -> list[str]:
        return []

    def other_tensors(self) -> list[str]:
        return ["w"]

    def input_specs(self, shapes):
        return {k: (tuple(v), "f32") for k, v in shapes.items()}

    def build_pre(self, g, w, ins):
        return dict(ins)

    def build_post(self, g, w, st):
        return {"y": gr.linear(g, st["x"], w("w"))}


@pytest.fixture(params=["avx512", "amx"])
def kernel(request):
    """Each bf16 kernel this CPU runs (the suite's default is off)."""
    yield from kernel_path(request.param)


@pytest.fixture(scope="module")
def pool():
    p = BackendPool(BackendManager(cpu_threads=2))
    yield p
    p.manager.close()


def write_gguf(path: Path, qtype: str, raw: np.ndarray) -> None:
    w = gguf.GGUFWriter(str(path), "test")
    w.add_tensor("w", raw, raw_dtype=QT[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run(pool, path: Path, x: np.ndarray, quant_as_bf16: bool | None = None) -> tuple[np.ndarray, ModuleRunner]:
    r = ModuleRunner(Linear(), WeightFile(path), ModulePlacement(("CPU",)), pool, n_threads=2)
    if quant_as_bf16 is not None:  # every graph the runner builds from now on
        make = r._new_graph

        def new_graph(devices, make=make):
            g, names = make(devices)
            g.quant_as_bf16 = quant_as_bf16
            return g, names

        r._new_graph = new_graph  # type: ignore[method-assign]
    return r.run({"x": x})["y"], r


@pytest.mark.skipif(native().bf16_cpu_kernel() == "off", reason="the CPU has no bf16 kernel")
@pytest.mark.parametrize("qtype", ["q8_0", "q4_k", "q5_k"])
@pytest.mark.parametrize("rows", [40, 600], ids=["columns", "rows"])
def test_quantised_weights_in_the_bf16_product(qtype: str, rows: int, kernel: str, pool, tmp_path: Path) -> None:
    rng = np.random.default_rng({"q8_0": 1, "q4_k": 2, "q5_k": 3}[qtype])
    n, k = 80, 512
    raw = random_blocks(qtype, n, k, rng)
    deq = gguf.quants.dequantize(raw, QT[qtype]).reshape(n, k).astype(np.float32)
    assert np.isfinite(deq).all() and deq.std() > 1e-3
    path = tmp_path / f"w_{qtype}.gguf"
    write_gguf(path, qtype, raw)
    x = rng.standard_normal((1, rows, k), dtype=np.float32)
    y, r = run(pool, path, x)
    assert r.bf16  # the module's products run in bf16 here
    assert r.wf.dtypes["w"] == qtype  # held quantised, not dequantised at load
    assert all(b.wb.mapped for b in r._bufs)  # mapped from the file
    exact = x[0].astype(np.float64) @ deq.T.astype(np.float64)
    scale = np.abs(exact).max()
    assert np.abs(y[0] - exact).max() <= 1e-2 * scale  # the stated tolerance
    emulated = bf16(x[0]).astype(np.float64) @ bf16(deq).T.astype(np.float64)
    ours = np.abs(y[0] - emulated).max() / scale
    assert ours <= 1e-3, ours
    # ggml's quantised product on the same file: 8-bit activations, further from the emulation
    y_ggml, r2 = run(pool, path, x, quant_as_bf16=False)
    theirs = np.abs(y_ggml[0] - emulated).max() / scale
    assert np.abs(y_ggml[0] - exact).max() <= 2e-2 * scale
    assert theirs > 2 * ours, (theirs, ours)
    r.release()
    r2.release()


@pytest.mark.parametrize("qtype", ["q8_0", "q4_k"])
def test_without_a_bf16_kernel_ggml_multiplies(qtype: str, pool, tmp_path: Path) -> None:
    """Without the bf16 kernel (the suite's default, and any CPU without one) ggml multiplies the
    quantised weights, within tolerance of the reference."""
    rng = np.random.default_rng(9)
    n, k = 64, 512
    raw = random_blocks(qtype, n, k, rng)
    deq = gguf.quants.dequantize(raw, QT[qtype]).reshape(n, k).astype(np.float32)
    path = tmp_path / f"v_{qtype}.gguf"
    write_gguf(path, qtype, raw)
    x = rng.standard_normal((1, 50, k), dtype=np.float32)
    y, r = run(pool, path, x)
    assert not r.bf16
    exact = x[0].astype(np.float64) @ deq.T.astype(np.float64)
    assert np.abs(y[0] - exact).max() <= 2e-2 * np.abs(exact).max()
    r.release()
