"""The work of built graphs (:mod:`sdplan.core.runtime.work_count`): products, convolutions
and attention counted against their textbook FLOP whatever kernel runs them, memory-bound
bytes, devices and the copies between them, weights; and the work engine job of the demo."""

from __future__ import annotations

import pytest
from sdplan.core.errors import ModelFileError

pytest.importorskip("sdplan._ggml")

from conftest import REPO  # noqa: E402
from sdplan.core.pipelines.work import count_work  # noqa: E402
from sdplan.core.planning.work import GraphWork, works_from_json  # noqa: E402
from sdplan.core.runtime import graph as gr  # noqa: E402
from sdplan.core.runtime.devices import BackendManager  # noqa: E402
from sdplan.core.runtime.native import native  # noqa: E402
from sdplan.core.runtime.work_count import graph_work  # noqa: E402

DEMO = REPO / "resources" / "demo" / "sdplan-demo-shapes.safetensors"


@pytest.fixture(scope="module")
def cpu():
    with BackendManager(cpu_threads=1) as m:
        yield m.get("CPU")


def _weights(backend, **shapes):
    ng = native()
    store = ng.WeightStore([(n, "f16" if len(s) > 1 else "f32", s) for n, s in shapes.items()])
    buf = store.allocate(list(shapes), backend)
    return store, buf


def _work(backends, build) -> GraphWork:
    g = gr.new_graph(backends, n_threads=1)
    with gr.on(g, 0):
        build(g)
    g.build()
    return graph_work(g, ["A", "B", "C"][:len(backends)])


def test_a_product_is_2mkn_flops_with_its_weights_dtype(cpu) -> None:
    store, _ = _weights(cpu, w=(96, 64))

    def build(g):
        g.output("y", g.mul_mat(store.tensor("w"), g.input("x", (2, 40, 64))))

    w = _work([cpu], build).devices["A"]
    assert [(o.cls, o.dtype, o.flops, o.count) for o in w.ops] == [("mm", "f16", 2.0 * 96 * 64 * 80, 1)]
    assert (w.weights, w.weight_bytes) == (1, 96 * 64 * 2)


@pytest.mark.parametrize("method", ["im2col", "cpu_im2col", "winograd", "fma", "bf16"])
def test_a_convolution_counts_the_direct_products_flops_whatever_runs_it(cpu, method) -> None:
    ng = native()
    if method == "fma" and not ng.fma_gemm():
        pytest.skip("no FMA product on this CPU")
    if method == "bf16" and ng.bf16_cpu_kernel() == "off":
        pytest.skip("no bf16 kernel on this CPU")
    if method == "winograd" and not ng.cpu_avx2_fma():
        pytest.skip("no AVX2/FMA Winograd kernel here")
    if method == "bf16":
        before = ng.bf16_kernel()
        ng.set_bf16_kernel("auto")
    store, _ = _weights(cpu, w=(32, 16, 3, 3))
    try:
        def build(g):
            g.f16_as_bf16 = method == "bf16"
            x = g.input("x", (2, 16, 40, 40))
            g.output("y", gr.conv2d(g, x, store.tensor("w"), None, 1, 1, method=method))

        w = _work([cpu], build).devices["A"]
    finally:
        if method == "bf16":
            ng.set_bf16_kernel(before)
    direct = 2.0 * 2 * 32 * 40 * 40 * 16 * 9  # batch, out channels, output pixels, in channels, 3x3
    assert sum(o.flops * o.count for o in w.ops) == direct
    assert {o.cls for o in w.ops} == {"conv"}  # the column paths' product of columns too
    # the columns' bytes belong to the convolution (its measured rate includes them)
    assert not {"IM2COL", "cpu_im2col"} & set(w.mem_kernels)


def test_attention_counts_scores_and_values_with_its_head_width(cpu) -> None:
    def build(g):
        q = g.input("q", (1, 4, 50, 32))
        k, v = g.input("k", (1, 4, 70, 32)), g.input("v", (1, 4, 70, 32))
        g.output("y", g.flash_attn(q, k, v, None, 0.1))

    w = _work([cpu], build).devices["A"]
    attn = [o for o in w.ops if o.cls == "attn"]
    assert len(attn) == 1 and attn[0].flops == 2.0 * 4 * 50 * 70 * (32 + 32)
    assert attn[0].kernel.endswith("@d32")  # more keys than queries: no key tag


def test_cross_attention_over_fewer_keys_is_tagged_with_their_count(cpu) -> None:
    """Fewer keys than queries (a UNet's cross-attention over CLIP's 77 tokens) is priced by
    rates measured over as many keys: the kernel carries ``k`` and the key count."""
    def build(g):
        q = g.input("q", (2, 4, 256, 40))
        k, v = g.input("k", (2, 4, 77, 40)), g.input("v", (2, 4, 77, 40))
        g.output("y", g.flash_attn(q, k, v, None, 0.1))

    attn = [o for o in _work([cpu], build).devices["A"].ops if o.cls == "attn"]
    assert len(attn) == 1 and attn[0].kernel.endswith("@d40k77")
    assert attn[0].flops == 2.0 * 2 * 4 * 256 * 77 * (40 + 40)


def test_memory_bound_ops_count_their_bytes_and_views_count_as_nodes(cpu) -> None:
    def build(g):
        a, b = g.input("a", (1000,)), g.input("b", (1000,))
        s = g.add(a, b)
        g.output("y", g.reshape(s, (10, 100)))

    work = _work([cpu], build)
    w = work.devices["A"]
    assert w.ops == () and w.mem_ops >= 1
    assert w.mem_bytes >= 3 * 4000  # the add reads two and writes one
    assert w.mem_kernels["ADD"] == (3 * 4000, 1)
    assert sum(b for b, _ in w.mem_kernels.values()) == w.mem_bytes
    assert w.nodes >= 2  # the add and the reshape (a view), and an output copy
    assert (work.input_bytes, work.inputs) == (8000, 2)
    assert work.output_bytes == 4000 and work.outputs == 1


def test_a_split_counts_each_devices_work_and_the_copies_between_them(cpu) -> None:
    other = native().init_backend("CPU")
    store, _ = _weights(cpu, w0=(64, 64), w1=(64, 64))
    g = gr.new_graph([cpu, other], n_threads=1)
    with gr.on(g, 0):
        x = g.input("x", (8, 64))
        h = g.mul_mat(store.tensor("w0"), x)
    with gr.on(g, 1):
        y = g.mul_mat(store.tensor("w1"), g.add(h, x))  # reads the first device's h and the input
    with gr.on(g, 0):
        g.output("y", g.scale(y, 2.0))
    g.build()
    work = graph_work(g, ["A", "B"])
    flops = 2.0 * 64 * 64 * 8
    assert sum(o.flops for o in work.devices["A"].ops) == flops
    assert sum(o.flops for o in work.devices["B"].ops) == flops
    assert work.copies == {"A>B": 2 * 8 * 64 * 4, "B>A": 8 * 64 * 4}  # h and x there, y back
    assert work.devices["B"].weights == 1 and work.devices["A"].weights == 1


def test_the_work_job_counts_the_demo_generation() -> None:
    works = count_work({"model": [str(DEMO)]}, width=128, height=128, cfg=True)
    assert set(works) == {"te", "diffusion", "vae"}
    te, unet, vae = works["te"][0], works["diffusion"][0], works["vae"][0]
    assert (te.phase, te.calls, unet.phase, unet.calls, vae.phase, vae.calls) == ("text", 2, "step", 1, "decode", 1)
    assert unet.graph.devices["CPU"].flops > 0 and vae.graph.devices["CPU"].weight_bytes > 0
    # the block stacks cut their compute at a few checkpoints, not one per block (each is a
    # round trip on an RPC device); the VAE has no block stack
    assert (te.graph.checkpoints, unet.graph.checkpoints, vae.graph.checkpoints) == ({"CPU": 2}, {"CPU": 3}, {})
    # without guidance the UNet's batch halves: so do its products
    one = count_work({"model": [str(DEMO)]}, width=128, height=128, cfg=False)
    mm = lambda w: sum(o.flops * o.count for o in w.graph.devices["CPU"].ops if o.cls != "attn")  # noqa: E731
    assert mm(one["diffusion"][0]) == pytest.approx(mm(unet) / 2, rel=0.02)
    assert one["te"][0].calls == 1
    # the JSON form reads back
    back = works_from_json({m: [w.to_json() for w in ws] for m, ws in works.items()})
    assert back["diffusion"][0] == unet


def test_families_without_a_count_give_none_and_a_missing_file_is_an_error(tmp_path) -> None:
    """A file of no known family has no count ({}: the prediction's formula); a missing one
    is an error naming it."""
    import numpy as np
    from safetensors.numpy import save_file

    other = tmp_path / "other.safetensors"
    save_file({"encoder.layers.0.weight": np.zeros((4, 4), np.float32)}, str(other))
    assert count_work({"diffusion_model": [str(other)]}, width=64, height=64) == {}
    with pytest.raises(ModelFileError, match="missing.safetensors"):
        count_work({"model": [str(tmp_path / "missing.safetensors")]}, width=64, height=64)


def test_a_graph_split_and_computed_is_read_as_built_and_computes_the_same_after(cpu) -> None:
    """The scheduler points split nodes at its copies; reading the nodes between computes (and
    after the buffers were freed) sees the graph as built and leaves the split working."""
    import numpy as np

    other = native().init_backend("CPU")
    g = gr.new_graph([cpu, other], n_threads=1)
    with gr.on(g, 0):
        x = g.input("x", (4, 8))
        h = g.scale(x, 2.0)
    with gr.on(g, 1):
        y = g.add(h, x)
    with gr.on(g, 0):
        g.output("y", g.scale(y, 0.5))
    g.build()
    arr = np.arange(32, dtype=np.float32).reshape(4, 8)
    g.allocate()
    g.set_input("x", arr)
    g.compute()
    first = graph_work(g, ["A", "B"])
    g.compute()
    np.testing.assert_allclose(g.get_output("y"), 1.5 * arr)
    g.reserve()
    g.free_compute()
    assert graph_work(g, ["A", "B"]) == first
    assert first.copies == {"A>B": 2 * 4 * 8 * 4, "B>A": 4 * 8 * 4}


def test_qwen_image_is_counted_per_prompt_graph_of_its_dit() -> None:
    """Qwen-Image's count through the registry: the LLM once, the DiT's prompt graph and, with
    CFG, its negative prompt's graph (fewer text tokens, so less work), the decoder once."""
    from qwen_image_util import SIZE, files

    works = count_work(files(), width=SIZE, height=SIZE, cfg=True)
    assert set(works) == {"te", "diffusion", "vae"}
    prompt, negative = works["diffusion"]
    assert (prompt.phase, prompt.calls, negative.calls) == ("step", 1, 1)
    flops = lambda w: sum(o.flops * o.count for o in w.graph.devices["CPU"].ops)  # noqa: E731
    assert 0 < flops(negative) < flops(prompt)
    assert [(w.phase, w.calls) for w in works["te"]] == [("text", 1)]
    assert [(w.phase, w.calls) for w in works["vae"]] == [("decode", 1)]
    # no guidance: one DiT graph; two pictures: each graph twice (pictures run one by one)
    assert len(count_work(files(), width=SIZE, height=SIZE, cfg=False)["diffusion"]) == 1
    assert [w.calls for w in count_work(files(), width=SIZE, height=SIZE, batch=2)["diffusion"]] == [2, 2]


def test_a_controlnet_is_counted_beside_the_unet_on_the_conditional_batch(tmp_path) -> None:
    from controlnet_util import controlnet_from_unet

    net = controlnet_from_unet(DEMO, tmp_path / "demo_controlnet.safetensors")
    works = count_work({"model": [str(DEMO)], "control_net": [net]}, width=128, height=128, cfg=True)
    plain = count_work({"model": [str(DEMO)]}, width=128, height=128, cfg=True)
    (cn,) = works["controlnet"]
    assert (cn.phase, cn.calls) == ("step", 1)
    flops = lambda w: sum(o.flops * o.count for o in w.graph.devices["CPU"].ops)  # noqa: E731
    assert flops(cn) > 0 and cn.graph.devices["CPU"].weight_bytes > 0
    # it runs on the conditional batch alone: guidance leaves it as it is, a second picture doubles it
    no_cfg = count_work({"model": [str(DEMO)], "control_net": [net]}, width=128, height=128, cfg=False)
    two = count_work({"model": [str(DEMO)], "control_net": [net]}, width=128, height=128, batch=2, cfg=False)
    assert flops(no_cfg["controlnet"][0]) == pytest.approx(flops(cn))
    assert flops(two["controlnet"][0]) == pytest.approx(2 * flops(cn), rel=0.02)
    # the UNet itself takes the residuals as more inputs
    assert works["diffusion"][0].graph.inputs > plain["diffusion"][0].graph.inputs


def test_vae_tiling_counts_one_tile_per_tile_of_the_grid() -> None:
    """--vae-tiling with 64 px tiles on a 128 px picture (16 latent pixels, tiles of 8 with half
    overlap): sd-cli's grid has 3 x 3 tiles; each decode is one tile's graph."""
    from sdplan.core.planning.vae_tiling import VaeTiling

    whole = count_work({"model": [str(DEMO)]}, width=128, height=128)["vae"][0]
    tiled = count_work({"model": [str(DEMO)]}, width=128, height=128,
                       vae_tiling=VaeTiling(True, (64, 64)).to_json())["vae"][0]
    assert tiled.calls == 9
    flops = lambda w: sum(o.flops * o.count for o in w.graph.devices["CPU"].ops)  # noqa: E731
    assert flops(tiled) == pytest.approx(flops(whole) / 4, rel=0.05)


def test_wan_is_counted_per_prompt_pass_and_frame() -> None:
    """Wan's graphs are counted at the video's frames: UMT5 and the DiT once per CFG pass, the
    decoder once; more frames, more DiT work; an image-to-video DiT's encoder beside the
    decoder."""
    from sparse_writer import FIXTURES

    t2v = {"diffusion_model": [str(FIXTURES / "wan_tiny.safetensors")],
           "t5xxl": [str(FIXTURES / "umt5_tiny.safetensors")], "vae": [str(FIXTURES / "wan_vae_tiny.safetensors")]}
    one = count_work(t2v, width=64, height=64, cfg=True)
    five = count_work(t2v, width=64, height=64, cfg=True, overrides={"video_frames": 5})
    assert [(w.phase, w.calls) for m in ("te", "diffusion", "vae") for w in five[m]] == [
        ("text", 2), ("step", 2), ("decode", 1)]
    dit = lambda w: w["diffusion"][0].graph.flops  # noqa: E731
    assert dit(five) > 1.2 * dit(one)  # two latent frames of tokens instead of one (the 512 text tokens stay)
    assert count_work(t2v, width=64, height=64, cfg=False)["diffusion"][0].calls == 1
    i2v = {**t2v, "diffusion_model": [str(FIXTURES / "wan_i2v_tiny.safetensors")]}
    vae = count_work(i2v, width=64, height=64, cfg=True, overrides={"video_frames": 5})["vae"]
    assert len(vae) == 2 and vae[1].graph.flops > 0 and vae[1].graph.devices["CPU"].weight_bytes > 0


def test_flux2_klein_is_counted_per_prompt_pass_with_its_512_text_tokens(tmp_path) -> None:
    """FLUX.2 klein's count through the registry: the LLM over the 512 padded tokens once per
    prompt (twice with CFG), the DiT once per pass (twice with CFG, each picture apart), the
    decoder once per picture; the text's work does not depend on the picture size, the DiT's
    and the decoder's grow with it."""
    from flux2_util import AE, DIT, SIZE, write_llm

    files = {"diffusion_model": [str(DIT)], "llm": [str(write_llm(tmp_path / "llm.safetensors"))],
             "vae": [str(AE)]}
    flops = lambda w: sum(o.flops * o.count for o in w.graph.devices["CPU"].ops)  # noqa: E731
    works = count_work(files, width=SIZE, height=SIZE, cfg=True)
    assert {m: [(w.phase, w.calls) for w in ws] for m, ws in works.items()} == {
        "te": [("text", 2)], "diffusion": [("step", 2)], "vae": [("decode", 1)]}
    one = count_work(files, width=SIZE, height=SIZE, cfg=False, batch=3)
    assert [w.calls for w in one["te"]] == [1] and [w.calls for w in one["diffusion"]] == [3]
    assert [w.calls for w in one["vae"]] == [3]
    big = count_work(files, width=2 * SIZE, height=2 * SIZE, cfg=False)
    assert flops(big["te"][0]) == flops(works["te"][0]) > 0
    assert flops(big["diffusion"][0]) > flops(works["diffusion"][0]) > 0
    assert 3.5 < flops(big["vae"][0]) / flops(works["vae"][0]) < 4.5  # 4x the latent pixels


def _flops(work) -> float:
    return sum(o.flops * o.count for o in work.graph.devices["CPU"].ops)


def _calls(works) -> dict[str, list[tuple[str, int]]]:
    return {m: [(w.phase, w.calls) for w in ws] for m, ws in works.items()}


def test_flux1_counts_t5_and_clip_per_prompt_the_dit_per_pass_and_the_decoder_per_picture() -> None:
    """FLUX.1's count through the registry: T5 over its 256 padded tokens and CLIP-L over its
    77 once per prompt each (twice with CFG), the DiT once per pass (twice with CFG, each
    picture apart), the decoder once per picture; the text's work does not depend on the
    picture size, the DiT's and the decoder's grow with it; a longer ``t5_length`` grows T5's
    and the DiT's. The tiny DiT's head width has no default RoPE split: the count builds it
    with another split (the same work as the axes its tests give)."""
    from flux_util import AE, AXES, CLIP, DEV, SCHNELL, T5

    files = {"diffusion_model": [str(DEV)], "t5xxl": [str(T5)], "clip_l": [str(CLIP)], "vae": [str(AE)]}
    works = count_work(files, width=64, height=64, cfg=True)
    assert _calls(works) == {"te": [("text", 2), ("text", 2)], "diffusion": [("step", 2)], "vae": [("decode", 1)]}
    given = count_work(files, width=64, height=64, cfg=True, overrides={"flux_axes": AXES, "clip_heads": 2})
    assert [_flops(w) for ws in given.values() for w in ws] == [_flops(w) for ws in works.values() for w in ws]
    one = count_work({**files, "diffusion_model": [str(SCHNELL)]}, width=64, height=64, cfg=False, batch=3)
    assert _calls(one) == {"te": [("text", 1), ("text", 1)], "diffusion": [("step", 3)], "vae": [("decode", 3)]}
    big = count_work(files, width=128, height=128, cfg=False)
    assert [_flops(w) for w in big["te"]] == [_flops(w) for w in works["te"]]
    assert _flops(works["te"][0]) > _flops(works["te"][1]) > 0  # T5 over 256 tokens, CLIP over 77
    assert _flops(big["diffusion"][0]) > _flops(works["diffusion"][0]) > 0
    assert 3.5 < _flops(big["vae"][0]) / _flops(works["vae"][0]) < 4.5  # 4x the latent pixels
    long = count_work(files, width=64, height=64, cfg=False, overrides={"t5_length": 512})
    assert _flops(long["te"][0]) > 1.9 * _flops(works["te"][0])
    assert _flops(long["te"][1]) == _flops(works["te"][1])
    assert _flops(long["diffusion"][0]) > _flops(works["diffusion"][0])


def test_chroma_counts_t5_at_512_and_the_dit_on_the_kept_rows_of_each_prompt() -> None:
    """Chroma's count: T5 over the 512 padded tokens once per prompt (twice with CFG, Chroma's
    default), the DiT's prompt graph (256 prompt tokens and a pad row kept) and, with CFG,
    the empty negative prompt's (``</s>`` and a pad row), each once per step and picture; the
    negative prompt's graph is the smaller; without the DiT mask both see all 512 rows."""
    from flux_util import AE, CHROMA, T5

    files = {"diffusion_model": [str(CHROMA)], "t5xxl": [str(T5)], "vae": [str(AE)]}
    works = count_work(files, width=64, height=64, cfg=True, batch=2)
    assert _calls(works) == {"te": [("text", 2)], "diffusion": [("step", 2), ("step", 2)], "vae": [("decode", 2)]}
    cond, uncond = (_flops(w) for w in works["diffusion"])
    assert cond > 2 * uncond > 0
    one = count_work(files, width=64, height=64, cfg=False)
    assert _calls(one) == {"te": [("text", 1)], "diffusion": [("step", 1)], "vae": [("decode", 1)]}
    assert _flops(one["diffusion"][0]) == cond
    big = count_work(files, width=128, height=128, cfg=False)
    assert _flops(big["te"][0]) == _flops(works["te"][0]) > 0
    assert _flops(big["diffusion"][0]) > cond
    assert 3.5 < _flops(big["vae"][0]) / _flops(works["vae"][0]) < 4.5
    unmasked = count_work(files, width=64, height=64, cfg=True, overrides={"chroma_use_dit_mask": False})
    full = [_flops(w) for w in unmasked["diffusion"]]
    assert full[0] == full[1] > cond


def test_z_image_counts_the_llm_over_the_template_and_prompt_and_the_dit_per_prompt() -> None:
    """Z-Image's count: the Qwen3 LLM over the template and 256 prompt tokens once (with CFG
    also over the template alone, the empty negative prompt), the DiT's graph with each
    prompt's caption rows once per step and picture, the decoder once per picture; the
    text's work does not depend on the picture size, the DiT's and the decoder's grow."""
    import tempfile
    from pathlib import Path

    from zimage_util import AE, DIT, write_qwen3

    with tempfile.TemporaryDirectory() as d:
        files = {"diffusion_model": [str(DIT)], "llm": [str(write_qwen3(Path(d) / "llm.safetensors"))],
                 "vae": [str(AE)]}
        works = count_work(files, width=64, height=64, cfg=True)
        one = count_work(files, width=64, height=64, cfg=False, batch=3)
        big = count_work(files, width=128, height=128, cfg=False)
    assert _calls(works) == {"te": [("text", 1), ("text", 1)], "diffusion": [("step", 1), ("step", 1)],
                             "vae": [("decode", 1)]}
    assert _calls(one) == {"te": [("text", 1)], "diffusion": [("step", 3)], "vae": [("decode", 3)]}
    prompt, negative = (_flops(w) for w in works["te"])
    assert prompt > 10 * negative > 0  # the template and 256 tokens against the template alone
    assert _flops(works["diffusion"][0]) > _flops(works["diffusion"][1]) > 0
    assert _flops(one["diffusion"][0]) == _flops(works["diffusion"][0])
    assert _flops(big["te"][0]) == prompt
    assert _flops(big["diffusion"][0]) > _flops(works["diffusion"][0])
    assert 3.5 < _flops(big["vae"][0]) / _flops(works["vae"][0]) < 4.5


def test_a_set_of_files_still_being_opened_has_no_count_yet(tmp_path) -> None:
    """The board counts while files are still being opened: a Z-Image or klein DiT and its LLM
    without the autoencoder give no count (the formula prices them) instead of a KeyError that
    stopped the board; the whole set is counted."""
    from flux2_util import AE as KLEIN_AE
    from flux2_util import DIT as KLEIN_DIT
    from flux2_util import write_llm
    from zimage_util import DIT

    llm = str(write_llm(tmp_path / "llm.safetensors"))
    assert count_work({"diffusion_model": [str(DIT)], "llm": [llm]}, width=64, height=64) == {}
    assert count_work({"diffusion_model": [str(KLEIN_DIT)], "llm": [llm]}, width=64, height=64) == {}
    whole = count_work({"diffusion_model": [str(KLEIN_DIT)], "llm": [llm], "vae": [str(KLEIN_AE)]},
                       width=64, height=64)
    assert set(whole) == {"te", "diffusion", "vae"}


def test_sdxl_counts_both_encoders_the_unet_with_its_vector_and_the_decoder() -> None:
    """SDXL's count (it priced by the parameter-count formula: its 1024 px step at 2.5x the
    measured one): CLIP ViT-L and bigG each once per prompt (twice with CFG; the refiner has
    bigG alone), the UNet on the CFG batch once per evaluation, the decoder per picture batch;
    CFG doubles the UNet's products; a parallel-CFG copy runs each half at the same time."""
    from sdplan.core.runtime.placement import CFG, ModulePlacement
    from sdplan.core.runtime.runner import BackendPool
    from sdxl_util import BASE, REFINER

    mm = lambda w, d="CPU": sum(o.flops * o.count for o in w.graph.devices[d].ops if o.cls != "attn")  # noqa: E731
    cfg = count_work({"model": [str(BASE)]}, width=64, height=64, cfg=True)
    assert {m: [(w.phase, w.calls) for w in ws] for m, ws in cfg.items()} == {
        "te": [("text", 2), ("text", 2)], "diffusion": [("step", 1)], "vae": [("decode", 1)]}
    one = count_work({"model": [str(BASE)]}, width=64, height=64, cfg=False)
    assert [w.calls for w in one["te"]] == [1, 1]
    assert mm(cfg["diffusion"][0]) == pytest.approx(2 * mm(one["diffusion"][0]), rel=0.02)
    big = count_work({"model": [str(BASE)]}, width=128, height=128, cfg=False)
    assert [mm(w) for w in big["te"]] == [mm(w) for w in one["te"]]
    assert 3.5 < mm(big["vae"][0]) / mm(one["vae"][0]) < 4.5
    refiner = count_work({"model": [str(REFINER)]}, width=64, height=64, cfg=True)
    assert [(w.phase, w.calls) for w in refiner["te"]] == [("text", 2)]
    with BackendManager(cpu_threads=1) as manager:
        pool = BackendPool(manager, {"B": native().init_backend("CPU")})
        cpu = ModulePlacement(("CPU",))
        par = count_work({"model": [str(BASE)]}, width=64, height=64, pool=pool,
                         placements={"te": cpu, "diffusion": cpu, "vae": cpu, CFG: ModulePlacement(("B",))})
    mine, theirs = par["diffusion"]
    assert (mine.group, theirs.group, mine.graph.main, theirs.graph.main) == ("cfg", "cfg", "CPU", "B")
    assert mm(theirs, "B") == pytest.approx(mm(mine)) == pytest.approx(mm(one["diffusion"][0]))


def test_input_shapes_are_each_input_arrays_shape_whatever_its_dtype() -> None:
    """The one helper the families' work counts and dry runs read their graph inputs with."""
    import numpy as np
    from sdplan.core.pipelines.work import input_shapes

    got = input_shapes({"x": np.zeros((1, 16, 8, 6), np.float32), "ids": np.zeros((1, 77), np.int32),
                        "t": np.zeros((), np.float32)})
    assert got == {"x": (1, 16, 8, 6), "ids": (1, 77), "t": ()}
    assert all(type(d) is int for s in got.values() for d in s)
