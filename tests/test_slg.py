"""Skip-layer guidance settings: sd-cli's step window and its ``--skip-layers`` syntax."""

from __future__ import annotations

import pytest
from sdplan.core.errors import InvalidArgument
from sdplan.core.sampling.slg import SkipLayerGuidance, parse_skip_layers


def test_window_is_sd_clis() -> None:
    """sd-cli: step k = i + 1 runs SLG when int(start * (n + 1)) < k < int(end * (n + 1))."""
    default = SkipLayerGuidance(2.5)
    # 20 steps: int(0.21) = 0 < k < int(4.2) = 4 -> k 1..3 -> i 0..2
    assert [i for i in range(20) if default.active(i, 20)] == [0, 1, 2]
    # 40 steps: int(0.41) = 0 < k < int(8.2) = 8 -> i 0..6
    assert [i for i in range(40) if default.active(i, 40)] == list(range(7))
    # 4 steps, 0.2..0.8: int(1.0) = 1 < k < int(4.0) = 4 -> i 1, 2
    assert [i for i in range(4) if SkipLayerGuidance(2.5, (1,), 0.2, 0.8).active(i, 4)] == [1, 2]
    assert not any(SkipLayerGuidance(0.0).active(i, 20) for i in range(20))  # scale 0: off
    assert not SkipLayerGuidance(2.5, ()).enabled


def test_skip_layers_text() -> None:
    assert parse_skip_layers("[7,8,9]") == (7, 8, 9)
    assert parse_skip_layers("[7, 8 9]") == (7, 8, 9)
    assert parse_skip_layers("[]") == ()
    with pytest.raises(InvalidArgument, match="in brackets"):
        parse_skip_layers("7,8,9")
    with pytest.raises(InvalidArgument, match="'x' is not a block index"):
        parse_skip_layers("[7,x]")
    with pytest.raises(InvalidArgument, match="--slg-scale: 'big' is not a number"):
        SkipLayerGuidance.from_request({"slg_scale": "big"})
    with pytest.raises(InvalidArgument, match="start at 0"):
        SkipLayerGuidance.from_request({"skip_layers": "[-1]"})
    req = SkipLayerGuidance(2.5, (7, 8)).to_request()
    assert req["skip_layers"] == "[7,8]" and SkipLayerGuidance.from_request(req) == SkipLayerGuidance(2.5, (7, 8))
