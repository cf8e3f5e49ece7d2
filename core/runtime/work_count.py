"""Count a built graph's work: operations and bytes per device, without computing it.

:func:`graph_work` walks the nodes of a built ``sdplan._ggml.Graph``
(``sdplan._ggml.graph_nodes``: op, kernel, shape, dtype, bytes, device, sources) and sums
them into a :class:`~sdplan.core.planning.work.GraphWork`:

- products (``MUL_MAT``, sdplan's ``bf16_gemm``/``fma_gemm`` custom ops): class ``mm`` (a
  ``MUL_MAT`` of im2col columns, ggml's or sdplan's, is a convolution: class ``conv``, and the
  im2col's bytes are part of it),
  ``2 * output elements * K`` FLOP, ``K`` the weight's inner length (for a weight of shape
  ggml ``[K, M]`` the row length; for a convolution kernel ``[KW, KH, IC, OC]`` run as one
  product op, ``KW * KH * IC``; such an op with a kernel wider than 1x1 is class ``conv``);
- sdplan's Winograd convolution (``winograd``): class ``conv``, the direct product's
  ``2 * output elements * 9 * IC`` FLOP (its weight is the source of the kernel-packing node
  before it), so convolutions count the same on every device whatever method runs them;
- attention (ggml's ``FLASH_ATTN_EXT``, sdplan's ``bf16_attention``/``fma_attention``):
  class ``attn``, ``2 * B * H * Nq * Nk * (D + Dv)`` FLOP (scores and values);
- every other node that computes (not a view): memory-bound, its output's bytes plus its
  sources' bytes, and one memory op (each has a fixed cost besides its bytes); the bytes are
  kept per kernel too (:func:`mem_kernel`), since a GroupNorm or a SiLU moves its bytes
  slower than an add.

A node runs on the device it was pinned to (the runner pins every node: block ranges to
their device, the rest to the main device); a node's source made on another device is one
copy per compute (deduplicated per destination), and the graph's inputs live on the main
device. Weights are counted once per device that uses them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from sdplan.core.planning.work import DeviceWork, GraphWork, OpGroup
from sdplan.core.runtime.native import native

#: ggml ops that only view their source: no work, but still a node.
_PRODUCT_KERNELS = ("bf16_gemm", "fma_gemm")
_ATTENTION_KERNELS = ("FLASH_ATTN_EXT", "bf16_attention", "fma_attention")
_COLUMN_KERNELS = ("IM2COL", "cpu_im2col")
#: ops whose buffer size ggml's RPC client asks the server for at every allocation
_QUERIED = ("FLASH_ATTN_EXT", "MUL_MAT_ID")


def _elems(ne: Sequence[int]) -> int:
    return math.prod(ne)


def _outer(ne: Sequence[int]) -> int:
    """The outermost dimension of a weight larger than 1 (its output channels or rows)."""
    for n in reversed(ne):
        if n > 1:
            return int(n)
    return 1


def classify(node: tuple[Any, ...], nodes: Sequence[tuple[Any, ...]]) -> tuple[str, str, float] | None:
    """``(class, weight dtype, FLOP)`` of a compute node (module docstring), or None for a
    memory-bound or view node. ``nodes``: the graph's nodes (a Winograd node's weight is a
    source of its kernel-packing node)."""
    _, kernel, ne, _, _, view, _, srcs = node
    if view:
        return None
    out = _elems(ne)
    if kernel == "MUL_MAT":
        a = srcs[0]
        return "conv" if _columns(nodes, a[0]) is not None else "mm", a[2], 2.0 * out * a[1][0]
    if kernel in _PRODUCT_KERNELS and len(srcs) >= 2:
        w = srcs[1]
        cls = "conv" if len(w[1]) == 4 and w[1][0] * w[1][1] > 1 and w[1][2] > 1 else "mm"
        return cls, w[2], 2.0 * out * _elems(w[1]) / _outer(w[1])
    if kernel == "winograd" and len(srcs) >= 2:
        packed = srcs[1]
        w = nodes[packed[0]][7][0] if packed[0] >= 0 and nodes[packed[0]][7] else packed
        return "conv", w[2], 2.0 * out * 9 * w[1][2]
    if kernel in _ATTENTION_KERNELS and len(srcs) >= 3:
        q, k = srcs[0], srcs[1]
        dv = ne[0]
        return "attn", k[2], 2.0 * (out / dv) * k[1][1] * (q[1][0] + dv)
    return None


def _columns(nodes: Sequence[tuple[Any, ...]], sid: int) -> int | None:
    """The index of the im2col node (ggml's ``IM2COL`` or sdplan's ``cpu_im2col``) that
    source ``sid`` is or views, else None: a product of such columns is a convolution."""
    while 0 <= sid < len(nodes):
        node = nodes[sid]
        if node[1] in _COLUMN_KERNELS:
            return sid
        if not node[5] or not node[7]:
            return None
        sid = node[7][0][0]
    return None


def mem_kernel(node: tuple[Any, ...]) -> str:
    """The kernel a memory-bound node's bytes are priced by: sdplan's CPU kernel for a custom
    op, else ggml's op description (the unary and GLU ops by their own names: ``SILU``); an
    element-wise ``ADD``/``SUB``/``MUL``/``DIV`` that broadcasts a smaller operand (a bias
    over channels) as ``ADD@b``: it moves its bytes at another rate."""
    if node[0] == "CUSTOM":
        return str(node[1])
    srcs = node[7]
    if node[0] in ("ADD", "SUB", "MUL", "DIV") and len(srcs) >= 2 and srcs[1][3] < srcs[0][3]:
        return f"{node[0]}@b"
    return str(node[0])


def kernel_key(node: tuple[Any, ...], nodes: Sequence[tuple[Any, ...]] = ()) -> str:
    """The kernel name a node's work is priced by: ggml's op name or sdplan's kernel, with a
    shape tag where the rate depends on more than the op's size: attention ``@d`` and the
    head width (``bf16_attention@d40``), and ``k`` and the keys' tokens where fewer keys than
    queries (cross-attention over a text context: ``FLASH_ATTN_EXT@d40k77``; ggml's CPU kernel
    pays a cost per query row that 77 keys amortise far less than a self-attention's, 2x the
    time per score at SD's widths), a convolution ``@c`` and its output channels
    (``winograd@c128``, ``MUL_MAT@c32``: a narrow convolution over many pixels runs far
    slower per FLOP than a wide one of the same size)."""
    kernel, srcs = str(node[1]), node[7]
    if kernel in _ATTENTION_KERNELS and srcs:
        q = srcs[0][1]
        nk = srcs[1][1][1] if len(srcs) >= 2 else q[1]
        return f"{kernel}@d{q[0]}" + (f"k{nk}" if nk < q[1] else "")
    if kernel == "MUL_MAT" and len(srcs) >= 2 and _columns(nodes, srcs[0][0]) is not None:
        return f"{kernel}@c{srcs[1][1][1]}"  # columns times the kernel [K, OC]
    if kernel in _PRODUCT_KERNELS and len(srcs) >= 2 and (classify(node, nodes or [node]) or ("",))[0] == "conv":
        return f"{kernel}@c{srcs[1][1][3]}"  # kernel [KW, KH, IC, OC]
    if kernel == "winograd" and len(srcs) >= 2 and nodes:
        packed = srcs[1]
        w = nodes[packed[0]][7][0] if packed[0] >= 0 and nodes[packed[0]][7] else packed
        return f"{kernel}@c{w[1][3]}"
    return kernel


def graph_work(g: Any, devices: Sequence[str], buffers: Mapping[str, int] | None = None,
               checkpoints: Mapping[str, int] | None = None) -> GraphWork:
    """The work of built graph ``g`` whose backends are ``devices`` (sdplan device names in
    the graph's scheduler order, main device first); ``buffers``: each device's compute
    buffer bytes when measured (a dry-run reserve); ``checkpoints``: device -> the
    checkpoints among its nodes (:attr:`~sdplan.core.planning.work.GraphWork.checkpoints`).

    Raises:
        ValueError: ``g`` is not built.
    """
    nodes = native().graph_nodes(g)
    main = devices[0]
    # the columns of a convolution run as im2col and a product: their bytes are the
    # convolution's (its rate is measured with them)
    folded = {c for n in nodes if n[1] == "MUL_MAT" and n[7] for c in [_columns(nodes, n[7][0][0])] if c is not None}

    def dev(i: int) -> str:
        return devices[i] if 0 <= i < len(devices) else main

    groups: dict[str, dict[tuple[str, str, str, float], int]] = defaultdict(lambda: defaultdict(int))
    mem: dict[str, float] = defaultdict(float)
    mem_ops: dict[str, int] = defaultdict(int)
    mem_kernels: dict[str, dict[str, tuple[float, int]]] = defaultdict(dict)
    queries: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    weights: dict[str, dict[int, int]] = defaultdict(dict)
    copies: dict[str, int] = defaultdict(int)
    copied: set[tuple[int, str]] = set()
    used: set[int] = set()
    inputs: dict[int, int] = {}
    for index, node in enumerate(nodes):
        _, kernel, _, _, nbytes, view, backend, srcs = node
        d = dev(backend)
        count[d] += 1
        for sid, _, _, sbytes, weight, _ in srcs:
            if sid >= 0:
                used.add(sid)
            if weight:
                weights[d][sid] = int(sbytes)
                continue
            if sid < 0:
                inputs[sid] = max(inputs.get(sid, 0), int(sbytes))
            src_dev = dev(nodes[sid][6]) if sid >= 0 else main
            if src_dev != d and not view and (sid, d) not in copied:
                copied.add((sid, d))
                copies[f"{src_dev}>{d}"] += int(sbytes)
        if view or index in folded:
            continue
        if kernel in _QUERIED:
            queries[d] += 1
        work = classify(node, nodes)
        if work is None:
            moved = nbytes + sum(s[3] for s in srcs)
            mem[d] += moved
            mem_ops[d] += 1
            kb, kn = mem_kernels[d].get(mem_kernel(node), (0.0, 0))
            mem_kernels[d][mem_kernel(node)] = (kb + moved, kn + 1)
        else:
            cls, dtype, flops = work
            groups[d][(cls, kernel_key(node, nodes), dtype, float(flops))] += 1
    outs = [n for i, n in enumerate(nodes) if i not in used]  # what nothing reads: the outputs
    out_devs = {}
    for name in dict.fromkeys([*count, *groups]):
        ops = tuple(OpGroup(c, k, t, f, n) for (c, k, t, f), n in sorted(groups[name].items()))
        out_devs[name] = DeviceWork(ops, mem[name], count[name], len(weights[name]),
                                    sum(weights[name].values()), mem_ops[name], dict(mem_kernels[name]),
                                    int((buffers or {}).get(name, 0)), queries[name])
    return GraphWork(main, out_devs, sum(inputs.values()), len(inputs),
                     sum(int(n[4]) for n in outs), len(outs), dict(copies), dict(checkpoints or {}))
