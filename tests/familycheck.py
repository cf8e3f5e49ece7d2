"""Where family names are compared: a check over source files.

A family is named in one place, its declaration under ``core/families/`` (and its pipeline
folder under ``core/pipelines/`` may compare its own names); everything else asks the registry.
:func:`comparisons` finds, in a module's syntax tree:

- a comparison (``==``, ``!=``, ``in``, ``not in``) of an expression that speaks of a family or
  an architecture (a name or attribute containing ``family``, ``arch`` or ``architecture``)
  with a family name, or a tuple, list or set holding one;
- ``.startswith(...)``/``.endswith(...)`` of such an expression with a family name;
- a dict literal keyed by two or more family names (a per-family table).

Scheduler names that happen to equal a family's (``flux``, ``flux2``) are not compared with a
family expression and pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

#: Family names and the architecture names built from them (a family, ``-`` and a variant).
FAMILY_NAMES = frozenset({"sd1", "sd2", "sdxl", "sd3", "flux", "chroma", "z_image", "flux2_klein",
                          "flux2"})
_WORDS = ("family", "arch")


def is_family_name(value: object) -> bool:
    """True for a family name or an architecture name of one (``flux-dev``)."""
    return isinstance(value, str) and (value in FAMILY_NAMES or value.split("-", 1)[0] in FAMILY_NAMES
                                       and "-" in value)


def _speaks_of_family(node: ast.AST) -> bool:
    text = ast.unparse(node).lower()
    return any(w in text for w in _WORDS)


def _holds_family_name(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return is_family_name(node.value)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and is_family_name(e.value) for e in node.elts)
    return False


def comparisons(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """``(line, code)`` of every family-name comparison in ``source`` (module docstring)."""
    tree = ast.parse(source, filename)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_holds_family_name(s) for s in sides) and any(
                    _speaks_of_family(s) for s in sides if not _holds_family_name(s)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith") and node.args \
                and _holds_family_name(node.args[0]) and _speaks_of_family(node.func.value):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Dict):
            keys = [k for k in node.keys if isinstance(k, ast.Constant) and is_family_name(k.value)]
            if len(keys) >= 2:
                found.append((node.lineno, ast.unparse(node)[:80]))
    return found


def allowed(relative: Path) -> bool:
    """True for files that may compare family names: the family declarations and the
    families' own pipeline folders (``core/pipelines/<folder>/`` named after a family or
    holding several of one lineage: ``sd`` for SD 1.x / 2.x)."""
    parts = relative.parts
    if parts[:2] == ("core", "families"):
        return True
    return len(parts) >= 4 and parts[:2] == ("core", "pipelines") and parts[2] in FAMILY_FOLDERS


#: Pipeline folders that belong to families (the folder's own family names may be compared).
FAMILY_FOLDERS = frozenset({"sd", "sdxl", "sd3", "flux", "chroma", "z_image", "flux2"})


def check_tree(root: Path, folders: Iterable[str] = ("core", "app")) -> list[str]:
    """Every family-name comparison outside the allowed files, as ``path:line: code``."""
    out: list[str] = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root)
            if allowed(rel):
                continue
            for line, code in comparisons(path.read_text(encoding="utf-8"), str(path)):
                out.append(f"{rel}:{line}: {code}")
    return out


if __name__ == "__main__":
    print(check_tree(Path(__file__).resolve().parents[1]))
