"""LoRA on the engine: the patches of one module, merged into its weights or added in its
graph.

:func:`build_module_lora` turns the :class:`~sdplan.core.modelfiles.lora.LoraPart` s that
patch one module (from any number of LoRA files, each with its multiplier) into one
:class:`TargetPatch` per patched weight, in host float32:

- low-rank parts (LoRA, LoCon; a Tucker ``mid`` folded into ``down``) stacked along the
  rank axis: ``down`` ``(R, in[, kh, kw])`` and ``up`` ``(out, R[, 1, 1])`` with each part's
  ``multiplier * alpha / rank`` folded into its columns of ``up`` and its rows placed where
  the part lands in a fused weight (zeros elsewhere);
- dense parts (LoHa, LoKr, full ``diff``; a low-rank part whose kernel differs from the
  weight's) summed into ``dense`` of the weight's shape.

A :class:`ModuleLora` applies them in one of sd-cli's two modes (``--lora-apply-mode``):

- ``immediately`` (:meth:`ModuleLora.merge`): after the engine reads a weight into its
  buffer, ``W += up @ down + dense`` on the host (quantized weights are dequantized and
  requantized: ``sdplan._ggml.convert_rows``). The runner merges wherever it reads a file:
  once for resident weights and params-device copies, on every load for ``disk``
  residency (no merged copy is cached).
- ``at_runtime`` (:meth:`ModuleLora.wrap`): the weight lookup hands the graph an
  :class:`~sdplan.core.runtime.graph.AdaptedWeight` and :func:`~sdplan.core.runtime.graph.linear`
  / :func:`~sdplan.core.runtime.graph.conv2d` add ``up(down(x)) + dense(x)`` beside the
  weight's own product. The LoRA tensors (:meth:`ModuleLora.arrays`; f16 low-rank
  factors, f32 dense deltas) live on the device that runs their weight, so each range of a
  layer split applies its own part.

``auto`` (:func:`choose_mode`) picks as sd-cli does (``src/stable-diffusion.cpp``): at
runtime when a weight of the model is quantized, layers stream, the diffusion model's
weights live off its runtime device, or a module is split over devices; immediately
otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sdplan.core.errors import SdplanError
from sdplan.core.modelfiles.lora import LoraFile, LoraPart
from sdplan.core.planning.adapters import APPLY_MODES, lora_apply_mode
from sdplan.core.runtime.graph import AdaptedWeight
from sdplan.core.runtime.native import native

__all__ = ["APPLY_MODES", "TargetPatch", "ModuleLora", "build_module_lora", "choose_mode", "part_delta"]

_PLAIN = {"f32": np.float32, "f16": np.float16}


@dataclass
class TargetPatch:
    """Every LoRA contribution to one weight, host float32 (see the module docstring).

    ``shape`` is the weight's numpy-order shape; ``down``/``up`` are None without low-rank
    parts, ``dense`` None without dense ones.
    """

    name: str
    shape: tuple[int, ...]
    down: np.ndarray | None = None
    up: np.ndarray | None = None
    dense: np.ndarray | None = None
    sources: list[str] = field(default_factory=list)

    def delta(self) -> np.ndarray:
        """``up @ down + dense`` as float32 of :attr:`shape`."""
        out = np.zeros(self.shape, np.float32) if self.dense is None else self.dense.copy()
        if self.down is not None and self.up is not None:
            if len(self.shape) == 4:
                out += np.einsum("or,rikl->oikl", self.up[:, :, 0, 0], self.down)
            else:
                out += (self.up @ self.down).reshape(self.shape)
        return out

    @property
    def rank(self) -> int:
        return 0 if self.down is None else int(self.down.shape[0])


def _tucker(t: np.ndarray, wa: np.ndarray, wb: np.ndarray) -> np.ndarray:
    """LyCORIS' ``rebuild_tucker``: ``einsum('ijkl,jr,ip->prkl', t, wb, wa)``."""
    return np.einsum("ijkl,jr,ip->prkl", t, wb.reshape(wb.shape[0], -1), wa.reshape(wa.shape[0], -1))


def _mat(a: np.ndarray) -> np.ndarray:
    return a.reshape(a.shape[0], -1)


def part_delta(lf: LoraFile, part: LoraPart, out_shape: tuple[int, ...]) -> tuple[str, tuple[np.ndarray, ...]]:
    """One part's contribution for a weight region of ``out_shape`` (the part's rows of the
    weight): ``("lowrank", (down, up))`` with the scale folded into ``up`` (multiplier
    excluded), or ``("dense", (delta,))``. Formulas as the module docstring of
    :mod:`sdplan.core.modelfiles.lora`.

    Raises:
        SdplanError: the part's sizes do not fit ``out_shape``.
    """
    k = part.keys
    alpha = lf.scalar(k["alpha"]) if "alpha" in k else None
    conv = len(out_shape) == 4
    if part.kind == "lora":
        down, up = lf.read(k["down"]), lf.read(k["up"])
        rank = down.shape[0]
        scale = alpha / rank if alpha is not None else 1.0
        if "mid" in k:
            mid = lf.read(k["mid"])
            if mid.ndim == 4:  # Tucker: 1x1 down, kxk mid
                down = np.einsum("rskl,si->rikl", mid, _mat(down))
            else:
                down = _mat(mid) @ _mat(down)
        if conv:
            if down.ndim == 2:
                down = down.reshape(*down.shape, 1, 1)
            up = _mat(up).reshape(up.shape[0], -1, 1, 1)
            if down.shape[1:] != out_shape[1:] or up.shape[0] != out_shape[0]:
                if down.shape[1] == out_shape[1] and up.shape[0] == out_shape[0]:
                    delta = np.einsum("or,rikl->oikl", up[:, :, 0, 0], down) * scale
                    if delta.size == int(np.prod(out_shape)):
                        return "dense", (delta.reshape(out_shape),)
                raise SdplanError(f"{lf.path}: {k['down']} {tuple(down.shape)} / {k['up']} {tuple(up.shape)} "
                                  f"do not fit {part.target.tensor} {out_shape}")
            return "lowrank", (down.astype(np.float32), (up * scale).astype(np.float32))
        down, up = _mat(down), _mat(up)
        if down.shape[1] != int(np.prod(out_shape[1:])) or up.shape[0] != out_shape[0] or up.shape[1] != down.shape[0]:
            raise SdplanError(f"{lf.path}: {k['down']} {tuple(down.shape)} / {k['up']} {tuple(up.shape)} "
                              f"do not fit {part.target.tensor} {out_shape}")
        return "lowrank", (down.astype(np.float32), (up * scale).astype(np.float32))
    if part.kind == "diff":
        d = lf.read(k["diff"])
    elif part.kind == "loha":
        w1a, w1b, w2a, w2b = (lf.read(k[r]) for r in ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"))
        rank = w1b.shape[0]
        w1 = _tucker(lf.read(k["hada_t1"]), w1a, w1b) if "hada_t1" in k else _mat(w1a) @ _mat(w1b)
        w2 = _tucker(lf.read(k["hada_t2"]), w2a, w2b) if "hada_t2" in k else _mat(w2a) @ _mat(w2b)
        d = w1 * w2 * (alpha / rank if alpha is not None else 1.0)
    else:  # lokr
        rank = 1
        if "lokr_w1" in k:
            w1 = lf.read(k["lokr_w1"])
        else:
            w1b = lf.read(k["lokr_w1_b"])
            rank = w1b.shape[0]
            w1 = _mat(lf.read(k["lokr_w1_a"])) @ _mat(w1b)
        if "lokr_w2" in k:
            w2 = lf.read(k["lokr_w2"])
        else:
            w2a, w2b = lf.read(k["lokr_w2_a"]), lf.read(k["lokr_w2_b"])
            rank = w2b.shape[0]
            w2 = _tucker(lf.read(k["lokr_t2"]), w2a, w2b) if "lokr_t2" in k else _mat(w2a) @ _mat(w2b)
        scale = alpha / rank if alpha is not None and rank != 1 else 1.0
        if conv and w2.ndim == 2:
            w2 = w2.reshape(*w2.shape, 1, 1)
        if w2.ndim == 4:
            w1 = w1.reshape(*w1.shape[:2], 1, 1)
        d = np.kron(w1, w2) * scale
    if d.size != int(np.prod(out_shape)):
        raise SdplanError(f"{lf.path}: the {part.kind} patch of {part.target.tensor} has {d.size} values, "
                          f"the weight region {out_shape} {int(np.prod(out_shape))}")
    return "dense", (d.reshape(out_shape).astype(np.float32),)


def _place(rows: np.ndarray, part: LoraPart, full: tuple[int, ...]) -> np.ndarray:
    """Rows of a part (``up`` or a dense delta) in the whole weight's output axis."""
    t = part.target
    if t.rows is None and not t.swap_halves:
        return rows
    out = np.zeros((full[0], *rows.shape[1:]), np.float32)
    start, stop = t.rows if t.rows is not None else (0, full[0])
    out[start:stop] = rows
    if t.swap_halves:
        half = full[0] // 2
        out = np.concatenate([out[half:], out[:half]])
    return out


def build_module_lora(module: str, parts: Sequence[tuple[LoraFile, LoraPart, float]],
                      shapes: Mapping[str, tuple[int, ...]], runtime: bool,
                      names: Mapping[str, str] | None = None) -> ModuleLora | None:
    """The patches of ``module`` from ``(file, part, multiplier)`` triples (parts of other
    modules are skipped), or None when none patches it.

    Args:
        shapes: the module's weight name -> numpy-order shape.
        runtime: build for ``at_runtime`` (else ``immediately``).
        names: checkpoint name -> store name (default: the same).

    Raises:
        SdplanError: a part whose sizes do not fit its weight (names file and tensors).
    """
    names = names or {}
    patches: dict[str, TargetPatch] = {}
    lows: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for lf, part, mult in parts:
        t = part.target
        if t.module != module or mult == 0:
            continue
        if t.tensor not in shapes:
            raise SdplanError(f"{lf.path}: {t.tensor} is not a weight of {module}")
        full = tuple(int(d) for d in shapes[t.tensor])
        region = (t.rows[1] - t.rows[0], *full[1:]) if t.rows else full
        store = names.get(t.tensor, t.tensor)
        tp = patches.setdefault(store, TargetPatch(store, full))
        tp.sources.append(lf.path)
        kind, arrays = part_delta(lf, part, region)
        if kind == "lowrank":
            down, up = arrays
            lows.setdefault(store, []).append((down, _place(up * np.float32(mult), part, full)))
        else:
            d = _place(arrays[0] * np.float32(mult), part, full)
            tp.dense = d if tp.dense is None else tp.dense + d
    for store, items in lows.items():
        tp = patches[store]
        tp.down = np.concatenate([d for d, _ in items], axis=0)
        tp.up = np.concatenate([u for _, u in items], axis=1)
    return ModuleLora(module, patches, runtime) if patches else None


class ModuleLora:
    """The LoRA patches of one module and how they are applied (module docstring).

    Attributes:
        module: the module name; patches: store name -> :class:`TargetPatch`; runtime:
        ``at_runtime`` (else ``immediately``); dtype: dtype of the at-runtime tensors.
    """

    def __init__(self, module: str, patches: dict[str, TargetPatch], runtime: bool, dtype: str = "f16") -> None:
        self.module, self.patches, self.runtime, self.dtype = module, patches, runtime, dtype
        self._arrays: dict[str, np.ndarray] | None = None

    # ------------------------------------------------------------------ immediately
    def merge(self, store: Any, names: Sequence[str]) -> int:
        """Add each patch among ``names`` into its allocated weight of ``store`` (host round
        trip in float32; the weight keeps its dtype). Returns how many were merged.

        Raises:
            SdplanError: a weight dtype ggml cannot convert.
        """
        done = 0
        for n in names:
            tp = self.patches.get(n)
            if tp is None:
                continue
            store.set_data(n, _from_f32(_to_f32(store, n, tp.shape) + tp.delta(), _dtype_of(store, n)))
            done += 1
        return done

    # ------------------------------------------------------------------ at runtime
    def arrays(self) -> dict[str, np.ndarray]:
        """The at-runtime tensors: ``<weight>.lora_down``/``.lora_up``/``.lora_dense``
        (host float32; held in :attr:`dtype`)."""
        if self._arrays is None:
            out: dict[str, np.ndarray] = {}
            for n, tp in self.patches.items():
                if tp.down is not None and tp.up is not None:
                    out[n + ".lora_down"] = np.ascontiguousarray(tp.down, np.float32)
                    out[n + ".lora_up"] = np.ascontiguousarray(tp.up, np.float32)
                if tp.dense is not None:
                    out[n + ".lora_dense"] = np.ascontiguousarray(tp.dense, np.float32)
            self._arrays = out
        return self._arrays

    def tensor_names(self, weights: Sequence[str]) -> list[str]:
        """The at-runtime tensor names of the patches of ``weights``."""
        arrays = self.arrays()
        return [f"{n}{s}" for n in weights if n in self.patches
                for s in (".lora_down", ".lora_up", ".lora_dense") if f"{n}{s}" in arrays]

    def dtypes(self) -> dict[str, str]:
        """The runtime dtype of each at-runtime tensor: :attr:`dtype` for ``down``/``up``,
        f32 for dense deltas (LoHa/LoKr products lose too much in f16) and vectors."""
        return {n: self.dtype if a.ndim > 1 and not n.endswith(".lora_dense") else "f32"
                for n, a in self.arrays().items()}

    def nbytes(self) -> int:
        """Bytes of the at-runtime tensors in their :meth:`dtypes`."""
        dts = self.dtypes()
        return sum(a.size * (2 if dts[n] == "f16" else 4) for n, a in self.arrays().items())

    def wrap(self, name: str, base: Any, lookup: Any) -> Any:
        """``base`` (the weight ``name``'s tensor) with its patch for the graph: an
        :class:`AdaptedWeight` whose LoRA tensors come from ``lookup(tensor name)``, or
        ``base`` itself when ``name`` has no patch."""
        tp = self.patches.get(name)
        if tp is None:
            return base
        has = set(self.arrays())
        get = (lambda s: lookup(name + s) if name + s in has else None)  # noqa: E731
        return AdaptedWeight(base, get(".lora_down"), get(".lora_up"), get(".lora_dense"))


def _dtype_of(store: Any, name: str) -> str:
    return str(store.tensor(name).dtype)


def _to_f32(store: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
    raw = store.get_bytes(name)
    dt = _dtype_of(store, name)
    if dt in _PLAIN:
        return np.frombuffer(raw, _PLAIN[dt]).astype(np.float32).reshape(shape)
    try:
        f32 = native().convert_rows(raw, dt, "f32", int(shape[-1]))
    except ValueError as exc:
        raise SdplanError(f"LoRA merge: weight {name} in {dt}: {exc}") from None
    return np.frombuffer(f32, np.float32).reshape(shape).copy()


def _from_f32(a: np.ndarray, dt: str) -> np.ndarray:
    a = np.ascontiguousarray(a, np.float32)
    if dt in _PLAIN:
        return a.astype(_PLAIN[dt])
    try:
        raw = native().convert_rows(a.tobytes(), "f32", dt, int(a.shape[-1]))
    except ValueError as exc:
        raise SdplanError(f"LoRA merge: cannot store a merged weight in {dt}: {exc}") from None
    return np.frombuffer(raw, np.uint8)


def choose_mode(requested: str, quantized: bool, placement: Any = None, split: bool = False) -> str:
    """The apply mode for ``requested`` (``auto``, ``immediately``, ``at_runtime``) by
    :func:`sdplan.core.planning.adapters.lora_apply_mode`: ``placement`` is the diffusion
    model's :class:`~sdplan.core.runtime.runner.ModulePlacement` (streaming, residency).

    Raises:
        SdplanError: an unknown mode.
    """
    return lora_apply_mode(requested, quantized=quantized,
                           offloaded=placement is not None and placement.params_mode != "runtime",
                           streaming=placement is not None and placement.stream_layers, split=split)
