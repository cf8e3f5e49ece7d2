"""sd-cli's sampling options beyond sampler and scheduler, in one value the pipelines share:
``--eta``, ``--sigmas``, ``--flow-shift``, ``--timestep-shift``, ``--rng``,
``--sampler-rng`` and ``--extra-sample-args``.

:func:`prepare` turns them into what a pipeline's sampling loop needs: the generator of the
starting noise, the sampler's noise source (the same generator unless ``--sampler-rng``
names another kind, then a second one seeded alike, as sd-cli does), and the sigmas (the
custom ``--sigmas`` list, or the scheduler's).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sdplan.core.sampling.errors import SamplingError
from sdplan.core.sampling.names import RNGS

if TYPE_CHECKING:  # numpy and the schedules load where a run prepares (not to check flags)
    import numpy as np
    from sdplan.core.sampling.noise import NoiseSource
    from sdplan.core.sampling.schedules import DiscreteSchedule
    from sdplan.core.sampling.schedules_more import FlowSchedule

__all__ = ["SamplingOptions", "parse_sigmas", "check_sigmas", "MAX_SIGMAS", "parse_key_values", "prepare",
           "shifted_timestep"]


@dataclass(frozen=True)
class SamplingOptions:
    """sd-cli's sampling options (defaults are sd-cli's).

    Attributes:
        eta: ``--eta``; None: the sampler's default.
        sigmas: ``--sigmas``: a custom descending schedule (a final 0 is added when
            missing), replacing the scheduler's; empty: none. Checked by
            :func:`check_sigmas`.
        flow_shift: ``--flow-shift`` for flow models; None: the model's default.
        timestep_shift: ``--timestep-shift`` (SDXL, NitroFusion): the model sees timestep
            ``round(t * shift / 1000)``; 0: off.
        rng: ``--rng``: ``cuda`` (default), ``cpu`` or ``std_default``.
        sampler_rng: ``--sampler-rng``; None: the ``rng`` generator itself.
        extra: ``--extra-sample-args`` as key -> text.
    """

    eta: float | None = None
    sigmas: tuple[float, ...] = ()
    flow_shift: float | None = None
    timestep_shift: int = 0
    rng: str = "cuda"
    sampler_rng: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_sigmas(self.sigmas)
        for flag, name in (("--rng", self.rng), ("--sampler-rng", self.sampler_rng)):
            if name is not None and name not in RNGS:
                raise SamplingError(f"{flag} {name!r} is unknown; choose one of {', '.join(RNGS)}")
        if self.timestep_shift < 0 or self.timestep_shift > 1000:
            raise SamplingError(f"--timestep-shift must be 0..1000, got {self.timestep_shift}")

    @classmethod
    def from_request(cls, req: Mapping[str, object]) -> SamplingOptions:
        """Read the request keys ``eta``, ``sigmas`` (text or list), ``flow_shift``,
        ``timestep_shift``, ``rng``, ``sampler_rng``, ``extra_sample_args`` (text or
        mapping); absent keys keep the defaults.

        Raises:
            SamplingError: a malformed value.
        """
        raw_sigmas: Any = req.get("sigmas")
        sigmas = parse_sigmas(raw_sigmas) if isinstance(raw_sigmas, str) else \
            tuple(float(v) for v in (raw_sigmas or ()))
        extra = req.get("extra_sample_args")
        extra_map = parse_key_values(extra) if isinstance(extra, str) else dict(extra or {})  # type: ignore[call-overload]
        eta, shift = req.get("eta"), req.get("flow_shift")
        return cls(eta=None if eta is None else float(eta),  # type: ignore[arg-type]
                   sigmas=sigmas, flow_shift=None if shift is None else float(shift),  # type: ignore[arg-type]
                   timestep_shift=int(req.get("timestep_shift") or 0),  # type: ignore[call-overload]
                   rng=str(req.get("rng") or "cuda"),
                   sampler_rng=str(req["sampler_rng"]) if req.get("sampler_rng") else None,
                   extra=extra_map)


#: Largest finite float32 (the engine's sigmas and latents are float32).
FLOAT32_MAX = 3.4028234663852886e38
#: Most ``--sigmas`` values: 1000 steps (the discrete schedules' training timesteps, and
#: ``--steps``' limit) ending in 0.
MAX_SIGMAS = 1001


def check_sigmas(sigmas: Sequence[float]) -> None:
    """Refuse custom sigmas that are not finite (in float32: at most :data:`FLOAT32_MAX`), are
    negative, or are more than :data:`MAX_SIGMAS` values (more than 1000 steps once the final
    0 is added).

    Raises:
        SamplingError: naming ``--sigmas`` and the first bad value.
    """
    if len(sigmas) > MAX_SIGMAS or (len(sigmas) == MAX_SIGMAS and sigmas[-1] != 0.0):
        raise SamplingError(f"--sigmas holds {len(sigmas)} values; at most {MAX_SIGMAS} "
                            f"(1000 steps, ending in 0)")
    for i, s in enumerate(sigmas):
        if not math.isfinite(s):
            raise SamplingError(f"--sigmas value {i + 1} is {s}; sigmas must be finite numbers")
        if s > FLOAT32_MAX:
            raise SamplingError(f"--sigmas value {i + 1} is {s:g}; sigmas must be finite in the "
                                f"engine's float32 (at most {FLOAT32_MAX:g})")
        if s < 0:
            raise SamplingError(f"--sigmas value {i + 1} is {s:g}; sigmas must not be negative")


def parse_sigmas(text: str) -> tuple[float, ...]:
    """``--sigmas`` text (``"14.61,7.8,3.5,0.0"``, brackets allowed) -> floats, as sd-cli
    reads it.

    Raises:
        SamplingError: a value that is not a number, or no value at all.
    """
    body = text.strip()
    if body.startswith("["):
        body = body[1:]
    if body.endswith("]"):
        body = body[:-1]
    out = []
    for item in body.split(","):
        item = item.strip()
        if item:
            try:
                out.append(float(item))
            except ValueError:
                raise SamplingError(f"--sigmas: {item!r} is not a number") from None
    if not out:
        raise SamplingError(f"--sigmas: no values in {text!r}")
    return tuple(out)


def parse_key_values(text: str) -> dict[str, str]:
    """``key=value,key=value`` (``--extra-sample-args``) -> mapping, keys and values trimmed.

    Raises:
        SamplingError: an entry without ``=`` or with an empty key.
    """
    out: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise SamplingError(f"--extra-sample-args: {part.strip()!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def prepare(opts: SamplingOptions, seed: int, steps: int, scheduler: str,
            schedule: DiscreteSchedule | FlowSchedule, family: str = "sd1",
            image_tokens: int | None = None
            ) -> tuple[NoiseSource, NoiseSource, np.ndarray]:
    """``(start_noise, sampler_noise, sigmas)`` for a run (module docstring).

    ``sigmas`` is float32: ``opts.sigmas`` with a final 0 added when it does not end in 0,
    else :func:`~sdplan.core.sampling.schedules.get_sigmas` for ``scheduler``.

    Raises:
        SamplingError: custom sigmas that do not descend, scheduler errors.
    """
    import numpy as np
    from sdplan.core.sampling.noise import make_noise
    from sdplan.core.sampling.schedules import get_sigmas

    start = make_noise(opts.rng, seed)
    sampler = start if opts.sampler_rng in (None, opts.rng) else \
        make_noise(opts.sampler_rng, seed)  # type: ignore[arg-type]
    if opts.sigmas:
        values = list(opts.sigmas)
        if values[-1] != 0.0:
            values.append(0.0)
        if len(values) < 2 or any(b > a for a, b in zip(values, values[1:], strict=False)):
            raise SamplingError(f"--sigmas must descend, got {list(opts.sigmas)}")
        sigmas = np.asarray(values, dtype=np.float32)
    else:
        sigmas = get_sigmas(scheduler, steps, schedule, family, image_tokens, opts.extra)
    return start, sampler, sigmas


def shifted_timestep(sigma: float, shift: int, schedule: DiscreteSchedule,
                     scalings_of: Callable[[float], tuple[float, float, float]]
                     ) -> tuple[float, float, float]:
    """sd-cli's ``--timestep-shift`` for a step at ``sigma`` (``adjust_sample_step_scalings``):
    the model is given timestep ``round(t(sigma) * shift / 1000)`` (clamped to 0..999) and
    its output is combined with that timestep's scalings. Returns ``(t_shifted, c_skip,
    c_out)`` with ``c_skip = c_skip(s') c_in(sigma) / c_in(s')`` and ``c_out = c_out(s')``,
    ``s'`` the shifted timestep's sigma, ``scalings_of(s) -> (c_skip, c_out, c_in)`` the
    model's scalings (:func:`~sdplan.core.sampling.schedules.scalings`).
    """
    t = schedule.sigma_to_t(float(sigma))
    shifted = int(min(max(round(t * shift / 1000.0), 0), 999))
    s2 = float(schedule.t_to_sigma(float(shifted)))
    skip2, out2, in2 = scalings_of(s2)
    return float(shifted), skip2 * scalings_of(float(sigma))[2] / in2, out2
