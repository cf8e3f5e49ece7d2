"""The one error of sdplan's sampling package, shared by its schedules, noise and samplers."""

from __future__ import annotations

from sdplan.core.errors import SdplanError


class SamplingError(SdplanError):
    """An unknown sampler or schedule name, or unusable sampling input."""

    code = "invalid_sampling"
