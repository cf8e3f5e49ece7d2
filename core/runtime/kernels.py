"""The CPU kernels a process runs, chosen in one place and handed to the native module.

Three inputs decide, in this order:

1. the CPU's features, as the native module reports them (``bf16_cpu_kernel``: ``amx`` with
   AMX tiles, ``avx512`` with AVX512_BF16, else ``off``; ``cpu_avx2_fma``: AVX2, FMA and F16C
   for the FMA product; the Winograd convolution's build; the GELU rows' SIMD width);
2. the environment: ``SDPLAN_BF16_KERNEL`` (auto, amx, avx512, off) and ``SDPLAN_FMA_GEMM``
   (on, off), read here and nowhere else;
3. the measured rule: with AVX512_BF16 alone, the modules whose class lists ``avx512_fast``
   run bf16 only where a timed product is at least :data:`FAST_SPEEDUP` times the f16 one
   (:func:`sdplan.core.runtime.bf16_rule.avx512_bf16_speedup`, timed once per process, only
   when such a module is first built).

:func:`choose` makes the decision (:class:`CpuKernels`); :func:`apply` gives it to the native
module once, as values (``set_bf16_kernel``, ``set_fma_gemm``), on the module's first use
(:func:`sdplan.core.runtime.native.native`): the C++ side receives decisions and never reads the
environment. :func:`sdplan.core.runtime.native.cpu_kernels` is the choice as it runs. Each model class lists, in ``cpu_bf16_kernels``,
the kernels it measured faster with (data, not a decision); :meth:`CpuKernels.holds_bf16` is
the one place that data meets the choice.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from sdplan.core.errors import InvalidArgument

__all__ = ["BF16_ENV", "FMA_ENV", "FAST_SPEEDUP", "CpuKernels", "current", "running", "apply", "choose"]

#: Environment variable choosing the CPU bf16 kernel (auto, amx, avx512, off) for this process
#: and the engine processes it starts; unset means auto, the fastest the CPU runs (bf16 weights
#: change outputs by about 1% of their range against f16's 0.1%, tests/test_bf16_models.py;
#: ``off`` keeps f16 weights, multiplied by sdplan's FMA product where the CPU has AVX2, FMA and
#: F16C, else by ggml's).
BF16_ENV = "SDPLAN_BF16_KERNEL"

#: Environment variable turning sdplan's FMA product (f16 linear weights and f16/f32
#: convolution kernels widened to f32 and multiplied with AVX2/FMA, native/kernels/fma_gemm.cpp)
#: on or off for this process and its engine processes; unset means on where the CPU runs it.
#: ``off`` hands those products to ggml (which rounds the activations to f16 as well).
FMA_ENV = "SDPLAN_FMA_GEMM"

#: Smallest measured speed-up (f16 product time / bf16 product time) at which the modules
#: listing ``avx512_fast`` take AVX512_BF16 (core/runtime/bf16_rule.py says how it was set).
FAST_SPEEDUP = 1.5


@dataclass(frozen=True)
class CpuKernels:
    """The process's CPU kernel choice (module docstring).

    Attributes:
        bf16: the bf16 kernel graphs use: ``amx``, ``avx512`` or ``off``.
        cpu_bf16: the best bf16 kernel this CPU runs (what ``auto`` gives).
        fma_gemm: f16 products and convolutions by sdplan's FMA product.
        wino: the Winograd convolution's build (``avx512``, ``avx2``, ``generic``).
        glu: the GELU rows' SIMD (``avx512``, ``avx2``, ``off``).
        why: each choice's source, for people: ``{"bf16": "SDPLAN_BF16_KERNEL=off", ...}``.
    """

    bf16: str
    cpu_bf16: str
    fma_gemm: bool
    wino: str
    glu: str
    why: dict[str, str] = field(default_factory=dict, compare=False)

    def avx512_fast(self, speedup: Callable[[], float]) -> bool:
        """Whether AVX512_BF16 measured fast enough here for the modules listing
        ``avx512_fast``: ``speedup()`` (the timed product's ratio,
        :func:`sdplan.core.runtime.bf16_rule.avx512_bf16_speedup`, called only with the avx512
        kernel in use) reaches :data:`FAST_SPEEDUP`."""
        return self.bf16 == "avx512" and speedup() >= FAST_SPEEDUP

    def holds_bf16(self, listed: Any, speedup: Callable[[], float]) -> bool:
        """Whether a model class whose ``cpu_bf16_kernels`` are ``listed`` runs its products
        in bf16: the kernel in use is listed, or it is ``avx512``, the class lists
        ``avx512_fast`` and :meth:`avx512_fast` holds."""
        kernels = tuple(listed or ())
        if self.bf16 == "off":
            return False
        return self.bf16 in kernels or ("avx512_fast" in kernels and self.avx512_fast(speedup))

    def to_json(self) -> dict[str, object]:
        return {"bf16_kernel": self.bf16, "bf16_cpu_kernel": self.cpu_bf16, "fma_gemm": self.fma_gemm,
                "wino_kernel": self.wino, "glu_simd": self.glu, "why": dict(self.why)}


def _bf16_value(value: str | None, cpu: str) -> tuple[str | None, str]:
    """The bf16 kernel ``$SDPLAN_BF16_KERNEL`` asks for (None: auto) and why.

    Raises:
        InvalidArgument: an unknown name, or a kernel this CPU cannot run.
    """
    if not value or value.strip().lower() == "auto":
        return None, f"auto: the CPU runs {cpu}"
    name = value.strip().lower()
    if name not in ("amx", "avx512", "off"):
        raise InvalidArgument(f"{BF16_ENV}={value!r}: expected auto, amx, avx512 or off")
    order = {"off": 0, "avx512": 1, "amx": 2}
    if order[name] > order.get(cpu, 0):
        raise InvalidArgument(f"{BF16_ENV}={value!r}: this CPU runs {cpu} at best")
    return name, f"{BF16_ENV}={name}"


def _fma_value(value: str | None) -> bool | None:
    """``$SDPLAN_FMA_GEMM`` as True/False, None when unset.

    Raises:
        InvalidArgument: any value but on, off, 1, 0.
    """
    if not value:
        return None
    choice = {"on": True, "1": True, "off": False, "0": False}.get(value.strip().lower())
    if choice is None:
        raise InvalidArgument(f"{FMA_ENV}={value!r}: expected on or off (1 or 0)")
    return choice


def choose(module: ModuleType, environ: Any = None) -> CpuKernels:
    """The choice for this CPU (``module``: the native module, for its features) and
    ``environ`` (default: ``os.environ``), without applying it.

    Raises:
        InvalidArgument: a malformed or impossible setting in the environment (naming it).
    """
    env = os.environ if environ is None else environ
    cpu = str(module.bf16_cpu_kernel())
    bf16, why_bf16 = _bf16_value(env.get(BF16_ENV), cpu)
    fma = _fma_value(env.get(FMA_ENV))
    fma_cpu = bool(module.cpu_avx2_fma())
    return CpuKernels(bf16=bf16 or cpu, cpu_bf16=cpu,
                      fma_gemm=fma_cpu if fma is None else (fma and fma_cpu),
                      wino=str(module.wino_kernel()), glu=str(module.glu_simd_name()),
                      why={"bf16": why_bf16,
                           "fma_gemm": f"{FMA_ENV}={'on' if fma else 'off'}" if fma is not None
                           else ("auto: AVX2, FMA and F16C" if fma_cpu else "auto: no AVX2/FMA/F16C")})


_CURRENT: list[CpuKernels] = []


def apply(module: ModuleType, choice: CpuKernels) -> None:
    """Hand ``choice`` to the native module (its kernels then run as chosen) and make it this
    process's :func:`current`."""
    module.set_bf16_kernel(choice.bf16)
    module.set_fma_gemm(choice.fma_gemm)
    _CURRENT[:] = [choice]


def running(module: ModuleType) -> CpuKernels:
    """The kernels ``module`` (the native module) runs now, with the sources of this process's
    choice where it made one (``set in this process`` where a caller changed a kernel since)."""
    base = _CURRENT[0] if _CURRENT else None
    bf16, fma = str(module.bf16_kernel()), bool(module.fma_gemm())
    why = dict(base.why) if base is not None else {}
    if base is None or bf16 != base.bf16:
        why["bf16"] = "set in this process"
    if base is None or fma != base.fma_gemm:
        why["fma_gemm"] = "set in this process"
    glu = getattr(module, "glu_simd_name", None)
    return CpuKernels(bf16=bf16, cpu_bf16=str(module.bf16_cpu_kernel()), fma_gemm=fma,
                      wino=str(module.wino_kernel()), glu=str(glu()) if glu else "off", why=why)


def current(ng: ModuleType) -> CpuKernels:
    """This process's choice (made and applied on the native module's first use:
    :func:`sdplan.core.runtime.native.native`; ``ng`` is that module), as it runs now (a
    benchmark or test that sets another kernel with ``set_bf16_kernel``/``set_fma_gemm`` is
    seen, its source named ``set in this process``)."""
    if not _CURRENT:
        apply(ng, choose(ng))
    base = _CURRENT[0]
    if (str(ng.bf16_kernel()), bool(ng.fma_gemm())) == (base.bf16, base.fma_gemm):
        return base
    return running(ng)
