"""CLIP text encoder graphs against transformers' outputs for the tiny SD1 (OpenAI layout,
quick-GELU) and SD2 (OpenCLIP layout, fused in_proj, GELU) fixtures.

Tolerance: max abs error <= 5e-3 x max |reference| (fp16 weights, f32 activations; measured
about 6e-4 relative).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("sdplan._ggml has no Graph in this build", allow_module_level=True)
from safetensors.numpy import load_file  # noqa: E402
from sdplan.core.modelfiles.checkpoint import read_model_files  # noqa: E402
from sdplan.core.models import clip  # noqa: E402
from sdplan.core.pipelines.sd.pipeline import module_weight_file  # noqa: E402
from sdplan.core.runtime import graph as gr  # noqa: E402

FIX = Path(__file__).parent / "fixtures"
REL_TOL = 5e-3


@pytest.fixture(scope="module")
def cpu():
    mgr = G.BackendManager(2)
    yield mgr.get("CPU")
    mgr.close()


class Loaded:
    """A module's weights read into one CPU buffer: ``tensors`` (checkpoint name -> tensor)."""

    def __init__(self, cpu, family: str, module: str) -> None:
        ms = read_model_files({"model": [FIX / f"{family}_tiny.safetensors"]})
        wf, names = module_weight_file(ms, module)
        self.store = wf.new_store()
        self.buffer = self.store.allocate(list(wf.infos), cpu)
        wf.read(self.store, list(wf.infos))
        self.tensors = {n: self.store.tensor(s) for n, s in names.items()}

    def free(self) -> None:
        self.buffer.free()


def load(cpu, family: str, module: str) -> tuple[Loaded, dict[str, np.ndarray]]:
    return Loaded(cpu, family, module), load_file(str(FIX / f"{family}_ref.safetensors"))


def assert_close(got: np.ndarray, ref: np.ndarray, rel: float = REL_TOL) -> float:
    assert got.shape == ref.shape, (got.shape, ref.shape)
    err = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert err <= rel, f"relative max error {err:.2e} > {rel:.0e}"
    return err


@pytest.mark.parametrize("family", ["sd1", "sd2"])
@pytest.mark.parametrize("skip,final_ln,key", [
    (1, True, "clip_last_hidden_state"),
    (2, False, "clip_penultimate_hidden_state"),
    (2, True, "clip_penultimate_final_ln"),
])
def test_clip_matches_transformers(cpu, family, skip, final_ln, key) -> None:
    mw, ref = load(cpu, family, "te")
    cfg = clip.clip_config(mw.tensors, n_heads=2)
    expect = json.loads((FIX / "fixture_configs.json").read_text())[family]
    assert cfg.layout == expect["clip_layout"]
    assert (cfg.width, cfg.n_layers, cfg.mlp_width) == (16, 2, 32)
    assert cfg.activation == ("gelu_quick" if family == "sd1" else "gelu_erf")
    g = gr.new_graph([cpu])
    ids = g.input("ids", (1, 77), "i32")
    mask = g.input("mask", (77, 77))
    g.output("h", clip.clip_text(g, mw.tensors, ids, mask, cfg, skip, final_ln))
    g.set_input("ids", ref["clip_input_ids"].astype(np.int32))
    g.set_input("mask", clip.causal_mask(77))
    g.compute()
    assert_close(g.get_output("h"), ref[key])
    mw.free()


def test_causal_mask_and_bad_clip_skip(cpu) -> None:
    m = clip.causal_mask(4)
    assert np.isneginf(m[0, 1]) and m[1, 0] == 0 and m[3, 3] == 0
    mw, _ = load(cpu, "sd1", "te")
    g = gr.new_graph([cpu])
    with pytest.raises(ValueError, match="clip_skip must be in 1..2"):
        clip.clip_text(g, mw.tensors, g.input("ids", (1, 77), "i32"), g.input("m", (77, 77)),
                       clip.clip_config(mw.tensors, 2), clip_skip=3)


def test_full_size_clip_l_layout(shared_dir: Path, cpu) -> None:
    """CLIP ViT-L/14 names and shapes (no weights): 12 layers, width 768, 12 heads; builds."""
    layout = json.loads((shared_dir / "models/real_size_key_layouts.json").read_text())["clip_l_hf"]
    prefix = "cond_stage_model.transformer.text_model."
    shapes = {prefix + k: tuple(v) for k, v in layout.items()}
    cfg = clip.clip_config(shapes)
    assert (cfg.layout, cfg.width, cfg.n_layers, cfg.n_heads, cfg.mlp_width, cfg.vocab) == (
        "openai", 768, 12, 12, 3072, 49408)
    store = G.WeightStore([(f"w{i}", "f32" if len(s) == 1 else "f16", list(s))
                           for i, s in enumerate(shapes.values())])
    w = {n: store.tensor(f"w{i}") for i, n in enumerate(shapes)}
    store.plan([f"w{i}" for i in range(len(shapes))], cpu)
    g = gr.new_graph([cpu])
    h = clip.clip_text(g, w, g.input("ids", (1, 77), "i32"), g.input("m", (77, 77)), cfg)
    assert h.shape == (1, 77, 768)
