"""FLUX.2 dev runs against transformers, mistral-common and diffusers' ``Flux2Pipeline``
(``make_flux2_dev_fixtures.py``): the prompt's Tekken ids in sd-cli's template, the Mistral
states dev takes (blocks 10, 20, 30; zero rows to 512) from transformers names and from a
GGUF file with llama.cpp's permuted q/k rows and its own tokenizer, the DiT with its guidance
embedder, a 4-step run at distilled guidance 3.5, a reference-image edit; the DiT's and the
encoder's blocks split over two backends with disk residency equal to one device."""

from __future__ import annotations

import numpy as np
import pytest
from flux2_dev_util import AE, DIT, PROMPT, SIZE, ref, write_llm
from flux_util import rel_err

G = pytest.importorskip("sdplan._ggml")
if not hasattr(G, "Graph"):
    pytest.skip("the native module has no Graph", allow_module_level=True)
from sdplan.core.errors import SdplanError  # noqa: E402
from sdplan.core.pipelines.flux2_dev.pipeline import TEMPLATE, DevModels, DevPipeline  # noqa: E402
from sdplan.core.runtime.runner import BackendPool, BlockRange, ModulePlacement  # noqa: E402
from sdplan.core.text.bpe_tokenizer import BPETokenizer  # noqa: E402

R = ref()
TOL = 3e-3


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    d = tmp_path_factory.mktemp("mistral")
    return {"hf": write_llm(d / "mistral_tiny.safetensors"), "gguf": write_llm(d / "mistral-tiny-f16.gguf", "gguf")}


@pytest.fixture(scope="module")
def pool():
    second = G.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(G.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


def pipe_of(pool, llm_path, placements=None) -> DevPipeline:
    return DevPipeline(DevModels(DIT, llm_path, AE), pool=pool, placements=placements, n_threads=1)


def run(pool, llm_path, placements=None, **kw) -> dict:
    with pipe_of(pool, llm_path, placements) as pipe:
        out = pipe.txt2img(PROMPT, SIZE, SIZE, noise=R["pipe.noise"], vae_scale=2, **kw)
        out["context"] = pipe.encode_prompt(PROMPT)
        out["memory"] = pipe.memory()
        return out


@pytest.fixture(scope="module")
def single(pool, llm) -> dict:
    return run(pool, llm["hf"], steps=4)


def test_prompt_ids_are_mistral_commons_in_sdclis_template() -> None:
    tok = BPETokenizer.mistral()
    for key, prompt in (("llm.ids", PROMPT), ("llm.neg_ids", "")):
        ids = tok.encode_prompt(prompt, *TEMPLATE).ids[0].tolist()
        assert [tok.token_id("<s>"), *ids] == R[key][0].tolist()
    assert tok.vocab_size == 131072 and tok.token_id("[INST]") == 3 and tok.token_id("[/SYSTEM_PROMPT]") == 18


def test_prompt_states_are_dev_layers_padded_with_zero_rows(single) -> None:
    n = R["llm.ids"].shape[1]
    assert single["context"].shape == R["llm.hidden"].shape == (1, 512, 48)
    assert rel_err(single["context"][:, :n], R["llm.hidden"][:, :n]) < TOL
    assert not single["context"][:, n:].any()


def test_gguf_encoder_with_permuted_rows_and_its_own_tokenizer(pool, llm) -> None:
    with pipe_of(pool, llm["gguf"]) as pipe:
        assert pipe.llm.cfg.rope == "normal" and pipe.llm.cfg.head_dim == 128
        assert pipe.tokenizer.source.endswith(".gguf")
        context = pipe.encode_prompt("")
    n = R["llm.neg_ids"].shape[1]
    assert rel_err(context[:, :n], R["llm.neg_hidden"][:, :n]) < TOL


@pytest.fixture(scope="module")
def dit_f32(tmp_path_factory):
    from safetensors.numpy import load_file, save_file

    path = tmp_path_factory.mktemp("dit32") / "flux2_dev_tiny_f32.safetensors"
    save_file({k: v.astype(np.float32) for k, v in load_file(str(DIT)).items()}, str(path))
    return path


@pytest.mark.parametrize("case", ["a", "b"])
def test_dit_with_guidance_embedder_matches_diffusers(pool, llm, dit_f32, case) -> None:
    refs = [R[k] for k in sorted(R) if k.startswith(f"dit_{case}.ref")]
    want = R[f"dit_{case}.out"]
    errs = {}
    for name, path in (("f32", dit_f32), ("f16", DIT)):
        with DevPipeline(DevModels(path, llm["hf"], AE), pool=pool, n_threads=1) as pipe:
            assert pipe.dit.cfg.guidance and pipe.dit.n_blocks == 50
            pipe.guidance = float(R[f"dit_{case}.guidance"][0])
            out = pipe.velocity(R[f"dit_{case}.latent"], float(R[f"dit_{case}.sigma"][0]), R[f"dit_{case}.context"],
                                refs=refs)
        errs[name] = rel_err(out, want.reshape(1, out.shape[2], out.shape[3], -1).transpose(0, 3, 1, 2))
    # the f32 graph is the model; the f16 file rounds activations in 50 blocks' products
    assert errs["f32"] < 1e-4 and errs["f16"] < TOL
    if case == "a":  # the guidance embedder is read: another guidance moves the output
        with DevPipeline(DevModels(dit_f32, llm["hf"], AE), pool=pool, n_threads=1) as pipe:
            pipe.guidance = 1.0
            other = pipe.velocity(R["dit_a.latent"], float(R["dit_a.sigma"][0]), R["dit_a.context"])
        assert rel_err(other, want.reshape(1, 4, 4, -1).transpose(0, 3, 1, 2)) > 100 * errs["f32"]


def test_four_steps_at_guidance_3_5_match_diffusers_pipeline(single) -> None:
    np.testing.assert_allclose(single["sigmas"], R["pipe.sigmas"], atol=1e-6)
    assert single["latent"].shape == (1, 128, 4, 4)
    assert rel_err(single["latent"], R["pipe.latent"]) < TOL
    assert rel_err(single["image"], R["pipe.image"]) < TOL


def test_guidance_changes_the_picture(pool, llm, single) -> None:
    other = run(pool, llm["hf"], steps=4, guidance=1.5)
    assert rel_err(other["latent"], single["latent"]) > 5 * TOL


def test_reference_image_edit_matches_diffusers(pool, llm) -> None:
    out = run(pool, llm["hf"], steps=2, ref_images=[R["edit.picture"]])
    err = rel_err(out["latent"], R["edit.latent"])
    assert err < TOL
    assert rel_err(out["image"], R["edit.image"]) < TOL


def test_split_with_disk_residency_matches_one_device(single, pool, llm) -> None:
    split = {"diffusion": (BlockRange("CPU", 0, 24), BlockRange("CPU1", 25, 49)),
             "te": (BlockRange("CPU", 0, 14), BlockRange("CPU1", 15, 30))}
    pl = {m: ModulePlacement(("CPU", "CPU1"), r, "disk") for m, r in split.items()}
    pl["vae"] = ModulePlacement(("CPU",))
    out = run(pool, llm["hf"], pl, steps=4)
    np.testing.assert_allclose(out["latent"], single["latent"], atol=1e-5)
    np.testing.assert_allclose(out["image"], single["image"], atol=1e-5)
    for runner in ("diffusion", "llm"):
        assert set(out["memory"][runner]) == {"CPU", "CPU1"}


def test_dev_refuses_kleins_qwen3_encoder(pool, tmp_path) -> None:
    from flux2_util import write_llm as write_qwen3

    qwen = write_qwen3(tmp_path / "qwen_3_tiny.safetensors")
    with pytest.raises(SdplanError, match="FLUX.2 dev reads the states of Mistral-Small-3.2; this encoder is a qwen3"):
        DevPipeline(DevModels(DIT, qwen, AE), pool=pool, n_threads=1)
