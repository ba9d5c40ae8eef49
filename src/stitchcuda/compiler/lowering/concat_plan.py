"""Concatenations that grow one buffer: a chain of ``cat`` nodes along one dim, each taking the
pieces of the one before it and more (DenseNet's dense layers: layer k reads the concatenation of
the block's input and every earlier layer's output), is one buffer the size of the largest. Each
concatenation copies only its new pieces into their slice of it, and is read as a strided view
of the buffer's leading part: layer k copies its own feature map, not all k of them (as
Inductor's concatenation planning has a producer write into its slice).

A chain is planned only where nothing depends on a concatenation being a buffer of its own: every
concatenation but the largest is read by kernels that read through strides (pointwise and row
kernels, batch norm), is neither returned nor written back, and is alone in its group.
"""

from __future__ import annotations

from dataclasses import dataclass

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import contiguous_strides
from stitchcuda.compiler.ir.formulas import ROW_OPS, is_pointwise
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.lowering.lower_context import LowerContext

# the operators (besides pointwise and row ones) whose lowering reads an operand through any strides
_STRIDED_READERS = {"aten._native_batch_norm_legit_functional", "aten._native_batch_norm_legit",
                    "aten._native_batch_norm_legit_no_training", "aten.batch_norm"}
# the groups whose kernels read their operands through strides (not a library call's operand)
_STRIDED_GROUPS = {"elementwise", "row_reduce", "data_movement", "other"}


@dataclass
class ConcatWrite:
    """What one planned concatenation copies: its pieces from ``first`` on, into the shared buffer
    at element ``offset``, as a region of ``shape`` along ``dim``."""

    pieces: list[str]
    dim: int
    shape: tuple[int, ...]
    offset: int


def plan_concats(cx: LowerContext, groups: list[FusionGroup], owner: dict[str, int]) -> dict[str, ConcatWrite]:
    """Plan the concatenation chains of the graph: each member's value is stored in the largest
    member's buffer (its leading part, read through that buffer's strides: ``cx.out.layouts``);
    returns what each member copies."""
    graph = cx.graph
    by_id = {g.id: g for g in groups}
    cats: dict[tuple, list[tuple[Node, list[str], int]]] = {}
    for n in graph.nodes:
        if n.op != "aten.cat" or by_id[owner[n.name]].nodes != [n.name] or not isinstance(n.args[0], list):
            continue
        pieces = n.args[0]
        meta = graph.meta(n.name)
        if meta is None or meta.dtype != "float32" or not pieces or \
                not all(isinstance(p, str) and p.startswith("%") for p in pieces):
            continue
        rank = len(meta.shape)
        dim = (n.args[1] if len(n.args) > 1 else 0) % rank
        key = (pieces[0], dim, tuple(d for i, d in enumerate(meta.shape) if i != dim))
        cats.setdefault(key, []).append((n, [p[1:] for p in pieces], dim))
    planned: dict[str, ConcatWrite] = {}
    for members in cats.values():
        members.sort(key=lambda m: len(m[1]))
        last, pieces, dim = members[-1]
        chain = [m for m in members if m[1] == pieces[:len(m[1])]]
        if len(chain) < 2 or len({len(m[1]) for m in chain}) != len(chain) or \
                not all(_views_only_read_through_strides(cx, m[0], by_id, owner) for m in chain[:-1]):
            continue
        buffer = cx.buffer(last.name)
        strides = contiguous_strides(cx.shape(last.name))
        sizes = [cx.shape(p)[dim] for p in pieces]
        done = 0
        for node, mine, _ in chain:
            start = sum(sizes[:done])
            region = list(cx.shape(last.name))
            region[dim] = sum(sizes[done:len(mine)])
            planned[node.name] = ConcatWrite(mine[done:], dim, tuple(region), start * strides[dim])
            cx.out.storage[node.name] = buffer
            if node is not last:
                cx.out.layouts[node.name] = (strides, 0)
            done = len(mine)
    return planned


def _views_only_read_through_strides(cx: LowerContext, cat: Node, by_id: dict[int, FusionGroup],
                                     owner: dict[str, int]) -> bool:
    """Whether ``cat`` may be a strided view of a larger buffer: not returned or written back, and
    every reader a kernel that reads it through strides."""
    graph = cx.graph
    if cat.name in graph.outputs or cat.name in graph.mutations.values():
        return False
    for user in cx.users.get(cat.name, []):
        node = cx.nodes.get(user)
        if node is None or by_id[owner[user]].kind not in _STRIDED_GROUPS:
            return False
        if not (is_pointwise(node.op) or node.op in ROW_OPS or node.op in _STRIDED_READERS):
            return False
    return True
