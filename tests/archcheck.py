"""The one-way flow of sdplan's code, as a check over source files.

Every import statement counts, wherever it is written (module top, inside a function,
under ``if TYPE_CHECKING``): :func:`imports_of` walks the whole syntax tree.

Layers, lowest first; a module may import its own layer and the layers below it, never
one above or a sibling of its rank::

    base       sdplan.core (package), sdplan.core.errors
    families   the family registry: one declaration per model family (pure Python)
    planning   placement strings -> plan (pure Python)
    modelfiles model files -> tensors, modules, families
    text | sampling      tokenizers and prompts | schedules, samplers, previews
    runtime    the engine's Python side
    models     graph definitions
    pipelines  one per family, and the engine jobs
    session    the desktop session without Qt: the board's state and operations
    server     ``sdplan serve`` below its command: APIs, queue, device groups, metrics
    commands   sdplan.core.cli and sdplan.core.commands.*
    app        sdplan.app.*

Besides the order: families and planning import neither numpy, the native module nor Qt; core never
imports Qt or ``sdplan.app`` but for the ``gui`` command's single entry
(``sdplan.core.commands.gui`` -> ``sdplan.app.main``); only ``sdplan.core.runtime.native``
imports ``sdplan._ggml``; the app never imports a command module; and no two
``sdplan`` modules import each other, directly or around a cycle.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: Source folder -> the package it installs as.
PACKAGES = {"core": "sdplan.core", "app": "sdplan.app"}

#: Layer name -> rank; a module may import ranks lower than its own, and its own layer.
RANKS = {"base": 0, "families": 1, "planning": 2, "modelfiles": 3, "text": 4, "sampling": 4,
         "runtime": 5, "models": 6, "pipelines": 7, "session": 8, "server": 9, "commands": 10, "app": 11}

QT = ("PySide6", "shiboken6")
NATIVE = "sdplan._ggml"
NATIVE_DOOR = "sdplan.core.runtime.native"
#: The one import from core into the app: the ``gui`` command's entry.
GUI_ENTRY = ("sdplan.core.commands.gui", "sdplan.app.main")


@dataclass(frozen=True)
class Violation:
    """One broken rule: ``module`` imports ``target`` (at ``line``) against ``rule``."""

    module: str
    target: str
    line: int
    rule: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line} imports {self.target}: {self.rule}"


def module_files(root: Path) -> dict[str, Path]:
    """Module name -> source file for every ``.py`` file under the source folders."""
    out: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


def _is_package(name: str, files: dict[str, Path]) -> bool:
    path = files.get(name)
    return path is not None and path.name == "__init__.py"


def imports_of(name: str, path: Path, files: dict[str, Path]) -> list[tuple[str, int]]:
    """Every module ``name`` (whose source is ``path``) imports, with the line: ``import a.b``
    gives ``a.b``; ``from a import b`` gives ``a.b`` when that is a module, else ``a``;
    relative imports are resolved against the module's package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if _is_package(name, files) else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in files else base, node.lineno))
    return found


def layer_of(module: str) -> str | None:
    """The layer of an ``sdplan`` module (None for modules outside the layers)."""
    if module.startswith("sdplan.app"):
        return "app"
    if module in ("sdplan.core", "sdplan.core.errors"):
        return "base"
    if module == "sdplan.core.cli" or module.startswith("sdplan.core.commands"):
        return "commands"
    parts = module.split(".")
    if len(parts) >= 3 and parts[:2] == ["sdplan", "core"] and parts[2] in RANKS:
        return parts[2]
    return None


def _top(target: str) -> str:
    return target.split(".")[0]


def check_edge(module: str, target: str) -> str | None:
    """The rule ``module`` importing ``target`` breaks, or None."""
    src = layer_of(module)
    if module.startswith("sdplan.core"):
        if _top(target) in QT:
            return "core never imports Qt"
        if target.startswith("sdplan.app") and (module, target) != GUI_ENTRY:
            return "core never imports the app (only the gui command's entry does)"
    if src in ("planning", "families"):
        if _top(target) == "numpy":
            return f"{src} is pure Python: no numpy"
        if _top(target) in QT:
            return f"{src} imports no Qt"
    if target == NATIVE and module != NATIVE_DOOR:
        return f"only {NATIVE_DOOR} imports the native module"
    dst = layer_of(target)
    if src is None or dst is None:
        return None
    if dst == "commands" and src != "commands":
        return ("the app never imports a command module" if src == "app"
                else "nothing in core imports a command module")
    if (module, target) == GUI_ENTRY:
        return None
    if RANKS[dst] > RANKS[src] or (RANKS[dst] == RANKS[src] and dst != src):
        return f"layer {src} may not import layer {dst}"
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing
    itself): each is an import cycle. Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1 or node in graph.get(node, ()):
                    out.append(sorted(comp))
    return out


def check_tree(root: Path) -> list[str]:
    """Every broken rule of the source tree at ``root`` (empty when the flow holds)."""
    files = module_files(root)
    problems: list[str] = []
    graph: dict[str, set[str]] = {m: set() for m in files}
    for module, path in files.items():
        for target, line in imports_of(module, path, files):
            rule = check_edge(module, target)
            if rule:
                problems.append(str(Violation(module, target, line, rule)))
            if target in files and target != module:
                graph[module].add(target)
    for comp in cycles(graph):
        problems.append("import cycle: " + " -> ".join(comp))
    return problems


def long_modules(root: Path, limit: int, folders: Iterable[str] = ("core",)) -> list[str]:
    """``path: N lines`` for every module in ``folders`` longer than ``limit`` lines."""
    out = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > limit:
                out.append(f"{path.relative_to(root)}: {n} lines")
    return out
