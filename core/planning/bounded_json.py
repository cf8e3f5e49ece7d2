"""One bounded JSON reader for every JSON document sdplan reads: device inventories, model
profiles, sharded ``*.safetensors.index.json`` files, the library cache, the generation
queue, the saved session, plan files, the text chunks of PNG pictures.

A document is refused, as one :class:`JsonRefused` line naming its source, when it is

- larger than :attr:`JsonLimits.max_bytes` (a file is never read past that many bytes);
- not UTF-8, or not JSON;
- nested deeper than :attr:`JsonLimits.max_depth` (Python's parser recurses once per level:
  ten thousand ``[`` would otherwise end in a ``RecursionError``);
- holding more than :attr:`JsonLimits.max_containers` arrays and objects or more than
  :attr:`JsonLimits.max_items` values, counted on the text before it is parsed (an upper
  bound: brackets and commas inside strings count too), so the parsed document's memory is
  bounded: an empty object costs 64 bytes and a float 24, against one to four bytes of text;
- holding ``NaN``, ``Infinity`` or a number that overflows a float (``1e999``).

Reading a file goes through :mod:`sdplan.core.planning.paths`: a missing file, a folder, a
FIFO, a name too long or a permission denied is a :class:`~sdplan.core.errors.PathError`
naming the path.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sdplan.core.planning import paths

__all__ = ["JsonLimits", "JsonRefused", "DEFAULT_LIMITS", "loads", "read_json"]


@dataclass(frozen=True)
class JsonLimits:
    """The bounds of one kind of document.

    Attributes:
        max_bytes: largest document, bytes of UTF-8.
        max_depth: deepest nesting of arrays and objects (a bare value is depth 0).
        max_containers: most arrays and objects (``[`` and ``{`` in the text).
        max_items: most values (commas in the text, plus one).
    """

    max_bytes: int = 16 * 2**20
    max_depth: int = 64
    max_containers: int = 1_000_000
    max_items: int = 4_000_000


#: Limits of sdplan's own small files (inventories, profiles, plans, queue, session, cache):
#: 16 MiB, 64 levels, a million containers, four million values (at most some 350 MiB of
#: Python objects for the worst text of that size).
DEFAULT_LIMITS = JsonLimits()


class JsonRefused(ValueError):
    """A JSON document outside its :class:`JsonLimits` or not JSON; the message names its
    source. A :class:`ValueError`, as :func:`json.loads` raises for bad JSON."""


def _constant(name: str) -> float:
    raise JsonRefused(f"{name} is not a finite number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonRefused(f"the number {text[:40]} overflows")
    return value


class _HookError(Exception):
    """Carries an error of the caller's ``object_pairs_hook`` through the parser."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _passing(hook: Callable[[list[tuple[str, Any]]], Any]) -> Callable[[list[tuple[str, Any]]], Any]:
    def call(pairs: list[tuple[str, Any]]) -> Any:
        try:
            return hook(pairs)
        except Exception as exc:  # noqa: BLE001 - re-raised as it was, outside the parser
            raise _HookError(exc) from None
    return call


def _walk_depth(doc: Any, limit: int) -> int:
    """The nesting depth of a parsed document, without recursion; stops past ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(doc, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            values: Any = node.values()
        elif isinstance(node, list):
            values = node
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((v, depth) for v in values if isinstance(v, (dict, list)))
    return deepest


def loads(text: str | bytes, source: str = "JSON", limits: JsonLimits = DEFAULT_LIMITS,
          object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """Parse ``text`` within ``limits`` (module docstring).

    Args:
        text: the document (bytes are decoded as UTF-8).
        source: what it is, for the messages (a path, ``"the sdplan text of x.png"``).
        limits: the bounds.
        object_pairs_hook: as :func:`json.loads` (e.g. to refuse duplicate keys).

    Returns:
        The document: dict, list, str, int, float, bool or None.

    Raises:
        JsonRefused: ``"SOURCE: ..."``: too large, not UTF-8, not JSON, too deep, too many
            values, a non-finite number. Errors raised by ``object_pairs_hook`` pass through.
    """
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > limits.max_bytes:
        raise JsonRefused(f"{source}: {size} bytes of JSON, more than the {limits.max_bytes} "
                          "byte limit")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonRefused(f"{source}: not JSON (not UTF-8 text at byte {exc.start})") from None
    containers = text.count("[") + text.count("{")
    if containers > limits.max_containers:
        raise JsonRefused(f"{source}: {containers} arrays and objects, more than the "
                          f"{limits.max_containers} limit")
    items = text.count(",") + 1
    if items > limits.max_items:
        raise JsonRefused(f"{source}: {items} values, more than the {limits.max_items} limit")
    hook = None if object_pairs_hook is None else _passing(object_pairs_hook)
    try:
        doc = json.loads(text, parse_constant=_constant, parse_float=_float, object_pairs_hook=hook)
    except _HookError as exc:
        raise exc.error from None
    except JsonRefused as exc:
        raise JsonRefused(f"{source}: {exc}") from None
    except RecursionError:
        raise JsonRefused(f"{source}: JSON nested deeper than {limits.max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise JsonRefused(f"{source}: not JSON ({exc.msg} at line {exc.lineno} "
                          f"column {exc.colno})") from None
    except ValueError:  # Python's limit on the digits of an integer (4300)
        raise JsonRefused(f"{source}: not JSON (an integer of more than "
                          f"{sys.get_int_max_str_digits()} digits)") from None
    if _walk_depth(doc, limits.max_depth) > limits.max_depth:
        raise JsonRefused(f"{source}: JSON nested deeper than {limits.max_depth} levels")
    return doc


def read_json(path: str | os.PathLike[str], limits: JsonLimits = DEFAULT_LIMITS,
              what: str = "file",
              object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """The JSON document in the file ``path``, read within ``limits`` (never more than
    ``limits.max_bytes + 1`` bytes of it).

    Args:
        path: the file.
        limits: the bounds.
        what: what the file is (``"inventory"``, ``"profile"``...), for the messages.
        object_pairs_hook: as :func:`loads`.

    Raises:
        PathError: the file is missing, a folder, not a regular file, or cannot be read
            (naming the path and the operating system's reason).
        JsonRefused: as :func:`loads`, naming the path.
    """
    raw = paths.read_bytes(path, limits.max_bytes, what)
    if len(raw) > limits.max_bytes:
        raise JsonRefused(f"{os.fspath(path)}: larger than the {limits.max_bytes} byte limit of "
                          f"a JSON {what}")
    return loads(raw, os.fspath(path), limits, object_pairs_hook)
