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

from types import ModuleType

from sdplan.core.errors import InventoryError
from sdplan.core.runtime import kernels


class NativeUnavailable(InventoryError):
    """The native module is not built or cannot be loaded here."""

    code = "native_unavailable"


_CHECKED: list[bool] = []


def native() -> ModuleType:
    """The native module ``sdplan._ggml``, checked once to agree with the loaded ggml
    library on the tensor layout (:func:`check_tensor_layout`).

    Its first use also chooses this process's CPU kernels and hands them to it
    (:mod:`sdplan.core.runtime.kernels`).

    Raises:
        NativeUnavailable: the extension is not built or cannot be loaded, or it was built
            for another tensor-name length than the library (the message says to reinstall
            sdplan).
        InvalidArgument: a malformed kernel setting in the environment (naming it).
    """
    try:
        import sdplan._ggml as module
    except ImportError as exc:  # pragma: no cover - only without a build
        raise NativeUnavailable(
            f"sdplan's native module sdplan._ggml cannot be loaded ({exc}); reinstall sdplan"
        ) from None
    if not _CHECKED:
        check_tensor_layout(module)
        kernels.apply(module, kernels.choose(module))  # the CPU kernels, chosen once, handed down
        _CHECKED.append(True)
    return module


def cpu_kernels() -> kernels.CpuKernels:
    """The CPU kernels this process runs (:mod:`sdplan.core.runtime.kernels`: chosen once from
    the CPU's features, the environment and the measured rule)."""
    return kernels.current(native())


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
