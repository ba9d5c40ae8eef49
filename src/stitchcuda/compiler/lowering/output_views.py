"""Outputs that are reshapes of a value the program computes (``x.view(n, -1)``, ``torch.flatten``,
a ``squeeze`` at the end of a forward): the value is stored in the output's buffer, so that its own
kernel writes the output and the view costs nothing, where it would otherwise be copied out of an
intermediate buffer by a kernel of its own (an output owns its buffer).

Planned only where nothing else needs the value in a buffer of its own: it is not returned or written
back itself, no other output is a view of it, no concatenation stores it, and the output's group is
the views alone. The value's group is then never launched with the weight packs (``hoist.py``): an
output buffer is new each call.
"""

from __future__ import annotations

from stitchcuda.compiler.ir.expr import numel
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import LAYOUT_VIEWS
from stitchcuda.compiler.lowering.lower_context import LowerContext


def plan_output_views(cx: LowerContext, groups: list[FusionGroup], owner: dict[str, int]) -> None:
    """Store each such value in its output's buffer (``cx.out.storage``)."""
    graph = cx.graph
    by_id = {g.id: g for g in groups}
    kept = set(graph.outputs) | set(graph.mutations) | set(graph.mutations.values())
    taken: set[str] = set()
    for o in dict.fromkeys(graph.outputs):
        if graph.outputs.count(o) > 1 or o in cx.out.storage or o not in cx.nodes:
            continue
        chain, value = [], o
        while value in cx.nodes and cx.nodes[value].op in LAYOUT_VIEWS and len(cx.nodes[value].inputs()) == 1:
            chain.append(value)
            value = cx.nodes[value].inputs()[0]
        if not chain or value not in cx.nodes or value in graph.getitems or value in kept or value in taken \
                or value in cx.out.storage or value in cx.out.layouts or owner.get(value) == owner[o]:
            continue
        if set(by_id[owner[o]].nodes) != set(chain) or len(cx.nodes[value].out) != 1:
            continue
        meta = graph.meta(value)
        if meta is None or meta.dtype != "float32" or numel(meta.shape) != numel(cx.shape(o)):
            continue
        cx.out.storage[value] = cx.buffer(o)
        taken.add(value)
