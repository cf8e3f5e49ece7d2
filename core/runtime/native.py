"""The one door to the native module ``sdplan._ggml`` (ggml bound with nanobind).

Every Python module that runs ggml reaches the binding through :func:`native`, so that
``sdplan.core`` imports without it (planning and the app's board work on a machine where
the extension is missing) and a missing build is one clear error instead of an
ImportError deep inside a model. What the binding offers, model-agnostic:

* devices and backends: ``list_devices``, ``BackendManager``, ``device_memory``,
  ``features``; RPC: ``rpc_available``, ``rpc_add_server``, ``rpc_servers``,
  ``rpc_start_server``;
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


class NativeUnavailable(InventoryError):
    """The native module is not built or cannot be loaded here."""

    code = "native_unavailable"


def native() -> ModuleType:
    """The native module ``sdplan._ggml``.

    Raises:
        NativeUnavailable: the extension is not built or cannot be loaded (the message says
            to reinstall sdplan).
    """
    try:
        import sdplan._ggml as module
    except ImportError as exc:  # pragma: no cover - only without a build
        raise NativeUnavailable(
            f"sdplan's native module sdplan._ggml cannot be loaded ({exc}); reinstall sdplan"
        ) from None
    return module
