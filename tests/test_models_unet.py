"""LDM UNet graphs against diffusers' UNet2DConditionModel for the tiny fixtures: SD1 (eps,
conv proj_in, 8 heads) and SD2 (v, linear proj_in, head width 8 in the tiny model), and the
hyper-parameters of the full-size SD 1.5 layout.

Tolerance: max abs error <= 5e-3 x max |reference| (measured about 1e-3 relative).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from sdplan.core.models import unet  # noqa: E402
from sdplan.core.runtime import graph as gr  # noqa: E402
from test_models_clip import FIX, assert_close, load  # noqa: E402


@pytest.fixture(scope="module")
def cpu():
    mgr = G.BackendManager(2)
    yield mgr.get("CPU")
    mgr.close()



@pytest.mark.parametrize("family", ["sd1", "sd2"])
def test_unet_matches_diffusers(cpu, family) -> None:
    mw, ref = load(cpu, family, "diffusion")
    conf = json.loads((FIX / "fixture_configs.json").read_text())[family]["unet"]
    cfg = unet.unet_config(mw.tensors, family, head_dim=8 if family == "sd2" else None)
    mc = conf["block_out_channels"][0]
    assert cfg.model_channels == mc
    assert cfg.channel_mult == tuple(c // mc for c in conf["block_out_channels"])
    assert cfg.num_res_blocks == conf["layers_per_block"]
    assert cfg.attention_levels == (0,)
    assert cfg.context_dim == conf["cross_attention_dim"]
    assert cfg.linear_proj == conf["use_linear_projection"]
    assert cfg.heads(32) == (8 if family == "sd1" else 4)
    g = gr.new_graph([cpu])
    x, t, c = g.input("x", (1, 4, 8, 8)), g.input("t", (1,)), g.input("c", (1, 77, 16))
    g.output("y", unet.unet(g, mw.tensors, x, t, c, cfg))
    for tk, ck, ok in [("unet_t", "context_cond", "unet_out"), ("unet_t2", "context_uncond", "unet_out2")]:
        g.set_input("x", ref["unet_x"])
        g.set_input("t", ref[tk])
        g.set_input("c", ref[ck])
        g.compute()  # the same graph, reused with new inputs
        assert_close(g.get_output("y"), ref[ok])
    mw.free()


def test_unet_rejects_bad_latent_size(cpu) -> None:
    mw, _ = load(cpu, "sd1", "diffusion")
    g = gr.new_graph([cpu])
    with pytest.raises(ValueError, match="not divisible by 2"):
        unet.unet(g, mw.tensors, g.input("x", (1, 4, 7, 8)), g.input("t", (1,)),
                  g.input("c", (1, 77, 16)))


def test_full_size_sd15_unet(shared_dir: Path, cpu) -> None:
    """SD 1.5 names and shapes (weights planned, not loaded): 320 channels, mult 1,2,4,4,
    2 ResBlocks per level, attention on levels 0-2, context 768, 8 heads; the graph builds and
    its compute buffer is measured at a 64x64 image."""
    layout = json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())["sd15_unet_ldm"]
    shapes = {k: tuple(v) for k, v in layout.items()}
    cfg = unet.unet_config(shapes, "sd1")
    assert (cfg.model_channels, cfg.channel_mult, cfg.num_res_blocks) == (320, (1, 2, 4, 4), 2)
    assert (cfg.attention_levels, cfg.transformer_depth, cfg.context_dim) == ((0, 1, 2), 1, 768)
    assert not cfg.linear_proj and cfg.heads(1280) == 8
    assert unet.unet_config(shapes, "sd2").heads(1280) == 20
    names = list(shapes)
    store = G.WeightStore([(f"w{i}", "f32" if len(shapes[n]) == 1 else "f16", list(shapes[n]))
                           for i, n in enumerate(names)])
    store.plan([f"w{i}" for i in range(len(names))], cpu)
    w = {n: store.tensor(f"w{i}") for i, n in enumerate(names)}
    g = gr.new_graph([cpu])
    y = unet.unet(g, w, g.input("x", (1, 4, 8, 8)), g.input("t", (1,)), g.input("c", (1, 77, 768)), cfg)
    assert y.shape == (1, 4, 8, 8)
    g.output("y", y)
    assert g.reserve()[0] > 0
