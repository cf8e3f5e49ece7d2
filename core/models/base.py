"""Graph definitions, one file per architecture.

Every module graph implements :class:`ModuleGraph`: its weights are grouped into
numbered *blocks* (the unit of layer split, segmentation and streaming) and *other*
tensors (embeddings, final norms: always on the main device), and its graph is built in
three parts so the engine can run it whole, split over devices, or cut into segments:

* ``build_pre(g, w, inputs) -> state``: non-block work on the graph inputs;
* ``build_block(g, w, i, state) -> state``: block ``i``;
* ``build_post(g, w, state) -> outputs``.

``w(name)`` returns the weight tensor to use; ``state`` is a dict of named tensors (f32,
f16 or i32) carried from block to block, and across segment boundaries as arrays.

Architectures read their weights through :class:`Weights` (a prefixed view of a name ->
tensor mapping) and report a file that does not fit their layout with
:class:`ModelLayoutError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from sdplan.core.errors import SdplanError

Tensor = Any  # sdplan._ggml.Tensor
WeightLookup = Callable[[str], Tensor]


class ModelLayoutError(SdplanError):
    """The weights do not have the tensors or shapes an architecture needs."""

    code = "model_layout"


class Weights(Mapping[str, Any]):
    """A view of ``weights`` (name -> tensor, or name -> shape tuple) under ``prefix``.

    ``w["a.weight"]`` is ``weights[prefix + "a.weight"]`` (ModelLayoutError naming the full
    name when missing); ``w.get(name)`` returns None instead; ``w.sub("attn1.")`` narrows
    the prefix; ``w.shape(name)`` is the numpy-order shape; ``w.indices("layers.")`` the
    sorted integers ``i`` with some tensor under ``layers.{i}.``.
    """

    def __init__(self, weights: Mapping[str, Any], prefix: str = "") -> None:
        self.weights = weights
        self.prefix = prefix

    def __getitem__(self, name: str) -> Any:
        try:
            return self.weights[self.prefix + name]
        except KeyError:
            raise ModelLayoutError(f"missing tensor {self.prefix + name!r}") from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (self.prefix + name) in self.weights

    def get(self, name: str, default: Any = None) -> Any:
        return self.weights.get(self.prefix + name, default)

    def __iter__(self) -> Iterator[str]:
        n = len(self.prefix)
        return (k[n:] for k in self.weights if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def sub(self, prefix: str) -> Weights:
        """The view under ``self.prefix + prefix``."""
        return Weights(self.weights, self.prefix + prefix)

    def shape(self, name: str) -> tuple[int, ...]:
        """Numpy-order shape of ``name`` (a tensor's ``shape`` or a stored shape tuple)."""
        v = self[name]
        return tuple(int(d) for d in (v.shape if hasattr(v, "shape") else v))

    def indices(self, prefix: str) -> list[int]:
        """Sorted distinct ``i`` such that a tensor is named ``prefix{i}.``..."""
        pat = re.compile(re.escape(self.prefix + prefix) + r"(\d+)\.")
        return sorted({int(m.group(1)) for k in self.weights if (m := pat.match(k))})


class ModuleGraph(Protocol):
    """What the engine needs from an architecture (see the module docstring)."""

    n_blocks: int

    def block_tensors(self, i: int) -> list[str]:
        """Weight names of block ``i`` (0-based, execution order)."""

    def other_tensors(self) -> list[str]:
        """Weight names outside every block."""

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        """Graph inputs ``name -> (shape, dtype)`` for a run with these array shapes."""

    def build_pre(self, g: Any, w: WeightLookup, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """Non-block graph before block 0; returns the state."""

    def build_block(self, g: Any, w: WeightLookup, i: int, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Block ``i`` applied to ``state``."""

    def build_post(self, g: Any, w: WeightLookup, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """Non-block graph after the last block; returns the outputs."""
