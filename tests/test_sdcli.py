"""sd-cli flags that a model's own files call for (:func:`sdplan.core.planning.sdcli.model_file_flags`)."""

from __future__ import annotations

import pytest
from sdplan.core.planning.sdcli import model_file_flags


@pytest.mark.parametrize(("metadata", "family", "flags"), [
    ([{"sdplan.prediction": "v"}], "sd1", ["--prediction", "v"]),
    ([{"sdplan.prediction": "eps"}], "sd1", []),  # the family's own
    ([{"sdplan.prediction": "eps"}], "sd2", ["--prediction", "eps"]),
    ([{}], "sd1", []),
    ([{"sdplan.prediction": "v"}, {"sdplan.prediction": "eps"}], "sd1", []),  # files disagree
    ([{"sdplan.prediction": "v"}], "flux", []),  # not a UNet family
    ([{"sdplan.prediction": "x0"}], "sd1", []),  # unknown value: nothing written
])
def test_model_file_flags(metadata, family, flags) -> None:
    assert model_file_flags(metadata, family) == flags
