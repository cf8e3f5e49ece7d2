"""sd-cli's sampler, scheduler and noise generator names, without numpy.

The command line checks ``--sampling-method``, ``--scheduler``, ``--rng`` and
``--sampler-rng`` against these before the engine starts, so they live apart from the
numerical code that runs them (:mod:`sdplan.core.sampling.samplers`,
:mod:`sdplan.core.sampling.flow`, :mod:`sdplan.core.sampling.schedules`,
:mod:`sdplan.core.sampling.noise`, which re-export them).
"""

from __future__ import annotations

__all__ = ["SAMPLERS", "FLOW_SAMPLERS", "SCHEDULES", "TOKEN_SCHEDULES", "RNGS", "samplers_for", "schedulers_for"]

#: sd-cli ``--sampling-method`` names in sd-cli's order, each with an entry in
#: :data:`sdplan.core.sampling.samplers.SAMPLER_FUNCTIONS`: the one list the command line,
#: the engine and the app offer.
SAMPLERS = (
    "euler",
    "euler_a",
    "heun",
    "dpm2",
    "dpm++2s_a",
    "dpm++2m",
    "dpm++2mv2",
    "ipndm",
    "ipndm_v",
    "lcm",
    "ddim_trailing",
    "tcd",
    "res_multistep",
    "res_2s",
    "er_sde",
    "euler_cfg_pp",
    "euler_a_cfg_pp",
    "euler_ge",
    "dpm++2m_sde",
    "dpm++2m_sde_bt",
    "lms",
)
#: sd-cli sampler names that apply to flow matching: all of sd-cli's but ``tcd`` (whose
#: jumps are defined by the SD 1.x noise schedule's timesteps).
FLOW_SAMPLERS = tuple(name for name in SAMPLERS if name != "tcd")
#: sd-cli ``--scheduler`` names in sd-cli's order (``default`` and ``normal`` are accepted
#: as ``discrete``): the one list the command line, the engine and the app offer.
SCHEDULES = ("discrete", "karras", "exponential", "ays", "gits", "sgm_uniform", "simple",
             "smoothstep", "kl_optimal", "lcm", "bong_tangent", "ltx2", "logit_normal", "flux2",
             "flux", "beta")
#: Schedulers that need the image's token count (patches of the latent).
TOKEN_SCHEDULES = frozenset({"ltx2", "logit_normal", "flux2", "flux"})
#: sd-cli ``--rng`` / ``--sampler-rng`` names (:func:`sdplan.core.sampling.noise.make_noise`).
RNGS = ("std_default", "cuda", "cpu")


def samplers_for(sampling: str) -> tuple[str, ...]:
    """The ``--sampling-method`` names a family of ``sampling`` kind runs
    (:attr:`sdplan.core.families.declaration.Family.sampling`): ``discrete``, every sd-cli
    sampler (with sd-cli's alias ``ddim``); ``flow``, :data:`FLOW_SAMPLERS`."""
    return (*SAMPLERS, "ddim") if sampling == "discrete" else FLOW_SAMPLERS


def schedulers_for(sampling: str) -> tuple[str, ...]:
    """The ``--scheduler`` names a family of ``sampling`` kind runs, ``default`` first:
    ``flow`` models every sd-cli scheduler; ``discrete`` ones all but the token schedules
    (:data:`TOKEN_SCHEDULES`: they need a patchified latent's token count); ``normal`` is
    sd-cli's alias of ``discrete``."""
    names = SCHEDULES if sampling == "flow" else tuple(s for s in SCHEDULES if s not in TOKEN_SCHEDULES)
    return ("default", "normal", *names)
