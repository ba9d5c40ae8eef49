"""Horizontal fusion of projections: linears that read the same input become one wider product.

A transformer block projects one hidden state three times (query, key, value; Llama's gate and up
twice more). At the sizes users bring, each of those products fills a fraction of the GPU and
costs a launch of its own: BERT's 1024 x 256 x 256 projections run 32 x 32 tiles for about 10 us
each on an H100, where one 1024 x 768 x 256 product takes about the time of one. This pass makes
them one: the weights (and biases) are concatenated along their output dimension, the product is
taken once, and each former output is a slice of its columns, under the name it had, so that its
readers (the head split, an activation) read it in place through strides.

The concatenated weight is computed from the parameters alone, so the lowering launches it with
the weight packs (``lowering/hoist.py``): once, and again only when a weight changes. The state
dict is untouched: the program still holds the reference's own parameters. Merged are the
``aten.linear`` nodes of one input whose weights are 2-d float32 parameters of the same input
width, all with a bias or all without, up to :data:`MAX_MERGED` elements of weight.
"""

from __future__ import annotations

from stitchcuda.compiler.capture.graph import Node, OpGraph, TensorMeta

MAX_MERGED = 64 << 20  # elements of concatenated weight (256 MB): beyond, the copy outweighs a launch


def _mergeable(graph: OpGraph, n: Node, params: dict[str, TensorMeta]) -> bool:
    if n.name in graph.outputs or n.op != "aten.linear" or len(n.out) != 1 or n.kwargs or not isinstance(n.args[0], str):
        return False
    weight, bias = n.args[1], n.args[2] if len(n.args) > 2 else None
    if not (isinstance(weight, str) and weight[1:] in params and len(params[weight[1:]].shape) == 2):
        return False
    if bias is not None and not (isinstance(bias, str) and bias[1:] in params):
        return False
    return params[weight[1:]].dtype == "float32" and n.out[0].dtype == "float32"


def merge_shared_linears(graph: OpGraph) -> OpGraph:
    """A copy of ``graph`` where each set of two or more mergeable linears of one input is one
    linear over concatenated weights, its former outputs slices of the result."""
    written = set(graph.mutations.values())
    params = {p.name: p.meta for p in graph.placeholders
              if p.kind == "parameter" and p.meta is not None and p.name not in written}
    sets: dict[tuple, list[Node]] = {}
    for n in graph.nodes:
        if _mergeable(graph, n, params):
            weight = params[n.args[1][1:]]
            key = (n.args[0], weight.shape[1], len(n.args) > 2 and n.args[2] is not None)
            sets.setdefault(key, []).append(n)
    merged = [group for group in sets.values()
              if len(group) > 1 and sum(params[n.args[1][1:]].numel for n in group) <= MAX_MERGED]
    if not merged:
        return graph
    replace: dict[str, list[Node]] = {}  # the first linear of a set -> the nodes that stand for the set
    dropped: set[str] = set()
    taken = {n.name for n in graph.nodes} | {p.name for p in graph.placeholders} | set(graph.getitems)
    for group in merged:
        first = group[0]
        base = f"{first.name}_merged"
        while base in taken:
            base += "_"
        taken |= {base, base + "_weight", base + "_bias"}
        widths = [params[n.args[1][1:]].shape[0] for n in group]
        k = params[first.args[1][1:]].shape[1]
        lead = first.out[0].shape[:-1]
        nodes = [Node(name=base + "_weight", op="aten.cat", args=[[n.args[1] for n in group], 0],
                      out=[TensorMeta(shape=[sum(widths), k], dtype="float32")], module=first.module)]
        args = [first.args[0], "%" + base + "_weight"]
        if len(first.args) > 2 and first.args[2] is not None:
            nodes.append(Node(name=base + "_bias", op="aten.cat", args=[[n.args[2] for n in group], 0],
                              out=[TensorMeta(shape=[sum(widths)], dtype="float32")], module=first.module))
            args.append("%" + base + "_bias")
        nodes.append(Node(name=base, op="aten.linear", args=args,
                          out=[TensorMeta(shape=[*lead, sum(widths)], dtype="float32")], module=first.module))
        start = 0
        for n, width in zip(group, widths, strict=True):
            nodes.append(Node(name=n.name, op="aten.slice", overload="Tensor",
                              args=["%" + base, len(lead), start, start + width, 1], out=n.out, module=n.module))
            start += width
        replace[first.name] = nodes
        dropped |= {n.name for n in group[1:]}
    out = graph.model_copy(deep=True)
    out.nodes = [m for n in out.nodes if n.name not in dropped for m in replace.get(n.name, [n])]
    return out
