"""The one door to the native module ``sdplan._ggml`` (ggml bound with nanobind).

Every Python module that runs ggml reaches the binding through :func:`native`, so that
``sdplan.core`` imports without it (planning and the app's board work on a machine where
the extension is missing) and a missing build is one clear error instead of an
ImportError deep inside a model. What the binding offers, model-agnostic:

* devices and backends: ``list_devices``, ``BackendManager``, ``device_memory``,
  ``features``; RPC: ``rpc_available``, ``rpc_add_server``, ``rpc_servers``,
  ``rpc_start_server``, ``rpc_protocol``; the tensor layout: ``ggml_max_name`` (compiled),
  ``library_max_name`` (measured), ``tensor_overhead``;
* weights: ``WeightStore`` (tensors by name in backend buffers, read from files in
  chunks, staged between stores), ``WeightBuffer``;
* graphs: ``Graph`` (ops in numpy shape order, a ggml graph scheduler over several
  backends, reserve/compute/cancel, profiling; the conventions are
  :mod:`sdplan.core.runtime.graph`'s), ``ComputeCancelled``;
* custom CPU kernels (the Winograd convolution) behind ``Graph.conv_2d``.
"""

from __future__ import annotations

import os
from types import ModuleType

from sdplan.core.errors import InvalidArgument, InventoryError


class NativeUnavailable(InventoryError):
    """The native module is not built or cannot be loaded here."""

    code = "native_unavailable"


_CHECKED: list[bool] = []


def native() -> ModuleType:
    """The native module ``sdplan._ggml``, checked once to agree with the loaded ggml
    library on the tensor layout (:func:`check_tensor_layout`).

    Raises:
        NativeUnavailable: the extension is not built or cannot be loaded, or it was built
            for another tensor-name length than the library (the message says to reinstall
            sdplan).
    """
    try:
        import sdplan._ggml as module
    except ImportError as exc:  # pragma: no cover - only without a build
        raise NativeUnavailable(
            f"sdplan's native module sdplan._ggml cannot be loaded ({exc}); reinstall sdplan"
        ) from None
    if not _CHECKED:
        check_tensor_layout(module)
        apply_bf16_setting(module, os.environ.get(BF16_ENV))
        apply_fma_setting(module, os.environ.get(FMA_ENV))
        _CHECKED.append(True)
    return module


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


def apply_bf16_setting(module: ModuleType, value: str | None) -> None:
    """Use the bf16 kernel named by ``value`` (``$SDPLAN_BF16_KERNEL``: auto, amx, avx512 or
    off; None or empty: leave the default, auto).

    Raises:
        InvalidArgument: an unknown name or a kernel this CPU cannot run (the message names
            the variable and what the CPU runs): a setting to correct, not a missing module,
            so no command falls back to planning without the live devices.
    """
    if not value:
        return
    try:
        module.set_bf16_kernel(value.strip().lower())
    except ValueError as exc:
        reason = str(exc).removeprefix("set_bf16_kernel: ")
        raise InvalidArgument(f"{BF16_ENV}={value!r}: {reason}") from None


def apply_fma_setting(module: ModuleType, value: str | None) -> None:
    """Turn the FMA product on or off (``$SDPLAN_FMA_GEMM``: on, off, 1, 0; None or empty:
    leave the default, on where the CPU runs it).

    Raises:
        InvalidArgument: any other value (the message names the variable and the choices).
    """
    if not value:
        return
    choice = {"on": True, "1": True, "off": False, "0": False}.get(value.strip().lower())
    if choice is None:
        raise InvalidArgument(f"{FMA_ENV}={value!r}: expected on or off (1 or 0)")
    module.set_fma_gemm(choice)


def check_tensor_layout(module: ModuleType) -> None:
    """The module and the ggml library must agree on ``GGML_MAX_NAME`` (it sizes every
    ``ggml_tensor`` and the RPC tensor record): compare the module's compiled value with the
    library's measured one.

    Raises:
        NativeUnavailable: they disagree (one line with both values and the fix).
    """
    if not hasattr(module, "ggml_max_name"):  # pragma: no cover - a module without the check
        return
    mine, lib = int(module.ggml_max_name()), int(module.library_max_name())
    if mine != lib:
        raise NativeUnavailable(
            f"sdplan's native module was built for tensor names of {mine} bytes but the ggml "
            f"library uses {lib}; "
            "reinstall sdplan against this libggml-python "
            "(pip install --no-build-isolation --force-reinstall --no-deps .)")
