"""sd-cli's prompt weighting syntax (parse_prompt_attention) and the per-chunk weighting."""

from __future__ import annotations

import numpy as np
import pytest
from sdplan.core.text.prompt import (
    BREAK_SEGMENT,
    PromptError,
    PromptSegment,
    apply_prompt_weights,
    parse_prompt_attention,
)


def segs(text: str) -> list[tuple[str, float]]:
    return [(s.text, round(s.weight, 6)) for s in parse_prompt_attention(text)]


def test_plain_text_is_one_segment() -> None:
    assert segs("normal text") == [("normal text", 1.0)]


def test_round_brackets_multiply_by_1_1() -> None:
    assert segs("an (important) word") == [("an ", 1.0), ("important", 1.1), (" word", 1.0)]


def test_documented_mixed_example() -> None:
    # The worked example of the grammar's documentation (sd-cli and the webui agree on it).
    assert segs("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).") == [
        ("a ", 1.0),
        ("house", round(1.3 * 1.1 * 1.1, 6)),
        (" ", 1.1),
        ("on", 1.0),
        (" a ", 1.1),
        ("hill", 0.55),
        (", sun, ", 1.1),
        ("sky", round(1.1**4, 6)),
        (".", 1.1),
    ]


def test_square_brackets_divide_by_1_1() -> None:
    assert segs("[[bg]]") == [("bg", round(1 / 1.1**2, 6))]


def test_unbalanced_and_stray_brackets() -> None:
    assert segs("(unbalanced") == [("unbalanced", 1.1)]
    assert segs("stray) and] closers") == [("stray and closers", 1.0)]
    assert segs("(unnecessary)(parens)") == [("unnecessaryparens", 1.1)]


def test_escapes_are_literal() -> None:
    assert segs(r"\(literal\]") == [("(literal]", 1.0)]
    assert segs(r"a \\ b \) c \[") == [("a \\ b ) c [", 1.0)]


def test_explicit_weights_including_signs_and_leading_dot() -> None:
    assert segs("(a:.5) (b:-1.25) (c:+2)") == [
        ("a", 0.5),
        (" ", 1.0),
        ("b", -1.25),
        (" ", 1.0),
        ("c", 2.0),
    ]
    # stof reads the leading number only.
    assert segs("(x:1.5.7)") == [("x", 1.5)]


def test_weight_without_digits_is_an_error() -> None:
    with pytest.raises(PromptError, match="not a number"):
        parse_prompt_attention("(x:.)")


def test_colon_without_weight_is_text() -> None:
    assert segs("time: 12") == [("time: 12", 1.0)]


def test_break_is_a_separate_marker() -> None:
    out = parse_prompt_attention("a cat BREAK (a dog)")
    assert out == [
        PromptSegment("a cat ", 1.0),
        BREAK_SEGMENT,
        PromptSegment(" ", 1.0),
        PromptSegment("a dog", pytest.approx(1.1)),
    ]
    assert out[1].is_break
    # Not a whole word, or lower case: plain text.
    assert segs("BREAKS break aBREAK") == [("BREAKS break aBREAK", 1.0)]
    # A marker inside brackets keeps its marker weight.
    assert [s.is_break for s in parse_prompt_attention("(a BREAK b)")] == [False, True, False]


def test_upper_case_b_inside_words_is_kept() -> None:
    assert segs("aBc Bob") == [("aBc Bob", 1.0)]


def test_empty_prompt() -> None:
    assert segs("") == [("", 1.0)]


def test_apply_prompt_weights_scales_tokens_and_restores_mean() -> None:
    rng = np.random.default_rng(0)
    hidden = rng.normal(0.3, 1.0, size=(2, 77, 8)).astype(np.float32)
    weights = np.ones((2, 77), np.float32)
    weights[0, 3] = 1.5
    weights[1, 10:12] = 0.5
    out = apply_prompt_weights(hidden, weights)
    for c in range(2):
        scaled = hidden[c] * weights[c][:, None]
        expect = scaled * (hidden[c].mean() / scaled.mean())
        np.testing.assert_allclose(out[c], expect, rtol=1e-5, atol=1e-6)
        assert out[c].mean() == pytest.approx(hidden[c].mean(), rel=1e-4)
    # All-ones weights change nothing.
    np.testing.assert_allclose(
        apply_prompt_weights(hidden, np.ones((2, 77), np.float32)), hidden, rtol=1e-6
    )


def test_apply_prompt_weights_rejects_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="weights"):
        apply_prompt_weights(np.zeros((1, 77, 4), np.float32), np.ones((1, 76), np.float32))
