"""The SD modules whose products run sdplan's bf16 kernel on CPUs that have one (UNet, VAE,
CLIP) against the diffusers/transformers references of the tiny fixtures, with the weights
held as ModuleRunner holds them (``WeightFile.hold_for(cpu, bf16=True)``: bf16 with AMX, f16 as
in the file with AVX512_BF16) and the graphs' ``f16_as_bf16`` set as the runner sets it, on every kernel path this CPU runs
(AMX, AVX512_BF16, off: f16 products as before).

Tolerance, max abs error / max |reference|: ``off`` (f16 weights, as before) the f16 tests'
own 5e-3 (test_models_clip's ``REL_TOL``); with the bf16 kernel 2e-2 (``BF16_REL_TOL``).
Measured (sd1 / sd2, AMX and AVX512_BF16 alike): UNet 1.3-1.4e-2 / 7.2e-3, VAE decode
1.2-1.25e-2 / 7.3e-3, CLIP 4.9e-3 / 5.0e-3; the f16 path: UNet 6.9e-4 / 6.2e-4, VAE 9.6e-4 /
9.2e-4, CLIP 5.3e-4 / 5.0e-4. bf16 keeps 8 significant bits against f16's 11:
weights and activations rounded to bf16 carry about 8x f16's rounding error, and the UNet's
residual stream accumulates it.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
from safetensors.numpy import load_file  # noqa: E402
from sdplan.core.modelfiles.checkpoint import read_model_files  # noqa: E402
from sdplan.core.models import clip, unet, vae  # noqa: E402
from sdplan.core.pipelines.sd.pipeline import module_weight_file  # noqa: E402
from sdplan.core.runtime import graph as gr  # noqa: E402
from test_bf16_kernels import ORDER, kernel_path  # noqa: E402
from test_models_clip import FIX, assert_close  # noqa: E402

BF16_REL_TOL = 2e-2


@pytest.fixture(scope="module")
def mgr():
    m = G.BackendManager(2)
    yield m
    m.close()


@pytest.fixture(params=ORDER)
def kernel(request):
    yield from kernel_path(request.param)


def tol(kernel_name: str) -> float:
    """The test's tolerance for the kernel path (see the module docstring)."""
    return 5e-3 if kernel_name == "off" else BF16_REL_TOL


def held(cpu, family: str, module: str, kernel_name: str):
    """The module's tensors read into one CPU buffer in the dtypes ModuleRunner holds them."""
    ms = read_model_files({"model": [FIX / f"{family}_tiny.safetensors"]})
    wf, names = module_weight_file(ms, module)
    wf.hold_for(cpu, bf16=True)
    kinds = set(wf.dtypes.values())
    # AMX: converted as they load; AVX512_BF16: the fixture's f16, rounded in the kernel
    assert ("bf16" in kinds) == (kernel_name == "amx"), kinds
    store = wf.new_store()
    buf = store.allocate(list(wf.infos), cpu)
    wf.read(store, list(wf.infos))
    return {n: store.tensor(s) for n, s in names.items()}, buf, store


@pytest.mark.parametrize("family", ["sd1", "sd2"])
def test_unet_in_bf16_matches_diffusers(mgr, kernel, family) -> None:
    cpu = mgr.get("CPU")
    w, buf, _ = held(cpu, family, "diffusion", kernel)
    ref = load_file(str(FIX / f"{family}_ref.safetensors"))
    cfg = unet.unet_config(w, family, head_dim=8 if family == "sd2" else None)
    g = gr.new_graph([cpu])
    g.f16_as_bf16 = True  # as ModuleRunner sets it for these modules
    x, t, c = g.input("x", (1, 4, 8, 8)), g.input("t", (1,)), g.input("c", (1, 77, 16))
    g.output("y", unet.unet(g, w, x, t, c, cfg))
    g.set_input("x", ref["unet_x"])
    g.set_input("t", ref["unet_t"])
    g.set_input("c", ref["context_cond"])
    g.compute()
    assert g.bf16_products is (kernel != "off")
    assert_close(g.get_output("y"), ref["unet_out"], tol(kernel))
    buf.free()


@pytest.mark.parametrize("family", ["sd1", "sd2"])
def test_vae_in_bf16_matches_diffusers(mgr, kernel, family) -> None:
    cpu = mgr.get("CPU")
    w, buf, _ = held(cpu, family, "vae", kernel)
    ref = load_file(str(FIX / f"{family}_ref.safetensors"))
    cfg = vae.vae_config(w)
    z = ref["vae_decode_in"]
    g = gr.new_graph([cpu])
    g.f16_as_bf16 = True  # as ModuleRunner sets it for these modules
    g.output("img", vae.vae_decode(g, w, g.input("z", z.shape), cfg))
    g.set_input("z", np.ascontiguousarray(z, dtype=np.float32))
    g.compute()
    assert g.bf16_products is (kernel != "off")
    assert_close(g.get_output("img"), ref["vae_decode_out"], tol(kernel))
    buf.free()


@pytest.mark.parametrize("family", ["sd1", "sd2"])
def test_clip_in_bf16_matches_transformers(mgr, kernel, family) -> None:
    cpu = mgr.get("CPU")
    w, buf, _ = held(cpu, family, "te", kernel)
    ref = load_file(str(FIX / f"{family}_ref.safetensors"))
    cfg = clip.clip_config(w, n_heads=2)
    assert cfg.layout == json.loads((FIX / "fixture_configs.json").read_text())[family]["clip_layout"]
    g = gr.new_graph([cpu])
    g.f16_as_bf16 = True  # as ModuleRunner sets it for these modules
    ids, mask = g.input("ids", (1, 77), "i32"), g.input("mask", (77, 77))
    g.output("h", clip.clip_text(g, w, ids, mask, cfg, 1, True))
    g.set_input("ids", ref["clip_input_ids"].astype(np.int32))
    g.set_input("mask", clip.causal_mask(77))
    g.compute()
    assert g.bf16_products is (kernel != "off")
    assert_close(g.get_output("h"), ref["clip_last_hidden_state"], tol(kernel))
    buf.free()


@pytest.mark.parametrize("kernel_name", ORDER)
def test_runner_runs_bf16_where_the_module_measured_faster(mgr, kernel_name) -> None:
    """UNet and CLIP take bf16 products with AMX and AVX512_BF16, the VAE with AMX only (its f16
    Winograd path measured as fast with AVX512_BF16 alone); the weights stay f16 either way
    (the graphs' ``f16_as_bf16`` rounds them in the kernel)."""
    from types import SimpleNamespace

    from sdplan.core.runtime.runner import BackendPool, ModulePlacement, ModuleRunner

    assert unet.UNetGraph.cpu_bf16_kernels == ("amx", "avx512") == clip.ClipGraph.cpu_bf16_kernels
    assert vae.VaeGraph.cpu_bf16_kernels == ("amx",)
    for _ in kernel_path(kernel_name):
        ms = read_model_files({"model": [FIX / "sd1_tiny.safetensors"]})
        for module, graph_cls in (("diffusion", unet.UNetGraph), ("vae", vae.VaeGraph)):
            wf, _ = module_weight_file(ms, module)
            model = SimpleNamespace(n_blocks=0, cpu_bf16_kernels=graph_cls.cpu_bf16_kernels,
                                    other_tensors=lambda: [], block_tensors=lambda i: [])
            r = ModuleRunner(model, wf, ModulePlacement(("CPU",)), BackendPool(mgr))
            assert r.bf16 == (kernel_name in graph_cls.cpu_bf16_kernels)
            assert ("bf16" in set(r.wf.dtypes.values())) == (r.bf16 and kernel_name == "amx")
            g, _ = r._new_graph(["CPU"])
            assert g.f16_as_bf16 == (r.bf16 and kernel_name != "amx")  # AMX: converted at load
            r.release()


@pytest.mark.parametrize("family", ["sd1", "sd2"])
def test_full_cfg_run_on_each_kernel_path_matches_diffusers(kernel, family) -> None:
    """The whole pipeline as a user runs it (prompt, 4 euler steps with CFG, decode; every
    module held as ModuleRunner holds it on this kernel path) against diffusers' fp32 run.

    Tolerances: the final latent 1e-2 x max |ref| on the f16 path (test_pipeline's), 4e-2 with
    the bf16 kernel; the picture within 2 levels of 255 (f16) and 8 (bf16) per channel, the
    mean difference within 0.5 (f16) and 1.5 (bf16) levels. Measured (sd1 / sd2): f16 latent
    1.9e-3 / 2.7e-3, picture max 1, mean 0.07 / 0.09; AVX512_BF16 1.5e-2 / 1.9e-2, max 3 / 4,
    mean 0.64 / 0.69; AMX 1.6e-2 / 2.1e-2, max 5 / 4, mean 0.73 / 0.86.
    """
    from sdplan.core.pipelines.sd.pipeline import GenerateParams
    from sdplan.core.pipelines.stages.results import image_to_uint8
    from test_pipeline import model, ref

    r = ref(family)
    with model(family) as sd:
        held = {name: runner.bf16 for name, runner in sd.runners.items()}
        latents: list[np.ndarray] = []
        p = GenerateParams("a photo of a cat", "", 16, 16, 4, float(r["run_cfg_scale"][0]), 1, "euler", "discrete")
        imgs = sd.txt2img(p, on_step=lambda i, n, x: latents.append(x), noise=r["run_noise"], sigmas=r["run_sigmas"])
    assert held["diffusion"] == (kernel != "off")
    assert held["vae"] == (kernel == "amx")
    want = r["run_final_latent"]
    err = float(np.abs(latents[-1] - want).max() / np.abs(want).max())
    diff = np.abs(imgs[0].astype(int) - image_to_uint8(r["run_image"][0]).astype(int))
    print(f"{family} {kernel}: latent {err:.2e}, picture max {diff.max()} mean {diff.mean():.3f}")
    assert err <= (1e-2 if kernel == "off" else 4e-2)
    assert diff.max() <= (2 if kernel == "off" else 8)
    assert diff.mean() <= (0.5 if kernel == "off" else 1.5)
