"""Copies that every reader reads through views which are strided views of the value beneath.

nn.MultiheadAttention lays its packed Q/K/V projection out as ``[3, S, B, E]`` with a copy
(``.contiguous()``), then views each of q, k and v as ``[S, B*H, hd]``, transposes it and views it
back as ``[B, H, S, hd]``. No strides express the middle of that chain (``B*H`` merges a batch dim
with a split of the columns), which is why the copy is there; yet its end reads the projection's
own buffer through strides. Where every view of a copy that anything else reads is such a
strided view of the value under the copy's own views, the copy goes: each of those views becomes
one strided view of that value's buffer (``stitchcuda.buffer_view``, torch's ``as_strided``
over a value that has its storage to itself), and no kernel lays the copy out (the product or the attention
kernel reads q, k and v straight out of the projection).

Which views qualify is found by replaying the views on element indices with torch, not by rules
per view operator: a view qualifies where the indices it ends with are an affine map of its
coordinates with non-negative strides.
"""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.capture.evaluate import evaluate_node
from stitchcuda.compiler.capture.graph import Node, OpGraph
from stitchcuda.compiler.ir.ops import SPLITS, VIEW_OPS
from stitchcuda.compiler.schedule.rewrite import without_unread

# the index replay holds the value's element count in int64 twice over: larger values keep the copy
MAX_REPLAYED = 1 << 24
_FORMATS = (None, "torch.preserve_format", "torch.contiguous_format")


def read_copies_through_views(graph: OpGraph) -> OpGraph:
    """``graph`` without the copies whose readers all read through views that are strided views of
    the copied value's source buffer: each such view is a ``stitchcuda.buffer_view`` of that buffer."""
    produced = {n.name: n for n in graph.nodes}
    users = graph.users()
    kept = set(graph.outputs) | set(graph.mutations) | set(graph.mutations.values())
    replaced: dict[str, Node] = {}
    dropped: set[str] = set()
    beneath: set[str] = set()  # the views between a dropped copy and its source: kept where still read
    for n in graph.nodes:
        if n.op != "aten.clone" or n.name in kept or len(n.inputs()) != 1 or n.kwargs.get("memory_format") not in _FORMATS:
            continue
        found = _rewrite(graph, produced, users, kept, n)
        if found is not None and not _overlaps(found, replaced, dropped):
            replaced |= found[0]
            dropped |= found[1]
            beneath |= found[2]
    if not replaced:
        return graph
    out = graph.model_copy(deep=True)
    nodes = [replaced.get(m.name, m) for m in out.nodes if m.name not in dropped]
    out.nodes = without_unread(out, nodes, lambda m: m.name in beneath)
    return out


def _overlaps(found: tuple[dict[str, Node], set[str], set[str]], replaced: dict[str, Node], dropped: set[str]) -> bool:
    """Whether a copy's rewrite reads or rewrites what an earlier one dropped or rewrote (a copy of a
    view of another copy: the first goes, the second stays and reads the first's buffer view)."""
    ends, gone, beneath = found
    sources = {m.args[0][1:] for m in ends.values()}
    return bool((sources | set(ends) | gone | beneath) & (set(replaced) | dropped))


def _view(n: Node) -> bool:
    return n.op in VIEW_OPS and n.op not in SPLITS and len(n.out) == 1 and len(n.inputs()) == 1


def _rewrite(graph: OpGraph, produced: dict[str, Node], users: dict[str, list[str]], kept: set[str],
             copy: Node) -> tuple[dict[str, Node], set[str], set[str]] | None:
    """(the views that become buffer views, the nodes that go, the views beneath the copy)
    for ``copy``; None where it stays."""
    import torch

    chain: list[Node] = []  # the views between the source buffer and the copy, last first
    name = copy.inputs()[0]
    while name in produced and _view(produced[name]) and name not in graph.getitems:
        chain.append(produced[name])
        name = produced[name].inputs()[0]
    base = name
    meta = graph.meta(base)
    if not chain or base in graph.getitems or meta is None or meta.numel > MAX_REPLAYED or meta.numel == 0:
        return None
    if base not in produced or produced[base].op in VIEW_OPS:
        return None  # a placeholder (a parameter may be strided) or a view: not a buffer of its own
    tree: list[Node] = []  # the views that read the copy, directly or through one another
    ends: list[str] = []  # the values of the tree (or the copy) something outside it reads
    stack = [copy.name]
    while stack:
        value = stack.pop()
        outside = value in kept
        for reader in users.get(value, []):
            r = produced.get(reader)
            if r is not None and _view(r) and reader not in graph.getitems:
                tree.append(r)
                stack.append(reader)
            else:
                outside = True
        if outside:
            ends.append(value)
    if not ends or copy.name in ends:
        return None  # something reads the copy itself as a buffer: it is a real layout
    values: dict[str, Any] = {base: torch.arange(meta.numel, dtype=torch.int64).view(meta.shape)}
    try:
        for v in reversed(chain):
            values[v.name] = evaluate_node(v, values)
        values[copy.name] = values[chain[0].name].contiguous()
        order = {m.name: i for i, m in enumerate(graph.nodes)}
        for v in sorted(tree, key=lambda m: order[m.name]):
            values[v.name] = evaluate_node(v, values)
    except Exception:  # noqa: BLE001 - a view torch will not replay on indices: the copy stays
        return None
    replaced: dict[str, Node] = {}
    for end in ends:
        strided = _as_strided(values[end], meta.numel)
        if strided is None:
            return None
        node = produced[end]
        replaced[end] = Node(name=end, op="stitchcuda.buffer_view", args=[f"%{base}", list(node.out[0].shape), *strided],
                             out=[node.out[0]], module=node.module)
    return replaced, ({copy.name} | {v.name for v in tree}) - set(ends), {v.name for v in chain}


def _as_strided(indices: Any, numel: int) -> tuple[list[int], int] | None:
    """(strides, offset) with which ``as_strided`` of a buffer of ``numel`` elements reads
    ``indices`` (element positions in it), or None where no non-negative strides do."""
    import torch

    if indices.numel() == 0:
        return None
    start = [0] * indices.dim()
    offset = int(indices[tuple(start)])
    strides = []
    for d, size in enumerate(indices.shape):
        if size == 1:
            strides.append(0)
            continue
        step = list(start)
        step[d] = 1
        stride = int(indices[tuple(step)]) - offset
        if stride < 0:
            return None
        strides.append(stride)
    try:
        read = torch.as_strided(torch.arange(numel, dtype=torch.int64), tuple(indices.shape), strides, offset)
    except RuntimeError:  # out of the buffer's bounds
        return None
    return (strides, offset) if torch.equal(read, indices) else None
