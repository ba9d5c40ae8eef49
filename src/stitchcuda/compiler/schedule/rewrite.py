"""Graph rewrites the compiler makes when a fused group did not lower: a multi-output split becomes
one single-output view per piece, so that each piece can be read, or materialised, on its own. And
what every rewrite that bypasses nodes needs: dropping those nothing reads any more."""

from __future__ import annotations

from collections.abc import Callable

from stitchcuda.compiler.capture.graph import Node, OpGraph
from stitchcuda.compiler.ir.ops import SPLITS


def split_into_slices(graph: OpGraph, names: frozenset[str] | set[str]) -> OpGraph:
    """A copy of ``graph`` where each split/chunk/unbind node of ``names`` is replaced by one
    ``aten.slice`` (``aten.select`` for unbind) per piece, named as the piece was: its readers and the
    forward's outputs read the same names."""
    targets = {n.name for n in graph.nodes if n.name in names and n.op in SPLITS}
    if not targets:
        return graph
    out = graph.model_copy(deep=True)
    pieces: dict[str, list[tuple[int, str]]] = {}
    for item, (src, index) in out.getitems.items():
        if src in targets:
            pieces.setdefault(src, []).append((index, item))
    nodes: list[Node] = []
    for n in out.nodes:
        if n.name not in targets:
            nodes.append(n)
            continue
        rank = len(out.meta(n.args[0][1:]).shape)  # type: ignore[union-attr]
        if n.op == "aten.unbind":
            dim = int(n.args[1]) if len(n.args) > 1 else 0
        else:
            dim = int(n.args[2]) if len(n.args) > 2 else int(n.kwargs.get("dim", 0))
        dim %= rank
        starts = [0]
        for o in n.out:
            starts.append(starts[-1] + (1 if n.op == "aten.unbind" else o.shape[dim]))
        for index, item in sorted(pieces.get(n.name, [])):
            if n.op == "aten.unbind":
                nodes.append(Node(name=item, op="aten.select", overload="int", args=[n.args[0], dim, index],
                                  out=[n.out[index]], module=n.module))
            else:
                nodes.append(Node(name=item, op="aten.slice", overload="Tensor",
                                  args=[n.args[0], dim, starts[index], starts[index + 1], 1],
                                  out=[n.out[index]], module=n.module))
    out.nodes = nodes
    out.getitems = {k: v for k, v in out.getitems.items() if v[0] not in targets}
    return out


def without_unread(graph: OpGraph, nodes: list[Node], bypassed: Callable[[Node], bool]) -> list[Node]:
    """``nodes`` less those ``bypassed`` accepts that nothing reads (any more, once the others are
    gone), the forward's outputs and buffer write-backs kept."""
    pinned = set(graph.outputs) | set(graph.mutations) | set(graph.mutations.values())
    while True:
        read = {a for n in nodes for a in n.inputs()} | pinned
        kept = [n for n in nodes if n.name in read or not bypassed(n)]
        if len(kept) == len(nodes):
            return nodes
        nodes = kept
