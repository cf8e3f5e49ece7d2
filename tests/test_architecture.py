"""The architecture holds: the one-way flow (every import counted, function-local ones
too), no cycles, small modules, one home for shared pieces, a map that matches the tree,
``sdplan.core`` importable without Qt and the native module, and the house linters."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import archcheck
import pytest
from conftest import REPO

# ----------------------------------------------------------------------------- the flow


def test_the_flow_holds() -> None:
    problems = archcheck.check_tree(REPO)
    assert problems == [], "\n".join(problems)


def _copy_tree(tmp_path: Path) -> Path:
    for folder in archcheck.PACKAGES:
        shutil.copytree(REPO / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _plant(root: Path, rel: str, code: str) -> None:
    path = root / rel
    path.write_text(path.read_text(encoding="utf-8") + "\n\n" + textwrap.dedent(code),
                    encoding="utf-8")


@pytest.mark.parametrize(("rel", "code", "expect"), [
    # a function-local import of numpy in planning
    ("core/planning/plan.py", "def _planted():\n    import numpy\n    return numpy\n",
     "sdplan.core.planning.plan:{line} imports numpy: planning is pure Python"),
    # an upward import hidden in a function: planning -> runtime
    ("core/planning/profile.py",
     "def _planted():\n    from sdplan.core.runtime import devices\n    return devices\n",
     "imports sdplan.core.runtime.devices: layer planning may not import layer runtime"),
    # a sibling of the same rank: text -> sampling
    ("core/text/prompt.py", "from sdplan.core.sampling import samplers\n",
     "layer text may not import layer sampling"),
    # Qt from core, under TYPE_CHECKING
    ("core/pipelines/sd/pipeline.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
     "    from PySide6.QtCore import QObject\n", "core never imports Qt"),
    # the native module outside its door
    ("core/models/unet.py", "def _planted():\n    import sdplan._ggml\n",
     "only sdplan.core.runtime.native imports the native module"),
    # the app reaching a command module
    ("app/main.py", "def _planted():\n    from sdplan.core.commands import plan\n",
     "the app never imports a command module"),
    # the engine's side reaching up into the session
    ("core/pipelines/compute.py", "def _planted():\n    from sdplan.core.session import board\n",
     "layer pipelines may not import layer session"),
    # Qt in the session
    ("core/session/board.py", "def _planted():\n    from PySide6.QtCore import QObject\n",
     "core never imports Qt"),
    # core reaching a command module
    ("core/pipelines/jobs.py", "def _planted():\n    from sdplan.core.commands.generate import run\n",
     "nothing in core imports a command module"),
])
def test_the_flow_check_fails_on_a_planted_bad_import(tmp_path: Path, rel: str, code: str,
                                                      expect: str) -> None:
    root = _copy_tree(tmp_path)
    assert archcheck.check_tree(root) == []
    before = len((root / rel).read_text(encoding="utf-8").splitlines())
    _plant(root, rel, code)
    problems = archcheck.check_tree(root)
    planted = [p for p in problems if expect.split("{line}")[-1] in p]
    assert len(planted) == 1, problems
    if "{line}" in expect:  # the line of the planted import is named
        line = before + 4  # two blank lines, the def, then the import
        assert planted[0].startswith(expect.split("{line}")[0] + str(line)), planted


def test_the_flow_check_finds_a_cycle_through_function_local_imports(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    _plant(root, "core/planning/estimate.py",
           "def _planted():\n    from sdplan.core.planning import autoplan\n")
    problems = archcheck.check_tree(root)
    assert any(p.startswith("import cycle: ") and "sdplan.core.planning.autoplan" in p
               and "sdplan.core.planning.estimate" in p for p in problems), problems


def test_cycle_finder_on_small_graphs() -> None:
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert sorted(archcheck.cycles(g)) == [["a", "b", "c"], ["e"]]
    assert archcheck.cycles({"a": {"b"}, "b": set()}) == []


def test_layers_of_modules() -> None:
    assert archcheck.layer_of("sdplan.core.errors") == "base"
    assert archcheck.layer_of("sdplan.core.cli") == "commands"
    assert archcheck.layer_of("sdplan.core.planning.plan") == "planning"
    assert archcheck.layer_of("sdplan.app.board.cards") == "app"
    assert archcheck.layer_of("sdplan.core.session.board") == "session"
    assert archcheck.layer_of("numpy") is None
    assert archcheck.check_edge("sdplan.core.commands.gui", "sdplan.app.main") is None
    assert archcheck.check_edge("sdplan.core.commands.plan", "sdplan.app.main") is not None
    assert archcheck.check_edge("sdplan.core.pipelines.sd.pipeline", "sdplan.core.models.unet") is None
    assert archcheck.check_edge("sdplan.core.session.session", "sdplan.core.pipelines.request") is None
    assert archcheck.check_edge("sdplan.app.controller", "sdplan.core.session.session") is None


# ----------------------------------------------------------------------------- sizes and homes

def test_no_core_or_app_module_over_600_lines() -> None:
    assert archcheck.long_modules(REPO, 600, ("core", "app")) == []


def test_size_check_sees_a_long_app_module(tmp_path: Path) -> None:
    root = _copy_tree(tmp_path)
    (root / "app" / "planted.py").write_text("x = 1\n" * 601, encoding="utf-8")
    assert archcheck.long_modules(root, 600, ("core", "app")) == ["app/planted.py: 601 lines"]


def _classes(root: Path) -> list[tuple[str, ast.ClassDef]]:
    out = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        out += [(str(path.relative_to(REPO)), n) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    return out


def test_one_weights_view_and_one_whole_graph_adapter() -> None:
    """Name-prefix views (Mapping subclasses) and graphs without blocks (``n_blocks = 0``)
    are defined once, in ``core/models/base.py``; everything else uses them."""
    views, adapters = [], []
    for rel, cls in _classes(REPO / "core"):
        bases = {ast.unparse(b).split("[")[0] for b in cls.bases}
        if bases & {"Mapping", "MutableMapping", "dict"}:
            views.append(f"{rel}:{cls.name}")
        for stmt in cls.body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and \
                    "n_blocks" in ast.unparse(stmt).split("=")[0] and \
                    ast.unparse(stmt).rstrip().endswith("= 0"):
                adapters.append(f"{rel}:{cls.name}")
    assert views == ["core/models/base.py:Weights"]
    assert adapters == ["core/models/base.py:WholeGraph"]


def test_test_doubles_stay_out_of_the_package() -> None:
    names = {cls.name for _, cls in _classes(REPO / "core") + _classes(REPO / "app")}
    assert not {n for n in names if n.startswith(("Replay", "Fake", "Dummy"))}


# ----------------------------------------------------------------------------- the map

def _mapped_folders(text: str) -> set[str]:
    section = text.split("## The map", 1)[1].split("\n## ", 1)[0]
    return {m.group(1).rstrip("/") for m in re.finditer(r"^- `([\w./-]+/)`", section, re.M)}


def _existing_folders() -> set[str]:
    proc = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                          cwd=REPO, capture_output=True, text=True, check=True)
    folders = set()
    for line in proc.stdout.splitlines():
        parent = str(Path(line).parent)
        if parent != "." and not parent.startswith("."):
            folders.add(parent)
    return folders


def test_architecture_doc_matches_the_tree() -> None:
    mapped = _mapped_folders((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    existing = _existing_folders()
    assert mapped - existing == set(), "docs/architecture.md names folders that do not exist"
    assert existing - mapped == set(), "folders missing from docs/architecture.md"


def test_map_parser_sees_a_missing_folder() -> None:
    text = "## The map\n\n- `core/` x\n- `core/planning/` y\n\n## Layers\n- `nope/` z\n"
    assert _mapped_folders(text) == {"core", "core/planning"}


# ----------------------------------------------------------------------------- imports and linters

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


def _tool(name: str) -> str:
    """The linter installed beside this interpreter (the test extra), else one on PATH."""
    beside = str(Path(sys.executable).with_name(name))
    exe = shutil.which(beside) or shutil.which(name)
    if exe is None:
        pytest.skip(f"{name} is not installed (it is part of the test extra)")
    return exe


def test_ruff_clean() -> None:
    proc = subprocess.run([_tool("ruff"), "check", "core", "app", "tests", "bench", "tools"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_core() -> None:
    proc = subprocess.run([_tool("mypy"), "core"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
