"""The architecture's layering holds: ``sdplan.core`` imports without Qt and without the
native extension, and the code passes the house linters (ruff everywhere, mypy on core)."""

from __future__ import annotations

import pkgutil
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

# Poison PySide6 and the native module, then import every core module.
_BLOCKED_IMPORT = textwrap.dedent(
    """
    import importlib, pkgutil, sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split('.')[0] in ('PySide6', 'shiboken6') or name == 'sdplan._ggml':
                raise ImportError('blocked: ' + name)
            return None
    sys.meta_path.insert(0, Block())
    import sdplan.core
    bad = []
    for m in pkgutil.walk_packages(sdplan.core.__path__, 'sdplan.core.'):
        try:
            importlib.import_module(m.name)
        except ImportError as exc:
            bad.append(f'{m.name}: {exc}')
    print('\\n'.join(bad))
    sys.exit(1 if bad else 0)
    """
)


def test_core_imports_without_qt_and_native() -> None:
    proc = subprocess.run([sys.executable, "-c", _BLOCKED_IMPORT], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"core modules import Qt or the native module at import time:\n{proc.stdout}{proc.stderr}"


def test_core_has_modules() -> None:
    import sdplan.core

    names = {m.name for m in pkgutil.iter_modules(sdplan.core.__path__)}
    assert {"assignment", "plan", "placement", "inventory", "checkpoint", "estimate"} <= names


def _tool(name: str) -> str:
    """The linter installed beside this interpreter (the test extra), else one on PATH."""
    beside = str(Path(sys.executable).with_name(name))
    exe = shutil.which(beside) or shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} is not installed (it is part of the test extra)")
    return exe


def test_ruff_clean() -> None:
    proc = subprocess.run([_tool("ruff"), "check", "core", "app", "tests", "bench"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_core() -> None:
    proc = subprocess.run([_tool("mypy"), "core"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
