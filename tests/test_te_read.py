"""The LLM states a family reads (``Family.llm_layers``) are the pipelines' out layers and decide
the encoder blocks a plan counts: klein reads up to block 27, FLUX.2 dev up to 30, Z-Image all
but the last, Qwen-Image all (the final normed state), as stable-diffusion.cpp's ``LLMEmbedder``
asks for them (``out_layers`` {9, 18, 27}, {10, 20, 30}, {35} of 36); a profile's ``tail`` (final
norm and output head) is bytes within ``other``; an encoder file's cached profile trims as the
files read together do."""

from __future__ import annotations

import pytest
from sdplan.core.errors import ModelFileError
from sdplan.core.families import family
from sdplan.core.modelfiles.te_read import is_llm_tail, trim_llm_profile
from sdplan.core.planning.profile import ModuleProfile, Profile


@pytest.mark.parametrize("name, n, layers, read", [
    ("flux2_klein", 36, (9, 18, 27), 27), ("flux2", 40, (10, 20, 30), 30),
    ("z_image", 36, (35,), 35), ("z_image", 4, (3,), 3), ("qwen_image", 28, (29,), 28)])
def test_states_and_blocks_read(name: str, n: int, layers: tuple[int, ...], read: int) -> None:
    fam = family(name)
    assert fam.llm_out_layers(n) == layers and fam.llm_blocks_read(n) == read


def test_a_state_the_encoder_lacks_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"FLUX.2 klein reads LLM states \[27\]; the encoder has 20 blocks"):
        family("flux2_klein").llm_out_layers(20)


def test_pipelines_take_the_family_states() -> None:
    pytest.importorskip("numpy")
    from sdplan.core.pipelines.flux2.pipeline import OUT_LAYERS as KLEIN
    from sdplan.core.pipelines.flux2_dev.pipeline import OUT_LAYERS as DEV

    assert KLEIN is family("flux2_klein").llm_layers and DEV is family("flux2").llm_layers


def test_tail_names() -> None:
    for name in ("model.norm.weight", "output_norm.weight", "lm_head.weight", "output.weight",
                 "text_encoders.llm.model.norm.weight", "language_model.lm_head.weight"):
        assert is_llm_tail(name), name
    for name in ("model.embed_tokens.weight", "token_embd.weight", "model.layers.0.input_layernorm.weight"):
        assert not is_llm_tail(name), name


def test_trim_an_encoder_files_profile() -> None:
    mp = ModuleProfile(tuple(range(10, 46)), 100, {"llm": sum(range(10, 46)) + 100}, "llm", tail=7)
    klein = trim_llm_profile(mp, "flux2_klein-4b")
    assert klein.blocks == tuple(range(10, 37)) and klein.other == 93 and klein.tail == 0
    assert klein.encoders == {"llm": sum(range(10, 37)) + 93} and klein.total == klein.encoders["llm"]
    assert trim_llm_profile(mp, "qwen_image") is mp and trim_llm_profile(mp, None) is mp
    assert trim_llm_profile(mp, "flux") is mp  # no LLM states declared
    t5 = ModuleProfile((5,) * 36, 3, {"t5xxl": 183}, "t5xxl")
    assert trim_llm_profile(t5, "flux2_klein-4b") is t5


def test_profile_json_tail() -> None:
    mp = ModuleProfile((1, 2), 10, {"llm": 13}, "llm", tail=4)
    assert mp.to_json()["tail"] == 4
    assert Profile.from_json({"modules": {"te": mp.to_json()}}).modules["te"] == mp
    with pytest.raises(ModelFileError, match="'tail' must be bytes within 'other'"):
        Profile.from_json({"modules": {"te": {"blocks": [1], "other": 3, "tail": 4}}}, source="p.json")
