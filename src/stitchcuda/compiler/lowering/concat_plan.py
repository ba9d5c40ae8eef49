"""Concatenations that grow one buffer: a chain of ``cat`` nodes along one dim, each taking the
pieces of the one before it and more (DenseNet's dense layers: layer k reads the concatenation of
the block's input and every earlier layer's output), is one buffer the size of the largest. Each
concatenation copies only its new pieces into their slice of it, and is read as a strided view
of the buffer's leading part: layer k copies its own feature map, not all k of them (as
Inductor's concatenation planning has a producer write into its slice).

A chain is planned only where nothing depends on a concatenation being a buffer of its own: every
concatenation but the largest is read by kernels that read through strides (pointwise and row
kernels, family kernels such as a training batch norm), is neither returned nor written back, and
is alone in its group.

A piece that a pointwise kernel makes for the concatenation alone (an Inception branch's last
activation) is written by that kernel straight into its slice, through strides: nothing copies it.
"""

from __future__ import annotations

from dataclasses import dataclass

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import Unsupported, contiguous_strides
from stitchcuda.compiler.ir.formulas import ROW_OPS, is_pointwise
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import FAMILY_OPS
from stitchcuda.compiler.lowering.lower_context import LowerContext

# the groups whose kernels read their operands through strides (not a library call's operand)
_STRIDED_GROUPS = {"elementwise", "row_reduce", "data_movement", "other"}


@dataclass
class ConcatWrite:
    """What one planned concatenation copies: a run of its pieces (``pieces``), a region of
    ``shape`` along ``dim`` at element ``offset`` of the shared buffer, whose ``strides`` it has."""

    pieces: list[str]
    dim: int
    shape: tuple[int, ...]
    offset: int
    strides: tuple[int, ...]


def plan_concats(cx: LowerContext, groups: list[FusionGroup], owner: dict[str, int]) -> dict[str, list[ConcatWrite]]:
    """Plan the graph's concatenations: a chain's members are stored in the largest one's buffer
    (its leading part, read through that buffer's strides: ``cx.out.layouts``), and a piece a
    pointwise kernel makes for one concatenation alone is stored in its slice. Returns, for each
    planned concatenation, the runs of pieces it still copies (none: it is its buffer already)."""
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
    planned: dict[str, list[ConcatWrite]] = {}
    for members in cats.values():
        members.sort(key=lambda m: len(m[1]))
        last, pieces, dim = members[-1]
        chain = [m for m in members if m[1] == pieces[:len(m[1])]]
        if len({len(m[1]) for m in chain}) != len(chain) or \
                not all(_views_only_read_through_strides(cx, m[0], by_id, owner) for m in chain[:-1]):
            chain = [members[-1]]
        in_place = {p for p in pieces if _made_for(cx, p, last.name, by_id, owner)} \
            if len(set(pieces)) == len(pieces) else set()
        if len(chain) < 2 and not in_place:
            continue
        buffer = cx.buffer(last.name)
        strides = contiguous_strides(cx.shape(last.name))
        sizes = [cx.shape(p)[dim] for p in pieces]
        for p in in_place:  # its kernel writes it into its slice
            cx.out.storage[p] = buffer
            cx.out.layouts[p] = (strides, sum(sizes[:pieces.index(p)]) * strides[dim])
        done = 0
        for node, mine, _ in chain:
            planned[node.name] = _runs(cx.shape(last.name), sizes, strides, dim, mine, done, in_place)
            cx.out.storage[node.name] = buffer
            if node is not last:
                cx.out.layouts[node.name] = (strides, 0)
            done = len(mine)
    return planned


def _runs(shape: tuple[int, ...], sizes: list[int], strides: tuple[int, ...], dim: int, pieces: list[str],
          first: int, in_place: set[str]) -> list[ConcatWrite]:
    """The runs of ``pieces[first:]`` that are copied (the pieces not written in place)."""
    runs: list[ConcatWrite] = []
    k = first
    while k < len(pieces):
        if pieces[k] in in_place:
            k += 1
            continue
        end = k
        while end < len(pieces) and pieces[end] not in in_place:
            end += 1
        region = list(shape)
        region[dim] = sum(sizes[k:end])
        runs.append(ConcatWrite(pieces[k:end], dim, tuple(region), sum(sizes[:k]) * strides[dim], strides))
        k = end
    return runs


def _made_for(cx: LowerContext, piece: str, cat: str, by_id: dict[int, FusionGroup], owner: dict[str, int]) -> bool:
    """Whether ``piece`` is a float32 value a pointwise group makes for ``cat`` alone."""
    graph = cx.graph
    node = cx.nodes.get(piece)
    meta = graph.meta(piece)
    if node is None or piece not in owner or meta is None or meta.dtype != "float32" or piece in graph.outputs \
            or piece in graph.mutations.values() or cx.users.get(piece, []) != [cat]:
        return False
    group = by_id[owner[piece]]
    try:
        return group.kind == "elementwise" and cx.outputs_of(group) == [piece]
    except Unsupported:  # a value no buffer holds: its group's own lowering says so
        return False


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
        # pointwise and row kernels, and family kernels (a training batch norm): reads through strides
        if not (is_pointwise(node.op) or node.op in ROW_OPS or node.op in FAMILY_OPS):
            return False
    return True
