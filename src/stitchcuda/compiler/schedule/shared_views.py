"""A view several elementwise kernels read becomes one view per reader, before fusion.

Fusion attaches a free view (a transpose, a slice, a reshape: strides, no data) to the one group
that reads it; a view read by several groups was laid out by a copy kernel of its own. In
attention prologues that is most of the program: rotary embeddings slice the transposed query and
key into halves and read the whole too, repeat_kv expands them again, and each of those views
cost a launch and a round trip through memory. A view costs nothing to repeat, so each
elementwise reader gets its own copy of the view chain and reads through its strides; the values
the chain starts from are read, not copied. Views read by anything but elementwise kernels and
other views (a GEMM wants its operand laid out) keep their one node.
"""

from __future__ import annotations

from stitchcuda.compiler.capture.graph import Node, OpGraph
from stitchcuda.compiler.ir.ops import VIEW_OPS
from stitchcuda.compiler.schedule.roles import op_role

_MAX_PASSES = 64  # view chains are short; each pass copies one level of every chain


def _shared(n: Node, readers: list[Node], pinned: set[str]) -> bool:
    """Whether view ``n`` is read by more than one node, each an elementwise kernel or a view (a
    view of a split's piece stays one: the split's pieces are laid out together)."""
    if n.op not in VIEW_OPS or len(n.out) != 1 or n.name in pinned or len(readers) < 2 or set(n.inputs()) & pinned:
        return False
    return all(r.op in VIEW_OPS or op_role(r) == "elementwise" for r in readers)


def split_shared_views(graph: OpGraph) -> OpGraph:
    """``graph`` where every view read by several elementwise kernels (or views) is one view per
    reader, each copy named ``<view>__r<k>`` and placed right after the original."""
    pinned = set(graph.outputs) | set(graph.mutations) | set(graph.mutations.values())
    pinned |= {src for src, _ in graph.getitems.values()} | set(graph.getitems)
    nodes = list(graph.nodes)
    taken = {n.name for n in nodes} | {p.name for p in graph.placeholders} | set(graph.getitems)

    def fresh(base: str) -> str:
        k = 1
        while f"{base}__r{k}" in taken:
            k += 1
        taken.add(f"{base}__r{k}")
        return f"{base}__r{k}"

    for _ in range(_MAX_PASSES):
        readers: dict[str, list[Node]] = {}
        for n in nodes:
            for name in set(n.inputs()):
                readers.setdefault(name, []).append(n)
        out: list[Node] = []
        rename: dict[str, dict[str, str]] = {}  # a reader -> {a view it reads: the copy it reads now}
        for n in nodes:
            n = n.reading(rename[n.name]) if n.name in rename else n
            out.append(n)
            if not _shared(n, readers.get(n.name, []), pinned):
                continue
            for reader in readers[n.name][1:]:
                copy = n.model_copy(update={"name": fresh(n.name.split("__r")[0])})
                out.append(copy)
                rename.setdefault(reader.name, {})[n.name] = copy.name
        if len(out) == len(nodes):
            break
        nodes = out
    if len(nodes) == len(graph.nodes):
        return graph
    result = graph.model_copy()
    result.nodes = nodes
    return result
