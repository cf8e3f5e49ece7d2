"""The DiTs and text encoders whose products run in bf16 with sdplan's AMX kernel, and with
AVX512_BF16 where it measured fast on the CPU at hand (``cpu_bf16_kernels = ("amx",
"avx512_fast")``: FluxDiT with Chroma and FLUX.2 klein, ZImageDiT, MMDiT, T5Encoder,
LLMEncoder; sdplan.core.runtime.bf16_rule) against the diffusers/transformers references of
their tiny fixtures, run as ModuleRunner runs them, on every kernel path this CPU runs:
``off`` f16 products; ``avx512`` bf16 products where ``avx512_bf16_speedup()`` reaches
``FAST_SPEEDUP`` (a Zen 4 EPYC: 1.6-2.3), else f16; ``amx`` bf16 (weights converted as they load).

Tolerance, max abs error / max |reference| (the families' tests' ``rel_err``): the f16 path the
families' own 2e-3 (T5: 5e-3, its f16 GELU table); bf16 ``BF16_TOL`` 2e-2 as the SD modules'
(test_bf16_models.py), T5 4e-2 (8x its f16 tolerance, as bf16's rounding is 8x f16's).
Measured with AMX (2 threads): FLUX.1 schnell 4.1e-3, dev 4.4e-3, Chroma 4.5e-3, FLUX.2
klein 4.3e-3, Z-Image 6.7e-3 / 1.47e-2, SD3 MMDiT 3.1e-3, T5 2.9e-2, Qwen3 2.2e-3; the f16
path 4.5e-5 to 3.7e-4 (T5 3.2e-3); with AVX512_BF16 on a Zen 4 EPYC (f16 weights rounded in
the kernel) FLUX.1 schnell 4.1e-3, dev 4.4e-3, Chroma 4.5e-3, FLUX.2 klein 4.3e-3, Z-Image
7.3e-3 / 9.8e-3, SD3 3.1e-3, T5 1.1e-2, Qwen3 5.2e-4 (the Z-Image pipeline: context 4.3e-4,
latent 3.0e-3). bf16 keeps 8 significant bits against f16's 11; files
published in bf16 (Z-Image, Qwen3, FLUX.2) lose nothing by it, and the T5 files users run
most are fp8 or quantized, far coarser.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from flux_util import AXES, CHROMA, CHROMA_REF, DEV, SCHNELL, T5, rel_err  # noqa: E402
from flux_util import ref as flux_ref  # noqa: E402
from sdplan.core.models.chroma import ChromaDiT  # noqa: E402
from sdplan.core.models.flux import FluxDiT, unpatchify  # noqa: E402
from sdplan.core.models.flux2 import Flux2DiT  # noqa: E402
from sdplan.core.models.llm import LLMEncoder  # noqa: E402
from sdplan.core.models.mmdit import MMDiT, unpatch  # noqa: E402
from sdplan.core.models.t5 import T5Encoder  # noqa: E402
from sdplan.core.models.z_image import ZImageDiT  # noqa: E402
from sdplan.core.models.z_image import unpatchify as z_unpatchify  # noqa: E402
from sdplan.core.pipelines.stages.flow_dit import shapes  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner  # noqa: E402
from sdplan.core.runtime.weights import WeightFile  # noqa: E402
from test_bf16_kernels import ORDER, kernel_path  # noqa: E402

BF16_TOL = 2e-2


def bf16_products(kernel: str) -> bool:
    """Whether these modules run their products in bf16 on this kernel path (bf16_rule)."""
    from sdplan.core.runtime.bf16_rule import FAST_SPEEDUP, avx512_bf16_speedup

    return kernel == "amx" or (kernel == "avx512" and avx512_bf16_speedup() >= FAST_SPEEDUP)


@pytest.fixture(scope="module")
def pool():
    p = BackendPool(G.BackendManager(2))
    yield p
    p.manager.close()


@pytest.fixture(params=ORDER)
def kernel(request):
    yield from kernel_path(request.param)


def _run(pool, model: Any, path: Any, make_inputs: Callable[[], dict], dtypes: dict | None = None,
         names: list[str] | None = None) -> tuple[dict[str, np.ndarray], set[str]]:
    """The module's outputs on one CPU and the dtypes its matrices are held in, with
    ``"bf16 products"`` added where the runner runs them in bf16."""
    wf = WeightFile(path, names, dtypes=dtypes, backend=pool.get("CPU"))
    r = ModuleRunner(model, wf, ModulePlacement(("CPU",)), pool, n_threads=2)
    try:
        held = {d for n, d in r.wf.dtypes.items() if len(r.wf.infos[n].shape) >= 2}
        if r.bf16:
            held.add("bf16 products")
        return r.run(make_inputs()), held
    finally:
        r.release()


def flux(pool, name: str) -> tuple[np.ndarray, np.ndarray, set[str]]:
    R = flux_ref()
    path = {"schnell": SCHNELL, "dev": DEV}[name]
    mod = FluxDiT.from_weights(shapes(path), axes=AXES)
    out, held = _run(pool, mod, path, lambda: mod.inputs(R["dit_latent"], R["dit_txt"], R["dit_y"],
                                                          float(R["dit_t"][0]), float(R["dit_guidance"][0])))
    return unpatchify(out["out"], 8, 8), R[f"dit_{name}_out"], held


def chroma(pool) -> tuple[np.ndarray, np.ndarray, set[str]]:
    R = flux_ref(CHROMA_REF)
    mod = ChromaDiT.from_weights(shapes(CHROMA), axes=AXES)
    keep = int(R["dit_keep"][0])
    out, held = _run(pool, mod, CHROMA, lambda: mod.inputs(R["dit_latent"], R["dit_txt"][:, :keep], None,
                                                           float(R["dit_t"][0])))
    return unpatchify(out["out"], 8, 8), R["dit_masked"], held


def flux2(pool) -> tuple[np.ndarray, np.ndarray, set[str]]:
    from flux2_util import DIT, ref

    R = ref()
    mod = Flux2DiT.from_weights(shapes(DIT))
    lat = R["dit_a.latent"]
    refs = [R[k] for k in sorted(R) if k.startswith("dit_a.ref")]
    out, held = _run(pool, mod, DIT, lambda: mod.inputs(lat, R["dit_a.context"], float(R["dit_a.sigma"][0]), refs))
    return out["out"][:, : lat.shape[2] * lat.shape[3]], R["dit_a.out"], held


def z_image(pool, case: str) -> tuple[np.ndarray, np.ndarray, set[str]]:
    from zimage_util import DIT, ref

    R = ref()
    mod = ZImageDiT.from_weights(shapes(DIT))
    lat = R[f"dit_{case}.latent"]
    out, held = _run(pool, mod, DIT, lambda: mod.inputs(lat, R[f"dit_{case}.context"], float(R[f"dit_{case}.sigma"][0])),
                     dtypes={"x_pad_token": "f32", "cap_pad_token": "f32"})
    return z_unpatchify(out["out"], lat.shape[2], lat.shape[3]), R[f"dit_{case}.out"], held


def sd3(pool) -> tuple[np.ndarray, np.ndarray, set[str]]:
    from sd3_util import SD3, ref

    R = ref()
    mod = MMDiT.from_weights(shapes(SD3))
    names = mod.other_tensors() + [n for i in range(mod.n_blocks) for n in mod.block_tensors(i)]
    out, held = _run(pool, mod, SD3, lambda: mod.inputs(R["dit_latent"], R["dit_context"], R["dit_pooled"],
                                                         float(R["dit_t"][0]) / 1000), names=names)
    return unpatch(out["out"], 8, 8), R["dit_out"], held


def t5(pool) -> tuple[np.ndarray, np.ndarray, set[str]]:
    R = flux_ref()
    enc = T5Encoder.from_weights(shapes(T5))
    out, held = _run(pool, enc, T5, lambda: enc.inputs(R["t5_ids"]))
    return out["hidden"], R["t5_hidden"], held


def qwen3(pool, tmp_path) -> tuple[np.ndarray, np.ndarray, set[str]]:
    from zimage_util import ref, write_qwen3

    R = ref()
    path = write_qwen3(tmp_path / "qwen_3_tiny.safetensors")
    enc = LLMEncoder.from_weights(shapes(path))
    out, held = _run(pool, enc, path, lambda: enc.inputs(R["llm.ids"]))
    return out["hidden"], R["llm.hidden_final"], held


CASES = {
    "flux-schnell": (lambda pool, tmp: flux(pool, "schnell"), 2e-3, BF16_TOL),
    "flux-dev": (lambda pool, tmp: flux(pool, "dev"), 2e-3, BF16_TOL),
    "chroma": (lambda pool, tmp: chroma(pool), 2e-3, BF16_TOL),
    "flux2-klein": (lambda pool, tmp: flux2(pool), 2e-3, BF16_TOL),
    "z_image-a": (lambda pool, tmp: z_image(pool, "a"), 2e-3, BF16_TOL),
    "z_image-b": (lambda pool, tmp: z_image(pool, "b"), 2e-3, BF16_TOL),
    "sd3-mmdit": (lambda pool, tmp: sd3(pool), 2e-3, BF16_TOL),
    "t5": (lambda pool, tmp: t5(pool), 5e-3, 4e-2),
    "qwen3": (qwen3, 2e-3, BF16_TOL),
}


@pytest.mark.parametrize("case", list(CASES))
def test_module_on_each_kernel_path_matches_reference(pool, kernel, case, tmp_path) -> None:
    build, f16_tol, bf16_tol = CASES[case]
    got, want, held = build(pool, tmp_path)
    err = rel_err(got, want)
    print(f"{case} {kernel}: held {sorted(held)}, error {err:.2e}")
    bf16 = bf16_products(kernel)
    assert ("bf16 products" in held) == bf16, held
    assert ("bf16" in held) == (kernel == "amx"), held  # AVX512_BF16: f16 rounded in the kernel
    assert err < (bf16_tol if bf16 else f16_tol)


def test_classes_list_amx_and_fast_avx512() -> None:
    """What bench/bench_cpu_bf16_families.py measured: AMX 0.12-0.51x the f16 path's time for
    every one of these modules; AVX512_BF16 alone 0.50-0.58x on a Zen 4 EPYC, 0.75-1.03x on a
    Xeon (so: where it measures fast, bf16_rule)."""
    for cls in (FluxDiT, ChromaDiT, Flux2DiT, ZImageDiT, MMDiT, T5Encoder, LLMEncoder):
        assert cls.cpu_bf16_kernels == ("amx", "avx512_fast"), cls


def test_fast_avx512_rule() -> None:
    """avx512_fast counts only with the avx512 kernel in use and a measured speed-up of at
    least FAST_SPEEDUP; listed kernels count as they are."""
    from sdplan.core.runtime.kernels import CpuKernels

    for kernel, speedup, kernels, want in [
        ("avx512", 1.9, ("amx", "avx512_fast"), True),
        ("avx512", 1.2, ("amx", "avx512_fast"), False),
        ("avx512", 1.2, ("amx", "avx512"), True),
        ("amx", 0.0, ("amx", "avx512_fast"), True),
        ("off", 0.0, ("amx", "avx512_fast"), False),
        ("avx512", 1.9, ("amx",), False),
    ]:
        choice = CpuKernels(bf16=kernel, cpu_bf16=kernel, fma_gemm=True, wino="avx512", glu="avx512")
        assert choice.holds_bf16(kernels, lambda s=speedup: s) is want, (kernel, speedup, kernels)


def test_measured_speedup_where_the_cpu_runs_avx512_bf16() -> None:
    """The measurement itself: a positive ratio where the avx512 kernel runs, 0.0 elsewhere."""
    from sdplan.core.runtime.bf16_rule import avx512_bf16_speedup

    for _ in kernel_path("avx512"):
        s = avx512_bf16_speedup()
        assert 0.2 < s < 10.0, s  # a time ratio of the same product, not a default
    for _ in kernel_path("off"):
        assert avx512_bf16_speedup() == 0.0


def test_z_image_pipeline_on_each_kernel_path_matches_diffusers(kernel, tmp_path) -> None:
    """The whole Z-Image Turbo run as a user makes it (Qwen3 encoder, 4 euler steps, decode; each
    module held as ModuleRunner holds it on this kernel path) against diffusers' ZImagePipeline.
    Tolerances: the f16 path test_pipeline_z_image's 3e-3 for the context and the final latent,
    the bf16 path 2e-2. Measured: f16 context 3.0e-5, latent 6.7e-5; AMX 2.5e-3 and 2.3e-3 (the
    DiT, the Qwen3 encoder and the VAE all in bf16)."""
    from sdplan.core.pipelines.z_image.pipeline import ZImageModels, ZImagePipeline
    from zimage_util import AE, DIT, PROMPT, ref, write_qwen3

    R = ref()
    llm = write_qwen3(tmp_path / "qwen_3_tiny.safetensors")
    pool = BackendPool(G.BackendManager(1))
    pipe = ZImagePipeline(ZImageModels(DIT, llm, AE), pool=pool, n_threads=2)
    try:
        out = pipe.txt2img(PROMPT, 16, 16, steps=4, noise=R["pipe.noise"], vae_scale=2)
        context = pipe.encode_prompt(PROMPT)
        held = {name: r.bf16 for name, r in pipe.runners.items()}
    finally:
        pipe.close()
        pool.manager.close()
    errs = rel_err(context, R["llm.hidden_m2"]), rel_err(out["latent"], R["pipe.latent"])
    print(f"z_image {kernel}: held {held}, context {errs[0]:.2e}, latent {errs[1]:.2e}")
    bf16 = bf16_products(kernel)
    assert held["diffusion"] == held["llm"] == bf16 and held["vae"] == (kernel == "amx"), held
    tol = BF16_TOL if bf16 else 3e-3
    assert errs[0] < tol and errs[1] < tol
    assert np.isfinite(out["image"]).all()
