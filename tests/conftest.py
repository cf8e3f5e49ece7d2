"""Shared test fixtures: the location of ``../shared`` and markers' skip rules.

``SHARED`` is ``<repo>/../shared``; tests that need it use the ``shared_dir`` fixture,
which skips when the folder is absent (a user's fresh clone) and fails when
``SDPLAN_REQUIRE_SHARED=1`` (CI), so CI can never silently skip them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The f16 path (f16 weights; sdplan's FMA products, or ggml's on a CPU without AVX2, FMA and
# F16C) is what the parity tests' tolerances are for: the
# suite runs it unless told otherwise. The bf16 kernels, sdplan's default on CPUs that have
# them, are tested on every path the CPU runs, at their own tolerance, in test_bf16_kernels.py
# and test_bf16_models.py (which choose the kernel themselves).
os.environ.setdefault("SDPLAN_BF16_KERNEL", "off")

# Qt's offscreen platform has one 800x800 screen by default: the window's first size follows
# the available screen, so the app's tests get a 1920x1080 desk (tests that need another
# screen write their own file; ``offscreen:configfile=...``).
SCREEN = Path(__file__).resolve().parent / "offscreen_screen.json"
# Model hashes and library entries written by the code under test stay out of the user's
# cache folder.
_OWN_CACHE: str | None = None
if "SDPLAN_CACHE_DIR" not in os.environ:
    import tempfile

    _OWN_CACHE = os.environ["SDPLAN_CACHE_DIR"] = tempfile.mkdtemp(prefix="sdplan-test-cache-")
    # measured device profiles (``$XDG_CACHE_HOME/sdplan``) too: tests see this machine's
    # calibration only where they write one themselves
    os.environ["XDG_CACHE_HOME"] = os.path.join(_OWN_CACHE, "xdg")
if os.environ.get("QT_QPA_PLATFORM", "offscreen") == "offscreen":
    os.environ["QT_QPA_PLATFORM"] = f"offscreen:configfile={SCREEN}"


def _apply_kernel_setting() -> None:
    """Load the native module now, so the setting holds before any test (or a module-level
    skip condition) reads the kernel in use; tests that need the module skip on their own."""
    from sdplan.core.runtime.native import NativeUnavailable, native

    try:
        native()
    except NativeUnavailable:
        pass


_apply_kernel_setting()

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


def require_or_skip(what: str, env: str) -> None:
    """Skip with ``what`` as the reason, or fail when the variable ``env`` is ``1``."""
    if os.environ.get(env) == "1":
        pytest.fail(f"{what} (and {env}=1 forbids skipping)")
    pytest.skip(what)


@pytest.fixture(scope="module")
def cpus():
    """Two CPU backend instances as devices ``CPU`` and ``CPU1`` (one thread each): a layer
    split across two backends without a second device, one pool per test module."""
    ng = pytest.importorskip("sdplan._ggml")
    from sdplan.core.runtime.runner import BackendPool

    second = ng.init_backend("CPU")
    second.set_n_threads(1)
    p = BackendPool(ng.BackendManager(1), extra={"CPU1": second})
    yield p
    p.manager.close()


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """The ``../shared`` folder beside the checkout (skips when absent)."""
    if not SHARED.is_dir():
        require_or_skip(f"{SHARED} is absent", "SDPLAN_REQUIRE_SHARED")
    return SHARED


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ARG001 - pytest's signature
    """Close the engine's process-wide backends that in-process engine tests created
    (``process._POOL``, held for a process's lifetime by design), so that the native manager is
    freed while its module is alive rather than reported as leaked at the interpreter's exit."""
    import sys

    process = sys.modules.get("sdplan.core.runtime.process")
    pool = getattr(process, "_POOL", None)
    if pool is not None:
        pool.manager.close()
        process._POOL = None  # type: ignore[union-attr]
    if _OWN_CACHE is not None:
        import shutil

        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
