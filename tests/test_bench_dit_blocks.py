"""The DiT block benchmark's inputs (bench/bench_dit_blocks.py, bench/dit_cut.py): each family's
real layout cut to N blocks of every stack is read back by sdplan's model class with N blocks
per stack and nothing else changed, the whole layout with the released block counts, the
native 1024 px inputs have 4096 image tokens and the family's text tokens, and the cost model
that turns a cut call into a step weighs the stacks as their shapes say."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import dit_cut  # noqa: E402
import real_size_files as rsf  # noqa: E402


def _counts(fam: str, model: Any) -> dict[str, int]:
    """Blocks per stack as the model class read them."""
    c = model.cfg
    if fam in ("flux", "chroma", "flux2"):
        return {"double": c.n_double, "single": c.n_single}
    if fam == "z_image":
        return {"layers": c.n_layers, "noise_refiner": c.n_noise_refiner, "context_refiner": c.n_context_refiner}
    if fam == "sd3":
        return {"joint": c.depth}
    return {"blocks": c.n_blocks}


#: the released models' blocks per stack (model cards / published configurations)
REAL = {"flux": {"double": 19, "single": 38}, "chroma": {"double": 19, "single": 38},
        "sd3": {"joint": 24}, "flux2": {"double": 5, "single": 20},
        "z_image": {"layers": 30, "noise_refiner": 2, "context_refiner": 2}, "qwen_image": {"blocks": 60}}


@pytest.fixture(scope="module")
def layouts(shared_dir: Path) -> dict[str, Any]:
    return rsf.layouts(shared_dir)


@pytest.mark.parametrize("fam", list(dit_cut.DITS))
def test_cut_layouts_read_back_with_the_cut_block_counts(fam: str, layouts: dict[str, Any]) -> None:
    cls = dit_cut.model_class(fam)
    full = dit_cut.dit_layout(fam, layouts)
    assert _counts(fam, cls.from_weights(full)) == REAL[fam]
    for n in (1, 2):
        cut = dit_cut.cut_layout(full, n)
        model = cls.from_weights(cut)
        assert _counts(fam, model) == {k: n for k in REAL[fam]}
        listed = set(model.other_tensors()).union(*(model.block_tensors(i) for i in range(model.n_blocks)))
        assert listed == set(cut)  # the file holds exactly what the model reads
        # every kept name has its real shape; SD3's cut ends with the real last block's
        # (joint_blocks.23: no text-stream outputs, a 2-vector modulation)
        for name, shape in cut.items():
            m = dit_cut.BLOCK.search(name)
            if fam == "sd3" and m and int(m.group(2)) == n - 1:
                name = f"{name[:m.start(2)]}23{name[m.end(2):]}"
            assert shape == full[name], name


def test_chroma_is_flux_without_modulation_and_with_the_approximator(layouts: dict[str, Any]) -> None:
    ch = dit_cut.dit_layout("chroma", layouts)
    model = dit_cut.model_class("chroma").from_weights(ch)
    assert model.cfg.approximator == dit_cut.CHROMA_APPROX == (64, 5120, 5)
    assert model.n_mods == 3 * 38 + 12 * 19 + 2 == 344  # the approximator's rows (chroma.py docstring)
    assert not [n for n in ch if "mod.lin" in n or "modulation" in n or n.startswith(("time_in", "vector_in"))]
    flux = layouts["flux1_dev_bfl"]
    assert ch["double_blocks.7.img_attn.qkv.weight"] == tuple(flux["double_blocks.7.img_attn.qkv.weight"])
    assert len(ch) == len(flux) - 2 * (19 * 2 + 38) - 2 * 7 + 4 + 5 * 5


def test_sd3_cut_ends_with_the_real_last_block(layouts: dict[str, Any]) -> None:
    cut = dit_cut.cut_layout(dit_cut.dit_layout("sd3", layouts), 2)
    assert "joint_blocks.0.context_block.mlp.fc1.weight" in cut
    assert "joint_blocks.1.context_block.mlp.fc1.weight" not in cut  # as joint_blocks.23
    assert "joint_blocks.1.context_block.attn.qkv.weight" in cut
    assert not [n for n in cut if n.startswith("joint_blocks.") and int(n.split(".")[1]) > 1]


@pytest.mark.parametrize("fam", list(dit_cut.DITS))
def test_native_inputs_have_4096_image_tokens(fam: str, layouts: dict[str, Any]) -> None:
    model = dit_cut.model_class(fam).from_weights(dit_cut.cut_layout(dit_cut.dit_layout(fam, layouts), 1))
    txt = dit_cut.DITS[fam].txt
    ins = dit_cut.native_inputs(fam, model, 1024, txt)
    assert dit_cut.image_tokens(fam, model, 1024) == 4096
    img = ins["img"]
    tokens = img.shape[1] * img.shape[2] if fam == "sd3" else img.shape[1]  # SD3: (1, 64, 64, 64) patches
    assert tokens == 4096
    assert ins["txt"].shape == (1, txt, model.cfg.context)
    assert img.shape[-1] == {"flux2": 128}.get(fam, 64)  # 2x2 patches of 16 channels; FLUX.2: 128


def test_text_tokens_are_what_the_pipelines_pass() -> None:
    from sdplan.core.pipelines.chroma.pipeline import T5_LENGTH
    from sdplan.core.pipelines.flux2.pipeline import MIN_TOKENS
    from sdplan.core.pipelines.qwen_image.generate import DRY_RUN_TOKENS

    assert dit_cut.DITS["chroma"].txt == T5_LENGTH == 512
    assert dit_cut.DITS["flux2"].txt == MIN_TOKENS == 512
    assert dit_cut.DITS["qwen_image"].txt == DRY_RUN_TOKENS == 256
    assert dit_cut.DITS["sd3"].txt == 154 and dit_cut.DITS["flux"].txt == 256


def test_step_scale_weighs_stacks_by_their_cost(layouts: dict[str, Any]) -> None:
    def scale(fam: str) -> float:
        full = dit_cut.dit_layout(fam, layouts)
        per = dit_cut.block_flops(full, 4096, dit_cut.DITS[fam].txt, full[dit_cut.DITS[fam].width_key][0])
        return dit_cut.flops_of(dit_cut.stacks(full), per) / dit_cut.flops_of(dit_cut.stacks(
            dit_cut.cut_layout(full, 1)), per)

    assert scale("sd3") == pytest.approx(24.0) and scale("qwen_image") == pytest.approx(60.0)
    # FLUX.1: a double block's two streams see 4096 + 256 tokens, a single block's 4352: equal
    assert scale("flux") == pytest.approx(57 / 2, rel=0.01)
    # Z-Image: the text refiner (512 tokens) costs ~1/10 of a main layer, so the step is far
    # more than (30 + 2 + 2) / 3 cut calls
    full = dit_cut.dit_layout("z_image", layouts)
    per = dit_cut.block_flops(full, 4096, 512, 3840)
    assert per["context_refiner"] < 0.15 * per["layers"] and per["noise_refiner"] < per["layers"]
    assert 15.0 < scale("z_image") < 17.0


def _diffusers_of(fam: str, c: Any) -> dict[str, Any]:
    """The diffusers configuration arguments sdplan's reading ``c`` of the real layout implies."""
    if fam == "z_image":
        return dict(in_channels=c.channels, dim=c.width, n_heads=c.heads, n_kv_heads=c.kv_heads,
                    cap_feat_dim=c.context, axes_dims=list(c.axes))
    out = dict(in_channels=c.in_channels, num_attention_heads=c.heads, attention_head_dim=c.width // c.heads,
               joint_attention_dim=c.context)
    if fam == "sd3":
        return dict(out, patch_size=c.patch, caption_projection_dim=c.width, pooled_projection_dim=c.pooled,
                    out_channels=c.out_channels, pos_embed_max_size=c.pos_size)
    out["axes_dims_rope"] = list(c.axes)
    if fam == "flux":
        out.update(pooled_projection_dim=c.pooled, guidance_embeds=c.guidance)
    elif fam == "chroma":
        out.update(zip(("approximator_num_channels", "approximator_hidden_dim", "approximator_layers"),
                       c.approximator, strict=True))
    elif fam == "flux2":
        out.update(mlp_ratio=c.mlp / c.width, guidance_embeds=c.guidance)
    return out


@pytest.mark.parametrize("fam", list(dit_cut.DITS))
def test_diffusers_configurations_are_the_layouts(fam: str, layouts: dict[str, Any]) -> None:
    import bench_dit_blocks as bdb

    full = dit_cut.dit_layout(fam, layouts)
    c = dit_cut.model_class(fam).from_weights(full).cfg
    expected = _diffusers_of(fam, c)
    cls, cfg = bdb.ref_config(fam, dit_cut.stacks(dit_cut.cut_layout(full, 2)))
    assert cls.endswith("Transformer2DModel")
    assert {k: cfg[k] for k in expected} == expected
    counts = {k: v for k, v in cfg.items() if k in bdb.REF_BLOCKS[fam]}
    assert counts and set(counts.values()) == {2}  # every stack cut alike
    # the whole layout gives the released models' diffusers block counts
    real = {k: v for k, v in bdb.ref_config(fam, dit_cut.stacks(full))[1].items() if k in bdb.REF_BLOCKS[fam]}
    assert real == RELEASED_DIFFUSERS[fam]


#: the released models' block counts in their diffusers configurations (transformer/config.json)
RELEASED_DIFFUSERS = {
    "flux": {"num_layers": 19, "num_single_layers": 38}, "chroma": {"num_layers": 19, "num_single_layers": 38},
    "sd3": {"num_layers": 24}, "flux2": {"num_layers": 5, "num_single_layers": 20},
    "z_image": {"n_layers": 30, "n_refiner_layers": 2}, "qwen_image": {"num_layers": 60}}
