"""A linear over rows taken in another order is the linear of the rows in their own order, taken
in that order afterwards: ``linear(permute(x)) == permute(linear(x))`` when the permutation keeps
the last dimension last.

``nn.MultiheadAttention`` and ``nn.Transformer*`` layers with ``batch_first=True`` transpose their
input to sequence-first before the input projection; the transposed value is no operand a GEMM
takes, so it was laid out by a copy kernel before every such product. Here the product reads the
value as it is and its output is the transposed view, which the head split reads through strides
(as it reads any view). A rewrite is kept only where every view that reads the product's output
is still a view of the new layout (checked by torch itself on meta tensors); the product's output
is never a returned value.
"""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.capture.graph import Node, OpGraph, TensorMeta
from stitchcuda.compiler.ir.expr import permutation
from stitchcuda.compiler.ir.ops import VIEW_OPS
from stitchcuda.compiler.schedule.rewrite import without_unread

_ROW_PERMUTES = ("aten.permute", "aten.transpose")


def _order(n: Node, rank: int) -> list[int] | None:
    """The dims ``n`` (a permute or transpose) puts in each place, or None when it moves the last."""
    order = permutation(n, rank)
    return order if order is not None and order[-1] == rank - 1 else None


def _views_still_views(graph: OpGraph, start: Node, shape: list[int], order: list[int]) -> bool:
    """Whether every view chain reading ``start`` stays a view when ``start`` is the ``order``
    permutation of a dense ``shape`` (torch's own view rules, on meta tensors)."""
    import torch

    from stitchcuda.compiler.capture.evaluate import evaluate_node

    values: dict[str, Any] = {start.name: torch.empty(shape, device="meta").permute(order)}
    readers: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for a in n.inputs():
            readers.setdefault(a, []).append(n)
    pending = [start.name]
    while pending:
        for r in readers.get(pending.pop(), []):
            if r.op not in VIEW_OPS or r.name in values:
                continue
            if any(v not in values for v in r.inputs()):
                return False  # a view of two values: not a chain this check follows
            try:
                values[r.name] = evaluate_node(r, values)
            except Exception:  # noqa: BLE001 - torch's refusal: the new layout cannot be viewed so
                return False
            pending.append(r.name)
    return True


def commute_row_permutes(graph: OpGraph) -> OpGraph:
    """``graph`` where each linear reading a last-dim-keeping permute of a computed value reads the
    value itself, its output named ``<linear>__rows`` and the linear's own name now the permute of it."""
    produced = {n.name: n for n in graph.nodes}
    pinned = set(graph.outputs) | set(graph.mutations) | set(graph.mutations.values())
    nodes: list[Node] = []
    changed = False
    for n in graph.nodes:
        source = n.args[0][1:] if n.op == "aten.linear" and n.args and isinstance(n.args[0], str) else None
        permute = produced.get(source) if source else None
        if permute is None or permute.op not in _ROW_PERMUTES or n.name in pinned or len(n.out) != 1 \
                or not isinstance(permute.args[0], str):
            nodes.append(n)
            continue
        x = permute.args[0][1:]
        x_meta = graph.meta(x)
        rank = len(x_meta.shape) if x_meta is not None else 0
        order = _order(permute, rank) if rank >= 2 else None
        if order is None or (x in produced and produced[x].op in VIEW_OPS):
            nodes.append(n)  # a permute of a view: its layout is not the dense one assumed here
            continue
        rows_shape = [*x_meta.shape[:-1], n.out[0].shape[-1]]  # type: ignore[union-attr]
        if not _views_still_views(graph, n, rows_shape, order):
            nodes.append(n)
            continue
        rows = n.model_copy(update={"name": f"{n.name}__rows", "args": ["%" + x, *n.args[1:]],
                                    "out": [TensorMeta(shape=rows_shape, dtype=n.out[0].dtype)]})
        nodes += [rows, Node(name=n.name, op="aten.permute", overload="default", args=["%" + rows.name, order],
                             out=n.out, module=n.module)]
        changed = True
    if not changed:
        return graph
    out = graph.model_copy()
    out.nodes = without_unread(graph, nodes, lambda n: n.op in _ROW_PERMUTES)  # the permutes bypassed
    return out
