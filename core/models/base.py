"""What every model graph definition shares: the graph protocol, the weights view, the
whole-graph adapter.

Every module graph implements :class:`ModuleGraph`: its weights are grouped into
numbered *blocks* (the unit of layer split, segmentation and streaming) and *other*
tensors (embeddings, final norms: always on the main device), and its graph is built in
three parts so the engine can run it whole, split over devices, or cut into segments:

* ``build_pre(g, w, inputs) -> state``: non-block work on the graph inputs;
* ``build_block(g, w, i, state) -> state``: block ``i``;
* ``build_post(g, w, state) -> outputs``.

``w(name)`` returns the weight tensor to use; ``state`` is a dict of named tensors (f32,
f16 or i32) carried from block to block, and across segment boundaries as arrays.

A graph may read only its leading blocks (an LLM whose last hidden state asked for comes
before its last block): its optional ``blocks_read`` attribute says how many. The later
blocks' tensors stay listed (they are the file's) but the engine neither loads nor places
them (``ModuleRunner``), as sd-cli loads only the tensors its graph uses.

Architectures read their weights through :class:`Weights` (the one prefixed, renamed or
restricted view of a name -> tensor mapping or lookup) and report a file that does not fit
their layout with :class:`ModelLayoutError`. Graphs without blocks derive from
:class:`WholeGraph` (or are a :class:`FunctionGraph`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, Protocol

from sdplan.core.errors import SdplanError

Tensor = Any  # sdplan._ggml.Tensor
WeightLookup = Callable[[str], Tensor]


class ModelLayoutError(SdplanError):
    """The weights do not have the tensors or shapes an architecture needs."""

    code = "model_layout"


class Weights(Mapping[str, Any]):
    """The one named view of weights every architecture reads through.

    ``source`` is a mapping (name -> tensor, or name -> shape tuple, as a checkpoint header
    gives) or the engine's lookup function ``w(name) -> tensor``. ``w[key]`` looks up
    ``prefix + key``, through ``names`` when given: a mapping renames (view name -> source
    name, e.g. checkpoint name -> store name), any other collection only restricts (the
    names this view has). A missing name raises :class:`ModelLayoutError` naming it.

    ``w.get(name)`` returns None instead; ``name in w`` tests presence; ``w.sub("attn1.")``
    narrows the prefix; ``w.shape(name)`` is the numpy-order shape; ``w.indices("layers.")``
    the sorted integers ``i`` with some tensor under ``layers.{i}.``. Iteration (and
    ``indices``) needs a mapping source or ``names``.
    """

    def __init__(self, source: Mapping[str, Any] | Callable[[str], Any], prefix: str = "",
                 names: Mapping[str, str] | Collection[str] | None = None) -> None:
        self.source = source
        self.prefix = prefix
        self.names = names

    def _source_name(self, full: str) -> str | None:
        if self.names is None:
            return full
        if full not in self.names:
            return None
        return self.names[full] if isinstance(self.names, Mapping) else full

    def __getitem__(self, name: str) -> Any:
        full = self.prefix + name
        src = self._source_name(full)
        if src is not None:
            try:
                if isinstance(self.source, Mapping):
                    return self.source[src]
                return self.source(src)
            except KeyError:
                pass
        raise ModelLayoutError(f"missing tensor {full!r}")

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        src = self._source_name(self.prefix + name)
        if src is None:
            return False
        return src in self.source if isinstance(self.source, Mapping) else True

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default

    def _keys(self) -> Iterable[str]:
        if self.names is not None:
            return self.names
        if isinstance(self.source, Mapping):
            return self.source
        raise TypeError("a view over a lookup function lists no names (give names=)")

    def __iter__(self) -> Iterator[str]:
        n = len(self.prefix)
        return (k[n:] for k in self._keys() if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def sub(self, prefix: str) -> Weights:
        """The view under ``self.prefix + prefix``."""
        return Weights(self.source, self.prefix + prefix, self.names)

    def shape(self, name: str) -> tuple[int, ...]:
        """Numpy-order shape of ``name`` (a tensor's ``shape`` or a stored shape tuple)."""
        v = self[name]
        return tuple(int(d) for d in (v.shape if hasattr(v, "shape") else v))

    def indices(self, prefix: str) -> list[int]:
        """Sorted distinct ``i`` such that a tensor is named ``prefix{i}.``..."""
        head = self.prefix + prefix
        found = set()
        for k in self._keys():
            if k.startswith(head):  # prefix{digits}.rest (no pattern to compile per prefix)
                num, dot, _ = k[len(head):].partition(".")
                if dot and num.isdecimal():
                    found.add(int(num))
        return sorted(found)


class ModuleGraph(Protocol):
    """What the engine needs from an architecture (see the module docstring)."""

    n_blocks: int

    def block_tensors(self, i: int) -> list[str]:
        """Weight names of block ``i`` (0-based, execution order); IndexError for an ``i``
        outside ``0..n_blocks - 1`` (:func:`check_block`)."""

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


#: Where a diffusion model's tensors start: a single-file checkpoint's prefix, or none (a
#: separate diffusion-model file), as sd-cli reads them.
DIFFUSION_PREFIXES = ("model.diffusion_model.", "")


def diffusion_prefix(names: Mapping[str, Any], keys: tuple[str, ...], what: str) -> str:
    """The prefix of :data:`DIFFUSION_PREFIXES` in front of every tensor name in ``keys``.

    Raises:
        ModelLayoutError: ``no {what}: 'key' and 'key' missing (with or without
            'model.diffusion_model.')``.
    """
    for p in DIFFUSION_PREFIXES:
        if all(p + k in names for k in keys):
            return p
    raise ModelLayoutError(f"no {what}: {' and '.join(repr(k) for k in keys)} missing "
                           f"(with or without {DIFFUSION_PREFIXES[0]!r})")


def check_block(graph: Any, i: int) -> None:
    """Raise IndexError naming ``graph`` unless ``0 <= i < graph.n_blocks`` (a block index of
    :meth:`ModuleGraph.block_tensors`; negative indices are not blocks)."""
    if not 0 <= i < graph.n_blocks:
        raise IndexError(f"{type(graph).__name__} has blocks 0..{graph.n_blocks - 1}, not {i}")


class WholeGraph:
    """Base of module graphs without blocks (a VAE, a UNet, a TAE, an upscaler...): the whole
    graph is built by :meth:`build` after block 0 would start, every weight is a non-block
    tensor on the main device, and asking for a block raises IndexError. Subclasses give
    :meth:`other_tensors`, :meth:`input_specs` and :meth:`build`."""

    n_blocks = 0

    def block_tensors(self, i: int) -> list[str]:
        raise IndexError(f"{type(self).__name__} has no blocks (asked for block {i})")

    def other_tensors(self) -> list[str]:
        raise NotImplementedError

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        raise NotImplementedError

    def build(self, g: Any, w: WeightLookup, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        """The graph's outputs from its inputs."""
        raise NotImplementedError

    def build_pre(self, g: Any, w: WeightLookup, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        return dict(inputs)

    def build_block(self, g: Any, w: WeightLookup, i: int, state: dict[str, Tensor]) -> dict[str, Tensor]:
        raise IndexError(f"{type(self).__name__} has no blocks (asked for block {i})")

    def build_post(self, g: Any, w: WeightLookup, state: dict[str, Tensor]) -> dict[str, Tensor]:
        return self.build(g, w, state)


class FunctionGraph(WholeGraph):
    """A graph without blocks built by one function ``fn(g, weights, inputs) -> outputs``,
    ``weights`` a :class:`Weights` view restricted to ``names``; ``specs`` gives the inputs'
    dtypes (their shapes come from the arrays of a run); ``cpu_bf16_kernels`` the CPU bf16
    kernels with which its products run in bf16 (core/runtime/bf16_rule.py), as the graph class whose function it runs
    lists them (e.g. ``VaeGraph.cpu_bf16_kernels`` for a VAE decoder function).

    Raises:
        ValueError: from :meth:`input_specs` when an input is missing.
    """

    def __init__(self, names: list[str], specs: dict[str, str],
                 fn: Callable[[Any, Weights, dict[str, Any]], dict[str, Any]],
                 cpu_bf16_kernels: tuple[str, ...] = ()) -> None:
        self.names, self.specs, self.fn = list(names), dict(specs), fn
        self.cpu_bf16_kernels = tuple(cpu_bf16_kernels)

    def other_tensors(self) -> list[str]:
        return list(self.names)

    def input_specs(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], str]]:
        missing = sorted(set(self.specs) - set(shapes))
        if missing:
            raise ValueError(f"inputs {missing} missing")
        return {k: (tuple(shapes[k]), dt) for k, dt in self.specs.items()}

    def build(self, g: Any, w: WeightLookup, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
        return self.fn(g, Weights(w, names=frozenset(self.names)), inputs)
